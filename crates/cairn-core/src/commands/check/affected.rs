//! Names the snapshots and paths that need what a check found missing or damaged: each chosen
//! snapshot's trees are walked again, skipping subtrees already known to need nothing bad.

use std::sync::atomic::{AtomicBool, Ordering};

use super::{Affected, Finding, Progress};
use crate::engine::repository::Repository;
use crate::engine::trees::MAX_DEPTH;
use crate::error::{Error, Result};
use cairn_format::id::{BlobId, IdMap, IdSet, SnapshotId};
use cairn_format::snapshot::Snapshot;
use cairn_format::tree::Chunk;

/// Most affected paths listed per finding (the count of the rest is in the message).
const MAX_AFFECTED: usize = 1000;

/// Fills in each finding's `affected` list.
pub fn name(
    repo: &Repository,
    snapshots: &[(SnapshotId, Snapshot)],
    findings: &mut [Finding],
    cancel: &AtomicBool,
    progress: &Progress,
) -> Result<()> {
    let mut bad: IdMap<BlobId, Vec<usize>> = IdMap::default();
    for (i, f) in findings.iter().enumerate() {
        for b in &f.blobs {
            bad.entry(*b).or_default().push(i);
        }
    }
    let mut walk = Walk { repo, bad: &bad, clean: IdSet::default(), hits: Vec::new(), cancel };
    for (id, snap) in snapshots {
        progress.step();
        let short = id.short();
        walk.tree(&snap.tree, "", &short, 0)?;
    }
    let mut extra = vec![0usize; findings.len()];
    walk.hits.sort();
    walk.hits.dedup();
    for (i, a) in walk.hits {
        if findings[i].affected.len() < MAX_AFFECTED {
            findings[i].affected.push(a);
        } else {
            extra[i] += 1;
        }
    }
    for (f, more) in findings.iter_mut().zip(extra) {
        if more > 0 {
            f.message.push_str(&format!(" (and {more} more paths)"));
        }
    }
    Ok(())
}

struct Walk<'a> {
    repo: &'a Repository,
    bad: &'a IdMap<BlobId, Vec<usize>>,
    /// Trees below which nothing bad is needed.
    clean: IdSet<BlobId>,
    hits: Vec<(usize, Affected)>,
    cancel: &'a AtomicBool,
}

impl Walk<'_> {
    fn hit(&mut self, id: &BlobId, snapshot: &str, path: &str) -> bool {
        let Some(findings) = self.bad.get(id) else { return false };
        let path = if path.is_empty() { "/".to_string() } else { path.to_string() };
        for &i in findings {
            self.hits.push((i, Affected { snapshot: snapshot.to_string(), path: path.clone() }));
        }
        true
    }

    /// Walks tree `id` at `path`; returns whether anything below needs a bad blob.
    fn tree(&mut self, id: &BlobId, path: &str, snapshot: &str, depth: usize) -> Result<bool> {
        if self.clean.contains(id) || depth > MAX_DEPTH {
            return Ok(false);
        }
        if self.cancel.load(Ordering::Relaxed) {
            return Err(Error::Interrupted);
        }
        if self.hit(id, snapshot, path) {
            return Ok(true); // the directory itself cannot be read
        }
        let Ok(tree) = self.repo.read_tree(id) else { return Ok(false) };
        let mut any = false;
        for node in &tree.nodes {
            let p = format!("{path}/{}", node.name_lossy());
            for c in &node.content {
                if let Chunk::Data { id, .. } = c {
                    // Every bad chunk: each finding names the paths that need its blob.
                    any |= self.hit(id, snapshot, &p);
                }
            }
            if let Some(sub) = node.subtree {
                any |= self.tree(&sub, &p, snapshot, depth + 1)?;
            }
        }
        if !any {
            self.clean.insert(*id);
        }
        Ok(any)
    }
}
