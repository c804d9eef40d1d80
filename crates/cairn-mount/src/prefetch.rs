//! Read-ahead for the whole mount: one long-lived read pipeline ([`cairn_core::engine::read`]: fetch
//! workers, decode workers, verified blobs into the [`BlobCache`]) fed from a queue of
//! [`Stream`]s, each an ordered list of blobs some reader will want and how far that reader has
//! got.
//!
//! A stream's blobs are planned lazily by its [`Source`] (a large file's chunks; the small files
//! met walking a snapshot's tree from the file opened on, across directories), into coalesced
//! reads ([`ordered_reads`]), and handed to the pipeline at most a window of bytes ahead of its
//! reader ([`Stream::want`] moves the reader on). The pipeline takes the next read from the most
//! recently used stream that has one within its window, so it never drains between files or
//! directories; when nothing is wanted it waits, its workers idle. A stream that is no longer
//! read is cancelled: nothing more of it is fetched, and the blobs it brought that its reader
//! never reached leave the cache.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use cairn_core::engine::read::{
    coalesce, coalesce_gap, ordered_reads, Decoded, PackRead, Plain, Queued, ReadRef, Reader, Sink, Slots,
};
use cairn_core::engine::repository::Repository;
use cairn_core::error::{Error, Result};
use cairn_format::id::BlobId;
use cairn_format::pack::BlobEntry;

use crate::cache::BlobCache;

/// Reads one session of the pipeline hands out before its workers start anew (bounds the
/// memory of the reads handed out; see [`Slots`]).
const SESSION_READS: usize = 4096;

/// The pipeline's limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Bytes in flight in the pipeline (fetched ranges plus their plaintext).
    pub budget: u64,
    /// Bytes (ranges plus plaintext) one stream may have handed out beyond its reader.
    pub window: u64,
    /// Reads in flight.
    pub fetchers: usize,
    /// Decode workers.
    pub decoders: usize,
    /// Reads in the download limit's foreground lane (a live restore's export: what its
    /// client waits for goes ahead of the background restore).
    pub foreground: bool,
}

/// What plans a stream's blobs, a batch at a time, in the order its reader will want them.
pub trait Source: Send {
    /// The next blobs, or `None` when there are no more.
    fn more(&mut self) -> Option<Vec<BlobId>>;

    /// Whether the blobs of one batch may be fetched in any order (all of them are wanted
    /// soon: the files of a walk), so they are read in pack order, coalesced as a restore's
    /// are, instead of in the order given (a large file read from start to end).
    fn batch_in_any_order(&self) -> bool {
        false
    }
}

/// A source of one list of blobs, planned at once (a large file from the chunk being read).
pub struct Blobs(pub Option<Vec<BlobId>>);

impl Source for Blobs {
    fn more(&mut self) -> Option<Vec<BlobId>> {
        self.0.take()
    }
}

/// The mount's read pipeline. Dropping it stops the pipeline and waits for its workers.
pub struct Prefetch {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// What the pipeline and the streams share.
struct Shared {
    repo: Arc<Repository>,
    cache: Arc<BlobCache>,
    limits: Limits,
    queue: Mutex<Queue>,
    /// Signalled when a stream is added or its reader moves on, and on stop.
    work: Condvar,
    stopped: Arc<AtomicBool>,
    /// Blobs handed to the pipeline and not yet delivered or failed.
    in_flight: Mutex<InFlight>,
}

/// Blobs in the pipeline.
#[derive(Default)]
struct InFlight {
    /// How many times each is in flight.
    count: HashMap<BlobId, u32>,
    /// Those read for a stream cancelled since: not kept when they arrive.
    unwanted: HashSet<BlobId>,
}

struct Queue {
    streams: Vec<Arc<Stream>>,
    /// Bumped with every change a waiting pipeline should look at.
    changes: u64,
    /// Use counter: the most recently used stream is served first.
    tick: u64,
}

impl Prefetch {
    /// Starts the pipeline reading `repo` into `cache`.
    pub fn start(repo: Arc<Repository>, cache: Arc<BlobCache>, limits: Limits) -> Result<Self> {
        let shared = Arc::new(Shared {
            repo,
            cache,
            limits,
            queue: Mutex::new(Queue { streams: Vec::new(), changes: 0, tick: 0 }),
            work: Condvar::new(),
            stopped: Arc::new(AtomicBool::new(false)),
            in_flight: Mutex::default(),
        });
        let run = shared.clone();
        let thread = std::thread::Builder::new()
            .name("cairn-prefetch".into())
            .spawn(move || run.run())
            .map_err(|e| Error::Internal(format!("cannot start the read-ahead thread: {e}")))?;
        Ok(Prefetch { shared, thread: Some(thread) })
    }

