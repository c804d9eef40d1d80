//! Plan stage: every tree of the snapshots to copy is loaded from the source (the one tree
//! loader, level by level), and the blobs they need are listed: the trees themselves and every
//! data chunk of every file.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::id::{BlobId, IdMap, IdSet};
use crate::repository::Repository;
use crate::tree::{Chunk, TreeBytes};
use crate::trees::{for_each_tree, Loading};

/// What the snapshots to copy need from the source.
pub(super) struct Needed {
    /// Every tree, encoded (the rewrite stage decodes and rewrites them when blob IDs differ).
    pub trees: IdMap<BlobId, TreeBytes>,
    /// Every data blob, in the order first met.
    pub data: Vec<BlobId>,
}

/// Loads every tree below `roots` on `threads` threads; a tree that cannot be read is an error
/// naming it (nothing is copied then).
pub(super) fn needed(
    src: &Repository,
    roots: impl IntoIterator<Item = BlobId>,
    threads: usize,
    cancel: Arc<AtomicBool>,
) -> Result<Needed> {
    let loading = Loading { cancel, ..Default::default() };
    let mut trees = IdMap::default();
    let mut seen: IdSet<BlobId> = IdSet::default();
    let mut data = Vec::new();
    for_each_tree(src, roots, threads, &loading, |id, tree| {
        let tree = tree.map_err(|e| {
            Error::Refused(format!(
                "the source's tree {} cannot be read ({e}); nothing was copied: run `cairn check` on the source",
                id.short()
            ))
        })?;
        for node in tree.nodes() {
            for chunk in &node.content {
                if let Chunk::Data { id, .. } = chunk {
                    if seen.insert(*id) {
                        data.push(*id);
                    }
                }
            }
        }
        trees.insert(id, tree);
        Ok(())
    })?;
    Ok(Needed { trees, data })
}
