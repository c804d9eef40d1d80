//! Bandwidth limits (`--limit-upload`, `--limit-download`): a layer around any [`Storage`] that
//! holds the bytes written, and the bytes read, each to a rate, whatever the backend. One token
//! bucket per direction is shared by every request in flight, so the limit is the link's total,
//! not each connection's: a restore's 32 concurrent ranged reads together move at most the
//! download limit, and still overlap with its writes into the target.
//!
//! A request pays for its bytes before it is sent (a write's length, a ranged read's length) or,
//! where the size is known only once it has come (a whole-object read), when it has come. The
//! bucket holds at most [`BURST`] of traffic, so an idle link does not save up for a long burst;
//! a request larger than what the bucket holds runs it into debt, which the next requests wait
//! out. Listings, existence checks and deletions move few bytes and are not held.
//!
//! Reads someone waits for now (a live restore's client reading what is not restored yet) are
//! made on a thread inside [`foreground`]: they wait only behind each other's bytes (a second
//! bucket at the same rate), never behind the debt of the background work in flight, which pays
//! for them instead (their bytes count against the shared bucket the background waits on). Over
//! any long stretch the total stays the limit; for a moment it can exceed it by the foreground
//! bytes in flight.

use std::cell::Cell;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::trace::RequestTrace;
use super::{ObjectInfo, Storage};
use crate::error::Result;
use futures_util::future::BoxFuture;

/// How much traffic an idle bucket saves up: this long at the limit.
pub const BURST: Duration = Duration::from_millis(100);

/// Bytes per second each way (`None`: no limit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Bytes written to the repository per second.
    pub upload: Option<u64>,
    /// Bytes read from the repository per second.
    pub download: Option<u64>,
}

impl Limits {
    /// Whether neither direction is limited.
    pub fn is_none(&self) -> bool {
        self.upload.is_none() && self.download.is_none()
    }
}

thread_local! {
    /// Whether this thread's requests are in the foreground lane.
    static FOREGROUND: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread's requests in the foreground lane: a limited download made in it
/// waits only behind other foreground downloads, not behind the background's.
pub fn foreground<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            FOREGROUND.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(FOREGROUND.with(|c| c.replace(true)));
    f()
}

/// Whether this thread is inside [`foreground`].
pub fn in_foreground() -> bool {
    FOREGROUND.with(|c| c.get())
}

/// A token bucket of bytes: [`TokenBucket::take`] waits until the bytes taken so far fit the rate.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    capacity: f64,
    state: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    /// Bytes that may go now; negative: the debt of requests already let through.
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A bucket filling at `rate` bytes per second (at least 1), holding [`BURST`] of it, full.
    pub fn new(rate: u64) -> Self {
        let rate = rate.max(1) as f64;
        let capacity = rate * BURST.as_secs_f64();
        TokenBucket { rate, capacity, state: Mutex::new(Bucket { tokens: capacity, at: Instant::now() }) }
    }

    /// Takes `n` bytes, waiting as long as the bucket is in debt after them.
    pub fn take(&self, n: u64) {
        let wait = self.charge(n);
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }

    /// Takes `n` bytes without waiting; returns how long the taker should wait (the debt after
    /// them, at the rate).
    fn charge(&self, n: u64) -> Duration {
        let mut b = self.state.lock().expect("token bucket");
        let now = Instant::now();
        let refill = now.saturating_duration_since(b.at).as_secs_f64() * self.rate;
        b.tokens = (b.tokens + refill).min(self.capacity) - n as f64;
        b.at = now;
        if b.tokens < 0.0 {
            Duration::from_secs_f64(-b.tokens / self.rate)
        } else {
            Duration::ZERO
        }
    }
}

/// One direction's limit with two lanes: the background waits on `all` (every byte), a
/// [`foreground`] request on `urgent` (the foreground's bytes only) and charges `all` too.
#[derive(Debug)]
pub struct Lanes {
    all: TokenBucket,
    urgent: TokenBucket,
}

impl Lanes {
    /// Both lanes at `rate` bytes per second.
    pub fn new(rate: u64) -> Self {
        Lanes { all: TokenBucket::new(rate), urgent: TokenBucket::new(rate) }
    }

    /// Takes `n` bytes in this thread's lane, waiting as that lane's debt requires.
    pub fn take(&self, n: u64) {
        if in_foreground() {
            let _ = self.all.charge(n);
            self.urgent.take(n);
        } else {
            self.all.take(n);
        }
    }
}

/// `inner` with its reads and writes held to [`Limits`].
pub struct LimitedStorage {
    inner: Arc<dyn Storage>,
    upload: Option<TokenBucket>,
    download: Option<Lanes>,
}

