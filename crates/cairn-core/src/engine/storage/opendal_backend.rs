//! [`Storage`] on Apache OpenDAL: the `fs`, `s3` and `sftp` services, each behind OpenDAL's
//! timeout, concurrency-limit and retry layers.

use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use opendal::blocking;
use opendal::layers::{ConcurrentLimitLayer, RetryLayer, TimeoutLayer};
use opendal::options::{ReadOptions, WriteOptions};
use opendal::{ErrorKind, Operator};

use super::{explain, Location, ObjectInfo, Storage};
use crate::error::{Error, Result};
use futures_util::future::BoxFuture;

/// OpenDAL needs a Tokio runtime to drive its (async) services. One is shared by all storages
/// alive at once, and shut down with the last of them: that drops its tasks, among them the
/// SFTP connections, whose `ssh` processes are told to exit rather than outliving Cairn.
pub(super) fn runtime() -> Result<Arc<tokio::runtime::Runtime>> {
    static RT: Mutex<Weak<tokio::runtime::Runtime>> = Mutex::new(Weak::new());
    let mut shared = RT.lock().expect("runtime lock");
    if let Some(rt) = shared.upgrade() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("cairn-io")
        .enable_all()
        .build()
        .map_err(|e| Error::io("cairn-io", "cannot start the I/O runtime", e))?;
    let rt = Arc::new(rt);
    *shared = Arc::downgrade(&rt);
    Ok(rt)
}

/// How to reach a repository: the SFTP and server options (ignored for other locations), and
/// the bandwidth limits (any location, applied where the storage is opened for a command).
#[derive(Clone, Debug, Default)]
pub struct RemoteOptions {
    /// Bytes per second to and from the repository.
    pub limits: super::Limits,
    /// SSH private key for SFTP (otherwise the agent and ssh's default keys are used).
    pub sftp_key: Option<String>,
    /// SSH host key policy for SFTP: `strict` (default: the host must be in known_hosts),
    /// `add` (trust a new host on first use), `accept` (trust any host key).
    pub sftp_known_hosts: Option<String>,
    /// How to reach and authenticate to a repository server (`cairn+https://…`).
    pub server: super::ServerOptions,
}

/// Ranged reads in flight by default: a local disk gains little from more than a few, while a
/// remote server needs many to hide each request's round trip (DESIGN.md, "Remote
/// repositories").
const LOCAL_CONCURRENCY: usize = 4;
const S3_CONCURRENCY: usize = 32;
/// Each SFTP connection is one `ssh` process, and sshd refuses bursts of more than 10
/// unauthenticated connections (`MaxStartups`), so SFTP stays below that.
const SFTP_CONCURRENCY: usize = 8;

/// Requests slower than this (per request, or per chunk of a body) are abandoned and retried.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Transient failures are retried this many times, with exponential backoff from 200 ms.
const RETRIES: usize = 5;

/// A repository stored through an OpenDAL operator.
#[derive(Clone)]
pub struct OpendalStorage {
    // Dropped before the runtime that drives it (fields drop in order).
    op: blocking::Operator,
    /// The same operator unwrapped, for what the blocking one cannot do (abort an upload).
    async_op: opendal::Operator,
    /// Prepended to every object path: the repository's directory below the operator's root
    /// over SFTP ("srv/cairn/"), empty otherwise.
    prefix: Arc<str>,
    location: Arc<str>,
    /// The location, parsed: what an error about it names (the endpoint, bucket, host).
    place: Arc<Location>,
    kind: Kind,
    runtime: Arc<tokio::runtime::Runtime>,
}

/// Which OpenDAL service is behind the operator.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Local,
    S3,
    /// Writes go to a temporary name first and are renamed into place: a plain SFTP write
    /// would let a reader see a partial object.
    Sftp,
}

impl Kind {
    fn concurrency(self) -> usize {
        match self {
            Kind::Local => LOCAL_CONCURRENCY,
            Kind::S3 => S3_CONCURRENCY,
            Kind::Sftp => SFTP_CONCURRENCY,
        }
    }

