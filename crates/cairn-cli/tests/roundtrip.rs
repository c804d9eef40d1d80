//! Round trips through the `cairn` binary: build a file tree, back it up, restore it into a
//! fresh directory, and compare the two byte for byte and by metadata (type, mode incl.
//! setuid/setgid/sticky, owner, size, atime and mtime to the nanosecond, symlink target, device
//! number, xattrs and POSIX ACLs, hard-link groups, holes).
//!
//! The trees are generated with proptest and hold every kind of entry Cairn stores. The tests
//! must run as root on a file system with xattrs and ACLs (ext4): they chown to arbitrary IDs,
//! make device nodes and set `system.posix_acl_*` xattrs directly.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use cairn_format::compress::Codec;
use cairn_format::pack::BlobKind;
use common::{
    assert_same, count_files, reset_times, restored_path, scan, scan_source, Cairn, Kind, Rng, Scan, StoredBlob,
    PASSWORD,
};
use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

// ---------------------------------------------------------------------------------------------
// Tree specifications
// ---------------------------------------------------------------------------------------------

/// A POSIX ACL, encoded as the kernel's `system.posix_acl_*` xattr value.
#[derive(Clone, Debug)]
struct Acl {
    user_obj: u16,
    users: BTreeMap<u32, u16>,
    group_obj: u16,
    groups: BTreeMap<u32, u16>,
    mask: Option<u16>,
    other: u16,
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
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    atime: (i64, u32),
    mtime: (i64, u32),
}

#[derive(Clone, Debug)]
enum Content {
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
enum LinkTarget {
    /// Relative path to some entry of the tree (possibly itself, possibly a directory).
    Relative(usize),
    /// Absolute path to some entry of the tree.
    Absolute(usize),
    /// A path that does not exist (bytes need not be UTF-8).
    Dangling(Vec<u8>),
}

#[derive(Clone, Debug)]
enum EntryKind {
    File { content: Content, xattrs: BTreeMap<u8, Vec<u8>>, acl: Option<Acl> },
    Symlink(LinkTarget),
    Fifo,
    CharDevice(u32, u32),
    BlockDevice(u32, u32),
}

#[derive(Clone, Debug)]
struct EntrySpec {
    /// Index (modulo the number of directories) of the directory it goes in.
    dir: usize,
    /// Name style.
    name: usize,
    kind: EntryKind,
    meta: Meta,
}

#[derive(Clone, Debug)]
struct DirSpec {
    /// Index (modulo the directories made so far) of the parent.
    parent: usize,
    name: usize,
    meta: Meta,
    xattrs: BTreeMap<u8, Vec<u8>>,
    acl: Option<Acl>,
    /// Default ACL.
    default_acl: Option<Acl>,
    /// Whether the default ACL is set after the directory's entries are made (so they do not
    /// inherit it) rather than when the directory is made (so they do).
    late_default_acl: bool,
}

#[derive(Clone, Debug)]
struct TreeSpec {
    root: DirSpec,
    dirs: Vec<DirSpec>,
    entries: Vec<EntrySpec>,
    /// Extra names for regular files: (file index, directory index, name style).
    links: Vec<(usize, usize, usize)>,
    /// One large incompressible file: (length, seed).
    big: Option<(usize, u64)>,
}

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

fn time_strategy() -> impl Strategy<Value = (i64, u32)> {
    // ext4 with large inodes stores 1901..2446 with nanoseconds.
    (-2_000_000_000i64..16_000_000_000, 0u32..1_000_000_000)
}

fn id_strategy() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0u32), 1u32..70_000, 70_000u32..4_000_000_000,]
}

fn meta_strategy() -> impl Strategy<Value = Meta> {
    (0u32..=0o7777, id_strategy(), id_strategy(), time_strategy(), time_strategy())
        .prop_map(|(mode, uid, gid, atime, mtime)| Meta { mode, uid, gid, atime, mtime })
}

