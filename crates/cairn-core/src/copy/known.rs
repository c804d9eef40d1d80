//! Known names (repositories with different chunk-ID keys only): an earlier copy of a source
//! snapshot is the same tree of the same content under the destination's names, so walking
//! both side by side tells the destination's ID of every blob the earlier snapshot holds. A new
//! snapshot shares most of its data with its parent, so copying it then reads from the source
//! only the blobs no earlier copy named (instead of every blob, to hash it under the
//! destination's key).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::id::{BlobId, IdMap, IdSet};
use crate::repository::Repository;
use crate::tree::{Chunk, Tree};
use crate::trees::{load_all, LoadedTree, Loading};

/// Source blob ID → destination blob ID of every data blob below the source roots of `pairs`
/// (a source snapshot's root tree and the root of its copy in the destination). A pair whose
/// trees differ in shape (not a copy after all) teaches nothing, and a tree that cannot be
/// loaded only means its pair is skipped: knowing names only saves reads.
pub(super) fn names(
    src: &Repository,
    dst: &Repository,
    pairs: &[(BlobId, BlobId)],
    threads: usize,
    cancel: Arc<AtomicBool>,
) -> IdMap<BlobId, BlobId> {
    let mut known = IdMap::default();
    for (from, to) in pairs {
        let loading = Loading { cancel: cancel.clone(), ..Default::default() };
        let (Ok(a), Ok(b)) = (load_all(src, *from, threads, &loading), load_all(dst, *to, threads, &loading)) else {
            continue;
        };
        let mut learned = IdMap::default();
        if side_by_side(&a, &b, *from, *to, &mut learned, &mut IdSet::default()).is_some() {
            known.extend(learned);
        }
    }
    known
}

/// Walks tree `a` of `at` and tree `b` of `bt` together, recording each data blob of `a` with
/// the blob at the same place in `b`; `None` when the two are not the same tree.
fn side_by_side(
    at: &IdMap<BlobId, LoadedTree>,
    bt: &IdMap<BlobId, LoadedTree>,
    a: BlobId,
    b: BlobId,
    learned: &mut IdMap<BlobId, BlobId>,
    done: &mut IdSet<BlobId>,
) -> Option<()> {
    // An explicit stack: trees may nest deeply.
    let mut stack = vec![(a, b)];
    while let Some((a, b)) = stack.pop() {
        if !done.insert(a) {
            continue;
        }
        let (ta, tb): (&Tree, &Tree) = (&at.get(&a)?.tree, &bt.get(&b)?.tree);
        if ta.nodes.len() != tb.nodes.len() {
            return None;
        }
        for (na, nb) in ta.nodes.iter().zip(&tb.nodes) {
            if na.name != nb.name || na.kind != nb.kind || na.content.len() != nb.content.len() {
                return None;
            }
            for (ca, cb) in na.content.iter().zip(&nb.content) {
                match (ca, cb) {
                    (Chunk::Data { id: ia, len: la }, Chunk::Data { id: ib, len: lb }) if la == lb => {
                        learned.insert(*ia, *ib);
                    }
                    (Chunk::Zero { len: la }, Chunk::Zero { len: lb }) if la == lb => {}
                    _ => return None,
                }
            }
            match (na.subtree, nb.subtree) {
                (Some(sa), Some(sb)) => stack.push((sa, sb)),
                (None, None) => {}
                _ => return None,
            }
        }
    }
    Some(())
}