    /// Requests in flight at most, whatever concurrency a user asks for: generous for a disk
    /// or an object store, but over SFTP each request slot may open an SSH connection.
    fn request_limit(self) -> usize {
        match self {
            Kind::Sftp => SFTP_CONCURRENCY,
            Kind::Local | Kind::S3 => 64,
        }
    }
}

impl OpendalStorage {
    /// Opens the storage at `location`. Nothing is read yet: a wrong location or wrong
    /// credentials surface at the first request, as a [`Error::Storage`] naming it.
    pub fn open(location: &Location, remote: &RemoteOptions) -> Result<Self> {
        let shown = location.to_string();
        let err = |e| storage_err("open", &shown, e);
        match location {
            Location::Local(root) => Self::local(root),
            Location::S3 { endpoint, bucket, prefix } => {
                let mut b = opendal::services::S3::default()
                    .endpoint(endpoint)
                    .bucket(bucket)
                    .root(&format!("/{prefix}"))
                    .region(&env_first(&["AWS_DEFAULT_REGION", "AWS_REGION"]).unwrap_or_else(|| "us-east-1".into()));
                if let (Some(id), Some(secret)) =
                    (env_first(&["AWS_ACCESS_KEY_ID"]), env_first(&["AWS_SECRET_ACCESS_KEY"]))
                {
                    b = b.access_key_id(&id).secret_access_key(&secret);
                }
                if let Some(token) = env_first(&["AWS_SESSION_TOKEN"]) {
                    b = b.session_token(&token);
                }
                install_http_transport()?;
                Self::layered(Operator::new(b).map_err(err)?, location, Kind::S3, String::new())
            }
            Location::Sftp { user, host, port, path } => {
                let endpoint = match port {
                    Some(p) => format!("ssh://{host}:{p}"),
                    None => format!("ssh://{host}"),
                };
                // OpenDAL's SFTP service makes its root directory on every connection, so a
                // command that finds no repository would leave the directory behind: the
                // operator is rooted at `/` and the repository's directory is a path prefix.
                let mut b = opendal::services::Sftp::default().endpoint(&endpoint).root("/");
                if let Some(u) = user {
                    b = b.user(u);
                }
                if let Some(k) = &remote.sftp_key {
                    b = b.key(k);
                }
                if let Some(k) = &remote.sftp_known_hosts {
                    b = b.known_hosts_strategy(k);
                }
                let prefix = match path.trim_matches('/') {
                    "" => String::new(),
                    dir => format!("{dir}/"),
                };
                Self::layered(Operator::new(b).map_err(err)?, location, Kind::Sftp, prefix)
            }
            Location::Server { .. } => {
                Err(Error::Usage(format!("{shown} is a repository server: open it with ServerStorage")))
            }
        }
    }

    /// A repository in the local directory `root` (OpenDAL's `fs` service). Writes go to a
    /// temporary file under `root/.tmp` first and are renamed into place, so a crash never
    /// leaves a partial object behind.
    ///
    /// Nothing is made here: OpenDAL makes a missing root when the operator is built, so the
    /// directories it made are removed again at once (if still empty). A command that finds no
    /// repository leaves no trace; `init` ([`Storage::create`]) and the first write make them.
    pub fn local(root: &str) -> Result<Self> {
        let missing = missing_dirs(std::path::Path::new(root));
        let builder = opendal::services::Fs::default().root(root);
        let built = Operator::new(builder).map_err(|e| storage_err("open", root, e));
        for dir in &missing {
            if std::fs::remove_dir(dir).is_err() {
                break;
            }
        }
        Self::layered(built?, &Location::Local(root.to_string()), Kind::Local, String::new())
    }

