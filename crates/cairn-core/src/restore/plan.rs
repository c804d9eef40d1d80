//! Plan stage: list the entries to restore (after `--include` / `--exclude`), then — once the
//! compare stage knows which chunks are missing from the target — where every needed blob goes
//! and which ranged reads fetch them.
//!
//! Each distinct blob appears once, with all of its destinations (file, offset); the blobs of
//! one pack are sorted by offset and neighbours are coalesced into one read.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use globset::{Glob, GlobSet, GlobSetBuilder};

use super::types::{Dest, Entry, Fetches, NeededChunk, Plan};
use crate::error::{Error, Result};
use crate::id::{BlobId, IdMap};
use crate::read::{coalesce, coalesce_gap};
use crate::repository::Repository;
use crate::snapshot::Snapshot;
use crate::tree::{Node, NodeKind};
use crate::trees::{load_all, LoadedTree, Loading, MAX_DEPTH};

/// Which snapshot paths a restore takes.
#[derive(Default)]
pub struct Filter {
    include: Option<GlobSet>,
    exclude: Option<GlobSet>,
}

fn globset(patterns: &[String]) -> Result<Option<GlobSet>> {
    if patterns.is_empty() {
        return Ok(None);
    }
    let mut b = GlobSetBuilder::new();
    for p in patterns {
        b.add(Glob::new(p).map_err(|e| Error::Usage(format!("bad pattern {p:?}: {e}")))?);
    }
    Ok(Some(b.build().map_err(|e| Error::Usage(format!("bad patterns: {e}")))?))
}

impl Filter {
    /// Builds a filter from `--include` and `--exclude` globs, matched against the absolute
    /// path inside the snapshot and against the entry's name.
    pub fn new(include: &[String], exclude: &[String]) -> Result<Self> {
        Ok(Filter { include: globset(include)?, exclude: globset(exclude)? })
    }

    fn matches(set: &GlobSet, abs: &Path) -> bool {
        set.is_match(abs) || abs.file_name().is_some_and(|n| set.is_match(n))
    }

    fn is_empty(&self) -> bool {
        self.include.is_none() && self.exclude.is_none()
    }

    fn excluded(&self, abs: &Path) -> bool {
        self.exclude.as_ref().is_some_and(|s| Self::matches(s, abs))
    }

    fn included(&self, abs: &Path) -> bool {
        self.include.as_ref().is_none_or(|s| Self::matches(s, abs))
    }

    /// Whether an entry at `rel` below the restore's snapshot path `base` would be selected
    /// were it in the snapshot: not excluded, and included itself or below an included
    /// directory (as [`build`] decides). `--delete` removes only such entries, so a filtered
    /// restore never deletes what its filters leave out.
    pub fn selects(&self, base: &Path, rel: &Path) -> bool {
        let abs = base.join(rel);
        !self.excluded(&abs) && abs.ancestors().take_while(|a| *a != base).any(|a| self.included(a))
    }
}

/// What a restore starts from.
pub enum Top {
    /// Restore the entries of this tree into the target.
    Tree(BlobId),
    /// Restore this one node into the target.
    Node(Box<Node>),
}

/// Where restoring `base` (absolute inside `snapshot`, named `name` in messages; `None` for the
/// whole snapshot) starts: the top, whether its entries go into the target (rather than the one
/// node being the target), and for `SNAP:DIR` the directory, whose metadata the target takes
/// (`SNAP:DIR` restores DIR's contents into the target).
pub fn start(
    repo: &Repository,
    snapshot: &Snapshot,
    name: &str,
    base: Option<&Path>,
) -> Result<(Top, bool, Option<Node>)> {
    Ok(match base {
        None => (Top::Tree(snapshot.tree), true, None),
        Some(p) => match crate::trees::resolve(repo, &snapshot.tree, p, name)? {
            None => (Top::Tree(snapshot.tree), true, None),
            Some(node) if node.kind == NodeKind::Dir => {
                (Top::Tree(node.subtree.expect("validated dir")), true, Some(node))
            }
            Some(node) => (Top::Node(Box::new(node)), false, None),
        },
    })
}

struct Builder<'a> {
    repo: &'a Repository,
    filter: &'a Filter,
    plan: Plan,
    links: HashMap<(u64, u64), usize>,
    depth: usize,
    trees: IdMap<BlobId, LoadedTree>,
    /// Trees on the current path that will be listed again (see [`LoadedTree`]).
    again: usize,
}

/// Lists the entries for restoring `top`, whose snapshot path is `base`; trees are loaded on
/// `threads` threads first.
pub fn build(
    repo: &Repository,
    top: Top,
    base: &Path,
    filter: &Filter,
    threads: usize,
    loading: &Loading,
) -> Result<Plan> {
    let trees = match &top {
        Top::Tree(id) => load_all(repo, *id, threads, loading)?,
        Top::Node(_) => IdMap::default(),
    };
    let mut b = Builder { repo, filter, plan: Plan::default(), links: HashMap::new(), depth: 0, trees, again: 0 };
    match top {
        Top::Tree(id) => {
            b.add_tree(&id, Path::new(""), base, false)?;
        }
        Top::Node(node) => {
            let abs = base.to_path_buf();
            b.add_node(*node, Path::new(""), &abs, false)?;
        }
    }
    Ok(b.plan)
}

