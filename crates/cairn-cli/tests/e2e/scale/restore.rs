//! Restores of many files in bounded memory (issue #17): a restore is planned and written in
//! batches, so hard links, directory metadata, `--delete` and filters must work across batch
//! boundaries, and peak RSS must stay within `--max-memory` plus a fixed overhead whatever the
//! number of files.

use crate::support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;

use support::{assert_same, num, restored_path, scan, scan_source, Cairn, Fixture, Rng, PASSWORD};

/// The smallest batch is 4 MiB of entries (about 6,000 small files): a 1 MiB budget cuts a
/// tree of this many files into several batches.
const FILES: usize = 24_000;

/// Builds a tree of `files` small files in nested directories: duplicate contents far apart,
/// hard links whose two names fall in different batches, symlinks, a read-only directory and
/// an empty one, and directory times that must survive the batches after them.
fn make_tree(root: &Path, files: usize) {
    let mut rng = Rng(17);
    let dirs = 48;
    for d in 0..dirs {
        let dir = root.join(format!("d{d:02}")).join(format!("sub{}", d % 3));
        fs::create_dir_all(&dir).expect("mkdir");
        for f in 0..files / dirs {
            let len = 1 + (rng.next_u64() % 3000) as usize;
            // Every 10th file has content that another directory far away has too.
            let data = if f % 10 == 0 { format!("shared content {f}\n").into_bytes() } else { rng.bytes(len) };
            fs::write(dir.join(format!("f{f:04}")), data).expect("write");
        }
    }
    // Hard links from the first directory into the last ones: different batches.
    for i in 0..20 {
        let first = root.join("d00/sub0").join(format!("f{i:04}"));
        fs::hard_link(
            &first,
            root.join(format!("d{:02}/sub{}", 47 - i % 3, (47 - i % 3) % 3)).join(format!("link{i}")),
        )
        .expect("link");
    }
    std::os::unix::fs::symlink("../sub0/f0001", root.join("d05/sub2/to-f0001")).expect("symlink");
    fs::create_dir(root.join("d10/empty")).expect("mkdir empty");
    // A read-only directory with files in it: its mode is set after its files are written.
    let ro = root.join("d20/readonly");
    fs::create_dir(&ro).expect("mkdir");
    for i in 0..5 {
        fs::write(ro.join(format!("r{i}")), format!("read-only {i}")).expect("write");
    }
    fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).expect("chmod");
}

impl Fixture {
    /// A tree of `files` files ([`make_tree`]) in memory, backed up into a fresh repository.
    fn many_files(files: usize) -> Fixture {
        Fixture::in_memory().with_backup_of(|src| make_tree(src, files), &[], &[])
    }
}

