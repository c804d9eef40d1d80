//! The read path: `plan → fetch → decode`, the one way every command reads blobs from packs.
//!
//! Restore, dump and check all go through it: the caller plans ranged, coalesced reads of packs
//! ([`coalesce`], or whole packs for a data check), a [`Reader`] runs fetch workers that keep
//! many reads in flight, each reserved against a byte budget first, and decode workers that
//! decrypt, decompress and recompute every blob's ID on a CPU pool. What happens to each
//! verified blob is the caller's [`Sink`]: a restore hands it to its writers, a dump to the
//! stream in order, a check counts it.
//!
//! ```text
//!   reads ─▶ fetch (N in flight, budget) ─▶ decode (CPU pool, verify) ─▶ Sink
//!                 ▲
//!            tune (N from throughput, latency, pressure)
//! ```
//!
//! N is the caller's, or — [`Reader::auto_tuned`] — moved while reading by `tune.rs`.

mod buffers;
mod decode;
mod fetch;
mod gap;
mod pace;
mod queue;
mod tune;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::bounded;

pub use buffers::{Buf, BufferPool};
pub use decode::{Decoded, Plain};
pub use gap::{gap_within, link_gap, GapChoice, LinkCost, PRIOR_RATE};
pub use pace::{ordered_reads, Pace, Paced};
pub use queue::{Queued, Slots};
pub use tune::{Controller as FetchTuner, Step as TuneStep, AUTO_MAX};

use crate::engine::memory::Budget;
use crate::engine::platform::CpuTimes;
use crate::engine::profile::{StageClock, StageTimes};
use crate::engine::repository::Repository;
use crate::error::Error;
use cairn_format::crypto::SALT_LEN;
use cairn_format::id::PackId;
use cairn_format::index::BlobLocation;
use cairn_format::pack::BlobEntry;

/// One ranged read of a pack, covering one or more blobs.
#[derive(Debug)]
pub struct PackRead {
    /// The pack.
    pub pack: PackId,
    /// The pack's salt.
    pub salt: [u8; SALT_LEN],
    /// Where the read starts.
    pub offset: u64,
    /// How much it reads.
    pub length: u64,
    /// The blobs it covers, by offset.
    pub blobs: Vec<BlobEntry>,
    /// Empty: the read is the one range `length` bytes from `offset`. Otherwise the ranges of
    /// the pack it reads, as (offset, length), in order and apart, each holding whole blobs:
    /// `offset` is the first one's, `length` their sum, and the bytes read are theirs back to
    /// back (see [`join_parts`]).
    pub parts: Vec<(u64, u64)>,
}

impl PackRead {
    /// A read of the one range `length` bytes from `offset` of a pack, holding `blobs`.
    pub fn range(pack: PackId, salt: [u8; SALT_LEN], offset: u64, length: u64, blobs: Vec<BlobEntry>) -> Self {
        PackRead { pack, salt, offset, length, blobs, parts: Vec::new() }
    }

    /// Plaintext bytes the blobs of this read decode to.
    pub fn raw_bytes(&self) -> u64 {
        self.blobs.iter().map(|b| u64::from(b.raw_length)).sum()
    }

    /// Where the byte at `offset` of the pack (one of this read's) is among the bytes it read.
    pub fn position(&self, offset: u64) -> usize {
        let mut before = 0;
        for &(start, len) in &self.parts {
            if (start..start + len).contains(&offset) {
                return (before + offset - start) as usize;
            }
            before += len;
        }
        debug_assert!(self.parts.is_empty(), "offset {offset} is in none of the read's parts");
        offset.saturating_sub(self.offset) as usize
    }
}

/// Reads with at most this gap between them are merged (the gap is read and dropped). On a
/// local disk another read costs little, so little is read in vain (a partial restore of the
/// Linux tree fetched 1.85x the changed chunks' bytes with 64 KiB); a remote request waits a
/// round trip, worth 64 KiB of unneeded bytes.
const LOCAL_GAP: u64 = 4 * 1024;
/// See [`LOCAL_GAP`].
const REMOTE_GAP: u64 = 64 * 1024;

/// The coalescing gap for `repo`'s storage.
pub fn coalesce_gap(repo: &Repository) -> u64 {
    if repo.storage().is_remote() {
        REMOTE_GAP
    } else {
        LOCAL_GAP
    }
}

/// Largest single read, and most plaintext one read decodes to (a restore decodes and writes a
/// read as one batch).
pub const MAX_READ: u64 = 8 * 1024 * 1024;

