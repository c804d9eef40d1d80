//! Golden test vectors: bytes written by repository format version 1 that every later version
//! of Cairn must still read exactly (docs/FORMAT.md §11).
//!
//! The vectors live in `crates/cairn-cli/tests/golden/` (beside the `e2e/` folder):
//!
//! * `golden/repo-v1/` — a repository (password `golden-password`, Argon2id 1 MiB / 1 pass,
//!   chunk sizes 1/4/16 KiB, 1 MiB packs) holding one snapshot of the tree [`golden_source`]
//!   builds at [`GOLDEN_SOURCE`], made with `cairn --host golden-host backup --tag golden`.
//! * `golden/manifest-v1.txt` — every entry of that tree as it was on disk: path, type, mode,
//!   owner, size, mtime and atime in nanoseconds, an FNV-1a 64 hash of the content (or the
//!   symlink target), xattrs and ACLs, hard-link group, and whether the file was sparse.
//! * `golden/config-v2.json`, `golden/snapshot-original-v2.bin` — plaintexts of a version 2
//!   config (with a copied chunk-ID key, §6) and of a snapshot made by `cairn copy` (§10).
//! * `golden/sealed-config-v1.bin`, `golden/sealed-snapshot-v1.bin` — sealed files (§4) and
//!   `golden/pack-v1.bin` — a pack (§7), all under the master secret `0x42 × 32`.
//!
//! The vectors are committed and must never change. To make them again (only for a deliberate
//! format change; a new format version should add `repo-v2` beside v1, not replace it), run as
//! root on a file system with xattrs and ACLs:
//!
//! ```text
//! cargo test -p cairn-cli --test e2e -- --ignored golden::generate_golden_repository
//! ```

use crate::support;
use crate::support::library;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::support::library::compress::Codec;
use crate::support::library::crypto::MasterKey;
use crate::support::library::pack::{decode_blob, read_header, BlobKind, PackWriter};
use crate::support::library::sealed::{self, SealedKind};
use crate::support::library::tree::{Chunk, Node, NodeKind};
use support::{is_root, read_noatime, restored_path, scan, scan_source, Cairn, Kind, Meta, Scan};

/// Where the golden tree was when it was backed up (recorded in the snapshot).
const GOLDEN_SOURCE: &str = "/tmp/cairn-golden-v1/src";
const GOLDEN_PASSWORD: &str = "golden-password";
const GOLDEN_HOST: &str = "golden-host";
const GOLDEN_TAG: &str = "golden";

/// `blob_id(b"cairn golden vector")` under master secret `0x42 × 32`: keyed BLAKE3 with key
/// `BLAKE3-derive("cairn 2026-11-22 chunk id key v1", secret)`.
const GOLDEN_BLOB_ID: &str = "a7d83b594e433555977c5d53fb15a0315e7c854525eb491d7a3cc20220f92db5";
/// `blob_id(b"")` under the same key.
const GOLDEN_EMPTY_BLOB_ID: &str = "29dcf8469ee9d4df1478f729490acd437357664257e3d5c95be4c7b2c5720769";

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn golden_key() -> MasterKey {
    MasterKey::from_secret([0x42; 32])
}

// ---------------------------------------------------------------------------------------------
// The golden source tree. Frozen: changing anything here breaks the committed vectors.
// ---------------------------------------------------------------------------------------------

