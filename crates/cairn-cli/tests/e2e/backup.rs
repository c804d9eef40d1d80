//! End-to-end tests of the backup pipeline on real trees: selection options, standard input,
//! fixed-size chunking of a sparse image, the parent snapshot, in-flight dedup, a backup killed
//! with SIGKILL, and two backups into one repository at the same time.

use crate::support;

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::library::pack::BlobKind;
use serde_json::Value;
use support::{
    assert_same, last_json, reset_times, restored_path, scan, scan_source, snapshot_id, Cairn, Fixture, Rng, PASSWORD,
};

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

/// Small chunks and 1 MiB packs, so small trees make many chunks and packs.
const SMALL: [&str; 4] = ["--chunk-sizes", "16384,65536,262144", "--pack-size", "1"];

/// The fixture's repository, initialised with [`SMALL`].
fn new_repo(fx: &Fixture) -> Cairn {
    fx.cairn.init(&SMALL);
    fx.cairn.clone()
}

/// Every path in snapshot `spec` below `under`, relative to it.
fn listed(cairn: &Cairn, spec: &str, under: &Path) -> BTreeSet<PathBuf> {
    let out = cairn.ok(["--json", "ls", spec]);
    out.lines()
        .filter_map(|l| {
            let v: Value = serde_json::from_str(l).expect("ls --json line");
            let p = PathBuf::from(v["path"].as_str().expect("path"));
            p.strip_prefix(under).ok().filter(|r| !r.as_os_str().is_empty()).map(Path::to_path_buf)
        })
        .collect()
}

fn set(paths: &[&str]) -> BTreeSet<PathBuf> {
    paths.iter().map(PathBuf::from).collect()
}

/// Restores `spec` and checks it against `want`, a scan of the source as it was backed up.
fn restore_exact(cairn: &Cairn, spec: &str, src: &Path, want: &support::Scan, target: &Path) {
    cairn.restore_with(spec, target, &["--verify"]);
    assert_same(want, &scan(&restored_path(target, src)), true);
}

#[test]
fn exclusions_files_from_and_dry_run() {
    let fx = Fixture::new();
    let base = &fx.base;
    let src = base.as_path().join("src");
    for d in ["build", "cache", "skip", "deep/er"] {
        fs::create_dir_all(src.join(d)).expect("mkdir");
    }
    for f in ["keep.txt", "a.o", "B.TMP", "build/x", "cache/data", "skip/data", "deep/er/y.txt", "deep/z.log"] {
        fs::write(src.join(f), f).expect("write");
    }
    fs::write(src.join("cache/CACHEDIR.TAG"), "Signature: 8a477f597d28d172789f06886806bc55\n").expect("tag");
    fs::write(src.join("skip/.nobackup"), "").expect("marker");
    // A tag without the signature does not count.
    fs::create_dir(src.join("fake-cache")).expect("mkdir");
    fs::write(src.join("fake-cache/CACHEDIR.TAG"), "no signature").expect("tag");
    let excludes = base.as_path().join("excludes");
    fs::write(&excludes, "# build output\n*/build\n\n*.log\n").expect("write");

    let cairn = new_repo(&fx);
    let ex = excludes.to_str().expect("utf-8");
    let args = [
        "--exclude",
        "*.o",
        "--iexclude",
        "*.tmp",
        "--exclude-file",
        ex,
        "--exclude-caches",
        "--exclude-if-present",
        ".nobackup",
    ];
    // A dry run reports what would be added and stores nothing.
    let packs_before = fs::read_dir(base.as_path().join("repo/data")).map(|d| d.count()).unwrap_or(0);
    let mut dry_args = args.to_vec();
    dry_args.push("--dry-run");
    let dry = cairn.backup(&[&src], &dry_args);
    assert_eq!(dry["snapshot_id"], Value::Null, "{dry}");
    assert_eq!(dry["dry_run"], true, "{dry}");
    assert!(dry["bytes_added"].as_u64().expect("bytes_added") > 0, "{dry}");
    assert!(cairn.snapshots().is_empty(), "a dry run wrote a snapshot");
    assert_eq!(fs::read_dir(base.as_path().join("repo/data")).map(|d| d.count()).unwrap_or(0), packs_before);

    let summary = cairn.backup(&[&src], &args);
    assert_eq!(summary["files_new"], 3, "{summary}");
    let want = set(&["keep.txt", "deep", "deep/er", "deep/er/y.txt", "fake-cache", "fake-cache/CACHEDIR.TAG"]);
    assert_eq!(listed(&cairn, &snapshot_id(&summary), &src), want);

    // --files-from: the listed paths (and only they) are backed up and recorded.
    let list = base.as_path().join("list");
    fs::write(&list, format!("# two paths\n{}\n{}\n", src.join("keep.txt").display(), src.join("deep").display()))
        .expect("write");
    let summary = cairn.backup(&[], &["--files-from", list.to_str().expect("utf-8")]);
    let snaps = cairn.snapshots();
    let last = snaps.iter().find(|s| s["id"] == summary["snapshot_id"]).expect("snapshot listed");
    let recorded: BTreeSet<&str> = last["paths"].as_array().expect("paths").iter().filter_map(Value::as_str).collect();
    let keep = src.join("keep.txt").display().to_string();
    let deep = src.join("deep").display().to_string();
    assert_eq!(recorded, BTreeSet::from([keep.as_str(), deep.as_str()]));
    assert_eq!(
        listed(&cairn, &snapshot_id(&summary), &src),
        set(&["keep.txt", "deep", "deep/er", "deep/er/y.txt", "deep/z.log"])
    );
}

