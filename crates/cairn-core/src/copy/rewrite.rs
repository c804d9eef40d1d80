//! Rewrite stage (repositories with different chunk-ID keys only): a tree's bytes hold its
//! children's blob IDs, so every tree is written again with the destination's IDs, children
//! before parents, and the copied snapshot points at its new root. Data blobs were renamed by
//! the transfer stage; a tree is only serialized, named under the destination's key, and
//! written if the destination lacks it.

use crossbeam_channel::Sender;

use super::transfer::Destination;
use crate::error::{Error, Result};
use crate::id::{BlobId, IdMap};
use crate::pack::BlobKind;
use crate::packwrite::{Job, Payload};
use crate::tree::{Chunk, Tree, TreeBytes};

/// Rewrites every tree below `roots` bottom-up; returns source tree ID → destination tree ID.
/// `trees` holds every tree below the roots; `data` maps every data blob they name.
pub(super) fn rewrite(
    dst: &Destination<'_>,
    trees: &IdMap<BlobId, TreeBytes>,
    roots: &[BlobId],
    data: &IdMap<BlobId, BlobId>,
    jobs: &Sender<Job>,
) -> Result<IdMap<BlobId, BlobId>> {
    let mut renamed: IdMap<BlobId, BlobId> = IdMap::default();
    // Depth-first, a tree after all its subtrees (an explicit stack: trees may nest deeply).
    let mut stack: Vec<(BlobId, bool)> = roots.iter().map(|r| (*r, false)).collect();
    while let Some((id, children_done)) = stack.pop() {
        if renamed.contains_key(&id) {
            continue;
        }
        let tree = trees.get(&id).ok_or_else(|| Error::Internal(format!("tree {} was not loaded", id.short())))?;
        if !children_done {
            stack.push((id, true));
            stack.extend(tree.subtrees().iter().filter(|s| !renamed.contains_key(*s)).map(|s| (*s, false)));
            continue;
        }
        let new = rename_tree(tree, data, &renamed)?;
        let bytes = new.to_bytes();
        let new_id = dst.repo.key().blob_id(&bytes);
        if dst.wants(new_id)
            && !dst.send(jobs, Job { id: new_id, kind: BlobKind::Tree, payload: Payload::Plain(bytes) })
        {
            return Err(crate::packwrite::stopped("pack"));
        }
        renamed.insert(id, new_id);
    }
    Ok(renamed)
}

/// `tree` with every chunk and subtree ID replaced by its destination ID.
fn rename_tree(tree: &TreeBytes, data: &IdMap<BlobId, BlobId>, trees: &IdMap<BlobId, BlobId>) -> Result<Tree> {
    let missing = |what: &str, id: &BlobId| Error::Internal(format!("{what} {} has no destination ID", id.short()));
    let mut out = Tree { nodes: tree.nodes().collect() };
    for node in &mut out.nodes {
        for chunk in &mut node.content {
            if let Chunk::Data { id, .. } = chunk {
                *id = *data.get(id).ok_or_else(|| missing("blob", id))?;
            }
        }
        if let Some(sub) = &mut node.subtree {
            *sub = *trees.get(sub).ok_or_else(|| missing("tree", sub))?;
        }
    }
    Ok(out)
}
