//! A restore starts at once (issue #18, part 2): before its first data fetch it waits for at
//! most 5 requests one after another, however deep the snapshot's directories, counted by the
//! fault layer's request trace (a count of round trips, not a timing); and it holds its shared
//! lock until it ends.

use crate::support;
use crate::support::library;

use std::fs;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{assert_same, restored_path, scan, scan_source, Cairn, Fixture};

/// A small tree several directories deep, backed up into a fresh repository.
fn backed_up(fx: &Fixture) -> (Cairn, std::path::PathBuf) {
    let src = fx.src.clone();
    let deep = src.join("a/b/c/d");
    fs::create_dir_all(&deep).unwrap();
    fs::write(src.join("top.txt"), b"top").unwrap();
    fs::write(deep.join("leaf.bin"), vec![7u8; 300_000]).unwrap();
    for i in 0..20 {
        fs::write(src.join("a/b").join(format!("f{i}")), format!("file {i}").repeat(100)).unwrap();
    }
    let cairn = fx.cairn.clone();
    cairn.init(&[]);
    // Two snapshots: `latest` has more than one to choose from. One packer thread: each backup
    // writes its trees into one tree pack, so the walk of `latest` leads through two (its own
    // and the first backup's, which holds the unchanged directories). Each further tree pack
    // met at a deeper level costs one more round trip (docs/DESIGN.md, "Starting at once").
    cairn.backup(&[&src], &["--threads", "1"]);
    fs::write(src.join("later.txt"), b"later").unwrap();
    cairn.backup(&[&src], &["--threads", "1"]);
    (cairn, src)
}

/// The latency the serial-chain tests inject: two requests sent side by side count as one
/// after the other when the second starts after the first ended, so a thread started late on a
/// loaded machine must not outlast a request (at 20 ms it could).
const CHAIN_LATENCY: &str = "latency=100ms";

/// The `round_trips` record `--profile --json` printed.
fn round_trips(stdout: &str) -> Value {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["message_type"] == "round_trips")
        .unwrap_or_else(|| panic!("no round_trips record in:\n{stdout}"))
}