/// Groups blob locations by pack, sorts them by offset and merges neighbours at most `gap` bytes
/// apart into one read, up to [`MAX_READ`] stored bytes and [`MAX_READ`] of plaintext. A read's
/// reservation (the range plus its plaintext) stays within `budget`, so a small budget really
/// bounds the bytes in flight. A blob that alone exceeds the budget is read on its own.
pub fn coalesce(mut located: Vec<BlobLocation>, budget: u64, gap: u64) -> Vec<PackRead> {
    located.sort_unstable_by_key(|l| (l.pack_no, l.entry.offset));
    let mut reads: Vec<PackRead> = Vec::new();
    let mut raw = 0; // plaintext bytes of the last read's blobs
    let mut last_pack = None;
    for loc in located {
        let b = loc.entry;
        let (start, end) = (u64::from(b.offset), u64::from(b.offset) + u64::from(b.length));
        if let Some(r) = reads.last_mut().filter(|_| last_pack == Some(loc.pack_no)) {
            let r_end = r.offset + r.length;
            let reserved = end - r.offset + raw + u64::from(b.raw_length);
            let fits = end - r.offset <= MAX_READ && raw + u64::from(b.raw_length) <= MAX_READ;
            if start >= r_end && start - r_end <= gap && fits && reserved <= budget {
                r.length = end - r.offset;
                r.blobs.push(b);
                raw += u64::from(b.raw_length);
                continue;
            }
        }
        last_pack = Some(loc.pack_no);
        reads.push(PackRead::range(loc.pack, loc.salt, start, end - start, vec![b]));
        raw = u64::from(b.raw_length);
    }
    reads
}

/// Most ranges one read of several parts covers ([`join_parts`]) from a local storage (a file
/// opened once for all of them) ...
pub const MOST_PARTS: usize = 32;

/// ... and from a remote one, whose ranges are each a request, sent at once: the reads in
/// flight are tuned as reads, so a joined read may not be many of them.
pub const MOST_PARTS_REMOTE: usize = 8;

/// Most ranges one read of several parts covers from `repo`'s storage.
pub fn most_parts(repo: &Repository) -> usize {
    if repo.storage().is_remote() {
        MOST_PARTS_REMOTE
    } else {
        MOST_PARTS
    }
}

/// Joins the reads of one pack that follow each other in `reads` (as [`coalesce`] gives them)
/// into reads of up to `most` ranges each ([`most_parts`]), within [`MAX_READ`] and `budget` as
/// [`coalesce`]'s are, the bytes between them not read. Each such read is one unit of the
/// fetch and decode stages however many requests the storage makes for it
/// ([`Storage::read_ranges_async`](crate::engine::storage::Storage::read_ranges_async)): one
/// wake-up of a fetch worker and of a decoder for all its blobs, which go to the writers in
/// handfuls, not one each.
/// For scattered small blobs that may not be read through (the chunks local data could not
/// supply, the restore plan's `Gap::Within`): restoring `many` with a tenth
/// changed at 20 ms a request, about 90,000 reads of one blob cost fetch, decode and write
/// some 57 us a file against 21 us for a file of a coalesced read.
pub fn join_parts(reads: Vec<PackRead>, budget: u64, most: usize) -> Vec<PackRead> {
    let mut out: Vec<PackRead> = Vec::with_capacity(reads.len());
    let mut last_raw = 0; // plaintext bytes of the last read's blobs
    for read in reads {
        let read_raw = read.raw_bytes();
        if let Some(last) = out.last_mut().filter(|l| l.pack == read.pack) {
            let (length, raw) = (last.length + read.length, last_raw + read_raw);
            let parts = last.parts.len().max(1) + read.parts.len().max(1);
            if parts <= most && length <= MAX_READ && raw <= MAX_READ && length + raw <= budget {
                debug_assert!(last.parts.last().map_or(last.offset + last.length, |p| p.0 + p.1) < read.offset);
                if last.parts.is_empty() {
                    last.parts.push((last.offset, last.length));
                }
                if read.parts.is_empty() {
                    last.parts.push((read.offset, read.length));
                } else {
                    last.parts.extend_from_slice(&read.parts);
                }
                last.length = length;
                last.blobs.extend_from_slice(&read.blobs);
                last_raw = raw;
                continue;
            }
        }
        out.push(read);
        last_raw = read_raw;
    }
    out
}

/// A read as a [`Reader`] hands it to its [`Sink`]: the read, and its place among the reads the
/// feed gave it (0 for the first), so a sink that puts reads back in order knows which one it
/// has. Dereferences to the read.
#[derive(Clone, Copy, Debug)]
pub struct ReadRef<'r> {
    /// The read's place in the feed.
    pub seq: usize,
    /// The read.
    pub read: &'r PackRead,
}