    /// Adds the layers every backend gets: a timeout per request, a cap on requests in flight
    /// and retries with exponential backoff and jitter for errors OpenDAL marks temporary
    /// (timeouts, 5xx, throttling, dropped connections).
    fn layered(op: Operator, place: &Location, kind: Kind, prefix: String) -> Result<Self> {
        let location = place.to_string();
        let op = op
            .layer(TimeoutLayer::new().with_timeout(REQUEST_TIMEOUT).with_io_timeout(IO_TIMEOUT))
            .layer(ConcurrentLimitLayer::new(kind.request_limit()))
            .layer(
                RetryLayer::new()
                    .with_jitter()
                    .with_min_delay(Duration::from_millis(200))
                    .with_max_delay(Duration::from_secs(10))
                    .with_max_times(RETRIES),
            );
        let rt = runtime()?;
        let _guard = rt.enter();
        let async_op = op.clone();
        let op = blocking::Operator::new(op).map_err(|e| storage_err("open", &location, e))?;
        Ok(Self {
            op,
            async_op,
            prefix: prefix.into(),
            location: location.into(),
            place: Arc::new(place.clone()),
            kind,
            runtime: rt.clone(),
        })
    }

    /// Writes to `.tmp/NAME.RANDOM`, then renames into place. A write that fails (a full
    /// disk, a dropped connection) removes its temporary object, so it does not hold the space
    /// the next write needs; one a killed process left is removed by a later backup once it
    /// is old ([`Storage::remove_stale_temporaries`]). SFTP's rename refuses to replace
    /// an existing file. Cairn never rewrites an object under its name (locks are refreshed
    /// under new names), and content-addressed objects with the same name hold the same bytes,
    /// so an existing target means the object is already stored.
    fn staged_write(&self, path: &str, data: Vec<u8>) -> Result<()> {
        let tmp = self.temporary(path);
        if let Err(e) = self.op.write(&tmp, data) {
            let _ = self.op.delete(&tmp);
            return Err(self.fail("write", path, e));
        }
        self.commit(&tmp, path)
    }

    /// A new temporary object's full path for a write of `path`: `.tmp/NAME.RANDOM`.
    fn temporary(&self, path: &str) -> String {
        let name = path.rsplit('/').next().unwrap_or(path);
        self.at(&format!("{TEMPORARIES}{name}.{}", hex::encode(rand_bytes())))
    }

    /// Renames the whole temporary object `tmp` into place as `path` ([`Self::staged_write`]
    /// says why an existing `path` means it is already stored); `tmp` is gone afterwards.
    fn commit(&self, tmp: &str, path: &str) -> Result<()> {
        if let Err(e) = self.op.rename(tmp, &self.at(path)) {
            let exists = self.op.exists(&self.at(path)).unwrap_or(false);
            let _ = self.op.delete(tmp);
            if !exists {
                return Err(self.fail("write", path, e));
            }
        }
        Ok(())
    }

    /// [`Storage::write_parts`]: to a temporary object renamed into place (local, SFTP), or as
    /// one multipart upload of [`UPLOAD_PART`]-byte parts that becomes visible only when it
    /// completes (S3). At most one such part is held in memory.
    fn streamed_write(&self, path: &str, parts: &mut dyn Iterator<Item = Result<bytes::Bytes>>) -> Result<()> {
        if self.kind == Kind::S3 {
            return self.multipart_write(path, parts);
        }
        let target = self.temporary(path);
        let mut writer = self.op.writer(&target).map_err(|e| self.fail("write", path, e))?;
        let mut written = || -> Result<()> {
            for part in &mut *parts {
                writer.write(part?).map_err(|e| self.fail("write", path, e))?;
            }
            writer.close().map_err(|e| self.fail("write", path, e))?;
            Ok(())
        };
        let outcome = written();
        drop(writer);
        if let Err(e) = outcome {
            let _ = self.op.delete(&target);
            return Err(e);
        }
        self.commit(&target, path)
    }

