//! Trees described as data: a [`TreeSpec`] (directories, entries of every kind with their
//! metadata, xattrs and ACLs, hard links, one optional big sparse file), the proptest
//! strategies that generate them, [`fixed_spec`] (one of each kind, for the tests that need a
//! known tree) and [`materialize`], which makes one on disk. The tests must run as root on a
//! file system with xattrs and ACLs (ext4): materialize chowns to arbitrary IDs, makes device
//! nodes and sets `system.posix_acl_*` xattrs directly.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use proptest::prelude::*;

use crate::support;
use crate::support::Rng;

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;
// ---------------------------------------------------------------------------------------------
// Tree specifications
// ---------------------------------------------------------------------------------------------

/// A POSIX ACL, encoded as the kernel's `system.posix_acl_*` xattr value.
#[derive(Clone, Debug)]
pub struct Acl {
    pub user_obj: u16,
    pub users: BTreeMap<u32, u16>,
    pub group_obj: u16,
    pub groups: BTreeMap<u32, u16>,
    pub mask: Option<u16>,
    pub other: u16,
}

impl Acl {
    fn encode(&self) -> Vec<u8> {
        const UNDEFINED: u32 = u32::MAX;
        let mut out = 2u32.to_le_bytes().to_vec(); // POSIX_ACL_XATTR_VERSION
        let mut entry = |tag: u16, perm: u16, id: u32| {
            out.extend_from_slice(&tag.to_le_bytes());
            out.extend_from_slice(&perm.to_le_bytes());
            out.extend_from_slice(&id.to_le_bytes());
        };
        entry(0x01, self.user_obj, UNDEFINED); // ACL_USER_OBJ
        for (&id, &perm) in &self.users {
            entry(0x02, perm, id); // ACL_USER
        }
        entry(0x04, self.group_obj, UNDEFINED); // ACL_GROUP_OBJ
        for (&id, &perm) in &self.groups {
            entry(0x08, perm, id); // ACL_GROUP
        }
        let named = !self.users.is_empty() || !self.groups.is_empty();
        if let Some(mask) = self.mask.or(named.then_some(0o7)) {
            entry(0x10, mask, UNDEFINED); // ACL_MASK
        }
        entry(0x20, self.other, UNDEFINED); // ACL_OTHER
        out
    }
}

#[derive(Clone, Debug)]
pub struct Meta {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
}

#[derive(Clone, Debug)]
pub enum Content {
    Empty,
    Small(Vec<u8>),
    /// Incompressible.
    Random {
        len: usize,
        seed: u64,
    },
    /// Text that compresses well.
    Compressible {
        len: usize,
        seed: u64,
    },
    /// `set_len(size)`, then writes of `len` random bytes at `permille` of the size.
    Sparse {
        size: u64,
        writes: Vec<(u32, u32, u64)>,
    },
    /// Written zeros (allocated, not holes).
    Zeros(usize),
}

#[derive(Clone, Debug)]
pub enum LinkTarget {
    /// Relative path to some entry of the tree (possibly itself, possibly a directory).
    Relative(usize),
    /// Absolute path to some entry of the tree.
    Absolute(usize),
    /// A path that does not exist (bytes need not be UTF-8).
    Dangling(Vec<u8>),
}

#[derive(Clone, Debug)]
pub enum EntryKind {
    File { content: Content, xattrs: BTreeMap<u8, Vec<u8>>, acl: Option<Acl> },
    Symlink(LinkTarget),
    Fifo,
    CharDevice(u32, u32),
    BlockDevice(u32, u32),
}

#[derive(Clone, Debug)]
pub struct EntrySpec {
    /// Index (modulo the number of directories) of the directory it goes in.
    pub dir: usize,
    /// Name style.
    pub name: usize,
    pub kind: EntryKind,
    pub meta: Meta,
}

#[derive(Clone, Debug)]
pub struct DirSpec {
    /// Index (modulo the directories made so far) of the parent.
    pub parent: usize,
    pub name: usize,
    pub meta: Meta,
    pub xattrs: BTreeMap<u8, Vec<u8>>,
    pub acl: Option<Acl>,
    /// Default ACL.
    pub default_acl: Option<Acl>,
    /// Whether the default ACL is set after the directory's entries are made (so they do not
    /// inherit it) rather than when the directory is made (so they do).
    pub late_default_acl: bool,
}

#[derive(Clone, Debug)]
pub struct TreeSpec {
    pub root: DirSpec,
    pub dirs: Vec<DirSpec>,
    pub entries: Vec<EntrySpec>,
    /// Extra names for regular files: (file index, directory index, name style).
    pub links: Vec<(usize, usize, usize)>,
    /// One large incompressible file: (length, seed).
    pub big: Option<(usize, u64)>,
}

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

