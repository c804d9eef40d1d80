//! The one small storage interface the rest of Cairn uses (FORMAT.md §1 gives the layout).
//!
//! Every backend goes through Apache OpenDAL ([`opendal_backend`]), except a repository on a
//! `cairn serve` server ([`server_client`]); fault injection, bandwidth limits ([`limit`]) and
//! other layers wrap a [`Storage`] rather than replace it.

mod explain;
mod fault;
mod limit;
mod location;
mod metered;
mod opendal_backend;
mod server_client;
mod trace;

pub use explain::{bucket_name_problem, storage_full};
pub use fault::{parse_duration as parse_fault_duration, Faults, FaultyStorage};
pub use limit::{foreground, LimitedStorage, Limits, TokenBucket};
pub use location::{is_loopback_host, Location};
pub use metered::{LinkMeter, MeteredStorage, NEAR};
pub use opendal_backend::{OpendalStorage, RemoteOptions};
pub use server_client::{
    parse_fingerprint, tls_config as server_tls_config, ServerOptions, ServerStorage, PROTOCOL as SERVER_PROTOCOL,
};
pub use trace::{CriticalPath, RequestTrace};

use crate::error::{Error, Result};
use futures_util::future::BoxFuture;

/// The runtime that drives the storages' requests (OpenDAL's services, the repository server's
/// client, the fault layer's timers), shared by all storages alive at once.
pub fn io_runtime() -> Result<std::sync::Arc<tokio::runtime::Runtime>> {
    opendal_backend::runtime()
}

/// One object listed by [`Storage::list`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Path relative to the repository root, with `/` separators.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
}

/// Who stored each snapshot, as far as the storage knows (FORMAT.md §15.4): only a `cairn serve`
/// server records it, and its client learns it from each listing of `snapshots/`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Provenance {
    /// The storage keeps no record: not a `cairn serve` repository.
    #[default]
    NotServed,
    /// A `cairn serve` server that sent no record with its last listing of `snapshots/` (one of
    /// protocol revision 1, before records were kept), or no listing of it was made yet.
    NotRecorded,
    /// What the server sent with its last listing of `snapshots/`.
    Recorded(StoredBy),
}

/// The records a revision 2 server sends with a listing of `snapshots/`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoredBy {
    /// The name of the token this client sends, as the server knows it.
    pub this_token: String,
    /// The token that stored each snapshot listed; a snapshot without a record is absent.
    pub snapshots: std::collections::HashMap<cairn_format::id::SnapshotId, String>,
}

impl Provenance {
    /// The name of the token that stored snapshot `id`, if the server recorded one.
    pub fn stored_by(&self, id: &cairn_format::id::SnapshotId) -> Option<&str> {
        match self {
            Provenance::Recorded(r) => r.snapshots.get(id).map(String::as_str),
            _ => None,
        }
    }
}

