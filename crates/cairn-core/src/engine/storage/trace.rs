//! A record of requests, to count the round trips a command waits for one after another before
//! its first data fetch (the fault layer keeps one; issue #18: at most 5).
//!
//! Two requests are *serial* when the second started after the first had finished: it could
//! have waited for it. The longest chain of such requests that ended before the first data
//! fetch started is the critical path a high-latency link pays for in full before data flows;
//! requests sent side by side count once.

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// One request: what it was, when it started and ended.
#[derive(Clone, Debug)]
struct Request {
    what: String,
    start: Instant,
    end: Instant,
}

/// Requests recorded until the first data fetch starts (after that nothing more is kept, so a
/// long restore does not grow the record).
#[derive(Default)]
pub struct RequestTrace {
    requests: Mutex<Vec<Request>>,
    first_data: OnceLock<Instant>,
}

impl RequestTrace {
    /// Records a request `what` (an operation and a path) that ran from `start` until now, if
    /// it started before the first data fetch.
    pub fn record(&self, what: impl FnOnce() -> String, start: Instant) {
        if self.first_data.get().is_some_and(|t| *t <= start) {
            return;
        }
        let end = Instant::now();
        self.requests.lock().expect("trace lock").push(Request { what: what(), start, end });
    }

    /// The first ranged read of file data (not of trees) is starting now; the first call wins.
    pub fn data_fetch_starts(&self) {
        let _ = self.first_data.set(Instant::now());
    }

    /// The longest chain of requests, each started after the one before it ended, that all
    /// ended before the first data fetch started (before now, if none has): oldest first, each
    /// request's operation and path with its start and end, and when the first data fetch
    /// started, as times since the first request recorded started — how long a command waited
    /// before data flowed, and what for.
    pub fn critical_path(&self) -> CriticalPath {
        let before = self.first_data.get().copied().unwrap_or_else(Instant::now);
        let requests = self.requests.lock().expect("trace lock");
        let Some(t0) = requests.iter().map(|r| r.start).min() else {
            return CriticalPath { chain: Vec::new(), first_data: self.first_data.get().map(|_| Duration::ZERO) };
        };
        let mut done: Vec<&Request> = requests.iter().filter(|r| r.end <= before).collect();
        done.sort_by_key(|r| r.start);
        let since = |t: Instant| t.saturating_duration_since(t0);
        let chain = longest_chain(&done)
            .into_iter()
            .map(|i| Step { what: done[i].what.clone(), start: since(done[i].start), end: since(done[i].end) })
            .collect();
        CriticalPath { chain, first_data: self.first_data.get().map(|&t| since(t)) }
    }

    /// Whether the first data fetch has started.
    pub fn data_fetched(&self) -> bool {
        self.first_data.get().is_some()
    }
}

/// One request of a [`CriticalPath`]; times since the first request recorded started.
#[derive(Clone, Debug)]
pub struct Step {
    pub what: String,
    pub start: Duration,
    pub end: Duration,
}

/// The requests waited for one after another before the first data fetch.
#[derive(Clone, Debug)]
pub struct CriticalPath {
    /// Oldest first.
    pub chain: Vec<Step>,
    /// When the first data fetch started (none has yet: `None`).
    pub first_data: Option<Duration>,
}

/// Indices of the longest chain in `requests` (sorted by start) where each starts no earlier
/// than the one before it ended.
fn longest_chain(requests: &[&Request]) -> Vec<usize> {
    // length[i]: the longest chain ending with request i; prev[i]: the one before it there.
    let mut length = vec![0usize; requests.len()];
    let mut prev = vec![None; requests.len()];
    for i in 0..requests.len() {
        length[i] = 1;
        // Every request that ended before i started also started before it: it comes earlier.
        for j in 0..i {
            if requests[j].end <= requests[i].start && length[j] + 1 > length[i] {
                length[i] = length[j] + 1;
                prev[i] = Some(j);
            }
        }
    }
    let Some(mut at) = (0..requests.len()).max_by_key(|&i| length[i]) else { return Vec::new() };
    let mut chain = vec![at];
    while let Some(p) = prev[at] {
        chain.push(p);
        at = p;
    }
    chain.reverse();
    chain
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_side_by_side_count_once_and_serial_ones_add_up() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let req = |what: &str, s, e| Request { what: what.into(), start: at(s), end: at(e) };
        // keys listed beside index listing; key read after both; two trees one after another;
        // the lock's write overlaps the key read.
        let requests = [
            req("list keys", 0, 50),
            req("list index", 1, 51),
            req("write lock", 2, 52),
            req("read key", 52, 102),
            req("read index", 53, 103),
            req("tree 1", 110, 160),
            req("tree 2", 161, 211),
        ];
        let refs: Vec<&Request> = requests.iter().collect();
        let chain: Vec<&str> = longest_chain(&refs).iter().map(|&i| requests[i].what.as_str()).collect();
        assert_eq!(chain.len(), 4);
        assert_eq!(chain[2..], ["tree 1", "tree 2"]);
        assert!(longest_chain(&[]).is_empty());
    }

    #[test]
    fn only_requests_before_the_first_data_fetch_count() {
        let trace = RequestTrace::default();
        let t = Instant::now();
        trace.record(|| "list keys/".into(), t);
        let t = Instant::now();
        trace.record(|| "read keys/1".into(), t);
        trace.data_fetch_starts();
        assert!(trace.data_fetched());
        let t = Instant::now();
        trace.record(|| "read data/1".into(), t);
        let timed = trace.critical_path();
        let whats: Vec<&str> = timed.chain.iter().map(|s| s.what.as_str()).collect();
        assert_eq!(whats, ["list keys/", "read keys/1"]);
        // Timed from the first request's start: in order, the data fetch after the chain.
        assert_eq!(timed.chain[0].start, Duration::ZERO);
        assert!(timed.chain[0].end <= timed.chain[1].start && timed.chain[1].start <= timed.chain[1].end);
        assert!(timed.first_data.unwrap() >= timed.chain[1].end);
        assert!(RequestTrace::default().critical_path().chain.is_empty());
    }
}