/// The requests waited for one after another that `--profile --json` printed (its
/// `round_trips` record), which must agree with the count printed beside them. Opening and
/// locking wait for two at least, whatever the command: fewer means the trace missed requests.
fn serial_chain(stdout: &str) -> Vec<String> {
    let trips = round_trips(stdout);
    let chain: Vec<String> =
        trips["chain"].as_array().unwrap().iter().map(|c| c.as_str().unwrap().to_string()).collect();
    assert_eq!(trips["serial_before_data"].as_u64().unwrap() as usize, chain.len());
    // Each request of the chain timed, one after another, every one of them paying the 100 ms
    // injected; the first data fetch (when there is one) started after the last.
    let times: Vec<(f64, f64)> = trips["chain_ms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t[0].as_f64().unwrap(), t[1].as_f64().unwrap()))
        .collect();
    assert_eq!(times.len(), chain.len());
    for (i, &(start, end)) in times.iter().enumerate() {
        assert!(end - start >= 99.9, "{} took {} ms at 100 ms per request", chain[i], end - start);
        assert!(i == 0 || times[i - 1].1 <= start, "not one after another: {times:?}");
    }
    if let Some(first) = trips["first_data_ms"].as_f64() {
        assert!(first >= times.last().unwrap().1, "data fetched at {first} ms, before the chain ended: {times:?}");
    }
    assert!(chain.len() >= 2, "the trace counts requests: {chain:?}");
    chain
}

#[test]
fn a_restore_waits_for_at_most_five_round_trips_before_its_first_data_fetch() {
    let fx = Fixture::new();
    let base = &fx.base;
    let (cairn, src) = backed_up(&fx);
    let before = scan_source(&src);
    let slow = cairn.clone().with_env("CAIRN_INJECT_FAULTS", CHAIN_LATENCY);
    for spec in ["latest", &cairn.snapshots()[0]["id"].as_str().unwrap()[..8]] {
        let target = base.as_path().join(format!("target-{spec}"));
        let out =
            slow.ok(["--json", "restore", spec, "--target", target.to_str().unwrap(), "--profile", "--no-local-data"]);
        let chain = serial_chain(&out);
        let n = chain.len();
        // The source lies 5+ directories below the snapshot's root, and a level-by-level walk
        // alone would take one round trip per level.
        assert!(n <= 5, "{n} serial round trips before the first data fetch: {chain:?}");
        assert!(!chain.iter().any(|c| c.starts_with("delete")), "nothing is deleted before data: {chain:?}");
        // The two tree packs are read side by side, not the second after the first's trees
        // led into it.
        let tree_reads = chain.iter().filter(|c| c.starts_with("read range of data/")).count();
        assert!(tree_reads <= 1, "tree packs read one after another: {chain:?}");
        if spec == "latest" {
            assert_same(&before, &scan(&restored_path(&target, &src)), true);
        }
    }
}

/// A structure check reads every key, index and snapshot file, lists the packs and reads their
/// headers and every tree: the files and listings are fetched beside the key's round trips and
/// the lock's, the trees and headers at once, so it waits for a handful of requests one after
/// another however many files and directories there are.
#[test]
fn a_check_waits_for_a_handful_of_round_trips_one_after_another() {
    let fx = Fixture::new();
    let base = &fx.base;
    let (cairn, _src) = backed_up(&fx);
    let slow = cairn.clone().with_env("CAIRN_INJECT_FAULTS", CHAIN_LATENCY);
    for cache in [None, Some(base.as_path().join("cache"))] {
        let mut args = vec!["--json".to_string()];
        match &cache {
            None => args.push("--no-cache".into()),
            Some(dir) => args.extend(["--cache-dir".into(), dir.to_str().unwrap().into()]),
        }
        args.extend(["check".into(), "--profile".into()]);
        let out = slow.ok(&args);
        let chain = serial_chain(&out);
        let n = chain.len();
        // Opening and locking wait for three (the key's two; the lock's write then its listing,
        // after the check that a repository is there), the trees and headers for one more each
        // tree pack the index leads to. One after another, the key, index, snapshot and pack
        // listings and files alone would be eleven.
        assert!(n <= 5, "{n} serial round trips in a structure check: {chain:?}");
        assert!(out.contains("\"errors\":0"), "{out}");
    }
}

#[test]
fn a_restore_holds_its_shared_lock_until_it_ends() {
    let fx = Fixture::new();
    let base = &fx.base;
    let (cairn, _src) = backed_up(&fx);
    let target = base.as_path().join("target");
    // Every pack read hangs 2 s: the restore is still reading long after it opened.
    let child = cairn
        .command()
        .env("CAIRN_INJECT_FAULTS", "stall=data/,stall-for=2s")
        .args(["restore", "latest", "--target"])
        .arg(&target)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let locks = || fs::read_dir(cairn.repo.join("locks")).map(|d| d.count()).unwrap_or(0);
    let started = Instant::now();
    // Its lock appears when it has opened the repository (a loaded machine may take seconds to
    // get there); a second later it is still in its first 2 s read, and holds it.
    while locks() == 0 && started.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(locks(), 1, "a restore still reading holds its lock");
    let out = support::wait_within_timeout(child, "restore");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(locks(), 0, "the lock is removed when the restore ends");
}

/// Once a restore reads nothing more from the repository (its walk is over and its last
/// batch's read workers have ended) it lets its lock go, so the lock's removal runs beside its
/// last writes; a restore that fetches nothing keeps it to the end. Either way no lock is left.
#[test]
fn a_restore_lets_its_lock_go_once_its_reads_are_over() {
    let fx = Fixture::new();
    let base = &fx.base;
    let (cairn, src) = backed_up(&fx);
    let before = scan_source(&src);
    let slow = cairn.clone().with_env("CAIRN_INJECT_FAULTS", "latency=20ms");
    let target = base.as_path().join("target");
    let let_go = |out: &str| {
        let record = out
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["message_type"] == "lock")
            .unwrap_or_else(|| panic!("no lock record in:\n{out}"));
        record["let_go_before_end_seconds"].as_f64()
    };
    let args = ["--json", "restore", "latest", "--target", target.to_str().unwrap(), "--profile", "--no-local-data"];
    let first = slow.ok(args);
    let early = let_go(&first);
    assert!(early.is_some_and(|s| s >= 0.0), "the lock was not let go when the reads ended: {first}");
    assert_same(&before, &scan(&restored_path(&target, &src)), true);
    let locks = || fs::read_dir(cairn.repo.join("locks")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(locks(), 0, "the lock is removed by the time the restore ends");
    // The same again: everything is in place, nothing is fetched, the lock is kept to the end.
    let again = slow.ok(args);
    assert_eq!(let_go(&again), None, "{again}");
    assert_eq!(locks(), 0);
}

/// The restore runs while its lock is being taken (one round trip less before data): when the
/// lock cannot be had, the restore stops and the lock's error is what it says, in one line,
/// with a non-zero exit; nothing is restored beyond what it had verified by then.
#[test]
fn a_restore_that_cannot_have_its_lock_stops_and_says_why() {
    let fx = Fixture::new();
    let base = &fx.base;
    let (cairn, src) = backed_up(&fx);
    let before = scan_source(&src);
    // An exclusive lock (a repair's) of a live process on this host: this test's own.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let info = serde_json::json!({
        "version": 1, "exclusive": true, "hostname": library::platform::hostname(),
        "username": "tester", "pid": std::process::id(), "created": now, "refreshed": now,
    });
    let planted = cairn.repo.join("locks").join(format!("{:032x}", 0xfeed_u64));
    fs::create_dir_all(planted.parent().unwrap()).unwrap();
    fs::write(&planted, info.to_string()).unwrap();
    let target = base.as_path().join("target");
    for latency in ["0ms", "50ms"] {
        let out = cairn
            .command()
            .env("CAIRN_INJECT_FAULTS", format!("latency={latency}"))
            .args(["restore", "latest", "--no-local-data", "--target"])
            .arg(&target)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(11), "{err}");
        assert!(err.contains("is locked") && err.contains("exclusive"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        // Our own lock was taken back; the planted one is all there is.
        let left: Vec<_> = fs::read_dir(cairn.repo.join("locks")).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(left, std::slice::from_ref(&planted));
    }
    // Once the lock is gone the same restore completes the target, whatever it held.
    fs::remove_file(&planted).unwrap();
    cairn.ok(["restore", "latest", "--no-local-data", "--target", target.to_str().unwrap()]);
    assert_same(&before, &scan(&restored_path(&target, &src)), true);
}