    /// A new stream of the blobs `source` plans, served from now on (most recently used first).
    pub fn stream(&self, source: Box<dyn Source>) -> Arc<Stream> {
        let stream = Arc::new(Stream {
            shared: self.shared.clone(),
            state: Mutex::new(Planned::default()),
            source: Mutex::new(Some(source)),
            cancelled: AtomicBool::new(false),
        });
        let mut q = self.shared.queue.lock().expect("queue lock");
        q.tick += 1;
        stream.state.lock().expect("stream lock").used = q.tick;
        q.streams.push(stream.clone());
        q.changes += 1;
        drop(q);
        self.shared.work.notify_all();
        stream
    }

    /// Streams being served.
    #[cfg(test)]
    fn streams(&self) -> usize {
        self.shared.queue.lock().expect("queue lock").streams.len()
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::Release);
        {
            let mut q = self.shared.queue.lock().expect("queue lock");
            q.streams.clear(); // they hold the shared state: no cycle is left
            q.changes += 1;
        }
        self.shared.work.notify_all();
        self.shared.cache.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    /// The pipeline: sessions of one long-lived reader, each fed from the streams.
    fn run(&self) {
        let reader =
            Reader::new(&self.repo, self.limits.budget, self.stopped.clone()).in_foreground(self.limits.foreground);
        let mut slots = Slots::new(SESSION_READS);
        while !self.stopped.load(Ordering::Acquire) {
            std::thread::scope(|s| {
                let feed = Queued::new(&mut slots, || self.next_read());
                let sink = ToCache { shared: self };
                for w in reader.start(s, feed, self.limits.fetchers, self.limits.decoders, sink) {
                    let _ = w.join();
                }
            });
        }
    }

    /// The next read to fetch: from the most recently used stream that has one within its
    /// window; waits until one has. `None` once stopped.
    fn next_read(&self) -> Option<PackRead> {
        loop {
            let (mut streams, seen) = {
                let q = self.queue.lock().expect("queue lock");
                (q.streams.clone(), q.changes)
            };
            if self.stopped.load(Ordering::Acquire) {
                return None;
            }
            streams.sort_by_key(|s| std::cmp::Reverse(s.state.lock().expect("stream lock").used));
            for s in streams {
                if let Some(read) = s.next_read() {
                    let mut f = self.in_flight.lock().expect("in-flight lock");
                    // Cancelled since it handed the read out: its `forget` has run (it sets the
                    // flag first, then takes this lock) and did not see these blobs in flight,
                    // so they would be kept. The read is dropped instead.
                    if s.cancelled.load(Ordering::Acquire) {
                        continue;
                    }
                    for b in &read.blobs {
                        *f.count.entry(b.id).or_insert(0) += 1;
                        f.unwanted.remove(&b.id);
                    }
                    return Some(read);
                }
            }
            let q = self.queue.lock().expect("queue lock");
            if q.changes == seen {
                // A stream planning lazily may also become ready without a change: look again
                // now and then.
                drop(self.work.wait_timeout(q, Duration::from_millis(100)).expect("queue lock"));
            }
        }
    }

