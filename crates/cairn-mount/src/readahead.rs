//! Read-ahead: the blobs a reader will want next, in the order it will want them, fetched and
//! decoded through the shared read path ([`cairn_core::read`]) into the [`BlobCache`].
//!
//! A [`ReadAhead`] runs one [`Reader`] on a thread of its own: the blobs' coalesced reads
//! ([`ordered_reads`]) go to its fetch workers a bounded window ahead of the reader
//! ([`Paced`]), many in flight at once, and its decode workers put each verified blob into the
//! cache. The reader moves the window by saying which blob it wants ([`ReadAhead::want`]).
//! A sequential read of a large file has one of its own; the small files of a directory share
//! one (a `tar` or `cp -r` of the mount opens them one after another).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use cairn_core::error::{Error, Result};
use cairn_core::id::BlobId;
use cairn_core::pack::BlobEntry;
use cairn_core::read::{coalesce_gap, ordered_reads, Decoded, Pace, Paced, PackRead, Plain, Reader, Sink, MAX_READ};
use cairn_core::repository::Repository;

use crate::cache::BlobCache;

/// How much each read-ahead may hold and how many requests it keeps in flight.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Byte budget of one read-ahead's reader (fetched ranges plus their plaintext).
    pub budget: u64,
    /// Reads in flight.
    pub fetchers: usize,
    /// Decode workers.
    pub decoders: usize,
}

impl Limits {
    /// Reads handed out ahead of the reader: each reserves at most 2 × [`MAX_READ`], so the
    /// window fits the budget (as a dump's does).
    fn window(&self) -> usize {
        (self.budget / (2 * MAX_READ)).max(1) as usize
    }
}

/// One read-ahead: a list of blobs being read into the cache in order, a window ahead of the
/// reader. Dropping it stops it and waits for its workers.
pub struct ReadAhead {
    /// The read (index into the list) of each blob.
    positions: HashMap<BlobId, usize>,
    pace: Arc<Pace>,
    cancel: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
    /// Blobs delivered to the cache or failed.
    finished: Arc<Mutex<HashSet<BlobId>>>,
    thread: Option<JoinHandle<()>>,
}

impl ReadAhead {
    /// Starts reading `wanted` (in this order) into `cache`.
    pub fn start(repo: &Arc<Repository>, cache: &Arc<BlobCache>, wanted: &[BlobId], limits: Limits) -> Result<Self> {
        let reads = ordered_reads(&repo.index(), wanted, coalesce_gap(repo))?;
        let mut positions = HashMap::with_capacity(wanted.len());
        for (i, r) in reads.iter().enumerate() {
            for b in &r.blobs {
                positions.entry(b.id).or_insert(i);
            }
        }
        let (pace, cancel, done) = (Arc::new(Pace::default()), Arc::new(AtomicBool::new(false)), Arc::default());
        let finished = Arc::new(Mutex::new(HashSet::new()));
        let worker = Worker {
            repo: repo.clone(),
            cache: cache.clone(),
            reads,
            pace: pace.clone(),
            cancel: cancel.clone(),
            done: Arc::clone(&done),
            finished: finished.clone(),
            limits,
        };
        let thread = std::thread::Builder::new()
            .name("cairn-readahead".into())
            .spawn(move || worker.run())
            .map_err(|e| Error::Internal(format!("cannot start a read-ahead thread: {e}")))?;
        Ok(ReadAhead { positions, pace, cancel, done, finished, thread: Some(thread) })
    }

    /// Whether this read-ahead brings blob `id`.
    pub fn covers(&self, id: &BlobId) -> bool {
        self.positions.contains_key(id)
    }

    /// The reader wants blob `id` now: the window moves up to it. Returns false if this
    /// read-ahead does not bring it.
    pub fn want(&self, id: &BlobId) -> bool {
        match self.positions.get(id) {
            Some(&i) => {
                self.pace.reach(i);
                true
            }
            None => false,
        }
    }

    /// Whether blob `id` was delivered (or failed) already: if it is not in the cache now,
    /// it will not come from here again.
    pub fn passed(&self, id: &BlobId) -> bool {
        self.finished.lock().expect("finished lock").contains(id)
    }

    /// Whether a reader waiting for blob `id` should stop waiting: reading ended, or the blob
    /// was delivered (and maybe evicted) or failed.
    pub fn gave_up(&self, id: &BlobId) -> bool {
        self.done.load(Ordering::Acquire) || self.passed(id)
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        // A feed waiting for the reader would notice only after 100 ms: a `tar` of the mount
        // replaces a directory's read-ahead thousands of times.
        self.pace.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the read-ahead thread owns.
struct Worker {
    repo: Arc<Repository>,
    cache: Arc<BlobCache>,
    reads: Vec<PackRead>,
    pace: Arc<Pace>,
    cancel: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
    finished: Arc<Mutex<HashSet<BlobId>>>,
    limits: Limits,
}

impl Worker {
    fn run(self) {
        let reader = Reader::new(&self.repo, self.limits.budget, self.cancel.clone());
        std::thread::scope(|s| {
            let feed = Paced::new(&self.reads, self.limits.window(), &self.pace, || reader.cancelled());
            let sink = ToCache { cache: &self.cache, finished: &self.finished };
            for w in reader.start(s, feed, self.limits.fetchers, self.limits.decoders, sink) {
                let _ = w.join();
            }
        });
        self.done.store(true, Ordering::Release);
        self.cache.wake();
    }
}

/// The read-ahead's end of the read path: every verified blob into the cache.
#[derive(Clone)]
struct ToCache<'s> {
    cache: &'s BlobCache,
    finished: &'s Mutex<HashSet<BlobId>>,
}

impl<'s> Sink<'s> for ToCache<'s> {
    fn blobs(&self, _read: &'s PackRead, blobs: Vec<Decoded<'s>>) -> bool {
        for Decoded { id, data, .. } in blobs {
            let plain = match data {
                Plain::Own(v) => v,
                in_read => in_read.to_vec(),
            };
            // Into the cache before it counts as delivered: a reader that sees it delivered
            // and not cached knows it was evicted.
            self.cache.insert(id, Arc::new(plain));
            self.finished.lock().expect("finished lock").insert(id);
        }
        true
    }

    fn failed(&self, _read: &'s PackRead, blob: &BlobEntry, _why: &Error) {
        // The reader reads it again on its own and reports the error then.
        self.finished.lock().expect("finished lock").insert(blob.id);
        self.cache.wake();
    }
}
