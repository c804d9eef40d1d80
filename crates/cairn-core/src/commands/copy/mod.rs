//! Copy: snapshots from one repository into another, transferring only the blobs the
//! destination lacks (e.g. local → S3 for an off-site copy, or S3 → local to stage a restore).
//!
//! ```text
//! select ─▶ plan ─▶ [known] ─▶ transfer (read path, stored mode ─▶ pack writer) ─▶ [rewrite] ─▶ snapshots
//! ```
//!
//! [`select`] picks the source snapshots and drops those the destination already holds a copy
//! of (by their `original`); [`plan`] loads their trees from the source and lists the blobs
//! they need; [`transfer`] reads the missing ones through the shared read path, verified but
//! still compressed, into the shared pack writer (re-encrypted under the destination's keys,
//! never recompressed). When the two repositories name blobs with the same key (the
//! destination was made with `init --copy-chunker-params`, FORMAT.md §6), a blob has the same ID
//! in both and the destination's index says what it has. Otherwise every blob is renamed under
//! the destination's key ([`known`] takes the names an earlier copy of the parent snapshot
//! tells, so only the rest is read) and [`rewrite`] writes the trees again with the new IDs.
//!
//! Crash safety is the backup's: the pack writer indexes a pack only once it is stored, and the
//! snapshots are written last, after every index file they need. A copy killed at any moment
//! leaves at most packs no snapshot uses yet; run again, it finds in the destination's index
//! what the killed one stored. The caller holds a shared lock on both repositories (on the
//! destination the backup's kind, so a prune there treats the copy as a running backup).

mod known;
mod marks;
mod plan;
mod rewrite;
pub mod select;
mod transfer;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub use select::Skipped;
pub use transfer::ReadOptions;

use crossbeam_channel::bounded;

use crate::engine::memory::{left_for_reads_and_packs, MaxMemory};
use crate::engine::packwrite::{pack_buffer, write_packs, WriteOptions, Written};
use crate::engine::repository::Repository;
use crate::engine::select::SnapshotFilter;
use crate::error::{Error, Result};
use cairn_format::id::{BlobId, IdMap, SnapshotId};
use cairn_format::index::BlobLocation;
use cairn_format::snapshot::Snapshot;
use marks::Marks;
use plan::Walk;
use transfer::Destination;

/// How to copy.
#[derive(Clone, Debug)]
pub struct CopyOptions {
    /// Which source snapshots.
    pub filter: SnapshotFilter,
    /// How the source is read.
    pub read: ReadOptions,
    /// How the destination's packs are written (their memory is a share of `max_memory`).
    pub write: WriteOptions,
    /// Threads that load trees.
    pub tree_threads: usize,
    /// The whole copy's memory: both indexes, what it marks per source blob, trees kept for
    /// the rewrite, reads in flight and packs being filled and stored ([`Shares`]).
    pub max_memory: MaxMemory,
}

impl CopyOptions {
    /// The defaults for copying the snapshots `filter` chooses from `src` to `dst`: `fetchers`
    /// reads of the source in flight if given, else its backend's concurrency (at least 4);
    /// decoders and packers on every core (blobs arrive compressed: the packers only encrypt;
    /// trees renamed for a destination with other IDs are compressed with its default codec).
    pub fn new(
        src: &Repository,
        dst: &Repository,
        filter: SnapshotFilter,
        fetchers: Option<usize>,
        max_memory: MaxMemory,
    ) -> Self {
        let cores = crate::engine::platform::cores();
        CopyOptions {
            filter,
            read: ReadOptions {
                fetchers: fetchers.unwrap_or(src.storage().default_concurrency().max(4)).max(1),
                decoders: cores,
            },
            write: WriteOptions::rewriting(dst, dst.config().codec(), cores),
            tree_threads: cores.max(src.storage().default_concurrency().min(8)),
            max_memory,
        }
    }
}

