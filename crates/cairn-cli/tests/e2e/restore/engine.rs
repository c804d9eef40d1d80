//! End-to-end tests of the restore engine (issue 3): the real `cairn` binary restores real
//! files into real targets — non-empty ones (every `--overwrite` mode, `--delete`,
//! `--dry-run`), filtered ones, sparse files, hard links — and fails cleanly on a missing pack,
//! a stalled fetch, a full disk, a read-only target and SIGINT. Repositories use small chunks
//! and 1 MiB packs so a few MiB of data span many chunks and several packs.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::library::pack::BlobKind;
use serde_json::Value;
use support::{
    assert_same, last_json, num, read_noatime, restored_path, scan, scan_source, stderr, stdout, Cairn, Fixture, Kind,
    Rng, Scan,
};

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

/// Chunks of 16 KiB to 256 KiB (64 KiB on average) in 1 MiB packs.
const SMALL_REPO: [&str; 4] = ["--chunk-sizes", "16384,65536,262144", "--pack-size", "1"];

impl Fixture {
    /// `--json restore latest --target TARGET --no-local-data EXTRA...` that must succeed; the
    /// summary. These tests are of the fetch path: the source files, still there, are not
    /// read (`restore::local_data` tests that).
    fn restore_fetching(&self, target: &Path, extra: &[&str]) -> Value {
        self.cairn.restore_with("latest", target, &[&["--no-local-data"], extra].concat())
    }

    /// Runs `--json restore latest --target TARGET --no-local-data EXTRA...` with `env`,
    /// whatever happens.
    fn run_restore(&self, env: &[(&str, &str)], target: &Path, extra: &[&str]) -> Output {
        let mut args =
            vec!["--json", "restore", "latest", "--target", target.to_str().expect("UTF-8 path"), "--no-local-data"];
        args.extend(extra);
        self.cairn.run_env(env, args)
    }

    /// The data packs that hold no tree blob (deleting one loses file content only).
    fn data_only_packs(&self) -> Vec<String> {
        let mut packs: BTreeMap<String, bool> = BTreeMap::new();
        for b in self.cairn.stored_blobs() {
            *packs.entry(b.pack).or_insert(true) &= b.kind == BlobKind::Data;
        }
        packs.into_iter().filter(|(_, data_only)| *data_only).map(|(p, _)| p).collect()
    }
}

fn ino(path: &Path) -> u64 {
    fs::symlink_metadata(path).unwrap_or_else(|e| panic!("lstat {}: {e}", path.display())).ino()
}

fn allocated(path: &Path) -> u64 {
    fs::symlink_metadata(path).unwrap_or_else(|e| panic!("lstat {}: {e}", path.display())).blocks() * 512
}

