//! Plan stage: list the entries to restore (after `--include` / `--exclude`), then — once the
//! compare stage knows which chunks are missing from the target — where every needed blob goes
//! and which ranged reads fetch them.
//!
//! Each distinct blob appears once, with all of its destinations (file, offset); the blobs of
//! one pack are sorted by offset and neighbours are coalesced into one read.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use globset::{Glob, GlobSet, GlobSetBuilder};

use super::types::{ClosedDir, Dest, Entry, Fetches, Link, NeededChunk, Plan};
use crate::engine::read::{coalesce, gap_within, join_parts, most_parts, PackRead};
use crate::engine::repository::Repository;
use crate::engine::trees::{Ahead, Loading, TreeLoader, MAX_DEPTH};
use crate::error::{Error, Result};
use cairn_format::id::{BlobId, IdSet};
use cairn_format::index::{BlobLocation, Index};
use cairn_format::snapshot::Snapshot;
use cairn_format::tree::{Node, NodeKind};

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
        Some(p) => match crate::engine::trees::resolve(repo, &snapshot.tree, p, name)? {
            None => (Top::Tree(snapshot.tree), true, None),
            Some(node) if node.kind == NodeKind::Dir => {
                (Top::Tree(node.subtree.expect("validated dir")), true, Some(node))
            }
            Some(node) => (Top::Node(Box::new(node)), false, None),
        },
    })
}

/// How a restore's entries are cut into batches, each planned, fetched and written before the
/// next: the entries' estimated memory ([`entry_cost`]) a batch may reach.
#[derive(Clone, Copy, Debug)]
pub struct BatchLimit {
    /// Estimated bytes of a batch's entries and the state the stages keep for them.
    pub bytes: u64,
}

impl BatchLimit {
    /// One batch, however large (a dump of a directory lists every entry before it streams).
    pub const NONE: BatchLimit = BatchLimit { bytes: u64::MAX };

    /// The share of a restore's `--max-memory` its entries may take: an eighth, at least
    /// [`BATCH_MIN`] (see docs/DESIGN.md, "Restore in batches").
    pub fn for_memory(max_memory: u64) -> Self {
        BatchLimit { bytes: (max_memory / 8).max(BATCH_MIN) }
    }

    /// An empty batch with room for as many entries as fit the limit at their least cost:
    /// a vector growing by doubling would hold up to twice the batch's entries, and both
    /// copies while it moves.
    fn empty_plan(self) -> Plan {
        let most = (self.bytes / ENTRY_COST_MIN).min(BATCH_ENTRIES_PRESIZED) as usize;
        Plan { entries: Vec::with_capacity(most), closed: Vec::new() }
    }

    /// The first batch's limit: an eighth of the limit, at least [`BATCH_MIN`]; each next
    /// batch may be twice the one before, up to the limit. The stages after the plan wait for
    /// the first batch (a no-op restore of a million files compared nothing for the 0.2 s the
    /// walk took to list a full one), not for the later ones, which are listed meanwhile.
    fn first(self) -> u64 {
        (self.bytes / 8).max(BATCH_MIN).min(self.bytes)
    }

    /// Stored bytes of trees the walk loads ahead at most (beyond the next one): half a batch,
    /// at most [`TREE_BYTES_AHEAD`].
    pub fn trees_ahead(self) -> u64 {
        (self.bytes / 2).min(TREE_BYTES_AHEAD)
    }

    /// Bytes of whole tree packs the walk may hold ([`crate::engine::trees::ReadAhead`]: a pack read
    /// whole the first time a tree in it is wanted saves a round trip per directory level):
    /// twice the trees ahead (a pack is let go once every tree in it was taken).
    pub fn tree_packs(self) -> u64 {
        2 * self.trees_ahead()
    }

