//! Remote repositories against real servers on loopback: MinIO (S3) and OpenSSH's sshd (SFTP),
//! started by `support::servers`. Round trips, two backups at once, fault injection around the real
//! backend, the metadata cache, locks, and clear errors for wrong locations and credentials.

mod errors;

use crate::support;
use crate::support::servers;

use std::fs;
use std::path::{Path, PathBuf};

use support::{assert_same, restored_path, scan, scan_source, Cairn, Fixture, Scan, Tree};

/// A source tree of a few small and one multi-chunk file, a symlink, a hard link, nested
/// directories with their own modes and times.
fn make_tree(root: &Path, seed: u64) -> Scan {
    let mut t = Tree::new(root, seed);
    t.dir("a/b/c").dir("empty");
    for (i, size) in [0usize, 1, 4095, 65_536, 300_000].into_iter().enumerate() {
        t.random(&format!("a/small-{i}"), size);
    }
    // Several chunks (the tests init with small chunk sizes) so a file spans blobs and packs.
    t.random("a/b/big", 3 << 20)
        .file("a/b/c/deep", b"deep")
        .hard_link("a/b/c/deep", "a/deep-link")
        .symlink("b/big", "a/link-to-big")
        .mode("a/small-1", 0o600)
        .mode("a/b", 0o750)
        .times("a/small-2", (1_600_000_000, 5), (1_500_000_000, 123_456_789));
    t.scan()
}

/// Small chunks and packs, so a few MiB make many objects and ranged reads.
const INIT: [&str; 4] = ["--chunk-sizes", "65536,131072,524288", "--pack-size", "1"];

impl Fixture {
    /// A repository at the remote `location` and a source of [`make_tree`] (not backed up).
    fn at_remote(location: &str) -> Fixture {
        let mut fx = Fixture::remote(location).init(&INIT);
        fx.before = make_tree(&fx.src, 7);
        fx
    }
}

fn round_trip(location: &str) {
    let mut fx = Fixture::at_remote(location);
    fx.cairn.backup(&[&fx.src], &[]);
    fx.restore_exact("latest", "restore");
    // `dump` reads through the same backend.
    let out = fx.cairn.run(["dump", &format!("latest:{}/a/b/big", fx.src.display())]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout, fs::read(fx.src.join("a/b/big")).unwrap());
    // A second backup of the unchanged tree stores no file data again (at most new trees, as
    // the first backup moved access times) and restores the same.
    fx.before = scan_source(&fx.src);
    let second = fx.cairn.backup(&[&fx.src], &[]);
    assert!(second["bytes_added"].as_u64().unwrap() < 64 * 1024, "{second}");
    assert_eq!(fx.cairn.snapshots().len(), 2);
    fx.restore_exact("latest", "restore-2");
}

#[test]
fn s3_round_trip_is_exact() {
    round_trip(&servers::s3_repo("roundtrip"));
}

#[test]
fn sftp_round_trip_is_exact() {
    round_trip(&servers::sftp_repo("roundtrip"));
}

/// Two `cairn backup` processes write into one repository at the same time (sharing one
/// metadata cache); both snapshots restore exactly.
fn concurrent_backups(location: &str) {
    let fx = Fixture::at_remote(location);
    let other = fx.base.join("other");
    let other_before = make_tree(&other, 99);
    std::thread::scope(|s| {
        let a = s.spawn(|| fx.cairn.backup(&[&fx.src], &["--tag", "one"]));
        let b = s.spawn(|| fx.cairn.backup(&[&other], &["--tag", "two"]));
        a.join().expect("first backup");
        b.join().expect("second backup");
    });
    let snaps = fx.cairn.snapshots();
    assert_eq!(snaps.len(), 2, "{snaps:?}");
    for (tag, src, before) in [("one", &fx.src, &fx.before), ("two", &other, &other_before)] {
        let snap = snaps.iter().find(|s| s["tags"][0] == tag).expect("snapshot by tag");
        let id = snap["id"].as_str().unwrap();
        let target = fx.base.join(format!("restore-{tag}"));
        fx.cairn.restore(&id[..12], &target);
        assert_same(before, &scan(&restored_path(&target, src)), true);
    }
    assert!(fx.cairn.run(["unlock"]).stdout.starts_with(b"0 locks removed"), "both backups released their locks");
}