impl Builder<'_> {
    /// Adds a tree's entries; returns whether anything was added.
    fn add_tree(&mut self, id: &BlobId, dir: &Path, abs_dir: &Path, parent_included: bool) -> Result<bool> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Error::invalid(
                format!("tree {}", id.short()),
                format!("directories nested deeper than {MAX_DEPTH} levels"),
            ));
        }
        // Below a tree that will be listed again, every tree will be listed again too: copied.
        let again_above = self.again > 0;
        let (tree, again) = match self.trees.get_mut(id) {
            Some(t) if again_above => (t.tree.clone(), true),
            Some(t) if t.uses > 1 => {
                t.uses -= 1;
                (t.tree.clone(), true)
            }
            Some(_) => (self.trees.remove(id).expect("tree just found").tree, false),
            None => (self.repo.read_tree(id)?, again_above),
        };
        self.again += usize::from(again);
        let mut any = false;
        for node in tree.nodes {
            // Absolute paths are only for the filters; without any, none is built.
            let abs = if self.filter.is_empty() { PathBuf::new() } else { abs_dir.join(OsStr::from_bytes(&node.name)) };
            any |= self.add_node(node, dir, &abs, parent_included)?;
        }
        self.again -= usize::from(again);
        self.depth -= 1;
        Ok(any)
    }

    fn add_node(&mut self, node: Node, dir: &Path, abs: &Path, parent_included: bool) -> Result<bool> {
        if self.filter.excluded(abs) {
            return Ok(false);
        }
        let included = parent_included || self.filter.included(abs);
        let rel = dir.join(OsStr::from_bytes(&node.name));
        if let Some(sub) = node.subtree {
            let index = self.plan.entries.len();
            self.plan.entries.push(Entry { rel: rel.clone(), node, link_of: None });
            let any = self.add_tree(&sub, &rel, abs, included)?;
            if !included && !any {
                self.plan.entries.truncate(index);
                return Ok(false);
            }
            return Ok(true);
        }
        if !included {
            return Ok(false);
        }
        let index = self.plan.entries.len();
        let mut link_of = None;
        if node.kind == NodeKind::File && node.links > 1 {
            match self.links.get(&(node.device_id, node.inode)) {
                Some(&first) => link_of = Some(first),
                None => {
                    self.links.insert((node.device_id, node.inode), index);
                }
            }
        }
        self.plan.entries.push(Entry { rel, node, link_of });
        Ok(true)
    }
}

/// Builds the fetches for the chunks that `needed(entry)` lists, grouped by pack, sorted by
/// offset and coalesced into reads that each fit in `budget` (see [`coalesce`]).
///
/// The wanted chunks are sorted by blob ID first: each distinct blob is then looked up once,
/// in the index's own order, and its destinations are already side by side. (Looking every
/// chunk up in hash maps cost 80–140 ms of cache misses for the Linux tree's 80,000 chunks.)
pub fn fetches(repo: &Repository, plan: &Plan, needed: &[Vec<NeededChunk>], budget: u64) -> Fetches {
    debug_assert_eq!(needed.len(), plan.entries.len());
    let mut wanted: Vec<(BlobId, Dest, u32)> = Vec::with_capacity(needed.iter().map(Vec::len).sum());
    for (i, chunks) in needed.iter().enumerate() {
        wanted.extend(chunks.iter().map(|c| (c.id, Dest { entry: i as u32, offset: c.offset }, c.len)));
    }
    // By ID, and each blob's destinations in plan order (the decode stage picks a batch's
    // writer by its first destination).
    wanted.sort_unstable_by_key(|w| (w.0, w.1.entry, w.1.offset));
    let mut f = Fetches::default();
    let mut located = Vec::new();
    let index = repo.index();
    for same in wanted.chunk_by(|a, b| a.0 == b.0) {
        let id = same[0].0;
        let Some(loc) = index.get(&id) else {
            // Still a destination, so its files never count as complete.
            f.missing.extend(same.iter().map(|(_, d, _)| (d.entry as usize, id)));
            f.dests.insert(id, same.iter().map(|(_, d, _)| *d).collect());
            continue;
        };
        // A tree whose chunk length disagrees with the blob would make a file of the wrong
        // size: that file fails instead.
        let (fits, wrong): (Vec<_>, Vec<_>) = same.iter().partition(|(_, _, len)| *len == loc.entry.raw_length);
        f.mismatched.extend(wrong.iter().map(|(_, d, _)| (d.entry as usize, id)));
        if !fits.is_empty() {
            f.dests.insert(id, fits.iter().map(|(_, d, _)| *d).collect());
            located.push(loc);
        }
    }
    drop(index);
    f.reads = coalesce(located, budget, coalesce_gap(repo));
    f.fetch_bytes = f.reads.iter().map(|r| r.length).sum();
    f
}
