//! Backups of many files in bounded memory (issue #17): the peak RSS of a backup stays within
//! the bound docs/DESIGN.md ("Backup memory") documents, which grows with the entries of the
//! largest directory and the blobs of the repository by a few dozen bytes each, not with a
//! whole `Node` per file held until its directory is done.

use crate::support;

use std::fs;
use std::path::Path;

use serde_json::Value;
use support::{last_json, memory_tempdir, num, run_with_peak_rss, Cairn, Rng, PASSWORD};

/// Files in the test tree: most in one directory, as the `many` data set's top directory.
const FILES: u64 = 200_000;
const IN_BIG_DIR: u64 = 150_000;
const PACK_MIB: u64 = 4;
const THREADS: u64 = 2;
const UPLOADS: u64 = 2;

/// The bound of docs/DESIGN.md, "Backup memory", in MiB: the packs being filled, queued and
/// stored, the index, the largest directory's entries held encoded, the parent snapshot's tree
/// of that directory when there is one, and a fixed overhead.
fn bound_mib(blobs: u64, largest_dir: u64, with_parent: bool) -> u64 {
    let packs = (2 * THREADS + 2 * UPLOADS + 2) * PACK_MIB;
    let index = blobs * 120 / (1 << 20);
    let pending = largest_dir * 400 / (1 << 20);
    let parent = if with_parent { largest_dir * 1024 / (1 << 20) } else { 0 };
    packs + index + pending + parent + 48
}

/// 150,000 files in one directory and 50,000 in 50 others, each of 1 to 200 random bytes (so a
/// blob each).
fn make_tree(root: &Path) {
    let mut rng = Rng(23);
    let big = root.join("big");
    fs::create_dir_all(&big).expect("mkdir");
    for f in 0..IN_BIG_DIR {
        let len = 1 + (rng.next_u64() % 200) as usize;
        fs::write(big.join(format!("a-file-with-a-longer-name-{f:06}")), rng.bytes(len)).expect("write");
    }
    let per_dir = (FILES - IN_BIG_DIR) / 50;
    for d in 0..50 {
        let dir = root.join(format!("d{d:02}"));
        fs::create_dir(&dir).expect("mkdir");
        for f in 0..per_dir {
            let len = 1 + (rng.next_u64() % 200) as usize;
            fs::write(dir.join(format!("f{f:05}")), rng.bytes(len)).expect("write");
        }
    }
}

/// Backs `src` up; returns the JSON summary and the peak RSS in MiB.
fn backup(cairn: &Cairn, src: &Path) -> (Value, u64) {
    let mut c = cairn.command();
    c.args(["--json", "backup", "--threads", &THREADS.to_string(), "--upload-concurrency", &UPLOADS.to_string()])
        .arg(src);
    let (stdout, _, peak_kib) = run_with_peak_rss(&mut c);
    (last_json(&stdout), peak_kib / 1024)
}

/// An initial backup of 200,000 files, 150,000 of them in one directory, and a backup with
/// nothing changed stay within the documented bound; both record every file.
#[test]
fn peak_rss_of_a_backup_of_200k_files_stays_within_the_bound() {
    // One such test at a time, and no other test in /dev/shm beside it (see support::shm_alone).
    let _alone = support::shm_alone();
    let base = memory_tempdir();
    let src = base.path().join("src");
    make_tree(&src);
    let cairn = Cairn::new(&base.path().join("repo"), PASSWORD);
    cairn.init(&["--pack-size", &PACK_MIB.to_string()]);

    let (first, peak) = backup(&cairn, &src);
    assert_eq!(num(&first, "files_new"), FILES, "{first}");
    let bound = bound_mib(FILES, IN_BIG_DIR, false);
    eprintln!("initial backup: peak RSS {peak} MiB, bound {bound} MiB");
    assert!(peak <= bound, "initial backup: peak RSS {peak} MiB over the bound {bound} MiB: {first}");

    let (again, peak) = backup(&cairn, &src);
    assert_eq!(num(&again, "files_unmodified"), FILES, "{again}");
    assert_eq!(num(&again, "bytes_added"), 0, "{again}");
    let bound = bound_mib(FILES, IN_BIG_DIR, true);
    eprintln!("unchanged backup: peak RSS {peak} MiB, bound {bound} MiB");
    assert!(peak <= bound, "unchanged backup: peak RSS {peak} MiB over the bound {bound} MiB: {again}");

    // The snapshot holds every file of the big directory with its content.
    let listed = cairn.ok(["ls", &format!("latest:{}", src.join("big").display())]);
    assert_eq!(listed.lines().filter(|l| l.contains("a-file-with-a-longer-name-")).count() as u64, IN_BIG_DIR);
    let name = "a-file-with-a-longer-name-123456";
    let dumped = cairn.run(["dump", &format!("latest:{}", src.join("big").join(name).display())]);
    assert!(dumped.status.success(), "dump failed: {}", String::from_utf8_lossy(&dumped.stderr));
    assert_eq!(dumped.stdout, fs::read(src.join("big").join(name)).expect("read"));
}