/// xorshift64*: the golden tree's only source of "random" bytes.
fn golden_random(len: usize, mut state: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

fn golden_text(len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut n = 0;
    while out.len() < len {
        out.extend_from_slice(format!("golden line {n:05}: the quick brown fox jumps over the lazy dog\n").as_bytes());
        n += 1;
    }
    out.truncate(len);
    out
}

/// A POSIX ACL in the kernel's xattr encoding: `(tag, perm, id)` entries.
fn acl_xattr(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut out = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

const NO_ID: u32 = u32::MAX;

/// Regular files: path, mode, content.
fn golden_files() -> Vec<(&'static str, u32, Vec<u8>)> {
    vec![
        ("README.txt", 0o644, b"Cairn golden repository, format version 1.\nDo not regenerate casually.\n".to_vec()),
        ("compressible.txt", 0o644, golden_text(96 * 1024)),
        // Incompressible and several chunks long with 1/4/16 KiB chunking.
        ("random.bin", 0o600, golden_random(40 * 1024, 0x601d_e7a1_5eed)),
        ("zeros.bin", 0o644, vec![0u8; 20_000]),
        ("empty", 0o400, Vec::new()),
        ("setuid-tool", 0o4755, b"#!/bin/sh\necho golden\n".to_vec()),
        ("dir/nested.txt", 0o644, b"nested file\n".to_vec()),
        ("dir/hardlink-a", 0o640, b"hard link content\n".to_vec()),
        ("dir/acl-file", 0o664, b"file with an access ACL\n".to_vec()),
        ("dir/subdir/deep.txt", 0o444, b"deep\n".to_vec()),
    ]
}

/// Size of the sparse file and its two data ranges.
const SPARSE_SIZE: u64 = 1024 * 1024 + 3;
const SPARSE_DATA: [(u64, usize); 2] = [(256 * 1024, 3000), (SPARSE_SIZE - 3, 3)];

fn sparse_bytes(i: usize, len: usize) -> Vec<u8> {
    if i == 0 {
        b"SPARSE-".iter().copied().cycle().take(len).collect()
    } else {
        b"END".to_vec()
    }
}

/// Fixed times: entry `k` gets mtime `1_700_000_000 + k days` plus a distinct nanosecond part,
/// atime 1000 s later.
fn golden_times(k: i64) -> ((i64, i64), (i64, i64)) {
    let mtime = (1_700_000_000 + k * 86_400, (k * 111_111_111 + 7) % 1_000_000_000);
    ((mtime.0 + 1000, (mtime.1 + 1) % 1_000_000_000), mtime)
}

/// Builds the golden tree at `root` (which must not exist). Needs root for the ownership.
fn golden_source(root: &Path) {
    for d in ["", "empty-dir", "dir", "dir/subdir"] {
        fs::create_dir(root.join(d)).expect("mkdir");
    }
    for (path, _, content) in golden_files() {
        fs::write(root.join(path), content).expect("write");
    }
    let sparse = fs::File::create(root.join("sparse.img")).expect("create");
    sparse.set_len(SPARSE_SIZE).expect("set_len");
    for (i, &(offset, len)) in SPARSE_DATA.iter().enumerate() {
        sparse.write_all_at(&sparse_bytes(i, len), offset).expect("write_at");
    }
    drop(sparse);
    fs::hard_link(root.join("dir/hardlink-a"), root.join("hardlink-b")).expect("link");
    std::os::unix::fs::symlink("README.txt", root.join("link-rel")).expect("symlink");
    std::os::unix::fs::symlink("/nonexistent/cairn/golden/target", root.join("link-dangling")).expect("symlink");
    std::os::unix::fs::symlink("../random.bin", root.join("dir/link-up")).expect("symlink");
    let fifo = std::ffi::CString::new(root.join("fifo").as_os_str().as_bytes()).expect("path");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0, "mkfifo");

    // Ownership, modes, xattrs, ACLs.
    let chown =
        |p: &str, uid: u32, gid: u32| std::os::unix::fs::lchown(root.join(p), Some(uid), Some(gid)).expect("chown");
    chown("dir/hardlink-a", 1234, 5678);
    chown("dir", 1000, 1000);
    chown("link-rel", 4321, 8765);
    let chmod =
        |p: &str, mode: u32| fs::set_permissions(root.join(p), fs::Permissions::from_mode(mode)).expect("chmod");
    for (path, mode, _) in golden_files() {
        chmod(path, mode);
    }
    chmod("sparse.img", 0o644);
    chmod("fifo", 0o640);
    chmod("", 0o755);
    chmod("empty-dir", 0o700);
    chmod("dir", 0o2750);
    chmod("dir/subdir", 0o1777);
    xattr::set(root.join("dir/nested.txt"), "user.golden", b"golden-value\x00\x01\xff").expect("xattr");
    xattr::set(root.join("dir"), "user.golden.dir", b"on a directory").expect("xattr");
    xattr::set(
        root.join("dir/acl-file"),
        "system.posix_acl_access",
        &acl_xattr(&[
            (0x01, 6, NO_ID),
            (0x02, 4, 1001),
            (0x04, 4, NO_ID),
            (0x08, 6, 2002),
            (0x10, 6, NO_ID),
            (0x20, 4, NO_ID),
        ]),
    )
    .expect("ACL");
    // Set after the directory's entries exist, so they do not inherit it.
    xattr::set(
        root.join("dir/subdir"),
        "system.posix_acl_default",
        &acl_xattr(&[(0x01, 7, NO_ID), (0x02, 5, 1001), (0x04, 5, NO_ID), (0x10, 5, NO_ID), (0x20, 0, NO_ID)]),
    )
    .expect("default ACL");

    // Times last, children before their directories.
    let order = [
        "README.txt",
        "compressible.txt",
        "random.bin",
        "zeros.bin",
        "empty",
        "setuid-tool",
        "dir/nested.txt",
        "dir/hardlink-a",
        "dir/acl-file",
        "dir/subdir/deep.txt",
        "sparse.img",
        "link-rel",
        "link-dangling",
        "dir/link-up",
        "fifo",
        "dir/subdir",
        "dir",
        "empty-dir",
        "",
    ];
    for (k, p) in order.iter().enumerate() {
        let (atime, mtime) = golden_times(k as i64);
        support::set_times(&root.join(p), atime, mtime);
    }
}

// ---------------------------------------------------------------------------------------------
// The manifest
// ---------------------------------------------------------------------------------------------

const MANIFEST_HEADER: &str = "\
# Cairn golden manifest, format version 1: every entry of the tree in repo-v1, as it was on
# disk when it was backed up. Tab-separated: path, type, mode (octal), uid, gid, size (files
# and symlinks), mtime and atime (seconds.nanoseconds), content (FNV-1a 64 of a file's bytes,
# or a symlink's target), xattrs (name=hex, ACLs included), hard-link group (link count and
# first path), and `sparse` when the file was mostly holes (a restore must keep holes).
";

fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The manifest fields of every entry of the tree at `root`, scanned as `s`.
fn manifest_rows(root: &Path, s: &Scan) -> Vec<Vec<String>> {
    let mut groups: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let rel_name = |p: &Path| {
        if p.as_os_str().is_empty() {
            ".".to_string()
        } else {
            p.to_str().expect("golden names are ASCII").to_string()
        }
    };
    for (p, m) in s {
        if m.kind != Kind::Dir {
            groups.entry(m.ino).or_default().push(rel_name(p));
        }
    }
    s.iter()
        .map(|(p, m): (&PathBuf, &Meta)| {
            let abs = root.join(p);
            let content = match m.kind {
                Kind::File => format!("fnv1a64={:016x}", fnv1a64(&read_noatime(&abs))),
                Kind::Symlink => {
                    format!("target={}", std::str::from_utf8(m.target.as_deref().expect("target")).expect("ASCII"))
                }
                Kind::CharDevice | Kind::BlockDevice => format!("rdev={:#x}", m.rdev),
                _ => "-".to_string(),
            };
            let xattrs = if m.xattrs.is_empty() {
                "-".to_string()
            } else {
                m.xattrs
                    .iter()
                    .map(|(k, v)| format!("{}={}", String::from_utf8_lossy(k), hex(v)))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let links = match groups.get(&m.ino) {
                Some(g) if m.kind != Kind::Dir && g.len() > 1 => format!("links={}:{}", g.len(), g[0]),
                _ => "-".to_string(),
            };
            let sparse = m.kind == Kind::File && m.size >= 64 * 1024 && m.blocks * 512 * 2 < m.size;
            vec![
                rel_name(p),
                m.kind.name().to_string(),
                format!("{:04o}", m.mode),
                m.uid.to_string(),
                m.gid.to_string(),
                match m.kind {
                    Kind::File | Kind::Symlink => m.size.to_string(),
                    _ => "-".to_string(),
                },
                format!("{}.{:09}", m.mtime.0, m.mtime.1),
                format!("{}.{:09}", m.atime.0, m.atime.1),
                content,
                xattrs,
                links,
                if sparse { "sparse" } else { "-" }.to_string(),
            ]
        })
        .collect()
}

fn render_manifest(rows: &[Vec<String>]) -> String {
    let mut out = format!("{MANIFEST_HEADER}source\t{GOLDEN_SOURCE}\n");
    for r in rows {
        out.push_str(&r.join("\t"));
        out.push('\n');
    }
    out
}

/// Parses `manifest-v1.txt`: (source path, rows).
fn parse_manifest(text: &str) -> (String, Vec<Vec<String>>) {
    let mut source = None;
    let mut rows = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let fields: Vec<String> = line.split('\t').map(str::to_string).collect();
        if fields[0] == "source" && fields.len() == 2 {
            source = Some(fields[1].clone());
        } else {
            assert_eq!(fields.len(), 12, "bad manifest line {line:?}");
            rows.push(fields);
        }
    }
    (source.expect("manifest names its source"), rows)
}

// ---------------------------------------------------------------------------------------------
// Generator
// ---------------------------------------------------------------------------------------------

fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("mkdir");
    for e in fs::read_dir(from).expect("list") {
        let e = e.expect("entry");
        let dest = to.join(e.file_name());
        if e.file_type().expect("type").is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            fs::copy(e.path(), &dest).expect("copy");
        }
    }
}