/// A restore cut into batches is exact: contents, hard links (across batches), symlinks,
/// directory modes and times; a second restore fetches nothing; `--delete` removes what the
/// snapshot lacks in every batch's directories; the JSON summary counts the batches.
#[test]
fn a_restore_in_many_batches_is_exact_and_repairs_and_deletes() {
    let env = Fixture::many_files(FILES);
    let src_scan = &env.before;
    let t = env.path("t");
    let first = env.cairn.restore_with("latest", &t, &["--max-memory", "1M", "--no-local-data"]);
    assert!(num(&first, "batches") >= 3, "expected several batches: {first}");
    assert_eq!(num(&first, "files"), (FILES / 48 * 48 + 20 + 5) as u64, "{first}");
    let restored = restored_path(&t, &env.src);
    assert_same(src_scan, &scan(&restored), true);
    // Hard links share an inode, though their names were restored in different batches.
    use std::os::unix::fs::MetadataExt;
    for i in 0..20 {
        let a = fs::metadata(restored.join("d00/sub0").join(format!("f{i:04}"))).expect("stat");
        let b =
            fs::metadata(restored.join(format!("d{:02}/sub{}", 47 - i % 3, (47 - i % 3) % 3)).join(format!("link{i}")))
                .expect("stat");
        assert_eq!(a.ino(), b.ino(), "link{i} is not a hard link of its file");
    }

    // Nothing else to do: only the hard-linked files are written again (a file with other
    // names is always replaced, never written through, as in every restore).
    let again = env.cairn.restore_with("latest", &t, &["--max-memory", "1M", "--no-local-data"]);
    let linked: u64 =
        (0..20).map(|i| fs::metadata(env.src.join("d00/sub0").join(format!("f{i:04}"))).expect("stat").len()).sum();
    assert_eq!(num(&again, "bytes_written"), linked, "{again}");

    // Damage in the first and the last batches' directories, and extra entries in both.
    fs::remove_file(restored.join("d00/sub0/f0003")).expect("rm");
    fs::write(restored.join("d47/sub2/f0100"), b"changed").expect("write");
    fs::write(restored.join("d01/sub1/extra"), b"not in the snapshot").expect("write");
    fs::create_dir(restored.join("d46/sub1/extra-dir")).expect("mkdir");
    fs::write(restored.join("d46/sub1/extra-dir/x"), b"x").expect("write");
    fs::write(t.join("top-extra"), b"x").expect("write");
    let fixed = env.cairn.restore_with("latest", &t, &["--max-memory", "1M", "--delete", "--no-local-data"]);
    assert!(num(&fixed, "batches") >= 3, "{fixed}");
    assert_eq!(num(&fixed, "deleted"), 3, "{fixed}");
    assert!(num(&fixed, "bytes_fetched") > 0, "{fixed}");
    assert_same(src_scan, &scan(&restored), true);
    assert!(!t.join("top-extra").exists(), "--delete left an extra entry in the target");
}