    /// What is left of `max_memory` for the data in flight: `fixed` (the index, already in
    /// memory) is taken first; two batches are in memory at once (one restored, the next being
    /// planned), the trees ahead take about three times their stored size, and the tree packs
    /// held; at least a quarter of `max_memory` (a small budget is mostly the minimum batch and
    /// the index) and [`DATA_MIN`].
    pub fn data_budget(self, max_memory: u64, fixed: u64) -> u64 {
        let taken = fixed
            .saturating_add(self.bytes.saturating_mul(2))
            .saturating_add(3 * self.trees_ahead() + self.tree_packs());
        max_memory.saturating_sub(taken).max(max_memory / 4).max(DATA_MIN)
    }
}

/// The smallest data budget a restore runs with, whatever `--max-memory` is left for it.
pub const DATA_MIN: u64 = 1024 * 1024;

/// The smallest batch limit: below it, a batch's start and drain cost more than it saves.
pub const BATCH_MIN: u64 = 4 * 1024 * 1024;

/// The least an entry costs ([`entry_cost`]).
const ENTRY_COST_MIN: u64 = 640;

/// Most entries a batch makes room for up front (a restore without batches grows its vector).
const BATCH_ENTRIES_PRESIZED: u64 = 1 << 20;

/// Estimated bytes an entry costs while its batch is restored: the entry itself and what the
/// compare, schedule and write stages keep per entry and per chunk (measured: see
/// docs/DESIGN.md, "Restore in batches").
pub fn entry_cost(e: &Entry) -> u64 {
    let n = &e.node;
    let xattrs: usize = n.xattrs.iter().map(|x| x.name.len() + x.value.len() + 48).sum();
    let acl = n.acl_access.as_ref().map_or(0, Vec::len) + n.acl_default.as_ref().map_or(0, Vec::len);
    (ENTRY_COST_MIN as usize
        + 2 * e.rel.as_os_str().len()
        + n.name.len()
        + n.target.len()
        + xattrs
        + acl
        + 160 * n.content.len()) as u64
}

/// Trees loaded ahead of the walk: enough to keep a remote repository's round trips overlapped.
const TREES_AHEAD: usize = 64;

/// Bytes of trees (as stored, unpacked) loaded ahead of the walk at most, beyond the next one;
/// a tree takes about three times its stored size in memory.
const TREE_BYTES_AHEAD: u64 = 8 * 1024 * 1024;

/// Lists the entries for restoring `top`, whose snapshot path is `base`, in one plan (trees are
/// loaded on `threads` threads).
pub fn build(
    repo: &Repository,
    top: Top,
    base: &Path,
    filter: &Filter,
    threads: usize,
    loading: &Loading,
) -> Result<Plan> {
    let mut all = None;
    stream(repo, top, base, filter, false, threads, loading, BatchLimit::NONE, |plan| {
        all = Some(plan);
        true
    })?;
    Ok(all.unwrap_or_default())
}

/// Lists the entries for restoring `top`, whose snapshot path is `base`, depth first in tree
/// order, and hands them to `emit` in batches of at most `limit` (the last batch closes the
/// walk; `emit` returning false stops it). Trees are loaded a window ahead on `threads`
/// threads, so memory holds the walk's path, the window and one batch, not the whole tree.
/// With `names`, each closed directory lists its children in the restore (for `--delete`).
#[allow(clippy::too_many_arguments)]
pub fn stream(
    repo: &Repository,
    top: Top,
    base: &Path,
    filter: &Filter,
    names: bool,
    threads: usize,
    loading: &Loading,
    limit: BatchLimit,
    emit: impl FnMut(Plan) -> bool,
) -> Result<()> {
    std::thread::scope(|s| {
        // A repository whose trees lie in a few packs has them all read at once, side by side
        // (not when the metadata cache holds the trees, nor for a file without any).
        let root = match &top {
            Top::Tree(id) => Some(*id),
            Top::Node(node) => node.subtree,
        };
        if root.is_some_and(|id| repo.cached_tree_as::<cairn_format::tree::TreeBytes>(&id).is_none()) {
            for read in loading.read_ahead.all_tree_packs(repo) {
                s.spawn(move || crate::engine::trees::read_whole(repo, &read, &loading.read_ahead));
            }
        }
        let loader = TreeLoader::start_with(s, repo, threads.max(1), Some(&loading.read_ahead));
        let mut b = Builder {
            filter,
            ahead: Ahead::new(repo, &loader, TREES_AHEAD, limit.trees_ahead()),
            loading,
            plan: limit.empty_plan(),
            cost: 0,
            cut_at: limit.first(),
            limit,
            emit,
            batch: 0,
            links: HashMap::new(),
            open: Vec::new(),
            materialized: 0,
            names,
        };
        match top {
            Top::Tree(id) => {
                // The target itself: open, made, never an entry.
                b.open.push(OpenDir { rel: PathBuf::new(), node: None, names: names.then(HashSet::new) });
                b.materialized = 1;
                b.add_tree(&id, Path::new(""), base, false)?;
                b.close_dir();
            }
            Top::Node(node) => {
                let abs = base.to_path_buf();
                b.add_node(*node, Path::new(""), &abs, false)?;
            }
        }
        // The tree packs read ahead are not needed once the walk is over (nor those the start
        // hint had read that the walk did not take).
        loading.read_ahead.release();
        repo.drop_preloaded_packs();
        let last = std::mem::take(&mut b.plan);
        (b.emit)(last);
        Ok(())
    })
}