/// How a copy shares out its `--max-memory` (docs/DESIGN.md, "Copy"). First what grows with
/// the repositories: the two indexes as loaded (the destination's does not learn what the copy
/// stores) and the marks. Of the rest, three eighths for the packs being filled and stored, an
/// eighth for trees (read ahead of the walk, being loaded, and kept between the walk and the
/// rewrite), an eighth for the walk's batches of blobs to read, and the rest for reads in
/// flight.
#[derive(Clone, Copy, Debug)]
pub struct Shares {
    /// Bytes the reads take: the reader admits half as many in flight, because a read's reused
    /// buffer may be up to twice its size and idle buffers are kept (`read/buffers.rs`).
    pub read: u64,
    /// Bytes of the destination's packs in memory.
    pub write: u64,
    /// Bytes of trees: tree packs read ahead of the walk, and trees kept for the rewrite.
    pub hold: u64,
}

impl Shares {
    /// The shares of `max_memory` for copying from `src` to `dst`, or why it cannot run within it.
    pub fn of(src: &Repository, dst: &Repository, rename: bool, max_memory: MaxMemory) -> Result<Shares> {
        let fixed =
            src.index().memory_bytes() + dst.index().memory_bytes() + Marks::memory_bytes(src.index().len(), rename);
        let left = left_for_reads_and_packs(
            max_memory,
            "copy",
            "the two indexes and the copy's marks",
            fixed,
            pack_buffer(dst),
        )?;
        let (write, hold, batches) = (left * 3 / 8, left / 8, left / 8);
        let read = left - write - hold - batches;
        Ok(Shares { read, write, hold })
    }

    /// Blobs one batch of the walk holds (about 200 bytes each with its read): the batches'
    /// share (as large as a third of the reads') holds the batch being read, the one waiting
    /// and the one being made.
    fn batch(&self) -> usize {
        (self.read / 9 / 200).clamp(1024, 100_000) as usize
    }

    /// Threads that load trees: each holds a read of up to 4 MiB of stored and decoded trees
    /// while it hands them on, within the trees' share beside what is read ahead and kept.
    fn tree_threads(&self, most: usize) -> usize {
        most.min((self.hold / (8 << 20)) as usize).max(1)
    }
}

/// What a copy is doing, for a progress display.
#[derive(Debug, Default)]
pub struct CopyProgress {
    /// The current phase: "selecting", "loading trees", "copying", "rewriting trees",
    /// "writing snapshots".
    pub phase: Mutex<&'static str>,
    /// Stored bytes the transfer reads from the source.
    pub total_bytes: AtomicU64,
    /// Stored bytes read and verified so far.
    pub read_bytes: AtomicU64,
    /// What the destination's pack writer wrote.
    pub written: Written,
}

impl CopyProgress {
    fn phase(&self, p: &'static str) {
        *self.phase.lock().expect("phase lock") = p;
    }
}

/// One snapshot copied.
#[derive(Clone, Debug)]
pub struct Copied {
    /// The source snapshot.
    pub source: SnapshotId,
    /// The new snapshot in the destination.
    pub copy: SnapshotId,
    /// Its content (as written to the destination).
    pub snapshot: Snapshot,
}

/// `cairn copy --json`'s summary: the schema of a copy's report, in one place (fields in
/// name order, as `serde_json::Value` prints them).
#[derive(Debug, serde::Serialize)]
pub struct CopySummary<'a> {
    blobs_known: u64,
    blobs_needed: u64,
    blobs_written: u64,
    bytes_read: u64,
    bytes_written: u64,
    copied: Vec<CopiedSummary<'a>>,
    index_files_written: u64,
    message_type: &'static str,
    packs_written: u64,
    same_ids: bool,
    seconds: f64,
    skipped: Vec<SkippedSummary>,
    snapshots_copied: usize,
    snapshots_skipped: usize,
}

/// One snapshot copied, in [`CopySummary`].
#[derive(Debug, serde::Serialize)]
pub struct CopiedSummary<'a> {
    copy: String,
    hostname: &'a str,
    paths: &'a [String],
    source: String,
    tags: &'a [String],
    time: i64,
    tree: String,
}

/// One snapshot skipped, in [`CopySummary`].
#[derive(Debug, serde::Serialize)]
pub struct SkippedSummary {
    existing: String,
    source: String,
}

