//! `cairn prune` and `cairn recompress` end to end (issue 14): real repositories made by the real
//! binary, snapshots forgotten, space freed; backups run beside a prune and are never blocked;
//! a prune killed with SIGKILL at each of its steps leaves every snapshot restorable and the
//! next prune finishes the work; a second prune refuses while one runs.
//!
//! Moments inside a prune are reached with the fault layer's stalls (`stall-write=deletions/`
//! holds it just before its manifest is stored, and so on): a real prune on a real repository,
//! paused at a chosen request.

use crate::support;
use crate::support::library;
use crate::support::servers;

use std::fs;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{assert_same, last_json, restored_path, scan, scan_source, wait_until, Cairn, Fixture, Rng};

/// Small chunks and 1 MiB packs: a few MiB make many packs and blobs.
const INIT: [&str; 4] = ["--chunk-sizes", "65536,131072,524288", "--pack-size", "1"];

impl Fixture {
    /// A local repository (small chunks, 1 MiB packs, a cache of its own) and an empty source.
    fn for_prune() -> Fixture {
        Fixture::new().isolated_cache().with_prune_repository()
    }

    /// This fixture with its repository initialised for the prune tests and an empty source.
    fn with_prune_repository(self) -> Fixture {
        fs::create_dir_all(&self.src).unwrap();
        self.init(&INIT)
    }

    /// Writes files `0..n` of generation `gen` (file `i` gets new random content when
    /// `i % 3 == gen % 3`, so each generation changes a third of the files), backs up, and
    /// remembers the snapshot.
    fn generation(&mut self, gen: u64, n: u64) -> String {
        for i in 0..n {
            let path = self.src.join(format!("f{i:02}"));
            if gen == 0 || i % 3 == gen % 3 {
                fs::write(&path, Rng(gen * 1000 + i + 1).bytes(200_000 + (i as usize % 5) * 37_000)).unwrap();
            }
        }
        self.remember_backup()
    }

    /// Backs up the source; remembers (in `snaps`) and returns the snapshot's ID.
    fn remember_backup(&mut self) -> String {
        let before = scan_source(&self.src);
        let s = self.cairn.backup(&[&self.src], &[]);
        let id = s["snapshot_id"].as_str().unwrap().to_string();
        self.snaps.push((id.clone(), before));
        id
    }

    /// Forgets snapshot `id` (and no longer remembers it).
    fn forget_remembered(&mut self, id: &str) {
        self.cairn.ok(["forget", id]);
        self.snaps.retain(|(s, _)| s != id);
    }

    /// Every remembered snapshot restores exactly what was backed up.
    fn all_restore(&self, tag: &str) {
        self.all_restore_from(&self.cairn, tag);
    }

    /// [`Fixture::all_restore`] from `cairn`'s repository (a copy of this one).
    fn all_restore_from(&self, cairn: &Cairn, tag: &str) {
        for (i, (id, want)) in self.snaps.iter().enumerate() {
            let target = self.base.join(format!("restore-{tag}-{i}"));
            cairn.restore(id, &target);
            assert_same(want, &scan(&restored_path(&target, &self.src)), false);
            fs::remove_dir_all(&target).unwrap();
        }
    }

    fn data_bytes(&self) -> u64 {
        dir_bytes(&self.cairn.repo.join("data"))
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    let mut sum = 0;
    for e in fs::read_dir(dir).into_iter().flatten() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        sum += if m.is_dir() { dir_bytes(&e.path()) } else { m.len() };
    }
    sum
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> =
        support::files_under(dir).iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    out.sort();
    out
}

/// `cairn --json prune ARGS`, which must succeed; returns its summary.
fn prune(cairn: &Cairn, args: &[&str]) -> Value {
    let mut full = vec!["--json", "prune"];
    full.extend_from_slice(args);
    let s = last_json(&cairn.ok(&full));
    assert_eq!(s["message_type"], "summary", "{s}");
    s
}