/// A reader that opens beside its lock lists `deletions/` before its lock is written; a
/// prune's manifest stored in between would be seen by neither side (the prune would not wait
/// for the reader, nor the reader avoid the prune's doomed packs). The lock lists `deletions/`
/// again once written: such a manifest stops the command, in one line, before it trusts what
/// it read.
#[test]
fn a_manifest_stored_while_a_reader_takes_its_lock_is_seen() {
    let fx = Fixture::new();
    let base = &fx.base;
    let (cairn, _src) = backed_up(&fx);
    let deletions = cairn.repo.join("deletions");
    fs::create_dir_all(&deletions).unwrap();
    let target = base.as_path().join("target");
    for (i, args) in [vec!["check"], vec!["restore", "latest", "--no-local-data", "--target", target.to_str().unwrap()]]
        .into_iter()
        .enumerate()
    {
        // The lock's write hangs 6 s; the open's listing of `deletions/` is long done when the
        // manifest appears 2.5 s in (a loaded machine may take a second or more to get there).
        let child = cairn
            .command()
            .env("CAIRN_INJECT_FAULTS", "stall-write=locks/,stall-for=6s")
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(2500));
        let name = format!("{:064x}", 0xd0_u64 + i as u64);
        fs::write(deletions.join(&name), b"a manifest stored meanwhile").unwrap();
        let out = support::wait_within_timeout(child, args[0]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(&format!("a prune stored deletions/{name}")) && err.contains("run it again"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        fs::remove_file(deletions.join(&name)).unwrap();
        assert_eq!(fs::read_dir(cairn.repo.join("locks")).unwrap().count(), 0, "the lock was let go");
    }
}

#[test]
fn over_a_slow_link_the_fetch_concurrency_rises_unless_it_was_given() {
    let fx = Fixture::new();
    let base = &fx.base;
    let src = base.as_path().join("src");
    fs::create_dir_all(&src).unwrap();
    // 24 MiB that does not compress, in 1 MiB packs: two dozen ranged reads or more.
    let mut rng = support::Rng(7);
    for i in 0..12 {
        fs::write(src.join(format!("f{i}")), rng.bytes(2 << 20)).unwrap();
    }
    let cairn = fx.cairn.clone();
    cairn.init(&["--pack-size", "1"]);
    cairn.backup(&[&src], &[]);
    let slow = cairn.with_env("CAIRN_INJECT_FAULTS", "latency=100ms");
    let target = base.as_path().join("auto");
    let summary = slow.restore_with("latest", &target, &["--max-memory", "64M", "--no-local-data"]);
    let steps = summary["fetch_tuning"].as_array().unwrap();
    let limits: Vec<u64> = steps.iter().map(|s| s["limit"].as_u64().unwrap()).collect();
    // Above the local default (4): the open measured 100 ms per request, and more in flight
    // fetch more (from the start, since the round trip is known before the first fetch).
    assert!(limits.iter().any(|&l| l > 4), "the concurrency rose: {steps:?}");
    assert!(steps[0]["reason"].as_str().unwrap().contains("round trip"), "{steps:?}");
    // Never more than the budget holds: 64 MiB over reads reserving about 2 MiB each.
    assert!(limits.iter().all(|&l| l <= 32), "within the budget: {steps:?}");
    assert_same(&scan_source(&src), &scan(&restored_path(&target, &src)), true);
    // An explicit --fetch-concurrency is kept as given.
    let fixed =
        slow.restore_with("latest", &base.as_path().join("fixed"), &["--fetch-concurrency", "4", "--no-local-data"]);
    assert_eq!(fixed["fetch_tuning"].as_array().unwrap().len(), 0, "{fixed}");
}

/// The decode/write split, tuned (issue #18, part 3): where every write into the target waits
/// (the fault layer's `CAIRN_INJECT_WRITE_LATENCY`, as on a network file system) and the cores
/// idle, the restore puts more writers to work than it started with; an explicit
/// `--write-threads` is kept as given, and all of those writers get work, though the files
/// come in a few large reads. Both restores are exact.
#[test]
fn writes_that_wait_get_more_writers_and_an_explicit_count_is_kept() {
    let fx = Fixture::new();
    let base = &fx.base;
    let src = base.as_path().join("src");
    fs::create_dir_all(&src).unwrap();
    // 96 files of 256 KiB that do not compress: 96 writes or more, 30 ms each.
    let mut rng = support::Rng(11);
    for i in 0..96 {
        fs::write(src.join(format!("f{i:02}")), rng.bytes(256 << 10)).unwrap();
    }
    let cairn = fx.cairn.clone();
    cairn.init(&[]);
    cairn.backup(&[&src], &[]);
    let slow = cairn.clone().with_env("CAIRN_INJECT_WRITE_LATENCY", "30ms");
    let target = base.as_path().join("auto");
    let summary = slow.restore_with("latest", &target, &["--no-local-data"]);
    let steps = summary["write_tuning"].as_array().unwrap();
    let limits: Vec<u64> = steps.iter().map(|s| s["limit"].as_u64().unwrap()).collect();
    // Started at the cores (at least 2); one sample of writers busy and cores idle doubles it.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    assert!(limits.first().is_some_and(|&l| l >= 2 * cores.max(2)), "the writers doubled: {steps:?}");
    assert!(steps[0]["reason"].as_str().unwrap().contains("writes wait"), "{steps:?}");
    assert!(limits.iter().all(|&l| l <= 4 * cores.max(4)), "within the most writers started: {steps:?}");
    assert_same(&scan_source(&src), &scan(&restored_path(&target, &src)), true);
    // An explicit --write-threads is kept as given.
    let fixed = base.as_path().join("fixed");
    let summary = slow.restore_with("latest", &fixed, &["--write-threads", "4", "--no-local-data", "--profile"]);
    assert_eq!(summary["write_tuning"].as_array().unwrap().len(), 0, "{summary}");
    // The 96 files come in three reads of 8 MiB, and the writers share each read's files: the
    // writes waited for were spread over more than two writers at a time (a read handed whole
    // to the writer of its first file kept 1.5 at work on average, however many there were).
    let seconds = |list: &str, key: &str, name: &str, field: &str| {
        let rows = summary[list].as_array().unwrap();
        rows.iter().find(|r| r[key] == name).and_then(|r| r[field].as_f64()).unwrap()
    };
    let at_once = seconds("profile", "stage", "write", "busy_s") / seconds("phases", "phase", "pipeline", "seconds");
    assert!(at_once > 2.0, "writers at work on average: {at_once:.2} of 4; {summary}");
    assert_same(&scan_source(&src), &scan(&restored_path(&fixed, &src)), true);
    // A bad duration is refused in one line, before anything is written.
    let bad_target = base.as_path().join("bad");
    let out = cairn.with_env("CAIRN_INJECT_WRITE_LATENCY", "-5s").run([
        "restore",
        "latest",
        "--target",
        bad_target.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("CAIRN_INJECT_WRITE_LATENCY"), "{stderr}");
    assert!(!bad_target.exists());
}

/// The start hint (FORMAT.md §14), written by each backup, carries the key file and names the
/// tree packs: a cold restore derives the key from the hint's copy and reads those packs beside
/// the index files. With the index files and the tree pack each held back for a second, the
/// first data fetch starts after one second with the hint, after two without it (the tree
/// pack's read then waits for the index, which says where the trees are).
#[test]
fn the_start_hint_reads_the_tree_packs_beside_the_index_files() {
    let fx = Fixture::new();
    let base = &fx.base;
    let src = base.as_path().join("src");
    fs::create_dir_all(src.join("a/b")).unwrap();
    fs::write(src.join("a/b/file"), vec![3u8; 200_000]).unwrap();
    let cairn = fx.cairn.clone();
    cairn.init(&[]);
    cairn.backup(&[&src], &["--threads", "1"]);
    let before = scan_source(&src);
    let hint = cairn.repo.join("hint");
    assert!(hint.exists(), "a backup writes the start hint");
    // The hint names the packs the index says hold trees, each to where its last blob ends.
    let (repo, _) = cairn.open();
    repo.load_index().unwrap();
    let hinted: Vec<_> = repo.hint().expect("a sound hint").tree_packs.clone();
    let ends = repo.index().pack_ends();
    let indexed: Vec<_> =
        repo.index().tree_packs().into_iter().map(|(no, pack, _)| (pack, ends[no as usize])).collect();
    assert_eq!(hinted.iter().map(|p| (p.pack, p.length)).collect::<Vec<_>>(), indexed);
    assert_eq!(hinted.len(), 1, "one backup on one thread writes one tree pack");
    let tree_pack = hinted[0].pack.to_hex();

    let faults = format!("latency=5ms,stall-read=index/,stall={tree_pack},stall-for=1s");
    let slow = cairn.clone().with_env("CAIRN_INJECT_FAULTS", &faults);
    let first_data_ms = |name: &str| {
        let target = base.as_path().join(name);
        let out = slow.ok([
            "--json",
            "restore",
            "latest",
            "--target",
            target.to_str().unwrap(),
            "--profile",
            "--no-local-data",
        ]);
        assert_same(&before, &scan(&restored_path(&target, &src)), true);
        round_trips(&out)["first_data_ms"].as_f64().unwrap()
    };
    let with = first_data_ms("with-hint");
    assert!((1000.0..1900.0).contains(&with), "with the hint the first data fetch started at {with} ms");
    fs::remove_file(&hint).unwrap();
    let without = first_data_ms("without-hint");
    assert!(without >= 2000.0, "without the hint the first data fetch started at {without} ms");
}

/// A hint that is stale (older tree packs, packs a prune deleted) or damaged costs the round
/// trip it would have saved, never the restore: each restore below is exact, and `check` names
/// a damaged hint in a notice.
#[test]
fn a_stale_or_damaged_start_hint_costs_time_never_the_restore() {
    let fx = Fixture::new();
    let base = &fx.base;
    let (cairn, src) = backed_up(&fx);
    let hint = cairn.repo.join("hint");
    let old = fs::read(&hint).unwrap();
    fs::create_dir_all(src.join("new/deeper")).unwrap();
    fs::write(src.join("new/deeper/file"), b"new after the hint").unwrap();
    cairn.backup(&[&src], &["--threads", "1"]);
    let before = scan_source(&src);
    let exact = |name: &str| {
        let target = base.as_path().join(name);
        // A damaged hint is warned of (once, naming it); the restore is whole all the same.
        let out = cairn.run(["--json", "restore", "latest", "--target", target.to_str().unwrap(), "--no-local-data"]);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{name}: {err}");
        assert!(err.lines().all(|l| l.starts_with("warning: hint ")), "{name}: {err}");
        assert_same(&before, &scan(&restored_path(&target, &src)), true);
    };
    // Older than the snapshot: its tree packs do not hold the new trees.
    assert_ne!(fs::read(&hint).unwrap(), old);
    fs::write(&hint, &old).unwrap();
    exact("stale");

    // Naming packs a prune deleted.
    for args in [&["forget", "--keep-last", "1"][..], &["prune", "--max-unused", "0%"]] {
        let out = cairn.run(args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    fs::write(&hint, &old).unwrap();
    exact("pruned");

    // Damaged in its sealed body: ignored; `check` names it in a notice (exit 0).
    let mut bad = old.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    fs::write(&hint, &bad).unwrap();
    exact("damaged");
    let out = cairn.run(["check"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let said: Vec<&str> = stdout.lines().filter(|l| l.contains("hint")).collect();
    assert_eq!(said.len(), 1, "{stdout}");
    assert!(said[0].contains("authentication failed") && said[0].contains("next backup rewrites it"), "{stdout}");

    // Not a hint at all, and gone: as if none were ever written.
    fs::write(&hint, b"not a hint").unwrap();
    exact("garbage");
    fs::remove_file(&hint).unwrap();
    exact("none");
}
