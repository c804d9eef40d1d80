//! Plan stage: list the entries to restore (after `--include` / `--exclude`), then — once the
//! check stage knows which chunks are missing from the target — where every needed blob goes
//! and which ranged reads fetch them.
//!
//! Each distinct blob appears once, with all of its destinations (file, offset); the blobs of
//! one pack are sorted by offset and neighbours are coalesced into one read.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use globset::{Glob, GlobSet, GlobSetBuilder};

use super::check::NeededChunk;
use crate::crypto::SALT_LEN;
use crate::error::{Error, Result};
use crate::id::{BlobId, IdMap, PackId};
use crate::index::BlobLocation;
use crate::layout::pack_path;
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
    /// Index into the plan's entries.
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

impl PackRead {
    /// Plaintext bytes the blobs of this read decode to.
    pub fn raw_bytes(&self) -> u64 {
        self.blobs.iter().map(|b| u64::from(b.raw_length)).sum()
    }
}

/// The entries of a restore, parents before children.
#[derive(Debug, Default)]
pub struct Plan {
    /// Entries, parents before children.
    pub entries: Vec<Entry>,
}

/// Where the needed blobs go and how to fetch them.
#[derive(Debug, Default)]
pub struct Fetches {
    /// Destinations of every blob to fetch.
    pub dests: IdMap<BlobId, Vec<Dest>>,
    /// The reads that fetch them.
    pub reads: Vec<PackRead>,
    /// Blobs a file needs that no index lists: `(entry, blob)`.
    pub missing: Vec<(usize, BlobId)>,
    /// Chunks whose recorded length differs from their blob's: `(entry, blob)`.
    pub mismatched: Vec<(usize, BlobId)>,
    /// Stored bytes the reads will fetch.
    pub fetch_bytes: u64,
}

/// Reads with at most this gap between them are merged (the gap is read and dropped). On a
/// local disk another read costs little, so little is read in vain (a partial restore of the
/// Linux tree fetched 1.85x the changed chunks' bytes with 64 KiB); a remote request waits a
/// round trip, worth 64 KiB of unneeded bytes.
const LOCAL_GAP: u64 = 4 * 1024;
/// See [`LOCAL_GAP`].
const REMOTE_GAP: u64 = 64 * 1024;

/// The coalescing gap for `repo`'s storage.
fn coalesce_gap(repo: &Repository) -> u64 {
    if repo.storage().is_remote() {
        REMOTE_GAP
    } else {
        LOCAL_GAP
    }
}

/// Largest single read, and most plaintext one read decodes to (a read is decoded and written
/// as one batch).
pub const MAX_READ: u64 = 8 * 1024 * 1024;

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

/// Finds the node at `path` (absolute, inside the snapshot) without following symlinks.
/// Returns `None` for `/` (the root tree itself).
pub fn resolve(repo: &Repository, root: &BlobId, path: &str, snapshot: &str) -> Result<Option<Node>> {
    let mut tree_id = *root;
    let mut found = None;
    let not_found = || Error::PathNotFound { path: path.to_string(), snapshot: snapshot.to_string() };
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
    for (i, part) in parts.iter().enumerate() {
        let tree = repo.read_tree(&tree_id)?;
        let node = tree.nodes.into_iter().find(|n| n.name == part.as_bytes()).ok_or_else(not_found)?;
        if i + 1 < parts.len() {
            tree_id = node.subtree.ok_or_else(not_found)?;
        }
        found = Some(node);
    }
    Ok(found)
}