pub fn time_strategy() -> impl Strategy<Value = (i64, u32)> {
    // ext4 with large inodes stores 1901..2446 with nanoseconds.
    (-2_000_000_000i64..16_000_000_000, 0u32..1_000_000_000)
}

pub fn id_strategy() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0u32), 1u32..70_000, 70_000u32..4_000_000_000,]
}

pub fn meta_strategy() -> impl Strategy<Value = Meta> {
    (0u32..=0o7777, id_strategy(), id_strategy(), time_strategy(), time_strategy())
        .prop_map(|(mode, uid, gid, atime, mtime)| Meta { mode, uid, gid, atime, mtime })
}

pub fn acl_strategy(named_required: bool) -> impl Strategy<Value = Acl> {
    let named = || prop::collection::btree_map(id_strategy(), 0u16..8, 0..3);
    (0u16..8, named(), 0u16..8, named(), prop::option::of(0u16..8), 0u16..8).prop_map(
        move |(user_obj, mut users, group_obj, groups, mask, other)| {
            if named_required && users.is_empty() && groups.is_empty() {
                users.insert(1000, 0o6);
            }
            Acl { user_obj, users, group_obj, groups, mask, other }
        },
    )
}

pub fn xattrs_strategy() -> impl Strategy<Value = BTreeMap<u8, Vec<u8>>> {
    prop::collection::btree_map(0u8..6, prop::collection::vec(any::<u8>(), 0..64), 0..3)
}

pub fn content_strategy() -> impl Strategy<Value = Content> {
    prop_oneof![
        2 => Just(Content::Empty),
        3 => prop::collection::vec(any::<u8>(), 1..300).prop_map(Content::Small),
        1 => (1..MIB, any::<u64>()).prop_map(|(len, seed)| Content::Random { len, seed }),
        2 => (1..MIB, any::<u64>()).prop_map(|(len, seed)| Content::Compressible { len, seed }),
        2 => (
            1..16 * MIB as u64,
            prop::collection::vec((0u32..=1000, 1u32..20_000, any::<u64>()), 0..4),
        )
            .prop_map(|(size, writes)| Content::Sparse { size, writes }),
        1 => (1..MIB).prop_map(Content::Zeros),
    ]
}

pub fn link_target_strategy() -> impl Strategy<Value = LinkTarget> {
    prop_oneof![
        any::<usize>().prop_map(LinkTarget::Relative),
        any::<usize>().prop_map(LinkTarget::Absolute),
        prop::collection::vec(1u8..=255, 1..40).prop_map(LinkTarget::Dangling),
    ]
}

pub fn entry_kind_strategy() -> impl Strategy<Value = EntryKind> {
    prop_oneof![
        5 => (
            content_strategy(),
            xattrs_strategy(),
            prop::option::weighted(0.3, acl_strategy(true)),
        )
            .prop_map(|(content, xattrs, acl)| EntryKind::File { content, xattrs, acl }),
        2 => link_target_strategy().prop_map(EntryKind::Symlink),
        1 => Just(EntryKind::Fifo),
        1 => (0u32..4096, 0u32..(1 << 20)).prop_map(|(a, b)| EntryKind::CharDevice(a, b)),
        1 => (0u32..4096, 0u32..(1 << 20)).prop_map(|(a, b)| EntryKind::BlockDevice(a, b)),
    ]
}

pub fn dir_strategy() -> impl Strategy<Value = DirSpec> {
    (
        any::<usize>(),
        any::<usize>(),
        meta_strategy(),
        xattrs_strategy(),
        prop::option::weighted(0.25, acl_strategy(true)),
        prop::option::weighted(0.25, acl_strategy(false)),
        any::<bool>(),
    )
        .prop_map(|(parent, name, meta, xattrs, acl, default_acl, late_default_acl)| DirSpec {
            parent,
            name,
            meta,
            xattrs,
            acl,
            default_acl,
            late_default_acl,
        })
}

pub fn entry_strategy() -> impl Strategy<Value = EntrySpec> {
    (any::<usize>(), any::<usize>(), entry_kind_strategy(), meta_strategy())
        .prop_map(|(dir, name, kind, meta)| EntrySpec { dir, name, kind, meta })
}