/// Where a repository's objects live. Paths are relative to the repository root and use `/`.
pub trait Storage: Send + Sync {
    /// A human-readable location, for messages.
    fn location(&self) -> &str;
    /// Reads a whole object.
    fn read(&self, path: &str) -> Result<Vec<u8>>;
    /// Reads `len` bytes at `offset` into `buf` (replacing its content, reusing its memory); a
    /// short object is reported as damaged.
    fn read_range_into(&self, path: &str, offset: u64, len: u64, buf: &mut Vec<u8>) -> Result<()>;
    /// [`Storage::read_range_into`] a new buffer.
    fn read_range(&self, path: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let mut buf = Vec::new();
        self.read_range_into(path, offset, len, &mut buf)?;
        Ok(buf)
    }
    /// [`Storage::read_range_into`] as a future owning its buffer, which it gives back filled:
    /// one thread keeps many reads in flight with it (the read path's fetch stage,
    /// `read/fetch.rs`). A storage that waits on a network (or, in the fault layer, on a timer)
    /// waits on the I/O runtime ([`io_runtime`]) without holding a thread, so it is polled
    /// inside that runtime; the default reads at once, in the caller's thread, as a local disk
    /// does. A layer around another storage forwards it: the default, around a remote storage,
    /// would block inside the runtime (its blocking read starts a runtime of its own there).
    fn read_range_async(&self, path: String, offset: u64, len: u64, buf: Vec<u8>) -> BoxFuture<'_, Result<Vec<u8>>> {
        read_at_once(|buf| self.read_range_into(&path, offset, len, buf), buf)
    }
    /// The ranges `ranges` (offset, length) of one object, back to back in `buf`, as one read of
    /// the read path (a read of several parts, `read::join_parts`). The default requests each
    /// range with [`Storage::read_range_async`], all at once, so they wait out one round trip
    /// together; a local file is opened once for all of them, and a layer forwards the whole.
    fn read_ranges_async(&self, path: String, ranges: Vec<(u64, u64)>, buf: Vec<u8>) -> BoxFuture<'_, Result<Vec<u8>>> {
        Box::pin(read_each(ranges, buf, move |offset, len| {
            self.read_range_async(path.clone(), offset, len, Vec::new())
        }))
    }
    /// Writes a whole object atomically: readers see all of it or nothing.
    fn write(&self, path: &str, data: Vec<u8>) -> Result<()>;
    /// Writes an object from `parts` as they come, atomically like [`Storage::write`], without
    /// holding all of it in memory where the backend allows (`cairn serve` streams uploads this
    /// way). If a part is an error, nothing is stored, what was written so far is removed, and
    /// that error is returned: the source checks the length and content hash in its last part.
    fn write_parts(&self, path: &str, parts: &mut dyn Iterator<Item = Result<bytes::Bytes>>) -> Result<()> {
        let mut data = Vec::new();
        for part in parts {
            data.extend_from_slice(&part?);
        }
        self.write(path, data)
    }
    /// Lists the objects below `dir` (recursively).
    fn list(&self, dir: &str) -> Result<Vec<ObjectInfo>>;
    /// Deletes an object; deleting a missing object is not an error.
    fn delete(&self, path: &str) -> Result<()>;
    /// Whether an object exists.
    fn exists(&self, path: &str) -> Result<bool>;
    /// Makes the repository's root exist (a directory; nothing for a bucket) and checks that it
    /// can be reached, so `init` fails with one clear line naming the location.
    fn create(&self) -> Result<()>;
    /// How many requests to keep in flight by default: a few for a local disk, many for a
    /// remote server where each request waits a round trip.
    fn default_concurrency(&self) -> usize;
    /// Whether the storage is on another machine (worth a local metadata cache).
    fn is_remote(&self) -> bool;
    /// Removes temporary objects (`.tmp/`, FORMAT.md §1) last modified more than `age` ago:
    /// what killed processes were writing. Returns how many were removed.
    fn remove_stale_temporaries(&self, age: std::time::Duration) -> Result<usize>;
    /// The record of requests a tracing layer keeps (the fault layer), if any: the read path
    /// marks its first data fetch in it, `--profile` and tests count round trips with it.
    fn trace(&self) -> Option<&RequestTrace> {
        None
    }
    /// Who stored each snapshot, as of the last listing of `snapshots/` (a layer forwards it).
    fn provenance(&self) -> Provenance {
        Provenance::NotServed
    }
}

/// How old a temporary object must be before a backup removes it as left behind by a killed
/// process: far longer than any one object takes to write (FORMAT.md §1).
pub const STALE_TEMPORARY_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

/// How many times a read that fails authentication (a short or corrupted transfer) is tried
/// before the object is reported as damaged.
const VERIFIED_READ_ATTEMPTS: usize = 3;

/// Reads a content-addressed object whose bytes must hash to its name (FORMAT.md §1), reading it
/// again if a transfer came back short or damaged.
pub(crate) fn read_checked(storage: &dyn Storage, path: &str) -> Result<Vec<u8>> {
    retry_damaged(|| {
        let bytes = storage.read(path)?;
        cairn_format::layout::check_name(path, &bytes)?;
        Ok(bytes)
    })
}

