//! Plan stage: list what to restore, where every blob goes, and which ranged reads fetch them.
//!
//! Each distinct blob appears once in the plan, with all of its destinations (file, offset);
//! the blobs of one pack are sorted by offset and neighbours are coalesced into one read.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::crypto::SALT_LEN;
use crate::error::{Error, Result};
use crate::id::{BlobId, PackId};
use crate::pack::BlobEntry;
use crate::repository::Repository;
use crate::tree::{Chunk, Node, NodeKind, Tree};

/// One file system entry to restore.
#[derive(Debug)]
pub struct Entry {
    /// Path relative to the target.
    pub rel: PathBuf,
    /// Its metadata and content.
    pub node: Node,
    /// For a hard link: the entry it is a link of.
    pub link_of: Option<usize>,
}

/// One place a blob's bytes go.
#[derive(Clone, Copy, Debug)]
pub struct Dest {
    /// Index into [`Plan::entries`].
    pub entry: u32,
    /// Byte offset in that file.
    pub offset: u64,
}

/// One ranged read of a pack, covering one or more blobs.
#[derive(Debug)]
pub struct PackRead {
    /// The pack.
    pub pack: PackId,
    /// The pack's salt.
    pub salt: [u8; SALT_LEN],
    /// Where the read starts.
    pub offset: u64,
    /// How much it reads.
    pub length: u64,
    /// The blobs it covers, by offset.
    pub blobs: Vec<BlobEntry>,
}

/// Everything a restore will do.
#[derive(Debug, Default)]
pub struct Plan {
    /// Entries, parents before children.
    pub entries: Vec<Entry>,
    /// Destinations of every blob to fetch.
    pub dests: HashMap<BlobId, Vec<Dest>>,
    /// The reads that fetch them.
    pub reads: Vec<PackRead>,
    /// Blobs a file needs that no index lists: `(entry, blob)`.
    pub missing: Vec<(usize, BlobId)>,
    /// Bytes of file content in total.
    pub total_bytes: u64,
    /// Of which zero (holes, zero chunks: never fetched, never written).
    pub zero_bytes: u64,
    /// Stored bytes the reads will fetch.
    pub fetch_bytes: u64,
}

/// Reads with less than this gap between them are merged (the gap is read and dropped).
const COALESCE_GAP: u64 = 64 * 1024;
/// Largest single read.
const MAX_READ: u64 = 8 * 1024 * 1024;

/// Finds the node at `path` (absolute, inside the snapshot) without following symlinks.
/// Returns `None` for `/` (the root tree itself).
pub fn resolve(
    repo: &Repository,
    root: &BlobId,
    path: &str,
    snapshot: &str,
) -> Result<Option<Node>> {
    let mut tree_id = *root;
    let mut found = None;
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    for (i, part) in parts.iter().enumerate() {
        let tree = repo.read_tree(&tree_id)?;
        let node = tree
            .nodes
            .into_iter()
            .find(|n| n.name == part.as_bytes())
            .ok_or_else(|| Error::PathNotFound {
                path: path.to_string(),
                snapshot: snapshot.to_string(),
            })?;
        if i + 1 < parts.len() {
            tree_id = node.subtree.ok_or_else(|| Error::PathNotFound {
                path: path.to_string(),
                snapshot: snapshot.to_string(),
            })?;
        }
        found = Some(node);
    }
    Ok(found)
}

/// Builds the plan for restoring `top` (the children of a directory tree, or one node).
pub fn build(repo: &Repository, top: Top) -> Result<Plan> {
    let mut plan = Plan::default();
    let mut links: HashMap<(u64, u64), usize> = HashMap::new();
    match top {
        Top::Tree(id) => add_tree(repo, &id, Path::new(""), &mut plan, &mut links)?,
        Top::Node(node) => add_node(repo, *node, Path::new(""), &mut plan, &mut links)?,
    }
    plan_reads(repo, &mut plan);
    Ok(plan)
}

/// What a restore starts from.
pub enum Top {
    /// Restore the entries of this tree into the target.
    Tree(BlobId),
    /// Restore this one node into the target.
    Node(Box<Node>),
}

fn add_tree(
    repo: &Repository,
    id: &BlobId,
    dir: &Path,
    plan: &mut Plan,
    links: &mut HashMap<(u64, u64), usize>,
) -> Result<()> {
    let tree: Tree = repo.read_tree(id)?;
    for node in tree.nodes {
        add_node(repo, node, dir, plan, links)?;
    }
    Ok(())
}

fn add_node(
    repo: &Repository,
    node: Node,
    dir: &Path,
    plan: &mut Plan,
    links: &mut HashMap<(u64, u64), usize>,
) -> Result<()> {
    let rel = dir.join(OsStr::from_bytes(&node.name));
    let index = plan.entries.len();
    let subtree = node.subtree;
    let mut link_of = None;
    if node.kind == NodeKind::File {
        if node.links > 1 {
            match links.get(&(node.device_id, node.inode)) {
                Some(&first) => link_of = Some(first),
                None => {
                    links.insert((node.device_id, node.inode), index);
                }
            }
        }
        if link_of.is_none() {
            add_content(plan, index, &node.content);
        }
    }
    plan.entries.push(Entry {
        rel: rel.clone(),
        node,
        link_of,
    });
    if let Some(sub) = subtree {
        add_tree(repo, &sub, &rel, plan, links)?;
    }
    Ok(())
}

fn add_content(plan: &mut Plan, entry: usize, content: &[Chunk]) {
    let mut offset = 0u64;
    for chunk in content {
        match *chunk {
            Chunk::Data { id, .. } => {
                plan.dests.entry(id).or_default().push(Dest {
                    entry: entry as u32,
                    offset,
                });
            }
            Chunk::Zero { len } => plan.zero_bytes += len,
        }
        offset += chunk.len();
    }
    plan.total_bytes += offset;
}

/// Groups the needed blobs by pack, sorts them by offset and coalesces neighbours.
fn plan_reads(repo: &Repository, plan: &mut Plan) {
    let index = repo.index();
    let mut by_pack: BTreeMap<u32, (PackId, [u8; SALT_LEN], Vec<BlobEntry>)> = BTreeMap::new();
    for (id, dests) in &plan.dests {
        match index.get(id) {
            Some(loc) => by_pack
                .entry(loc.pack_no)
                .or_insert_with(|| (loc.pack, loc.salt, Vec::new()))
                .2
                .push(loc.entry),
            None => plan
                .missing
                .extend(dests.iter().map(|d| (d.entry as usize, *id))),
        }
    }
    for (_, (pack, salt, mut blobs)) in by_pack {
        blobs.sort_by_key(|b| b.offset);
        let mut current: Option<PackRead> = None;
        for b in blobs {
            let (start, end) = (
                u64::from(b.offset),
                u64::from(b.offset) + u64::from(b.length),
            );
            if let Some(r) = current.as_mut() {
                let r_end = r.offset + r.length;
                if start >= r_end && start - r_end <= COALESCE_GAP && end - r.offset <= MAX_READ {
                    r.length = end - r.offset;
                    r.blobs.push(b);
                    continue;
                }
                plan.fetch_bytes += r.length;
                plan.reads.push(current.take().expect("current read"));
            }
            current = Some(PackRead {
                pack,
                salt,
                offset: start,
                length: end - start,
                blobs: vec![b],
            });
        }
        if let Some(r) = current {
            plan.fetch_bytes += r.length;
            plan.reads.push(r);
        }
    }
}
