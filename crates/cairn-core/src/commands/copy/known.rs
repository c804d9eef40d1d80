//! Known names (repositories with different chunk-ID keys only): an earlier copy of a source
//! snapshot is the same tree of the same content under the destination's names, so walking
//! both side by side tells the destination's ID of every blob the earlier snapshot holds. A new
//! snapshot shares most of its data with its parent, so copying it then reads from the source
//! only the blobs no earlier copy named (instead of every blob, to hash it under the
//! destination's key).
//!
//! The two trees are walked level by level, a few pairs of trees at a time (the one tree loader
//! on each side), so what is held is those trees, the pairs of the next level and what the walk
//! learned (36 bytes a blob) — not both snapshots' trees. What a pair teaches is recorded in the
//! [`Marks`] only once the whole pair proved the same tree.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::marks::Marks;
use crate::engine::repository::Repository;
use crate::engine::trees::{load_level, Loading};
use cairn_format::id::{BlobId, IdMap, IdSet};
use cairn_format::tree::{Chunk, TreeBytes};

/// Pairs of trees loaded at once: a level of a million files' directories is not held whole.
const PAIRS_AT_ONCE: usize = 32;

/// Records in `marks` the destination ID of every data blob below the source roots of `pairs`
/// (a source snapshot's root tree and the root of its copy in the destination) that the
/// destination still holds. A pair whose trees differ in shape (not a copy after all) teaches
/// nothing, and a tree that cannot be loaded only means its pair is skipped: knowing names
/// only saves reads. `read_ahead` bounds the tree packs each side reads ahead.
pub(super) fn names(
    src: &Repository,
    dst: &Repository,
    pairs: &[(BlobId, BlobId)],
    threads: usize,
    read_ahead: u64,
    cancel: Arc<AtomicBool>,
    marks: &Marks,
) {
    for (from, to) in pairs {
        let sides = [src, dst].map(|_| {
            let loading = Loading { cancel: cancel.clone(), ..Default::default() };
            loading.read_ahead.limit(read_ahead / 2);
            loading
        });
        let mut learned = Vec::new();
        if side_by_side([src, dst], &sides, *from, *to, threads, &mut learned).is_some() {
            let index = dst.index();
            for (pos, new) in learned {
                if index.contains_live(&new) {
                    marks.name(pos, new);
                }
            }
        }
    }
}

/// Walks tree `a` of the source and tree `b` of the destination together, level by level,
/// recording each data blob of `a` (by its source index position) with the blob at the same
/// place in `b`; `None` when the two are not the same tree or a tree cannot be loaded.
fn side_by_side(
    repos: [&Repository; 2],
    loading: &[Loading; 2],
    a: BlobId,
    b: BlobId,
    threads: usize,
    learned: &mut Vec<(usize, BlobId)>,
) -> Option<()> {
    let mut done: IdSet<BlobId> = IdSet::default();
    let mut level = vec![(a, b)];
    while !level.is_empty() {
        let mut next = Vec::new();
        for chunk in level.chunks(PAIRS_AT_ONCE) {
            let todo: Vec<(BlobId, BlobId)> = chunk.iter().copied().filter(|(a, _)| done.insert(*a)).collect();
            let [ta, tb] = [0, 1].map(|side| {
                let ids: Vec<BlobId> = todo.iter().map(|p| if side == 0 { p.0 } else { p.1 }).collect();
                load_level::<TreeBytes>(repos[side], &ids, threads, &loading[side]).ok().and_then(|loaded| {
                    loaded.into_iter().map(|(id, t)| t.ok().map(|t| (id, t))).collect::<Option<IdMap<_, _>>>()
                })
            });
            let (ta, tb) = (ta?, tb?);
            let index = repos[0].index();
            for (a, b) in &todo {
                let (ta, tb) = (ta.get(a)?, tb.get(b)?);
                if ta.len() != tb.len() {
                    return None;
                }
                for (na, nb) in ta.nodes().zip(tb.nodes()) {
                    if na.name != nb.name || na.kind != nb.kind || na.content.len() != nb.content.len() {
                        return None;
                    }
                    for (ca, cb) in na.content.iter().zip(&nb.content) {
                        match (ca, cb) {
                            (Chunk::Data { id: ia, len: la }, Chunk::Data { id: ib, len: lb }) if la == lb => {
                                // A blob no source index lists is the walk's error to report.
                                if let Some(pos) = index.position(ia) {
                                    learned.push((pos, *ib));
                                }
                            }
                            (Chunk::Zero { len: la }, Chunk::Zero { len: lb }) if la == lb => {}
                            _ => return None,
                        }
                    }
                    match (na.subtree, nb.subtree) {
                        (Some(sa), Some(sb)) => next.push((sa, sb)),
                        (None, None) => {}
                        _ => return None,
                    }
                }
            }
        }
        level = next;
    }
    Some(())
}