impl LimitedStorage {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Storage>, limits: Limits) -> Self {
        LimitedStorage { inner, upload: limits.upload.map(TokenBucket::new), download: limits.download.map(Lanes::new) }
    }

    fn download(&self, n: u64) {
        if let Some(b) = &self.download {
            b.take(n);
        }
    }
}

impl Storage for LimitedStorage {
    fn location(&self) -> &str {
        self.inner.location()
    }

    fn read(&self, path: &str) -> Result<Vec<u8>> {
        let data = self.inner.read(path)?;
        self.download(data.len() as u64);
        Ok(data)
    }

    fn read_range_into(&self, path: &str, offset: u64, len: u64, buf: &mut Vec<u8>) -> Result<()> {
        self.download(len);
        self.inner.read_range_into(path, offset, len, buf)
    }

    // The download limit is taken in the caller's thread, in its lane, before the request.
    fn read_range_async(&self, path: String, offset: u64, len: u64, buf: Vec<u8>) -> BoxFuture<'_, Result<Vec<u8>>> {
        self.download(len);
        self.inner.read_range_async(path, offset, len, buf)
    }

    fn read_ranges_async(&self, path: String, ranges: Vec<(u64, u64)>, buf: Vec<u8>) -> BoxFuture<'_, Result<Vec<u8>>> {
        self.download(ranges.iter().map(|r| r.1).sum());
        self.inner.read_ranges_async(path, ranges, buf)
    }

    fn write(&self, path: &str, data: Vec<u8>) -> Result<()> {
        if let Some(b) = &self.upload {
            b.take(data.len() as u64);
        }
        self.inner.write(path, data)
    }

    fn list(&self, dir: &str) -> Result<Vec<ObjectInfo>> {
        self.inner.list(dir)
    }

    fn delete(&self, path: &str) -> Result<()> {
        self.inner.delete(path)
    }

    fn exists(&self, path: &str) -> Result<bool> {
        self.inner.exists(path)
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

    #[test]
    fn threads_sharing_a_bucket_share_its_rate() {
        // 4 threads taking 64 KiB 8 times each at 4 MiB/s: 2 MiB in about half a second (less
        // the burst the full bucket lets through at once).
        let bucket = TokenBucket::new(4 << 20);
        let start = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| (0..8).for_each(|_| bucket.take(64 << 10)));
            }
        });
        let took = start.elapsed().as_secs_f64();
        let want = 0.5 - BURST.as_secs_f64();
        assert!(took >= want * 0.95, "{took:.3} s, want {want:.3} s");
    }

    #[test]
    fn a_foreground_download_goes_ahead_of_the_background_debt() {
        // 4 background downloads of 512 KiB at 1 MiB/s are paid for ahead: about 2 s of debt.
        // A foreground download of 16 KiB made after them returns before any of them, and its
        // bytes are added to what the background pays; a background one made then is last.
        use std::sync::atomic::{AtomicUsize, Ordering};
        let lanes = Lanes::new(1 << 20);
        let order = Mutex::new(Vec::new());
        let started = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for i in 0..4 {
                let (lanes, order, started) = (&lanes, &order, &started);
                s.spawn(move || {
                    started.fetch_add(1, Ordering::SeqCst);
                    lanes.take(512 << 10);
                    order.lock().unwrap().push(format!("background {i}"));
                });
            }
            while started.load(Ordering::SeqCst) < 4 {
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_millis(50));
            s.spawn(|| {
                foreground(|| lanes.take(16 << 10));
                assert!(!in_foreground(), "the lane is this thread's only inside foreground()");
                order.lock().unwrap().push("foreground".into());
            });
            std::thread::sleep(Duration::from_millis(50));
            s.spawn(|| {
                lanes.take(16 << 10);
                order.lock().unwrap().push("background late".into());
            });
        });
        let order = order.into_inner().unwrap();
        assert_eq!(order[0], "foreground", "{order:?}");
        assert_eq!(order[5], "background late", "{order:?}");
    }

    #[test]
    fn a_request_larger_than_the_bucket_is_paid_by_waiting() {
        let bucket = TokenBucket::new(1 << 20);
        let start = Instant::now();
        bucket.take(300 << 10); // the 100 ms burst, then debt
        bucket.take(1);
        let took = start.elapsed().as_secs_f64();
        let want = (300.0 / 1024.0) - BURST.as_secs_f64();
        assert!(took >= want * 0.95 && took < want + 0.2, "{took:.3} s, want {want:.3} s");
    }
}
