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
mod plan;
mod rewrite;
pub mod select;
mod transfer;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub use select::Skipped;
pub use transfer::ReadOptions;

use crate::error::{Error, Result};
use crate::id::{BlobId, IdMap, IdSet, SnapshotId};
use crate::index::BlobLocation;
use crate::packwrite::{write_packs, WriteOptions, Written};
use crate::repository::Repository;
use crate::select::SnapshotFilter;
use crate::snapshot::Snapshot;
use transfer::Destination;

/// How to copy.
#[derive(Clone, Debug)]
pub struct CopyOptions {
    /// Which source snapshots.
    pub filter: SnapshotFilter,
    /// How the source is read.
    pub read: ReadOptions,
    /// How the destination's packs are written.
    pub write: WriteOptions,
    /// Threads that load trees.
    pub tree_threads: usize,
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

    progress.phase("loading trees");
    let roots: Vec<BlobId> = selection.todo.iter().map(|(_, s)| s.tree).collect();
    let needed = plan::needed(src, roots.iter().copied(), opts.tree_threads, cancel.clone())?;
    report.blobs_needed = (needed.trees.len() + needed.data.len()) as u64;

    if !cancel.load(Ordering::Relaxed) {
        // Temporary objects of killed processes (a killed copy's too); a failed write removed its own.
        if let Err(e) = dst.storage().remove_stale_temporaries(crate::storage::STALE_TEMPORARY_AGE) {
            tracing::warn!("cannot remove stale temporary objects: {e}");
        }
    }
    // Between repositories with different IDs, earlier copies name what they hold (`known`).
    let known = if same_ids {
        IdMap::default()
    } else {
        progress.phase("matching earlier copies");
        let pairs = earlier_copies(src, dst, &selection.todo, &selection.by_origin);
        known::names(src, dst, &pairs, opts.tree_threads, cancel.clone())
    };
    let dest = Destination {
        repo: dst,
        rekey: !same_ids,
        queued: Default::default(),
        renamed: Default::default(),
        blobs_written: AtomicU64::new(0),
    };
    let to_read = locate(src, &dest, &needed, &known)?;
    report.blobs_known = dest.renamed.lock().expect("renamed lock").len() as u64;
    let new_roots = write_packs(dst, &opts.write, &progress.written, |jobs| {
        progress.phase("copying");
        transfer::transfer(src, &dest, to_read, &opts.read, &jobs, progress, cancel.clone())?;
        if same_ids {
            return Ok(roots.iter().map(|r| (*r, *r)).collect::<IdMap<_, _>>());
        }
        progress.phase("rewriting trees");
        let data = std::mem::take(&mut *dest.renamed.lock().expect("renamed lock"));
        rewrite::rewrite(&dest, &needed.trees, &roots, &data, &jobs)
    })?;
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

/// Where in the source the blobs to read are. With the same IDs in both repositories only what
/// the destination lacks (trees included) is read; otherwise every data blob is read, to learn
/// its name under the destination's key (trees are rewritten from the plan's copies), except
/// those whose name an earlier copy told (`known`) and the destination still holds. A blob no
/// source index lists is an error: the source is damaged.
fn locate(
    src: &Repository,
    dst: &Destination<'_>,
    needed: &plan::Needed,
    known: &IdMap<BlobId, BlobId>,
) -> Result<Vec<BlobLocation>> {
    let index = src.index();
    let dst_index = dst.repo.index();
    let mut seen: IdSet<BlobId> = IdSet::default();
    let ids: Box<dyn Iterator<Item = &BlobId>> = if dst.rekey {
        let mut renamed = dst.renamed.lock().expect("renamed lock");
        let mut unknown = Vec::new();
        for id in &needed.data {
            match known.get(id) {
                Some(new) if dst_index.contains_live(new) => {
                    renamed.insert(*id, *new);
                }
                _ => unknown.push(id),
            }
        }
        Box::new(unknown.into_iter())
    } else {
        Box::new(needed.trees.keys().chain(needed.data.iter()).filter(|id| !dst_index.contains_live(id)))
    };
    let mut located = Vec::new();
    for id in ids {
        if !seen.insert(*id) {
            continue;
        }
        let loc = index.get(id).ok_or_else(|| {
            Error::Refused(format!(
                "blob {} is in no index of the source; nothing was copied: run `cairn check` on the source",
                id.short()
            ))
        })?;
        located.push(loc);
    }
    Ok(located)
}