    /// Blob `id` left the pipeline, verified (`plain`) or failed: into the cache unless its
    /// stream was cancelled since, then no longer in flight (in this order, under the lock: a
    /// reader that finds a blob neither in flight nor cached knows it will not come).
    fn arrived(&self, id: BlobId, plain: Option<Vec<u8>>) {
        let mut f = self.in_flight.lock().expect("in-flight lock");
        if let Some(plain) = plain.filter(|_| !f.unwanted.contains(&id)) {
            self.cache.insert(id, Arc::new(plain));
        }
        if let Some(n) = f.count.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                f.count.remove(&id);
                f.unwanted.remove(&id);
            }
        }
    }

    fn is_in_flight(&self, id: &BlobId) -> bool {
        self.in_flight.lock().expect("in-flight lock").count.contains_key(id)
    }

    /// Drops `ids` from the cache, and those still in flight when they arrive.
    fn forget(&self, ids: &[BlobId]) {
        let mut f = self.in_flight.lock().expect("in-flight lock");
        let (coming, here): (Vec<BlobId>, Vec<BlobId>) = ids.iter().partition(|id| f.count.contains_key(id));
        f.unwanted.extend(coming);
        self.cache.remove(&here);
    }

    /// Blobs in flight.
    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.in_flight.lock().expect("in-flight lock").count.len()
    }
}

/// One ordered list of blobs a reader will want, handed to the pipeline a window ahead of it.
pub struct Stream {
    shared: Arc<Shared>,
    state: Mutex<Planned>,
    /// `None` once it has planned everything.
    source: Mutex<Option<Box<dyn Source>>>,
    cancelled: AtomicBool,
}

/// A stream's planned reads and where its reader is.
#[derive(Default)]
struct Planned {
    /// Planned reads not handed out yet; the first is read number `sent`.
    reads: VecDeque<PackRead>,
    /// Reads handed out (or skipped because the reader went past them).
    sent: usize,
    /// Where each planned blob is (its first place, if it comes more than once).
    positions: HashMap<BlobId, Place>,
    /// Bytes (range plus plaintext) of all planned reads up to the end of each.
    ends: Vec<u64>,
    /// For each planned read, the read after the last one of its batch.
    batch_ends: Vec<usize>,
    /// The read the reader wants now.
    reached: usize,
    /// When it was last used (the queue's tick).
    used: u64,
}

/// Where a planned blob is: the read (number) that brings it, and the first read of its batch
/// (a reader that wants it has reached that: the reads of a batch come in pack order).
#[derive(Clone, Copy)]
struct Place {
    read: usize,
    batch: usize,
}

impl Planned {
    /// Bytes of the reads before read `n`.
    fn before(&self, n: usize) -> u64 {
        n.checked_sub(1).map_or(0, |i| self.ends[i])
    }
}

impl Stream {
    /// Whether this stream brings blob `id` (it was planned).
    pub fn covers(&self, id: &BlobId) -> bool {
        self.state.lock().expect("stream lock").positions.contains_key(id)
    }

    /// The reader wants blob `id` now: the window moves up to it (never back), and the stream
    /// becomes the most recently used. Returns false if this stream does not bring it.
    pub fn want(&self, id: &BlobId) -> bool {
        let mut st = self.state.lock().expect("stream lock");
        let Some(at) = st.positions.get(id).map(|p| p.batch) else { return false };
        let moved = at > st.reached;
        if moved {
            st.reached = at;
        }
        drop(st);
        let mut q = self.shared.queue.lock().expect("queue lock");
        q.tick += 1;
        let tick = q.tick;
        if moved {
            q.changes += 1;
        }
        drop(q);
        self.state.lock().expect("stream lock").used = tick;
        if moved {
            self.shared.work.notify_all();
        }
        true
    }

    /// Whether a reader waiting for blob `id` should stop waiting: the stream was cancelled or
    /// the pipeline stopped, it does not bring the blob, or it handed the blob out and the
    /// blob came back (delivered — maybe evicted since — or failed) or it skipped it.
    pub fn gave_up(&self, id: &BlobId) -> bool {
        if self.cancelled.load(Ordering::Acquire) || self.shared.stopped.load(Ordering::Acquire) {
            return true;
        }
        let st = self.state.lock().expect("stream lock");
        match st.positions.get(id) {
            None => true,
            Some(p) if p.read < st.sent => {
                drop(st);
                !self.shared.is_in_flight(id)
            }
            Some(_) => false,
        }
    }