impl std::ops::Deref for ReadRef<'_> {
    type Target = PackRead;

    fn deref(&self) -> &PackRead {
        self.read
    }
}

/// What the caller does with the blobs a [`Reader`] reads. Each fetch and decode worker gets a
/// clone of its own, dropped when the worker ends (so a sink that holds channel senders closes
/// them when reading is over).
pub trait Sink<'r>: Clone + Send + 'r {
    /// The verified blobs of one read, in the read's order (a blob that failed is left out and
    /// was given to [`Sink::failed`]). Returns false to stop this worker (the caller is gone).
    fn blobs(&self, read: ReadRef<'r>, blobs: Vec<Decoded<'r>>) -> bool;

    /// A blob that could not be decoded, even after reading it again.
    fn failed(&self, read: ReadRef<'r>, blob: &BlobEntry, why: &Error);

    /// A read that could not be fetched: by default each of its blobs failed.
    fn read_failed(&self, read: ReadRef<'r>, why: &Error) {
        for b in &read.blobs {
            self.failed(read, b, why);
        }
    }

    /// A read's bytes as fetched, before anything is decrypted (a data check hashes whole packs
    /// here).
    fn fetched(&self, _read: ReadRef<'r>, _bytes: &[u8]) {}

    /// Whether the sink only wants to know that blobs verified, not their plaintext (a data
    /// check). Then each blob is decoded into one reused buffer and dropped, [`Sink::verified`]
    /// is called instead of [`Sink::blobs`], and a read reserves only its range, not its
    /// plaintext (each decode worker reserves its one buffer, grown to the largest blob it met).
    fn verify_only(&self) -> bool {
        false
    }

    /// Whether the sink wants each verified blob's *stored* bytes (decrypted but still
    /// compressed, to copy them into a new pack as they are) instead of its plaintext. Each blob
    /// is still decompressed and its ID recomputed (into one reused buffer) before it is handed
    /// on; a read reserves its range, as for [`Sink::verify_only`].
    fn stored_only(&self) -> bool {
        false
    }

    /// With [`Sink::verify_only`]: this many blobs of `read` verified. Returns false to stop.
    fn verified(&self, _read: ReadRef<'r>, _count: usize) -> bool {
        true
    }
}

/// Whether `sink` keeps no plaintext ([`Sink::verify_only`] or [`Sink::stored_only`]): then a
/// read reserves only its range at the fetch stage, and each decode worker reserves the one
/// buffer it decodes blobs into while it decodes a read.
fn keeps_no_plaintext<'s, S: Sink<'s>>(sink: &S) -> bool {
    sink.verify_only() || sink.stored_only()
}

/// Reads whose blobs average this size or more use the reader's reused buffers (a read of small
/// blobs — source code, a few KiB each — is freed once decoded; pooling it only kept memory idle
/// without saving page faults).
const POOLED_BLOB: u64 = 256 * 1024;

/// The state of one read path: the budget and buffers, the fetch and decode clocks, the count of
/// bytes fetched, and the cancel flag every worker watches.
pub struct Reader<'a> {
    repo: &'a Repository,
    budget: Budget,
    buffers: BufferPool,
    clocks: [StageClock; 2],
    fetched: AtomicU64,
    cancel: Arc<AtomicBool>,
    /// Set by [`Reader::auto_tuned`]: the gate on reads in flight and what the controller did.
    tuning: Option<Tuning>,
    meter: Meter,
    /// Called once every fetch and decode worker of a [`Reader::start`] has ended.
    when_done: Option<&'a (dyn Fn() + Sync)>,
    /// Its workers read in the download limit's foreground lane ([`Reader::in_foreground`]).
    foreground: bool,
    /// Drives the requests of the reads in flight (read/fetch.rs).
    runtime: Arc<tokio::runtime::Runtime>,
    /// Told of each read the feed hands out, so a fetch worker with reads in flight and room for
    /// more takes it without waiting for one of its own to arrive.
    offered: tokio::sync::Notify,
    /// Told by a decode worker of each read it takes from its queue: a fetch worker waiting for
    /// room there tries again (read/fetch.rs).
    room: tokio::sync::Notify,
}

/// The fetch stage's running totals the controller samples.
#[derive(Default)]
struct Meter {
    requests: AtomicU64,
    request_nanos: AtomicU64,
    budget_wait_nanos: AtomicU64,
    reserved: AtomicU64,
    live_fetchers: AtomicUsize,
    /// Fetch and decode workers not ended yet.
    live_workers: AtomicUsize,
    /// Time fetch workers spent blocked handing reads to the decode stage, once for each read
    /// a worker held meanwhile (it has many in flight, read/fetch.rs).
    hand_off_nanos: AtomicU64,
    /// Fetch threads started.
    threads: AtomicUsize,
    /// The most reads in flight at once so far (those in flight now are the fetch clock's
    /// `working`).
    in_flight_peak: AtomicU64,
}

/// An auto-tuned reader's gate and log.
struct Tuning {
    gate: tune::Gate,
    log: Mutex<Vec<tune::Step>>,
    /// The controller: handed in by [`Reader::tuned_from`] (or made when reading starts), and
    /// back once reading ends, for the next reader of the same restore.
    controller: Mutex<Option<tune::Controller>>,
}

impl<'a> Reader<'a> {
    /// A reader of `repo` whose bytes in flight stay within `max_memory`; setting `cancel`
    /// stops it.
    pub fn new(repo: &'a Repository, max_memory: u64, cancel: Arc<AtomicBool>) -> Self {
        Reader {
            repo,
            budget: Budget::new(max_memory),
            buffers: BufferPool::new(max_memory),
            clocks: Default::default(),
            fetched: AtomicU64::new(0),
            cancel,
            tuning: None,
            meter: Meter::default(),
            when_done: None,
            foreground: false,
            runtime: crate::engine::storage::io_runtime().expect("cannot start the I/O runtime"),
            offered: tokio::sync::Notify::new(),
            room: tokio::sync::Notify::new(),
        }
    }