    /// A streamed write to S3: one multipart upload of [`UPLOAD_PART`]-byte parts, visible only
    /// once it completes. An upload that fails (the body did not come whole, the server went
    /// away) is aborted, so its parts do not hold space until the bucket's rules for incomplete
    /// uploads expire them; if even the abort fails (the server is down), those rules are what
    /// remain.
    fn multipart_write(&self, path: &str, parts: &mut dyn Iterator<Item = Result<bytes::Bytes>>) -> Result<()> {
        let rt = self.runtime.handle();
        let opts = WriteOptions { chunk: Some(UPLOAD_PART), ..Default::default() };
        let mut writer =
            rt.block_on(self.async_op.writer_options(&self.at(path), opts)).map_err(|e| self.fail("write", path, e))?;
        let mut written = || -> Result<()> {
            for part in &mut *parts {
                rt.block_on(writer.write(part?)).map_err(|e| self.fail("write", path, e))?;
            }
            rt.block_on(writer.close()).map_err(|e| self.fail("write", path, e))?;
            Ok(())
        };
        let outcome = written();
        if outcome.is_err() {
            if let Err(e) = rt.block_on(writer.abort()) {
                tracing::debug!("aborting the upload of {path}: {e}");
            }
        }
        outcome
    }
}

/// The size of the parts a streamed write hands the backend at once (S3's multipart parts).
const UPLOAD_PART: usize = 8 << 20;

/// Where objects are written before they are renamed into place (local and SFTP).
const TEMPORARIES: &str = ".tmp/";

/// `dir` and those of its ancestors that do not exist, deepest first.
fn missing_dirs(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut at = Some(dir);
    while let Some(d) = at.filter(|d| !d.as_os_str().is_empty()) {
        if std::fs::symlink_metadata(d).is_ok() {
            break;
        }
        out.push(d.to_path_buf());
        at = d.parent();
    }
    out
}

impl OpendalStorage {
    /// The operator's path of the repository's object `path`.
    fn at(&self, path: &str) -> String {
        format!("{}{}", self.prefix, path.trim_start_matches('/'))
    }
}

fn rand_bytes() -> [u8; 8] {
    let mut b = [0u8; 8];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b).expect("OS random numbers");
    b
}

fn env_first(names: &[&str]) -> Option<String> {
    names.iter().find_map(|n| std::env::var(n).ok().filter(|v| !v.is_empty()))
}

/// OpenDAL's HTTP services send requests through a process-wide transport: a reqwest client
/// whose TLS (for https endpoints) uses rustls with ring, the crypto library Cairn already links.
fn install_http_transport() -> Result<()> {
    static INSTALLED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            // Fails only if a provider is already installed, which serves as well.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let client = reqwest::Client::builder().build().map_err(|e| e.to_string())?;
            opendal::HttpTransporter::install_default(opendal_http_transport_reqwest::ReqwestTransport::new(client));
            Ok(())
        })
        .clone()
        .map_err(|e| Error::Usage(format!("cannot set up HTTP: {e}")))
}

impl OpendalStorage {
    /// A ranged read of a local file, straight into the caller's buffer. (OpenDAL's fs reader
    /// zeroes a buffer, fills it on the runtime's thread and returns it to be copied once more:
    /// 9% of the CPU of restoring 1 GB of 1 MB files.)
    fn read_local_range(&self, path: &str, offset: u64, len: u64, buf: &mut Vec<u8>) -> Result<()> {
        self.read_local_ranges(path, &[(offset, len)], buf)
    }

    /// [`OpendalStorage::read_local_range`] of several ranges of one file, opened once, back to
    /// back in `buf`.
    fn read_local_ranges(&self, path: &str, ranges: &[(u64, u64)], buf: &mut Vec<u8>) -> Result<()> {
        use std::io::{Read, Seek, SeekFrom};
        let full = self.local_path(path);
        let failed = |e| local_read_error(path, &full, e);
        let mut file = std::fs::File::open(&full).map_err(failed)?;
        buf.clear();
        buf.reserve_exact(ranges.iter().map(|r| r.1).sum::<u64>() as usize);
        for &(offset, len) in ranges {
            file.seek(SeekFrom::Start(offset)).map_err(failed)?;
            let got = (&mut file).take(len).read_to_end(buf).map_err(failed)?;
            if got as u64 != len {
                return Err(Error::corrupt(
                    path,
                    format!("truncated: wanted {len} bytes at offset {offset}, got {got}"),
                ));
            }
        }
        Ok(())
    }

