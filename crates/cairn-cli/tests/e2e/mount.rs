//! `cairn mount` for real: the FUSE file system mounted on a temporary directory (a test that
//! cannot mount fails), browsed and read, compared entry by entry with the source; the layout
//! (`snapshots/`, `latest`, `ids/`, `hosts/`, `tags/`); a multi-MiB file read in order and at
//! random offsets; unmounting on SIGTERM and SIGINT (the mount point usable again, the lock
//! gone); one-line errors for bad input; and one mount of an S3 (MinIO) repository.

use crate::support;
use crate::support::servers;

use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use support::{assert_same, restored_path, scan, wait_within_timeout, Cairn, Fixture, Rng, Scan, Tree};

/// Small chunks and packs: a few MiB make many blobs and packs.
const INIT: [&str; 4] = ["--chunk-sizes", "65536,131072,524288", "--pack-size", "1"];

/// A source tree with every kind of entry a mount shows: small and multi-chunk files, a sparse
/// file, an empty one, symlinks, hard links across directories, extended attributes, a FIFO,
/// directories with their own modes and times.
fn make_tree(root: &Path, seed: u64) -> Scan {
    let mut t = Tree::new(root, seed);
    t.dir("a/b/c").dir("empty");
    for (i, size) in [0usize, 1, 4095, 65_536, 300_000].into_iter().enumerate() {
        t.random(&format!("a/small-{i}"), size);
    }
    t.random("a/b/big", 6 << 20);
    // A sparse file: data, a 3 MiB hole, data.
    let sparse = fs::File::create(t.path("a/sparse")).unwrap();
    sparse.write_all_at(&t.rng.bytes(100_000), 0).unwrap();
    sparse.write_all_at(&t.rng.bytes(50_000), 3 << 20).unwrap();
    drop(sparse);
    t.file("a/b/c/deep", b"deep")
        .hard_link("a/b/c/deep", "a/deep-link")
        .hard_link("a/small-3", "empty-sibling-link")
        .symlink("b/big", "a/link-to-big")
        .symlink("/nowhere/at/all", "dangling")
        .xattr("a/small-2", "user.comment", b"hello mount")
        .xattr("a/b", "user.dir", b"")
        .fifo("fifo", 0o640)
        .mode("a/small-1", 0o600)
        .mode("a/b", 0o750)
        .times("a/small-2", (1_600_000_000, 5), (1_500_000_000, 123_456_789));
    t.scan()
}

/// A running `cairn mount`: unmounted (SIGTERM, then a lazy unmount if it still is) when
/// dropped.
struct Mount {
    child: Option<Child>,
    point: PathBuf,
}

/// Whether `point` is a mount point now (`/proc/mounts`).
fn is_mounted(point: &Path) -> bool {
    let mounts = fs::read_to_string("/proc/mounts").unwrap();
    let point = point.to_str().unwrap();
    mounts.lines().any(|l| l.split(' ').nth(1) == Some(point))
}

impl Mount {
    /// Mounts `cairn`'s repository at `point` with `extra` options; waits until the mount is
    /// there. A mount that does not come up fails the test.
    fn start(cairn: &Cairn, point: &Path, extra: &[&str]) -> Mount {
        fs::create_dir_all(point).unwrap();
        let mut cmd = cairn.command();
        cmd.arg("mount").arg(point).args(extra).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("cannot start cairn mount");
        let start = Instant::now();
        while !is_mounted(point) {
            if let Some(status) = child.try_wait().unwrap() {
                let out = child.wait_with_output().unwrap();
                panic!("cairn mount exited ({status}) without mounting: {}", String::from_utf8_lossy(&out.stderr));
            }
            assert!(start.elapsed() < Duration::from_secs(60), "cairn mount did not mount within 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        Mount { child: Some(child), point: point.to_path_buf() }
    }

    /// Sends `signal` and waits for the process; returns its output.
    fn stop(mut self, signal: i32) -> std::process::Output {
        let child = self.child.take().unwrap();
        // SAFETY: signalling our own child by its PID.
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        wait_within_timeout(child, "cairn mount")
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling our own child by its PID.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
        }
        if is_mounted(&self.point) {
            let _ = std::process::Command::new("fusermount3").arg("-u").arg("-z").arg(&self.point).status();
        }
    }
}

impl Fixture {
    /// `fx` with its repository initialised and a source of [`make_tree`] (not backed up).
    fn for_mount(fx: Fixture) -> Fixture {
        let mut fx = fx.init(&INIT);
        fx.before = make_tree(&fx.src, 11);
        fx
    }

