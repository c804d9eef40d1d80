//! The state the pipeline's workers share: the plan and each file's progress through it, the
//! failures and warnings collected on the way, the cancel flag and the gate the writers wait at
//! until the create stage is done.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Instant;

use crossbeam_channel::{unbounded, Receiver, Sender};

use super::options::Sparse;
use super::types::{Dest, Fetches, FileState, Plan};
use crate::engine::profile::StageClock;
use crate::engine::read::{PackRead, Reader};
use crate::error::Error;
use cairn_format::id::{BlobId, IdMap};

/// Failures collected while the pipeline runs.
pub struct Failures<'a> {
    pub(super) dests: &'a IdMap<BlobId, Vec<Dest>>,
    pub(super) entries: Mutex<BTreeMap<usize, String>>,
}

impl<'a> Failures<'a> {
    /// No failures yet but the files that need a blob no index lists or a chunk whose recorded
    /// length differs from its blob's: those can never be restored.
    pub fn new(fetches: &'a Fetches) -> Self {
        let failures = Failures { dests: &fetches.dests, entries: Mutex::new(BTreeMap::new()) };
        for &(entry, id) in &fetches.missing {
            failures.entry(entry, &super::plan::missing(&id));
        }
        for &(entry, id) in &fetches.mismatched {
            failures.entry(entry, &super::plan::mismatched(&id));
        }
        failures
    }

    /// Every file that needs blob `id` fails with `why`.
    pub fn blob(&self, id: &BlobId, why: &str) {
        for d in self.dests.get(id).into_iter().flatten() {
            self.entry(d.entry as usize, why);
        }
    }

    /// Entry `i` fails with `why` (the first reason is kept).
    pub fn entry(&self, i: usize, why: &str) {
        self.entries.lock().expect("failures lock").entry(i).or_insert_with(|| why.to_string());
    }
}

/// How a file's first write prepared it: done, or the OS error code and message of why not.
pub type Prepared = std::result::Result<(), (Option<i32>, String)>;

/// State shared by the pipeline's workers.
pub struct Shared<'a> {
    pub(super) plan: &'a Plan,
    pub(super) fetches: &'a Fetches,
    pub(super) states: &'a [FileState],
    pub(super) target: &'a Path,
    /// The read path: fetch and decode, with the byte budget and the read buffers.
    pub(super) reader: Reader<'a>,
    pub(super) failures: Failures<'a>,
    pub(super) write_clock: StageClock,
    pub(super) remaining: Vec<AtomicU32>,
    /// Set by a file's first write, once it is prepared (or with why that failed); a failed
    /// file nothing was written to is left as it was.
    pub(super) touched: Vec<OnceLock<Prepared>>,
    pub(super) meta_done: Vec<AtomicBool>,
    pub(super) written: AtomicU64,
    pub(super) files_done: AtomicU64,
    pub(super) cancel: Arc<AtomicBool>,
    pub(super) fatal: Mutex<Option<Error>>,
    pub(super) warnings: Mutex<Vec<(PathBuf, String)>>,
    pub(super) sparse: Sparse,
    /// A live restore's target: writes go through it.
    pub(super) guard: Option<&'a dyn super::options::WriteGuard>,
    pub(super) is_root: bool,
    pub(super) umask: u32,
    /// Directories (relative to the target) with a default ACL while files are written; set
    /// once they are made.
    pub(super) acl_dirs: OnceLock<HashSet<PathBuf>>,
    /// The owner of the files this restore creates, by directory (as root).
    pub(super) new_owners: NewOwners,
    /// Opens once the directories and the entries without data are made: writers wait for it.
    pub(super) dirs_ready: Gate,
    /// Directories and other entries the create stage has made (the watchdog's measure of it).
    pub(super) created: AtomicU64,
    /// Fault injection: each write into the target waits this long first
    /// ([`super::RestoreOptions::write_latency`]).
    pub(super) write_latency: std::time::Duration,
    /// The reads of the chunks whose copy beside the fetches failed (`local/copy.rs`), planned
    /// as the copy finds them and handed out by the feed between the planned ones.
    pub(super) late: LateReads,
    /// Bytes the copy wrote (counted in `written` too), from the source and from the target.
    pub(super) copied: [AtomicU64; 2],
    /// When the pipeline started: `planned_span`, `late_span` and the copy's end are counted
    /// from it (one clock, so that they compare).
    pub(super) began: Instant,
    /// Nanoseconds from [`Shared::began`] to the last blob of a planned read handed to the
    /// writers, and the bytes of those reads' blobs: what the fetch did (`local::cost`'s
    /// repository rate). The bytes of the copy's failed chunks are not in it; their reads,
    /// handed out before the planned ones waiting, may stretch its span.
    pub(super) planned_span: AtomicU64,
    pub(super) planned_bytes: AtomicU64,
    /// Nanoseconds from [`Shared::began`] to the last blob of a read of the copy's failed
    /// chunks handed to the writers (`local::cost`'s local rate: how long after the copy's end
    /// they kept the batch going).
    pub(super) late_span: AtomicU64,
}

