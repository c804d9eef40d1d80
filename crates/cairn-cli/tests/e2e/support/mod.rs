//! What every end-to-end test shares: the one [`Fixture`] (a test's directory, its source, its
//! repository and the `cairn` binary that works on it), [`Cairn`] (running the binary against one
//! repository), scanning a file tree into comparable metadata and comparing two scans. The tree
//! builder is in [`tree`], the private MinIO and sshd in [`servers`].
//!
//! The library paths the tests use (`cairn_core::…`) are gathered in [`library`].
//!
//! Scans read each entry's metadata *before* anything that could change its access time
//! (listing a directory, reading a symlink), and read file contents with `O_NOATIME`, so a scan
//! records the tree as it was. Listing a directory or reading a symlink still updates its atime
//! on a `relatime` mount; [`reset_times`] puts the recorded times back before a backup.

#![allow(dead_code)]

pub mod library;
pub mod serve;
pub mod servers;
pub mod tree;

pub use tree::{Rng, Tree};

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use crate::support::library::compress::Codec;
use crate::support::library::crypto::MasterKey;
use crate::support::library::id::BlobId;
use crate::support::library::pack::{read_header, BlobKind};
use crate::support::library::repository::Repository;
use crate::support::library::storage::{OpendalStorage, Storage};
use filetime::FileTime;
use serde_json::Value;

/// Cheap Argon2id settings for every `init` in the tests.
pub const KDF_ARGS: [&str; 4] = ["--kdf-memory", "1024", "--kdf-iterations", "1"];

/// Longest any one command may run.
pub const COMMAND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// The password of the repositories the round-trip tests make.
pub const PASSWORD: &str = "round trip password";

/// Runs the `cairn` binary against one repository.
#[derive(Clone)]
pub struct Cairn {
    /// The repository directory.
    pub repo: PathBuf,
    /// Passed in `CAIRN_PASSWORD`.
    pub password: String,
    /// More environment for every command (remote credentials, fault injection).
    pub env: Vec<(String, String)>,
}

impl Cairn {
    /// A runner for `repo` with `password`.
    pub fn new(repo: &Path, password: &str) -> Self {
        Cairn { repo: repo.to_path_buf(), password: password.to_string(), env: Vec::new() }
    }