    /// Makes this reader's workers read in the download limit's foreground lane
    /// ([`crate::engine::storage::foreground`]): what a client waits for now, read ahead of
    /// background work sharing the limit.
    pub fn in_foreground(mut self, yes: bool) -> Self {
        self.foreground = yes;
        self
    }

    /// Runs `f` in this reader's lane.
    fn in_lane(&self, f: impl FnOnce()) {
        if self.foreground {
            crate::engine::storage::foreground(f)
        } else {
            f()
        }
    }

    /// Calls `hook` once every fetch and decode worker of [`Reader::start`] has ended, whether
    /// the reads were done, cancelled or refused: this reader reads nothing more (a decode
    /// worker reads a damaged blob again before it ends).
    pub fn when_done(mut self, hook: &'a (dyn Fn() + Sync)) -> Self {
        self.when_done = Some(hook);
        self
    }

    /// A fetch or decode worker ended.
    fn worker_ended(&self) {
        if self.meter.live_workers.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Some(hook) = self.when_done {
                hook();
            }
        }
    }

    /// With `on`, the number of reads in flight is the `fetchers` [`Reader::start`] is given
    /// only at first: it is moved while reading from measured throughput, latency and
    /// downstream pressure, up to [`AUTO_MAX`] and within the budget (see `read/tune.rs`).
    pub fn auto_tuned(mut self, on: bool) -> Self {
        self.tuning =
            on.then(|| Tuning { gate: tune::Gate::new(1), log: Mutex::new(Vec::new()), controller: Mutex::new(None) });
        self
    }

    /// An auto-tuned reader starts from `carried`, the controller a reader before it (of the
    /// same restore: one batch after another) ended with, instead of learning the link again.
    /// Nothing for a reader that is not auto-tuned.
    pub fn tuned_from(self, carried: Option<FetchTuner>) -> Self {
        if let Some(t) = &self.tuning {
            *t.controller.lock().expect("tuner lock") = carried;
        }
        self
    }

    /// The controller as it stands (after reading: where it settled), to hand to the next
    /// reader; `None` when not auto-tuned.
    pub fn tuner(&self) -> Option<FetchTuner> {
        self.tuning.as_ref().and_then(|t| t.controller.lock().expect("tuner lock").clone())
    }

    /// What the controller chose, in order (empty when not auto-tuned).
    pub fn tuning_log(&self) -> Vec<TuneStep> {
        self.tuning.as_ref().map(|t| t.log.lock().expect("tuning log").clone()).unwrap_or_default()
    }

