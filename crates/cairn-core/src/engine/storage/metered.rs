//! A measuring layer the repository puts around its storage:
//! it times the requests that move few bytes (listings, existence checks, reads of at most
//! [`SMALL`]) and keeps the shortest, the link's round-trip floor (what BBR calls the minimum
//! RTT). Large reads would add their transfer time and writes a local disk's flush (a lock
//! written on a busy machine took 1.8 ms where a small read took 10 µs), so they are not
//! timed. The read path's planner uses it to decide how far apart two wanted blobs may lie and
//! still share one ranged read (`read/gap.rs`): where a round trip costs more than the bytes
//! between them, the gap is read and dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::trace::RequestTrace;
use super::{ObjectInfo, Storage};
use crate::error::Result;
use futures_util::future::BoxFuture;

/// Requests moving at most this many bytes are timed: their time is mostly the round trip.
pub const SMALL: u64 = 64 * 1024;

/// A round trip shorter than this is a local repository's (or a LAN's): a local disk or a
/// server on this machine answers in microseconds, a link across a network in milliseconds.
pub const NEAR: Duration = Duration::from_millis(1);

/// What the requests so far say about the link.
#[derive(Debug)]
pub struct LinkMeter {
    /// The shortest request seen, in nanoseconds (`u64::MAX` before the first).
    floor_nanos: AtomicU64,
}

impl Default for LinkMeter {
    fn default() -> Self {
        LinkMeter { floor_nanos: AtomicU64::new(u64::MAX) }
    }
}

impl LinkMeter {
    /// A request took `took`.
    pub fn record(&self, took: Duration) {
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX - 1);
        self.floor_nanos.fetch_min(nanos, Ordering::Relaxed);
    }

    /// Whether the link is measured to be a far one (its round trip at least [`NEAR`]).
    pub fn far(&self) -> bool {
        self.latency().is_some_and(|l| l >= NEAR)
    }

    /// The shortest request so far: the latency every request pays at least (its transfer
    /// time included, so an upper bound of the round trip). `None` before the first request.
    pub fn latency(&self) -> Option<Duration> {
        match self.floor_nanos.load(Ordering::Relaxed) {
            u64::MAX => None,
            n => Some(Duration::from_nanos(n)),
        }
    }
}

/// `inner` with every request timed into a [`LinkMeter`].
pub struct MeteredStorage {
    inner: Arc<dyn Storage>,
    link: Arc<LinkMeter>,
}

impl MeteredStorage {
    /// Wraps `inner`, timing its requests into `link`.
    pub fn new(inner: Arc<dyn Storage>, link: Arc<LinkMeter>) -> Self {
        MeteredStorage { inner, link }
    }

    /// Runs `run`, timing it if it succeeds and `small` says its result moved few bytes.
    fn timed<T>(&self, run: impl FnOnce() -> Result<T>, small: impl FnOnce(&T) -> bool) -> Result<T> {
        let start = Instant::now();
        let out = run();
        // A failed request may have ended before reaching the other side: not a round trip.
        if let Ok(v) = &out {
            let took = start.elapsed();
            if small(v) {
                self.link.record(took);
            }
        }
        out
    }
}

impl Storage for MeteredStorage {
    fn location(&self) -> &str {
        self.inner.location()
    }

    fn read(&self, path: &str) -> Result<Vec<u8>> {
        self.timed(|| self.inner.read(path), |data| data.len() as u64 <= SMALL)
    }

    fn read_range_into(&self, path: &str, offset: u64, len: u64, buf: &mut Vec<u8>) -> Result<()> {
        self.timed(|| self.inner.read_range_into(path, offset, len, buf), |_| len <= SMALL)
    }

    fn read_range_async(&self, path: String, offset: u64, len: u64, buf: Vec<u8>) -> BoxFuture<'_, Result<Vec<u8>>> {
        let start = Instant::now();
        let read = self.inner.read_range_async(path, offset, len, buf);
        Box::pin(async move {
            let out = read.await;
            if out.is_ok() && len <= SMALL {
                self.link.record(start.elapsed());
            }
            out
        })
    }

    fn read_ranges_async(&self, path: String, ranges: Vec<(u64, u64)>, buf: Vec<u8>) -> BoxFuture<'_, Result<Vec<u8>>> {
        let start = Instant::now();
        let small = ranges.iter().map(|r| r.1).sum::<u64>() <= SMALL;
        let read = self.inner.read_ranges_async(path, ranges, buf);
        Box::pin(async move {
            let out = read.await;
            if out.is_ok() && small {
                self.link.record(start.elapsed());
            }
            out
        })
    }

    fn write(&self, path: &str, data: Vec<u8>) -> Result<()> {
        self.inner.write(path, data)
    }

    fn list(&self, dir: &str) -> Result<Vec<ObjectInfo>> {
        // A listing of a few hundred names fits one response.
        self.timed(|| self.inner.list(dir), |found| found.len() <= 1000)
    }

    fn delete(&self, path: &str) -> Result<()> {
        self.inner.delete(path)
    }

    fn exists(&self, path: &str) -> Result<bool> {
        self.timed(|| self.inner.exists(path), |_| true)
    }

    fn create(&self) -> Result<()> {
        self.inner.create()
    }

    fn default_concurrency(&self) -> usize {
        self.inner.default_concurrency()
    }

    fn is_remote(&self) -> bool {
        self.inner.is_remote()
    }

    fn remove_stale_temporaries(&self, age: Duration) -> Result<usize> {
        self.inner.remove_stale_temporaries(age)
    }

    fn trace(&self) -> Option<&RequestTrace> {
        self.inner.trace()
    }

    fn provenance(&self) -> super::Provenance {
        self.inner.provenance()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::storage::{Faults, FaultyStorage, Location, OpendalStorage, RemoteOptions};

    #[test]
    fn only_requests_moving_few_bytes_are_timed() {
        let dir = tempfile::tempdir().unwrap();
        let local =
            OpendalStorage::open(&Location::parse(dir.path().to_str().unwrap()).unwrap(), &RemoteOptions::default())
                .unwrap();
        let faults = Faults { latency: Duration::from_millis(30), ..Faults::default() };
        let link = Arc::new(LinkMeter::default());
        let s = MeteredStorage::new(Arc::new(FaultyStorage::new(local, faults)), link.clone());
        s.create().unwrap();
        s.write("big", vec![7; 1 << 20]).unwrap();
        assert_eq!(link.latency(), None, "a write is not timed");
        s.read("big").unwrap();
        assert_eq!(link.latency(), None, "nor a read of 1 MiB");
        s.read_range("big", 0, 100).unwrap();
        let floor = link.latency().expect("a small read is timed");
        assert!(floor >= Duration::from_millis(30), "{floor:?}");
    }

    #[test]
    fn the_floor_is_the_shortest_request() {
        let link = LinkMeter::default();
        assert_eq!(link.latency(), None);
        link.record(Duration::from_millis(30));
        link.record(Duration::from_millis(21));
        link.record(Duration::from_millis(90));
        assert_eq!(link.latency(), Some(Duration::from_millis(21)));
    }
}