/// `dump` of a directory streams in batches too: a tar of the 24,000-file tree written at
/// `--max-memory 1M` extracts to the same contents, modes and symlinks, and hard links whose
/// two names fall in different batches are links in the tar.
#[test]
fn a_dump_of_a_directory_in_many_batches_extracts_to_the_tree() {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    let env = Fixture::many_files(FILES);
    let out = env.cairn.run(["dump", "--max-memory", "1M", &format!("latest:{}", env.src.display())]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let x = env.path("x");
    fs::create_dir(&x).expect("mkdir");
    let mut untar =
        std::process::Command::new("tar").arg("-x").arg("-C").arg(&x).stdin(Stdio::piped()).spawn().expect("tar");
    untar.stdin.take().expect("stdin").write_all(&out.stdout).expect("feed tar");
    assert!(untar.wait().expect("tar").success());
    // Wherever the tar puts the tree, the files and their contents match.
    let root = [x.clone(), x.join("src"), restored_path(&x, &env.src)]
        .into_iter()
        .find(|p| p.join("d00").exists())
        .unwrap_or_else(|| panic!("no d00 in the tar under {x:?}"));
    let got = scan(&root);
    assert_eq!(got.len(), env.before.len(), "entries in the tar");
    for (p, m) in &env.before {
        let g = got.get(p).unwrap_or_else(|| panic!("{p:?} is not in the tar"));
        assert_eq!((m.kind, m.size, m.digest, m.mode), (g.kind, g.size, g.digest, g.mode), "{p:?}");
    }
    for i in 0..20 {
        let a = fs::metadata(root.join("d00/sub0").join(format!("f{i:04}"))).expect("stat");
        let b = fs::metadata(root.join(format!("d{:02}/sub{}", 47 - i % 3, (47 - i % 3) % 3)).join(format!("link{i}")))
            .expect("stat");
        assert_eq!(a.ino(), b.ino(), "link{i} is not a hard link in the tar");
    }
}

/// An `--include` that selects directories deep inside and far apart: only they (and their
/// parents) are restored, across batches, and parents the filter leaves empty are not made.
#[test]
fn a_filtered_restore_in_batches_makes_only_the_selected_directories() {
    let env = Fixture::many_files(FILES);
    let t = env.path("t");
    let summary = env.cairn.restore_with(
        "latest",
        &t,
        &["--max-memory", "1M", "--include", "**/d03/sub0/**", "--include", "**/d44/sub2/**"],
    );
    let restored = restored_path(&t, &env.src);
    for d in ["d03/sub0", "d44/sub2"] {
        assert_same(&scan_source(&env.src.join(d)), &scan(&restored.join(d)), true);
    }
    let top: Vec<String> = fs::read_dir(&restored)
        .expect("list")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
        .collect();
    let mut top = top;
    top.sort();
    assert_eq!(top, ["d03", "d44"], "{summary}");
    assert_eq!(num(&summary, "files"), (2 * (FILES / 48)) as u64, "{summary}");
}

/// Peak RSS of a restore of 200,000 files with a small budget stays within `--max-memory`
/// plus 64 MiB (it grew by about 1.3 KB a file when the whole plan was kept).
#[test]
fn peak_rss_of_a_restore_of_200k_files_stays_within_the_budget() {
    const MANY: usize = 200_000;
    let _shm = support::shm_shared();
    let base = support::memory_tempdir();
    let src = base.path().join("src");
    let mut rng = Rng(5);
    for d in 0..200 {
        let dir = src.join(format!("dir{d:03}"));
        fs::create_dir_all(&dir).expect("mkdir");
        for f in 0..MANY / 200 {
            let len = (rng.next_u64() % 200) as usize;
            fs::write(dir.join(format!("file-with-a-longer-name-{f:05}")), rng.bytes(len)).expect("write");
        }
    }
    let cairn = Cairn::new(&base.path().join("repo"), PASSWORD);
    cairn.init(&[]);
    cairn.backup(&[&src], &[]);
    let t = base.path().join("t");
    let budget_mib = 16;
    let mut restore = cairn.command();
    restore
        .args(["--json", "restore", "latest", "--target"])
        .arg(&t)
        // The source is still here; this measures the fetching restore (the local-data stage's
        // own memory is not bounded by batches yet: docs/DESIGN.md, "Restore in batches").
        .args(["--max-memory", &format!("{budget_mib}M"), "--no-local-data"]);
    let (out, _, peak_kib) = support::run_with_peak_rss(&mut restore);
    let peak_mib = peak_kib / 1024;
    let summary = support::last_json(&out);
    assert_eq!(num(&summary, "files"), MANY as u64, "{summary}");
    assert_eq!(num(&summary, "failed"), 0, "{summary}");
    assert!(num(&summary, "batches") > 1, "{summary}");
    assert!(peak_mib <= budget_mib + 64, "peak RSS {peak_mib} MiB over --max-memory {budget_mib}M + 64 MiB: {summary}");
    // Spot checks of the content (a full scan of 200,000 files is left to the other tests).
    let restored = restored_path(&t, &src);
    for d in [0, 99, 199] {
        for f in [0, MANY / 400, MANY / 200 - 1] {
            let rel = format!("dir{d:03}/file-with-a-longer-name-{f:05}");
            assert_eq!(fs::read(restored.join(&rel)).expect("read"), fs::read(src.join(&rel)).expect("read"), "{rel}");
        }
    }

    // The commands that walk snapshots: each refuses a budget that cannot hold the index, the
    // largest directory and a tree-loading thread, in one line naming the least that fits;
    // within that least budget each stays under it plus 64 MiB and says what it should.
    let mut least = None;
    for cmd in [&["stats"][..], &["ls", "latest"], &["find", "x"], &["diff", "latest", "latest"]] {
        let out = cairn.run([cmd, &["--max-memory", "1M"]].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{cmd:?}: {err}");
        assert!(err.contains("is too small for this walk"), "{cmd:?}: {err}");
        let n: u64 = err.split("give at least ").nth(1).and_then(|t| t.split(' ').next()).unwrap().parse().unwrap();
        assert!(least.is_none_or(|l| l == n), "{cmd:?}: {err}");
        least = Some(n);
    }
    let walk_mib = least.unwrap();
    let walk = |args: &[&str]| {
        let mut c = cairn.command();
        c.args(args).args(["--max-memory", &format!("{walk_mib}M")]);
        let (out, _, peak_kib) = support::run_with_peak_rss(&mut c);
        assert!(
            peak_kib / 1024 <= walk_mib + 64,
            "{args:?}: peak RSS {} MiB over {walk_mib}M + 64 MiB",
            peak_kib / 1024
        );
        out
    };
    let stats = support::last_json(&walk(&["--json", "stats"]));
    assert_eq!(stats["restore_size"]["files"], MANY as u64, "{stats}");
    let listed = walk(&["ls", "latest"]);
    assert_eq!(listed.lines().filter(|l| l.contains("/file-with-a-longer-name-")).count(), MANY, "ls lists every file");
    let found = walk(&["--json", "find", "file-with-a-longer-name-00007"]);
    assert_eq!(found.lines().filter(|l| l.contains("\"path\"")).count(), 200, "{found}");

    // A check refuses a budget that cannot hold the index, the packs it lists and what its walk
    // keeps, in one line naming the least; within that least, reading every pack, it stays under
    // it plus 64 MiB and finds nothing wrong.
    let out = cairn.run(["check", "--max-memory", "1M"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("is too small for this check"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let check_mib: u64 = err.split("give at least ").nth(1).and_then(|t| t.split(' ').next()).unwrap().parse().unwrap();
    let mut check = cairn.command();
    check.args(["--json", "check", "--read-data", "--max-memory", &format!("{check_mib}M")]);
    let (out, _, peak_kib) = support::run_with_peak_rss(&mut check);
    let summary = support::last_json(&out);
    assert_eq!(summary["errors"], 0, "{summary}");
    // Every file of 1-199 bytes is a blob, the identical ones one (and the empty ones none).
    assert!(num(&summary, "blobs") as usize > MANY / 2, "{summary}");
    assert_eq!(num(&summary, "blobs_read"), num(&summary, "blobs"), "every blob read: {summary}");
    assert!(
        peak_kib / 1024 <= check_mib + 64,
        "check: peak RSS {} MiB over --max-memory {check_mib}M + 64 MiB: {summary}",
        peak_kib / 1024
    );

    // A copy into a repository with other IDs (every blob read, named again and every tree
    // rewritten) within its budget too: it held every tree and a hash map entry or three per
    // blob, beside the budget's reads and packs.
    let dst = Cairn::new(&base.path().join("copy"), PASSWORD);
    dst.init(&["--pack-size", "1"]);
    let copy_mib = 48;
    let mut copy = dst.command();
    copy.env("CAIRN_FROM_PASSWORD", PASSWORD)
        .args(["--json", "copy", "--from-repo"])
        .arg(&cairn.repo)
        .args(["--max-memory", &format!("{copy_mib}M")]);
    let (out, _, peak_kib) = support::run_with_peak_rss(&mut copy);
    let peak_mib = peak_kib / 1024;
    let summary = support::last_json(&out);
    assert_eq!(num(&summary, "snapshots_copied"), 1, "{summary}");
    assert!(
        peak_mib <= copy_mib + 64,
        "copy: peak RSS {peak_mib} MiB over --max-memory {copy_mib}M + 64 MiB: {summary}"
    );
    let t2 = base.path().join("t2");
    dst.restore_with("latest", &t2, &["--no-local-data"]);
    let copied = restored_path(&t2, &src);
    for d in [0, 99, 199] {
        for f in [0, MANY / 400, MANY / 200 - 1] {
            let rel = format!("dir{d:03}/file-with-a-longer-name-{f:05}");
            assert_eq!(fs::read(copied.join(&rel)).expect("read"), fs::read(src.join(&rel)).expect("read"), "{rel}");
        }
    }

    // A prune that repacks every pack (their headers are unused space) within its budget too:
    // it held the index files twice and a set of every needed blob's ID beside its reads and
    // unbounded new packs.
    let prune_mib = 48;
    let mut prune = dst.command();
    prune.args(["--json", "prune", "--max-unused", "0", "--max-memory", &format!("{prune_mib}M")]);
    let (out, _, peak_kib) = support::run_with_peak_rss(&mut prune);
    let peak_mib = peak_kib / 1024;
    let summary = support::last_json(&out);
    assert!(num(&summary["plan"], "repack_packs") > 1, "{summary}");
    assert!(
        peak_mib <= prune_mib + 64,
        "prune: peak RSS {peak_mib} MiB over --max-memory {prune_mib}M + 64 MiB: {summary}"
    );
    let checked = dst.run(["check", "--read-data"]);
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stderr));
}