    /// A whole local file, read into one buffer of its size (opendal's would be copied into a
    /// second).
    fn read_local(&self, path: &str) -> Result<Vec<u8>> {
        let full = self.local_path(path);
        std::fs::read(&full).map_err(|e| local_read_error(path, &full, e))
    }

    /// A ranged read of a remote object, on the I/O runtime, into `buf`.
    async fn read_remote_range(&self, path: &str, offset: u64, len: u64, mut buf: Vec<u8>) -> Result<Vec<u8>> {
        let opts = ReadOptions { range: (offset..offset + len).into(), ..Default::default() };
        let got = self.async_op.read_options(&self.at(path), opts).await.map_err(|e| match e.kind() {
            ErrorKind::RangeNotSatisfied => Error::corrupt(path, "truncated (range past the end)"),
            _ => self.fail("read", path, e),
        })?;
        if got.len() as u64 != len {
            return Err(Error::corrupt(
                path,
                format!("truncated: wanted {len} bytes at offset {offset}, got {}", got.len()),
            ));
        }
        buf.clear();
        buf.reserve_exact(got.len());
        for part in got {
            buf.extend_from_slice(&part);
        }
        Ok(buf)
    }

    /// Where `path` of a local repository is on disk.
    fn local_path(&self, path: &str) -> std::path::PathBuf {
        std::path::Path::new(&*self.location).join(path)
    }
}

/// A failed read of `path` (at `full` on disk) of a local repository.
fn local_read_error(path: &str, full: &std::path::Path, e: std::io::Error) -> Error {
    match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound(path.to_string()),
        _ => Error::io(full, "cannot read", e),
    }
}

impl OpendalStorage {
    /// The error for a failed request: a failure of the location itself (the host, the bucket,
    /// the credentials) as one line saying what to do ([`Error::Unreachable`]), else about the
    /// object.
    fn fail(&self, op: &'static str, path: &str, e: opendal::Error) -> Error {
        if e.kind() == ErrorKind::NotFound {
            return Error::NotFound(path.to_string());
        }
        let text = explain::full_text(&e);
        let why = match &*self.place {
            Location::S3 { endpoint, bucket, .. } => {
                let host_port = endpoint.split_once("://").map_or(endpoint.as_str(), |(_, h)| h);
                let host = host_port.rsplit_once(':').map_or(host_port, |(h, _)| h);
                explain::connection(&text, host, host_port, "the S3 server")
                    .or_else(|| explain::s3(&text, endpoint, bucket))
            }
            Location::Sftp { user, host, port, .. } => {
                let host_port = format!("{host}:{}", port.unwrap_or(22));
                let login = match user {
                    Some(u) => format!("{u}@{host}"),
                    None => host.clone(),
                };
                explain::connection(&text, host, &host_port, "sshd").or_else(|| explain::sftp(&text, &login, host))
            }
            _ => None,
        };
        match why {
            Some(why) => explain::unreachable(&self.location, why, e),
            None => storage_err(op, path, e),
        }
    }
}

fn storage_err(op: &'static str, path: &str, source: opendal::Error) -> Error {
    if source.kind() == ErrorKind::NotFound {
        Error::NotFound(path.to_string())
    } else {
        Error::Storage { op, path: path.to_string(), source: Box::new(source) }
    }
}

impl Storage for OpendalStorage {
    fn location(&self) -> &str {
        &self.location
    }

    fn default_concurrency(&self) -> usize {
        self.kind.concurrency()
    }

    fn is_remote(&self) -> bool {
        self.kind != Kind::Local
    }

    fn read(&self, path: &str) -> Result<Vec<u8>> {
        if self.kind == Kind::Local {
            return self.read_local(path);
        }
        let buf = self.op.read(&self.at(path)).map_err(|e| self.fail("read", path, e))?;
        Ok(buf.to_vec())
    }