    /// The same runner with `name=value` added to every command's environment.
    pub fn with_env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_string(), value.to_string()));
        self
    }

    /// `cairn -r REPO` with a clean environment: only `CAIRN_PASSWORD` and [`Cairn::env`] are set.
    pub fn command(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_cairn"));
        for var in ["CAIRN_REPOSITORY", "CAIRN_PASSWORD_FILE", "CAIRN_NEW_PASSWORD", "CAIRN_NEW_PASSWORD_FILE"] {
            c.env_remove(var);
        }
        c.env("CAIRN_PASSWORD", &self.password).envs(self.env.iter().map(|(k, v)| (k, v))).arg("-r").arg(&self.repo);
        c
    }

    /// Runs `cairn -r REPO ARGS...`; kills it and panics if it runs longer than
    /// [`COMMAND_TIMEOUT`] (a hung pipeline must fail the test, not stall the suite).
    pub fn run<I, S>(&self, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.run_env(&[], args)
    }

    /// [`Cairn::run`] with extra environment variables (such as `CAIRN_INJECT_FAULTS`).
    pub fn run_env<I, S>(&self, env: &[(&str, &str)], args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = self.command();
        c.envs(env.iter().copied()).args(args);
        output_within_timeout(&mut c)
    }

    /// Runs a command that must succeed without writing to stderr; returns stdout.
    pub fn ok<I, S>(&self, args: I) -> String
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<std::ffi::OsString> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        let out = self.run(&args);
        let shown = format!(
            "cairn -r {} {:?}\nstatus: {}\nstdout:\n{}\nstderr:\n{}",
            self.repo.display(),
            args,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "command failed: {shown}");
        assert!(out.stderr.is_empty(), "command wrote to stderr (warnings?): {shown}");
        String::from_utf8(out.stdout).expect("stdout is UTF-8")
    }

    /// The same runner with `other`'s environment added (a remote source's credentials).
    pub fn with_envs(mut self, other: &Cairn) -> Self {
        self.env.extend(other.env.iter().cloned());
        self
    }

    /// The same runner with `password` instead.
    pub fn with_password(&self, password: &str) -> Cairn {
        let mut c = self.clone();
        c.password = password.to_string();
        c
    }

    /// Starts `cairn -r REPO ARGS...` with `env` added, stdout and stderr piped; finish it with
    /// [`wait_within_timeout`].
    pub fn spawn(&self, env: &[(&str, &str)], args: &[&str]) -> std::process::Child {
        let mut c = self.command();
        c.envs(env.iter().copied())
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c.spawn().expect("running the cairn binary")
    }

    /// `init` with cheap KDF settings plus `extra`.
    pub fn init(&self, extra: &[&str]) {
        let mut args = vec!["init"];
        args.extend(KDF_ARGS);
        args.extend(extra);
        self.ok(args);
    }

    /// `--json backup PATHS... EXTRA...`; returns the summary.
    pub fn backup(&self, paths: &[&Path], extra: &[&str]) -> Value {
        let mut args: Vec<&OsStr> = vec![OsStr::new("--json"), OsStr::new("backup")];
        args.extend(paths.iter().map(|p| p.as_os_str()));
        args.extend(extra.iter().map(OsStr::new));
        let summary = last_json(&self.ok(args));
        assert_eq!(summary["message_type"], "summary", "{summary}");
        assert_eq!(summary["errors"], 0, "{summary}");
        summary
    }

    /// `--json restore SPEC --target TARGET`; checks that nothing failed; returns the summary.
    pub fn restore(&self, spec: &str, target: &Path) -> Value {
        self.restore_with(spec, target, &[])
    }

    /// [`Cairn::restore`] with extra options.
    pub fn restore_with(&self, spec: &str, target: &Path, extra: &[&str]) -> Value {
        let mut args: Vec<&OsStr> = vec![
            OsStr::new("--json"),
            OsStr::new("restore"),
            OsStr::new(spec),
            OsStr::new("--target"),
            target.as_os_str(),
        ];
        args.extend(extra.iter().map(OsStr::new));
        let summary = last_json(&self.ok(args));
        assert_eq!(summary["message_type"], "summary", "{summary}");
        assert_eq!(summary["failed"], 0, "{summary}");
        assert_eq!(summary["warnings"], 0, "{summary}");
        summary
    }

    /// `--json snapshots`.
    pub fn snapshots(&self) -> Vec<Value> {
        match last_json(&self.ok(["--json", "snapshots"])) {
            Value::Array(a) => a,
            other => panic!("snapshots --json printed {other}"),
        }
    }

    /// Opens the repository with the library.
    pub fn open(&self) -> (Repository, Arc<dyn Storage>) {
        let storage: Arc<dyn Storage> =
            Arc::new(OpendalStorage::local(self.repo.to_str().expect("UTF-8 repository path")).expect("open storage"));
        let repo = Repository::open(storage.clone(), self.password.as_bytes()).expect("open repository");
        (repo, storage)
    }

    /// The tree blob of directory `path` (absolute) in snapshot `snapshot`.
    pub fn subtree_id(&self, snapshot: &str, path: &Path) -> BlobId {
        let (repo, _) = self.open();
        repo.load_index().expect("load index");
        let (_, snap) = repo.find_snapshot(snapshot).expect("find snapshot");
        let mut id = snap.tree;
        for part in path.strip_prefix("/").expect("absolute").iter() {
            let tree = repo.read_tree(&id).expect("read tree");
            let node = tree
                .nodes
                .into_iter()
                .find(|n| n.name == part.as_bytes())
                .unwrap_or_else(|| panic!("{} not in snapshot {snapshot}", path.display()));
            id = node.subtree.expect("a directory");
        }
        id
    }

    /// Every blob of every pack, read from the pack headers (not the index).
    pub fn stored_blobs(&self) -> Vec<StoredBlob> {
        let (repo, storage) = self.open();
        let mut out = Vec::new();
        for obj in storage.list("data").expect("list packs") {
            let bytes = storage.read(&obj.path).expect("read pack");
            let (_, entries) = read_header(repo.key(), &obj.path, &bytes).expect("pack header");
            out.extend(entries.into_iter().map(|e| StoredBlob {
                pack: obj.path.clone(),
                id: e.id,
                kind: e.kind,
                codec: e.codec,
                raw_length: e.raw_length,
                length: e.length,
            }));
        }
        out
    }
}

/// One test's world, the same for every test: a temporary directory (`base`, removed when the
/// fixture drops), a source directory in it (`src`, made by whoever fills it), a repository and
/// the `cairn` binary that works on it (`cairn`: `base/repo`, or a remote location), the source
/// as it was backed up (`before`) and the snapshot that backup made (`snapshot`).
///
/// Make one with [`Fixture::new`] (or [`Fixture::in_memory`], [`Fixture::remote`]), give it a
/// repository with [`Fixture::init`], a source with [`Tree`] or [`Fixture::scan_source`], and a
/// snapshot with [`Fixture::backup`]. What only one area needs lives in an `impl Fixture`
/// block of that area's module.
pub struct Fixture {
    _dir: tempfile::TempDir,
    /// Held by a fixture in `/dev/shm` (dropped after the directory is removed).
    _shm: Option<std::sync::RwLockReadGuard<'static, ()>>,
    /// The test's directory, canonical (snapshots record canonical absolute paths).
    pub base: PathBuf,
    /// The source directory, `base/src`.
    pub src: PathBuf,
    /// The repository and the binary that works on it.
    pub cairn: Cairn,
    /// The source as last scanned ([`Fixture::scan_source`]): what restores are compared with.
    pub before: Scan,
    /// The full ID of the snapshot the last [`Fixture::backup`] made (empty before one).
    pub snapshot: String,
    /// Snapshots a test remembers, each with the scan of what it backed up.
    pub snaps: Vec<(String, Scan)>,
}

impl Fixture {
    /// A fresh directory with a local repository location `base/repo` (not initialised) and
    /// [`PASSWORD`].
    pub fn new() -> Fixture {
        Fixture::in_dir(tempfile::tempdir().expect("tempdir"))
    }