    /// Starts, inside `s`, a feeder that hands `reads` out in order, fetch workers for
    /// `fetchers` reads in flight (at most [`AUTO_MAX`] threads, or a thread per core for a far
    /// link, each carrying its share, read/fetch.rs) and `decoders` decode workers giving blobs
    /// to clones of `sink`. The caller joins the handles (all end once the reads are done, the
    /// reader is cancelled, or the sink refuses).
    pub fn start<'s, S, I>(
        &'s self,
        s: &'s Scope<'s, '_>,
        reads: I,
        fetchers: usize,
        decoders: usize,
        sink: S,
    ) -> Vec<ScopedJoinHandle<'s, ()>>
    where
        S: Sink<'s>,
        I: IntoIterator<Item = &'s PackRead>,
        I::IntoIter: Send + 's,
    {
        let (mut fetchers, decoders) = (fetchers.max(1), decoders.max(1));
        let mut workers = Vec::new();
        if let Some(tuning) = &self.tuning {
            // A controller carried from the reader before starts where it settled.
            let mut carried = tuning.controller.lock().expect("tuner lock");
            let controller = carried.get_or_insert_with(|| tune::Controller::new(fetchers, self.budget.limit()));
            tuning.gate.set_limit(controller.limit());
            fetchers = controller.most().max(fetchers);
        }
        // A near repository (a local disk) is read on the thread that polls the read: a thread
        // for each read in flight. A far one's reads wait on the I/O runtime, not on a thread:
        // a thread per core carries them all (`fetch::far_threads`).
        let threads = if self.repo.link().far() { fetchers.min(fetch::far_threads()) } else { fetchers.min(AUTO_MAX) };
        self.meter.threads.fetch_max(threads, Ordering::Relaxed);
        self.meter.live_fetchers.fetch_add(threads, Ordering::Relaxed);
        self.meter.live_workers.fetch_add(threads + decoders, Ordering::AcqRel);
        if let Some(tuning) = &self.tuning {
            workers.push(spawn_named(s, "tune", move || self.tune(tuning)));
        }
        let (reads_tx, reads_rx) = bounded(fetchers);
        let (fetched_tx, fetched_rx) = bounded(decoders * 4);
        let reads = reads.into_iter();
        workers.push(spawn_named(s, "feed", move || {
            for (seq, read) in reads.enumerate() {
                if self.cancelled() || reads_tx.send(ReadRef { seq, read }).is_err() {
                    break;
                }
                self.offered.notify_one();
            }
        }));
        for i in 0..threads {
            let (rx, tx, sink) = (reads_rx.clone(), fetched_tx.clone(), sink.clone());
            let most = fetchers / threads + usize::from(i < fetchers % threads);
            workers.push(spawn_named(s, "fetch", move || {
                self.in_lane(|| fetch::fetch_worker(self, rx, tx, sink, most));
                self.meter.live_fetchers.fetch_sub(1, Ordering::Relaxed);
                self.worker_ended();
            }));
        }
        for _ in 0..decoders {
            let (rx, sink) = (fetched_rx.clone(), sink.clone());
            workers.push(spawn_named(s, "decode", move || {
                self.in_lane(|| decode::decode_worker(self, rx, sink));
                self.worker_ended();
            }));
        }
        workers
    }

    /// The controller's loop: samples the fetch stage and moves the gate's limit until every
    /// fetch worker has ended.
    fn tune(&self, tuning: &Tuning) {
        // Made when reading started; taken by the one tuning loop of this reader.
        let Some(mut controller) = tuning.controller.lock().expect("tuner lock").take() else { return };
        if let Some(start) = controller.take_start() {
            tuning.log.lock().expect("tuning log").push(start);
        }
        let began = Instant::now();
        let cores = crate::engine::platform::cores();
        let mut last = (Instant::now(), self.totals(), CpuTimes::now());
        let mut latency = Duration::ZERO;
        while self.meter.live_fetchers.load(Ordering::Relaxed) > 0 && !self.cancelled() {
            std::thread::sleep(Duration::from_millis(20));
            let now = Instant::now();
            let totals = self.totals();
            // A sample spans several round trips and as many requests as may be in flight.
            let long_enough = now - last.0 >= SAMPLE_MIN.max(latency * 4);
            let enough = totals.requests - last.1.requests >= controller.limit() as u64;
            if !(long_enough && (enough || now - last.0 >= SAMPLE_MAX)) {
                continue;
            }
            let cpu = CpuTimes::now();
            let mut sample = totals.since(&last.1, now - last.0);
            sample.round_trip = self.repo.link().latency();
            sample.cpu_busy = cpu.busy_since(&last.2, now - last.0, cores);
            latency = sample.request_time.checked_div(sample.requests.max(1) as u32).unwrap_or_default();
            if let Some((limit, reason)) = controller.step(&sample) {
                tuning.gate.set_limit(limit);
                let step = tune::Controller::logged(began.elapsed(), limit, &sample, reason);
                tuning.log.lock().expect("tuning log").push(step);
            }
            last = (now, totals, cpu);
        }
        *tuning.controller.lock().expect("tuner lock") = Some(controller);
    }

    /// Most fetch threads it started, and most reads it had in flight at once.
    pub fn fetch_threads_and_peak(&self) -> (usize, usize) {
        (self.meter.threads.load(Ordering::Relaxed), self.meter.in_flight_peak.load(Ordering::Relaxed) as usize)
    }

    /// The fetch stage's running totals.
    fn totals(&self) -> Totals {
        let m = &self.meter;
        Totals {
            requests: m.requests.load(Ordering::Relaxed),
            bytes: self.fetched.load(Ordering::Relaxed),
            request_nanos: m.request_nanos.load(Ordering::Relaxed),
            blocked_nanos: m.budget_wait_nanos.load(Ordering::Relaxed) + m.hand_off_nanos.load(Ordering::Relaxed),
            reserved: m.reserved.load(Ordering::Relaxed),
        }
    }

    /// The gate on reads in flight, when auto-tuned.
    fn gate(&self) -> Option<&tune::Gate> {
        self.tuning.as_ref().map(|t| &t.gate)
    }

    /// The repository read.
    pub fn repo(&self) -> &'a Repository {
        self.repo
    }

    /// The byte budget (a caller that holds blobs longer may reserve against it too).
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Whether reading was cancelled.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    /// Stops every worker after the unit of work it is in.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// Stored bytes fetched so far.
    pub fn fetched_bytes(&self) -> u64 {
        self.fetched.load(Ordering::Relaxed)
    }

    /// The fetch and decode stages' clocks.
    pub fn clocks(&self) -> &[StageClock; 2] {
        &self.clocks
    }

    /// The fetch and decode stages' times so far.
    pub fn times(&self) -> [StageTimes; 2] {
        [self.clocks[0].times(), self.clocks[1].times()]
    }
}