fn acl_strategy(named_required: bool) -> impl Strategy<Value = Acl> {
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

fn xattrs_strategy() -> impl Strategy<Value = BTreeMap<u8, Vec<u8>>> {
    prop::collection::btree_map(0u8..6, prop::collection::vec(any::<u8>(), 0..64), 0..3)
}

fn content_strategy() -> impl Strategy<Value = Content> {
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

fn link_target_strategy() -> impl Strategy<Value = LinkTarget> {
    prop_oneof![
        any::<usize>().prop_map(LinkTarget::Relative),
        any::<usize>().prop_map(LinkTarget::Absolute),
        prop::collection::vec(1u8..=255, 1..40).prop_map(LinkTarget::Dangling),
    ]
}

fn entry_kind_strategy() -> impl Strategy<Value = EntryKind> {
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

fn dir_strategy() -> impl Strategy<Value = DirSpec> {
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

fn entry_strategy() -> impl Strategy<Value = EntrySpec> {
    (any::<usize>(), any::<usize>(), entry_kind_strategy(), meta_strategy())
        .prop_map(|(dir, name, kind, meta)| EntrySpec { dir, name, kind, meta })
}

fn tree_strategy(big: impl Strategy<Value = Option<(usize, u64)>>) -> impl Strategy<Value = TreeSpec> {
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
fn name(prefix: &str, i: usize, style: usize) -> OsString {
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

fn xattr_name(k: u8) -> String {
    format!("user.cairn.test{k}")
}

fn compressible(len: usize, seed: u64) -> Vec<u8> {
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

fn write_content(path: &Path, content: &Content) {
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

fn mknod(path: &Path, kind: libc::mode_t, major: u32, minor: u32) {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("no NUL");
    let dev = libc::makedev(major, minor);
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    let r = unsafe { libc::mknod(c.as_ptr(), kind | 0o644, dev) };
    assert_eq!(r, 0, "mknod {}: {}", path.display(), std::io::Error::last_os_error());
}

/// The path from directory `from` to `to`, both absolute.
fn relative(from: &Path, to: &Path) -> PathBuf {
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

fn set_acl(path: &Path, name: &str, acl: &Acl) {
    xattr::set(path, name, &acl.encode()).unwrap_or_else(|e| panic!("set {name} on {}: {e} ({acl:?})", path.display()));
}

/// Owner, mode, xattrs and access ACL, in the order that keeps them all.
fn apply_meta(path: &Path, meta: &Meta, symlink: bool, xattrs: &BTreeMap<u8, Vec<u8>>, acl: Option<&Acl>) {
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

fn to_times(m: &Meta) -> ((i64, i64), (i64, i64)) {
    ((m.atime.0, i64::from(m.atime.1)), (m.mtime.0, i64::from(m.mtime.1)))
}

/// Makes the tree `spec` at `root` (which must not exist).
fn materialize(spec: &TreeSpec, root: &Path) {
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
        common::set_times(path, a, m);
    }
    for (d, path) in all_dirs.iter().zip(&dirs).rev() {
        let (a, m) = to_times(&d.meta);
        common::set_times(path, a, m);
    }
}

// ---------------------------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------------------------

/// A source tree and a repository in one temporary directory.
struct Fixture {
    base: tempfile::TempDir,
    src: PathBuf,
    before: Scan,
    cairn: Cairn,
}

impl Fixture {
    fn new(spec: &TreeSpec) -> Self {
        let base = tempfile::tempdir().expect("tempdir");
        let src = base.path().join("src");
        materialize(spec, &src);
        let before = scan_source(&src);
        let cairn = Cairn::new(&base.path().join("repo"), PASSWORD);
        Fixture { base, src, before, cairn }
    }

    /// Backs up the source (after undoing atime updates since the scan).
    fn backup(&self, extra: &[&str]) -> serde_json::Value {
        reset_times(&self.src, &self.before);
        self.cairn.backup(&[&self.src], extra)
    }

    /// Restores `spec` (a full snapshot) into a new directory; checks the result against the
    /// source and the restore summary against the scan.
    fn restore_and_compare(&self, spec: &str, name: &str) {
        self.restore_and_compare_with(spec, name, &[]);
    }

    /// [`Fixture::restore_and_compare`] with extra `restore` options.
    fn restore_and_compare_with(&self, spec: &str, name: &str, extra: &[&str]) {
        let target = self.base.path().join(name);
        let summary = self.cairn.restore_with(spec, &target, extra);
        let restored = scan(&restored_path(&target, &self.src));
        assert_same(&self.before, &restored, true);

        let count = |k: &[Kind]| self.before.values().filter(|m| k.contains(&m.kind)).count();
        assert_eq!(summary["files"], count(&[Kind::File]), "{summary}");
        let others = count(&[Kind::Symlink, Kind::Fifo, Kind::CharDevice, Kind::BlockDevice]);
        assert_eq!(summary["others"], others, "{summary}");
        // `/` is the target itself; `tmp` and the temporary directory are restored too.
        let ancestors = self.src.components().count() - 2;
        assert_eq!(summary["dirs"], count(&[Kind::Dir]) + ancestors, "{summary}");
        let inodes: BTreeMap<u64, u64> =
            self.before.values().filter(|m| m.kind == Kind::File).map(|m| (m.ino, m.size)).collect();
        assert_eq!(summary["bytes_total"], inodes.values().sum::<u64>(), "{summary}");
    }
}

/// `cases` cases, or `PROPTEST_CASES` when set (for longer hunts).
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(cases),
        max_shrink_iters: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(12))]

    /// Every kind of entry survives backup and restore exactly (default repository settings).
    #[test]
    fn any_tree_round_trips(
        spec in tree_strategy(prop::option::weighted(0.5, (2 * MIB..5 * MIB, any::<u64>())))
    ) {
        let fx = Fixture::new(&spec);
        fx.cairn.init(&[]);
        fx.backup(&[]);
        fx.restore_and_compare("latest", "restore");
    }
}

/// Restore options that change how the pipeline runs but never what it produces.
/// (`--preallocate` has its own test: it fragments files, which can cost extent blocks.)
fn restore_options_strategy() -> impl Strategy<Value = Vec<String>> {
    (1u32..4, 1u32..4, 1u32..5, prop::sample::select(vec!["64K", "1M", "256M"]), any::<bool>()).prop_map(
        |(write, decode, fetch, memory, verify)| {
            let mut v: Vec<String> = [
                "--write-threads".to_string(),
                write.to_string(),
                "--decode-threads".to_string(),
                decode.to_string(),
                "--fetch-concurrency".to_string(),
                fetch.to_string(),
                "--max-memory".to_string(),
                memory.to_string(),
            ]
            .into();
            if verify {
                v.push("--verify".into());
            }
            v
        },
    )
}

proptest! {
    #![proptest_config(config(8))]

    /// With 1 MiB packs and 1/4/16 KiB chunks, a tree spans hundreds of chunks and several
    /// packs, and still restores exactly, whatever the restore's threads, memory budget and
    /// verification.
    #[test]
    fn many_chunks_and_packs_round_trip(
        spec in tree_strategy((5 * MIB / 2..4 * MIB, any::<u64>()).prop_map(Some)),
        restore_options in restore_options_strategy(),
    ) {
        let fx = Fixture::new(&spec);
        fx.cairn.init(&["--pack-size", "1", "--chunk-sizes", "1024,4096,16384"]);
        fx.backup(&[]);
        let opts: Vec<&str> = restore_options.iter().map(String::as_str).collect();
        fx.restore_and_compare_with("latest", "restore", &opts);

        let blobs = fx.cairn.stored_blobs();
        let packs: BTreeSet<&str> = blobs.iter().map(|b| b.pack.as_str()).collect();
        prop_assert!(packs.len() >= 3, "only {} packs", packs.len());
        prop_assert_eq!(packs.len(), count_files(&fx.base.path().join("repo/data")));
        let data = blobs.iter().filter(|b| b.kind == BlobKind::Data).count();
        prop_assert!(data >= 300, "only {} data blobs", data);
        prop_assert!(
            blobs.iter().all(|b| b.kind == BlobKind::Tree || b.raw_length <= 16384),
            "a chunk exceeds the maximum size"
        );
    }
}

proptest! {
    #![proptest_config(config(8))]

    /// Restoring snapshot B over a restore of snapshot A (same paths, different trees):
    /// with `--delete` the target becomes exactly B; without it every entry of B is exact and
    /// the entries only A had are left as they were.
    #[test]
    fn restoring_one_snapshot_over_another(
        a in tree_strategy(Just(None)),
        b in tree_strategy(Just(None)),
    ) {
        let base = tempfile::tempdir().expect("tempdir");
        let src = base.path().join("src");
        let cairn = Cairn::new(&base.path().join("repo"), PASSWORD);
        cairn.init(&[]);
        materialize(&a, &src);
        let scan_a = scan_source(&src);
        let snap_a = cairn.backup(&[&src], &[]);
        fs::remove_dir_all(&src).expect("remove A");
        materialize(&b, &src);
        let scan_b = scan_source(&src);
        let snap_b = cairn.backup(&[&src], &[]);
        let (id_a, id_b) = (snap_a["snapshot_id"].as_str().expect("id"), snap_b["snapshot_id"].as_str().expect("id"));

        // With --delete: exactly B.
        let t1 = base.path().join("t1");
        cairn.restore(id_a, &t1);
        assert_same(&scan_a, &scan(&restored_path(&t1, &src)), true);
        cairn.restore_with(id_b, &t1, &["--delete"]);
        assert_same(&scan_b, &scan(&restored_path(&t1, &src)), true);

        // Without: B's entries exact, A's leftovers untouched.
        let t2 = base.path().join("t2");
        cairn.restore(id_a, &t2);
        cairn.restore(id_b, &t2);
        let got = scan(&restored_path(&t2, &src));
        let (in_b, leftovers): (Scan, Scan) = got.into_iter().partition(|(p, _)| scan_b.contains_key(p));
        assert_same(&scan_b, &in_b, true);
        let mut diffs = Vec::new();
        for (p, m) in &leftovers {
            let Some(was) = scan_a.get(p) else {
                diffs.push(format!("{p:?}: neither in A nor in B"));
                continue;
            };
            let same = m.kind == was.kind
                && m.mode == was.mode
                && (m.uid, m.gid) == (was.uid, was.gid)
                && m.size == was.size
                && m.mtime == was.mtime
                && m.xattrs == was.xattrs
                && m.digest == was.digest
                && m.target == was.target
                && m.rdev == was.rdev;
            if !same {
                diffs.push(format!("{p:?}: left over from A but changed: was {was:?}, now {m:?}"));
            }
        }
        prop_assert!(diffs.is_empty(), "{}", diffs.join("\n"));
    }
}

// ---------------------------------------------------------------------------------------------
// A fixed tree for the codec, dedup and sub-path tests
// ---------------------------------------------------------------------------------------------

fn meta(mode: u32, uid: u32, gid: u32, t: i64) -> Meta {
    Meta { mode, uid, gid, atime: (t + 17, 987_654_321), mtime: (t, 123_456_789) }
}

fn file(content: Content) -> EntryKind {
    EntryKind::File { content, xattrs: BTreeMap::new(), acl: None }
}

fn entry(dir: usize, name: usize, kind: EntryKind, meta: Meta) -> EntrySpec {
    EntrySpec { dir, name, kind, meta }
}

fn dir(parent: usize, name: usize, meta: Meta) -> DirSpec {
    DirSpec { parent, name, meta, xattrs: BTreeMap::new(), acl: None, default_acl: None, late_default_acl: false }
}

fn named_acl() -> Acl {
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
fn fixed_spec() -> TreeSpec {
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

/// Every codec restores exactly, and the blobs really are stored with the codec asked for.
#[test]
fn every_codec_round_trips() {
    let spec = fixed_spec();
    for (init, backup, want) in [
        ("none", None, Codec::None),
        ("lz4", None, Codec::Lz4),
        ("zstd:1", None, Codec::Zstd(1)),
        ("zstd:19", None, Codec::Zstd(19)),
        ("zstd:3", Some("lz4"), Codec::Lz4),
    ] {
        let fx = Fixture::new(&spec);
        fx.cairn.init(&["--compression", init]);
        match backup {
            Some(c) => fx.backup(&["--compression", c]),
            None => fx.backup(&[]),
        };
        fx.restore_and_compare("latest", "restore");
        let blobs = fx.cairn.stored_blobs();
        assert!(!blobs.is_empty());
        for b in &blobs {
            assert!(
                b.codec == want || b.codec == Codec::None,
                "init {init}, backup {backup:?}: blob {:?} stored with {:?}, wanted {want:?}",
                b.id,
                b.codec
            );
        }
        if want != Codec::None {
            assert!(blobs.iter().any(|b| b.codec == want), "init {init}, backup {backup:?}: no blob used {want:?}");
        }
    }
}

/// One repository holding blobs of several codecs restores each snapshot exactly.
#[test]
fn mixed_codecs_in_one_repository() {
    let fx = Fixture::new(&fixed_spec());
    fx.cairn.init(&["--compression", "zstd:3"]);
    let first = fx.backup(&["--compression", "lz4"]);
    // Change the compressible file so the second backup stores new (zstd) blobs.
    let changed = fx.src.join("e0");
    fs::OpenOptions::new()
        .append(true)
        .open(&changed)
        .expect("open")
        .write_all(&compressible(100 * KIB, 77))
        .expect("append");
    let before_change = fx.before.clone();
    let fx = Fixture { before: scan_source(&fx.src), ..fx };
    let second = fx.backup(&[]);
    let codecs: BTreeSet<String> = fx.cairn.stored_blobs().iter().map(|b| format!("{:?}", b.codec)).collect();
    assert!(codecs.contains("Lz4") && codecs.contains("Zstd(3)"), "{codecs:?}");

    let first_id = first["snapshot_id"].as_str().expect("id");
    let target = fx.base.path().join("first");
    fx.cairn.restore(&first_id[..12], &target);
    assert_same(&before_change, &scan(&restored_path(&target, &fx.src)), true);
    let second_id = second["snapshot_id"].as_str().expect("id");
    fx.restore_and_compare(second_id, "second");
}

/// Identical content is stored once within a backup, a second backup of an unchanged tree adds
/// no data blobs, and a third adds nothing at all for the tree (only the directories above it,
/// whose times other processes may change, can be new). Backups list directories without
/// changing their access times; the test's own scans undo theirs.
#[test]
fn unchanged_data_is_not_stored_twice() {
    let base = tempfile::tempdir().expect("tempdir");
    let src = base.path().join("src");
    fs::create_dir_all(src.join("sub")).expect("mkdir");
    let random = Rng(42).bytes(MIB);
    fs::write(src.join("a.bin"), &random).expect("write");
    fs::write(src.join("sub/copy-of-a.bin"), &random).expect("write");
    fs::write(src.join("text.txt"), compressible(256 * KIB, 1)).expect("write");
    let before = scan_source(&src);

    let cairn = Cairn::new(&base.path().join("repo"), PASSWORD);
    cairn.init(&["--chunk-sizes", "16384,65536,262144"]);
    let first = cairn.backup(&[&src], &[]);
    let blobs1 = cairn.stored_blobs();
    let raw = |blobs: &[&StoredBlob]| blobs.iter().map(|b| u64::from(b.raw_length)).sum::<u64>();
    let all1: Vec<&StoredBlob> = blobs1.iter().collect();
    assert_eq!(first["bytes_added"], raw(&all1), "bytes_added must count every new blob once: {first}");
    let data1: Vec<&StoredBlob> = blobs1.iter().filter(|b| b.kind == BlobKind::Data).collect();
    assert_eq!(raw(&data1), (MIB + 256 * KIB) as u64, "the copy of a.bin must not be stored again");
    assert_eq!(first["bytes_read"], (2 * MIB + 256 * KIB) as u64, "{first}");

    // Blobs a backup added, checking that bytes_added counts exactly them.
    let added = |summary: &serde_json::Value, old: &[StoredBlob]| -> Vec<StoredBlob> {
        let old: BTreeSet<_> = old.iter().map(|b| b.id).collect();
        let new: Vec<StoredBlob> = cairn.stored_blobs().into_iter().filter(|b| !old.contains(&b.id)).collect();
        assert_eq!(summary["bytes_added"], raw(&new.iter().collect::<Vec<_>>()), "{summary}");
        new
    };
    // What the second and third backups see: nothing touches the tree between them (resetting
    // the scan's atime updates changes ctimes, which the second backup records).
    let after_second = scan_source(&src);
    let second = cairn.backup(&[&src], &[]);
    let new2 = added(&second, &blobs1);
    for b in &new2 {
        assert_eq!(b.kind, BlobKind::Tree, "the second backup stored data blob {:?} again", b.id);
    }
    let blobs2 = cairn.stored_blobs();

    let third = cairn.backup(&[&src], &[]);
    let new3 = added(&third, &blobs2);
    let id = |s: &serde_json::Value| s["snapshot_id"].as_str().expect("id").to_string();
    assert_eq!(cairn.subtree_id(&id(&second), &src), cairn.subtree_id(&id(&third), &src));
    let ancestors = src.components().count() - 1;
    assert!(new3.len() <= ancestors, "{} new blobs for {ancestors} ancestor directories", new3.len());

    // Each snapshot restores the tree as it was.
    for (i, (s, want)) in [(&first, &before), (&third, &after_second)].into_iter().enumerate() {
        let target = base.path().join(format!("restore{i}"));
        cairn.restore(&id(s), &target);
        assert_same(want, &scan(&restored_path(&target, &src)), true);
    }
}

/// `restore SNAP:/abs/dir` puts that directory's contents straight into the target (not the
/// directory itself, nor anything beside it); `SNAP:/abs/file` restores just that file.
#[test]
fn restore_of_a_path_inside_the_snapshot() {
    let base = tempfile::tempdir().expect("tempdir");
    let src = base.path().join("src");
    fs::create_dir(&src).expect("mkdir");
    let sub = src.join("sub");
    materialize(&fixed_spec(), &sub);
    fs::write(src.join("beside.txt"), b"next to sub\n").expect("write");
    // A hard link from outside `sub` to a file inside it: restored alone, it is a plain file.
    fs::hard_link(sub.join("e5"), src.join("outside-link")).expect("link");
    common::set_times(&src.join("beside.txt"), (1_234_567_890, 5), (1_234_567_891, 6));
    let whole = scan_source(&src);
    let sub_scan: Scan =
        whole.iter().filter_map(|(p, m)| p.strip_prefix("sub").ok().map(|r| (r.to_path_buf(), m.clone()))).collect();

    let cairn = Cairn::new(&base.path().join("repo"), PASSWORD);
    cairn.init(&[]);
    cairn.backup(&[&src], &[]);
    let sub_spec = format!("latest:{}", sub.display());

    let t1 = base.path().join("t1/does/not/exist/yet");
    cairn.restore(&sub_spec, &t1);
    assert_same(&sub_scan, &scan(&t1), false);
    assert!(!t1.join("sub").exists() && !t1.join("beside.txt").exists());

    let t2 = base.path().join("t2");
    cairn.restore(&format!("{sub_spec}/"), &t2);
    assert_same(&sub_scan, &scan(&t2), false);

    // A single file lands as TARGET/NAME.
    let t3 = base.path().join("t3");
    cairn.restore(&format!("latest:{}", src.join("beside.txt").display()), &t3);
    let want: Scan = [
        (PathBuf::new(), whole[Path::new("")].clone()),
        (PathBuf::from("beside.txt"), whole[Path::new("beside.txt")].clone()),
    ]
    .into();
    assert_same(&want, &scan(&t3), false);

    // `ls SNAP:/abs/dir` lists the same entries (JSON, since some names hold newlines).
    let listed: BTreeSet<String> = cairn
        .ok(["--json", "ls", sub_spec.as_str()])
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("JSON line");
            v["path"].as_str().expect("path").to_string()
        })
        .collect();
    let expected: BTreeSet<String> = sub_scan
        .keys()
        .filter(|p| !p.as_os_str().is_empty())
        .map(|p| format!("{}/{}", sub.display(), p.to_string_lossy()))
        .collect();
    assert_eq!(listed, expected);

    // The whole snapshot still restores everything, `sub` included.
    let t4 = base.path().join("t4");
    cairn.restore("latest", &t4);
    assert_same(&whole, &scan(&restored_path(&t4, &src)), true);
}

/// Restoring a snapshot again into the same target leaves an exact copy: entries that exist
/// are replaced, and nothing of the first restore (such as a directory's default ACL, which
/// new files would inherit) leaks into the second.
#[test]
fn restoring_over_an_earlier_restore_is_exact() {
    let fx = Fixture::new(&fixed_spec());
    fx.cairn.init(&[]);
    fx.backup(&[]);
    fx.restore_and_compare("latest", "restore");
    fx.restore_and_compare("latest", "restore");
}

/// A default ACL on the restore target is not inherited by what the restore makes: every entry
/// gets exactly the mode and ACLs of the snapshot, as with any other target.
#[test]
fn default_acl_of_the_target_does_not_leak_into_the_restore() {
    let fx = Fixture::new(&fixed_spec());
    fx.cairn.init(&[]);
    fx.backup(&[]);
    let target = fx.base.path().join("acl-target");
    fs::create_dir(&target).expect("mkdir");
    set_acl(&target, "system.posix_acl_default", &named_acl());
    fx.restore_and_compare("latest", "acl-target");
}

/// Restoring over entries that changed kind, size or hard-link grouping replaces them without
/// writing through them: a name that is no longer a hard link does not drag its old partner
/// along, and a symlink where a file belongs is replaced, not followed.
#[test]
fn restoring_over_changed_entries_touches_only_what_the_snapshot_holds() {
    let base = tempfile::tempdir().expect("tempdir");
    let src = base.path().join("src");
    let outside = base.path().join("outside.txt");
    fs::write(&outside, b"precious, outside the target\n").expect("write");
    let cairn = Cairn::new(&base.path().join("repo"), PASSWORD);
    cairn.init(&[]);

    // Snapshot A.
    fs::create_dir_all(src.join("d2f")).expect("mkdir");
    fs::write(src.join("x"), b"version A\n").expect("write");
    fs::hard_link(src.join("x"), src.join("y")).expect("link");
    fs::write(src.join("f2d"), b"a file in A\n").expect("write");
    fs::write(src.join("d2f/child"), b"child in A\n").expect("write");
    std::os::unix::fs::symlink(&outside, src.join("s2f")).expect("symlink");
    fs::write(src.join("shrinks"), Rng(1).bytes(300 * KIB)).expect("write");
    fs::write(src.join("grows"), b"short").expect("write");
    let scan_a = scan_source(&src);
    let id_a = cairn.backup(&[&src], &[])["snapshot_id"].as_str().expect("id").to_string();

    // Snapshot B: the same names, changed.
    fs::remove_dir_all(&src).expect("rm");
    fs::create_dir_all(src.join("f2d")).expect("mkdir");
    fs::write(src.join("x"), b"version B, no longer linked\n").expect("write");
    fs::write(src.join("f2d/child"), b"child in B\n").expect("write");
    fs::write(src.join("d2f"), b"a file in B\n").expect("write");
    fs::write(src.join("s2f"), b"a file where A had a symlink\n").expect("write");
    fs::write(src.join("shrinks"), Rng(2).bytes(10 * KIB)).expect("write");
    fs::write(src.join("grows"), Rng(3).bytes(200 * KIB)).expect("write");
    let scan_b = scan_source(&src);
    let id_b = cairn.backup(&[&src], &[])["snapshot_id"].as_str().expect("id").to_string();

    for delete in [false, true] {
        let t = base.path().join(format!("t-{delete}"));
        cairn.restore(&id_a, &t);
        let restored = restored_path(&t, &src);
        assert_same(&scan_a, &scan(&restored), true);
        let opts: &[&str] = if delete { &["--delete"] } else { &[] };
        cairn.restore_with(&id_b, &t, opts);
        let mut got = scan(&restored);
        assert_eq!(fs::read(&outside).expect("read"), b"precious, outside the target\n");
        if delete {
            assert!(!got.contains_key(Path::new("y")), "--delete left y");
        } else {
            let y = got.remove(Path::new("y")).expect("y is left alone");
            assert_eq!(fs::read(restored.join("y")).expect("read y"), b"version A\n", "y was written through x");
            assert_eq!(y.mtime, scan_a[Path::new("y")].mtime);
        }
        assert_same(&scan_b, &got, true);
    }
}

/// `--preallocate` reserves a file's data before writing it: the restore is still exact, and a
/// file that is one extent in the source is not cut into hundreds (small chunks must not mean
/// one small reservation each).
#[test]
fn preallocated_restores_are_exact_and_not_fragmented() {
    let base = tempfile::tempdir().expect("tempdir");
    let src = base.path().join("src");
    fs::create_dir(&src).expect("mkdir");
    fs::write(src.join("big.bin"), Rng(7).bytes(4 * MIB)).expect("write");
    write_content(
        &src.join("sparse.img"),
        &Content::Sparse { size: 8 * MIB as u64, writes: vec![(100, 200_000, 1), (700, 300_000, 2)] },
    );
    let before = scan_source(&src);
    let cairn = Cairn::new(&base.path().join("repo"), PASSWORD);
    cairn.init(&["--chunk-sizes", "1024,4096,16384"]);
    cairn.backup(&[&src], &[]);
    for opts in [&[][..], &["--preallocate"][..]] {
        let target = base.path().join(format!("restore{}", opts.len()));
        cairn.restore_with("latest", &target, opts);
        let restored = restored_path(&target, &src);
        let diffs = common::differences(&before, &scan(&restored), true);
        assert!(diffs.is_empty(), "restore {opts:?}: {diffs:#?}");
        for name in ["big.bin", "sparse.img"] {
            let (a, b) = (common::extent_count(&src.join(name)), common::extent_count(&restored.join(name)));
            assert!(b <= 2 * a + 8, "{opts:?}: {name} has {a} extents in the source, {b} restored");
        }
    }
}

/// The generator's own sanity: a fixed tree really holds every kind of entry, holes, ACLs,
/// xattrs and a three-name hard-link group (so the other tests cover what they claim).
#[test]
fn fixed_tree_covers_every_entry_kind() {
    let base = tempfile::tempdir().expect("tempdir");
    let root = base.path().join("src");
    materialize(&fixed_spec(), &root);
    let s = scan(&root);
    let kinds: BTreeSet<Kind> = s.values().map(|m| m.kind).collect();
    for k in [Kind::File, Kind::Dir, Kind::Symlink, Kind::Fifo, Kind::CharDevice, Kind::BlockDevice] {
        assert!(kinds.contains(&k), "no {k:?}");
    }
    assert!(s.values().any(|m| m.nlink == 3 && m.kind == Kind::File));
    assert!(s.values().any(|m| m.kind == Kind::File && m.size >= MIB as u64 && m.blocks * 512 * 8 < m.size));
    for x in ["system.posix_acl_access", "system.posix_acl_default", "user.cairn.test0"] {
        assert!(s.values().any(|m| m.xattrs.contains_key(x.as_bytes())), "no {x}");
    }
    assert!(s.values().any(|m| m.mode & 0o4000 != 0));
    assert!(s.values().any(|m| m.mode & 0o2000 != 0));
    assert!(s.values().any(|m| m.mode & 0o1000 != 0));
    assert!(s.values().any(|m| m.mtime.0 < 0));
    assert!(s.keys().any(|p| std::str::from_utf8(p.as_os_str().as_bytes()).is_err()));
}

/// Issue 16, edge case 1: a tree deeper than PATH_MAX (4096 bytes) — 20 nested directories of
/// 250-byte names, a file at every level and every kind of entry in the deepest — backs up,
/// restores, compares and verifies exactly. No path reaches its deep entries (`open` by full
/// path fails with ENAMETOOLONG), so it is built, scanned and changed through open directories.
#[test]
fn paths_longer_than_path_max_round_trip() {
    use common::{deep, in_dir, mkdir_in, scan_deep, scan_source_deep};
    let base = tempfile::tempdir().expect("tempdir");
    let src = base.path().join("src");
    fs::create_dir(&src).expect("mkdir");
    let mut rng = Rng(16);
    let mut dir = fs::File::open(&src).expect("open src");
    let mut deepest = src.clone();
    for level in 0..20usize {
        fs::write(in_dir(&dir, "f"), rng.bytes(1000 + level * 997)).expect("write");
        let name = format!("{level:02}{}", "d".repeat(248));
        let sub = mkdir_in(&dir, &name, 0o755);
        xattr::set(in_dir(&dir, &name), "user.level", level.to_string().as_bytes()).expect("xattr");
        deepest.push(&name);
        dir = sub;
    }
    assert!(deepest.as_os_str().len() > 5000, "{} bytes", deepest.as_os_str().len());
    // The deepest directory: a file with data and a hole, a hard link to it, a symlink, a FIFO.
    let file = in_dir(&dir, "file");
    let f = fs::File::create(&file).expect("create");
    f.write_all_at(&rng.bytes(300 * KIB), 0).expect("write");
    f.set_len(2 * MIB as u64).expect("set_len");
    drop(f);
    fs::set_permissions(&file, fs::Permissions::from_mode(0o640)).expect("chmod");
    xattr::set(&file, "user.deep", b"at the bottom").expect("xattr");
    fs::hard_link(&file, in_dir(&dir, "link")).expect("link");
    std::os::unix::fs::symlink("../../somewhere/else", in_dir(&dir, "sym")).expect("symlink");
    let fifo = std::ffi::CString::new(in_dir(&dir, "fifo").into_os_string().into_vec()).expect("no NUL");
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0, "mkfifo");
    fs::write(in_dir(&dir, "empty"), b"").expect("write");
    fs::set_permissions(in_dir(&dir, "."), fs::Permissions::from_mode(0o750)).expect("chmod");
    drop(dir);
    let before = scan_source_deep(&src);
    assert_eq!(before.len(), 1 + 20 * 2 + 5, "{:?}", before.keys().collect::<Vec<_>>());

    let cairn = Cairn::new(&base.path().join("repo"), PASSWORD);
    cairn.init(&[]);
    cairn.backup(&[&src], &[]);
    let target = base.path().join("restore");
    let summary = cairn.restore("latest", &target);
    let restored = restored_path(&target, &src);
    assert_same(&before, &scan_deep(&restored), true);
    assert_eq!(summary["files"], 20 + 3, "{summary}");

    // Into the same, complete target: the comparison finds every file in place — except the
    // hard-linked one, which a restore replaces rather than write through, so only its 300 KiB
    // of data are written — and --verify reads each back.
    let summary = cairn.restore_with("latest", &target, &["--verify"]);
    assert_eq!(summary["bytes_written"], 300 * KIB, "{summary}");
    assert_eq!(summary["verified"], summary["files"], "{summary}");
    assert_same(&before, &scan_deep(&restored), true);

    // Damage at the bottom: changed bytes and mode, a file replaced by a directory, an entry
    // the snapshot lacks. The restore puts back exactly the snapshot (--delete removes the extra).
    let (dir, f19) = deep(&restored.join(deepest.strip_prefix(&src).unwrap()).parent().unwrap().join("f"));
    fs::OpenOptions::new().write(true).open(&f19).expect("open").write_all_at(b"damage", 10).expect("write");
    fs::set_permissions(&f19, fs::Permissions::from_mode(0o600)).expect("chmod");
    drop(dir);
    let (dir, bottom) = deep(&restored.join(deepest.strip_prefix(&src).unwrap()));
    fs::remove_file(bottom.join("empty")).expect("rm");
    fs::create_dir(bottom.join("empty")).expect("mkdir");
    fs::write(bottom.join("extra"), b"not in the snapshot").expect("write");
    drop(dir);
    let summary = cairn.restore_with("latest", &target, &["--delete", "--verify"]);
    assert!(summary["bytes_written"].as_u64().unwrap() > 0, "{summary}");
    assert_eq!(summary["deleted"], 1, "{summary}");
    assert_same(&before, &scan_deep(&restored), true);
}

/// Issue 16, edge case 2: `SNAP:PATH` with a path that is not UTF-8 works for `ls`, `dump` and
/// `restore` (the argument used to be refused by the parser with exit code 2).
#[test]
fn snapshot_paths_need_not_be_utf8() {
    let base = tempfile::tempdir().expect("tempdir");
    let src = base.path().join("src");
    let dir_name = OsString::from_vec(b"r\xe9pertoire".to_vec());
    let file_name = OsString::from_vec(b"caf\xe9.txt".to_vec());
    fs::create_dir_all(src.join(&dir_name)).unwrap();
    let content = compressible(300_000, 7);
    fs::write(src.join(&dir_name).join(&file_name), &content).unwrap();
    let c = Cairn::new(&base.path().join("repo"), PASSWORD);
    c.init(&[]);
    c.backup(&[&src], &[]);
    let spec = |p: &Path| {
        let mut s = OsString::from("latest:");
        s.push(p.as_os_str());
        s
    };
    let file = src.join(&dir_name).join(&file_name);
    let listed = c.run(["ls".into(), spec(&src.join(&dir_name))]);
    assert!(listed.status.success(), "{listed:?}");
    // Names are shown for people (not UTF-8: replacement characters).
    assert!(String::from_utf8_lossy(&listed.stdout).contains("caf\u{FFFD}.txt"), "{listed:?}");
    let dumped = c.run(["dump".into(), spec(&file)]);
    assert!(dumped.status.success(), "{dumped:?}");
    assert_eq!(dumped.stdout, content);
    let target = base.path().join("t");
    let restored =
        c.run([OsString::from("restore"), spec(&src.join(&dir_name)), "--target".into(), target.clone().into()]);
    assert!(restored.status.success(), "{restored:?}");
    assert_eq!(fs::read(target.join(&file_name)).unwrap(), content);
    let missing = c.run(["dump".into(), spec(&src.join(OsString::from_vec(b"n\xffpe".to_vec())))]);
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
}