/// The owner a file this restore creates gets in a directory, learned from the status of the
/// first one finished there: the restore's own user, and its group or the directory's if that
/// is set-group-ID (or the file system says otherwise). Every later file created there gets
/// the same, so root's restore takes no status per file to know whether a chown is needed (a
/// million on `many`). A directory's metadata is applied only once its files are finished, so
/// what a file learns holds for the others. Only the directories written last are kept.
#[derive(Default)]
pub struct NewOwners(Mutex<Vec<(PathBuf, (u32, u32))>>);

impl NewOwners {
    /// Directories kept: the writers work in plan order, a few directories at a time.
    const KEPT: usize = 64;

    /// The owner of a file created in `dir`; `status` gives the owner of one just created
    /// there, asked only for a directory not learned yet.
    pub fn of(&self, dir: &Path, status: impl FnOnce() -> Option<(u32, u32)>) -> Option<(u32, u32)> {
        let known = |kept: &[(PathBuf, (u32, u32))]| {
            kept.iter().rev().find(|(d, _)| d.as_os_str() == dir.as_os_str()).map(|&(_, owner)| owner)
        };
        if let Some(owner) = known(&self.0.lock().expect("owners lock")) {
            return Some(owner);
        }
        let owner = status()?;
        let mut kept = self.0.lock().expect("owners lock");
        if known(&kept).is_none() {
            if kept.len() == Self::KEPT {
                kept.drain(..Self::KEPT / 2);
            }
            kept.push((dir.to_path_buf(), owner));
        }
        Some(owner)
    }
}

/// A one-way gate: closed until opened, then open for good.
#[derive(Default)]
pub struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    /// Opens the gate and wakes whoever waits.
    pub fn open(&self) {
        *self.open.lock().expect("gate lock") = true;
        self.opened.notify_all();
    }

    /// Whether the gate is open.
    pub fn is_open(&self) -> bool {
        *self.open.lock().expect("gate lock")
    }

    /// Waits until the gate is open.
    pub fn wait(&self) {
        let mut open = self.open.lock().expect("gate lock");
        while !*open {
            open = self.opened.wait(open).expect("gate lock");
        }
    }
}

/// Opens its gate when dropped.
pub struct OpenOnDrop<'a>(pub &'a Gate);

impl Drop for OpenOnDrop<'_> {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// The reads of chunks whose local copy failed, planned while the copy runs: kept where the
/// fetch stage can borrow them for the rest of the batch, and announced on a channel that
/// closes once the copy is over.
pub struct LateReads {
    reads: boxcar::Vec<PackRead>,
    /// The copy's end of the channel: taken by the copy ([`LateReads::sender`]), dropped when
    /// it ends; dropped at once when there is no copy ([`LateReads::close`]).
    tx: Mutex<Option<Sender<usize>>>,
    rx: Receiver<usize>,
}

impl Default for LateReads {
    fn default() -> Self {
        let (tx, rx) = unbounded();
        LateReads { reads: boxcar::Vec::new(), tx: Mutex::new(Some(tx)), rx }
    }
}

impl LateReads {
    /// The end reads are announced on; the channel closes once it (and every clone) is dropped.
    pub fn sender(&self) -> Option<Sender<usize>> {
        self.tx.lock().expect("late reads lock").take()
    }