/// A directory on the walk's path.
struct OpenDir {
    rel: PathBuf,
    /// Its node (none for the target itself).
    node: Option<Node>,
    /// Its children in the restore so far (for `--delete`).
    names: Option<HashSet<OsString>>,
}

/// Where a hard-linked file's first entry went.
struct FirstLink {
    batch: u64,
    index: usize,
    rel: PathBuf,
}

struct Builder<'a, 'l, E> {
    filter: &'a Filter,
    ahead: Ahead<'l>,
    loading: &'a Loading,
    plan: Plan,
    /// Estimated bytes of `plan`'s entries.
    cost: u64,
    /// The cost at which this batch is handed on: [`BatchLimit::first`] for the first, twice
    /// that for the next, up to the limit.
    cut_at: u64,
    limit: BatchLimit,
    emit: E,
    /// How many batches were handed on.
    batch: u64,
    links: HashMap<(u64, u64), FirstLink>,
    /// The directories on the walk's path, the target first.
    open: Vec<OpenDir>,
    /// How many of `open` are entries already: a directory becomes one once it or something
    /// below it is selected (a directory the filters leave empty is not restored).
    materialized: usize,
    names: bool,
}

impl<E: FnMut(Plan) -> bool> Builder<'_, '_, E> {
    /// Adds a tree's entries; returns whether anything was added.
    fn add_tree(&mut self, id: &BlobId, dir: &Path, abs_dir: &Path, parent_included: bool) -> Result<bool> {
        if self.open.len() > MAX_DEPTH {
            return Err(Error::invalid(
                format!("tree {}", id.short()),
                format!("directories nested deeper than {MAX_DEPTH} levels"),
            ));
        }
        if self.loading.cancel.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::Interrupted);
        }
        let tree = self.ahead.take(id)?;
        self.loading.reads_done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut any = false;
        for node in tree.into_nodes() {
            // Absolute paths are only for the filters; without any, none is built.
            let abs = if self.filter.is_empty() { PathBuf::new() } else { abs_dir.join(OsStr::from_bytes(&node.name)) };
            any |= self.add_node(node, dir, &abs, parent_included)?;
        }
        self.ahead.left();
        Ok(any)
    }

    fn add_node(&mut self, node: Node, dir: &Path, abs: &Path, parent_included: bool) -> Result<bool> {
        if self.filter.excluded(abs) {
            return Ok(false);
        }
        let included = parent_included || self.filter.included(abs);
        let rel = dir.join(OsStr::from_bytes(&node.name));
        if let Some(sub) = node.subtree {
            self.open.push(OpenDir { rel: rel.clone(), node: Some(node), names: self.names.then(HashSet::new) });
            if included {
                self.materialize()?;
            }
            let any = self.add_tree(&sub, &rel, abs, included)?;
            self.close_dir();
            return Ok(included || any);
        }
        if !included {
            return Ok(false);
        }
        self.materialize()?;
        let mut link_of = None;
        if node.kind == NodeKind::File && node.links > 1 {
            match self.links.get(&(node.device_id, node.inode)) {
                Some(first) if first.batch == self.batch => link_of = Some(Link::Entry(first.index)),
                Some(first) => link_of = Some(Link::Earlier(first.rel.clone())),
                None => {
                    let first = FirstLink { batch: self.batch, index: self.plan.entries.len(), rel: rel.clone() };
                    self.links.insert((node.device_id, node.inode), first);
                }
            }
        }
        self.push(Entry { rel, node, link_of })?;
        Ok(true)
    }

    /// Makes entries of the open directories that are not yet (parents first).
    fn materialize(&mut self) -> Result<()> {
        while self.materialized < self.open.len() {
            let d = &self.open[self.materialized];
            let entry =
                Entry { rel: d.rel.clone(), node: d.node.clone().expect("only the target has no node"), link_of: None };
            self.materialized += 1;
            self.push_entry(entry, self.materialized - 1)?;
        }
        Ok(())
    }

    /// Adds an entry whose parent is the innermost open directory.
    fn push(&mut self, e: Entry) -> Result<()> {
        self.push_entry(e, self.open.len())
    }

    /// Adds an entry whose parent is open directory `depth - 1`; hands the batch on once it
    /// is full.
    fn push_entry(&mut self, e: Entry, depth: usize) -> Result<()> {
        if let (Some(parent), Some(name)) = (depth.checked_sub(1).and_then(|d| self.open.get_mut(d)), e.rel.file_name())
        {
            if let Some(names) = &mut parent.names {
                names.insert(name.to_os_string());
            }
        }
        self.cost += entry_cost(&e);
        self.plan.entries.push(e);
        if self.cost >= self.cut_at {
            self.cut()?;
        }
        Ok(())
    }

    /// Hands the batch on.
    fn cut(&mut self) -> Result<()> {
        let plan = std::mem::replace(&mut self.plan, self.limit.empty_plan());
        self.cost = 0;
        self.cut_at = self.cut_at.saturating_mul(2).min(self.limit.bytes);
        self.batch += 1;
        if (self.emit)(plan) {
            Ok(())
        } else {
            Err(Error::Interrupted)
        }
    }

    /// The innermost open directory is complete: once its batch is written, its metadata can
    /// be set (and `--delete` can look through it).
    fn close_dir(&mut self) {
        let d = self.open.pop().expect("a directory is open");
        if self.materialized > self.open.len() {
            self.materialized = self.open.len();
            self.plan.closed.push(ClosedDir { rel: d.rel, node: d.node, names: d.names });
        }
    }
}