pub fn tree_strategy(big: impl Strategy<Value = Option<(usize, u64)>>) -> impl Strategy<Value = TreeSpec> {
    (
        dir_strategy(),
        prop::collection::vec(dir_strategy(), 0..6),
        prop::collection::vec(entry_strategy(), 1..16),
        prop::collection::vec((any::<usize>(), any::<usize>(), any::<usize>()), 0..4),
        big,
    )
        .prop_map(|(root, dirs, entries, links, big)| TreeSpec { root, dirs, entries, links, big })
}

// ---------------------------------------------------------------------------------------------
// Building a tree on disk
// ---------------------------------------------------------------------------------------------

/// A unique name (`prefix` + `i`) in one of several awkward styles.
pub fn name(prefix: &str, i: usize, style: usize) -> OsString {
    let base = format!("{prefix}{i}");
    let bytes: Vec<u8> = match style % 9 {
        0..=2 => base.into_bytes(),
        3 => format!("{base} with spaces.txt").into_bytes(),
        4 => format!("{base}-ünïcødé-日本語").into_bytes(),
        5 => [base.as_bytes(), b"-\xff\xfe\x80-not-utf8"].concat(),
        6 => format!("-{base}\nnewline\ttab").into_bytes(),
        7 => format!(".{base}-hidden").into_bytes(),
        _ => format!("{base}-{}", "L".repeat(200)).into_bytes(),
    };
    OsString::from_vec(bytes)
}

pub fn xattr_name(k: u8) -> String {
    format!("user.cairn.test{k}")
}

pub fn compressible(len: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 100);
    let mut n = 0u64;
    while out.len() < len {
        out.extend_from_slice(
            format!("line {n:08}: the quick brown fox {seed:x} jumps over the lazy dog\n").as_bytes(),
        );
        n += 1;
    }
    out.truncate(len);
    out
}

pub fn write_content(path: &Path, content: &Content) {
    let mut f = fs::File::create(path).expect("create file");
    match content {
        Content::Empty => {}
        Content::Small(b) => f.write_all(b).expect("write"),
        Content::Random { len, seed } => f.write_all(&Rng(*seed).bytes(*len)).expect("write"),
        Content::Compressible { len, seed } => f.write_all(&compressible(*len, *seed)).expect("write"),
        Content::Sparse { size, writes } => {
            f.set_len(*size).expect("set_len");
            for &(permille, len, seed) in writes {
                let len = u64::from(len).min(*size);
                let offset = (size * u64::from(permille) / 1000).min(size - len);
                f.write_all_at(&Rng(seed).bytes(len as usize), offset).expect("write_at");
            }
        }
        Content::Zeros(len) => f.write_all(&vec![0u8; *len]).expect("write"),
    }
}

pub fn mknod(path: &Path, kind: libc::mode_t, major: u32, minor: u32) {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("no NUL");
    let dev = libc::makedev(major, minor);
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    let r = unsafe { libc::mknod(c.as_ptr(), kind | 0o644, dev) };
    assert_eq!(r, 0, "mknod {}: {}", path.display(), std::io::Error::last_os_error());
}