/// What a restore starts from.
pub enum Top {
    /// Restore the entries of this tree into the target.
    Tree(BlobId),
    /// Restore this one node into the target.
    Node(Box<Node>),
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

/// A loaded tree and how many directory nodes of other trees still refer to it (identical
/// directories share one tree): the last one takes it without a copy. Below a tree that will be
/// listed again every tree is copied, as it will be listed again too.
pub struct LoadedTree {
    tree: Tree,
    uses: u32,
}

/// Deepest directory nesting a restore accepts (a path that deep is already longer than
/// Linux's PATH_MAX); deeper trees are rejected instead of exhausting the stack.
pub const MAX_DEPTH: usize = 2048;

/// Lets the caller stop tree loading early and watch it progress.
#[derive(Default)]
pub struct Loading {
    /// Once set, loading stops after the reads in flight and fails with [`Error::Interrupted`].
    pub cancel: Arc<AtomicBool>,
    /// Tree reads completed so far.
    pub reads_done: AtomicU64,
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
        Top::Tree(id) => load_trees(repo, *id, threads, loading)?,
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

/// The chunks of a file with their offsets.
pub fn chunk_offsets(content: &[Chunk]) -> impl Iterator<Item = (u64, &Chunk)> {
    content.iter().scan(0u64, |off, c| {
        let at = *off;
        *off += c.len();
        Some((at, c))
    })
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

/// Groups blob locations by pack, sorts them by offset and merges neighbours at most `gap` bytes
/// apart into one read, up to [`MAX_READ`] stored bytes and [`MAX_READ`] of plaintext. A read's
/// reservation (the range plus its plaintext) stays within `budget`, so a small `--max-memory`
/// really bounds the bytes in flight. A blob that alone exceeds the budget is read on its own.
pub fn coalesce(mut located: Vec<BlobLocation>, budget: u64, gap: u64) -> Vec<PackRead> {
    located.sort_unstable_by_key(|l| (l.pack_no, l.entry.offset));
    let mut reads: Vec<PackRead> = Vec::new();
    let mut raw = 0; // plaintext bytes of the last read's blobs
    let mut last_pack = None;
    for loc in located {
        let b = loc.entry;
        let (start, end) = (u64::from(b.offset), u64::from(b.offset) + u64::from(b.length));
        if let Some(r) = reads.last_mut().filter(|_| last_pack == Some(loc.pack_no)) {
            let r_end = r.offset + r.length;
            let reserved = end - r.offset + raw + u64::from(b.raw_length);
            let fits = end - r.offset <= MAX_READ && raw + u64::from(b.raw_length) <= MAX_READ;
            if start >= r_end && start - r_end <= gap && fits && reserved <= budget {
                r.length = end - r.offset;
                r.blobs.push(b);
                raw += u64::from(b.raw_length);
                continue;
            }
        }
        last_pack = Some(loc.pack_no);
        reads.push(PackRead { pack: loc.pack, salt: loc.salt, offset: start, length: end - start, blobs: vec![b] });
        raw = u64::from(b.raw_length);
    }
    reads
}

/// Loads every tree below `root` ahead of planning: level by level, each level's tree blobs
/// fetched with coalesced ranged reads on `threads` threads. A level's reads are cut small
/// enough that every thread has some to decode (trees lie side by side in a few packs, and one
/// read per level left one core decoding while the other waited).
pub fn load_trees(
    repo: &Repository,
    root: BlobId,
    threads: usize,
    loading: &Loading,
) -> Result<IdMap<BlobId, LoadedTree>> {
    let mut trees: IdMap<BlobId, LoadedTree> = IdMap::default();
    let mut uses: IdMap<BlobId, u32> = IdMap::default();
    uses.insert(root, 1);
    let mut level = vec![root];
    for depth in 0.. {
        if level.is_empty() {
            break;
        }
        if depth > MAX_DEPTH {
            return Err(Error::invalid(
                format!("tree {}", level[0].short()),
                format!("directories nested deeper than {MAX_DEPTH} levels"),
            ));
        }
        // Trees the metadata cache holds are not fetched again (crate::cache).
        let mut cached = Vec::new();
        level.retain(|id| repo.cached_tree(id).map(|t| cached.push((*id, t))).is_none());
        let index = repo.index();
        let mut located = Vec::with_capacity(level.len());
        for id in &level {
            located
                .push(index.get(id).ok_or_else(|| Error::NotFound(format!("tree {} (not in any index)", id.short())))?);
        }
        drop(index);
        let level_bytes: u64 = located.iter().map(|l| u64::from(l.entry.length) + u64::from(l.entry.raw_length)).sum();
        let share = (level_bytes / (threads.max(1) as u64 * 4)).max(TREE_READ_MIN);
        let reads = coalesce(located, share, coalesce_gap(repo));
        let next = AtomicUsize::new(0);
        let loaded: Mutex<Vec<(BlobId, Tree)>> = Mutex::new(cached);
        let failed: Mutex<Option<Error>> = Mutex::new(None);
        std::thread::scope(|s| {
            for _ in 0..threads.clamp(1, reads.len().max(1)) {
                s.spawn(|| {
                    while let Some(read) = reads.get(next.fetch_add(1, Ordering::Relaxed)) {
                        if failed.lock().expect("lock").is_some() || loading.cancel.load(Ordering::Relaxed) {
                            return;
                        }
                        let result = read_trees(repo, read);
                        loading.reads_done.fetch_add(1, Ordering::Relaxed);
                        match result {
                            Ok(mut t) => loaded.lock().expect("lock").append(&mut t),
                            Err(e) => {
                                failed.lock().expect("lock").get_or_insert(e);
                                return;
                            }
                        }
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().expect("lock") {
            return Err(e);
        }
        if loading.cancel.load(Ordering::Relaxed) {
            return Err(Error::Interrupted);
        }
        level.clear();
        for (id, tree) in loaded.into_inner().expect("lock") {
            for n in &tree.nodes {
                if let Some(sub) = n.subtree {
                    *uses.entry(sub).or_default() += 1;
                    if !trees.contains_key(&sub) {
                        level.push(sub);
                    }
                }
            }
            trees.insert(id, LoadedTree { tree, uses: 0 });
        }
        level.sort_unstable();
        level.dedup();
        level.retain(|id| !trees.contains_key(id));
    }
    for (id, t) in trees.iter_mut() {
        t.uses = uses.get(id).copied().unwrap_or(1);
    }
    Ok(trees)
}

/// Smallest share of a tree level one read takes (below this, another read costs more than
/// decoding in parallel saves).
const TREE_READ_MIN: u64 = 256 * 1024;

/// Reads one coalesced range of tree blobs (again, if the transfer came back damaged) and
/// keeps each verified tree in the metadata cache.
fn read_trees(repo: &Repository, read: &PackRead) -> Result<Vec<(BlobId, Tree)>> {
    let path = pack_path(&read.pack);
    let key = repo.key().object_key(&read.salt);
    crate::repository::retry_damaged(|| {
        let bytes = repo.storage().read_range(&path, read.offset, read.length)?;
        read.blobs
            .iter()
            .map(|b| {
                let start = (u64::from(b.offset) - read.offset) as usize;
                Ok((b.id, repo.decode_tree(&key, b, &bytes[start..start + b.length as usize], &path)?))
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::Codec;
    use crate::pack::BlobKind;

    /// Blob `n` of pack 0 at `offset`, stored in `length` bytes, decoding to `raw` bytes.
    fn at(n: u8, offset: u32, length: u32, raw: u32) -> BlobLocation {
        let entry = BlobEntry {
            id: BlobId([n; 32]),
            kind: BlobKind::Data,
            codec: Codec::Zstd(1),
            offset,
            length,
            raw_length: raw,
        };
        BlobLocation { pack: PackId([0; 32]), pack_no: 0, salt: [0; SALT_LEN], entry }
    }

    fn shape(reads: &[PackRead]) -> Vec<(u64, u64, usize)> {
        reads.iter().map(|r| (r.offset, r.length, r.blobs.len())).collect()
    }

    #[test]
    fn neighbours_merge_across_small_gaps_only() {
        let locs = vec![at(3, 20_000, 100, 100), at(1, 0, 1000, 1000), at(2, 1000 + 4096, 100, 100)];
        let reads = coalesce(locs, u64::MAX, 4096);
        // Sorted by offset; the 4 KiB gap is read, the larger one is not.
        assert_eq!(shape(&reads), [(0, 5196, 2), (20_000, 100, 1)]);
    }

    #[test]
    fn reads_never_span_two_packs() {
        let in_pack = |mut l: BlobLocation, no: u32| {
            l.pack_no = no;
            l.pack = PackId([no as u8; 32]);
            l
        };
        // Two packs' blobs interleaved and out of order; pack 7's lie just after pack 3's.
        let locs = vec![
            in_pack(at(1, 400, 100, 100), 7),
            in_pack(at(2, 0, 100, 100), 3),
            in_pack(at(3, 300, 100, 100), 7),
            in_pack(at(4, 100, 100, 100), 3),
        ];
        let reads = coalesce(locs, u64::MAX, 4096);
        assert_eq!(shape(&reads), [(0, 200, 2), (300, 200, 2)]);
        assert_eq!(reads[0].pack, PackId([3; 32]));
        assert_eq!(reads[1].pack, PackId([7; 32]));
        assert_eq!(reads[1].blobs.iter().map(|b| b.id.0[0]).collect::<Vec<_>>(), [3, 1]);
    }

    #[test]
    fn a_read_decodes_to_at_most_max_read_bytes() {
        // Highly compressible blobs: 1 MiB stored each, 3 MiB of plaintext each.
        let mib = 1 << 20;
        let locs: Vec<_> = (0..6).map(|i| at(i, u32::from(i) * mib, mib, 3 * mib)).collect();
        let reads = coalesce(locs, u64::MAX, 0);
        assert_eq!(reads.iter().map(|r| r.blobs.len()).collect::<Vec<_>>(), [2, 2, 2]);
        assert!(reads.iter().all(|r| r.raw_bytes() <= MAX_READ));
    }

    #[test]
    fn a_small_budget_splits_reads_but_never_drops_a_blob() {
        let locs: Vec<_> = (0..4).map(|i| at(i, u32::from(i) * 1000, 1000, 1000)).collect();
        // Range plus plaintext of two blobs is 4000 bytes.
        assert_eq!(shape(&coalesce(locs.clone(), 4000, 0)), [(0, 2000, 2), (2000, 2000, 2)]);
        // A budget smaller than one blob: each is read alone.
        assert_eq!(coalesce(locs, 1, 0).len(), 4);
    }
}