#[test]
fn bad_exclude_pattern_is_one_line_error() {
    let fx = Fixture::new();
    let base = &fx.base;
    let cairn = new_repo(&fx);
    let out = cairn.run(["backup", base.as_path().to_str().expect("utf-8"), "--exclude", "a[b"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("bad exclude pattern \"a[b\""), "{err}");
}

#[test]
fn one_file_system_keeps_mount_points_empty() {
    let _shm = support::shm_shared();
    // /dev/shm is a separate file system (tmpfs) below /dev on Linux.
    let dev = fs::metadata("/dev").expect("/dev").dev();
    assert_ne!(fs::metadata("/dev/shm").expect("/dev/shm").dev(), dev, "this test needs /dev/shm mounted on its own");
    let marker = tempfile::Builder::new().prefix("cairn-x-").tempfile_in("/dev/shm").expect("file in /dev/shm");
    let name = marker.path().file_name().expect("name").to_owned();
    let fx = Fixture::new();
    let cairn = new_repo(&fx);
    let out = cairn.run(["--json", "backup", "/dev", "--one-file-system", "--exclude", "/dev/pts"]);
    assert!(matches!(out.status.code(), Some(0 | 3)), "{out:?}");
    let summary = last_json(&String::from_utf8_lossy(&out.stdout));
    let all = listed(&cairn, &snapshot_id(&summary), Path::new("/dev"));
    assert!(all.contains(Path::new("shm")), "the mount point itself is kept");
    assert!(!all.iter().any(|p| p.starts_with("shm") && p != Path::new("shm")), "nothing below /dev/shm: {all:?}");
    let out = cairn.run(["--json", "backup", "/dev/shm"]);
    assert!(out.status.success(), "{out:?}");
    let summary = last_json(&String::from_utf8_lossy(&out.stdout));
    assert!(listed(&cairn, &snapshot_id(&summary), Path::new("/dev/shm")).contains(Path::new(&name)));
}

#[test]
fn stdin_round_trips() {
    let fx = Fixture::new();
    let base = &fx.base;
    let cairn = new_repo(&fx);
    let mut data = Rng(7).bytes(3 * MIB);
    data.extend(vec![0u8; 2 * MIB]);
    data.extend(Rng(8).bytes(100 * KIB + 17));
    let mut child = cairn
        .command()
        .args(["--json", "backup", "--stdin", "--stdin-filename", "db.sql", "--tag", "dump"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut input = child.stdin.take().expect("stdin");
    let fed = data.clone();
    let feeder = std::thread::spawn(move || input.write_all(&fed));
    let out = child.wait_with_output().expect("wait");
    feeder.join().expect("feeder").expect("write to cairn");
    assert!(out.status.success(), "{out:?}");
    let summary = last_json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(summary["bytes_read"], data.len(), "{summary}");
    assert_eq!(summary["files_new"], 1, "{summary}");

    let dumped = cairn.command().args(["dump", "latest:/db.sql"]).output().expect("dump");
    assert!(dumped.status.success(), "{dumped:?}");
    assert!(dumped.stdout == data, "dumped {} bytes, backed up {}", dumped.stdout.len(), data.len());
    let target = base.as_path().join("restore");
    cairn.restore("latest", &target);
    assert!(fs::read(target.join("db.sql")).expect("restored file") == data);
    assert_eq!(cairn.snapshots()[0]["paths"], serde_json::json!(["/db.sql"]));

    let out = cairn.command().args(["backup", "--stdin", "--stdin-filename", "a/b"]).output().expect("run");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--stdin-filename"), "{out:?}");
}

#[test]
fn fixed_chunked_image_with_holes_round_trips() {
    let fx = Fixture::new();
    let base = &fx.base;
    let img = base.as_path().join("disk.img");
    let f = fs::File::create(&img).expect("create");
    f.set_len(64 * MIB as u64).expect("size"); // all hole
    f.write_all_at(&Rng(1).bytes(MIB), 0).expect("write");
    f.write_all_at(&vec![0u8; 2 * MIB], 20 * MIB as u64).expect("write zeros"); // allocated zeros
    f.write_all_at(&Rng(2).bytes(3 * MIB), 40 * MIB as u64).expect("write");
    f.sync_all().expect("sync");
    drop(f);
    let before = scan_source(base.as_path());

    let cairn = Cairn::new(&base.as_path().join("repo"), PASSWORD);
    cairn.init(&[]);
    reset_times(base.as_path(), &before);
    let summary = cairn.backup(&[&img], &["--chunker", "fixed:1M", "--compression", "none"]);
    // Holes are never read; zero chunks are read but never stored.
    assert_eq!(summary["bytes_read"], 6 * MIB, "{summary}");
    let data: Vec<_> = cairn.stored_blobs().into_iter().filter(|b| b.kind == BlobKind::Data).collect();
    assert_eq!(data.len(), 4, "{data:?}");
    assert!(data.iter().all(|b| b.raw_length as usize == MIB), "{data:?}");

    let target = base.as_path().join("restore");
    cairn.restore_with("latest", &target, &["--verify"]);
    let restored = restored_path(&target, &img);
    assert_eq!(support::content_digest(&restored), before[Path::new("disk.img")].digest.expect("digest"));
    let blocks = fs::metadata(&restored).expect("restored").blocks() * 512;
    assert!(blocks < 8 * MIB as u64, "the restored image is not sparse: {blocks} bytes allocated");
}

#[test]
fn parent_snapshot_reuses_unchanged_files() {
    let fx = Fixture::new();
    let base = &fx.base;
    let src = base.as_path().join("src");
    fs::create_dir_all(src.join("a/b")).expect("mkdir");
    fs::create_dir_all(src.join("quiet")).expect("mkdir");
    let mut rng = Rng(3);
    let sizes = [300 * KIB, 70 * KIB, MIB, 5, 0];
    let names = ["one", "a/two", "a/b/three", "quiet/four", "quiet/empty"];
    for (n, s) in names.iter().zip(sizes) {
        fs::write(src.join(n), rng.bytes(s)).expect("write");
    }
    let total: usize = sizes.iter().sum();
    let cairn = new_repo(&fx);

    let first = cairn.backup(&[&src], &[]);
    assert_eq!(first["parent"], Value::Null, "{first}");
    assert_eq!((first["files_new"].as_u64(), first["bytes_read"].as_u64()), (Some(5), Some(total as u64)));

    let second = cairn.backup(&[&src], &[]);
    assert_eq!(second["parent"], first["snapshot_id"], "{second}");
    assert_eq!(second["files_unmodified"], 5, "{second}");
    assert_eq!(second["bytes_read"], 0, "nothing changed, nothing is read: {second}");

    // Touch one file: only it is read.
    let touched = src.join("a/two");
    let t = filetime::FileTime::from_unix_time(1_600_000_000, 5);
    filetime::set_file_mtime(&touched, t).expect("touch");
    fs::write(src.join("a/new"), b"new file").expect("write");
    let third = cairn.backup(&[&src], &[]);
    assert_eq!(third["parent"], second["snapshot_id"], "{third}");
    assert_eq!(
        (third["files_new"].as_u64(), third["files_changed"].as_u64(), third["files_unmodified"].as_u64()),
        (Some(1), Some(1), Some(4)),
        "{third}"
    );
    assert_eq!(third["bytes_read"], 70 * KIB + 8, "only the touched and the new file are read: {third}");
    assert_eq!(third["bytes_added"].as_u64().map(|n| n < 8 * KIB as u64), Some(true), "{third}");
    // A directory in which nothing changed keeps its tree.
    assert_eq!(
        cairn.subtree_id(&snapshot_id(&second), &src.join("quiet")),
        cairn.subtree_id(&snapshot_id(&third), &src.join("quiet"))
    );
    assert!(third["dirs_unmodified"].as_u64().expect("dirs") >= 1, "{third}");
    assert!(third["dirs_changed"].as_u64().expect("dirs") >= 2, "{third}");

    // --force reads everything; --parent picks the parent.
    let forced = cairn.backup(&[&src], &["--force"]);
    assert_eq!(forced["parent"], Value::Null, "{forced}");
    assert_eq!(forced["bytes_read"], total + 8, "{forced}");
    let given = cairn.backup(&[&src], &["--parent", &snapshot_id(&first)[..12]]);
    assert_eq!(given["parent"], first["snapshot_id"], "{given}");
    assert_eq!(given["files_changed"], 1, "{given}");
    // Other paths: no parent.
    let other = cairn.backup(&[&src.join("a")], &[]);
    assert_eq!(other["parent"], Value::Null, "{other}");

    let before = scan(&src);
    let target = base.as_path().join("restore");
    restore_exact(&cairn, &snapshot_id(&given), &src, &before, &target);
}

#[test]
fn identical_chunks_met_at_once_are_stored_once() {
    let fx = Fixture::new();
    let base = &fx.base;
    let src = base.as_path().join("src");
    fs::create_dir(&src).expect("mkdir");
    let data = Rng(11).bytes(2 * MIB);
    for i in 0..24 {
        fs::write(src.join(format!("copy{i:02}")), &data).expect("write");
    }
    let cairn = new_repo(&fx);
    let summary = cairn.backup(&[&src], &["--read-concurrency", "8", "--threads", "4"]);
    assert_eq!(summary["bytes_read"], 24 * 2 * MIB, "{summary}");
    let stored: u64 =
        cairn.stored_blobs().iter().filter(|b| b.kind == BlobKind::Data).map(|b| u64::from(b.raw_length)).sum();
    assert_eq!(stored, 2 * MIB as u64, "every chunk must be stored exactly once");
}

/// Random files of `size` bytes in `dir`, named by `prefix`.
fn random_files(dir: &Path, prefix: &str, count: usize, size: usize, seed: u64) {
    fs::create_dir_all(dir).expect("mkdir");
    let mut rng = Rng(seed);
    for i in 0..count {
        fs::write(dir.join(format!("{prefix}{i:03}")), rng.bytes(size)).expect("write");
    }
}

fn count_files(dir: &Path) -> usize {
    fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

/// Sums the plaintext bytes of data blobs the repository's index knows.
fn indexed_data_bytes(cairn: &Cairn) -> u64 {
    let (repo, _) = cairn.open();
    repo.load_index().expect("load index");
    let index = repo.index();
    let mut seen = BTreeSet::new();
    cairn
        .stored_blobs()
        .into_iter()
        .filter(|b| b.kind == BlobKind::Data && index.contains(&b.id) && seen.insert(b.id))
        .map(|b| u64::from(b.raw_length))
        .sum()
}

#[test]
fn killed_backup_leaves_a_consistent_repository_and_is_reused() {
    let fx = Fixture::new();
    let base = &fx.base;
    let src = base.as_path().join("src");
    random_files(&src.join("old"), "f", 8, 256 * KIB, 21);
    let cairn = new_repo(&fx);
    let before_first = scan_source(&src);
    let first = cairn.backup(&[&src], &[]);
    let after_first = indexed_data_bytes(&cairn);

    // 48 MiB more, written slowly (every storage request waits), killed once a few index
    // files of it are stored.
    random_files(&src.join("new"), "g", 48, MIB, 22);
    let index_dir = base.as_path().join("repo/index");
    let indexes_before = count_files(&index_dir);
    let mut child = cairn
        .command()
        .args(["backup", src.to_str().expect("utf-8")])
        .env("CAIRN_INJECT_FAULTS", "latency=60ms")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(120);
    while count_files(&index_dir) < indexes_before + 2 {
        assert!(child.try_wait().expect("wait").is_none(), "the backup finished before it could be killed");
        assert!(Instant::now() < deadline, "no index files appeared");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    assert_eq!(cairn.snapshots().len(), 1, "a killed backup must not leave a snapshot");
    // Its lock names a process that no longer runs: `cairn unlock` removes it as stale.
    let out = cairn.command().arg("unlock").output().expect("unlock");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("1 locks removed"), "unlock: {out:?}");

    // Everything indexed is readable, and the earlier snapshot restores exactly.
    let (repo, _) = cairn.open();
    repo.load_index().expect("load index");
    for b in cairn.stored_blobs() {
        if repo.index().contains(&b.id) {
            repo.read_blob(&b.id).unwrap_or_else(|e| panic!("indexed blob {:?} unreadable: {e}", b.id));
        }
    }
    restore_exact(&cairn, &snapshot_id(&first), &src, &before_first, &base.as_path().join("r1"));
    let reused = indexed_data_bytes(&cairn) - after_first;
    assert!(reused >= 8 * MIB as u64, "the killed backup indexed only {reused} bytes");

    // The next backup reuses what the killed one stored and completes.
    let now = scan_source(&src);
    let again = cairn.backup(&[&src], &[]);
    let new_bytes = (48 * MIB) as u64;
    let added = again["bytes_added"].as_u64().expect("bytes_added");
    assert!(
        added <= new_bytes - reused + 64 * KIB as u64,
        "added {added} of {new_bytes}, {reused} were stored: {again}"
    );
    restore_exact(&cairn, &snapshot_id(&again), &src, &now, &base.as_path().join("r2"));
    restore_exact(&cairn, &snapshot_id(&first), &src, &before_first, &base.as_path().join("r3"));
}

#[test]
fn two_backups_into_one_repository_at_once() {
    let fx = Fixture::new();
    let base = &fx.base;
    let (a, b) = (base.as_path().join("a"), base.as_path().join("b"));
    random_files(&a, "a", 12, 700 * KIB, 31);
    random_files(&b, "b", 12, 700 * KIB, 32);
    // Content both trees share: each backup may store it, both must restore it.
    let shared = Rng(33).bytes(3 * MIB);
    fs::write(a.join("shared"), &shared).expect("write");
    fs::write(b.join("shared"), &shared).expect("write");
    let cairn = new_repo(&fx);
    let (scan_a, scan_b) = (scan_source(&a), scan_source(&b));
    let spawn = |dir: &Path| -> std::process::Child {
        cairn
            .command()
            .args(["--json", "backup", dir.to_str().expect("utf-8")])
            .env("CAIRN_INJECT_FAULTS", "latency=10ms")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
    };
    let (ca, cb) = (spawn(&a), spawn(&b));
    let (oa, ob) = (ca.wait_with_output().expect("wait"), cb.wait_with_output().expect("wait"));
    assert!(oa.status.success() && ob.status.success(), "{oa:?}\n{ob:?}");
    let (sa, sb) = (last_json(&String::from_utf8_lossy(&oa.stdout)), last_json(&String::from_utf8_lossy(&ob.stdout)));
    assert_eq!(cairn.snapshots().len(), 2);
    restore_exact(&cairn, &snapshot_id(&sa), &a, &scan_a, &base.as_path().join("ra"));
    restore_exact(&cairn, &snapshot_id(&sb), &b, &scan_b, &base.as_path().join("rb"));
}

#[test]
fn failing_storage_stops_the_pipeline_with_one_error() {
    let fx = Fixture::new();
    let base = &fx.base;
    let src = base.as_path().join("src");
    random_files(&src, "f", 6, MIB, 41);
    let cairn = new_repo(&fx);
    // Packs cannot be stored: `data` is a file.
    let data = base.as_path().join("repo/data");
    let _ = fs::remove_dir_all(&data);
    fs::write(&data, b"not a directory").expect("write");
    let out = cairn.run(["backup", src.to_str().expect("utf-8")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("data/"), "the error must name the pack it could not write: {err}");
    assert!(!err.contains("stopped early"), "the cause must be reported, not its echo: {err}");
    assert!(cairn.snapshots().is_empty(), "no snapshot without its data");
}

#[test]
fn json_progress_reports_totals_from_the_pre_scan() {
    let fx = Fixture::new();
    let base = &fx.base;
    let src = base.as_path().join("src");
    random_files(&src, "f", 8, MIB, 51);
    let cairn = new_repo(&fx);
    // Slow storage keeps the backup running for a few status intervals.
    let out = cairn
        .command()
        .args(["--json", "backup", src.to_str().expect("utf-8")])
        .env("CAIRN_INJECT_FAULTS", "latency=400ms")
        .output()
        .expect("run");
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let status: Vec<&Value> = lines.iter().filter(|v| v["message_type"] == "status").collect();
    assert!(!status.is_empty(), "no status lines: {lines:?}");
    for s in &status {
        if s["scan_finished"] == true {
            assert!(s["files_done"].as_u64() <= s["total_files"].as_u64(), "more done than found: {s}");
        }
        assert!(s["current_files"].is_array() && s["seconds_elapsed"].is_number(), "{s}");
    }
    let last = status.last().expect("a status line");
    assert_eq!(last["scan_finished"], true, "{last}");
    assert_eq!((last["total_files"].as_u64(), last["total_bytes"].as_u64()), (Some(8), Some(8 * MIB as u64)), "{last}");
    assert_eq!(lines.last().expect("summary")["message_type"], "summary");
}

#[test]
fn backups_killed_at_different_moments_never_damage_the_repository() {
    let fx = Fixture::new();
    let base = &fx.base;
    let src = base.as_path().join("src");
    random_files(&src.join("old"), "f", 4, 300 * KIB, 61);
    let cairn = new_repo(&fx);
    let before = scan_source(&src);
    let first = cairn.backup(&[&src], &[]);
    random_files(&src.join("new"), "g", 16, MIB, 62);
    // Early (walking, reading), middle (uploading) and late (indexing) kills.
    for delay_ms in [30u64, 400, 1200] {
        let mut child = cairn
            .command()
            .args(["backup", src.to_str().expect("utf-8")])
            .env("CAIRN_INJECT_FAULTS", "latency=40ms")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
        // A lock the killed backup took is stale now: `cairn unlock` removes it.
        let out = cairn.command().arg("unlock").output().expect("unlock");
        assert!(out.status.success(), "unlock after a kill at {delay_ms} ms: {out:?}");
        // Every indexed blob is readable; every snapshot's blobs are indexed.
        let (repo, _) = cairn.open();
        repo.load_index().expect("load index after a kill");
        for b in cairn.stored_blobs() {
            if repo.index().contains(&b.id) {
                repo.read_blob(&b.id).unwrap_or_else(|e| panic!("after a kill at {delay_ms} ms: {e}"));
            }
        }
        for snap in cairn.snapshots() {
            let target = base.as_path().join(format!("check-{delay_ms}-{}", snap["short_id"].as_str().expect("id")));
            cairn.restore_with(snap["id"].as_str().expect("id"), &target, &["--verify"]);
        }
    }
    restore_exact(&cairn, &snapshot_id(&first), &src, &before, &base.as_path().join("first"));
    let now = scan_source(&src);
    let last = cairn.backup(&[&src], &[]);
    restore_exact(&cairn, &snapshot_id(&last), &src, &now, &base.as_path().join("last"));
}

/// A tree 200 directories deep backs up with only 64 file descriptors allowed: the walker looks
/// entries up relative to their open directory but closes it before descending, so it holds no
/// descriptor per level. The restore is exact.
#[test]
fn a_deep_tree_backs_up_with_few_file_descriptors() {
    let fx = Fixture::new();
    let base = &fx.base;
    let src = base.as_path().join("src");
    let mut dir = src.clone();
    for level in 0..200 {
        dir.push("d");
        fs::create_dir_all(&dir).expect("mkdir");
        if level % 20 == 0 {
            fs::write(dir.join("f"), format!("level {level}\n").repeat(50)).expect("write");
            std::os::unix::fs::symlink("f", dir.join("link")).expect("symlink");
        }
    }
    let want = scan_source(&src);
    let cairn = new_repo(&fx);
    let out = std::process::Command::new("prlimit")
        .arg("--nofile=64")
        .arg(env!("CARGO_BIN_EXE_cairn"))
        .args(["--json", "-r"])
        .arg(base.as_path().join("repo"))
        .arg("backup")
        .arg(&src)
        .env("CAIRN_PASSWORD", PASSWORD)
        .output()
        .expect("run prlimit");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let summary = last_json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(summary["errors"], 0, "{summary}");
    restore_exact(&cairn, "latest", &src, &want, &base.as_path().join("t"));
}

/// The names in the repository's `.tmp/` (none if it does not exist).
fn temporaries(repo: &Path) -> Vec<String> {
    match fs::read_dir(repo.join(".tmp")) {
        Ok(d) => d.map(|e| e.expect("entry").file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    }
}

/// A backup that fails on a full disk removes the temporary objects it was writing, so the
/// disk holds only finished objects and, once there is room, the next small backup succeeds
/// without anyone cleaning up by hand (issue 16, 5).
#[test]
fn a_backup_failing_on_a_full_disk_leaves_no_temporary_objects() {
    let fx = Fixture::new();
    let base = &fx.base;
    let disk = base.as_path().join("disk");
    let mount = support::Tmpfs::mount(&disk, "size=4m");
    let repo = disk.join("repo");
    let cairn = Cairn::new(&repo, PASSWORD);
    cairn.init(&["--pack-size", "1", "--compression", "none"]);
    let big = base.as_path().join("big");
    fs::create_dir(&big).unwrap();
    fs::write(big.join("noise"), Rng(16).bytes(12 * MIB)).unwrap();
    let out = cairn.run([std::ffi::OsStr::new("backup"), big.as_os_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "a backup of 12 MiB into 4 MiB: {stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert_eq!(temporaries(&repo), Vec::<String>::new(), "the failed backup left temporary objects");
    // No space is held by a file unlinked but still open either: what is in use is what the
    // repository's files hold.
    let du = std::process::Command::new("du").args(["-s", "-B1"]).arg(&repo).output().expect("du");
    let held: u64 =
        String::from_utf8_lossy(&du.stdout).split_whitespace().next().and_then(|n| n.parse().ok()).expect("du");
    let used = mount.used();
    assert!(used <= held + 64 * 1024, "{used} bytes in use, {held} in the repository's files");
    // The packs finished before the disk filled are kept (the next backup of the same data reuses
    // them); they may leave a few bytes or a megabyte free, so the disk grows as an admin would
    // make room.
    mount.resize("8m");

    let small = base.as_path().join("small");
    fs::create_dir(&small).unwrap();
    fs::write(small.join("note"), b"a small file after a full disk\n").unwrap();
    let want = scan_source(&small);
    cairn.backup(&[&small], &[]);
    restore_exact(&cairn, "latest", &small, &want, &base.as_path().join("t"));
    assert_eq!(temporaries(&repo), Vec::<String>::new());
}

/// Temporary objects a killed process left behind are removed by a later backup once they are
/// more than an hour old; younger ones may belong to a process still writing and are kept.
#[test]
fn stale_temporary_objects_are_removed_by_a_later_backup() {
    let fx = Fixture::new();
    let base = &fx.base;
    let cairn = new_repo(&fx);
    let repo = base.as_path().join("repo");
    fs::create_dir_all(repo.join(".tmp")).unwrap();
    let old = repo.join(".tmp/0123abcd.killed");
    let young = repo.join(".tmp/4567cdef.writing");
    fs::write(&old, vec![7u8; 100_000]).unwrap();
    fs::write(&young, vec![7u8; 100]).unwrap();
    let two_hours_ago = filetime::FileTime::from_system_time(std::time::SystemTime::now() - Duration::from_secs(7200));
    let fifty_minutes_ago =
        filetime::FileTime::from_system_time(std::time::SystemTime::now() - Duration::from_secs(3000));
    filetime::set_file_mtime(&old, two_hours_ago).unwrap();
    filetime::set_file_mtime(&young, fifty_minutes_ago).unwrap();
    // Reading commands leave them alone.
    cairn.snapshots();
    assert!(old.exists());
    let src = base.as_path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("f"), b"f").unwrap();
    cairn.backup(&[&src], &[]);
    assert!(!old.exists(), "a temporary object two hours old was not removed");
    assert!(young.exists(), "a temporary object 50 minutes old was removed");
}