/// The path from directory `from` to `to`, both absolute.
pub fn relative(from: &Path, to: &Path) -> PathBuf {
    let a: Vec<Component> = from.components().collect();
    let b: Vec<Component> = to.components().collect();
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..a.len() {
        out.push("..");
    }
    for c in &b[common..] {
        out.push(c);
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

pub fn set_acl(path: &Path, name: &str, acl: &Acl) {
    xattr::set(path, name, &acl.encode()).unwrap_or_else(|e| panic!("set {name} on {}: {e} ({acl:?})", path.display()));
}

/// Owner, mode, xattrs and access ACL, in the order that keeps them all.
pub fn apply_meta(path: &Path, meta: &Meta, symlink: bool, xattrs: &BTreeMap<u8, Vec<u8>>, acl: Option<&Acl>) {
    std::os::unix::fs::lchown(path, Some(meta.uid), Some(meta.gid))
        .unwrap_or_else(|e| panic!("lchown {}: {e}", path.display()));
    if symlink {
        return;
    }
    fs::set_permissions(path, fs::Permissions::from_mode(meta.mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
    for (k, v) in xattrs {
        xattr::set(path, xattr_name(*k), v).unwrap_or_else(|e| panic!("setxattr {}: {e}", path.display()));
    }
    if let Some(acl) = acl {
        set_acl(path, "system.posix_acl_access", acl);
    }
}

pub fn to_times(m: &Meta) -> ((i64, i64), (i64, i64)) {
    ((m.atime.0, i64::from(m.atime.1)), (m.mtime.0, i64::from(m.mtime.1)))
}

/// Makes the tree `spec` at `root` (which must not exist).
pub fn materialize(spec: &TreeSpec, root: &Path) {
    let all_dirs: Vec<&DirSpec> = std::iter::once(&spec.root).chain(&spec.dirs).collect();
    let mut dirs: Vec<PathBuf> = Vec::new();
    for (k, d) in all_dirs.iter().enumerate() {
        let p = if k == 0 { root.to_path_buf() } else { dirs[d.parent % dirs.len()].join(name("d", k - 1, d.name)) };
        fs::create_dir(&p).expect("mkdir");
        if let (Some(acl), false) = (&d.default_acl, d.late_default_acl) {
            set_acl(&p, "system.posix_acl_default", acl);
        }
        dirs.push(p);
    }
    let paths: Vec<PathBuf> =
        spec.entries.iter().enumerate().map(|(i, e)| dirs[e.dir % dirs.len()].join(name("e", i, e.name))).collect();
    let candidates: Vec<&PathBuf> = dirs.iter().chain(&paths).collect();
    let mut files = Vec::new();
    for (e, path) in spec.entries.iter().zip(&paths) {
        match &e.kind {
            EntryKind::File { content, .. } => {
                write_content(path, content);
                files.push(path.clone());
            }
            EntryKind::Symlink(t) => {
                let target: PathBuf = match t {
                    LinkTarget::Relative(i) => {
                        relative(path.parent().expect("parent"), candidates[i % candidates.len()])
                    }
                    LinkTarget::Absolute(i) => candidates[i % candidates.len()].clone(),
                    LinkTarget::Dangling(b) => PathBuf::from(OsString::from_vec([b"missing-".as_slice(), b].concat())),
                };
                std::os::unix::fs::symlink(&target, path).expect("symlink");
            }
            EntryKind::Fifo => mknod(path, libc::S_IFIFO, 0, 0),
            EntryKind::CharDevice(a, b) => mknod(path, libc::S_IFCHR, *a, *b),
            EntryKind::BlockDevice(a, b) => mknod(path, libc::S_IFBLK, *a, *b),
        }
    }
    if let Some((len, seed)) = spec.big {
        let p = root.join("big-random.bin");
        write_content(&p, &Content::Random { len, seed });
    }
    if !files.is_empty() {
        for (j, &(f, d, style)) in spec.links.iter().enumerate() {
            let link = dirs[d % dirs.len()].join(name("h", j, style));
            fs::hard_link(&files[f % files.len()], &link).expect("hard link");
        }
    }
    let none = BTreeMap::new();
    for (e, path) in spec.entries.iter().zip(&paths) {
        match &e.kind {
            EntryKind::File { xattrs, acl, .. } => apply_meta(path, &e.meta, false, xattrs, acl.as_ref()),
            EntryKind::Symlink(_) => apply_meta(path, &e.meta, true, &none, None),
            _ => apply_meta(path, &e.meta, false, &none, None),
        }
    }
    for (d, path) in all_dirs.iter().zip(&dirs) {
        apply_meta(path, &d.meta, false, &d.xattrs, d.acl.as_ref());
        if let (Some(acl), true) = (&d.default_acl, d.late_default_acl) {
            set_acl(path, "system.posix_acl_default", acl);
        }
    }
    // Times last: making entries changes their directory's mtime.
    for (e, path) in spec.entries.iter().zip(&paths) {
        let (a, m) = to_times(&e.meta);
        support::set_times(path, a, m);
    }
    for (d, path) in all_dirs.iter().zip(&dirs).rev() {
        let (a, m) = to_times(&d.meta);
        support::set_times(path, a, m);
    }
}

// ---------------------------------------------------------------------------------------------
// A fixed tree for the codec, dedup and sub-path tests
// ---------------------------------------------------------------------------------------------

pub fn meta(mode: u32, uid: u32, gid: u32, t: i64) -> Meta {
    Meta { mode, uid, gid, atime: (t + 17, 987_654_321), mtime: (t, 123_456_789) }
}

pub fn file(content: Content) -> EntryKind {
    EntryKind::File { content, xattrs: BTreeMap::new(), acl: None }
}

pub fn entry(dir: usize, name: usize, kind: EntryKind, meta: Meta) -> EntrySpec {
    EntrySpec { dir, name, kind, meta }
}

pub fn dir(parent: usize, name: usize, meta: Meta) -> DirSpec {
    DirSpec { parent, name, meta, xattrs: BTreeMap::new(), acl: None, default_acl: None, late_default_acl: false }
}

pub fn named_acl() -> Acl {
    Acl {
        user_obj: 7,
        users: BTreeMap::from([(1001, 5), (4_000_000, 4)]),
        group_obj: 5,
        groups: BTreeMap::from([(2002, 6)]),
        mask: Some(7),
        other: 1,
    }
}

/// One of everything, about 2.5 MiB of content.
pub fn fixed_spec() -> TreeSpec {
    let mut root = dir(0, 0, meta(0o755, 0, 0, 1_600_000_000));
    root.xattrs.insert(1, b"root xattr".to_vec());
    let mut sub = dir(0, 0, meta(0o2775, 1000, 1000, 1_500_000_000));
    sub.default_acl = Some(Acl { users: BTreeMap::from([(3003, 7)]), ..named_acl() });
    let mut deep = dir(1, 4, meta(0o1777, 0, 0, -100_000_000));
    deep.acl = Some(named_acl());
    deep.xattrs.insert(0, vec![0, 1, 2, 255]);
    let empty = dir(0, 3, meta(0o700, 65534, 65534, 2_000_000_000));
    // A default ACL set after the directory's entries were made: they do not carry it.
    let mut late = dir(0, 2, meta(0o750, 0, 0, 1_650_000_000));
    late.default_acl = Some(named_acl());
    late.late_default_acl = true;
    let mut entries = vec![
        entry(0, 0, file(Content::Compressible { len: 600 * KIB, seed: 1 }), meta(0o644, 0, 0, 1_700_000_000)),
        entry(1, 0, file(Content::Random { len: 300 * KIB, seed: 2 }), meta(0o4755, 0, 0, 1_700_000_001)),
        // The same content again (not a hard link): deduplicated within one backup.
        entry(2, 3, file(Content::Random { len: 300 * KIB, seed: 2 }), meta(0o2750, 12345, 54321, 1_700_000_002)),
        entry(
            0,
            1,
            file(Content::Sparse { size: 8 * MIB as u64, writes: vec![(0, 5000, 3), (500, 100, 4), (1000, 777, 5)] }),
            meta(0o600, 0, 0, 1_700_000_003),
        ),
        entry(1, 1, file(Content::Sparse { size: 3 * MIB as u64, writes: vec![] }), meta(0o640, 0, 0, 1_700_000_004)),
        entry(0, 0, file(Content::Zeros(200 * KIB)), meta(0o444, 0, 0, 1_700_000_005)),
        entry(0, 4, file(Content::Empty), meta(0o000, 7, 8, 1_700_000_006)),
        entry(2, 5, file(Content::Small(b"small file\n".to_vec())), meta(0o1644, 0, 0, 1_700_000_007)),
        entry(0, 0, EntryKind::Symlink(LinkTarget::Relative(2)), meta(0o777, 1000, 1000, 1_700_000_008)),
        entry(2, 0, EntryKind::Symlink(LinkTarget::Absolute(5)), meta(0o777, 0, 0, 1_700_000_009)),
        entry(
            1,
            0,
            EntryKind::Symlink(LinkTarget::Dangling(b"nowhere/\xffx".to_vec())),
            meta(0o777, 0, 0, 1_700_000_010),
        ),
        entry(0, 0, EntryKind::Fifo, meta(0o620, 0, 0, 1_700_000_011)),
        entry(2, 0, EntryKind::CharDevice(1, 3), meta(0o666, 0, 0, 1_700_000_012)),
        entry(1, 0, EntryKind::BlockDevice(259, 65536), meta(0o660, 0, 6, 1_700_000_013)),
    ];
    entries.push(entry(
        2,
        6,
        EntryKind::File {
            content: Content::Compressible { len: 50 * KIB, seed: 9 },
            xattrs: BTreeMap::from([(0, b"v0".to_vec()), (3, vec![0xab; 2000]), (5, vec![])]),
            acl: Some(named_acl()),
        },
        meta(0o6770, 500, 600, 1_700_000_014),
    ));
    entries.push(entry(4, 0, file(Content::Small(b"no ACL here\n".to_vec())), meta(0o640, 0, 0, 1_700_000_015)));
    // 5 GiB, nearly all hole: offsets and lengths beyond 32 bits.
    entries.push(entry(
        4,
        0,
        file(Content::Sparse { size: 5 << 30, writes: vec![(900, 4096, 11), (1000, 10, 12)] }),
        meta(0o644, 0, 0, 1_700_000_016),
    ));
    TreeSpec {
        root,
        dirs: vec![sub, deep, empty, late],
        entries,
        // Three names for the compressible file, in three directories.
        links: vec![(0, 1, 0), (0, 2, 8)],
        big: None,
    }
}