    /// [`Fixture::new`] in memory ([`memory_tempdir`]), for trees of hundreds of thousands of
    /// files.
    pub fn in_memory() -> Fixture {
        let shm = shm_shared();
        let mut fx = Fixture::in_dir(memory_tempdir());
        fx._shm = Some(shm);
        fx
    }

    /// A fresh directory with a repository at the remote `location` (the servers' credentials
    /// and a private cache, `base/cache`), not initialised.
    pub fn remote(location: &str) -> Fixture {
        let mut fx = Fixture::new();
        fx.cairn = servers::cairn(location, &fx.base.join("cache"));
        fx
    }

    fn in_dir(dir: tempfile::TempDir) -> Fixture {
        let base = dir.path().canonicalize().expect("canonical tempdir");
        let src = base.join("src");
        let cairn = Cairn::new(&base.join("repo"), PASSWORD);
        Fixture {
            _dir: dir,
            _shm: None,
            base,
            src,
            cairn,
            before: Scan::new(),
            snapshot: String::new(),
            snaps: Vec::new(),
        }
    }

    /// The same fixture whose commands use `password`.
    pub fn with_password(mut self, password: &str) -> Fixture {
        self.cairn.password = password.to_string();
        self
    }

    /// The same fixture whose commands keep their default cache (`XDG_CACHE_HOME`, where
    /// `check` keeps its record of packs read, also for a local repository) in `base`, not in
    /// the user's home.
    pub fn isolated_cache(mut self) -> Fixture {
        self.cairn = isolated(self.cairn, &self.base);
        self
    }

    /// Initialises the repository (cheap KDF settings plus `extra`).
    pub fn init(self, extra: &[&str]) -> Fixture {
        self.cairn.init(extra);
        self
    }

    /// The path `name` in the test's directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.base.join(name)
    }

    /// The local repository's directory.
    pub fn repo(&self) -> &Path {
        &self.cairn.repo
    }

    /// A runner for another repository, `base/NAME`, with [`PASSWORD`] (not initialised).
    pub fn other_repo(&self, name: &str) -> Cairn {
        Cairn::new(&self.path(name), PASSWORD)
    }

    /// A repository file (`data/xx/…`, `index/…`) of the local repository.
    pub fn repo_file(&self, rel: &str) -> PathBuf {
        self.repo().join(rel)
    }

    /// The repository's ID (the name of its directory in the cache).
    pub fn repo_id(&self) -> String {
        self.cairn.open().0.config().id.clone()
    }

    /// The absolute path `rel` below the source directory, as snapshots name it.
    pub fn snap_path(&self, rel: &str) -> String {
        self.src.join(rel).to_str().expect("UTF-8 path").to_string()
    }

    /// A fresh [`Fixture::new`] whose source `make` fills, scanned into `before`, with a
    /// repository initialised with `init` options and the source backed up with `backup`
    /// options.
    pub fn backed_up(make: impl FnOnce(&Path), init: &[&str], backup: &[&str]) -> Fixture {
        Fixture::new().with_backup_of(make, init, backup)
    }

    /// This fixture with its source made by `make` and scanned into `before`, its repository
    /// initialised with `init` options and the source backed up with `backup` options.
    pub fn with_backup_of(mut self, make: impl FnOnce(&Path), init: &[&str], backup: &[&str]) -> Fixture {
        fs::create_dir_all(&self.src).expect("mkdir src");
        make(&self.src);
        self.scan_source();
        self.cairn.init(init);
        self.backup(backup);
        self
    }

    /// Scans the source ([`scan_source`]) into `before`.
    pub fn scan_source(&mut self) -> &Scan {
        self.before = scan_source(&self.src);
        &self.before
    }

    /// `--json backup SRC EXTRA...`; keeps the snapshot's ID in `snapshot`; returns the summary.
    pub fn backup(&mut self, extra: &[&str]) -> Value {
        let summary = self.cairn.backup(&[&self.src], extra);
        self.snapshot = snapshot_id(&summary);
        summary
    }

    /// Where the source lands in a full restore into `target`.
    pub fn restored(&self, target: &Path) -> PathBuf {
        restored_path(target, &self.src)
    }

    /// Asserts that `target` holds the source exactly as `before` recorded it.
    pub fn assert_exact(&self, target: &Path) {
        assert_same(&self.before, &scan(&self.restored(target)), true);
    }

    /// Restores snapshot `spec` into `base/NAME`; returns the scan of the restored source.
    pub fn restore_and_scan(&self, spec: &str, name: &str) -> Scan {
        let target = self.path(name);
        self.cairn.restore(spec, &target);
        scan(&self.restored(&target))
    }

    /// Restores `spec` into `base/NAME` and asserts that the source came back exactly.
    pub fn restore_exact(&self, spec: &str, name: &str) {
        let target = self.path(name);
        self.cairn.restore(spec, &target);
        self.assert_exact(&target);
    }
}

/// `cairn` with its default cache directory (`XDG_CACHE_HOME`) inside the test's directory
/// `base`, not in the user's home.
pub fn isolated(cairn: Cairn, base: &Path) -> Cairn {
    cairn.with_env("XDG_CACHE_HOME", base.join("xdg-cache").to_str().expect("UTF-8 path"))
}

