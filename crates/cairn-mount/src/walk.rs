//! The order a `tar`, `cp -r` or `rsync` of the mount reads small files in: a walk of a
//! snapshot's tree from the file opened on, depth first in name order (the order `readdir`
//! lists), into each subdirectory as it is met and, at the end of a directory, on after it in
//! its parent, up to the end of the snapshot. It plans a read-ahead [`Stream`]'s blobs a batch
//! at a time, loading the directories it passes (the reader's own lookups then find them
//! loaded).
//!
//! [`Stream`]: crate::prefetch::Stream

use std::sync::Arc;

use cairn_core::engine::repository::Repository;
use cairn_format::id::BlobId;
use cairn_format::tree::{Chunk, Node, NodeKind};

use crate::inodes::{Child, Ino, Inodes, What};
use crate::prefetch::Source;

/// Files up to this size are read ahead along the walk; larger ones by a stream of their own
/// when they are read.
pub const SMALL_FILE: u64 = 4 * 1024 * 1024;

/// Most files and plaintext bytes one batch plans.
const BATCH_FILES: usize = 256;
const BATCH_BYTES: u64 = 8 * 1024 * 1024;

/// Most files one walk plans (a reader still going gets a new walk from where it is).
const WALK_FILES: usize = 65_536;

/// A walk of a snapshot's tree from one file on.
pub struct Walk {
    repo: Arc<Repository>,
    inodes: Arc<Inodes>,
    /// The directories being walked, innermost last: each one's entries and the next to visit.
    stack: Vec<(Ino, Arc<[Child]>, usize)>,
    files: usize,
}

impl Walk {
    /// A walk from entry `from` (an index into its entries) of directory `dir` on.
    pub fn new(repo: Arc<Repository>, inodes: Arc<Inodes>, dir: Ino, from: usize) -> Self {
        let stack = match inodes.get(dir).map(|d| inodes.children(&repo, &d)) {
            Some(Ok(entries)) => vec![(dir, entries, from)],
            _ => Vec::new(),
        };
        Walk { repo, inodes, stack, files: 0 }
    }

    /// The next node of the walk, or `None` at the end of the snapshot.
    fn next_node(&mut self) -> Option<Arc<Node>> {
        loop {
            let (dir, entries, next) = self.stack.last_mut()?;
            let Some(ino) = entries.get(*next).map(|(_, i)| *i) else {
                let done = *dir;
                self.stack.pop();
                if self.stack.is_empty() {
                    self.climb(done);
                }
                continue;
            };
            *next += 1;
            let Some(inode) = self.inodes.get(ino) else { continue };
            let What::Node { node, .. } = &inode.what else { continue };
            if node.kind == NodeKind::Dir {
                // A directory that cannot be read is reported when the reader lists it.
                if let Ok(entries) = self.inodes.children(&self.repo, &inode) {
                    self.stack.push((ino, entries, 0));
                }
                continue;
            }
            return Some(node.clone());
        }
    }

    /// Goes on after directory `done` in its parent (unless it is the snapshot's root).
    fn climb(&mut self, done: Ino) {
        let Some(inode) = self.inodes.get(done) else { return };
        let What::Node { snapshot, parent, .. } = &inode.what else { return };
        if *snapshot == done {
            return;
        }
        let Some(up) = self.inodes.get(*parent) else { return };
        let Ok(entries) = self.inodes.children(&self.repo, &up) else { return };
        if let Some(at) = entries.iter().position(|(_, i)| *i == done) {
            self.stack.push((*parent, entries, at + 1));
        }
    }
}

impl Source for Walk {
    fn more(&mut self) -> Option<Vec<BlobId>> {
        let (mut blobs, mut files, mut bytes) = (Vec::new(), 0, 0);
        while files < BATCH_FILES && bytes < BATCH_BYTES && self.files < WALK_FILES {
            let Some(node) = self.next_node() else { break };
            if node.kind != NodeKind::File || node.size > SMALL_FILE {
                continue;
            }
            let before = blobs.len();
            blobs.extend(data_blobs(&node.content));
            if blobs.len() > before {
                files += 1;
                self.files += 1;
                bytes += node.size;
            }
        }
        (!blobs.is_empty()).then_some(blobs)
    }

    fn batch_in_any_order(&self) -> bool {
        true
    }
}

/// The blobs of `chunks`, in order.
pub fn data_blobs(chunks: &[Chunk]) -> impl Iterator<Item = BlobId> + '_ {
    chunks.iter().filter_map(|c| match c {
        Chunk::Data { id, .. } => Some(*id),
        Chunk::Zero { .. } => None,
    })
}