    fn read_range_into(&self, path: &str, offset: u64, len: u64, buf: &mut Vec<u8>) -> Result<()> {
        if self.kind == Kind::Local {
            return self.read_local_range(path, offset, len, buf);
        }
        *buf = self.runtime.block_on(self.read_remote_range(path, offset, len, std::mem::take(buf)))?;
        Ok(())
    }

    fn read_range_async(&self, path: String, offset: u64, len: u64, buf: Vec<u8>) -> BoxFuture<'_, Result<Vec<u8>>> {
        if self.kind == Kind::Local {
            return super::read_at_once(|buf| self.read_local_range(&path, offset, len, buf), buf);
        }
        Box::pin(async move { self.read_remote_range(&path, offset, len, buf).await })
    }

    fn read_ranges_async(&self, path: String, ranges: Vec<(u64, u64)>, buf: Vec<u8>) -> BoxFuture<'_, Result<Vec<u8>>> {
        if self.kind == Kind::Local {
            return super::read_at_once(|buf| self.read_local_ranges(&path, &ranges, buf), buf);
        }
        Box::pin(async move {
            let path = &path;
            super::read_each(ranges, buf, |offset, len| self.read_remote_range(path, offset, len, Vec::new())).await
        })
    }

    fn write(&self, path: &str, data: Vec<u8>) -> Result<()> {
        if self.kind == Kind::S3 {
            // A PUT is atomic: nothing partial is ever visible, nothing is left to clean up.
            self.op.write(&self.at(path), data).map_err(|e| self.fail("write", path, e))?;
            return Ok(());
        }
        self.staged_write(path, data)
    }

    fn write_parts(&self, path: &str, parts: &mut dyn Iterator<Item = Result<bytes::Bytes>>) -> Result<()> {
        self.streamed_write(path, parts)
    }

    fn remove_stale_temporaries(&self, age: Duration) -> Result<usize> {
        if self.kind == Kind::S3 {
            return Ok(0);
        }
        let entries = match self.op.list(&self.at(TEMPORARIES)) {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(self.fail("list", TEMPORARIES, e)),
        };
        let now = std::time::SystemTime::now();
        let mut removed = 0;
        for entry in entries {
            let old = entry
                .metadata()
                .last_modified()
                .and_then(|t| now.duration_since(std::time::SystemTime::from(t)).ok())
                .is_some_and(|a| a > age);
            // Best effort: another process may be removing the same file.
            if entry.metadata().is_file() && old && self.op.delete(entry.path()).is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }

    fn list(&self, dir: &str) -> Result<Vec<ObjectInfo>> {
        let dir = format!("{}/", dir.trim_end_matches('/'));
        let opts = opendal::options::ListOptions { recursive: true, ..Default::default() };
        let entries = match self.op.list_options(&self.at(&dir), opts) {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(self.fail("list", &dir, e)),
        };
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            if entry.metadata().is_dir() {
                continue;
            }
            let path = entry.path().strip_prefix(&*self.prefix).unwrap_or(entry.path());
            out.push(ObjectInfo { path: path.to_string(), size: entry.metadata().content_length() });
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    fn delete(&self, path: &str) -> Result<()> {
        match self.op.delete(&self.at(path)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.fail("delete", path, e)),
        }
    }

    fn exists(&self, path: &str) -> Result<bool> {
        self.op.exists(&self.at(path)).map_err(|e| self.fail("stat", path, e))
    }

    fn create(&self) -> Result<()> {
        let err = |e| self.fail("create", &self.location, e);
        match self.kind {
            // A bucket has no directories, and Cairn does not create buckets: listing the root
            // checks that the bucket exists and the credentials work.
            Kind::S3 => self.op.list("/").map(drop).map_err(err),
            Kind::Local => self.op.create_dir("/").map_err(err),
            Kind::Sftp => self.op.create_dir(&self.at(TEMPORARIES)).map_err(err),
        }
    }
}