/// Plaintexts of the golden pack: (kind, codec, bytes).
fn golden_pack_blobs() -> Vec<(BlobKind, Codec, Vec<u8>)> {
    vec![
        (BlobKind::Data, Codec::None, b"cairn golden pack blob 0, stored as is".to_vec()),
        (BlobKind::Data, Codec::Lz4, golden_text(5000)),
        (BlobKind::Tree, Codec::Zstd(3), golden_text(7000)),
        (BlobKind::Data, Codec::Zstd(19), golden_random(300, 7).repeat(10)),
    ]
}

const SEALED_CONFIG_BODY: &[u8] = b"{\"golden\":\"config\"}";

fn sealed_snapshot_body() -> Vec<u8> {
    golden_text(3000)
}

/// Makes every golden vector. See the top of this file; not run by default.
#[test]
#[ignore = "regenerates the committed golden vectors"]
fn generate_golden_repository() {
    assert!(is_root(), "the generator must run as root (it sets owners)");
    let dir = golden_dir();
    fs::create_dir_all(&dir).expect("mkdir golden");

    // Unit-level vectors.
    let key = golden_key();
    fs::write(dir.join("sealed-config-v1.bin"), sealed::seal(&key, SealedKind::Config, SEALED_CONFIG_BODY))
        .expect("write");
    fs::write(dir.join("sealed-snapshot-v1.bin"), sealed::seal(&key, SealedKind::Snapshot, &sealed_snapshot_body()))
        .expect("write");
    let mut w = PackWriter::new(&key, 0);
    for (kind, codec, plain) in golden_pack_blobs() {
        let stored = match codec {
            Codec::None => plain.clone(),
            c => c.compress(&plain).expect("compressible"),
        };
        w.add(key.blob_id(&plain), kind, codec, plain.len() as u32, &stored);
    }
    fs::write(dir.join("pack-v1.bin"), w.finish().bytes).expect("write");

    // The repository.
    let source = Path::new(GOLDEN_SOURCE);
    let parent = source.parent().expect("parent");
    if parent.exists() {
        fs::remove_dir_all(parent).expect("remove old source");
    }
    fs::create_dir_all(parent).expect("mkdir");
    golden_source(source);
    let s = scan_source(source);
    let manifest = render_manifest(&manifest_rows(source, &s));

    let repo = dir.join("repo-v1");
    if repo.exists() {
        fs::remove_dir_all(&repo).expect("remove old repository");
    }
    let cairn = Cairn::new(&repo, GOLDEN_PASSWORD);
    cairn.init(&["--chunk-sizes", "1024,4096,16384", "--pack-size", "1", "--compression", "zstd:3"]);
    support::reset_times(source, &s);
    cairn.backup(&[source], &["--host", GOLDEN_HOST, "--tag", GOLDEN_TAG]);
    // Only committed files matter: drop the (empty) temporary directory.
    let _ = fs::remove_dir(repo.join(".tmp"));
    fs::write(dir.join("manifest-v1.txt"), manifest).expect("write manifest");
    fs::remove_dir_all(parent).expect("remove source");

    let total: u64 = walk_files(&repo).iter().map(|p| fs::metadata(p).expect("stat").len()).sum();
    assert!(total < 200 * 1024, "the golden repository is {total} bytes");
}

fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).expect("list") {
        let e = e.expect("entry");
        if e.file_type().expect("type").is_dir() {
            out.extend(walk_files(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

/// Restores the golden repository with the binary and checks every entry against the manifest
/// and, byte for byte, against a freshly built copy of the golden tree.
#[test]
fn golden_repository_v1_restores_exactly() {
    let golden = golden_dir();
    let (source, expected) = parse_manifest(&fs::read_to_string(golden.join("manifest-v1.txt")).expect("manifest"));
    assert_eq!(source, GOLDEN_SOURCE);

    // Work on a copy: the committed repository is never touched.
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path().join("repo");
    copy_tree(&golden.join("repo-v1"), &repo);
    let cairn = Cairn::new(&repo, GOLDEN_PASSWORD);

    let snaps = cairn.snapshots();
    assert_eq!(snaps.len(), 1, "{snaps:?}");
    assert_eq!(snaps[0]["paths"], serde_json::json!([GOLDEN_SOURCE]));
    assert_eq!(snaps[0]["hostname"], GOLDEN_HOST);
    assert_eq!(snaps[0]["tags"], serde_json::json!([GOLDEN_TAG]));

    let target = tmp.path().join("restore");
    cairn.restore("latest", &target);
    let restored = restored_path(&target, Path::new(&source));
    let got = manifest_rows(&restored, &scan(&restored));

    // Owners can only be restored as root; everything else must match exactly.
    let mask = |rows: &[Vec<String>]| -> Vec<String> {
        rows.iter()
            .map(|r| {
                let mut r = r[..11].to_vec();
                if !is_root() {
                    r[3] = "-".into();
                    r[4] = "-".into();
                }
                r.join("\t")
            })
            .collect()
    };
    let (want_lines, got_lines) = (mask(&expected), mask(&got));
    for (w, g) in want_lines.iter().zip(&got_lines) {
        assert_eq!(g, w, "restored entry differs from the manifest");
    }
    assert_eq!(got_lines, want_lines, "restored entries differ from the manifest");
    for (w, g) in expected.iter().zip(&got) {
        if w[11] == "sparse" {
            let m = fs::metadata(restored.join(&w[0])).expect("stat");
            use std::os::unix::fs::MetadataExt;
            assert!(
                m.blocks() * 512 < m.len(),
                "{}: holes were not restored ({} blocks for {} bytes)",
                w[0],
                m.blocks(),
                m.len()
            );
        }
        assert_eq!(g[0], w[0]);
    }

    // Byte for byte against the tree rebuilt from its recipe (owners need root).
    if is_root() {
        let regen = tmp.path().join("regen");
        golden_source(&regen);
        let want = scan(&regen);
        let have = scan(&restored);
        for (p, m) in &want {
            match m.kind {
                Kind::File => {
                    assert_eq!(read_noatime(&restored.join(p)), read_noatime(&regen.join(p)), "{p:?}: content differs")
                }
                Kind::Symlink => assert_eq!(have[p].target, m.target, "{p:?}"),
                _ => {}
            }
        }
        assert_eq!(want.keys().collect::<Vec<_>>(), have.keys().collect::<Vec<_>>());
    }

    // `ls` lists the same paths.
    let listed: Vec<String> = cairn
        .ok(["--json", "ls", &format!("latest:{source}")])
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("JSON");
            v["path"].as_str().expect("path").to_string()
        })
        .collect();
    let mut listed_sorted = listed.clone();
    listed_sorted.sort();
    let mut want_paths: Vec<String> =
        expected.iter().filter(|r| r[0] != ".").map(|r| format!("{source}/{}", r[0])).collect();
    want_paths.sort();
    assert_eq!(listed_sorted, want_paths);
}

/// The golden repository, read with the library: config choices, and file content stored the
/// way the format describes (several chunks, zero chunks for holes and zero runs).
#[test]
fn golden_repository_v1_layout() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo_dir = tmp.path().join("repo");
    copy_tree(&golden_dir().join("repo-v1"), &repo_dir);
    let cairn = Cairn::new(&repo_dir, GOLDEN_PASSWORD);
    let (repo, _) = cairn.open();
    let c = repo.config();
    assert_eq!(c.version, 1);
    assert_eq!((c.chunker.min_size, c.chunker.avg_size, c.chunker.max_size), (1024, 4096, 16384));
    assert_eq!(c.pack_size, 1024 * 1024);
    repo.load_index().expect("index");
    let (_, snap) = repo.find_snapshot("latest").expect("snapshot");

    let mut tree = repo.read_tree(&snap.tree).expect("root tree");
    let mut node: Option<Node> = None;
    for part in GOLDEN_SOURCE.trim_start_matches('/').split('/') {
        if let Some(n) = &node {
            tree = repo.read_tree(&n.subtree.expect("dir")).expect("tree");
        }
        node = Some(tree.nodes.iter().find(|n| n.name == part.as_bytes()).cloned().expect("path in snapshot"));
    }
    let src = repo.read_tree(&node.expect("source").subtree.expect("dir")).expect("source tree");
    let get = |name: &str| -> &Node {
        src.nodes.iter().find(|n| n.name == name.as_bytes()).unwrap_or_else(|| panic!("{name} not in the snapshot"))
    };
    let data_chunks = |n: &Node| n.content.iter().filter(|c| matches!(c, Chunk::Data { .. })).count();
    assert!(data_chunks(get("random.bin")) >= 3, "random.bin is not split");
    assert!(data_chunks(get("compressible.txt")) >= 3);
    assert_eq!(get("zeros.bin").content, vec![Chunk::Zero { len: 20_000 }]);
    let sparse = get("sparse.img");
    assert_eq!(sparse.size, SPARSE_SIZE);
    assert!(matches!(sparse.content[0], Chunk::Zero { len } if len >= 256 * 1024));
    assert!(data_chunks(sparse) >= 1);
    assert_eq!(get("link-rel").kind, NodeKind::Symlink);
    assert_eq!(get("link-rel").target, b"README.txt");
    assert_eq!(get("fifo").kind, NodeKind::Fifo);
    let b = get("hardlink-b");
    assert_eq!(b.links, 2);
    // Every blob the snapshot needs is in the index and decodes to the recorded length.
    for n in &src.nodes {
        for c in &n.content {
            if let Chunk::Data { id, len } = c {
                assert_eq!(repo.read_blob(id).expect("blob").len(), *len as usize);
            }
        }
    }
}

/// The chunk ID function is part of the format: blob IDs must never change.
#[test]
fn blob_id_golden_vectors() {
    let key = golden_key();
    assert_eq!(key.blob_id(b"cairn golden vector").to_hex(), GOLDEN_BLOB_ID);
    assert_eq!(key.blob_id(b"").to_hex(), GOLDEN_EMPTY_BLOB_ID);
}

/// Stored sealed files open to their plaintext, and only as the kind they were sealed as.
#[test]
fn sealed_file_golden_vectors() {
    let key = golden_key();
    for (file, kind, other, body) in [
        ("sealed-config-v1.bin", SealedKind::Config, SealedKind::Snapshot, SEALED_CONFIG_BODY.to_vec()),
        ("sealed-snapshot-v1.bin", SealedKind::Snapshot, SealedKind::Index, sealed_snapshot_body()),
    ] {
        let bytes = fs::read(golden_dir().join(file)).expect("golden sealed file");
        assert_eq!(&bytes[..4], b"CRNS", "{file}");
        assert_eq!(bytes[4], kind as u8, "{file}");
        assert_eq!(bytes[5], 1, "{file}: envelope version");
        assert_eq!(sealed::open(&key, kind, file, &bytes).expect("opens"), body, "{file}");
        assert!(sealed::open(&key, other, file, &bytes).is_err(), "{file}");
        assert!(sealed::open(&MasterKey::from_secret([0x43; 32]), kind, file, &bytes).is_err());
    }
    // The snapshot body compresses, so that vector covers the zstd path; the config one does not.
    let snapshot = fs::read(golden_dir().join("sealed-snapshot-v1.bin")).expect("read");
    assert!(snapshot.len() < sealed_snapshot_body().len());
}

/// A stored pack: header, trailer and every blob (each codec) decode to the known plaintexts.
#[test]
fn pack_golden_vector() {
    let key = golden_key();
    let bytes = fs::read(golden_dir().join("pack-v1.bin")).expect("golden pack");
    assert_eq!(&bytes[bytes.len() - 4..], b"CRP1");
    let (salt, entries) = read_header(&key, "pack-v1.bin", &bytes).expect("header");
    assert_eq!(&bytes[bytes.len() - 40..bytes.len() - 8], &salt);
    let want = golden_pack_blobs();
    assert_eq!(entries.len(), want.len());
    let object_key = key.object_key(&salt);
    let mut offset = 0u32;
    for (e, (kind, codec, plain)) in entries.iter().zip(&want) {
        assert_eq!(e.kind, *kind);
        assert_eq!(e.codec, *codec);
        assert_eq!(e.raw_length as usize, plain.len());
        assert_eq!(e.offset, offset, "blobs are stored back to back");
        assert_eq!(e.id, key.blob_id(plain));
        let sealed = bytes[e.offset as usize..(e.offset + e.length) as usize].to_vec();
        let got = decode_blob(&key, &object_key, e, sealed, "pack-v1.bin").expect("decodes");
        assert_eq!(&got, plain);
        offset += e.length;
    }
    let mut damaged = bytes.clone();
    damaged[5] ^= 1;
    let e = &entries[0];
    let sealed = damaged[e.offset as usize..(e.offset + e.length) as usize].to_vec();
    assert!(decode_blob(&key, &object_key, e, sealed, "pack-v1.bin").is_err());
}

/// The manifest covers what the golden tree is meant to exercise.
#[test]
fn golden_manifest_is_complete() {
    let (_, rows) = parse_manifest(&fs::read_to_string(golden_dir().join("manifest-v1.txt")).expect("read"));
    let kinds: Vec<&str> = rows.iter().map(|r| r[1].as_str()).collect();
    for k in ["file", "dir", "symlink", "fifo"] {
        assert!(kinds.contains(&k), "no {k} in the manifest");
    }
    assert!(rows.iter().any(|r| r[11] == "sparse"));
    assert!(rows.iter().any(|r| r[10].starts_with("links=2:")));
    assert!(rows.iter().any(|r| r[9].contains("user.golden=")));
    assert!(rows.iter().any(|r| r[9].contains("system.posix_acl_access=")));
    assert!(rows.iter().any(|r| r[9].contains("system.posix_acl_default=")));
}

/// A version 2 config (`init --copy-chunker-params`, FORMAT.md §6): it holds the chunk-ID key of
/// the repository it copied its chunking from, and blobs are named with that key instead of the
/// one derived from the master secret.
#[test]
fn config_v2_golden_vector() {
    use crate::support::library::config::Config;
    let bytes = fs::read(golden_dir().join("config-v2.json")).expect("golden config");
    let config: Config = serde_json::from_slice(&bytes).expect("parses");
    assert_eq!(config.version, 2);
    assert_eq!(config.chunker.seed, 1_234_605_616_436_508_552);
    let key = config.validate().expect("valid").expect("holds a chunk-ID key");
    assert_eq!(key, [0x24; 32]);
    let copied = golden_key().with_chunk_id_key(key);
    assert_eq!(copied.blob_id(b"cairn golden vector").to_hex(), GOLDEN_COPIED_BLOB_ID);
    assert_ne!(GOLDEN_COPIED_BLOB_ID, GOLDEN_BLOB_ID);
    // The same key without the config's override names blobs as before.
    assert_eq!(golden_key().blob_id(b"cairn golden vector").to_hex(), GOLDEN_BLOB_ID);
}

/// `blob_id(b"cairn golden vector")` with chunk-ID key `0x24 × 32`: keyed BLAKE3 with that key.
const GOLDEN_COPIED_BLOB_ID: &str = "dd64f0a7bdbe3fb7642c64dcedd264d436c1211ea57ca8b0efe49fd61b52bd25";

/// A snapshot made by `cairn copy` (FORMAT.md §10): the version 1 fields, then `original`. A
/// version 1 reader decodes the same snapshot without it.
#[test]
fn snapshot_with_original_golden_vector() {
    use crate::support::library::id::{BlobId, SnapshotId};
    use crate::support::library::snapshot::Snapshot;
    let bytes = fs::read(golden_dir().join("snapshot-original-v2.bin")).expect("golden snapshot");
    let snap = Snapshot::from_bytes("snapshot-original-v2.bin", &bytes).expect("parses");
    assert_eq!(snap.original, Some(SnapshotId([0x11; 32])));
    assert_eq!(snap.parent, Some(SnapshotId([0x33; 32])));
    assert_eq!(snap.tree, BlobId([0x22; 32]));
    assert_eq!((snap.time.secs, snap.time.nanos), (1_700_000_000, 5));
    assert_eq!((snap.hostname.as_str(), snap.paths.as_slice()), ("golden-host", &["/home/golden".to_string()][..]));
    assert_eq!(snap.summary.duration_ms, 9);
    assert_eq!(snap.to_bytes(), bytes);
    // Without the last 33 bytes it is the same snapshot as version 1 wrote it.
    let v1 = Snapshot::from_bytes("v1", &bytes[..bytes.len() - 33]).expect("parses");
    assert_eq!(v1, Snapshot { original: None, ..snap });
}

/// The start hint the golden repository's hint vector should hold: written at 1,700,000,000
/// and naming the packs its index says hold trees, each to where its last blob ends.
fn golden_hint(repo: &library::repository::Repository) -> library::hint::Hint {
    repo.load_index().expect("index");
    let ends = repo.index().pack_ends();
    let tree_packs = repo
        .index()
        .tree_packs()
        .into_iter()
        .map(|(no, pack, _)| library::hint::TreePack { pack, length: ends[no as usize] })
        .collect();
    library::hint::Hint { version: library::hint::VERSION, written: 1_700_000_000, tree_packs }
}

/// The golden repository's one key file.
fn golden_key_file() -> PathBuf {
    let keys = golden_dir().join("repo-v1/keys");
    fs::read_dir(&keys).expect("keys").next().expect("a key file").expect("entry").path()
}

/// A copy of the golden repository with `golden/hint-v1.bin` as its start hint.
fn golden_repository_with_hint() -> (tempfile::TempDir, Cairn) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path().join("repo");
    copy_tree(&golden_dir().join("repo-v1"), &repo);
    let _ = fs::copy(golden_dir().join("hint-v1.bin"), repo.join("hint"));
    (tmp, Cairn::new(&repo, GOLDEN_PASSWORD))
}

