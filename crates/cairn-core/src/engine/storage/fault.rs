//! A fault-injection layer around any [`Storage`]: latency per request, stalls, failed,
//! truncated and corrupted reads. Tests and benchmarks wrap a real backend with it; it is never
//! a substitute for one. It also records its requests ([`RequestTrace`]) so a test or
//! `--profile` can count the round trips waited for one after another before data flows.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::trace::RequestTrace;
use super::{ObjectInfo, Storage};
use crate::error::{Error, Result};
use futures_util::future::BoxFuture;

/// Which faults to inject.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Added to every request.
    pub latency: Duration,
    /// Every n-th read (n > 0) fails with a storage error.
    pub fail_every: u64,
    /// Every n-th read (n > 0) comes back one byte short: a whole-object read returns the short
    /// data (the reader's hash or authentication check must catch it); a ranged read fails the
    /// way a backend reports a short transfer, as damage naming the object.
    pub truncate_every: u64,
    /// Every n-th read (n > 0) has one bit flipped.
    pub corrupt_every: u64,
    /// Ranged reads of objects whose path contains this string hang for `stall_for`.
    pub stall_path: Option<String>,
    /// Whole-object reads of objects whose path contains this string hang for `stall_for` (a
    /// test makes one file arrive last, e.g. the index files, to see what runs beside them).
    pub stall_read: Option<String>,
    /// Writes of objects whose path contains this string hang for `stall_for` first (a test
    /// holds a process at a chosen moment, e.g. a backup just before its snapshot is written).
    pub stall_write: Option<String>,
    /// Deletes of objects whose path contains this string hang for `stall_for` first.
    pub stall_delete: Option<String>,
    /// How long a stalled request hangs.
    pub stall_for: Duration,
    /// A file written (with the request's path) when a stall begins: a test waits for it
    /// instead of guessing how long the command takes to get there.
    pub stalled: Option<std::path::PathBuf>,
}

impl Faults {
    /// Parses `key=value` pairs separated by commas: `latency=50ms`, `fail-every=N`,
    /// `truncate-every=N`, `corrupt-every=N`, `stall=PATH-SUBSTRING` (ranged reads), `stall-read=PATH-SUBSTRING` (whole reads),
    /// `stall-write=PATH-SUBSTRING`, `stall-delete=PATH-SUBSTRING`, `stall-for=10s`,
    /// `stalled=FILE` (written when a stall begins).
    pub fn parse(spec: &str) -> Result<Self> {
        let mut f = Faults::default();
        let bad = |what: &str| Error::Usage(format!("bad fault spec {what:?}"));
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| bad(part))?;
            let num = || v.parse::<u64>().map_err(|_| bad(part));
            match k {
                "latency" => f.latency = parse_duration(v).ok_or_else(|| bad(part))?,
                "stall-for" => f.stall_for = parse_duration(v).ok_or_else(|| bad(part))?,
                "fail-every" => f.fail_every = num()?,
                "truncate-every" => f.truncate_every = num()?,
                "corrupt-every" => f.corrupt_every = num()?,
                "stall" => f.stall_path = Some(v.to_string()),
                "stall-read" => f.stall_read = Some(v.to_string()),
                "stall-write" => f.stall_write = Some(v.to_string()),
                "stall-delete" => f.stall_delete = Some(v.to_string()),
                "stalled" => f.stalled = Some(v.into()),
                _ => return Err(bad(part)),
            }
        }
        Ok(f)
    }
}

/// A fault's duration: `20ms`, `1.5s` or seconds without a unit (`None` if it is none of
/// these, negative or too large).
pub fn parse_duration(v: &str) -> Option<Duration> {
    if let Some(ms) = v.strip_suffix("ms") {
        return ms.parse().ok().map(Duration::from_millis);
    }
    v.strip_suffix('s').unwrap_or(v).parse::<f64>().ok().and_then(|s| Duration::try_from_secs_f64(s).ok())
}

/// A [`Storage`] that injects [`Faults`] into another.
pub struct FaultyStorage<S> {
    inner: S,
    faults: Faults,
    reads: AtomicU64,
    trace: RequestTrace,
}