    /// [`Fixture::for_mount`] with a local repository.
    fn local() -> Fixture {
        Fixture::for_mount(Fixture::new())
    }

    /// The mount point.
    fn point(&self) -> PathBuf {
        self.path("mnt")
    }

    /// The short IDs of the snapshots, oldest first.
    fn short_ids(&self) -> Vec<String> {
        self.cairn.snapshots().iter().map(|s| s["short_id"].as_str().unwrap().to_string()).collect()
    }
}

/// Compares the source with its place in one snapshot directory of the mount.
fn assert_snapshot_matches(fx: &Fixture, snapshot_dir: &Path) {
    let mounted = scan(&restored_path(snapshot_dir, &fx.src));
    assert_same(&fx.before, &mounted, true);
}

#[test]
fn mounted_snapshots_match_the_source_in_every_place_of_the_layout() {
    let fx = Fixture::local();
    fx.cairn.backup(&[&fx.src], &[]);
    // The first backup read the symlinks, which moved their access times: put them back.
    support::reset_times(&fx.src, &fx.before);
    fx.cairn.backup(&[&fx.src], &["--tag", "second"]);
    let ids = fx.short_ids();
    let host = fx.cairn.snapshots()[0]["hostname"].as_str().unwrap().to_string();
    let point = fx.point();
    let mount = Mount::start(&fx.cairn, &point, &[]);

    let names = |dir: &Path| -> Vec<String> {
        let mut n: Vec<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        n.sort();
        n
    };
    assert_eq!(names(&point), ["hosts", "ids", "snapshots", "tags"]);
    let mut want_ids = ids.clone();
    want_ids.sort();
    assert_eq!(names(&point.join("ids")), want_ids);
    // snapshots/: one directory per snapshot named by its time, and `latest` pointing at the
    // newest.
    let by_time = names(&point.join("snapshots"));
    assert_eq!(by_time.len(), 3, "{by_time:?}");
    assert!(by_time.contains(&"latest".to_string()));
    let latest = fs::read_link(point.join("snapshots/latest")).unwrap();
    assert!(by_time.contains(&latest.to_str().unwrap().to_string()), "latest -> {latest:?} of {by_time:?}");
    assert!(fs::symlink_metadata(point.join("snapshots/latest")).unwrap().file_type().is_symlink());
    assert_eq!(names(&point.join("hosts")), std::slice::from_ref(&host));
    assert_eq!(names(&point.join("hosts").join(&host)).len(), 3);
    assert_eq!(names(&point.join("tags")), ["second"]);
    let tagged = names(&point.join("tags/second"));
    assert_eq!(tagged.len(), 2, "{tagged:?}"); // the snapshot and `latest`
    let tagged_latest = fs::read_link(point.join("tags/second/latest")).unwrap();
    assert!(tagged.contains(&tagged_latest.to_str().unwrap().to_string()), "{tagged_latest:?} of {tagged:?}");

    // Every place shows the snapshot exactly: content, sizes, modes, owners, times, symlink
    // targets, hard-link groups (one inode), xattrs, holes.
    for dir in [
        point.join("snapshots/latest"),
        point.join("ids").join(&ids[0]),
        point.join("ids").join(&ids[1]),
        point.join("hosts").join(&host).join(&latest),
        point.join("tags/second/latest"),
    ] {
        assert_snapshot_matches(&fx, &dir);
    }
    // Hard links share an inode number; inode numbers stay the same while mounted.
    let snap = restored_path(&point.join("snapshots/latest"), &fx.src);
    let deep = fs::metadata(snap.join("a/b/c/deep")).unwrap();
    assert_eq!(deep.ino(), fs::metadata(snap.join("a/deep-link")).unwrap().ino());
    assert_eq!(deep.nlink(), 2);
    assert_ne!(deep.ino(), fs::metadata(snap.join("a/small-0")).unwrap().ino());
    assert_eq!(deep.ino(), fs::metadata(snap.join("a/b/c/deep")).unwrap().ino());
    // A sparse file reads zeros in its hole and allocates less than its size.
    let sparse = fs::read(snap.join("a/sparse")).unwrap();
    assert!(sparse[100_000..3 << 20].iter().all(|b| *b == 0));
    assert!(fs::metadata(snap.join("a/sparse")).unwrap().blocks() * 512 < 1 << 20);
    // Read-only: nothing can be created or written.
    assert!(fs::write(snap.join("new"), b"x").is_err());
    assert!(fs::OpenOptions::new().write(true).open(snap.join("a/small-4")).is_err());

    let out = mount.stop(libc::SIGTERM);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_large_file_reads_in_order_and_at_random_offsets() {
    let fx = Fixture::new();
    let base = &fx.base;
    let src = base.as_path().join("src");
    fs::create_dir_all(&src).unwrap();
    let mut rng = Rng(5);
    // Incompressible and compressible halves: blobs stored as they are and compressed.
    let mut data = rng.bytes(12 << 20);
    data.extend((0..(12u32 << 20)).map(|i| (i / 4096) as u8));
    fs::write(src.join("large"), &data).unwrap();
    let cairn = fx.cairn.clone();
    cairn.init(&INIT);
    cairn.backup(&[&src], &[]);
    let point = base.as_path().join("mnt");
    // A small budget: the cache holds only part of the file, so read-ahead and eviction both
    // happen.
    let mount = Mount::start(&cairn, &point, &["--max-memory", "32M"]);
    let path = restored_path(&point.join("snapshots/latest"), &src).join("large");

    assert!(fs::read(&path).unwrap() == data, "sequential read differs");
    // At random offsets and lengths, each compared with the source.
    let f = fs::File::open(&path).unwrap();
    for _ in 0..300 {
        let off = (rng.next_u64() % data.len() as u64) as usize;
        let len = 1 + (rng.next_u64() % (3 << 20)) as usize;
        let mut buf = vec![0u8; len];
        let n = f.read_at(&mut buf, off as u64).unwrap();
        let end = (off + len).min(data.len());
        assert_eq!(n.min(end - off), n, "read past the end");
        assert!(buf[..n] == data[off..off + n], "random read at {off}+{n} differs");
    }
    // Reading from the middle to the end after the random reads (read-ahead starts again).
    let mut tail = vec![0u8; data.len() - 5_000_000];
    let mut got = 0;
    while got < tail.len() {
        let n = f.read_at(&mut tail[got..], (5_000_000 + got) as u64).unwrap();
        assert!(n > 0);
        got += n;
    }
    assert!(tail == data[5_000_000..], "read from the middle differs");
    drop(f);
    let out = mount.stop(libc::SIGTERM);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Many small files in nested directories, a large file among them, each file's relative path
/// and bytes in name order (the order a `tar` of the mount reads them).
fn many_small_files(root: &Path, rng: &mut Rng) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    for d in 0..6 {
        for sub in ["", "inner", "inner/deeper"] {
            let dir = PathBuf::from(format!("d{d}")).join(sub);
            fs::create_dir_all(root.join(&dir)).unwrap();
            for f in 0..25 {
                let len = (rng.next_u64() % 30_000) as usize;
                files.push((dir.join(format!("f{f:02}")), rng.bytes(len)));
            }
        }
    }
    files.push((PathBuf::from("d3/large"), rng.bytes(5 << 20)));
    for (path, bytes) in &files {
        fs::write(root.join(path), bytes).unwrap();
    }
    files.sort();
    files
}

#[test]
fn many_small_files_across_directories_read_concurrently_return_the_right_bytes() {
    let fx = Fixture::new();
    let base = &fx.base;
    let src = base.as_path().join("src");
    let files = many_small_files(&src, &mut Rng(23));
    let cairn = fx.cairn.clone();
    cairn.init(&INIT);
    cairn.backup(&[&src], &[]);
    let point = base.as_path().join("mnt");
    // A budget small enough that read-ahead walks evict each other's blobs.
    let mount = Mount::start(&cairn, &point, &["--max-memory", "24M"]);
    let root = restored_path(&point.join("snapshots/latest"), &src);
    // Four readers at once, each in its own order: the walk's order (a `tar`), backwards,
    // every third file, and from the middle on then back to the start.
    let n = files.len();
    let orders: Vec<Vec<usize>> = vec![
        (0..n).collect(),
        (0..n).rev().collect(),
        (0..n).filter(|i| i % 3 == 0).collect(),
        (n / 2..n).chain(0..n / 2).collect(),
    ];
    std::thread::scope(|s| {
        for order in &orders {
            let (root, files) = (&root, &files);
            s.spawn(move || {
                for &i in order {
                    let (path, bytes) = &files[i];
                    let got = fs::read(root.join(path)).unwrap();
                    assert!(got == *bytes, "{} read from the mount differs from the source", path.display());
                }
            });
        }
    });
    // The same for `tar`, which reads through every directory in one go (in name order: the
    // source's own directories list in another).
    let tar = |dir: &Path| {
        let out =
            std::process::Command::new("tar").args(["--sort=name", "-cf", "-", "."]).current_dir(dir).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    };
    // The same names, attributes and bytes in the same order: the same archive.
    let (mounted, source) = (tar(&root), tar(&src));
    assert_eq!(mounted.len(), source.len());
    assert!(mounted == source, "tar of the mounted snapshot differs from tar of the source");
    let out = mount.stop(libc::SIGTERM);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn sigterm_and_sigint_unmount_cleanly_and_drop_the_lock() {
    let fx = Fixture::local();
    fx.cairn.backup(&[&fx.src], &[]);
    let point = fx.point();
    let locks = fx.cairn.repo.join("locks");
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let mount = Mount::start(&fx.cairn, &point, &[]);
        assert_eq!(fs::read_dir(&locks).unwrap().count(), 1, "a shared lock while mounted");
        // A file held open while the signal comes does not keep it mounted.
        let held = fs::File::open(restored_path(&point.join("snapshots/latest"), &fx.src).join("a/b/big")).unwrap();
        let out = mount.stop(signal);
        assert!(out.status.success(), "signal {signal}: {}", String::from_utf8_lossy(&out.stderr));
        drop(held);
        assert!(!is_mounted(&point), "still mounted after signal {signal}");
        // The mount point is an ordinary empty directory again.
        assert_eq!(fs::read_dir(&point).unwrap().count(), 0);
        assert_eq!(fs::read_dir(&locks).unwrap().count(), 0, "the lock is removed on unmount");
    }
}

/// Runs `cairn mount ARGS` that must fail at once; returns its stderr (one line).
fn fails_in_one_line(cairn: &Cairn, args: &[&std::ffi::OsStr]) -> String {
    let out = cairn.run(std::iter::once(std::ffi::OsStr::new("mount")).chain(args.iter().copied()));
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    err
}

#[test]
fn bad_input_gets_a_one_line_error() {
    let fx = Fixture::local();
    fx.cairn.backup(&[&fx.src], &[]);
    let missing = fx.base.join("no-such-dir");
    let err = fails_in_one_line(&fx.cairn, &[missing.as_os_str()]);
    assert!(err.contains("does not exist"), "{err}");
    let file = fx.src.join("a/small-1");
    let err = fails_in_one_line(&fx.cairn, &[file.as_os_str()]);
    assert!(err.contains("not a directory"), "{err}");
    let point = fx.point();
    fs::create_dir_all(&point).unwrap();
    let wrong = Cairn::new(&fx.cairn.repo, "wrong password");
    let err = fails_in_one_line(&wrong, &[point.as_os_str()]);
    assert!(err.to_lowercase().contains("password"), "{err}");
    let err = fails_in_one_line(&fx.cairn, &[point.as_os_str(), "--max-memory".as_ref(), "lots".as_ref()]);
    assert!(err.contains("lots"), "{err}");
    assert!(!is_mounted(&point));
}

#[test]
fn s3_repository_mounts_and_reads_exactly() {
    remote_repository_mounts_and_reads_exactly(&servers::s3_repo("mount"));
}

#[test]
fn sftp_repository_mounts_and_reads_exactly() {
    remote_repository_mounts_and_reads_exactly(&servers::sftp_repo("mount"));
}

#[test]
fn repository_on_a_server_mounts_and_reads_exactly() {
    let server = crate::support::serve::Server::start();
    let token = server.token(&["--repo", "mount", "--role", "append"]);
    let mut fx = Fixture::remote(&format!("cairn+https://{}/mount", server.addr));
    fx.cairn =
        fx.cairn.with_env("CAIRN_SERVER_TOKEN", &token).with_env("CAIRN_SERVER_FINGERPRINT", &server.fingerprint);
    mounts_and_reads_exactly(Fixture::for_mount(fx));
}

fn remote_repository_mounts_and_reads_exactly(location: &str) {
    mounts_and_reads_exactly(Fixture::for_mount(Fixture::remote(location)));
}

fn mounts_and_reads_exactly(fx: Fixture) {
    fx.cairn.backup(&[&fx.src], &[]);
    let point = fx.point();
    let mount = Mount::start(&fx.cairn, &point, &[]);
    assert_snapshot_matches(&fx, &point.join("snapshots/latest"));
    let out = mount.stop(libc::SIGTERM);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
