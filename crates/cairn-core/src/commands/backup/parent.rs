//! The parent snapshot: chosen automatically (the newest with the same host and paths), given
//! with `--parent`, or none with `--force`. The walker follows the parent's trees alongside
//! the file system, so an unchanged file's chunk list is reused without reading the file.

use std::collections::HashMap;

use crossbeam_channel::Receiver;

use crate::engine::repository::Repository;
use crate::engine::storage::Provenance;
use crate::error::Result;
use cairn_format::id::{BlobId, SnapshotId};
use cairn_format::snapshot::Snapshot;
use cairn_format::tree::{Node, NodeKind, TreeBytes};

/// Which snapshot a backup compares against.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ParentChoice {
    /// The newest snapshot of the same host and paths (through `cairn serve`: that this
    /// client's token stored).
    #[default]
    Auto,
    /// This snapshot (`latest` or an ID prefix).
    Given(String),
    /// None: every file is read (`--force`).
    Force,
}

/// Finds the parent snapshot for a backup of `paths` from `hostname`.
pub fn choose(
    repo: &Repository,
    choice: &ParentChoice,
    hostname: &str,
    paths: &[String],
) -> Result<Option<(SnapshotId, Snapshot)>> {
    match choice {
        ParentChoice::Force => Ok(None),
        ParentChoice::Given(spec) => repo.find_snapshot(spec).map(Some),
        ParentChoice::Auto => {
            let mut want = paths.to_vec();
            want.sort();
            let snapshots = repo.snapshots()?;
            let provenance = repo.storage().provenance();
            Ok(snapshots.into_iter().rev().find(|(id, s)| {
                let mut have = s.paths.clone();
                have.sort();
                s.hostname == hostname && have == want && stored_by_this_token(&provenance, id)
            }))
        }
    }
}

/// Whether snapshot `id` may be chosen as a parent as far as who stored it goes: through a
/// server that records it (FORMAT.md §15.4), only a snapshot this client's token stored. Another
/// token's snapshot of the same host and paths (one planted by another host with an append
/// token) would otherwise make the backup keep, for every unchanged file, the content that
/// snapshot names. Elsewhere no record exists and any snapshot may be the parent.
fn stored_by_this_token(provenance: &Provenance, id: &SnapshotId) -> bool {
    match provenance {
        Provenance::Recorded(r) => r.snapshots.get(id) == Some(&r.this_token),
        Provenance::NotServed | Provenance::NotRecorded => true,
    }
}

use crate::engine::trees::Loaded;
pub(super) use crate::engine::trees::TreeLoader;

/// Parent trees loaded at once.
pub(super) const TREE_LOADERS: usize = 4;

/// One directory of the parent snapshot (empty where the parent has no such directory), with
/// its subdirectories' trees on their way.
pub(super) struct ParentDir {
    tree: Option<TreeBytes>,
    coming: HashMap<Vec<u8>, Receiver<Loaded>>,
    /// Why the parent's tree of this directory could not be read (its files are then read).
    pub unreadable: Option<String>,
}

impl ParentDir {
    /// The parent's root tree. A parent tree that cannot be read is treated as absent (its
    /// files are read) and said so in `unreadable`.
    pub fn root(repo: &Repository, tree: Option<BlobId>, loader: &TreeLoader) -> Self {
        ParentDir::new(tree.map(|id| load(repo, id)), loader)
    }

    fn new(loaded: Option<Loaded>, loader: &TreeLoader) -> Self {
        let (tree, unreadable) = match loaded {
            None => (None, None),
            Some(Ok(t)) => (Some(t), None),
            Some(Err(why)) => (None, Some(why)),
        };
        let coming = tree
            .iter()
            .flat_map(|t| t.nodes())
            .filter_map(|n| Some((n.name, loader.request(n.subtree.filter(|_| n.kind == NodeKind::Dir)?))))
            .collect();
        ParentDir { tree, coming, unreadable }
    }

    /// The parent's entry named `name` (the parent's tree is kept encoded: 4 bytes an entry
    /// beside its encoding, so a directory of 250,000 entries takes about 30 MB, not 200).
    pub fn node(&self, name: &[u8]) -> Option<Node> {
        self.tree.as_ref()?.get(name)
    }

    /// The parent's tree ID of subdirectory `name`.
    pub fn subtree(&self, name: &[u8]) -> Option<BlobId> {
        self.node(name).filter(|n| n.kind == NodeKind::Dir).and_then(|n| n.subtree)
    }

    /// The parent's subdirectory `name` (taken: each is walked once).
    pub fn child(&mut self, name: &[u8], loader: &TreeLoader) -> ParentDir {
        let loaded = self.coming.remove(name).and_then(|rx| rx.recv().ok());
        ParentDir::new(loaded, loader)
    }
}

fn load(repo: &Repository, id: BlobId) -> Loaded {
    repo.read_tree_bytes(&id).map_err(|e| e.to_string())
}

/// Whether `now` is the parent's file `old` unchanged: same size, modification and status
/// change times, inode and device, and every chunk still in the index, in a pack no pending
/// prune is about to delete (FORMAT.md §13).
pub(super) fn unchanged(old: &Node, now: &Node, repo: &Repository) -> bool {
    old.kind == NodeKind::File
        && old.size == now.size
        && old.mtime == now.mtime
        && old.ctime == now.ctime
        && old.inode == now.inode
        && old.device_id == now.device_id
        && {
            let index = repo.index();
            old.content.iter().all(|c| match c {
                cairn_format::tree::Chunk::Data { id, .. } => index.contains_live(id),
                cairn_format::tree::Chunk::Zero { .. } => true,
            })
        }
}