impl CopyReport {
    /// The report as `--json` prints it.
    pub fn summary(&self) -> CopySummary<'_> {
        CopySummary {
            blobs_known: self.blobs_known,
            blobs_needed: self.blobs_needed,
            blobs_written: self.blobs_written,
            bytes_read: self.bytes_read,
            bytes_written: self.bytes_written,
            copied: self
                .copied
                .iter()
                .map(|c| CopiedSummary {
                    copy: c.copy.to_hex(),
                    hostname: &c.snapshot.hostname,
                    paths: &c.snapshot.paths,
                    source: c.source.to_hex(),
                    tags: &c.snapshot.tags,
                    time: c.snapshot.time.secs,
                    tree: c.snapshot.tree.to_hex(),
                })
                .collect(),
            index_files_written: self.index_files_written,
            message_type: "summary",
            packs_written: self.packs_written,
            same_ids: self.same_ids,
            seconds: self.seconds,
            skipped: self
                .skipped
                .iter()
                .map(|s| SkippedSummary { existing: s.existing.to_hex(), source: s.source.to_hex() })
                .collect(),
            snapshots_copied: self.copied.len(),
            snapshots_skipped: self.skipped.len(),
        }
    }
}

/// What a copy did.
#[derive(Debug, Default)]
pub struct CopyReport {
    /// Snapshots copied, oldest first.
    pub copied: Vec<Copied>,
    /// Snapshots the destination already held.
    pub skipped: Vec<Skipped>,
    /// Whether both repositories name blobs with the same key (copied data then deduplicates
    /// against the destination's own backups).
    pub same_ids: bool,
    /// Blobs the snapshots need (trees and data).
    pub blobs_needed: u64,
    /// Blobs written to the destination.
    pub blobs_written: u64,
    /// Data blobs whose destination ID an earlier copy told (between repositories with
    /// different IDs), so they were not read.
    pub blobs_known: u64,
    /// Stored bytes read from the source.
    pub bytes_read: u64,
    /// Bytes of packs written to the destination.
    pub bytes_written: u64,
    /// Packs written.
    pub packs_written: u64,
    /// Index files written.
    pub index_files_written: u64,
    /// Wall time in seconds.
    pub seconds: f64,
}

