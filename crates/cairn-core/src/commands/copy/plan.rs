//! Plan stage: the snapshots' trees are walked in the source (the one tree walker, level by
//! level, each tree handed on as it is decoded and dropped after), and the blobs the copy must
//! read are handed to the transfer in batches as the walk meets them: what the copy holds does
//! not grow with the number of files (docs/DESIGN.md, "Copy").
//!
//! With the same IDs in both repositories a blob is read only when the destination lacks it,
//! trees included. Otherwise every data blob is read, to learn its name under the destination's
//! key, except those whose name an earlier copy told (`known`) and the destination still holds;
//! the trees are not read as blobs but rewritten later, so the walk keeps each tree's subtrees
//! (the rewrite's order) and, within `hold` bytes, the trees themselves.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::marks::{locate, Marks};
use crate::engine::repository::Repository;
use crate::engine::trees::{for_each_tree, Loading};
use crate::error::{Error, Result};
use cairn_format::id::{BlobId, IdMap};
use cairn_format::index::BlobLocation;
use cairn_format::tree::{Chunk, TreeBytes};

/// What the walk met.
#[derive(Default)]
pub(super) struct Walked {
    /// Distinct trees.
    pub trees: u64,
    /// Distinct data blobs.
    pub data: u64,
    /// Data blobs whose destination ID an earlier copy told (not read).
    pub known: u64,
    /// Each tree's subtrees (only when renaming: the rewrite's order).
    pub shape: IdMap<BlobId, Box<[BlobId]>>,
    /// Trees kept as they were decoded for the rewrite (only when renaming, within `hold`).
    pub held: IdMap<BlobId, TreeBytes>,
}

/// How the walk runs.
pub(super) struct Walk<'a> {
    pub src: &'a Repository,
    pub dst: &'a Repository,
    /// Whether blobs are renamed (the repositories' IDs differ).
    pub rename: bool,
    /// Threads that load trees.
    pub threads: usize,
    /// Bytes of trees held: half for tree packs read ahead of the walk, half for decoded trees
    /// kept for the rewrite.
    pub hold: u64,
    /// Blobs a batch holds at most.
    pub batch: usize,
}

impl Walk<'_> {
    /// Walks every tree below `roots`, handing `send` each batch of source blobs to read; a tree
    /// that cannot be read is an error naming it (no snapshot is copied then).
    pub fn run(
        &self,
        roots: &[BlobId],
        marks: &Marks,
        cancel: Arc<AtomicBool>,
        mut send: impl FnMut(Vec<BlobLocation>) -> Result<()> + Send,
    ) -> Result<Walked> {
        let loading = Loading { cancel, ..Default::default() };
        loading.read_ahead.limit(self.hold / 2);
        let mut walked = Walked::default();
        let mut batch = Vec::new();
        let mut held_bytes = 0u64;
        for_each_tree(self.src, roots.iter().copied(), self.threads, &loading, |id, tree| {
            let tree = tree.map_err(|e| {
                Error::Refused(format!(
                    "the source's tree {} cannot be read ({e}); no snapshot was copied: run `cairn check` on the source",
                    id.short()
                ))
            })?;
            walked.trees += 1;
            self.meet(id, &tree, marks, &mut walked, &mut batch)?;
            if self.rename {
                walked.shape.insert(id, tree.subtrees().into());
                if held_bytes + tree.memory_bytes() <= self.hold / 2 {
                    held_bytes += tree.memory_bytes();
                    walked.held.insert(id, tree);
                }
            }
            // Sent with no index locked: the transfer's workers and the destination's indexer
            // take those locks while this waits for room.
            if batch.len() >= self.batch {
                send(std::mem::take(&mut batch))?;
            }
            Ok(())
        })?;
        if !batch.is_empty() {
            send(batch)?;
        }
        Ok(walked)
    }

    /// Adds to `batch` what of tree `id` must be read: the tree itself (same IDs, when the
    /// destination lacks it) and each data blob met for the first time that the destination
    /// lacks or must be named.
    fn meet(
        &self,
        id: BlobId,
        tree: &TreeBytes,
        marks: &Marks,
        walked: &mut Walked,
        batch: &mut Vec<BlobLocation>,
    ) -> Result<()> {
        let index = self.src.index();
        let dst_index = self.dst.index();
        if !self.rename && !dst_index.contains_live(&id) {
            batch.push(locate(&index, &id)?.1);
        }
        for node in tree.nodes() {
            for chunk in &node.content {
                let Chunk::Data { id, .. } = chunk else { continue };
                let (pos, loc) = locate(&index, id)?;
                if !marks.meet(pos) {
                    continue;
                }
                walked.data += 1;
                if !self.rename {
                    if !dst_index.contains_live(id) {
                        batch.push(loc);
                    }
                    continue;
                }
                // Named by an earlier copy (`known.rs`), which the destination still holds.
                if marks.named(pos) {
                    walked.known += 1;
                } else {
                    batch.push(loc);
                }
            }
        }
        Ok(())
    }
}