    /// Stops the stream: nothing more of it is fetched. With `forget`, the blobs it delivered
    /// that its reader never reached leave the cache (their share of it goes to the streams
    /// still read).
    pub fn cancel(&self, forget: bool) {
        if self.cancelled.swap(true, Ordering::AcqRel) {
            return;
        }
        {
            let mut q = self.shared.queue.lock().expect("queue lock");
            q.streams.retain(|s| !std::ptr::eq(&**s, self));
            q.changes += 1;
        }
        self.shared.cache.wake();
        if !forget {
            return;
        }
        let st = self.state.lock().expect("stream lock");
        let unread: Vec<BlobId> =
            st.positions.iter().filter(|(_, p)| p.batch > st.reached && p.read < st.sent).map(|(id, _)| *id).collect();
        drop(st);
        self.shared.forget(&unread);
    }

    /// The next read to hand out if it is within the window (planning more first if needed).
    fn next_read(&self) -> Option<PackRead> {
        let window = self.shared.limits.window;
        loop {
            if self.cancelled.load(Ordering::Acquire) {
                return None;
            }
            let mut st = self.state.lock().expect("stream lock");
            // Reads the reader went past are not fetched.
            while st.sent < st.reached && !st.reads.is_empty() {
                st.reads.pop_front();
                st.sent += 1;
            }
            let ahead = |st: &Planned, n: usize| st.before(n + 1) - st.before(st.reached.min(n));
            let unsent = st.ends.last().copied().unwrap_or(0) - st.before(st.sent);
            // Plan at least a window beyond what is handed out (so a reader finds the files it
            // opens planned), unless everything is.
            if unsent < window || st.reads.is_empty() {
                drop(st);
                if self.plan() {
                    continue;
                }
                st = self.state.lock().expect("stream lock");
            }
            if st.reads.is_empty() {
                return None;
            }
            // The reader's whole batch may go (its reads come in pack order, the one the reader
            // is at maybe last), then reads up to a window beyond the reader.
            let n = st.sent;
            let batch_end = st.batch_ends.get(st.reached).copied().unwrap_or(0);
            if n > st.reached && n >= batch_end && ahead(&st, n) > window {
                return None;
            }
            st.sent += 1;
            return st.reads.pop_front();
        }
    }

    /// Plans the source's next blobs; false if it has no more.
    fn plan(&self) -> bool {
        let mut source = self.source.lock().expect("source lock");
        let Some(blobs) = source.as_mut().and_then(|s| s.more()) else {
            *source = None;
            return false;
        };
        let any_order = source.as_ref().is_some_and(|s| s.batch_in_any_order());
        let (repo, gap) = (&self.shared.repo, coalesce_gap(&self.shared.repo));
        let reads = if any_order {
            // Each blob once, in pack order. A blob missing from the index is reported when its
            // file is read.
            let index = repo.index();
            let mut seen = HashSet::with_capacity(blobs.len());
            let located = blobs.iter().filter(|b| seen.insert(**b)).filter_map(|b| index.get(b)).collect();
            coalesce(located, self.shared.limits.budget, gap)
        } else {
            ordered_reads(&repo.index(), &blobs, gap).unwrap_or_else(|_| known_only(repo, &blobs))
        };
        let mut st = self.state.lock().expect("stream lock");
        let batch = st.ends.len();
        for r in reads {
            let n = st.ends.len();
            for b in &r.blobs {
                st.positions.entry(b.id).or_insert(Place { read: n, batch: if any_order { batch } else { n } });
            }
            let end = st.before(n) + r.length + r.raw_bytes();
            st.ends.push(end);
            st.batch_ends.push(n + 1);
            st.reads.push_back(r);
        }
        if any_order {
            let end = st.ends.len();
            st.batch_ends[batch..].fill(end);
        }
        true
    }
}

/// The reads of the blobs of `blobs` that the index lists.
fn known_only(repo: &Repository, blobs: &[BlobId]) -> Vec<PackRead> {
    let index = repo.index();
    let known: Vec<BlobId> = blobs.iter().filter(|b| index.get(b).is_some()).copied().collect();
    ordered_reads(&index, &known, coalesce_gap(repo)).unwrap_or_default()
}

/// The pipeline's end: every verified blob into the cache.
#[derive(Clone)]
struct ToCache<'s> {
    shared: &'s Shared,
}