/// The full snapshot ID of a backup's JSON summary.
pub fn snapshot_id(summary: &Value) -> String {
    summary["snapshot_id"].as_str().unwrap_or_else(|| panic!("no snapshot id: {summary}")).to_string()
}

/// The number `field` of a JSON summary.
pub fn num(summary: &Value, field: &str) -> u64 {
    summary[field].as_u64().unwrap_or_else(|| panic!("summary has no number {field}: {summary}"))
}

/// Lossy UTF-8 of a command's stderr.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Lossy UTF-8 of a command's stdout.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A command's stdout, once it is known to have succeeded (else the test fails showing both
/// streams).
pub fn ok(out: &Output) -> String {
    assert!(out.status.success(), "status {}\nstdout:\n{}\nstderr:\n{}", out.status, stdout(out), stderr(out));
    stdout(out)
}

/// Runs `c` with no input and its output captured, like [`Command::output`], but kills it and
/// panics if it runs longer than [`COMMAND_TIMEOUT`] (a hung pipeline must fail the test, not
/// stall the suite).
pub fn output_within_timeout(c: &mut Command) -> Output {
    use std::process::Stdio;
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let shown = format!("{c:?}");
    wait_within_timeout(c.spawn().expect("running the cairn binary"), &shown)
}

/// Waits until `cond` holds, polling every 20 ms; panics naming `what` after `within`.
pub fn wait_until(within: std::time::Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(start.elapsed() < within, "timed out after {within:?} waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Every file below `dir`, at any depth, sorted (none if `dir` does not exist).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).into_iter().flatten() {
        let path = e.unwrap().path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// Waits (up to 100 s) until `child` reaches the stall its `CAIRN_INJECT_FAULTS` names and the
/// fault layer writes `stalled` (its `stalled=FILE`), or ends; true if it stalled and still runs.
pub fn wait_for_stall(child: &mut std::process::Child, stalled: &Path) -> bool {
    let started = std::time::Instant::now();
    while !stalled.exists() && child.try_wait().unwrap().is_none() && started.elapsed().as_secs() < 100 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    stalled.exists() && child.try_wait().unwrap().is_none()
}

/// Waits for `child` (shown as `shown` in messages), collecting whatever of its stdout and
/// stderr is still piped; kills it and panics if it runs longer than [`COMMAND_TIMEOUT`].
pub fn wait_within_timeout(mut child: std::process::Child, shown: &str) -> Output {
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(child.stdout.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
    let err = drain(child.stderr.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
    let deadline = std::time::Instant::now() + COMMAND_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{shown} did not finish within {COMMAND_TIMEOUT:?}; stderr:\n{}",
                String::from_utf8_lossy(&err.join().expect("stderr reader"))
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    Output { status, stdout: out.join().expect("stdout reader"), stderr: err.join().expect("stderr reader") }
}

/// One blob as its pack header lists it.
#[derive(Clone, Debug)]
pub struct StoredBlob {
    /// The pack's path in the repository.
    pub pack: String,
    /// The blob.
    pub id: BlobId,
    /// Data or tree.
    pub kind: BlobKind,
    /// How it was compressed.
    pub codec: Codec,
    /// Plaintext length.
    pub raw_length: u32,
    /// Stored length (nonce + ciphertext + tag).
    pub length: u32,
}

/// Parses the last non-empty line of `stdout` as JSON.
pub fn last_json(stdout: &str) -> Value {
    let line =
        stdout.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_else(|| panic!("no output to parse: {stdout:?}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

/// Where a backed-up absolute path lands under a full restore into `target`.
pub fn restored_path(target: &Path, source: &Path) -> PathBuf {
    target.join(source.strip_prefix("/").expect("absolute source path"))
}

/// The kind of a file system entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
    /// Named pipe.
    Fifo,
    /// Character device.
    CharDevice,
    /// Block device.
    BlockDevice,
    /// Socket.
    Socket,
}

impl Kind {
    /// Lowercase name, as in manifests.
    pub fn name(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::Dir => "dir",
            Kind::Symlink => "symlink",
            Kind::Fifo => "fifo",
            Kind::CharDevice => "chardev",
            Kind::BlockDevice => "blockdev",
            Kind::Socket => "socket",
        }
    }
}

/// Everything the tests compare about one entry.
#[derive(Clone, Debug)]
pub struct Meta {
    /// Kind.
    pub kind: Kind,
    /// `st_mode & 0o7777`.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Files: length; symlinks: target length; others 0.
    pub size: u64,
    /// Access time (seconds, nanoseconds).
    pub atime: (i64, i64),
    /// Modification time (seconds, nanoseconds).
    pub mtime: (i64, i64),
    /// Device number of device nodes (0 otherwise).
    pub rdev: u64,
    /// Symlink target.
    pub target: Option<Vec<u8>>,
    /// Every extended attribute, ACLs (`system.posix_acl_*`) included.
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// [`content_digest`] of a file.
    pub digest: Option<[u8; 32]>,
    /// Inode number (hard-link identity).
    pub ino: u64,
    /// Link count.
    pub nlink: u64,
    /// Allocated 512-byte blocks.
    pub blocks: u64,
}

/// A scanned tree: path relative to the scanned root (`""` is the root) → metadata.
pub type Scan = BTreeMap<PathBuf, Meta>;

/// Keyed BLAKE3 (through cairn-core) as a content digest.
pub fn digest(data: &[u8]) -> [u8; 32] {
    MasterKey::from_secret([0x5a; 32]).blob_id(data).0
}

/// Opens a file for reading without touching its access time.
fn open_noatime(path: &Path) -> fs::File {
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOATIME | libc::O_NOFOLLOW)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

/// Reads a file without touching its access time.
pub fn read_noatime(path: &Path) -> Vec<u8> {
    let mut data = Vec::new();
    open_noatime(path).read_to_end(&mut data).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    data
}

/// A digest of a file's content that depends on the bytes only (not on where the holes are),
/// computed without reading holes, so that multi-GiB sparse files are cheap: the file is cut
/// into 64 KiB blocks; runs of all-zero blocks count as runs, other blocks by their hash.
pub fn content_digest(path: &Path) -> [u8; 32] {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    const BLOCK: u64 = 64 * 1024;
    let f = open_noatime(path);
    let size = f.metadata().expect("fstat").len();
    let mut tokens: Vec<u8> = size.to_le_bytes().to_vec();
    let mut zero_run = 0u64;
    let mut buf = vec![0u8; BLOCK as usize];
    let mut pos = 0u64;
    while pos < size {
        // SAFETY: lseek on a descriptor we own.
        let data = unsafe { libc::lseek(f.as_raw_fd(), pos as libc::off_t, libc::SEEK_DATA) };
        let data = if data < 0 { size } else { data as u64 };
        // Blocks wholly inside the hole are zero.
        let first_data_block = data / BLOCK * BLOCK;
        if first_data_block > pos {
            zero_run += (first_data_block - pos).div_ceil(BLOCK);
            pos = first_data_block.min(size);
            if pos >= size {
                break;
            }
        }
        let n = BLOCK.min(size - pos) as usize;
        f.read_exact_at(&mut buf[..n], pos).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        if buf[..n].iter().all(|&b| b == 0) {
            zero_run += 1;
        } else {
            if zero_run > 0 {
                tokens.push(b'Z');
                tokens.extend_from_slice(&zero_run.to_le_bytes());
                zero_run = 0;
            }
            tokens.push(b'D');
            tokens.extend_from_slice(&digest(&buf[..n]));
        }
        pos += n as u64;
    }
    if zero_run > 0 {
        tokens.push(b'Z');
        tokens.extend_from_slice(&zero_run.to_le_bytes());
    }
    digest(&tokens)
}

/// All extended attributes of `path` (not following a symlink).
pub fn xattrs_of(path: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut out = BTreeMap::new();
    let names = match xattr::list(path) {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return out,
        Err(e) => panic!("listxattr {}: {e}", path.display()),
    };
    for name in names {
        if let Some(v) = xattr::get(path, &name).unwrap_or_else(|e| panic!("getxattr {} {name:?}: {e}", path.display()))
        {
            out.insert(name.as_bytes().to_vec(), v);
        }
    }
    out
}

/// Reads one entry's metadata (and, for files, its content digest).
pub fn meta_of(path: &Path) -> Meta {
    let md = fs::symlink_metadata(path).unwrap_or_else(|e| panic!("lstat {}: {e}", path.display()));
    let ft = md.file_type();
    let kind = if ft.is_file() {
        Kind::File
    } else if ft.is_dir() {
        Kind::Dir
    } else if ft.is_symlink() {
        Kind::Symlink
    } else if ft.is_fifo() {
        Kind::Fifo
    } else if ft.is_char_device() {
        Kind::CharDevice
    } else if ft.is_block_device() {
        Kind::BlockDevice
    } else {
        Kind::Socket
    };
    let xattrs = xattrs_of(path);
    let mut m = Meta {
        kind,
        mode: md.mode() & 0o7777,
        uid: md.uid(),
        gid: md.gid(),
        size: 0,
        atime: (md.atime(), md.atime_nsec()),
        mtime: (md.mtime(), md.mtime_nsec()),
        rdev: 0,
        target: None,
        xattrs,
        digest: None,
        ino: md.ino(),
        nlink: md.nlink(),
        blocks: md.blocks(),
    };
    match kind {
        Kind::File => {
            m.size = md.len();
            m.digest = Some(content_digest(path));
        }
        Kind::Symlink => {
            m.size = md.len();
            m.target = Some(fs::read_link(path).expect("readlink").as_os_str().as_bytes().to_vec());
        }
        Kind::CharDevice | Kind::BlockDevice => m.rdev = md.rdev(),
        _ => {}
    }
    m
}

/// Scans `root` and everything below it.
pub fn scan(root: &Path) -> Scan {
    let mut out = Scan::new();
    scan_into(root, PathBuf::new(), &mut out);
    out
}

fn scan_into(abs: &Path, rel: PathBuf, out: &mut Scan) {
    let m = meta_of(abs);
    let is_dir = m.kind == Kind::Dir;
    out.insert(rel.clone(), m);
    if is_dir {
        let mut names: Vec<_> = fs::read_dir(abs)
            .unwrap_or_else(|e| panic!("list {}: {e}", abs.display()))
            .map(|e| e.expect("dir entry").file_name())
            .collect();
        names.sort();
        for n in names {
            scan_into(&abs.join(&n), rel.join(&n), out);
        }
    }
}

/// The entry `name` in the open directory `dir` as a path the kernel resolves from that
/// directory (`/proc/self/fd/N/NAME`; the final name is not followed): short however deep
/// `dir` lies, so path-based calls reach entries whose full path is longer than PATH_MAX.
/// `dir` must stay open while the path is used.
pub fn in_dir(dir: &fs::File, name: impl AsRef<OsStr>) -> PathBuf {
    use std::os::unix::io::AsRawFd;
    Path::new(&format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name.as_ref())
}

/// Opens the directory `name` in the open directory `dir` (`openat`, never through a symlink).
pub fn open_in(dir: &fs::File, name: impl AsRef<OsStr>) -> fs::File {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::io::AsRawFd;
    let name = name.as_ref();
    let c = std::ffi::CString::new(name.as_bytes()).expect("no NUL");
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: openat with a valid descriptor and NUL-terminated name; the result is owned.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags) };
    assert!(fd >= 0, "openat {name:?}: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` was just opened and is owned by nobody else.
    fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Makes the directory `name` in the open directory `dir` (`mkdirat`) and opens it.
pub fn mkdir_in(dir: &fs::File, name: impl AsRef<OsStr>, mode: u32) -> fs::File {
    use std::os::unix::io::AsRawFd;
    let c = std::ffi::CString::new(name.as_ref().as_bytes()).expect("no NUL");
    // SAFETY: mkdirat with a valid descriptor and NUL-terminated name.
    let rc = unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), mode as libc::mode_t) };
    assert_eq!(rc, 0, "mkdirat {:?}: {}", name.as_ref(), std::io::Error::last_os_error());
    open_in(dir, name)
}

/// Opens the directory at `path`, however long, one component at a time (`openat`).
pub fn open_dir_deep(path: &Path) -> fs::File {
    let mut parts = path.components();
    let first = parts.next().expect("a non-empty path");
    let mut dir = fs::File::open(first.as_os_str()).unwrap_or_else(|e| panic!("open {first:?}: {e}"));
    for part in parts {
        dir = open_in(&dir, part.as_os_str());
    }
    dir
}

/// The entry at `path` (of any length): its directory, opened by [`open_dir_deep`], and
/// [`in_dir`]'s short path to it, valid while that directory is open.
pub fn deep(path: &Path) -> (fs::File, PathBuf) {
    let dir = open_dir_deep(path.parent().expect("a path with a parent"));
    let short = in_dir(&dir, path.file_name().expect("a path with a name"));
    (dir, short)
}

/// [`scan`] for trees of any depth: entries are reached through their open directory
/// ([`in_dir`]), never by their full path, so paths longer than PATH_MAX are scanned too.
pub fn scan_deep(root: &Path) -> Scan {
    fn into(dir: &fs::File, name: &OsStr, rel: PathBuf, out: &mut Scan) {
        let path = in_dir(dir, name);
        let m = meta_of(&path);
        let is_dir = m.kind == Kind::Dir;
        out.insert(rel.clone(), m);
        if is_dir {
            let sub = open_in(dir, name);
            let mut names: Vec<_> = fs::read_dir(in_dir(&sub, "."))
                .unwrap_or_else(|e| panic!("list {}: {e}", rel.display()))
                .map(|e| e.expect("dir entry").file_name())
                .collect();
            names.sort();
            for n in names {
                into(&sub, &n, rel.join(&n), out);
            }
        }
    }
    let (dir, _) = deep(root);
    let mut out = Scan::new();
    into(&dir, root.file_name().expect("a root with a name"), PathBuf::new(), &mut out);
    out
}

/// [`reset_times`] for trees of any depth (entries reached through their open directory).
pub fn reset_times_deep(root: &Path, scan: &Scan) {
    for (rel, m) in scan.iter().rev() {
        let (_dir, p) = deep(&root.join(rel));
        set_times(&p, m.atime, m.mtime);
    }
}

/// [`scan_source`] for trees of any depth.
pub fn scan_source_deep(root: &Path) -> Scan {
    let s = scan_deep(root);
    reset_times_deep(root, &s);
    s
}

/// Sets atime and mtime of `path` without following a symlink.
pub fn set_times(path: &Path, atime: (i64, i64), mtime: (i64, i64)) {
    filetime::set_symlink_file_times(
        path,
        FileTime::from_unix_time(atime.0, atime.1 as u32),
        FileTime::from_unix_time(mtime.0, mtime.1 as u32),
    )
    .unwrap_or_else(|e| panic!("set times of {}: {e}", path.display()));
}

/// Puts back the times `scan` recorded for the tree at `root` (children before parents).
pub fn reset_times(root: &Path, scan: &Scan) {
    for (rel, m) in scan.iter().rev() {
        let p = if rel.as_os_str().is_empty() { root.to_path_buf() } else { root.join(rel) };
        set_times(&p, m.atime, m.mtime);
    }
}

/// Scans the source tree at `root` and undoes the scan's own atime updates.
pub fn scan_source(root: &Path) -> Scan {
    let s = scan(root);
    reset_times(root, &s);
    s
}

fn show(p: &Path) -> String {
    if p.as_os_str().is_empty() {
        "<root>".into()
    } else {
        format!("{:?}", p)
    }
}

fn show_xattrs(x: &BTreeMap<Vec<u8>, Vec<u8>>) -> String {
    let shown: Vec<String> = x
        .iter()
        .map(|(k, v)| {
            let hex: String = v.iter().map(|b| format!("{b:02x}")).collect();
            format!("{}={hex}", String::from_utf8_lossy(k))
        })
        .collect();
    format!("{{{}}}", shown.join(", "))
}

fn hard_link_groups(s: &Scan) -> HashMap<u64, BTreeSet<PathBuf>> {
    let mut groups: HashMap<u64, BTreeSet<PathBuf>> = HashMap::new();
    for (p, m) in s {
        if m.kind != Kind::Dir {
            groups.entry(m.ino).or_default().insert(p.clone());
        }
    }
    groups
}

/// Differences between a source scan and a restored scan. With `root_metadata` false the
/// root's own metadata is not compared (a restore of `SNAP:PATH` fills an existing target).
pub fn differences(src: &Scan, dst: &Scan, root_metadata: bool) -> Vec<String> {
    let mut diffs = Vec::new();
    for p in src.keys().filter(|p| !dst.contains_key(*p)) {
        diffs.push(format!("{}: missing from the restore", show(p)));
    }
    for p in dst.keys().filter(|p| !src.contains_key(*p)) {
        diffs.push(format!("{}: in the restore but not in the source", show(p)));
    }
    let src_groups = hard_link_groups(src);
    let dst_groups = hard_link_groups(dst);
    for (p, a) in src {
        let Some(b) = dst.get(p) else { continue };
        let mut field = |name: &str, x: String, y: String| {
            if x != y {
                diffs.push(format!("{}: {name}: source {x}, restored {y}", show(p)));
            }
        };
        field("kind", format!("{:?}", a.kind), format!("{:?}", b.kind));
        if a.kind != b.kind || (p.as_os_str().is_empty() && !root_metadata) {
            continue;
        }
        field("mode", format!("{:o}", a.mode), format!("{:o}", b.mode));
        field("uid", a.uid.to_string(), b.uid.to_string());
        field("gid", a.gid.to_string(), b.gid.to_string());
        field("mtime", format!("{:?}", a.mtime), format!("{:?}", b.mtime));
        field("atime", format!("{:?}", a.atime), format!("{:?}", b.atime));
        field("xattrs", show_xattrs(&a.xattrs), show_xattrs(&b.xattrs));
        match a.kind {
            Kind::File => {
                field("size", a.size.to_string(), b.size.to_string());
                field("content digest", format!("{:02x?}", a.digest), format!("{:02x?}", b.digest));
                // Sparseness: never more allocated than the source (one block of slack for
                // extent-tree blocks), and a file that was mostly hole keeps its holes.
                if b.blocks > a.blocks + 8 {
                    field(
                        "allocated 512-byte blocks (more than source + 8)",
                        a.blocks.to_string(),
                        b.blocks.to_string(),
                    );
                }
                if a.size >= 64 * 1024 && a.blocks * 512 * 2 < a.size && b.blocks * 512 >= b.size {
                    field(
                        "holes (allocated bytes of a mostly-hole file)",
                        (a.blocks * 512).to_string(),
                        (b.blocks * 512).to_string(),
                    );
                }
            }
            Kind::Symlink => {
                field("size", a.size.to_string(), b.size.to_string());
                field(
                    "symlink target",
                    format!("{:?}", a.target.as_ref().map(|t| OsStr::from_bytes(t))),
                    format!("{:?}", b.target.as_ref().map(|t| OsStr::from_bytes(t))),
                );
            }
            Kind::CharDevice | Kind::BlockDevice => {
                field("rdev", format!("{:#x}", a.rdev), format!("{:#x}", b.rdev));
            }
            _ => {}
        }
        if a.kind != Kind::Dir {
            let ga = &src_groups[&a.ino];
            let gb = &dst_groups[&b.ino];
            field("hard-link group", format!("{ga:?}"), format!("{gb:?}"));
        }
    }
    diffs
}

/// Panics, listing every difference, unless the restored scan matches the source scan.
pub fn assert_same(src: &Scan, dst: &Scan, root_metadata: bool) {
    let diffs = differences(src, dst, root_metadata);
    if !diffs.is_empty() {
        let shown: Vec<_> = diffs.iter().take(60).cloned().collect();
        panic!("the restore differs from the source in {} ways:\n  {}", diffs.len(), shown.join("\n  "));
    }
}

/// Counts the files below `dir` (recursively).
pub fn count_files(dir: &Path) -> usize {
    let mut n = 0;
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd {
            let e = e.expect("dir entry");
            let ft = e.file_type().expect("file type");
            if ft.is_dir() {
                n += count_files(&e.path());
            } else {
                n += 1;
            }
        }
    }
    n
}

/// Number of extents of a file (FIEMAP, after flushing delayed allocation).
pub fn extent_count(path: &Path) -> u32 {
    use std::os::unix::io::AsRawFd;
    #[repr(C)]
    struct Fiemap {
        start: u64,
        length: u64,
        flags: u32,
        mapped_extents: u32,
        extent_count: u32,
        reserved: u32,
    }
    const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
    const FIEMAP_FLAG_SYNC: u32 = 1;
    let f = open_noatime(path);
    let mut m =
        Fiemap { start: 0, length: u64::MAX, flags: FIEMAP_FLAG_SYNC, mapped_extents: 0, extent_count: 0, reserved: 0 };
    // SAFETY: FS_IOC_FIEMAP with extent_count 0 only writes the header we pass.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_FIEMAP as _, &mut m as *mut Fiemap) };
    assert_eq!(r, 0, "FIEMAP {}: {}", path.display(), std::io::Error::last_os_error());
    m.mapped_extents
}

/// Whether the tests run as root (ownership and device nodes can only be restored as root).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Every test that makes or removes something in `/dev/shm` holds this: shared
/// ([`shm_shared`]) by most, alone ([`shm_alone`]) by a test that backs a tree there up twice
/// and wants the second backup to find nothing changed (a directory made or removed beside it
/// changes `/dev/shm`'s times, which a snapshot records as a parent directory's; seen in CI:
/// 182 bytes), or that measures its peak memory.
static SHM: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Shares `/dev/shm` with the other tests that share it (see [`SHM`]).
pub fn shm_shared() -> std::sync::RwLockReadGuard<'static, ()> {
    SHM.read().unwrap_or_else(|e| e.into_inner())
}