/// Builds the fetches for the chunks that `needed(entry)` lists, grouped by pack, sorted by
/// offset and coalesced into reads that each fit in `budget`, reading through gaps of at most
/// `gap` bytes (see [`coalesce`], and [`crate::engine::read::LinkCost`] for the gap). The blobs
/// in `local` (the local-data stage copies them) get their destinations but no read: only a
/// copy that fails verification has them fetched, by [`late_reads`].
///
/// The wanted chunks are sorted by blob ID first: each distinct blob is then looked up once,
/// in the index's own order, and its destinations are already side by side. (Looking every
/// chunk up in hash maps cost 80–140 ms of cache misses for the Linux tree's 80,000 chunks.)
pub fn fetches(
    repo: &Repository,
    plan: &Plan,
    needed: &[Vec<NeededChunk>],
    local: &IdSet<BlobId>,
    budget: u64,
    gap: Gap,
) -> Fetches {
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
        if local.contains(&id) {
            // Copied from local data; the index is asked only if the copy fails.
            f.dests.insert(id, same.iter().map(|(_, d, _)| *d).collect());
        } else if let Some(loc) = located_blob(&index, id, same, &mut f) {
            located.push(loc);
        }
    }
    drop(index);
    f.reads = gap.coalesce(located, budget, most_parts(repo));
    f.fetch_bytes = f.reads.iter().map(|r| r.length).sum();
    f
}

