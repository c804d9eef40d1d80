//! Mark stage: every blob the snapshots need — their trees and the chunks the trees name —
//! found by loading the trees level by level with many reads in flight (the one tree walker,
//! [`crate::engine::trees::for_each_tree`]), and kept as one bit per blob of the index
//! ([`BlobSet`]).

use crate::engine::blobset::BlobSet;
use crate::engine::repository::Repository;
use crate::engine::trees::{for_each_tree, Loading};
use crate::error::{Error, Result};
use cairn_format::id::SnapshotId;
use cairn_format::snapshot::Snapshot;
use cairn_format::tree::Chunk;

/// Tree loads in flight while marking.
const MARK_THREADS: usize = 8;

/// The blobs `snapshots` need, by the repository's index as it is now. A tree that cannot be
/// read is an error: a prune that cannot see what a snapshot needs must not delete anything.
pub fn mark(repo: &Repository, snapshots: &[(SnapshotId, Snapshot)], loading: &Loading) -> Result<BlobSet> {
    let mut needed = BlobSet::new(&repo.index());
    let threads = MARK_THREADS.max(repo.storage().default_concurrency());
    for_each_tree(repo, snapshots.iter().map(|(_, s)| s.tree), threads, loading, |id, tree| {
        let tree = tree.map_err(|e| {
            Error::Refused(format!(
                "tree {} cannot be read ({e}); prune deletes nothing until every snapshot can be read: \
                 run `cairn check`, then `cairn repair`",
                id.short()
            ))
        })?;
        let index = repo.index();
        needed.insert(&index, id);
        for node in tree.nodes() {
            for c in &node.content {
                if let Chunk::Data { id, .. } = c {
                    needed.insert(&index, *id);
                }
            }
        }
        Ok(())
    })?;
    Ok(needed)
}