impl<S: Storage> FaultyStorage<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, faults: Faults) -> Self {
        FaultyStorage { inner, faults, reads: AtomicU64::new(0), trace: RequestTrace::default() }
    }

    fn delay(&self) {
        if !self.faults.latency.is_zero() {
            std::thread::sleep(self.faults.latency);
        }
    }

    /// Runs request `op` on `path` with the injected latency first, and records it.
    fn request<T>(&self, op: &str, path: &str, run: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        self.delay();
        let out = run();
        self.trace.record(|| format!("{op} {path}"), start);
        out
    }

    fn stall(&self, at: &Option<String>, path: &str) {
        if at.as_deref().is_some_and(|p| path.contains(p)) {
            if let Some(file) = &self.faults.stalled {
                let _ = std::fs::write(file, path);
            }
            std::thread::sleep(self.faults.stall_for);
        }
    }

    fn mangle(&self, path: &str, data: &mut Vec<u8>, ranged: bool) -> Result<()> {
        let n = self.reads.fetch_add(1, Ordering::Relaxed) + 1;
        let every = |k: u64| k > 0 && n.is_multiple_of(k);
        if every(self.faults.fail_every) {
            return Err(Error::Usage(format!("injected fault: read of {path} failed")));
        }
        if every(self.faults.truncate_every) && !data.is_empty() {
            if ranged {
                // What OpendalStorage::read_range reports for a short body ([`Storage`] contract).
                let got = data.len() - 1;
                return Err(Error::corrupt(path, format!("truncated: wanted {} bytes, got {got}", data.len())));
            }
            data.pop();
        }
        if every(self.faults.corrupt_every) && !data.is_empty() {
            let i = data.len() / 2;
            data[i] ^= 0x01;
        }
        Ok(())
    }

    /// A ranged read of `path` by `read` (given the inner storage), after the injected latency
    /// and stall, which wait on the I/O runtime's timer (the reads in flight on one fetch worker
    /// each wait out their own round trip, as they would on a network); recorded as `what` and
    /// mangled as the faults say.
    async fn ranged<'a>(
        &'a self,
        what: &str,
        path: String,
        read: impl FnOnce(&'a S, String) -> BoxFuture<'a, Result<Vec<u8>>>,
    ) -> Result<Vec<u8>> {
        let start = Instant::now();
        if !self.faults.latency.is_zero() {
            tokio::time::sleep(self.faults.latency).await;
        }
        if self.faults.stall_path.as_deref().is_some_and(|p| path.contains(p)) {
            tokio::time::sleep(self.faults.stall_for).await;
        }
        let got = read(&self.inner, path.clone()).await;
        self.trace.record(|| format!("{what} {path}"), start);
        let mut buf = got?;
        self.mangle(&path, &mut buf, true)?;
        Ok(buf)
    }
}

impl<S: Storage> Storage for FaultyStorage<S> {
    fn location(&self) -> &str {
        self.inner.location()
    }

    fn read(&self, path: &str) -> Result<Vec<u8>> {
        let mut data = self.request("read", path, || {
            self.stall(&self.faults.stall_read, path);
            self.inner.read(path)
        })?;
        self.mangle(path, &mut data, false)?;
        Ok(data)
    }

    // Faults land in the caller's buffer, so the layer keeps the backend's own way of reading.
    fn read_range_into(&self, path: &str, offset: u64, len: u64, buf: &mut Vec<u8>) -> Result<()> {
        self.request("read range of", path, || {
            self.stall(&self.faults.stall_path, path);
            self.inner.read_range_into(path, offset, len, buf)
        })?;
        self.mangle(path, buf, true)
    }

    fn read_range_async(&self, path: String, offset: u64, len: u64, buf: Vec<u8>) -> BoxFuture<'_, Result<Vec<u8>>> {
        Box::pin(self.ranged("read range of", path, move |inner, path| inner.read_range_async(path, offset, len, buf)))
    }

    // The ranges are requested at once: they wait out one round trip together.
    fn read_ranges_async(&self, path: String, ranges: Vec<(u64, u64)>, buf: Vec<u8>) -> BoxFuture<'_, Result<Vec<u8>>> {
        Box::pin(self.ranged("read ranges of", path, move |inner, path| inner.read_ranges_async(path, ranges, buf)))
    }

    fn write(&self, path: &str, data: Vec<u8>) -> Result<()> {
        self.request("write", path, || {
            self.stall(&self.faults.stall_write, path);
            self.inner.write(path, data)
        })
    }

    fn list(&self, dir: &str) -> Result<Vec<ObjectInfo>> {
        self.request("list", dir, || self.inner.list(dir))
    }

    fn delete(&self, path: &str) -> Result<()> {
        self.request("delete", path, || {
            self.stall(&self.faults.stall_delete, path);
            self.inner.delete(path)
        })
    }

    fn exists(&self, path: &str) -> Result<bool> {
        self.request("exists", path, || self.inner.exists(path))
    }

    fn create(&self) -> Result<()> {
        self.delay();
        self.inner.create()
    }

    fn default_concurrency(&self) -> usize {
        self.inner.default_concurrency()
    }

    fn is_remote(&self) -> bool {
        self.inner.is_remote()
    }

    fn trace(&self) -> Option<&RequestTrace> {
        Some(&self.trace)
    }

    fn provenance(&self) -> super::Provenance {
        self.inner.provenance()
    }

    fn remove_stale_temporaries(&self, age: Duration) -> Result<usize> {
        self.delay();
        self.inner.remove_stale_temporaries(age)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_spec() {
        let f = Faults::parse(
            "latency=50ms, fail-every=3,stall=data/,stall-for=2s,stall-write=snapshots/,stall-read=index/",
        )
        .unwrap();
        assert_eq!(f.stall_read.as_deref(), Some("index/"));
        assert_eq!(f.stall_write.as_deref(), Some("snapshots/"));
        assert_eq!(f.latency, Duration::from_millis(50));
        assert_eq!(f.fail_every, 3);
        assert_eq!(f.stall_path.as_deref(), Some("data/"));
        assert_eq!(f.stall_for, Duration::from_secs(2));
        assert!(Faults::parse("nonsense=1").is_err());
    }
}