/// How far apart two wanted blobs of a pack may lie and still be read together.
#[derive(Clone, Copy, Debug)]
pub enum Gap {
    /// At most this many bytes.
    Bytes(u64),
    /// At most this many bytes, and only while the bytes read through stay within
    /// [`crate::engine::read::gap_within`]'s share of the wanted bytes: what lies between the
    /// wanted blobs is what local data supplies, and reading it would spend the link's bytes
    /// local data is there to save.
    Within(u64),
}

impl Gap {
    /// The reads of `located`, each within `budget`; with [`Gap::Within`], the reads of one
    /// pack that may not be read through as one read of up to `most` ranges ([`join_parts`]).
    pub fn coalesce(self, located: Vec<BlobLocation>, budget: u64, most: usize) -> Vec<PackRead> {
        match self {
            Gap::Bytes(g) => coalesce(located, budget, g),
            Gap::Within(g) => {
                let gap = g.min(gap_within(&located, LOCAL_EXTRA));
                join_parts(coalesce(located, budget, gap), budget, most)
            }
        }
    }
}

/// The share of the wanted bytes a batch that copies local data may read through the gaps
/// between them (see [`Gap::Within`]).
pub const LOCAL_EXTRA: f64 = 0.25;

/// The location of blob `id`, wanted at the destinations `same` (each with the chunk length
/// its tree records); `None` with the destinations noted as missing or mismatched in `f` when
/// it cannot be fetched for them, or once fetched for the ones whose length fits.
fn located_blob(index: &Index, id: BlobId, same: &[(BlobId, Dest, u32)], f: &mut Fetches) -> Option<BlobLocation> {
    let Some(loc) = index.get(&id) else {
        // Still a destination, so its files never count as complete.
        f.missing.extend(same.iter().map(|(_, d, _)| (d.entry as usize, id)));
        f.dests.insert(id, same.iter().map(|(_, d, _)| *d).collect());
        return None;
    };
    // A tree whose chunk length disagrees with the blob would make a file of the wrong
    // size: that file fails instead.
    let (fits, wrong): (Vec<_>, Vec<_>) = same.iter().partition(|(_, _, len)| *len == loc.entry.raw_length);
    f.mismatched.extend(wrong.iter().map(|(_, d, _)| (d.entry as usize, id)));
    if fits.is_empty() {
        return None;
    }
    f.dests.insert(id, fits.iter().map(|(_, d, _)| *d).collect());
    Some(loc)
}

/// The reads that fetch the blobs `ids` (of `len` bytes each, as the trees record them) whose
/// local copy failed: they were left out of `f`'s reads ([`fetches`]' `local`) and keep the
/// destinations listed there. Those the index lacks, or whose length differs, fail their
/// files (`fail(entry, why)`).
pub fn late_reads(
    repo: &Repository,
    f: &Fetches,
    ids: &[(BlobId, u32)],
    budget: u64,
    gap: Gap,
    fail: impl Fn(usize, &str),
) -> Vec<PackRead> {
    let index = repo.index();
    let mut located = Vec::new();
    for &(id, len) in ids {
        let dests = f.dests.get(&id).map_or(&[][..], Vec::as_slice);
        match index.get(&id) {
            Some(loc) if loc.entry.raw_length == len => located.push(loc),
            Some(_) => {
                dests.iter().for_each(|d| fail(d.entry as usize, &mismatched(&id)));
            }
            None => dests.iter().for_each(|d| fail(d.entry as usize, &missing(&id))),
        }
    }
    drop(index);
    gap.coalesce(located, budget, most_parts(repo))
}

/// Why a file fails when a blob it needs is not in the index.
pub fn missing(id: &BlobId) -> String {
    format!("blob {} is not in the repository index", id.short())
}

/// Why a file fails when a chunk's recorded length is not its blob's.
pub fn mismatched(id: &BlobId) -> String {
    format!("a chunk's recorded length differs from blob {}", id.short())
}