/// Overwrites `data.len()` bytes at `offset` of an existing file, keeping its inode.
fn scribble(path: &Path, offset: u64, data: &[u8]) {
    let f = fs::OpenOptions::new().write(true).open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    f.write_all_at(data, offset).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Every path below `root` (relative), directories included.
fn all_paths(root: &Path) -> BTreeSet<PathBuf> {
    scan(root).into_keys().filter(|p| !p.as_os_str().is_empty()).collect()
}

/// Asserts that everything in `target` is a path of the restored source (or one of its
/// parents): no temporary or stray files.
fn assert_no_stray_files(env: &Fixture, target: &Path) {
    let restored = env.restored(target);
    let src_paths: BTreeSet<PathBuf> = env.before.keys().cloned().collect();
    for p in all_paths(target) {
        let abs = target.join(&p);
        if restored.starts_with(&abs) {
            continue; // a parent of the restored source
        }
        let rel = abs.strip_prefix(&restored).unwrap_or_else(|_| panic!("{} is outside the restore", abs.display()));
        assert!(src_paths.contains(rel), "stray entry {} in the target", abs.display());
    }
}

/// Random files of `sizes` bytes named `f000`, `f001`, ... in `dir`.
fn random_files(dir: &Path, seed: u64, sizes: &[usize]) {
    fs::create_dir_all(dir).expect("mkdir");
    let mut rng = Rng(seed);
    for (i, &n) in sizes.iter().enumerate() {
        fs::write(dir.join(format!("f{i:03}")), rng.bytes(n)).expect("write");
    }
}

/// A 4 MiB random file, a directory of small files and a nested text file.
fn standard_tree(src: &Path) {
    fs::write(src.join("big.bin"), Rng(1).bytes(4 * MIB)).expect("write big");
    random_files(&src.join("small"), 2, &[3 * KIB, 17 * KIB, 40 * KIB, 100, 0, 70 * KIB, 9 * KIB, 33 * KIB]);
    fs::create_dir_all(src.join("deep/er")).expect("mkdir");
    fs::write(src.join("deep/er/notes.txt"), b"some notes\n".repeat(1000)).expect("write");
    fs::set_permissions(src.join("deep/er/notes.txt"), fs::Permissions::from_mode(0o640)).expect("chmod");
}

/// `--overwrite always` (the default) compares the target chunk by chunk: after 4 KiB changed
/// in the middle of a large file, a truncated file and a deleted one, only the chunks that
/// differ are fetched and written, and the large file is fixed in place (same inode).
#[test]
fn overwrite_always_fetches_only_the_chunks_that_differ() {
    let env = Fixture::backed_up(standard_tree, &SMALL_REPO, &[]);
    let t = env.path("t");
    let first = env.restore_fetching(&t, &[]);
    env.assert_exact(&t);
    let total = num(&first, "bytes_total");
    assert_eq!(total, (4 * MIB + 3 * KIB + 17 * KIB + 40 * KIB + 100 + 70 * KIB + 9 * KIB + 33 * KIB + 11_000) as u64);
    assert_eq!(num(&first, "bytes_written"), total);
    assert_eq!(num(&first, "bytes_in_place"), 0);
    // The random data is stored incompressible.
    assert!(num(&first, "bytes_fetched") > (4 * MIB) as u64, "{first}");

    let r = env.restored(&t);
    let big_ino = ino(&r.join("big.bin"));
    scribble(&r.join("big.bin"), 2 * MIB as u64, &[0xa5; 4 * KIB]);
    let f = fs::OpenOptions::new().write(true).open(r.join("small/f005")).expect("open");
    f.set_len(10 * KIB as u64).expect("truncate");
    fs::remove_file(r.join("small/f002")).expect("rm");

    let second = env.restore_fetching(&t, &[]);
    env.assert_exact(&t);
    assert_eq!(ino(&r.join("big.bin")), big_ino, "big.bin was replaced, not fixed in place");
    let written = num(&second, "bytes_written");
    // At most two 256 KiB chunks of big.bin cover the 4 KiB; f005 (70 KiB) and f002 (40 KiB)
    // are rewritten whole.
    assert!(written >= (4 * KIB + 60 * KIB + 40 * KIB) as u64, "{second}");
    assert!(written <= (2 * 256 * KIB + 70 * KIB + 40 * KIB) as u64, "{second}");
    assert_eq!(num(&second, "bytes_in_place") + written, total, "{second}");
    let fetched = num(&second, "bytes_fetched");
    // Stored data is incompressible: what is fetched is what is written, plus per-blob
    // overhead and at most one 64 KiB coalescing gap per read.
    assert!(fetched >= written && fetched <= written + 4 * 64 * KIB as u64, "fetched {fetched}, wrote {written}");
}

/// A restore into an already-correct target reads no pack data at all (it even succeeds with
/// every data-only pack deleted), and a target whose files differ only in mode and times gets
/// its metadata fixed without a byte of content rewritten (same inodes, nothing fetched).
#[test]
fn correct_target_reads_no_pack_data_and_metadata_changes_rewrite_only_metadata() {
    let env = Fixture::backed_up(standard_tree, &SMALL_REPO, &[]);
    let t = env.path("t");
    env.restore_fetching(&t, &[]);
    let r = env.restored(&t);
    let data_packs = env.data_only_packs();
    assert!(data_packs.len() >= 2, "the data should fill several packs: {data_packs:?}");
    for p in &data_packs {
        fs::remove_file(env.cairn.repo.join(p)).expect("delete pack");
    }

    let noop = env.restore_fetching(&t, &[]);
    env.assert_exact(&t);
    assert_eq!(num(&noop, "bytes_fetched"), 0, "{noop}");
    assert_eq!(num(&noop, "bytes_written"), 0, "{noop}");
    assert_eq!(num(&noop, "bytes_in_place"), num(&noop, "bytes_total"), "{noop}");

    let inodes: BTreeMap<PathBuf, u64> = scan(&r).into_iter().map(|(p, m)| (p, m.ino)).collect();
    fs::set_permissions(r.join("big.bin"), fs::Permissions::from_mode(0o600)).expect("chmod");
    support::set_times(&r.join("small/f001"), (1_000_000_000, 0), (1_000_000_001, 0));
    support::set_times(&r.join("deep/er"), (1_000_000_000, 0), (1_000_000_001, 0));
    fs::set_permissions(r.join("deep/er/notes.txt"), fs::Permissions::from_mode(0o777)).expect("chmod");
    let meta = env.restore_fetching(&t, &[]);
    env.assert_exact(&t);
    assert_eq!(num(&meta, "bytes_fetched"), 0, "{meta}");
    assert_eq!(num(&meta, "bytes_written"), 0, "{meta}");
    let after: BTreeMap<PathBuf, u64> = scan(&r).into_iter().map(|(p, m)| (p, m.ino)).collect();
    assert_eq!(inodes, after, "content was replaced for a metadata-only difference");
}

/// `--overwrite if-changed` trusts a file whose size and mtime match (so damage that keeps
/// both goes unseen — and `--verify` then reports it), and rewrites a file whose mtime differs.
#[test]
fn overwrite_if_changed_trusts_size_and_mtime_and_verify_catches_what_it_trusted() {
    let env = Fixture::backed_up(standard_tree, &SMALL_REPO, &[]);
    let t = env.path("t");
    let first = env.restore_fetching(&t, &["--verify"]);
    assert_eq!(num(&first, "verified"), num(&first, "files"), "{first}");
    let r = env.restored(&t);
    let trusted = r.join("small/f002");
    let recorded = env.before[Path::new("small/f002")].clone();
    scribble(&trusted, 100, b"damage with the same size");
    support::set_times(&trusted, recorded.atime, recorded.mtime);
    let changed = r.join("small/f005");
    scribble(&changed, 0, b"changed");

    let s = env.restore_fetching(&t, &["--overwrite", "if-changed"]);
    assert_eq!(num(&s, "bytes_written"), (70 * KIB) as u64, "only f005, whole: {s}");
    assert_eq!(read_noatime(&changed), read_noatime(&env.src.join("small/f005")));
    assert_ne!(read_noatime(&trusted), read_noatime(&env.src.join("small/f002")));

    // --verify re-reads what was trusted and names it.
    let out = env.run_restore(&[], &t, &["--overwrite", "if-changed", "--verify"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = stderr(&out);
    let rel = r.strip_prefix(&t).expect("inside the target").join("small/f002");
    let want = format!("error: {}: verification failed: content differs from the snapshot", rel.display());
    assert!(err.lines().any(|l| l == want), "{err}");
    let summary = last_json(&stdout(&out));
    assert_eq!(num(&summary, "failed"), 1, "{summary}");

    // The default mode finds the damage by content.
    env.restore_fetching(&t, &[]);
    env.assert_exact(&t);
}

/// `--overwrite if-newer` replaces only files older than the snapshot's copy; `never` leaves
/// every existing file alone; both create what is missing.
#[test]
fn overwrite_if_newer_and_never() {
    let env = Fixture::backed_up(standard_tree, &SMALL_REPO, &[]);
    for mode in ["if-newer", "never"] {
        let t = env.path(mode);
        env.restore_fetching(&t, &[]);
        let r = env.restored(&t);
        let newer = r.join("small/f001");
        scribble(&newer, 0, b"local edit, newer than the snapshot");
        let mtime = env.before[Path::new("small/f001")].mtime;
        support::set_times(&newer, (mtime.0 + 1000, 0), (mtime.0 + 1000, 0));
        let older = r.join("small/f003");
        fs::write(&older, b"an old local copy").expect("write");
        support::set_times(&older, (1_000_000_000, 0), (1_000_000_000, 0));
        fs::remove_file(r.join("deep/er/notes.txt")).expect("rm");
        let newer_content = read_noatime(&newer);

        let s = env.restore_fetching(&t, &["--overwrite", mode]);
        assert_eq!(read_noatime(&newer), newer_content, "{mode} replaced a newer file");
        assert_eq!(read_noatime(&r.join("deep/er/notes.txt")), b"some notes\n".repeat(1000), "{mode}");
        let src_older = read_noatime(&env.src.join("small/f003"));
        let mut want_written = 11_000;
        if mode == "if-newer" {
            assert_eq!(read_noatime(&older), src_older, "if-newer kept an older file");
            assert_eq!(
                fs::symlink_metadata(&older).expect("lstat").mtime(),
                env.before[Path::new("small/f003")].mtime.0
            );
            want_written += src_older.len();
        } else {
            assert_eq!(read_noatime(&older), b"an old local copy", "never replaced a file");
        }
        assert_eq!(num(&s, "bytes_written"), want_written as u64, "{mode}: {s}");
        // Everything else is exact.
        let mut got = scan(&r);
        let mut want = env.before.clone();
        for p in ["small/f001", "small/f003"] {
            if mode == "never" || p == "small/f001" {
                got.remove(Path::new(p));
                want.remove(Path::new(p));
            }
        }
        assert_same(&want, &got, true);
    }
}

/// Per path: kind, mode, size, mtime, content digest, inode.
type Fingerprint = BTreeMap<PathBuf, (Kind, u32, u64, (i64, i64), Option<[u8; 32]>, u64)>;

/// A subset of a scan's fields that a read-only look at a tree cannot change (no atimes).
fn fingerprint(s: &Scan) -> Fingerprint {
    s.iter().map(|(p, m)| (p.clone(), (m.kind, m.mode, m.size, m.mtime, m.digest, m.ino))).collect()
}

/// `--dry-run` changes nothing and lists what would be created, updated and deleted (as JSON
/// and as text); `--delete` then removes exactly the entries the snapshot lacks.
#[test]
fn dry_run_lists_changes_and_delete_removes_extras() {
    let env = Fixture::backed_up(standard_tree, &SMALL_REPO, &[]);
    let t = env.path("t");
    env.restore_fetching(&t, &[]);
    let r = env.restored(&t);
    let rel = |p: &str| r.strip_prefix(&t).expect("inside").join(p);
    fs::write(r.join("extra.txt"), b"not in the snapshot").expect("write");
    fs::create_dir_all(r.join("small/extra_dir/sub")).expect("mkdir");
    fs::write(r.join("small/extra_dir/sub/x"), b"x").expect("write");
    fs::remove_file(r.join("small/f006")).expect("rm");
    scribble(&r.join("big.bin"), 3 * MIB as u64, b"changed");
    let before = fingerprint(&scan(&t));

    let out = env.run_restore(&[], &t, &["--dry-run", "--delete"]);
    assert!(out.status.success(), "{out:?}");
    let dry = last_json(&stdout(&out));
    assert_eq!(dry["message_type"], "dry_run", "{dry}");
    let list = |k: &str| -> Vec<PathBuf> {
        dry[k]
            .as_array()
            .unwrap_or_else(|| panic!("{k}: {dry}"))
            .iter()
            .map(|v| PathBuf::from(v.as_str().expect("path")))
            .collect()
    };
    assert_eq!(list("create"), [rel("small/f006")]);
    assert_eq!(list("update"), [rel("big.bin")]);
    assert_eq!(list("delete"), [rel("extra.txt"), rel("small/extra_dir")]);
    assert_eq!(num(&dry, "unchanged"), 8, "{dry}");
    let to_fetch = num(&dry, "bytes_to_fetch");
    assert!(to_fetch >= (9 * KIB) as u64 && to_fetch <= (9 * KIB + 256 * KIB + 64 * KIB) as u64, "{dry}");
    assert_eq!(fingerprint(&scan(&t)), before, "--dry-run changed the target");

    let text = env.cairn.run([
        "restore",
        "latest",
        "--target",
        t.to_str().expect("UTF-8"),
        "--dry-run",
        "--delete",
        "--no-local-data",
    ]);
    assert!(text.status.success(), "{text:?}");
    let text = stdout(&text);
    for line in [
        format!("create {}", rel("small/f006").display()),
        format!("update {}", rel("big.bin").display()),
        format!("delete {}", rel("extra.txt").display()),
        format!("delete {}", rel("small/extra_dir").display()),
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
    assert!(text.contains("would create 1 files, update 1, leave 8 unchanged, delete 2"), "{text}");
    assert_eq!(fingerprint(&scan(&t)), before, "--dry-run changed the target");

    // Without --delete the extras stay; with it they go, and the result is exact.
    let kept = env.restore_fetching(&t, &[]);
    assert_eq!(num(&kept, "deleted"), 0);
    assert!(r.join("extra.txt").exists() && r.join("small/extra_dir/sub/x").exists());
    let deleted = env.restore_fetching(&t, &["--delete"]);
    assert_eq!(num(&deleted, "deleted"), 2, "{deleted}");
    env.assert_exact(&t);
}

/// `--include` and `--exclude` globs (against the absolute path or the name) and `SNAP:PATH`
/// select exactly the entries they name, restored exactly, with their parent directories.
#[test]
fn include_exclude_and_snapshot_path_select_exactly() {
    let env = Fixture::backed_up(
        |src| {
            for (p, n) in [
                ("docs/a.txt", 5_000),
                ("docs/b.md", 7_000),
                ("code/main.rs", 3_000),
                ("code/lib.rs", 30_000),
                ("code/target/big.o", 300_000),
                ("code/target/x.rs", 1_000),
            ] {
                fs::create_dir_all(src.join(p).parent().expect("parent")).expect("mkdir");
                fs::write(src.join(p), Rng(n as u64).bytes(n)).expect("write");
            }
        },
        &SMALL_REPO,
        &[],
    );
    let src = env.src.display().to_string();
    let check = |name: &str, spec: &str, opts: &[&str], root: PathBuf, want: &[&str]| {
        let t = env.path(name);
        env.cairn.restore_with(spec, &t, opts);
        let base = if root.as_os_str().is_empty() { env.restored(&t) } else { t.clone() };
        let got: BTreeSet<PathBuf> = all_paths(&base);
        let want: BTreeSet<PathBuf> = want.iter().map(PathBuf::from).collect();
        assert_eq!(got, want, "{name}: {opts:?}");
        let restored_scan = scan(&base);
        for p in &want {
            let src_meta = &env.before[&root.join(p)];
            let m = &restored_scan[p];
            assert_eq!((m.kind, m.digest, m.mode), (src_meta.kind, src_meta.digest, src_meta.mode), "{name}: {p:?}");
            if m.kind == Kind::File {
                assert_eq!(m.mtime, src_meta.mtime, "{name}: {p:?}");
            }
        }
    };
    check(
        "rs",
        "latest",
        &["--include", "*.rs"],
        PathBuf::new(),
        &["code", "code/main.rs", "code/lib.rs", "code/target", "code/target/x.rs"],
    );
    check(
        "docs-dir",
        "latest",
        &["--include", &format!("{src}/docs")],
        PathBuf::new(),
        &["docs", "docs/a.txt", "docs/b.md"],
    );
    check(
        "ex",
        "latest",
        &["--exclude", "target", "--exclude", "*.md"],
        PathBuf::new(),
        &["code", "code/main.rs", "code/lib.rs", "docs", "docs/a.txt"],
    );
    check(
        "both",
        "latest",
        &["--include", &format!("{src}/code/**"), "--exclude", "big.o"],
        PathBuf::new(),
        &["code", "code/main.rs", "code/lib.rs", "code/target", "code/target/x.rs"],
    );
    check(
        "path",
        &format!("latest:{src}/code"),
        &["--exclude", "lib.rs"],
        PathBuf::from("code"),
        &["main.rs", "target", "target/big.o", "target/x.rs"],
    );
    // Under SNAP:PATH, globs still match the absolute path inside the snapshot.
    check(
        "path-abs",
        &format!("latest:{src}/code"),
        &["--exclude", &format!("{src}/code/target")],
        PathBuf::from("code"),
        &["main.rs", "lib.rs"],
    );
}

/// `--delete` with filters removes only extra entries the filters select: what the filters
/// leave out — snapshot entries and local files alike — is never deleted.
#[test]
fn delete_with_filters_removes_only_selected_extras() {
    let env = Fixture::backed_up(
        |src| {
            for p in ["docs/a.txt", "code/main.rs", "code/target/big.o"] {
                fs::create_dir_all(src.join(p).parent().expect("parent")).expect("mkdir");
                fs::write(src.join(p), p).expect("write");
            }
        },
        &SMALL_REPO,
        &[],
    );
    let t = env.path("t");
    env.restore_fetching(&t, &[]);
    let r = env.restored(&t);
    let rel = |p: &str| r.strip_prefix(&t).expect("inside").join(p);
    for p in ["code/local.rs", "code/target/local.o", "docs/local.txt"] {
        fs::write(r.join(p), b"local").expect("write");
    }
    let dry_delete = |opts: &[&str]| -> Vec<PathBuf> {
        let mut args = vec!["--dry-run", "--delete"];
        args.extend(opts);
        let out = env.run_restore(&[], &t, &args);
        assert!(out.status.success(), "{out:?}");
        let dry = last_json(&stdout(&out));
        dry["delete"].as_array().expect("delete").iter().map(|v| PathBuf::from(v.as_str().expect("path"))).collect()
    };
    assert_eq!(dry_delete(&["--include", "*.rs"]), [rel("code/local.rs")]);
    assert_eq!(dry_delete(&["--exclude", "*.o"]), [rel("code/local.rs"), rel("docs/local.txt")]);
    assert_eq!(
        dry_delete(&["--include", &format!("{}/code", env.src.display())]),
        [rel("code/local.rs"), rel("code/target/local.o")]
    );
    assert_eq!(dry_delete(&[]), [rel("code/local.rs"), rel("code/target/local.o"), rel("docs/local.txt")]);

    let s = env.restore_fetching(&t, &["--include", "*.rs", "--delete"]);
    assert_eq!(num(&s, "deleted"), 1, "{s}");
    assert!(!r.join("code/local.rs").exists());
    for p in ["docs/a.txt", "docs/local.txt", "code/target/big.o", "code/target/local.o", "code/main.rs"] {
        assert!(r.join(p).exists(), "--include '*.rs' --delete removed {p}");
    }
}

/// Sparse files: holes and zero chunks are restored as holes (and not fetched); `--sparse
/// always` also leaves zero blocks inside data as holes; `--sparse never` allocates every byte;
/// `--preallocate` keeps the holes. Every variant is exact.
#[test]
fn sparse_files_keep_their_holes() {
    let env = Fixture::backed_up(
        |src| {
            // 8 MiB with data only in [1, 2) MiB and [5, 6) MiB.
            let f = fs::File::create(src.join("holes.img")).expect("create");
            f.set_len(8 * MIB as u64).expect("size");
            f.write_all_at(&Rng(1).bytes(MIB), MIB as u64).expect("write");
            f.write_all_at(&Rng(2).bytes(MIB), 5 * MIB as u64).expect("write");
            // 3 MiB, fully allocated, the outer MiBs written as zeros.
            let mut zeros = vec![0u8; 3 * MIB];
            zeros[MIB..2 * MIB].copy_from_slice(&Rng(3).bytes(MIB));
            fs::write(src.join("zeros.bin"), zeros).expect("write");
            // One 1 MiB chunk holding a 256 KiB run of zeros.
            let mut inner = Rng(4).bytes(MIB);
            inner[256 * KIB..512 * KIB].fill(0);
            fs::write(src.join("inner.bin"), inner).expect("write");
        },
        &["--pack-size", "1"],
        &["--chunker", "fixed:1M"],
    );
    assert!(allocated(&env.src.join("zeros.bin")) >= 3 * MIB as u64);
    let slack = 64 * KIB as u64;
    for (name, opts) in [
        ("auto", &[][..]),
        ("always", &["--sparse", "always"][..]),
        ("never", &["--sparse", "never"][..]),
        ("prealloc", &["--preallocate"][..]),
    ] {
        let t = env.path(name);
        let s = env.restore_fetching(&t, opts);
        let r = env.restored(&t);
        let want_files: Scan = env.before.clone();
        let got = scan(&r);
        for (p, m) in &want_files {
            assert_eq!((m.kind, m.size, m.digest), (got[p].kind, got[p].size, got[p].digest), "{name}: {p:?}");
            assert_eq!(m.mtime, got[p].mtime, "{name}: {p:?}");
        }
        assert_eq!(num(&s, "bytes_zero"), (6 * MIB + 2 * MIB) as u64, "{name}: {s}");
        assert!(num(&s, "bytes_fetched") < (5 * MIB) as u64, "zero ranges were fetched: {s}");
        let (holes, zeros, inner) =
            (allocated(&r.join("holes.img")), allocated(&r.join("zeros.bin")), allocated(&r.join("inner.bin")));
        if name == "never" {
            assert!(
                holes >= 8 * MIB as u64 && zeros >= 3 * MIB as u64 && inner >= MIB as u64,
                "{holes} {zeros} {inner}"
            );
            continue;
        }
        assert!(holes >= 2 * MIB as u64 && holes <= 2 * MIB as u64 + slack, "{name}: holes.img allocates {holes}");
        assert!(zeros >= MIB as u64 && zeros <= MIB as u64 + slack, "{name}: zeros.bin allocates {zeros}");
        if name == "always" {
            assert!(inner <= 768 * KIB as u64 + slack, "--sparse always wrote zero blocks: {inner}");
        } else {
            assert!(inner >= MIB as u64, "{name}: inner.bin allocates {inner}");
        }
    }
}

/// Hard links come back as hard links (one inode, the right link count); a link restored
/// without its partners is a plain file with the same content.
#[test]
fn hard_links_are_restored_as_hard_links() {
    let env = Fixture::backed_up(
        |src| {
            fs::write(src.join("one"), Rng(9).bytes(300 * KIB)).expect("write");
            fs::create_dir(src.join("sub")).expect("mkdir");
            fs::hard_link(src.join("one"), src.join("two")).expect("link");
            fs::hard_link(src.join("one"), src.join("sub/three")).expect("link");
            fs::write(src.join("alone"), Rng(10).bytes(10 * KIB)).expect("write");
        },
        &SMALL_REPO,
        &[],
    );
    let t = env.path("t");
    let s = env.restore_fetching(&t, &[]);
    env.assert_exact(&t);
    let r = env.restored(&t);
    let i = ino(&r.join("one"));
    assert_eq!((ino(&r.join("two")), ino(&r.join("sub/three"))), (i, i));
    assert_eq!(fs::metadata(r.join("one")).expect("stat").nlink(), 3);
    assert_eq!(fs::metadata(r.join("alone")).expect("stat").nlink(), 1);
    // The shared content is written once.
    assert_eq!(num(&s, "bytes_written"), (300 * KIB + 10 * KIB) as u64, "{s}");
    // Restored again over itself it stays linked and exact.
    env.restore_fetching(&t, &[]);
    env.assert_exact(&t);
    // One name of the group alone.
    let t2 = env.path("t2");
    env.restore_fetching(&t2, &["--include", "three"]);
    let three = env.restored(&t2).join("sub/three");
    assert_eq!(read_noatime(&three), read_noatime(&env.src.join("one")));
    assert_eq!(fs::metadata(&three).expect("stat").nlink(), 1);
}

/// Each distinct blob is fetched and decoded once per restore, however many files and offsets
/// need it: six 2 MiB files made of one 64 KiB block fetch that block once.
#[test]
fn a_blob_needed_at_many_places_is_fetched_once() {
    let block = Rng(11).bytes(64 * KIB);
    let env = Fixture::backed_up(
        |src| {
            for i in 0..6 {
                fs::write(src.join(format!("copy{i}")), block.repeat(32)).expect("write");
            }
        },
        &[],
        &["--chunker", "fixed:64K"],
    );
    let t = env.path("t");
    let s = env.restore_fetching(&t, &[]);
    env.assert_exact(&t);
    assert_eq!(num(&s, "bytes_written"), (6 * 32 * 64 * KIB) as u64, "{s}");
    let fetched = num(&s, "bytes_fetched");
    assert!(fetched > (64 * KIB) as u64 && fetched < (65 * KIB) as u64, "fetched {fetched} for one 64 KiB blob");
}

/// Identical directories share one tree blob — empty ones, and ones holding the same hard links
/// (nodes record inodes, so on a real file system only these can be identical). The plan takes
/// a tree without copying it when its last directory is listed: every copy is restored, into
/// an empty target and over an existing one.
#[test]
fn identical_directories_sharing_trees_all_restore() {
    let env = Fixture::backed_up(
        |src| {
            fs::write(src.join("orig"), b"linked bytes\n".repeat(500)).expect("write");
            for i in 0..3 {
                fs::create_dir(src.join(format!("h{i}"))).expect("mkdir");
                fs::hard_link(src.join("orig"), src.join(format!("h{i}/x"))).expect("link");
            }
            for i in 0..5 {
                fs::create_dir_all(src.join(format!("deep/e{i}"))).expect("mkdir");
            }
        },
        &SMALL_REPO,
        &[],
    );
    let trees: BTreeSet<_> =
        env.cairn.stored_blobs().into_iter().filter(|b| b.kind == BlobKind::Tree).map(|b| b.id).collect();
    // The source's own directories, and one tree for each directory above it in the snapshot.
    let dirs = env.before.values().filter(|e| e.kind == Kind::Dir).count() + env.src.ancestors().count() - 1;
    assert_eq!(trees.len() + 6, dirs, "{} trees for {dirs} directories: the copies share none", trees.len());
    let t = env.path("t");
    env.restore_fetching(&t, &[]);
    env.assert_exact(&t);
    fs::remove_dir(env.restored(&t).join("deep/e3")).expect("rm");
    fs::remove_file(env.restored(&t).join("h1/x")).expect("rm");
    env.restore_fetching(&t, &[]);
    env.assert_exact(&t);
}

/// A directory backed up twice through a bind mount: its whole subtree is shared, so trees
/// below a shared tree are listed once per copy (the plan copies them rather than take them on
/// the first listing). Both copies restore exactly.
#[test]
fn a_bind_mounted_copy_shares_nested_trees_and_both_restore() {
    let fx = Fixture::new();
    let base = &fx.base;
    let src = base.as_path().join("src");
    let a = src.join("a");
    random_files(&a.join("sub/deeper"), 21, &[5 * KIB, 70 * KIB]);
    random_files(&a.join("sub/other"), 22, &[9 * KIB]);
    fs::write(a.join("top.txt"), b"top\n".repeat(100)).expect("write");
    fs::create_dir(src.join("b")).expect("mkdir");
    let bound = support::BindMount::new(&a, &src.join("b"));
    let cairn = fx.cairn.clone();
    cairn.init(&SMALL_REPO);
    cairn.backup(&[&src], &[]);
    drop(bound);
    let trees = cairn.stored_blobs().into_iter().filter(|b| b.kind == BlobKind::Tree).count();
    // src, a = b, a/sub, a/sub/deeper, a/sub/other, and the directories above src.
    assert_eq!(trees, 5 + src.ancestors().count() - 1, "the bind-mounted copy does not share trees");
    let want = scan_source(&a);
    for t in [base.as_path().join("t1"), base.as_path().join("t2")] {
        cairn.restore_with("latest", &t, &[]);
        let r = restored_path(&t, &src);
        assert_same(&want, &scan(&r.join("a")), true);
        assert_same(&want, &scan(&r.join("b")), true);
    }
}

/// A missing data pack during a restore of many files fails exactly the files that need it —
/// each named on its own line, including two files sharing one blob — with a non-zero exit;
/// every other file is restored exactly and no failed file is left behind.
#[test]
fn missing_pack_fails_only_its_files_among_many() {
    // One directory (trees and data are packed apart, so its packs hold data only) of files
    // smaller than the smallest chunk: one blob each.
    let sizes: Vec<usize> = (0..200).map(|i| 4 * KIB + (i * 997) % (11 * KIB)).collect();
    let env = Fixture::backed_up(
        |src| {
            random_files(&src.join("many"), 20, &sizes);
            // many/f000 again under another name: one blob, two files.
            fs::copy(src.join("many/f000"), src.join("zz-copy-of-f000")).expect("copy");
        },
        &SMALL_REPO,
        &[],
    );
    let packs = env.data_only_packs();
    assert!(!packs.is_empty(), "no data-only pack");
    let (repo, _) = env.cairn.open();
    let blob_of = |p: &Path| repo.key().blob_id(&read_noatime(&env.src.join(p)));
    let stored = env.cairn.stored_blobs();
    let pack_of = |id| stored.iter().find(|b| b.id == id).map(|b| b.pack.clone()).expect("stored blob");
    let shared_pack = pack_of(blob_of(Path::new("many/f000")));
    assert!(packs.contains(&shared_pack), "many/f000 should be in a data-only pack: {shared_pack} not in {packs:?}");
    let victim = shared_pack;
    let lost: BTreeSet<PathBuf> = env
        .before
        .iter()
        .filter(|(_, m)| m.kind == Kind::File)
        .map(|(p, _)| p.clone())
        .filter(|p| pack_of(blob_of(p)) == victim)
        .collect();
    assert!(lost.len() >= 10 && lost.len() < 190, "{} files in the victim pack", lost.len());
    fs::remove_file(env.cairn.repo.join(&victim)).expect("delete pack");

    let t = env.path("t");
    let out = env.run_restore(&[], &t, &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let r = env.restored(&t);
    let r_rel = r.strip_prefix(&t).expect("inside the target");
    let err = stderr(&out);
    let mut named = BTreeSet::new();
    for line in err.lines() {
        if let Some(rest) = line.strip_prefix("error: ") {
            let (path, why) = rest.split_once(": ").expect("error: PATH: WHY");
            assert!(why.contains(&format!("{victim} does not exist")), "{line}");
            named.insert(Path::new(path).strip_prefix(r_rel).expect("inside the restore").to_path_buf());
        } else {
            assert_eq!(line, format!("cairn: {} entries could not be restored (listed above)", lost.len()));
        }
    }
    assert_eq!(named, lost);
    assert!(lost.contains(Path::new("many/f000")) && lost.contains(Path::new("zz-copy-of-f000")), "{lost:?}");
    let summary = last_json(&stdout(&out));
    assert_eq!(num(&summary, "failed"), lost.len() as u64, "{summary}");
    let mut want = env.before.clone();
    want.retain(|p, _| !lost.contains(p));
    let got = scan(&r);
    for p in &lost {
        assert!(!got.contains_key(p), "{p:?} failed but is in the target");
    }
    assert_same(&want, &got, true);
}

/// Restoring over an older copy of the tree when a pack is missing: the files whose new data is
/// in that pack fail, but nothing was written to them, so they keep their old content (and say
/// so) instead of being removed; every other file is brought up to date.
#[test]
fn missing_pack_leaves_existing_files_as_they_were() {
    let sizes: Vec<usize> = (0..120).map(|i| 4 * KIB + (i * 997) % (11 * KIB)).collect();
    let env = Fixture::backed_up(|src| random_files(&src.join("many"), 21, &sizes), &SMALL_REPO, &[]);
    let t = env.path("t");
    env.restore_fetching(&t, &[]);
    let r = env.restored(&t);
    // The target holds an older version of every file: same size and times, other bytes.
    let old = |p: &Path| vec![b'o'; fs::metadata(env.src.join(p)).expect("stat").len() as usize];
    let files: Vec<PathBuf> = env.before.iter().filter(|(_, m)| m.kind == Kind::File).map(|(p, _)| p.clone()).collect();
    for p in &files {
        scribble(&r.join(p), 0, &old(p));
    }
    let (repo, _) = env.cairn.open();
    let stored = env.cairn.stored_blobs();
    let pack_of = |p: &Path| {
        let id = repo.key().blob_id(&read_noatime(&env.src.join(p)));
        stored.iter().find(|b| b.id == id).map(|b| b.pack.clone()).expect("stored blob")
    };
    let victim = pack_of(&files[0]);
    assert!(env.data_only_packs().contains(&victim), "{victim} holds trees");
    let lost: BTreeSet<&PathBuf> = files.iter().filter(|p| pack_of(p) == victim).collect();
    assert!(!lost.is_empty() && lost.len() < files.len(), "{} of {} files in the victim pack", lost.len(), files.len());
    fs::remove_file(env.cairn.repo.join(&victim)).expect("delete pack");

    let out = env.run_restore(&[], &t, &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = stderr(&out);
    for p in &files {
        let got = read_noatime(&r.join(p));
        if lost.contains(p) {
            assert_eq!(got, old(p), "{p:?} lost its old content");
            let line = err
                .lines()
                .find(|l| l.contains(&*p.to_string_lossy()))
                .unwrap_or_else(|| panic!("{p:?} not named: {err}"));
            assert!(line.contains("left as it was"), "{line}");
        } else {
            assert_eq!(got, read_noatime(&env.src.join(p)), "{p:?} not restored");
        }
    }
}

/// A fetch that hangs longer than `--stall-timeout` makes the watchdog report the stall and
/// name the stage that waits; the restore still completes exactly once the read returns.
#[test]
fn stalled_fetch_is_reported_by_the_watchdog() {
    let env = Fixture::backed_up(standard_tree, &SMALL_REPO, &[]);
    let pack = env.data_only_packs().pop().expect("a data-only pack");
    let name = pack.rsplit('/').next().expect("pack name").to_string();
    let faults = format!("stall={name},stall-for=6s");
    let t = env.path("t");
    let started = Instant::now();
    let out = env.run_restore(&[("CAIRN_INJECT_FAULTS", &faults)], &t, &["--stall-timeout", "2"]);
    assert!(out.status.success(), "{out:?}");
    assert!(started.elapsed() >= Duration::from_secs(6), "the injected stall did not happen");
    // The fetch's stall is reported once, in both places; a busy machine may add a pause of
    // its own elsewhere, reported the same way.
    let fetch = "no progress for 2 s; waiting in the fetch stage";
    let err = stderr(&out);
    let warned: Vec<&str> = err.lines().collect();
    assert_eq!(warned.iter().filter(|l| **l == format!("warning: restore stalled: {fetch}")).count(), 1, "{err}");
    assert!(
        warned.iter().all(|l| l.starts_with("warning: restore stalled: no progress for 2 s; waiting in the ")),
        "{err}"
    );
    let summary = last_json(&stdout(&out));
    let stalls: Vec<&str> = summary["stalls"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(stalls.iter().filter(|s| **s == fetch).count(), 1, "{summary}");
    assert_eq!(stalls.len(), warned.len(), "{summary}");
    // Progress lines carry the stall while it lasts.
    let stalled_status = stdout(&out)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .any(|v| v["message_type"] == "status" && v["stall"].is_string());
    assert!(stalled_status, "no status line reports the stall:\n{}", stdout(&out));
    env.assert_exact(&t);
}

/// A restore onto a full disk stops promptly with one clear line and a non-zero exit, and
/// leaves nothing in the target but (partial) entries of the snapshot.
#[test]
fn disk_full_is_one_clear_line() {
    let env = Fixture::backed_up(standard_tree, &SMALL_REPO, &[]);
    let t = env.path("small-disk");
    let _mount = support::Tmpfs::mount(&t, "size=1m");
    let started = Instant::now();
    let out = env.run_restore(&[], &t, &[]);
    assert!(started.elapsed() < Duration::from_secs(60), "a full disk took {:?}", started.elapsed());
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    // With --json the one line is the JSON error line (docs/JSON.md, `error`).
    assert!(is_json_error(&err, 1) && err.contains("No space left on device"), "{err}");
    assert!(err.contains(&t.display().to_string()), "the error does not name the file: {err}");
    assert_no_stray_files(&env, &t);
}

/// Whether `line` is docs/JSON.md's `error` object with exit code `code`.
fn is_json_error(line: &str, code: u64) -> bool {
    serde_json::from_str::<serde_json::Value>(line)
        .is_ok_and(|v| v["message_type"] == "error" && v["code"].as_u64() == Some(code))
}

/// A read-only target gives one clear line and a non-zero exit.
#[test]
fn read_only_target_is_one_clear_line() {
    let env = Fixture::backed_up(standard_tree, &SMALL_REPO, &[]);
    let t = env.path("ro");
    let _mount = support::Tmpfs::mount(&t, "ro,size=1m");
    let out = env.run_restore(&[], &t, &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    // With --json the one line is the JSON error line (docs/JSON.md, `error`).
    assert!(is_json_error(&err, 1) && err.contains("Read-only file system"), "{err}");
    assert!(all_paths(&t).is_empty());
}

/// SIGINT in the middle of a (slowed) restore: exit code 130 and a hint, promptly; nothing
/// but snapshot entries in the target; the same restore run again completes exactly and
/// fetches only what the first run had not written.
#[test]
fn sigint_stops_cleanly_and_a_rerun_finishes_the_job() {
    let env = Fixture::backed_up(
        |src| {
            let sizes: Vec<usize> = (0..24).map(|i| 300 * KIB + i * 7 * KIB).collect();
            random_files(&src.join("many"), 30, &sizes);
        },
        &SMALL_REPO,
        &[],
    );
    let full = env.restore_fetching(&env.path("reference"), &[]);
    let t = env.path("t");
    let mut cmd = env.cairn.command();
    cmd.env("CAIRN_INJECT_FAULTS", "latency=300ms")
        .args(["--json", "restore", "latest", "--no-local-data", "--target"])
        .arg(&t)
        .args(["--fetch-concurrency", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().expect("spawn cairn");
    // Interrupt once the first file has content.
    let deadline = Instant::now() + Duration::from_secs(60);
    let many = env.restored(&t).join("many");
    while !fs::read_dir(&many).map(|rd| rd.flatten().any(|e| e.metadata().is_ok_and(|m| m.len() > 0))).unwrap_or(false)
    {
        assert!(Instant::now() < deadline, "the restore wrote nothing within a minute");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) on the child we spawned and have not waited for.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) }, 0);
    let signalled = Instant::now();
    let out = child.wait_with_output().expect("wait");
    assert!(signalled.elapsed() < Duration::from_secs(10), "took {:?} to stop", signalled.elapsed());
    assert_eq!(out.status.code(), Some(130), "{out:?}");
    assert_eq!(stderr(&out).trim_end(), "cairn: restore interrupted; run the same command again to finish it");
    assert_no_stray_files(&env, &t);
    let done_before: u64 =
        fs::read_dir(&many).expect("list").flatten().map(|e| e.metadata().expect("stat").len()).sum();
    assert!(done_before > 0);

    let again = env.restore_fetching(&t, &[]);
    env.assert_exact(&t);
    let (total, fetched_all) = (num(&full, "bytes_total"), num(&full, "bytes_fetched"));
    assert!(num(&again, "bytes_in_place") > 0, "nothing of the first run was kept: {again}");
    let (fetched, written) = (num(&again, "bytes_fetched"), num(&again, "bytes_written"));
    assert!(fetched < fetched_all, "{again}");
    assert_eq!(num(&again, "bytes_in_place") + written, total, "{again}");
    // The data is incompressible: fetching only what is missing means fetching about what
    // is written (blob overhead, and a few coalescing gaps around chunks already in place).
    assert!(
        fetched >= written && fetched <= written + written / 8 + 256 * KIB as u64,
        "fetched {fetched}, wrote {written}"
    );
}

/// Reading the snapshot's trees is watched too: a stalled tree read is reported as a stall of
/// the plan stage, and SIGINT stops the restore after the read in flight instead of after
/// every level of the tree (each read here hangs for 3 s).
#[test]
fn stalled_tree_reads_are_reported_and_sigint_stops_them() {
    use std::io::BufRead;
    // One packer thread: every tree lands in one tree pack, whose reads are stalled.
    let env = Fixture::backed_up(|src| fs::write(src.join("f"), b"data").expect("write"), &[], &["--threads", "1"]);
    let packs: Vec<String> =
        env.cairn.stored_blobs().into_iter().filter(|b| b.kind == BlobKind::Tree).map(|b| b.pack).collect();
    let pack = packs.first().expect("a tree pack").rsplit('/').next().expect("name").to_string();
    assert!(packs.iter().all(|p| p.ends_with(&pack)), "one pack holds every tree: {packs:?}");
    let t = env.path("t");
    let mut child = env
        .cairn
        .command()
        .env("CAIRN_INJECT_FAULTS", format!("stall={pack},stall-for=3s"))
        .args(["--json", "restore", "latest", "--no-local-data", "--target"])
        .arg(&t)
        .args(["--stall-timeout", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cairn");
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let stalled = lines.by_ref().map(|l| l.expect("read stdout")).find(|l| {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        v["stall"] == "no progress for 1 s; waiting in the plan stage"
    });
    assert!(stalled.is_some(), "no status line reported the stalled tree read");
    // SAFETY: kill(2) on the child we spawned and have not waited for.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) }, 0);
    let signalled = Instant::now();
    lines.for_each(drop);
    let out = child.wait_with_output().expect("wait");
    assert!(signalled.elapsed() < Duration::from_millis(4500), "took {:?} to stop", signalled.elapsed());
    assert_eq!(out.status.code(), Some(130), "{out:?}");
    assert_eq!(stderr(&out).trim_end(), "cairn: restore interrupted; run the same command again to finish it");
    assert!(!t.exists(), "an interrupted plan wrote to the target");
}

/// A memory budget smaller than one pack — and smaller than one blob — still restores
/// exactly: a blob larger than the whole budget goes through on its own.
#[test]
fn memory_budget_smaller_than_a_pack_and_a_blob() {
    let env = Fixture::backed_up(standard_tree, &SMALL_REPO, &[]);
    for budget in ["512K", "16K", "1"] {
        let t = env.path(budget);
        env.restore_fetching(&t, &["--max-memory", budget, "--fetch-concurrency", "4", "--decode-threads", "2"]);
        env.assert_exact(&t);
    }
}

/// Runs `cairn ARGS...` to completion (output discarded); its exit code and peak RSS in KiB.
fn exit_and_peak_rss(cairn: &Cairn, args: &[&str]) -> (i32, u64) {
    let child = cairn.command().args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn();
    let pid = child.expect("spawn cairn").id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid out-parameter; wait4 reaps the child we spawned.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::wait4(pid, &mut status, 0, &mut usage) }, pid, "wait4");
    assert!(libc::WIFEXITED(status), "cairn {args:?} died: status {status:#x}");
    (libc::WEXITSTATUS(status), usage.ru_maxrss as u64)
}

/// The memory budget bounds the bytes in flight even when it is smaller than the reads the
/// planner would otherwise coalesce (8 MiB): restoring 16 MiB from one pack with a 1 MiB
/// budget peaks at most a few MiB above a restore that fetches nothing at all.
#[test]
fn memory_budget_bounds_peak_memory() {
    let env = Fixture::backed_up(
        |src| fs::write(src.join("big.bin"), Rng(5).bytes(16 * MIB)).expect("write"),
        &SMALL_REPO[..2],
        &[],
    );
    let t = env.path("t");
    let target = t.to_str().expect("UTF-8");
    let one_thread = ["--fetch-concurrency", "1", "--decode-threads", "1", "--write-threads", "1"];
    let mut args = vec!["restore", "latest", "--target", target, "--max-memory", "1M"];
    args.extend(one_thread);
    let (code, restore_kib) = exit_and_peak_rss(&env.cairn, &args);
    assert_eq!(code, 0);
    env.assert_exact(&t);
    let (code, noop_kib) = exit_and_peak_rss(&env.cairn, &args);
    assert_eq!(code, 0);
    let extra = restore_kib.saturating_sub(noop_kib);
    assert!(extra <= 8 * 1024, "a 1 MiB budget peaked {extra} KiB above a no-op restore ({noop_kib} KiB)");
}

/// `cairn dump` of a file writes its bytes; of a directory, a tar stream whose extraction
/// matches the source.
#[test]
fn dump_of_a_file_and_a_directory_matches_the_source() {
    let env = Fixture::backed_up(standard_tree, &SMALL_REPO, &[]);
    let big = env.cairn.run(["dump", &format!("latest:{}", env.src.join("big.bin").display())]);
    assert!(big.status.success(), "{}", stderr(&big));
    assert!(big.stdout == read_noatime(&env.src.join("big.bin")), "dump of big.bin differs");

    let tar = env.cairn.run(["dump", &format!("latest:{}", env.src.display())]);
    assert!(tar.status.success(), "{}", stderr(&tar));
    let x = env.path("x");
    fs::create_dir(&x).expect("mkdir");
    let mut untar = Command::new("tar").arg("-x").arg("-C").arg(&x).stdin(Stdio::piped()).spawn().expect("tar");
    untar.stdin.take().expect("stdin").write_all(&tar.stdout).expect("feed tar");
    assert!(untar.wait().expect("tar").success());
    // Wherever the tar puts the tree, the files and their contents match.
    let root = [x.clone(), x.join("src"), restored_path(&x, &env.src)]
        .into_iter()
        .find(|p| p.join("big.bin").exists())
        .unwrap_or_else(|| panic!("no big.bin in the tar: {:?}", all_paths(&x)));
    let got = scan(&root);
    for (p, m) in &env.before {
        let g = got.get(p).unwrap_or_else(|| panic!("{p:?} is not in the tar"));
        assert_eq!((m.kind, m.size, m.digest), (g.kind, g.size, g.digest), "{p:?}");
        if m.kind == Kind::File {
            assert_eq!((m.mode, m.mtime.0), (g.mode, g.mtime.0), "{p:?}");
        }
    }
    assert_eq!(got.len(), env.before.len(), "{:?}", got.keys().collect::<Vec<_>>());
}

/// `--json` prints progress lines while a restore runs and a summary with every documented
/// field; `--profile` prints busy / idle / blocked time of every stage.
#[test]
fn json_progress_summary_and_profile() {
    let env = Fixture::backed_up(standard_tree, &SMALL_REPO, &[]);
    let t = env.path("t");
    let out = env.run_restore(&[("CAIRN_INJECT_FAULTS", "latency=300ms")], &t, &["--fetch-concurrency", "1"]);
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let (summary, status) = lines.split_last().expect("output");
    assert!(!status.is_empty(), "no progress lines in a restore of several seconds");
    let mut last_done = 0;
    for s in status {
        assert_eq!(s["message_type"], "status", "{s}");
        for f in ["bytes_done", "total_bytes", "files_done", "total_files", "fetched_bytes"] {
            assert!(s[f].is_u64(), "{f} in {s}");
        }
        assert!(s["seconds_elapsed"].is_f64() && s["stall"].is_null(), "{s}");
        let done = num(s, "bytes_done");
        assert!(done >= last_done && done <= num(s, "total_bytes"), "{s}");
        last_done = done;
    }
    assert_eq!(summary["message_type"], "summary");
    assert_eq!(summary["snapshot_id"].as_str().map(str::len), Some(64), "{summary}");
    for f in [
        "files",
        "dirs",
        "others",
        "bytes_total",
        "bytes_written",
        "bytes_fetched",
        "bytes_in_place",
        "bytes_zero",
        "deleted",
        "verified",
        "failed",
        "warnings",
    ] {
        assert!(summary[f].is_u64(), "{f} in {summary}");
    }
    assert_eq!((num(summary, "files"), num(summary, "dirs")), (10, 3 + env.src.components().count() as u64 - 1));
    assert!(summary["seconds"].as_f64().is_some_and(|s| s > 0.4), "{summary}");
    assert_eq!(summary["stalls"], serde_json::json!([]), "{summary}");
    let stages: Vec<&str> =
        summary["profile"].as_array().expect("profile").iter().map(|s| s["stage"].as_str().expect("stage")).collect();
    assert_eq!(stages, ["fetch", "decode", "write"]);
    let fetch = &summary["profile"][0];
    assert!(fetch["busy_s"].as_f64().is_some_and(|b| b >= 0.3), "the fetch stage waited on 300 ms reads: {fetch}");
    for s in summary["profile"].as_array().expect("profile") {
        for f in ["busy_s", "idle_s", "blocked_s"] {
            assert!(s[f].as_f64().is_some_and(|v| v >= 0.0), "{f} in {s}");
        }
    }

    let text = env.cairn.run([
        "restore",
        "latest",
        "--target",
        env.path("t2").to_str().expect("UTF-8"),
        "--profile",
        "--no-local-data",
    ]);
    assert!(text.status.success(), "{text:?}");
    let text = stdout(&text);
    assert!(text.lines().any(|l| l.starts_with("restored 10 files, ")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("phases: plan ")), "{text}");
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["stage", "busy", "s", "idle", "s", "blocked", "s"]),
        "{text}"
    );
    for stage in ["fetch", "decode", "write"] {
        let row = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(stage))
            .unwrap_or_else(|| panic!("no {stage} row:\n{text}"));
        let nums: Vec<f64> = row.split_whitespace().skip(1).map(|v| v.parse().expect("seconds")).collect();
        assert_eq!(nums.len(), 3, "{row}");
    }
}

/// `restore SNAP:DIR --target T` puts DIR's contents in T, and T takes DIR's own metadata
/// (mode and times), set after its contents, as any other restored directory.
#[test]
fn restoring_a_directory_path_gives_the_target_its_metadata() {
    let env = Fixture::backed_up(standard_tree, &SMALL_REPO, &[]);
    let t = env.path("t");
    let spec = format!("latest:{}", env.src.display());
    env.cairn.restore_with(&spec, &t, &[]);
    let (want, got) = (fs::symlink_metadata(&env.src).expect("stat src"), fs::symlink_metadata(&t).expect("stat t"));
    assert_eq!(got.mode() & 0o7777, want.mode() & 0o7777, "mode of the target");
    assert_eq!((got.mtime(), got.mtime_nsec()), (want.mtime(), want.mtime_nsec()), "mtime of the target");
    assert_same(&env.before, &scan(&t), true);
}

/// A no-op restore opens each file first and takes its status from the open descriptor (one
/// lookup of the name, not two): whatever stands where a file belongs and is not a plain file
/// with one name — a symlink (never followed), a FIFO (never blocked on), a socket, a directory,
/// a second name of a file outside the target — is replaced; a file whose content differs with
/// its size and mtime kept is found by its hash and fixed in place; files whose content is
/// right but whose xattrs (a changed value, an extra one), mode or owner differ get only their
/// metadata fixed (same inode, not a byte written); everything else is left alone.
#[test]
fn no_op_compare_replaces_non_files_and_fixes_only_what_differs() {
    const SIZE: usize = 5 * KIB;
    let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];
    let env = Fixture::backed_up(
        |src| {
            let mut rng = Rng(17);
            for n in names {
                fs::write(src.join(format!("{n}.bin")), rng.bytes(SIZE)).expect("write");
            }
            xattr::set(src.join("g.bin"), "user.color", b"blue").expect("setxattr");
        },
        &SMALL_REPO,
        &[],
    );
    let t = env.path("t");
    env.restore_fetching(&t, &[]);
    let r = env.restored(&t);
    let p = |n: &str| r.join(format!("{n}.bin"));
    let inodes: BTreeMap<&str, u64> = names.iter().map(|&n| (n, ino(&p(n)))).collect();

    // a: a symlink to a file outside the target, which must be neither read nor written.
    let outside = env.path("outside");
    fs::write(&outside, b"outside\n").expect("write outside");
    fs::remove_file(p("a")).expect("rm a");
    std::os::unix::fs::symlink(&outside, p("a")).expect("symlink a");
    // b: a FIFO nobody writes to (opening it for reading without O_NONBLOCK would hang).
    fs::remove_file(p("b")).expect("rm b");
    let fifo = std::ffi::CString::new(p("b").as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0, "mkfifo");
    // c: a directory with a file in it.
    fs::remove_file(p("c")).expect("rm c");
    fs::create_dir(p("c")).expect("mkdir c");
    fs::write(p("c").join("inside"), b"x").expect("write inside");
    // d: the right content, but with a second name outside the target.
    let other_name = env.path("d-other");
    fs::hard_link(p("d"), &other_name).expect("link d");
    // e: a socket.
    fs::remove_file(p("e")).expect("rm e");
    let _socket = std::os::unix::net::UnixListener::bind(p("e")).expect("bind e");
    // f: 100 bytes changed, size and times put back (`--overwrite if-changed` would trust it).
    let f_meta = fs::metadata(p("f")).expect("stat f");
    scribble(&p("f"), 1000, &[0x5a; 100]);
    support::set_times(&p("f"), (f_meta.atime(), f_meta.atime_nsec()), (f_meta.mtime(), f_meta.mtime_nsec()));
    // g: its xattr's value changed; h: an xattr the snapshot does not have; i: another mode;
    // j (as root): another owner.
    xattr::set(p("g"), "user.color", b"red").expect("setxattr g");
    xattr::set(p("h"), "user.extra", b"1").expect("setxattr h");
    fs::set_permissions(p("i"), fs::Permissions::from_mode(0o604)).expect("chmod i");
    if support::is_root() {
        std::os::unix::fs::lchown(p("j"), Some(4321), Some(4321)).expect("chown j");
    }
    let outside_meta = fs::metadata(&outside).expect("stat outside");

    let summary = env.restore_fetching(&t, &[]);
    env.assert_exact(&t);
    assert_no_stray_files(&env, &t);
    // Five files replaced whole, one chunk of f rewritten in place (f is one chunk).
    assert_eq!(num(&summary, "bytes_written"), (6 * SIZE) as u64, "{summary}");
    assert_eq!(num(&summary, "bytes_in_place"), (4 * SIZE) as u64, "{summary}");
    assert_eq!(num(&summary, "bytes_total"), (names.len() * SIZE) as u64, "{summary}");
    for n in ["f", "g", "h", "i", "j"] {
        assert_eq!(ino(&p(n)), inodes[n], "{n}.bin was replaced, not fixed in place");
    }
    // Nothing was written through the symlink or to the other name, nor was either read.
    let now = fs::metadata(&outside).expect("stat outside");
    assert_eq!((now.atime(), now.atime_nsec()), (outside_meta.atime(), outside_meta.atime_nsec()), "outside was read");
    assert_eq!(fs::read(&outside).expect("read outside"), b"outside\n");
    assert_eq!(fs::metadata(&other_name).expect("stat d-other").nlink(), 1, "d.bin still shares its inode");
    assert_eq!(ino(&other_name), inodes["d"], "the other name lost its file");
    assert_eq!(fs::read(&other_name).expect("read d-other"), fs::read(env.src.join("d.bin")).expect("read d"));

    // Now exact: a second restore finds nothing to do.
    let again = env.restore_fetching(&t, &[]);
    assert_eq!(num(&again, "bytes_written"), 0, "{again}");
    assert_eq!(num(&again, "bytes_fetched"), 0, "{again}");
}

/// As root, the owner a new file gets is learned once per directory, not asked of every file:
/// in a target directory that is set-group-ID new files get its group, beside it root's. Each
/// file still ends with its snapshot's owner, whichever of the two that is, whether it is
/// fetched or copied from the source.
#[test]
fn new_files_end_with_their_owner_in_a_set_group_id_directory_and_beside_it() {
    if !support::is_root() {
        panic!("this test needs root (it chowns files), as CI runs it");
    }
    const GROUP: u32 = 4321;
    let env = Fixture::backed_up(
        |src| {
            for dir in ["a", "b"] {
                random_files(&src.join(dir), 7, &[100, 200, 300, 400, 500, 600]);
                for i in 0..6 {
                    let gid = if i % 2 == 0 { 0 } else { GROUP };
                    std::os::unix::fs::lchown(src.join(format!("{dir}/f{i:03}")), Some(0), Some(gid)).expect("chown");
                }
            }
        },
        &SMALL_REPO,
        &[],
    );
    for (name, extra) in [("fetched", &["--no-local-data"][..]), ("copied", &[][..])] {
        let t = env.path(name);
        let a = env.restored(&t).join("a");
        fs::create_dir_all(&a).expect("mkdir a");
        std::os::unix::fs::chown(&a, Some(0), Some(GROUP)).expect("chown a");
        fs::set_permissions(&a, fs::Permissions::from_mode(0o2755)).expect("chmod a");
        fs::write(a.join("probe"), b"").expect("probe");
        assert_eq!(fs::metadata(a.join("probe")).expect("stat probe").gid(), GROUP, "a is not set-group-ID");
        fs::remove_file(a.join("probe")).expect("rm probe");
        env.cairn.restore_with("latest", &t, extra);
        env.assert_exact(&t);
    }
}