/// `cairn --json check ARGS`: exit code and summary. Errors are reported in the exit code.
fn check(cairn: &Cairn, args: &[&str]) -> (i32, Value) {
    let mut full = vec!["--json", "check"];
    full.extend_from_slice(args);
    let out = cairn.run(&full);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let shown = format!("check {args:?}: {}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let code = out.status.code().unwrap_or_else(|| panic!("check was killed: {shown}"));
    (code, last_json(&stdout))
}

/// `check --read-data` finds no error (notices, e.g. of unreferenced packs, are allowed unless
/// `clean`).
fn assert_checks(cairn: &Cairn, clean: bool) {
    let (code, s) = check(cairn, &["--read-data"]);
    assert_eq!(code, 0, "check found errors: {s}");
    assert_eq!(s["errors"], 0, "{s}");
    if clean {
        assert_eq!(s["notices"], 0, "check has notices: {s}");
    }
}

/// Waits for `child` (at most five minutes) and returns its output.
fn finish(child: Child, what: &str) -> std::process::Output {
    support::wait_within_timeout(child, what)
}

/// A repository with four generations of 12 files, the first two forgotten: about half of its
/// data is needed by no snapshot.
fn forgotten_half() -> Fixture {
    let mut fx = Fixture::for_prune();
    let first = fx.generation(0, 12);
    let second = fx.generation(1, 12);
    fx.generation(2, 12);
    fx.generation(3, 12);
    fx.forget_remembered(&first);
    fx.forget_remembered(&second);
    fx
}

#[test]
fn prune_frees_what_forgotten_snapshots_held_and_the_rest_restores() {
    let fx = forgotten_half();
    let before_files = files_in(&fx.cairn.repo.join("data"));
    let before = fx.data_bytes();

    let dry = prune(&fx.cairn, &["--dry-run"]);
    assert_eq!(files_in(&fx.cairn.repo.join("data")), before_files, "a dry run deletes nothing");
    assert!(files_in(&fx.cairn.repo.join("deletions")).is_empty(), "a dry run writes no manifest");
    assert!(dry["plan"]["delete_packs"].as_u64().unwrap() + dry["plan"]["repack_packs"].as_u64().unwrap() > 0, "{dry}");
    assert_eq!(dry["plan"]["size"], before, "{dry}");

    // Too small a budget is refused in one line that says what to give, before anything
    // changes; then the prune runs within the least budget it named.
    let refused = fx.cairn.run(["prune", "--max-memory", "64K"]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{err}");
    assert_eq!(err.trim().lines().filter(|l| l.starts_with("cairn:")).count(), 1, "{err}");
    assert!(err.contains("--max-memory 1 MiB is too small for this prune"), "{err}");
    assert_eq!(files_in(&fx.cairn.repo.join("data")), before_files, "a refused prune deletes nothing");
    let least: u64 = err.split("give at least ").nth(1).and_then(|t| t.split(' ').next()).unwrap().parse().unwrap();
    let s = prune(&fx.cairn, &["--max-memory", &format!("{least}M")]);
    assert!(s["plan"]["repack_packs"].as_u64().unwrap() >= 2, "too little repacked: {s}");
    let after = fx.data_bytes();
    assert_eq!(s["size_before"], before, "{s}");
    assert_eq!(s["size_after"], after, "{s}");
    assert_eq!(s["freed_bytes"], before - after, "{s}");
    // What the dry run planned is what the prune did.
    assert_eq!(s["plan"]["delete_packs"], dry["plan"]["delete_packs"], "{s}\n{dry}");
    assert_eq!(s["plan"]["repack_packs"], dry["plan"]["repack_packs"], "{s}\n{dry}");
    // A third of the files changed per generation: the two forgotten snapshots held at least a
    // quarter of the data that only they needed.
    assert!(after * 4 < before * 3, "freed too little: {before} -> {after}\n{s}");
    let used = s["plan"]["used_bytes"].as_u64().unwrap();
    assert!(after <= used + used / 10 + 64 * 1024, "more than the needed data is left: {after} vs {used}\n{s}");
    assert!(files_in(&fx.cairn.repo.join("deletions")).is_empty(), "the manifest is removed at the end");

    assert_checks(&fx.cairn, true);
    fx.all_restore("after");
    // Nothing is left to do.
    let again = prune(&fx.cairn, &[]);
    assert_eq!(again["freed_bytes"], 0, "{again}");
    assert_eq!(again["plan"]["delete_packs"], 0, "{again}");
    assert_eq!(again["plan"]["repack_packs"], 0, "{again}");
}

#[test]
fn forget_with_prune_forgets_then_frees_the_space() {
    let mut fx = Fixture::for_prune();
    for gen in 0..4 {
        fx.generation(gen, 9);
    }
    let before = fx.data_bytes();
    let out = fx.cairn.ok(["--json", "forget", "--keep-last", "2", "--prune"]);
    let mut lines = out.lines().filter(|l| !l.trim().is_empty());
    let groups: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(groups[0]["remove"].as_array().unwrap().len(), 2, "{out}");
    let s: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(s["message_type"], "summary", "{out}");
    assert!(s["freed_bytes"].as_u64().unwrap() > 0, "{out}");
    assert_eq!(fx.cairn.snapshots().len(), 2);
    assert!(fx.data_bytes() < before);
    fx.snaps.drain(..2);
    assert_checks(&fx.cairn, true);
    fx.all_restore("forget-prune");
}

#[test]
fn prune_on_s3_frees_space_and_the_rest_restores() {
    let mut fx = Fixture::remote(&servers::s3_repo("prune")).with_prune_repository();
    let first = fx.generation(0, 9);
    fx.generation(1, 9);
    fx.forget_remembered(&first);
    let s = prune(&fx.cairn, &[]);
    let freed = s["freed_bytes"].as_u64().unwrap();
    assert!(freed > 0, "{s}");
    assert_eq!(s["size_before"].as_u64().unwrap() - freed, s["size_after"].as_u64().unwrap(), "{s}");
    assert_checks(&fx.cairn, true);
    fx.all_restore("s3");
    assert_eq!(prune(&fx.cairn, &[])["freed_bytes"], 0);
}

/// A backup that loaded the index before the prune stored its manifest deduplicates against
/// blobs the prune is about to delete. Held just before writing its snapshot while the prune
/// decides, it finishes after; the prune waits for it and keeps what its snapshot needs.
#[test]
fn a_backup_running_while_prune_decides_keeps_what_it_deduplicated() {
    let mut fx = Fixture::for_prune();
    let first = fx.generation(0, 9);
    fx.generation(1, 9);
    // The next backup brings back generation 0's files 1, 4 and 7, which only the first
    // snapshot holds (generation 1 changed them); then that snapshot is forgotten.
    let old = |i: u64| Rng(i + 1).bytes(200_000 + (i as usize % 5) * 37_000);
    fx.forget_remembered(&first);
    for i in [1, 4, 7] {
        fs::write(fx.src.join(format!("f{i:02}")), old(i)).unwrap();
    }
    let want = scan_source(&fx.src);
    let held = fx.cairn.spawn(
        &[("CAIRN_INJECT_FAULTS", "stall-write=snapshots/,stall-for=6s")],
        &["--json", "backup", fx.src.to_str().unwrap()],
    );
    // It takes its lock, then loads the index (before the prune's manifest exists).
    let locks = fx.cairn.repo.join("locks");
    wait_until(Duration::from_secs(60), "the backup's lock", || !files_in(&locks).is_empty());
    std::thread::sleep(Duration::from_millis(1500));
    let start = Instant::now();
    // No unused space tolerated: every pack holding one of those blobs is to be deleted.
    let s = prune(&fx.cairn, &["--max-unused", "0%"]);
    let out = finish(held, "held backup");
    assert!(out.status.success(), "backup failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(start.elapsed() >= Duration::from_secs(2), "the prune did not wait for the running backup: {s}");
    let backup = last_json(&String::from_utf8_lossy(&out.stdout));
    // The backup deduplicated the old files against blobs the prune had planned to delete (it
    // added nothing for them); the restore below shows the prune kept them.
    assert!(backup["bytes_added"].as_u64().unwrap_or(0) < 200_000, "{backup}");
    assert!(s["plan"]["delete_packs"].as_u64().unwrap() + s["plan"]["repack_packs"].as_u64().unwrap() > 0, "{s}");
    assert!(s["finished"]["rescued_packs"].as_u64().unwrap() > 0, "the prune kept nothing for the backup: {s}");
    assert_eq!(s["finished"]["new_snapshots"], 1, "{s}");
    fx.snaps.push((backup["snapshot_id"].as_str().unwrap().to_string(), want));
    assert_checks(&fx.cairn, false);
    fx.all_restore("rescued");
}

/// Backups started before, during and after prunes, with data that deduplicates against what
/// the prunes remove, all finish without waiting; afterwards every snapshot restores exactly and
/// the repository checks clean.
#[test]
fn backups_beside_prunes_finish_and_every_snapshot_restores() {
    let mut fx = Fixture::for_prune();
    fx.generation(0, 12);
    let mut finished_during = 0;
    for round in 1..=3u64 {
        let old = fx.snaps[0].0.clone();
        fx.generation(round, 12);
        fx.forget_remembered(&old);
        // A slow prune (every request 10 ms later) and backups beside it.
        let running = fx.cairn.spawn(&[("CAIRN_INJECT_FAULTS", "latency=10ms")], &["--json", "prune"]);
        let mut pruning = Some(running);
        for step in 0..2u64 {
            // Bring back a file as the first, forgotten generation had it (it dedups against
            // blobs the prune is deleting) and add another.
            let i = (round * 2 + step) % 12;
            fs::write(fx.src.join(format!("f{i:02}")), Rng(i + 1).bytes(200_000 + (i as usize % 5) * 37_000)).unwrap();
            fs::write(fx.src.join(format!("new{round}-{step}")), Rng(77 + round * 10 + step).bytes(100_000)).unwrap();
            fx.remember_backup();
            if let Some(p) = pruning.as_mut() {
                if p.try_wait().unwrap().is_none() {
                    finished_during += 1;
                }
            }
        }
        let out = finish(pruning.take().unwrap(), "prune");
        assert!(out.status.success(), "prune failed: {}", String::from_utf8_lossy(&out.stderr));
        fx.remember_backup();
    }
    assert!(finished_during > 0, "no backup finished while a prune ran: prunes block backups?");
    assert_checks(&fx.cairn, false);
    fx.all_restore("beside");
    prune(&fx.cairn, &[]);
    assert_checks(&fx.cairn, true);
    fx.all_restore("final");
}

/// The moments a prune is killed at: a fault stall holds it at one request, then SIGKILL.
const KILL_POINTS: [(&str, &str); 7] = [
    ("while marking (reading trees)", "stall=data/"),
    ("before its manifest is stored", "stall-write=deletions/"),
    ("during repacking (a new pack)", "stall-write=data/"),
    ("while writing index files", "stall-write=index/"),
    ("while removing replaced index files", "stall-delete=index/"),
    ("while deleting packs", "stall-delete=data/"),
    ("before removing its manifest", "stall-delete=deletions/"),
];

#[test]
fn a_prune_killed_at_any_step_leaves_every_snapshot_restorable_and_the_next_finishes() {
    let template = forgotten_half();
    let clean_prune = template.base.join("clean");
    // What a whole prune frees, for comparison.
    copy_dir(&template.cairn.repo, &clean_prune);
    let whole = prune(&Cairn { repo: clean_prune.clone(), ..template.cairn.clone() }, &[]);
    let whole_after = whole["size_after"].as_u64().unwrap();

    for (i, (moment, fault)) in KILL_POINTS.iter().enumerate() {
        let repo = template.base.join(format!("kill-{i}"));
        copy_dir(&template.cairn.repo, &repo);
        let cairn = Cairn { repo: repo.clone(), ..template.cairn.clone() };
        let stalled = template.base.join(format!("stalled-{i}"));
        let spec = format!("{fault},stall-for=120s,stalled={}", stalled.display());
        let mut child = cairn.spawn(&[("CAIRN_INJECT_FAULTS", &spec)], &["--json", "prune"]);
        // Let it reach the stall (it stalls for two minutes there, and says when it begins).
        let stalls = support::wait_for_stall(&mut child, &stalled);
        assert!(child.try_wait().unwrap().is_none(), "{moment}: the prune ended before it was killed");
        assert!(stalls, "{moment}: the prune did not reach its stall in 100 s");
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Its lock is stale (the process is gone); `cairn unlock` removes it, as a user would.
        cairn.ok(["unlock"]);

        let (code, s) = check(&cairn, &["--read-data"]);
        assert_eq!(code, 0, "{moment}: check after the kill found errors: {s}");
        template.all_restore_from(&cairn, &format!("killed-{i}"));
        let next = prune(&cairn, &[]);
        assert!(files_in(&repo.join("deletions")).is_empty(), "{moment}: the next prune left a manifest: {next}");
        assert_checks(&cairn, true);
        template.all_restore_from(&cairn, &format!("next-{i}"));
        let size = dir_bytes(&repo.join("data"));
        assert!(
            size <= whole_after + whole_after / 20,
            "{moment}: after the next prune {size} bytes, a whole prune leaves {whole_after}"
        );
        fs::remove_dir_all(&repo).unwrap();
    }
}

#[test]
fn a_second_prune_refuses_while_one_runs() {
    let fx = forgotten_half();
    let first = fx.cairn.spawn(&[("CAIRN_INJECT_FAULTS", "stall-write=deletions/,stall-for=30s")], &["prune"]);
    let locks = fx.cairn.repo.join("locks");
    wait_until(Duration::from_secs(60), "the first prune's lock", || !files_in(&locks).is_empty());
    let out = fx.cairn.run(["prune"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(11), "{err}");
    assert!(err.contains("is locked") && err.contains("prune lock of process"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let mut first = first;
    first.kill().unwrap();
    first.wait().unwrap();
    // The killed prune's lock is stale (its process is gone): the next prune goes ahead, and
    // says it ignores the lock.
    let out = fx.cairn.run(["--json", "prune"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("ignoring stale lock") && err.contains("no longer runs"), "{err}");
    let s = last_json(&String::from_utf8_lossy(&out.stdout));
    assert!(s["freed_bytes"].as_u64().unwrap() > 0, "{s}");
}

/// A lock held by a live process when the manifest is written holds the deletion back; with a
/// short --max-wait the prune leaves it for the next, and backups meanwhile store again what the
/// doomed packs hold.
#[test]
fn a_prune_waits_for_older_operations_and_leaves_the_deletion_for_the_next() {
    let mut fx = forgotten_half();
    let mut sleeper = Command::new("sleep").arg("600").spawn().unwrap();
    plant_lock(&fx.cairn.repo, sleeper.id());
    let before = files_in(&fx.cairn.repo.join("data"));
    // No unused space tolerated: every pack holding a blob no snapshot needs is doomed.
    let s = prune(&fx.cairn, &["--max-wait", "1s", "--max-unused", "0%"]);
    assert_eq!(s["deferred"], true, "{s}");
    assert!(s["finished"].is_null(), "{s}");
    assert_eq!(files_in(&fx.cairn.repo.join("deletions")).len(), 1, "the manifest stays for the next prune");
    let now = files_in(&fx.cairn.repo.join("data"));
    assert!(before.iter().all(|p| now.contains(p)), "a deferred prune deleted a pack");
    // A backup now does not deduplicate against doomed packs: generation 0's files come back
    // and those only the forgotten snapshots held (f01 and f02; f00 was unchanged until
    // generation 3) are stored again.
    for i in 0..3u64 {
        fs::write(fx.src.join(format!("f{i:02}")), Rng(i + 1).bytes(200_000 + (i as usize % 5) * 37_000)).unwrap();
    }
    let stored_before = fx.data_bytes();
    fx.remember_backup();
    assert!(fx.data_bytes() > stored_before + 400_000, "the backup deduplicated against doomed packs");
    assert_checks(&fx.cairn, false);
    fx.all_restore("deferred");

    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    fx.cairn.ok(["unlock"]);
    let s = prune(&fx.cairn, &[]);
    assert_eq!(s["earlier"].as_array().unwrap().len(), 1, "{s}");
    assert!(files_in(&fx.cairn.repo.join("deletions")).is_empty());
    assert_checks(&fx.cairn, true);
    fx.all_restore("finished");
}

#[test]
fn recompress_changes_the_codec_and_everything_still_restores() {
    let mut fx = Fixture::for_prune();
    // Compressible files, so every codec stores them compressed.
    for i in 0..6u64 {
        let text: Vec<u8> = (0..300_000u64).map(|j| b"abcdefgh"[((j * (i + 3)) / 7 % 8) as usize]).collect();
        fs::write(fx.src.join(format!("t{i}")), text).unwrap();
    }
    fx.remember_backup();
    // Codecs of the blobs stored compressed (a blob that does not compress is stored as it is).
    let codecs = |fx: &Fixture| -> Vec<String> {
        let all = fx.cairn.stored_blobs();
        let set: std::collections::BTreeSet<String> =
            all.iter().filter(|b| b.codec != library::compress::Codec::None).map(|b| b.codec.to_string()).collect();
        set.into_iter().collect()
    };
    assert!(codecs(&fx).iter().all(|c| c.starts_with("zstd")), "{:?}", codecs(&fx));
    let compressed = fx.cairn.stored_blobs().iter().filter(|b| b.codec != library::compress::Codec::None).count();
    assert!(compressed >= 6, "the text files were stored compressed");
    let s = last_json(&fx.cairn.ok(["--json", "recompress", "--to", "lz4"]));
    assert_eq!(s["plan"]["reencode_blobs"].as_u64().unwrap(), compressed as u64, "{s}");
    assert_eq!(codecs(&fx), ["lz4"], "every compressed blob is lz4 now");
    let after: Vec<&String> = s["by_codec_after"].as_object().unwrap().keys().collect();
    assert!(after.iter().all(|c| *c == "lz4" || *c == "none"), "{s}");
    assert!(s["plan"]["by_codec"].as_object().unwrap().keys().any(|c| c.starts_with("zstd")), "{s}");
    assert_checks(&fx.cairn, true);
    fx.all_restore("lz4");
    let again = last_json(&fx.cairn.ok(["--json", "recompress", "--to", "lz4"]));
    assert_eq!(again["plan"]["repack_packs"], 0, "a second recompress has nothing to do: {again}");
    // And back, for one snapshot's blobs only.
    let id = fx.snaps[0].0.clone();
    last_json(&fx.cairn.ok(["--json", "recompress", "--to", "zstd:3", "--snapshot", &id]));
    assert_eq!(codecs(&fx), ["zstd:3"]);
    fx.all_restore("zstd");
}

#[test]
fn bad_prune_options_are_one_line_errors() {
    let fx = Fixture::for_prune();
    for (args, want) in [
        (vec!["prune", "--max-unused", "150%"], "invalid limit"),
        (vec!["prune", "--max-repack-size", "lots"], "size"),
        (vec!["recompress", "--to", "gzip"], "unknown compression"),
    ] {
        let out = fx.cairn.run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}

fn copy_dir(from: &Path, to: &Path) {
    let st = Command::new("cp").arg("-a").arg(from).arg(to).status().unwrap();
    assert!(st.success());
}

/// Writes a shared lock of process `pid` on this host into `repo`.
fn plant_lock(repo: &Path, pid: u32) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let info = serde_json::json!({
        "version": 1, "exclusive": false, "hostname": library::platform::hostname(),
        "username": "tester", "pid": pid, "created": now, "refreshed": now,
    });
    fs::write(repo.join("locks").join(format!("{:032x}", u128::from(pid) * 7919)), info.to_string()).unwrap();
}

/// A deletion manifest that cannot be read only ever withholds a deletion: check notes it,
/// backups and restores ignore it, and the next prune removes it.
#[test]
fn a_damaged_manifest_is_noted_ignored_and_removed() {
    let mut fx = forgotten_half();
    let junk = b"not a sealed file at all".to_vec();
    let name = library::id::DeletionId::hash_of(&junk).to_hex();
    fs::create_dir_all(fx.cairn.repo.join("deletions")).unwrap();
    fs::write(fx.cairn.repo.join("deletions").join(&name), &junk).unwrap();
    let (code, s) = check(&fx.cairn, &[]);
    assert_eq!(code, 0, "{s}");
    let kinds: Vec<&str> = s["findings"].as_array().unwrap().iter().map(|f| f["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["damaged_deletion"], "{s}");
    fs::write(fx.src.join("extra"), b"more").unwrap();
    fx.remember_backup();
    fx.all_restore("junk");
    prune(&fx.cairn, &[]);
    assert!(files_in(&fx.cairn.repo.join("deletions")).is_empty());
    assert_checks(&fx.cairn, true);
    fx.all_restore("junk-pruned");
}