#[test]
fn s3_two_backups_at_once() {
    concurrent_backups(&servers::s3_repo("concurrent"));
}

#[test]
fn sftp_two_backups_at_once() {
    concurrent_backups(&servers::sftp_repo("concurrent"));
}

/// Restores through the fault-injection layer wrapping the real backend. Short and corrupted
/// reads are caught by authentication and read again, so those restores are exact; failed
/// requests either are survived or make the restore fail with a clear error naming the object.
/// Afterwards nothing stored is lost: a restore without faults is exact.
fn faults(location: &str) {
    let fx = Fixture::at_remote(location);
    fx.cairn.backup(&[&fx.src], &[]);
    for (i, spec) in ["latency=20ms", "truncate-every=5", "corrupt-every=4", "truncate-every=7,corrupt-every=3"]
        .into_iter()
        .enumerate()
    {
        let target = fx.base.join(format!("exact-{i}"));
        let out = fx.cairn.clone().with_env("CAIRN_INJECT_FAULTS", spec).run([
            "--no-cache",
            "restore",
            "latest",
            "--target",
            target.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{spec}: {}", String::from_utf8_lossy(&out.stderr));
        assert_same(&fx.before, &scan(&restored_path(&target, &fx.src)), true);
    }
    for every in [3, 7, 19] {
        let spec = format!("fail-every={every}");
        let target = fx.base.join(format!("fail-{every}"));
        let out = fx.cairn.clone().with_env("CAIRN_INJECT_FAULTS", &spec).run([
            "--no-cache",
            "restore",
            "latest",
            "--target",
            target.to_str().unwrap(),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            assert_same(&fx.before, &scan(&restored_path(&target, &fx.src)), true);
            continue;
        }
        assert!(stderr.contains("injected fault: read of "), "{spec}: the error names no object:\n{stderr}");
        for line in stderr.lines().filter(|l| l.starts_with("error:") || l.starts_with("cairn:")) {
            assert!(!line.trim().is_empty());
        }
        // Whatever was restored is exact; what failed is absent, never partial.
        let restored = restored_path(&target, &fx.src);
        if restored.exists() {
            for (rel, m) in scan(&restored) {
                let want = fx.before.get(&rel).unwrap_or_else(|| panic!("{spec}: unexpected {rel:?}"));
                if m.kind == support::Kind::File {
                    assert_eq!(m.size, want.size, "{spec}: {rel:?} restored partially");
                }
            }
        }
    }
    fx.restore_exact("latest", "after-faults");
}

#[test]
fn s3_fault_injection() {
    faults(&servers::s3_repo("faults"));
}

#[test]
fn sftp_fault_injection() {
    faults(&servers::sftp_repo("faults"));
}

/// The metadata cache: after one listing, `snapshots` and `ls` work from the cache even when
/// the repository's copies are damaged (so they were not downloaded again); a damaged cache
/// entry is detected, dropped and fetched again; `--no-cache` reads the repository.
#[test]
fn metadata_cache_is_used_verified_and_repaired() {
    let location = servers::sftp_repo("cache");
    let fx = Fixture::at_remote(&location);
    fx.cairn.backup(&[&fx.src], &[]);
    let listing = fx.cairn.ok(["ls", "latest"]);
    fx.cairn.ok(["snapshots"]);
    let repo_dir = PathBuf::from(location.rsplit_once(':').unwrap().1);
    // The repository's directory, named by its ID (`key-hints/` beside it is not one).
    let cache_dir = fs::read_dir(fx.path("cache"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().is_some_and(|n| n != "key-hints"))
        .expect("a repository cache");
    for kind in ["index", "snapshots", "trees"] {
        let n = fs::read_dir(cache_dir.join(kind)).map(|d| d.count()).unwrap_or(0);
        assert!(n > 0, "nothing cached under {kind}/");
    }
    // Damage every index and snapshot file in the repository itself.
    let damaged = damage_index_and_snapshots(&repo_dir);
    assert_eq!(fx.cairn.ok(["ls", "latest"]), listing, "ls must come from the cache");
    let out = fx.cairn.run(["--no-cache", "ls", "latest"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("is damaged"), "without the cache the damage shows: {stderr}");
    // Each damaged object is skipped with a warning (FORMAT.md §18); with every snapshot
    // damaged, `latest` has none to choose: one error line.
    assert_eq!(stderr.trim().lines().filter(|l| l.starts_with("cairn: ")).count(), 1, "{stderr}");
    assert!(stderr.contains("cairn: the repository has no snapshots"), "{stderr}");
    // Repair the repository; damage the cache instead: the entry is refetched, not trusted.
    for (p, mut bytes) in damaged {
        bytes[40] ^= 0xff;
        fs::write(&p, &bytes).unwrap();
    }
    let mut cached_trees = Vec::new();
    for kind in ["index", "snapshots", "trees"] {
        for e in fs::read_dir(cache_dir.join(kind)).unwrap() {
            let p = e.unwrap().path();
            let mut bytes = fs::read(&p).unwrap();
            let i = bytes.len() / 2;
            bytes[i] ^= 0x01;
            fs::write(&p, &bytes).unwrap();
            if kind == "trees" {
                cached_trees.push((p, bytes));
            }
        }
    }
    assert_eq!(fx.cairn.ok(["ls", "latest"]), listing);
    fx.restore_exact("latest", "restore");
    for (p, bad) in cached_trees {
        assert_ne!(fs::read(&p).unwrap(), bad, "{p:?} was not replaced");
    }
}

/// Flips a byte of every index and snapshot file in the repository at `repo_dir`; returns each
/// file with its damaged bytes.
fn damage_index_and_snapshots(repo_dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut damaged = Vec::new();
    for kind in ["index", "snapshots"] {
        for e in fs::read_dir(repo_dir.join(kind)).unwrap() {
            let p = e.unwrap().path();
            let mut bytes = fs::read(&p).unwrap();
            bytes[40] ^= 0xff;
            fs::write(&p, &bytes).unwrap();
            damaged.push((p, bytes));
        }
    }
    damaged
}

/// What a backup and a prune write goes into the metadata cache as it is written (index files,
/// snapshots, the trees of every pack stored): on the machine that wrote them, `ls` reads none
/// of them over the link. It lists the whole tree with every index and snapshot file in the
/// repository damaged and every pack gone, where `--no-cache` fails on the damage.
#[test]
fn metadata_a_backup_and_a_prune_write_is_cached_as_it_is_written() {
    let location = servers::sftp_repo("write-through");
    let fx = Fixture::at_remote(&location);
    fx.cairn.backup(&[&fx.src], &[]);
    fs::write(fx.src.join("a/b/c/later"), b"later").unwrap();
    fx.cairn.backup(&[&fx.src], &[]);
    // The first snapshot's trees of `a`, `a/b`, `a/b/c` are garbage now: repacking every partly
    // used pack writes the second snapshot's trees again, sealed anew, which the cache must
    // take too (the copies the backups left there no longer authenticate at their new place).
    fx.cairn.ok(["forget", "--keep-last", "1"]);
    let pruned = support::last_json(&fx.cairn.ok(["--json", "prune", "--max-unused", "0"]));
    assert!(pruned["plan"]["repack_packs"].as_u64().unwrap() >= 1, "nothing repacked: {pruned}");
    let listing = fx.cairn.ok(["--no-cache", "ls", "latest"]);
    assert!(listing.contains("later"), "{listing}");

    let repo_dir = PathBuf::from(location.rsplit_once(':').unwrap().1);
    damage_index_and_snapshots(&repo_dir);
    fs::remove_dir_all(repo_dir.join("data")).unwrap();
    fs::create_dir(repo_dir.join("data")).unwrap();
    assert_eq!(fx.cairn.ok(["ls", "latest"]), listing, "ls must come from what was cached as written");
    let out = fx.cairn.run(["--no-cache", "ls", "latest"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("is damaged"), "without the cache the damage shows: {stderr}");
}

/// A backup killed mid-run leaves its lock; the next backup reports it as stale (its process
/// is gone) and proceeds; `cairn unlock` removes it.
#[test]
fn stale_lock_of_a_killed_backup_is_reported_and_removed() {
    let location = servers::s3_repo("locks");
    let fx = Fixture::at_remote(&location);
    // MinIO keeps each object as a directory of its drive: BUCKET/PREFIX/locks/<id>/.
    let prefix = location.rsplit_once(&format!("/{}/", servers::BUCKET)).unwrap().1;
    let locks = servers::servers().dir.join("minio").join(servers::BUCKET).join(prefix).join("locks");
    let mut slow = fx.cairn.command();
    slow.env("CAIRN_INJECT_FAULTS", "latency=200ms")
        .arg("backup")
        .arg(&fx.src)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = slow.spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    // The lock is there once its xl.meta is: MinIO makes the object's directory first, and a
    // client killed before the reply can leave that directory empty.
    let lock_written = || fs::read_dir(&locks).is_ok_and(|d| d.flatten().any(|e| e.path().join("xl.meta").is_file()));
    while !lock_written() {
        assert!(std::time::Instant::now() < deadline, "the backup never took its lock");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(fs::read_dir(&locks).unwrap().count(), 1);

    let out = fx.cairn.run(["backup", fx.src.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("ignoring stale lock locks/") && stderr.contains("no longer runs"), "{stderr}");
    let removed = fx.cairn.ok(["unlock"]);
    assert!(removed.contains("no longer runs") && removed.ends_with("1 locks removed\n"), "{removed}");
    assert_eq!(fs::read_dir(&locks).map_or(0, |d| d.count()), 0);
    fx.restore_exact("latest", "restore");
}

/// Wrong locations and credentials fail with one line naming what failed.
#[test]
fn wrong_locations_and_credentials_fail_with_one_clear_line() {
    let s = servers::servers();
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let cases: Vec<(Cairn, &str)> = vec![
        (servers::cairn(&format!("s3:{}/no-such-bucket/r", s.s3_endpoint), &cache), "no-such-bucket"),
        (
            servers::cairn(&servers::s3_repo("badsecret"), &cache).with_env("AWS_SECRET_ACCESS_KEY", "wrong-secret"),
            "s3:http://127.0.0.1",
        ),
        (servers::cairn(&format!("s3:http://127.0.0.1:{closed}/{}/r", servers::BUCKET), &cache), "127.0.0.1"),
        (servers::cairn(&format!("sftp:{}@127.0.0.1:{closed}:/tmp/r", s.ssh_user), &cache), "sftp:"),
        (servers::cairn("s3:127.0.0.1/bucket", &cache), "bad S3 location"),
    ];
    for (cairn, names) in cases {
        let mut args = vec!["init"];
        args.extend(support::KDF_ARGS);
        let out = cairn.run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{}: init succeeded", cairn.repo.display());
        assert_eq!(stderr.trim_end().lines().count(), 1, "{}: not one line:\n{stderr}", cairn.repo.display());
        assert!(stderr.contains(names), "{}: the error does not name {names:?}: {stderr}", cairn.repo.display());
    }
}

/// Without `--sftp-key`, the key comes from the SSH agent (`SSH_AUTH_SOCK`); with neither, the
/// server refuses and `init` says so in one line.
#[test]
fn sftp_key_from_the_agent() {
    let s = servers::servers();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let mut agent = std::process::Command::new("ssh-agent")
        .arg("-D")
        .arg("-a")
        .arg(&sock)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("ssh-agent (openssh-client)");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !sock.exists() {
        assert!(std::time::Instant::now() < deadline, "ssh-agent did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let cairn = servers::cairn(&servers::sftp_repo("agent"), &dir.path().join("cache"));
    let init = |agent_sock: Option<&Path>| {
        let mut c = cairn.command();
        c.env_remove("CAIRN_SFTP_KEY").env_remove("SSH_AUTH_SOCK").arg("init").args(support::KDF_ARGS);
        if let Some(sock) = agent_sock {
            c.env("SSH_AUTH_SOCK", sock);
        }
        c.output().unwrap()
    };
    let refused = init(None);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "init without any key succeeded");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("sftp:"), "{stderr}");

    let added = std::process::Command::new("ssh-add").arg(&s.ssh_key).env("SSH_AUTH_SOCK", &sock).output().unwrap();
    assert!(added.status.success(), "ssh-add: {}", String::from_utf8_lossy(&added.stderr));
    let ok = init(Some(&sock));
    assert!(ok.status.success(), "init with the agent's key: {}", String::from_utf8_lossy(&ok.stderr));
    agent.kill().unwrap();
    agent.wait().unwrap();
}

/// `init` over a remote location whose config was lost but whose other objects remain refuses,
/// naming them, and writes nothing (issue 16, 4).
fn init_refuses_leftover_objects(location: &str) {
    let fx = Fixture::at_remote(location);
    fx.cairn.backup(&[&fx.src], &[]);
    // The library's own S3 and SFTP clients run in a child process with the servers'
    // credentials (this process's environment is shared with every other test).
    servers::remote_storage(&fx.cairn, "delete", "config");
    let objects = |dir: &str| servers::remote_storage(&fx.cairn, "list", dir).len();
    let before: Vec<usize> = ["keys", "index", "snapshots", "data"].iter().map(|d| objects(d)).collect();
    let mut args = vec!["init"];
    args.extend(support::KDF_ARGS);
    let out = fx.cairn.run(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    for want in ["already holds repository objects", "1 key file", "1 snapshot", "not initializing over them"] {
        assert!(stderr.contains(want), "the error does not say {want:?}: {stderr}");
    }
    assert!(servers::remote_storage(&fx.cairn, "exists", "config").is_empty(), "init wrote a config");
    let after: Vec<usize> = ["keys", "index", "snapshots", "data"].iter().map(|d| objects(d)).collect();
    assert_eq!(before, after, "init wrote objects");
}

#[test]
fn s3_init_refuses_leftover_objects() {
    init_refuses_leftover_objects(&servers::s3_repo("leftover"));
}

#[test]
fn sftp_init_refuses_leftover_objects() {
    init_refuses_leftover_objects(&servers::sftp_repo("leftover"));
}

/// A command pointed at an SFTP directory that does not exist says there is no repository
/// and makes nothing on the server (issue 16, 3).
#[test]
fn sftp_location_without_a_repository_is_left_untouched() {
    let location = servers::sftp_repo("typo");
    let dir = PathBuf::from(location.rsplit_once(':').unwrap().1);
    let fx = Fixture::new();
    let base = &fx.base;
    let cairn = servers::cairn(&location, &base.as_path().join("cache"));
    for args in [&["snapshots"][..], &["ls", "latest"][..]] {
        let out = cairn.run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(10), "{stderr}");
        assert!(stderr.contains("no repository at"), "{stderr}");
        assert!(!dir.exists(), "{args:?} made {} on the server", dir.display());
    }
}
