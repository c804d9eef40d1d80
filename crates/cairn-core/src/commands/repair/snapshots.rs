//! `repair snapshots`: for snapshots whose trees need blobs no index has (or trees that cannot
//! be read), new snapshots with each such file cut to the chunks before its first missing one
//! and each unreadable directory emptied. The trees that change are written anew (one pack);
//! the original snapshot stays unless asked to forget it.

use crate::engine::repository::Repository;
use crate::engine::select::SnapshotFilter;
use crate::engine::trees::MAX_DEPTH;
use crate::error::Result;
use cairn_format::id::{BlobId, IdMap, IdSet, SnapshotId};
use cairn_format::layout::snapshot_path;
use cairn_format::pack::BlobKind;
use cairn_format::tree::{Chunk, NodeKind, Tree};

/// What `repair snapshots` did (or, in a dry run, would do) to one snapshot.
#[derive(Debug)]
pub struct SnapshotRepair {
    /// The damaged snapshot.
    pub old: SnapshotId,
    /// Its repaired copy (`None` in a dry run).
    pub new: Option<SnapshotId>,
    /// Files cut: path, size before, size after.
    pub cut: Vec<(String, u64, u64)>,
    /// Directories that could not be read and are now empty.
    pub emptied: Vec<String>,
    /// Whether the damaged original was removed.
    pub forgotten: bool,
}

/// Repairs the snapshots `filter` selects (the index must be loaded). With `forget` the
/// originals are removed (the caller then holds the exclusive lock); with `dry_run` nothing is
/// written.
pub fn repair_snapshots(
    repo: &Repository,
    filter: &SnapshotFilter,
    forget: bool,
    dry_run: bool,
) -> Result<Vec<SnapshotRepair>> {
    let mut out = Vec::new();
    let mut fixer = Fixer { repo, clean: IdSet::default(), new_trees: IdMap::default() };
    let mut pending = Vec::new();
    // A snapshot file that cannot be read cannot be repaired: the others still are.
    let (readable, _) = repo.read_snapshots()?;
    for (id, snap) in filter.choose(readable, &filter.provenance(repo)?)? {
        let mut rep = SnapshotRepair { old: id, new: None, cut: Vec::new(), emptied: Vec::new(), forgotten: false };
        if let Some(root) = fixer.tree(&snap.tree, "", 0, &mut rep)? {
            pending.push((snap, root, rep));
        }
    }
    // A damaged sorted index answers "not found": those cuts would drop data that is there.
    repo.index_intact()?;
    if dry_run || pending.is_empty() {
        out.extend(pending.into_iter().map(|(_, _, r)| r));
        return Ok(out);
    }
    // The new trees first (one pack and its index), then the snapshots that need them.
    let blobs: Vec<(BlobKind, Vec<u8>)> = fixer
        .new_trees
        .into_iter()
        .filter(|(id, _)| !repo.index().contains(id))
        .map(|(_, bytes)| (BlobKind::Tree, bytes))
        .collect();
    if !blobs.is_empty() {
        repo.write_pack(&blobs, repo.config().codec())?;
    }
    for (mut snap, root, mut rep) in pending {
        snap.tree = root;
        rep.new = Some(repo.save_snapshot(&snap)?);
        if forget {
            repo.storage().delete(&snapshot_path(&rep.old))?;
            rep.forgotten = true;
        }
        out.push(rep);
    }
    Ok(out)
}

struct Fixer<'a> {
    repo: &'a Repository,
    /// Trees that need nothing missing.
    clean: IdSet<BlobId>,
    /// Trees written anew, by ID.
    new_trees: IdMap<BlobId, Vec<u8>>,
}

impl Fixer<'_> {
    /// The ID of the repaired tree `id` at `path`, or `None` if it needs no repair.
    fn tree(&mut self, id: &BlobId, path: &str, depth: usize, rep: &mut SnapshotRepair) -> Result<Option<BlobId>> {
        if self.clean.contains(id) || depth > MAX_DEPTH {
            return Ok(None);
        }
        let mut tree = match self.repo.read_tree(id) {
            Ok(t) => t,
            Err(_) => {
                rep.emptied.push(if path.is_empty() { "/".into() } else { path.to_string() });
                return Ok(Some(self.store(&Tree::default())));
            }
        };
        let mut changed = false;
        for node in &mut tree.nodes {
            let p = format!("{path}/{}", node.name_lossy());
            if node.kind == NodeKind::File {
                let index = self.repo.index();
                let first_missing = node.content.iter().position(|c| match c {
                    Chunk::Data { id, .. } => !index.contains(id),
                    Chunk::Zero { .. } => false,
                });
                drop(index);
                if let Some(at) = first_missing {
                    node.content.truncate(at);
                    let size = node.content.iter().map(Chunk::len).sum();
                    rep.cut.push((p.clone(), node.size, size));
                    node.size = size;
                    changed = true;
                }
            }
            if let Some(sub) = node.subtree {
                if let Some(new) = self.tree(&sub, &p, depth + 1, rep)? {
                    node.subtree = Some(new);
                    changed = true;
                }
            }
        }
        if !changed {
            self.clean.insert(*id);
            return Ok(None);
        }
        Ok(Some(self.store(&tree)))
    }

    fn store(&mut self, tree: &Tree) -> BlobId {
        let bytes = tree.to_bytes();
        let id = self.repo.key().blob_id(&bytes);
        self.new_trees.insert(id, bytes);
        id
    }
}