/// Has `/dev/shm` to itself among the tests (see [`SHM`]).
pub fn shm_alone() -> std::sync::RwLockWriteGuard<'static, ()> {
    SHM.write().unwrap_or_else(|e| e.into_inner())
}

/// A temporary directory in memory when the machine has one (`/dev/shm`): hundreds of
/// thousands of files are made and removed there in seconds, not minutes.
pub fn memory_tempdir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).expect("tempdir in /dev/shm")
    } else {
        tempfile::tempdir().expect("tempdir")
    }
}

/// Runs `c` to the end (stdin closed, stdout and stderr captured); returns its stdout, stderr
/// and peak RSS in KiB. Panics if it fails.
///
/// The peak is measured by GNU `time` (installed by `.ci/run`), which forks the command from
/// its own small process: a child spawned straight from this test process (`posix_spawn`,
/// which shares our memory until it execs) starts with our peak RSS as its `ru_maxrss`, and
/// the tests beside it in this process (a dump's tar held in memory, a generated tree's
/// listing) made that 104 MiB where the command itself peaked far lower.
pub fn run_with_peak_rss(c: &mut Command) -> (String, String, u64) {
    let report = tempfile::NamedTempFile::new().expect("temp file");
    let mut timed = Command::new("/usr/bin/time");
    timed.args(["-f", "%M", "-o"]).arg(report.path()).arg(c.get_program()).args(c.get_args());
    for (name, value) in c.get_envs() {
        match value {
            Some(v) => timed.env(name, v),
            None => timed.env_remove(name),
        };
    }
    if let Some(dir) = c.get_current_dir() {
        timed.current_dir(dir);
    }
    timed.stdin(std::process::Stdio::null());
    let out = output_within_timeout(&mut timed);
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "command failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    let report = fs::read_to_string(report.path()).expect("time's report");
    let peak = report.lines().last().and_then(|l| l.trim().parse().ok());
    (stdout, stderr, peak.unwrap_or_else(|| panic!("no peak RSS in time's report {report:?}")))
}