/// Copies the snapshots `opts.filter` selects from `src` into `dst`. Setting `cancel` stops it
/// (nothing is then written after the packs in flight: no snapshot).
pub fn copy(
    src: &Repository,
    dst: &Repository,
    opts: &CopyOptions,
    progress: &CopyProgress,
    cancel: Arc<AtomicBool>,
) -> Result<CopyReport> {
    let started = Instant::now();
    if src.config().id == dst.config().id {
        return Err(Error::Usage(format!(
            "the source and the destination are the same repository ({}): give another --from-repo",
            &src.config().id[..8]
        )));
    }
    progress.phase("selecting");
    let selection = select::select(src, dst, &opts.filter)?;
    let same_ids = src.key().chunk_id_key() == dst.key().chunk_id_key();
    let mut report = CopyReport { skipped: selection.skipped, same_ids, ..Default::default() };
    if selection.todo.is_empty() {
        report.seconds = started.elapsed().as_secs_f64();
        return Ok(report);
    }

    if !cancel.load(Ordering::Relaxed) {
        // Temporary objects of killed processes (a killed copy's too); a failed write removed its own.
        if let Err(e) = dst.storage().remove_stale_temporaries(crate::engine::storage::STALE_TEMPORARY_AGE) {
            tracing::warn!("cannot remove stale temporary objects: {e}");
        }
    }
    let roots: Vec<BlobId> = selection.todo.iter().map(|(_, s)| s.tree).collect();
    let rename = !same_ids;
    let share = Shares::of(src, dst, rename, opts.max_memory)?;
    let marks = Marks::new(&src.index(), rename);
    let tree_threads = share.tree_threads(opts.tree_threads);
    // Between repositories with different IDs, earlier copies name what they hold (`known`).
    if rename {
        progress.phase("matching earlier copies");
        let pairs = earlier_copies(src, dst, &selection.todo, &selection.by_origin);
        known::names(src, dst, &pairs, tree_threads, share.hold, cancel.clone(), &marks);
    }
    let dest = Destination { src, repo: dst, rekey: rename, marks: &marks, blobs_written: AtomicU64::new(0) };
    let walk = Walk { src, dst, rename, threads: tree_threads, hold: share.hold, batch: share.batch() };
    // The walk meets each blob once, so the destination's index need not learn what is stored.
    let write = WriteOptions { memory: Some(share.write), index_stored: false, ..opts.write };
    let (walked, new_roots) = write_packs(dst, &write, &progress.written, |jobs| {
        progress.phase("copying");
        let mut walked = std::thread::scope(|s| {
            // The walk hands on a batch while the one before it is read: one waits, one is read.
            let (tx, rx) = bounded::<Vec<BlobLocation>>(1);
            let walker = s.spawn(|| {
                let tx = tx;
                walk.run(&roots, &marks, cancel.clone(), |batch| tx.send(batch).map_err(|_| Error::Interrupted))
            });
            let mut moved = Ok(());
            for batch in &rx {
                moved = transfer::transfer(&dest, batch, share.read / 2, &opts.read, &jobs, progress, cancel.clone());
                if moved.is_err() {
                    break;
                }
            }
            drop(rx); // a walker waiting to send stops
            let walked = walker.join().expect("copy walker panicked");
            moved.and(walked)
        })?;
        if same_ids {
            return Ok((walked, roots.iter().map(|r| (*r, *r)).collect::<IdMap<_, _>>()));
        }
        progress.phase("rewriting trees");
        let renamed =
            rewrite::rewrite(&dest, &mut walked, &roots, tree_threads, share.hold / 2, cancel.clone(), &jobs)?;
        Ok((walked, renamed))
    })?;
    report.blobs_needed = walked.trees + walked.data;
    report.blobs_known = walked.known;
    if cancel.load(Ordering::Relaxed) {
        return Err(Error::Interrupted);
    }

    // Every pack is stored and indexed: now the snapshots (FORMAT.md §1, write order).
    progress.phase("writing snapshots");
    let mut copies = selection.by_origin;
    for (source, snap) in selection.todo {
        let tree = *new_roots.get(&snap.tree).ok_or_else(|| Error::Internal("a root was not rewritten".into()))?;
        // The parent is a source snapshot: in the destination, its copy (if there is one).
        let parent = snap.parent.and_then(|p| copies.get(&p).copied());
        let snapshot = Snapshot { tree, parent, original: Some(snap.origin(source)), ..snap };
        let copy = dst.save_snapshot(&snapshot)?;
        copies.insert(source, copy);
        report.copied.push(Copied { source, copy, snapshot });
    }
    if !report.copied.is_empty() {
        // As after a backup: the destination's start hint names its tree packs as they now are.
        crate::engine::trees::write_hint(dst);
    }
    report.blobs_written = dest.blobs_written.load(Ordering::Relaxed);
    report.bytes_read = progress.read_bytes.load(Ordering::Relaxed);
    report.bytes_written = progress.written.bytes();
    report.packs_written = progress.written.packs.load(Ordering::Relaxed);
    report.index_files_written = progress.written.index_files.lock().expect("written lock").len() as u64;
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// The root trees of the source snapshots that the snapshots to copy were based on (their
/// parents) and of the destination's copies of them, where it has copies.
fn earlier_copies(
    src: &Repository,
    dst: &Repository,
    todo: &[(SnapshotId, Snapshot)],
    by_origin: &IdMap<SnapshotId, SnapshotId>,
) -> Vec<(BlobId, BlobId)> {
    let mut parents: Vec<SnapshotId> = todo.iter().filter_map(|(_, s)| s.parent).collect();
    parents.sort_unstable();
    parents.dedup();
    parents
        .into_iter()
        .filter_map(|p| {
            let copy = by_origin.get(&p)?;
            // A parent removed from either side since (forget) simply teaches nothing.
            Some((src.read_snapshot(&p).ok()?.tree, dst.read_snapshot(copy).ok()?.tree))
        })
        .collect()
}