/// FORMAT.md §14: the start hint's layout (magic, version, the key file carried, the sealed
/// body of kind 5) and its body, for the golden repository.
#[test]
fn hint_golden_vector() {
    let bytes = fs::read(golden_dir().join("hint-v1.bin")).expect("golden hint");
    assert_eq!(&bytes[..9], b"cairnhnt\x01");
    let parts = library::hint::split(&bytes).expect("splits");
    let key_file = golden_key_file();
    assert_eq!(parts.key_file, fs::read(&key_file).expect("key file"), "carries the repository's key file");
    assert_eq!(parts.key_id().to_hex(), key_file.file_name().unwrap().to_str().unwrap());
    assert_eq!(&parts.sealed[..6], &[b'C', b'R', b'N', b'S', SealedKind::Hint as u8, 1]);

    let (_tmp, cairn) = golden_repository_with_hint();
    let (repo, _) = cairn.open();
    let hint = repo.hint().expect("the golden hint opens").clone();
    assert!(!hint.tree_packs.is_empty());
    assert_eq!(hint, golden_hint(&repo));
    assert!(repo.hint_damage().is_none());
    let body = sealed::open(repo.key(), SealedKind::Hint, "hint", parts.sealed).expect("opens");
    assert_eq!(body, hint.to_bytes(), "postcard: version, written, tree packs");
    assert!(sealed::open(repo.key(), SealedKind::Deletion, "hint", parts.sealed).is_err());
}

#[test]
#[ignore = "writes tests/golden/hint-v1.bin: a format change, never done casually"]
fn generate_hint_vector() {
    let (_tmp, cairn) = golden_repository_with_hint();
    let (repo, _) = cairn.open();
    let key_file = golden_key_file();
    let sealed = sealed::seal(repo.key(), SealedKind::Hint, &golden_hint(&repo).to_bytes());
    let bytes = library::hint::join(&fs::read(key_file).expect("key file"), &sealed);
    fs::write(golden_dir().join("hint-v1.bin"), bytes).expect("write the hint vector");
}