    /// No copy runs: no read will come.
    pub fn close(&self) {
        self.sender();
    }

    /// Keeps `reads` and announces them on `tx` (from [`LateReads::sender`]).
    pub fn add(&self, tx: &Sender<usize>, reads: Vec<PackRead>) {
        for read in reads {
            // The feed is gone (the pipeline is shutting down): nothing to do.
            let _ = tx.send(self.reads.push(read));
        }
    }
}

impl Shared<'_> {
    /// What the fetch stage is fed: the planned reads, with those of the chunks whose copy
    /// failed handed out first as the copy finds them, then the rest of those until the copy
    /// is over.
    pub fn reads(&self) -> impl Iterator<Item = &PackRead> + Send {
        let mut planned = self.fetches.reads.iter();
        let late = &self.late;
        std::iter::from_fn(move || {
            if let Ok(i) = late.rx.try_recv() {
                return late.reads.get(i);
            }
            planned.next().or_else(|| late.rx.recv().ok().and_then(|i| late.reads.get(i)))
        })
    }

    /// Whether the pipeline is shutting down.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    /// Stops everything because of an error no other file would escape (disk full, read-only).
    pub fn fatal(&self, path: PathBuf, e: std::io::Error) {
        self.fail(Error::io(path, "cannot write", e));
    }

    /// Stops everything with `e` (the first such error is kept).
    pub fn fail(&self, e: Error) {
        self.fatal.lock().expect("fatal lock").get_or_insert(e);
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// Records metadata that could not be applied (or an entry not deleted), with why.
    pub fn warn(&self, path: PathBuf, why: String) {
        self.warnings.lock().expect("warnings lock").push((path, why));
    }

    /// The failed entries with why, once the pipeline is done; a file that failed before
    /// anything was written to it says that what was at its path is left as it was.
    pub fn take_failures(&self) -> BTreeMap<usize, String> {
        let mut failed = std::mem::take(&mut *self.failures.entries.lock().expect("failures lock"));
        for (&i, why) in failed.iter_mut() {
            let was_there = matches!(self.states[i], FileState::InPlace { .. } | FileState::Create { clear: true });
            if was_there && self.touched[i].get().is_none() {
                why.push_str("; what was already at this path is left as it was");
            }
        }
        failed
    }
}

/// How many chunks each entry of `plan` waits for: the write of its last one finishes it.
pub fn chunks_to_write(plan: &Plan, fetches: &Fetches) -> Vec<AtomicU32> {
    let mut remaining: Vec<AtomicU32> = (0..plan.entries.len()).map(|_| AtomicU32::new(0)).collect();
    for dests in fetches.dests.values() {
        for d in dests {
            *remaining[d.entry as usize].get_mut() += 1;
        }
    }
    remaining
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_new_owner_is_asked_once_per_directory_and_only_the_last_directories_are_kept() {
        let owners = NewOwners::default();
        let asked = Cell::new(0);
        let ask = |owner: (u32, u32)| {
            let asked = &asked;
            move || {
                asked.set(asked.get() + 1);
                Some(owner)
            }
        };
        assert_eq!(owners.of(Path::new("a"), ask((0, 7))), Some((0, 7)));
        assert_eq!(owners.of(Path::new("a"), ask((9, 9))), Some((0, 7)), "learned, not asked again");
        assert_eq!(owners.of(Path::new("b"), ask((0, 0))), Some((0, 0)), "another directory is asked");
        assert_eq!(owners.of(Path::new("a/b"), ask((0, 3))), Some((0, 3)));
        assert_eq!(asked.get(), 3);
        // A status that could not be taken is not learned.
        assert_eq!(owners.of(Path::new("c"), || None), None);
        assert_eq!(owners.of(Path::new("c"), ask((0, 5))), Some((0, 5)));
        // Only the last directories are kept: the first is asked again once many followed it.
        for i in 0..NewOwners::KEPT {
            owners.of(Path::new(&format!("d{i}")), ask((1, 1)));
        }
        assert_eq!(owners.of(Path::new("a"), ask((0, 8))), Some((0, 8)));
        assert!(owners.0.lock().expect("owners lock").len() <= NewOwners::KEPT);
    }
}