/// Backs `src` up with `extra` arguments over a link where every request takes 200 ms (packs
/// are filled far faster than they are stored, so they pile up as far as the backup lets
/// them); returns the JSON summary, stderr and the peak RSS in MiB.
fn slow_backup(cairn: &Cairn, src: &Path, extra: &[&str]) -> (Option<Value>, String, u64) {
    let mut c = cairn.command();
    c.env("CAIRN_INJECT_FAULTS", "latency=200ms").args(["--json", "backup"]).args(extra).arg(src);
    let (stdout, stderr, peak_kib) = run_with_peak_rss(&mut c);
    let summary = stdout.lines().rev().find_map(|l| serde_json::from_str::<Value>(l).ok());
    (summary, stderr, peak_kib / 1024)
}

/// `backup --max-memory` bounds the packs being filled, waiting and being stored (the part of a
/// backup's memory its configuration sets: 20 packs of 18 MiB with four threads and four uploads)
/// to half of what the index leaves; a budget that cannot hold two packs is refused up front.
#[test]
fn backup_max_memory_bounds_the_packs_in_memory() {
    // One such test at a time, and no other test in /dev/shm beside it (see support::shm_alone).
    let _alone = support::shm_alone();
    let base = memory_tempdir();
    let src = base.path().join("src");
    fs::create_dir_all(&src).expect("mkdir");
    let mut rng = Rng(5);
    for i in 0..6 {
        fs::write(src.join(format!("random-{i}")), rng.bytes(40 << 20)).expect("write");
    }
    let cairn = Cairn::new(&base.path().join("repo"), PASSWORD);
    cairn.init(&[]); // 16 MiB packs

    // Too small for two packs of 18 MiB: refused in one line, nothing stored.
    let out = cairn.run(["backup", "--max-memory", "64M", src.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--max-memory 64 MiB is too small") && err.contains("give at least"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(cairn.snapshots().is_empty());

    // Four packers and four uploads: without a bound they hold up to 20 packs of 18 MiB, far
    // above the bound (with two of each, 10 packs, the control's peak came within a few MiB of
    // the bounded run's once, when the bounded one peaked high).
    let many = ["--threads", "4", "--upload-concurrency", "4"];
    let max_mib = 128;
    let (summary, stderr, bounded) =
        slow_backup(&cairn, &src, &[&many[..], &["--max-memory", &format!("{max_mib}M")]].concat());
    let summary = summary.unwrap_or_else(|| panic!("no summary: {stderr}"));
    assert_eq!(num(&summary, "files_new"), 6, "{summary}");
    eprintln!("backup --max-memory {max_mib}M over a slow link: peak RSS {bounded} MiB");
    assert!(bounded <= max_mib + 64, "peak RSS {bounded} MiB over --max-memory {max_mib} MiB + 64 MiB");
    let checked = cairn.ok(["check", "--read-data"]);
    assert!(checked.contains("no errors"), "{checked}");
    // The same backup into a fresh repository without the bound holds more packs at once: the
    // bound is what held it.
    let control = Cairn::new(&base.path().join("control"), PASSWORD);
    control.init(&[]);
    let (summary, stderr, unbounded) = slow_backup(&control, &src, &many);
    assert!(summary.is_some(), "{stderr}");
    eprintln!("the same without --max-memory: peak RSS {unbounded} MiB");
    assert!(unbounded > bounded, "without the bound {unbounded} MiB, with it {bounded} MiB");
}
