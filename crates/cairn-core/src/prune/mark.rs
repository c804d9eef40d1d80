//! Mark stage: every blob the snapshots need — their trees and the chunks the trees name —
//! found by loading the trees level by level with many reads in flight (the one tree walker,
//! [`crate::trees::for_each_tree`]).

use crate::error::{Error, Result};
use crate::id::{BlobId, IdSet, SnapshotId};
use crate::repository::Repository;
use crate::snapshot::Snapshot;
use crate::tree::Chunk;
use crate::trees::{for_each_tree, Loading};

/// Tree loads in flight while marking.
const MARK_THREADS: usize = 8;

/// The blobs `snapshots` need. A tree that cannot be read is an error: a prune that cannot see
/// what a snapshot needs must not delete anything.
pub fn mark(repo: &Repository, snapshots: &[(SnapshotId, Snapshot)], loading: &Loading) -> Result<IdSet<BlobId>> {
    let mut used = IdSet::default();
    let threads = MARK_THREADS.max(repo.storage().default_concurrency());
    for_each_tree(repo, snapshots.iter().map(|(_, s)| s.tree), threads, loading, |id, tree| {
        let tree = tree.map_err(|e| {
            Error::Refused(format!(
                "tree {} cannot be read ({e}); prune deletes nothing until every snapshot can be read: \
                 run `cairn check`, then `cairn repair`",
                id.short()
            ))
        })?;
        used.insert(id);
        for node in tree.nodes() {
            used.extend(node.content.iter().filter_map(|c| match c {
                Chunk::Data { id, .. } => Some(*id),
                Chunk::Zero { .. } => None,
            }));
        }
        Ok(())
    })?;
    Ok(used)
}