/// Runs `read` until it succeeds, fails with something other than damage, or has been tried
/// [`VERIFIED_READ_ATTEMPTS`] times. Transient storage errors were already retried by the
/// storage layer; damage that persists is reported.
pub(crate) fn retry_damaged<T>(mut read: impl FnMut() -> Result<T>) -> Result<T> {
    let mut attempt = 1;
    loop {
        match read() {
            Err(Error::Corrupt { file, why }) if attempt < VERIFIED_READ_ATTEMPTS => {
                tracing::warn!("{file} is damaged ({why}); reading it again");
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// A read into `buf` made now, in the caller's thread, as a future that is ready
/// ([`Storage::read_range_async`] of a storage that does not wait on the I/O runtime).
fn read_at_once<'a>(read: impl FnOnce(&mut Vec<u8>) -> Result<()>, mut buf: Vec<u8>) -> BoxFuture<'a, Result<Vec<u8>>> {
    Box::pin(std::future::ready(read(&mut buf).map(|()| buf)))
}

/// Each of `ranges` read by `read` (offset, length), all at once, and put back to back in `buf`.
pub(crate) async fn read_each<F>(
    ranges: Vec<(u64, u64)>,
    mut buf: Vec<u8>,
    read: impl Fn(u64, u64) -> F,
) -> Result<Vec<u8>>
where
    F: std::future::Future<Output = Result<Vec<u8>>>,
{
    let parts = futures_util::future::join_all(ranges.iter().map(|&(offset, len)| read(offset, len))).await;
    buf.clear();
    for part in parts {
        buf.extend_from_slice(&part?);
    }
    Ok(buf)
}

/// [`retry_damaged`] for a read that owns its buffer ([`Storage::read_range_async`]): `read`
/// is given a buffer each time (the one it started with first, then a new one).
pub(crate) async fn retry_damaged_async<F>(mut buf: Vec<u8>, mut read: impl FnMut(Vec<u8>) -> F) -> Result<Vec<u8>>
where
    F: std::future::Future<Output = Result<Vec<u8>>>,
{
    let mut attempt = 1;
    loop {
        match read(std::mem::take(&mut buf)).await {
            Err(Error::Corrupt { file, why }) if attempt < VERIFIED_READ_ATTEMPTS => {
                tracing::warn!("{file} is damaged ({why}); reading it again");
                attempt += 1;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fault::{Faults, FaultyStorage};
    use super::opendal_backend::OpendalStorage;
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// A storage that only forwards what every storage must have: its ranged reads are the
    /// trait's own (`read_range_async` at once, `read_ranges_async` each range at once).
    struct Plain(OpendalStorage);

    impl Storage for Plain {
        fn location(&self) -> &str {
            self.0.location()
        }
        fn read(&self, path: &str) -> Result<Vec<u8>> {
            self.0.read(path)
        }
        fn read_range_into(&self, path: &str, offset: u64, len: u64, buf: &mut Vec<u8>) -> Result<()> {
            self.0.read_range_into(path, offset, len, buf)
        }
        fn write(&self, path: &str, data: Vec<u8>) -> Result<()> {
            self.0.write(path, data)
        }
        fn list(&self, dir: &str) -> Result<Vec<ObjectInfo>> {
            self.0.list(dir)
        }
        fn delete(&self, path: &str) -> Result<()> {
            self.0.delete(path)
        }
        fn exists(&self, path: &str) -> Result<bool> {
            self.0.exists(path)
        }
        fn create(&self) -> Result<()> {
            self.0.create()
        }
        fn default_concurrency(&self) -> usize {
            1
        }
        fn is_remote(&self) -> bool {
            false
        }
        fn remove_stale_temporaries(&self, age: Duration) -> Result<usize> {
            self.0.remove_stale_temporaries(age)
        }
    }

    /// Reads of several ranges give them back to back, the buffer's old content gone, whether
    /// the local backend opens the file once, the trait's default requests each range, or the
    /// fault layer, under the metered and limit layers as a repository stacks them, waits one
    /// round trip for all of them (one request in its trace, not one a range); a range past the
    /// end is damage.
    #[test]
    fn a_read_of_several_ranges_gives_them_back_to_back() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        let object: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        OpendalStorage::local(root).unwrap().write("data/ab/pack", object.clone()).unwrap();
        let ranges = vec![(0, 10), (100, 900), (5_000, 1), (9_990, 10)];
        let want: Vec<u8> = ranges.iter().flat_map(|&(o, l)| object[o as usize..(o + l) as usize].to_vec()).collect();
        let rt = io_runtime().unwrap();
        let latency = Duration::from_millis(20);
        let faulty = FaultyStorage::new(OpendalStorage::local(root).unwrap(), Faults { latency, ..Faults::default() });
        let limits = limit::Limits { upload: None, download: Some(1 << 30) };
        let stacked = metered::MeteredStorage::new(
            Arc::new(limit::LimitedStorage::new(Arc::new(faulty), limits)),
            Arc::new(metered::LinkMeter::default()),
        );
        let storages: [(&str, Box<dyn Storage>); 3] = [
            ("local", Box::new(OpendalStorage::local(root).unwrap())),
            ("default", Box::new(Plain(OpendalStorage::local(root).unwrap()))),
            ("fault layer, stacked", Box::new(stacked)),
        ];
        for (name, s) in &storages {
            let t = Instant::now();
            let got = rt.block_on(s.read_ranges_async("data/ab/pack".into(), ranges.clone(), vec![7; 3])).unwrap();
            assert_eq!(got, want, "{name}");
            if let Some(trace) = s.trace() {
                assert!(t.elapsed() >= latency, "{name}: the round trip was waited for");
                let asked: Vec<String> = trace.critical_path().chain.into_iter().map(|step| step.what).collect();
                assert_eq!(asked, ["read ranges of data/ab/pack"], "{name}: one request for all the ranges");
            }
            let past = rt.block_on(s.read_ranges_async("data/ab/pack".into(), vec![(0, 10), (9_995, 10)], Vec::new()));
            assert!(matches!(past, Err(Error::Corrupt { .. })), "{name}: {past:?}");
        }
        assert!(storages[2].1.trace().is_some(), "the stacked fault layer keeps a trace");
    }
}
