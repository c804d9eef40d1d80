//! Rewrite stage (repositories with different chunk-ID keys only): a tree's bytes hold its
//! children's blob IDs, so every tree is written again with the destination's IDs, children
//! before parents, and the copied snapshot points at its new root. Data blobs were named by the
//! transfer stage (in the [`Marks`]); a tree is only serialized, named under the destination's
//! key, and written if the destination lacks it.
//!
//! The trees are taken by height — first those with no subtrees, then those whose subtrees are
//! all done — each height loaded at once by the one tree loader (many reads in flight), except
//! the trees the walk kept. What is held is the walk's `shape` (each tree's subtrees), the new
//! names of the trees done and one read's trees at a time, not every tree of the snapshots.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use crossbeam_channel::Sender;

use super::marks::Marks;
use super::plan::Walked;
use super::transfer::Destination;
use crate::engine::packwrite::{Job, Payload};
use crate::engine::repository::Repository;
use crate::engine::trees::{load_level_each, Loading};
use crate::error::{Error, Result};
use cairn_format::id::{BlobId, IdMap, IdSet};
use cairn_format::pack::BlobKind;
use cairn_format::tree::{Chunk, TreeBytes};

/// Rewrites every tree the walk met (`walked.shape`), bottom-up; returns source tree ID →
/// destination tree ID.
pub(super) fn rewrite(
    dst: &Destination<'_>,
    walked: &mut Walked,
    roots: &[BlobId],
    threads: usize,
    read_ahead: u64,
    cancel: Arc<AtomicBool>,
    jobs: &Sender<Job>,
) -> Result<IdMap<BlobId, BlobId>> {
    let src = dst.src;
    let renamed: Mutex<IdMap<BlobId, BlobId>> = Mutex::default();
    let failed: Mutex<Option<Error>> = Mutex::default();
    let loading = Loading { cancel, ..Default::default() };
    loading.read_ahead.limit(read_ahead);
    for level in by_height(&walked.shape, roots)? {
        let mut load = Vec::new();
        for id in level {
            match walked.held.remove(&id) {
                Some(tree) => one(src, dst, &renamed, &failed, jobs, id, Ok(tree)),
                None => load.push(id),
            }
        }
        load_level_each(src, &load, threads, &loading, &|id, tree| one(src, dst, &renamed, &failed, jobs, id, tree))?;
        if let Some(e) = failed.lock().expect("failed lock").take() {
            return Err(e);
        }
    }
    Ok(renamed.into_inner().expect("renamed lock"))
}

/// Rewrites tree `id` (its subtrees done) and records its new name; the first error is kept.
fn one(
    src: &Repository,
    dst: &Destination<'_>,
    renamed: &Mutex<IdMap<BlobId, BlobId>>,
    failed: &Mutex<Option<Error>>,
    jobs: &Sender<Job>,
    id: BlobId,
    tree: Result<TreeBytes>,
) {
    let done = tree.and_then(|tree| {
        let subtrees: IdMap<BlobId, BlobId> = {
            let renamed = renamed.lock().expect("renamed lock");
            tree.subtrees()
                .iter()
                .map(|s| renamed.get(s).map(|new| (*s, *new)).ok_or_else(|| missing("tree", s)))
                .collect::<Result<_>>()?
        };
        let bytes = rename_tree(src, &tree, dst.marks, &subtrees)?;
        let new_id = dst.repo.key().blob_id(&bytes);
        if dst.wants(new_id)
            && !dst.send(jobs, Job { id: new_id, kind: BlobKind::Tree, payload: Payload::Plain(bytes) })
        {
            return Err(crate::engine::packwrite::stopped("pack"));
        }
        renamed.lock().expect("renamed lock").insert(id, new_id);
        Ok(())
    });
    if let Err(e) = done {
        failed.lock().expect("failed lock").get_or_insert(e);
    }
}

/// A blob the rewrite has no destination ID for (a bug: the walk named them all).
fn missing(what: &str, id: &BlobId) -> Error {
    Error::Internal(format!("{what} {} has no destination ID", id.short()))
}

/// The trees below `roots` grouped by height (0: no subtrees; else one more than the highest
/// subtree), lowest first: every tree comes after all its subtrees.
fn by_height(shape: &IdMap<BlobId, Box<[BlobId]>>, roots: &[BlobId]) -> Result<Vec<Vec<BlobId>>> {
    let unknown = |id: &BlobId| Error::Internal(format!("tree {} was not walked", id.short()));
    let mut height: IdMap<BlobId, usize> = IdMap::default();
    let mut open: IdSet<BlobId> = IdSet::default();
    let mut levels: Vec<Vec<BlobId>> = Vec::new();
    for root in roots {
        // Depth-first with an explicit stack (trees may nest deeply); a tree is given its height
        // once its subtrees have theirs.
        let mut stack = vec![(*root, false)];
        while let Some((id, expanded)) = stack.pop() {
            if height.contains_key(&id) {
                continue;
            }
            let subtrees = shape.get(&id).ok_or_else(|| unknown(&id))?;
            if !expanded {
                if !open.insert(id) {
                    // Content-addressed trees cannot contain themselves; a damaged repository
                    // that says otherwise must not loop.
                    return Err(Error::invalid(format!("tree {}", id.short()), "it contains itself"));
                }
                stack.push((id, true));
                stack.extend(subtrees.iter().filter(|s| !height.contains_key(*s)).map(|s| (*s, false)));
                continue;
            }
            open.remove(&id);
            let h = subtrees
                .iter()
                .map(|s| height.get(s).map(|h| h + 1).ok_or_else(|| unknown(s)))
                .try_fold(0, |most, h| -> Result<usize> { Ok(most.max(h?)) })?;
            height.insert(id, h);
            if levels.len() <= h {
                levels.resize_with(h + 1, Vec::new);
            }
            levels[h].push(id);
        }
    }
    Ok(levels)
}

/// The encoding of `tree` with every chunk and subtree ID replaced by its destination ID.
fn rename_tree(src: &Repository, tree: &TreeBytes, marks: &Marks, trees: &IdMap<BlobId, BlobId>) -> Result<Vec<u8>> {
    let index = src.index();
    tree.map_nodes(|node| {
        for chunk in &mut node.content {
            if let Chunk::Data { id, .. } = chunk {
                *id = marks.name_of(&index, id).ok_or_else(|| missing("blob", id))?;
            }
        }
        if let Some(sub) = &mut node.subtree {
            *sub = *trees.get(sub).ok_or_else(|| missing("tree", sub))?;
        }
        Ok(())
    })
}
