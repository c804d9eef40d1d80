//! Asynchronous completion: a directory's tree blob is stored when its last entry is done,
//! on whichever thread finishes that entry.
//!
//! The walker lists a directory into a [`PendingDir`], leaving a [`Slot`] for every entry
//! that is not finished yet (a file being read, a subdirectory being walked). Readers fill
//! slots as files are read; the last fill (or the end of the listing) stores the tree and
//! fills the directory's own slot in its parent. So a reader never waits for a directory, and
//! the walker never waits for a reader. Finished entries are held encoded ([`TreeBuf`]), so a
//! directory of many files waiting for its last one costs about 100 bytes per entry.

use std::sync::{Arc, Mutex};

use super::progress::Counters;
use super::treebuf::TreeBuf;
use super::Shared;
use crate::error::Result;
use cairn_format::id::BlobId;
use cairn_format::pack::BlobKind;
use cairn_format::tree::Node;

/// A directory whose tree is not stored yet.
pub(super) struct PendingDir {
    state: Mutex<DirState>,
    /// Where the finished tree's ID goes; `None` for the root.
    up: Option<Slot>,
    /// This directory's tree in the parent snapshot (for the new/changed/unmodified counts).
    old: Option<BlobId>,
}

struct DirState {
    /// The entries in name order.
    tree: TreeBuf,
    /// Unfinished entries, plus one while the directory is still being listed.
    pending: usize,
}

/// An entry of a pending directory that is still being worked on.
pub(super) struct Slot {
    dir: Arc<PendingDir>,
    index: usize,
}

impl PendingDir {
    /// Starts a directory whose tree will fill `up` (the root when `None`).
    pub fn new(up: Option<Slot>, old: Option<BlobId>) -> Arc<Self> {
        Arc::new(PendingDir { state: Mutex::new(DirState { tree: TreeBuf::default(), pending: 1 }), up, old })
    }

    /// Adds a finished entry.
    pub fn push_done(&self, node: Node) {
        self.state.lock().expect("pending dir lock").tree.push_done(&node);
    }

    /// Adds an entry that a later [`Slot::fill`] finishes.
    pub fn push(self: &Arc<Self>, node: Node) -> Slot {
        let mut st = self.state.lock().expect("pending dir lock");
        st.pending += 1;
        let index = st.tree.push_open(node);
        Slot { dir: self.clone(), index }
    }

    /// Marks the listing finished; stores the tree if every entry is done.
    pub fn listed(self: &Arc<Self>, sh: &Shared<'_>) -> Result<()> {
        self.release(sh)
    }

    fn release(self: &Arc<Self>, sh: &Shared<'_>) -> Result<()> {
        let tree = {
            let mut st = self.state.lock().expect("pending dir lock");
            st.pending -= 1;
            if st.pending > 0 {
                return Ok(());
            }
            std::mem::take(&mut st.tree)
        };
        let id = sh.store.save(BlobKind::Tree, tree.into_bytes())?;
        let c = sh.counters;
        Counters::bump(match self.old {
            None => &c.dirs_new,
            Some(old) if old == id => &c.dirs_unmodified,
            Some(_) => &c.dirs_changed,
        });
        match &self.up {
            Some(slot) => slot.fill(sh, |n| n.subtree = Some(id)),
            None => {
                *sh.root.lock().expect("root lock") = Some(id);
                Ok(())
            }
        }
    }
}

impl Slot {
    /// Finishes the entry with `finish`.
    pub fn fill(&self, sh: &Shared<'_>, finish: impl FnOnce(&mut Node)) -> Result<()> {
        self.dir.state.lock().expect("pending dir lock").tree.finish(self.index, finish);
        self.dir.release(sh)
    }

    /// Leaves the entry out of its directory (it could not be read).
    pub fn drop_entry(&self, sh: &Shared<'_>) -> Result<()> {
        self.dir.state.lock().expect("pending dir lock").tree.leave_out(self.index);
        self.dir.release(sh)
    }
}