/// A tmpfs mounted at a directory (made if missing), unmounted when dropped. The tests run as
/// root.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// `mount -t tmpfs -o OPTIONS tmpfs AT`.
    pub fn mount(at: &Path, options: &str) -> Self {
        fs::create_dir_all(at).expect("mkdir mount point");
        let st = Command::new("mount").args(["-t", "tmpfs", "-o", options, "tmpfs"]).arg(at).status().expect("mount");
        assert!(st.success(), "mount -t tmpfs -o {options} failed (the tests run as root)");
        Tmpfs(at.to_path_buf())
    }

    /// `mount -o remount,size=SIZE`: the disk grows (or shrinks) with its files kept.
    pub fn resize(&self, size: &str) {
        let st =
            Command::new("mount").args(["-o", &format!("remount,size={size}")]).arg(&self.0).status().expect("mount");
        assert!(st.success(), "remounting {} with size={size} failed", self.0.display());
    }

    /// Bytes in use on the file system, from `statvfs`.
    pub fn used(&self) -> u64 {
        let out = Command::new("stat").args(["-f", "-c", "%b %f %S"]).arg(&self.0).output().expect("stat -f");
        let text = String::from_utf8_lossy(&out.stdout);
        let v: Vec<u64> = text.split_whitespace().map(|n| n.parse().expect("stat -f number")).collect();
        (v[0] - v[1]) * v[2]
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// `mount --bind FROM AT`, undone when dropped.
pub struct BindMount(PathBuf);

impl BindMount {
    /// Binds `from` at `at`.
    pub fn new(from: &Path, at: &Path) -> Self {
        let st = Command::new("mount").arg("--bind").arg(from).arg(at).status().expect("mount");
        assert!(st.success(), "mount --bind failed (the tests run as root)");
        BindMount(at.to_path_buf())
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}