impl<'s> Sink<'s> for ToCache<'s> {
    fn blobs(&self, _read: ReadRef<'s>, blobs: Vec<Decoded<'s>>) -> bool {
        for Decoded { id, data, .. } in blobs {
            let plain = match data {
                Plain::Own(v) => v,
                in_read => in_read.to_vec(),
            };
            self.shared.arrived(id, Some(plain));
        }
        true
    }

    fn failed(&self, _read: ReadRef<'s>, blob: &BlobEntry, _why: &Error) {
        // The reader reads it again on its own and reports the error then.
        self.shared.arrived(blob.id, None);
        self.shared.cache.wake();
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Instant;

    use cairn_core::commands::backup::{backup, BackupOptions, Progress};
    use cairn_core::engine::repository::InitOptions;
    use cairn_core::engine::storage::OpendalStorage;
    use cairn_format::keyfile::KdfParams;
    use cairn_format::tree::NodeKind;

    use super::*;
    use crate::walk::data_blobs;

    /// A repository holding one backup of 24 files of 40 KB (distinct random bytes, one blob
    /// each with 64 KiB chunks), and their blobs in pack order (which a parallel backup does
    /// not keep in file order: every other blob of this list is 40 KB from the next, every other
    /// one of the files' list may not be).
    fn repository(dir: &Path) -> (Arc<Repository>, Vec<BlobId>) {
        let src = dir.join("src");
        std::fs::create_dir_all(&src).unwrap();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for f in 0..24 {
            let bytes: Vec<u8> = (0..40_000)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            std::fs::write(src.join(format!("f{f:02}")), bytes).unwrap();
        }
        let storage = Arc::new(OpendalStorage::local(dir.join("repo").to_str().unwrap()).unwrap());
        let kdf = KdfParams { memory_kib: 8, iterations: 1, parallelism: 1 };
        let opts = InitOptions { kdf, chunk_sizes: (65_536, 131_072, 524_288), ..InitOptions::default() };
        let repo = Repository::init(storage, b"pw", &opts).unwrap();
        let done = backup(&repo, &[src], &BackupOptions::default(), &Progress::default()).unwrap();
        repo.load_index().unwrap();
        let mut blobs = Vec::new();
        let mut dirs = vec![done.snapshot.tree];
        while let Some(t) = dirs.pop() {
            for n in repo.read_tree(&t).unwrap().nodes {
                match n.kind {
                    NodeKind::Dir => dirs.extend(n.subtree),
                    _ => blobs.extend(data_blobs(&n.content)),
                }
            }
        }
        assert_eq!(blobs.len(), 24);
        blobs.sort_by_key(|b| {
            let loc = repo.index().get(b).unwrap();
            (loc.pack_no, loc.entry.offset)
        });
        (Arc::new(repo), blobs)
    }

    /// One blob a read (no coalescing across a 40 KB blob: a window of `window` bytes holds
    /// about `window / 80_000` reads).
    fn prefetch(repo: &Arc<Repository>, window: u64) -> (Prefetch, Arc<BlobCache>) {
        let cache = Arc::new(BlobCache::new(64 << 20));
        let limits = Limits { budget: 32 << 20, window, fetchers: 2, decoders: 1, foreground: false };
        (Prefetch::start(repo.clone(), cache.clone(), limits).unwrap(), cache)
    }

    fn until(what: &str, done: impl Fn() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(start.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_stream_stays_its_window_ahead_of_its_reader_and_skips_what_the_reader_passed() {
        let dir = tempfile::tempdir().unwrap();
        let (repo, blobs) = repository(dir.path());
        // Stored blobs are about 40 KB of range and 40 KB of plaintext: a window of 250 KB
        // holds three reads.
        let (p, cache) = prefetch(&repo, 250_000);
        // Coalesced reads of one pack put several blobs in one read: keep them apart by asking
        // for every other blob.
        let wanted: Vec<BlobId> = blobs.iter().step_by(2).copied().collect();
        let s = p.stream(Box::new(Blobs(Some(wanted.clone()))));
        until("the first blobs", || cache.get(&wanted[0]).is_some());
        std::thread::sleep(Duration::from_millis(300));
        let here = |b: &[BlobId]| b.iter().filter(|id| cache.get(id).is_some()).count();
        assert!(here(&wanted) <= 4, "{} blobs read ahead, the window holds 3 or 4", here(&wanted));
        assert!(!s.gave_up(&wanted[8]), "not read yet, but it will be");
        // The reader jumps to blob 8: it and the window after it come, blobs 4 to 7 never.
        assert!(s.want(&wanted[8]));
        until("blob 8", || cache.get(&wanted[8]).is_some());
        until("the window after blob 8", || cache.get(&wanted[9]).is_some());
        assert_eq!(here(&wanted[4..8]), 0, "passed blobs are not fetched");
        assert!(s.gave_up(&wanted[5]), "a reader waiting for a skipped blob reads it itself");
        assert!(!s.covers(&blobs[1]) && s.gave_up(&blobs[1]));
    }

    /// A batch of blobs wanted in any order (as a walk's).
    struct AnyOrder(Option<Vec<BlobId>>);

    impl Source for AnyOrder {
        fn more(&mut self) -> Option<Vec<BlobId>> {
            self.0.take()
        }

        fn batch_in_any_order(&self) -> bool {
            true
        }
    }

    #[test]
    fn a_walk_batch_is_read_in_pack_order_and_whole_when_its_reader_wants_any_of_it() {
        let dir = tempfile::tempdir().unwrap();
        let (repo, blobs) = repository(dir.path());
        // A window smaller than the batch.
        let (p, cache) = prefetch(&repo, 500_000);
        let in_pack = blobs;
        // Every other blob (12 reads of one blob: the gaps are too wide to merge, 960 KB in
        // all), given in the reverse of their order in the pack.
        let given: Vec<BlobId> = in_pack.iter().step_by(2).rev().copied().collect();
        let s = p.stream(Box::new(AnyOrder(Some(given.clone()))));
        // The reader wants the batch's last blob in the pack first: the reads before it are not
        // passed over, and the whole batch comes although it is larger than the window.
        until("the batch planned", || s.covers(&given[0]));
        assert!(s.want(&given[0]));
        let here = |b: &[BlobId]| b.iter().filter(|id| cache.get(id).is_some()).count();
        until("the whole batch", || here(&given) == given.len());
        assert_eq!(s.state.lock().unwrap().ends.len(), 12);
        // All 24 blobs in reverse: in the order given each would be a read of its own; in pack
        // order they merge.
        let all: Vec<BlobId> = in_pack.iter().rev().copied().collect();
        let t = p.stream(Box::new(AnyOrder(Some(all.clone()))));
        until("the second batch planned", || t.covers(&all[0]));
        let reads = t.state.lock().unwrap().ends.len();
        assert!(reads <= 2, "24 neighbouring blobs of one pack in {reads} reads");
    }

    #[test]
    fn a_cancelled_stream_fetches_nothing_more_and_frees_its_cache_share() {
        let dir = tempfile::tempdir().unwrap();
        let (repo, blobs) = repository(dir.path());
        let (p, cache) = prefetch(&repo, 500_000);
        let wanted: Vec<BlobId> = blobs.iter().step_by(2).copied().collect();
        let s = p.stream(Box::new(Blobs(Some(wanted.clone()))));
        let here = |b: &[BlobId]| b.iter().filter(|id| cache.get(id).is_some()).count();
        until("a window of blobs", || here(&wanted) >= 5);
        assert_eq!(p.streams(), 1);
        s.cancel(true);
        assert_eq!(p.streams(), 0);
        assert!(s.gave_up(&wanted[11]));
        until("the reads in flight", || p.shared.in_flight() == 0);
        std::thread::sleep(Duration::from_millis(200));
        // Only the blob its reader was at stays; nothing beyond the window was fetched.
        assert_eq!(here(&wanted), 1);
        assert!(cache.get(&wanted[0]).is_some());
        assert_eq!(cache.bytes(), 40_000);
        // Another stream is served as before.
        let t = p.stream(Box::new(Blobs(Some(vec![wanted[11]]))));
        until("a new stream's blob", || cache.get(&wanted[11]).is_some());
        assert!(t.gave_up(&wanted[11]) && !t.cancelled.load(Ordering::Relaxed));
    }
}