/// Shortest sample the controller takes.
const SAMPLE_MIN: Duration = Duration::from_millis(200);
/// Longest sample (when fewer requests than the limit complete, e.g. large reads on a slow link).
const SAMPLE_MAX: Duration = Duration::from_secs(2);

/// Running totals of the fetch stage at one moment.
#[derive(Clone, Copy)]
struct Totals {
    requests: u64,
    bytes: u64,
    request_nanos: u64,
    blocked_nanos: u64,
    reserved: u64,
}

impl Totals {
    /// What happened between `before` and these totals, `elapsed` apart.
    fn since(&self, before: &Totals, elapsed: Duration) -> tune::Sample {
        let requests = self.requests - before.requests;
        tune::Sample {
            elapsed,
            requests,
            bytes: self.bytes - before.bytes,
            request_time: Duration::from_nanos(self.request_nanos - before.request_nanos),
            blocked: Duration::from_nanos(self.blocked_nanos.saturating_sub(before.blocked_nanos)),
            reserved_per_read: (self.reserved - before.reserved) / requests.max(1),
            round_trip: None,
            cpu_busy: None,
        }
    }
}

/// Starts a scoped thread named `cairn-NAME` (so profilers and `top -H` show the stages).
pub(crate) fn spawn_named<'scope, F>(s: &'scope Scope<'scope, '_>, name: &str, f: F) -> ScopedJoinHandle<'scope, ()>
where
    F: FnOnce() + Send + 'scope,
{
    std::thread::Builder::new().name(format!("cairn-{name}")).spawn_scoped(s, f).expect("cannot start a worker thread")
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::compress::Codec;
    use cairn_format::id::BlobId;
    use cairn_format::pack::BlobKind;

    /// Blob `n` of pack 0 at `offset`, stored in `length` bytes, decoding to `raw` bytes.
    fn at(n: u8, offset: u32, length: u32, raw: u32) -> BlobLocation {
        let entry = BlobEntry {
            id: BlobId([n; 32]),
            kind: BlobKind::Data,
            codec: Codec::Zstd(1),
            offset,
            length,
            raw_length: raw,
        };
        BlobLocation { pack: PackId([0; 32]), pack_no: 0, salt: [0; SALT_LEN], entry }
    }

    /// `l` moved to pack `no`.
    fn in_pack(mut l: BlobLocation, no: u32) -> BlobLocation {
        l.pack_no = no;
        l.pack = PackId([no as u8; 32]);
        l
    }

    fn shape(reads: &[PackRead]) -> Vec<(u64, u64, usize)> {
        reads.iter().map(|r| (r.offset, r.length, r.blobs.len())).collect()
    }

    #[test]
    fn neighbours_merge_across_small_gaps_only() {
        let locs = vec![at(3, 20_000, 100, 100), at(1, 0, 1000, 1000), at(2, 1000 + 4096, 100, 100)];
        let reads = coalesce(locs, u64::MAX, 4096);
        // Sorted by offset; the 4 KiB gap is read, the larger one is not.
        assert_eq!(shape(&reads), [(0, 5196, 2), (20_000, 100, 1)]);
    }

    #[test]
    fn reads_never_span_two_packs() {
        // Two packs' blobs interleaved and out of order; pack 7's lie just after pack 3's.
        let locs = vec![
            in_pack(at(1, 400, 100, 100), 7),
            in_pack(at(2, 0, 100, 100), 3),
            in_pack(at(3, 300, 100, 100), 7),
            in_pack(at(4, 100, 100, 100), 3),
        ];
        let reads = coalesce(locs, u64::MAX, 4096);
        assert_eq!(shape(&reads), [(0, 200, 2), (300, 200, 2)]);
        assert_eq!(reads[0].pack, PackId([3; 32]));
        assert_eq!(reads[1].pack, PackId([7; 32]));
        assert_eq!(reads[1].blobs.iter().map(|b| b.id.0[0]).collect::<Vec<_>>(), [3, 1]);
    }

    #[test]
    fn a_read_decodes_to_at_most_max_read_bytes() {
        // Highly compressible blobs: 1 MiB stored each, 3 MiB of plaintext each.
        let mib = 1 << 20;
        let locs: Vec<_> = (0..6).map(|i| at(i, u32::from(i) * mib, mib, 3 * mib)).collect();
        let reads = coalesce(locs, u64::MAX, 0);
        assert_eq!(reads.iter().map(|r| r.blobs.len()).collect::<Vec<_>>(), [2, 2, 2]);
        assert!(reads.iter().all(|r| r.raw_bytes() <= MAX_READ));
    }

    #[test]
    fn a_small_budget_splits_reads_but_never_drops_a_blob() {
        let locs: Vec<_> = (0..4).map(|i| at(i, u32::from(i) * 1000, 1000, 1000)).collect();
        // Range plus plaintext of two blobs is 4000 bytes.
        assert_eq!(shape(&coalesce(locs.clone(), 4000, 0)), [(0, 2000, 2), (2000, 2000, 2)]);
        // A budget smaller than one blob: each is read alone.
        assert_eq!(coalesce(locs, 1, 0).len(), 4);
    }

    #[test]
    fn reads_of_one_pack_that_may_not_read_through_are_joined_in_parts() {
        // Pack 3: three blobs 10,000 bytes apart; pack 7: one.
        let locs = vec![
            in_pack(at(1, 0, 100, 200), 3),
            in_pack(at(2, 10_100, 100, 200), 3),
            in_pack(at(3, 20_200, 50, 100), 3),
            in_pack(at(4, 0, 100, 200), 7),
        ];
        let reads = join_parts(coalesce(locs.clone(), u64::MAX, 4096), u64::MAX, MOST_PARTS);
        assert_eq!(shape(&reads), [(0, 250, 3), (0, 100, 1)]);
        assert_eq!(reads[0].parts, [(0, 100), (10_100, 100), (20_200, 50)]);
        assert!(reads[1].parts.is_empty(), "one range stays a plain read");
        // Each blob is where its part puts it among the bytes read.
        assert_eq!(
            reads[0].blobs.iter().map(|b| reads[0].position(u64::from(b.offset))).collect::<Vec<_>>(),
            [0, 100, 200]
        );
        assert_eq!(reads[1].position(0), 0);
        // The budget bounds a joined read as it bounds a coalesced one (range and plaintext):
        // 250 + 500 bytes do not fit in 700, so the third blob starts a read of its own.
        let reads = join_parts(coalesce(locs, 700, 4096), 700, MOST_PARTS);
        assert_eq!(shape(&reads), [(0, 200, 2), (20_200, 50, 1), (0, 100, 1)]);
        // At most MOST_PARTS ranges to a read.
        let many: Vec<_> = (0..MOST_PARTS as u32 + 5).map(|i| at(i as u8, i * 10_000, 100, 100)).collect();
        let reads = join_parts(coalesce(many, u64::MAX, 4096), u64::MAX, MOST_PARTS);
        assert_eq!(reads.iter().map(|r| r.parts.len()).collect::<Vec<_>>(), [MOST_PARTS, 5]);
    }

    proptest::proptest! {
        /// Reads joined in parts ([`join_parts`]) still cover every blob once, of its own pack,
        /// inside one of their ranges, which are in order, apart and within the pack's blobs;
        /// the bytes read back to back put each blob where [`PackRead::position`] says; and the
        /// limits of a coalesced read hold for the whole.
        #[test]
        fn joined_reads_put_every_blob_where_position_says(
            blobs in proptest::collection::vec((0u32..3, 0u32..50_000, 1u32..20_000, 1u32..100_000), 0..200),
            budget in 1u64..4_000_000,
            gap in 0u64..20_000,
            most in 1usize..40,
        ) {
            // Each pack's blobs in order, with room between them.
            let mut next = [0u32; 3];
            let mut locs = Vec::new();
            for (i, (pack, space, len, raw)) in blobs.iter().enumerate() {
                let p = *pack as usize;
                let mut id = [0u8; 32];
                id[..8].copy_from_slice(&(i as u64).to_le_bytes());
                let offset = next[p] + space;
                let entry = BlobEntry { id: BlobId(id), kind: BlobKind::Data, codec: Codec::None, offset, length: *len, raw_length: *raw };
                next[p] = offset + len;
                locs.push(BlobLocation { pack: PackId([*pack as u8; 32]), pack_no: *pack, salt: [0; SALT_LEN], entry });
            }
            // A pack's byte at `o` is (o mod 251): what a read of the parts gives back.
            let byte = |o: u64| (o % 251) as u8;
            let reads = join_parts(coalesce(locs.clone(), budget, gap), budget, most);
            let mut seen = std::collections::HashSet::new();
            for r in &reads {
                let ranges = if r.parts.is_empty() { vec![(r.offset, r.length)] } else { r.parts.clone() };
                proptest::prop_assert!(r.parts.len() <= most);
                proptest::prop_assert_eq!(ranges[0].0, r.offset);
                proptest::prop_assert_eq!(ranges.iter().map(|p| p.1).sum::<u64>(), r.length);
                proptest::prop_assert!(ranges.windows(2).all(|w| w[0].0 + w[0].1 < w[1].0));
                let alone = r.blobs.len() == 1;
                proptest::prop_assert!(alone || (r.length <= MAX_READ && r.raw_bytes() <= MAX_READ));
                proptest::prop_assert!(alone || r.length + r.raw_bytes() <= budget);
                let read: Vec<u8> = ranges.iter().flat_map(|&(o, l)| (o..o + l).map(byte)).collect();
                for b in &r.blobs {
                    proptest::prop_assert!(seen.insert(b.id));
                    let (start, end) = (u64::from(b.offset), u64::from(b.offset) + u64::from(b.length));
                    proptest::prop_assert!(ranges.iter().any(|&(o, l)| o <= start && end <= o + l));
                    let at = r.position(start);
                    let want: Vec<u8> = (start..end).map(byte).collect();
                    proptest::prop_assert_eq!(&read[at..at + b.length as usize], &want[..]);
                    let loc = locs.iter().find(|l| l.entry.id == b.id).unwrap();
                    proptest::prop_assert_eq!(loc.pack, r.pack);
                }
            }
            proptest::prop_assert_eq!(seen.len(), locs.len());
        }

        /// Every blob is covered by exactly one read, of its own pack, that contains its range;
        /// no read crosses packs, exceeds MAX_READ, or (unless it is one blob alone) the budget.
        #[test]
        fn coalescing_covers_every_blob_once(
            blobs in proptest::collection::vec((0u32..4, 0u32..64, 1u32..300_000, 1u32..3_000_000), 0..200),
            budget in 1u64..40_000_000,
            gap in 0u64..100_000,
        ) {
            // Lay each pack's blobs end to end (a pack's blobs never overlap).
            let mut next = [0u32; 4];
            let mut locs = Vec::new();
            for (i, (pack, _, len, raw)) in blobs.iter().enumerate() {
                let p = *pack as usize;
                let mut id = [0u8; 32];
                id[..8].copy_from_slice(&(i as u64).to_le_bytes());
                let entry = BlobEntry { id: BlobId(id), kind: BlobKind::Data, codec: Codec::None, offset: next[p], length: *len, raw_length: *raw };
                next[p] += len;
                locs.push(BlobLocation { pack: PackId([*pack as u8; 32]), pack_no: *pack, salt: [0; SALT_LEN], entry });
            }
            let reads = coalesce(locs.clone(), budget, gap);
            let mut seen = std::collections::HashMap::new();
            for r in &reads {
                let alone = r.blobs.len() == 1;
                proptest::prop_assert!(alone || r.length <= MAX_READ);
                proptest::prop_assert!(alone || r.raw_bytes() <= MAX_READ);
                proptest::prop_assert!(alone || r.length + r.raw_bytes() <= budget);
                for b in &r.blobs {
                    *seen.entry(b.id).or_insert(0) += 1;
                    proptest::prop_assert!(u64::from(b.offset) >= r.offset);
                    proptest::prop_assert!(u64::from(b.offset) + u64::from(b.length) <= r.offset + r.length);
                    let loc = locs.iter().find(|l| l.entry.id == b.id).unwrap();
                    proptest::prop_assert_eq!(loc.pack, r.pack);
                }
            }
            proptest::prop_assert_eq!(seen.len(), locs.len());
            proptest::prop_assert!(seen.values().all(|&n| n == 1));
        }
    }
}
