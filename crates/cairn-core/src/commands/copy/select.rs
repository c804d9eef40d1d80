//! Select stage: which source snapshots to copy, and which the destination already holds.
//!
//! Every copy records the snapshot it copies as its `original` (the first of a chain of copies,
//! FORMAT.md §10), so a snapshot is already in the destination when one of the destination's
//! snapshots has the same origin ([`Snapshot::origin`]): copying it again makes nothing.

use crate::engine::repository::Repository;
use crate::engine::select::SnapshotFilter;
use crate::error::Result;
use cairn_format::id::{IdMap, SnapshotId};
use cairn_format::snapshot::Snapshot;

/// A source snapshot the destination already holds a copy of.
#[derive(Clone, Debug)]
pub struct Skipped {
    /// The source snapshot.
    pub source: SnapshotId,
    /// The destination's copy of it.
    pub existing: SnapshotId,
    /// The source snapshot's content.
    pub snapshot: Snapshot,
}

/// What the select stage chose.
pub(super) struct Selection {
    /// Source snapshots to copy, oldest first.
    pub todo: Vec<(SnapshotId, Snapshot)>,
    /// Source snapshots already copied.
    pub skipped: Vec<Skipped>,
    /// The destination's snapshots by origin: where a copied snapshot's parent is.
    pub by_origin: IdMap<SnapshotId, SnapshotId>,
}

/// Chooses the source snapshots `filter` selects and sorts out those the destination holds.
pub(super) fn select(src: &Repository, dst: &Repository, filter: &SnapshotFilter) -> Result<Selection> {
    let chosen = filter.select(src)?;
    // A destination snapshot that cannot be read cannot be recognised as a copy; at worst its
    // source is copied again, which is harmless.
    let (existing, damaged) = dst.read_snapshots()?;
    for (path, e) in damaged {
        tracing::warn!("destination snapshot {path} cannot be read ({e}); it is not counted as a copy");
    }
    let mut by_origin: IdMap<SnapshotId, SnapshotId> = IdMap::default();
    for (id, snap) in &existing {
        by_origin.entry(snap.origin(*id)).or_insert(*id);
    }
    let mut todo: Vec<(SnapshotId, Snapshot)> = Vec::new();
    let mut skipped = Vec::new();
    for (id, snap) in chosen {
        let origin = snap.origin(id);
        if let Some(existing) = by_origin.get(&origin) {
            skipped.push(Skipped { source: id, existing: *existing, snapshot: snap });
        } else if todo.iter().any(|(t, s)| s.origin(*t) == origin) {
            // Two copies of one snapshot in the source: one copy is enough.
            continue;
        } else {
            todo.push((id, snap));
        }
    }
    Ok(Selection { todo, skipped, by_origin })
}
