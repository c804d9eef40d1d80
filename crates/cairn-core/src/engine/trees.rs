//! The one tree loader and walker: restore planning, `ls`, `dump` and `check` find and load
//! trees here.
//!
//! [`for_each_tree`] loads every distinct tree below a set of roots level by level, each
//! level's tree blobs fetched with coalesced ranged reads on several threads, so a remote
//! repository waits one round trip per level, not per directory ([`load_all`] keeps them, for
//! `copy`'s comparison of two snapshots). [`walk`] and [`walk_with`] visit one snapshot in tree
//! order with its trees loaded a bounded window ahead (`ls`, `find`); [`resolve`] follows one
//! path. When the trees wanted are
//! known up front (every tree the index lists, for `check`), [`load_listed`] reads them all at
//! once through the read path: one round of many requests instead of one per level. A walker
//! that goes one directory at a time beside something else (a backup beside its parent
//! snapshot) asks a [`TreeLoader`], which loads the trees it will want next on a few threads.
//!
//! Level by level still costs one round trip per level of nesting (a backup of `/home/me/src`
//! is six levels deep before the first file). But a backup writes a directory's tree after its
//! subdirectories', into packs of trees only, so the trees below a tree lie in the same few
//! packs: a walk reads all of each tree pack it meets ([`ReadAhead`], up to a pack's target
//! size) and finds the next levels already in memory. A restore then waits one round trip for
//! its trees when they lie in one pack, and one per further pack they lead into.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crossbeam_channel::{bounded, Receiver, Sender};

use crate::engine::memory::MaxMemory;
use crate::engine::read::{coalesce, coalesce_gap, Decoded, PackRead, ReadRef, Reader, Sink};
use crate::engine::repository::Repository;
use crate::error::{Error, Result};
use cairn_format::id::{BlobId, IdMap, IdSet, PackId};
use cairn_format::index::BlobLocation;
use cairn_format::layout::pack_path;
use cairn_format::pack::BlobEntry;
use cairn_format::tree::{Node, Nodes, TreeBytes, TreeForm};

/// Deepest directory nesting accepted (a path that deep is already longer than Linux's
/// PATH_MAX); deeper trees are rejected instead of exhausting the stack.
pub const MAX_DEPTH: usize = 2048;

/// Smallest share of a tree level one read takes (below this, another read costs more than
/// decoding in parallel saves).
const TREE_READ_MIN: u64 = 256 * 1024;

/// The most stored bytes of trees one read of a level takes ([`load_level_each`]): its trees are
/// held parsed (about three times their stored size) until each is handed on.
const TREE_READ_MAX: u64 = 4 * 1024 * 1024;

/// Lets the caller stop tree loading early and watch it progress.
#[derive(Default)]
pub struct Loading {
    /// Once set, loading stops after the reads in flight and fails with [`Error::Interrupted`].
    pub cancel: Arc<AtomicBool>,
    /// Tree reads completed so far.
    pub reads_done: AtomicU64,
    /// Tree pack bytes read ahead of the levels that will want them.
    pub read_ahead: ReadAhead,
}

/// Most bytes of tree packs one walk reads ahead and holds (the Linux tree's trees take about
/// 5 MiB stored; a walk of many snapshots holds at most this much beyond the trees it loads).
pub(crate) const READ_AHEAD_MAX: u64 = 64 * 1024 * 1024;

/// Most tree packs [`ReadAhead::all_tree_packs`] reads at once at the start of a walk.
pub(crate) const ALL_TREE_PACKS: usize = cairn_format::hint::TREE_PACKS_MAX;

/// Tree pack bytes read ahead by one walk: the ranges read, by pack, the packs already read
/// whole (each at most once), those whose whole read is still in flight, and where each pack's
/// blobs end. Dropped with the walk's [`Loading`].
#[derive(Default)]
pub struct ReadAhead {
    /// Most bytes held (0: [`READ_AHEAD_MAX`]).
    max: AtomicU64,
    held: Mutex<Holding>,
    /// Signalled when a whole pack read in flight has landed (or failed).
    landed: Condvar,
    packs: Mutex<IdSet<PackId>>,
    bytes: AtomicU64,
    pack_ends: std::sync::OnceLock<Vec<u64>>,
}

/// The ranges held, and the packs being read whole: a tree of such a pack waits for that read
/// instead of sending its own request one round trip behind it.
#[derive(Default)]
struct Holding {
    ranges: Vec<Held>,
    /// Pack → where its whole read (from 0) ends, while that read is in flight.
    pending: IdMap<PackId, u64>,
}

/// One range of a pack read ahead.
struct Held {
    pack: PackId,
    offset: u64,
    bytes: Arc<Vec<u8>>,
    /// Bytes of its blobs not taken yet: once every blob was, the range is let go.
    left: u64,
    /// Where the blobs taken so far begin: a blob taken again (a tree met twice) counts once.
    taken: HashSet<u64>,
    /// A pack's whole read, counted against the limit.
    whole: bool,
}

impl ReadAhead {
    /// The held bytes of a blob at `loc`, and where in them it lies; the blob counts as taken.
    /// A range whose every blob was taken is let go at once, unless it is a whole pack (counted
    /// against the limit): that stays until [`ReadAhead::extend`] needs its room, since a tree
    /// met again (an identical or empty directory elsewhere) would otherwise be read on its own,
    /// one round trip after another. A blob of a pack whose whole read is in flight waits for it.
    fn take(&self, loc: &BlobLocation) -> Option<(Arc<Vec<u8>>, usize)> {
        let (start, len) = (u64::from(loc.entry.offset), u64::from(loc.entry.length));
        let mut state = self.held.lock().expect("read-ahead lock");
        let i = loop {
            let found = state.ranges.iter().position(|h| {
                h.pack == loc.pack && h.offset <= start && start + len <= h.offset + h.bytes.len() as u64
            });
            match (found, state.pending.get(&loc.pack)) {
                (Some(i), _) => break i,
                (None, Some(end)) if start + len <= *end => {
                    state = self.landed.wait(state).expect("read-ahead lock");
                }
                (None, _) => return None,
            }
        };
        let held = &mut state.ranges;
        let h = &mut held[i];
        let found = (h.bytes.clone(), (start - h.offset) as usize);
        if h.taken.insert(start) {
            h.left = h.left.saturating_sub(len);
        }
        if h.left == 0 && !h.whole {
            held.swap_remove(i);
        }
        Some(found)
    }

    /// Lets go of whole packs whose every blob was taken, oldest first, until `need` bytes fit
    /// under `max` (or none is left to let go).
    fn make_room(&self, need: u64, max: u64) {
        let mut state = self.held.lock().expect("read-ahead lock");
        while self.bytes.load(Ordering::Relaxed) + need > max {
            let Some(i) = state.ranges.iter().position(|h| h.whole && h.left == 0) else { return };
            self.free(state.ranges.remove(i));
        }
    }

    /// Gives the room of a whole pack let go back to the limit.
    fn free(&self, gone: Held) {
        if gone.whole {
            let freed = gone.bytes.len() as u64;
            let _ = self.bytes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| Some(b.saturating_sub(freed)));
        }
    }

    /// Widens `read` (of pack number `pack_no` in `repo`'s index) to all the blobs of its pack,
    /// the first time the pack is read, if the pack is no larger than the repository's target
    /// pack size (a little over counts: the packer closes a pack past it) and the walk holds
    /// less than its limit.
    fn extend(&self, repo: &Repository, read: &mut PackRead, pack_no: u32) {
        let pack_size = u64::from(repo.config().pack_size) * 5 / 4;
        let ends = self.pack_ends.get_or_init(|| repo.index().pack_ends());
        let end = ends.get(pack_no as usize).copied().unwrap_or(0).max(read.offset + read.length);
        let max = self.max();
        if end > pack_size {
            return;
        }
        self.make_room(end, max);
        if end > max.saturating_sub(self.bytes.load(Ordering::Relaxed)) {
            return;
        }
        if !self.packs.lock().expect("read-ahead lock").insert(read.pack) {
            return;
        }
        // Held whole until its blobs are taken (see `take`); its trees wait for it meanwhile.
        self.bytes.fetch_add(end, Ordering::Relaxed);
        self.held.lock().expect("read-ahead lock").pending.insert(read.pack, end);
        read.offset = 0;
        read.length = end;
    }

    /// When the repository's trees lie in a few packs that fit under the limit together (at most
    /// [`ALL_TREE_PACKS`], each no larger than the target pack size), the whole reads of all of
    /// them, to be run side by side now ([`read_whole`]): every tree the walk wants then waits
    /// for one round trip, however many packs its levels lead through one after another.
    /// Registered as in flight, so the first trees wanted wait for these reads. None otherwise.
    pub(crate) fn all_tree_packs(&self, repo: &Repository) -> Vec<PackRead> {
        let ends = self.pack_ends.get_or_init(|| repo.index().pack_ends());
        let Some(packs) = whole_tree_packs(repo, ends, self.max()) else { return Vec::new() };
        let mut state = self.held.lock().expect("read-ahead lock");
        let mut read = self.packs.lock().expect("read-ahead lock");
        packs
            .into_iter()
            .filter(|(pack, ..)| read.insert(*pack))
            .map(|(pack, salt, end)| {
                self.bytes.fetch_add(end, Ordering::Relaxed);
                state.pending.insert(pack, end);
                PackRead::range(pack, salt, 0, end, Vec::new())
            })
            .collect()
    }

    /// Most bytes held.
    fn max(&self) -> u64 {
        match self.max.load(Ordering::Relaxed) {
            0 => READ_AHEAD_MAX,
            m => m,
        }
    }

    /// `read` is over, held or failed: if it was its pack's whole read, the trees waiting for
    /// it go on (to the bytes held, or to a read of their own).
    fn finished(&self, read: &PackRead) {
        let mut state = self.held.lock().expect("read-ahead lock");
        if read.offset == 0 && state.pending.get(&read.pack) == Some(&read.length) {
            state.pending.remove(&read.pack);
            self.landed.notify_all();
        }
    }

    /// Keeps the bytes of `read` for the levels to come if it holds more than the blobs it was
    /// made for (which are taken at once). A pack's whole read (see [`ReadAhead::extend`]) is
    /// held as such.
    fn hold(&self, read: &PackRead, bytes: &Arc<Vec<u8>>) {
        let mut taken = HashSet::with_capacity(read.blobs.len());
        let wanted: u64 =
            read.blobs.iter().filter(|b| taken.insert(u64::from(b.offset))).map(|b| u64::from(b.length)).sum();
        let left = read.length.saturating_sub(wanted);
        if left == 0 {
            return;
        }
        let bytes = bytes.clone();
        let mut state = self.held.lock().expect("read-ahead lock");
        let whole = read.offset == 0 && state.pending.get(&read.pack) == Some(&read.length);
        state.ranges.push(Held { pack: read.pack, offset: read.offset, bytes, left, taken, whole });
    }

    /// Holds at most `bytes` (a restore's share of `--max-memory` for tree packs), instead of
    /// [`READ_AHEAD_MAX`].
    pub fn limit(&self, bytes: u64) {
        self.max.store(bytes.max(1), Ordering::Relaxed);
    }

    /// Frees what is held (a finished walk: a restore's [`Loading`] lives on through its data
    /// pipeline, which must not carry tree packs beside its budget).
    pub(crate) fn release(&self) {
        let gone = std::mem::take(&mut self.held.lock().expect("read-ahead lock").ranges);
        gone.into_iter().for_each(|h| self.free(h));
    }
}

/// The packs holding `repo`'s trees (its index loaded; `ends` is where each pack's blobs end),
/// with their salts and ends, when a walk reads them all whole at its start: at most
/// [`ALL_TREE_PACKS`], each no larger than the target pack size (a little over counts: the
/// packer closes a pack past it), `max` bytes together. `None` otherwise. The start hint names
/// the same packs (FORMAT.md §14).
pub(crate) fn whole_tree_packs(
    repo: &Repository,
    ends: &[u64],
    max: u64,
) -> Option<Vec<(PackId, [u8; cairn_format::crypto::SALT_LEN], u64)>> {
    let tree_packs = repo.index().tree_packs();
    if tree_packs.len() > ALL_TREE_PACKS {
        return None;
    }
    let packs: Vec<_> = tree_packs
        .into_iter()
        .map(|(pack_no, pack, salt)| (pack, salt, ends.get(pack_no as usize).copied().unwrap_or(0)))
        .collect();
    let pack_size = u64::from(repo.config().pack_size) * 5 / 4;
    let total: u64 = packs.iter().map(|p| p.2).sum();
    (!packs.iter().any(|p| p.2 > pack_size) && total <= max).then_some(packs)
}

/// Bytes one tree-loading thread holds at most: a read of up to [`TREE_READ_MAX`] stored bytes
/// and its trees decoded (about three times as many) until each is handed on.
const TREE_THREAD_BYTES: u64 = 4 * TREE_READ_MAX;

/// How a walk of snapshots (`ls`, `find`, `diff`, `stats`) fits its `--max-memory`: the index,
/// what the command keeps per blob (`extra`) and the largest directory's tree (held encoded,
/// and by a walk on its path while its entries are visited) come first; of the rest, half is
/// for the threads loading trees and half for tree packs read ahead
/// ([`ReadAhead::limit`], at most [`READ_AHEAD_MAX`]).
#[derive(Clone, Copy, Debug)]
pub struct WalkShares {
    /// Threads loading trees (at most the number asked for).
    pub threads: usize,
    /// Bytes of tree packs read ahead.
    pub read_ahead: u64,
}

impl WalkShares {
    /// The shares of `max_memory` for a walk of `repo` (its index loaded) on at most `threads`
    /// threads, or why it cannot run within it.
    pub fn of(repo: &Repository, max_memory: MaxMemory, threads: usize, extra: u64) -> Result<WalkShares> {
        let index = repo.index();
        let fixed = index.memory_bytes() + extra + 2 * index.largest_tree();
        let least = fixed + 2 * TREE_THREAD_BYTES;
        let budget =
            max_memory.budget("walk", "the index and the largest directory", fixed, "threads loading trees", least)?;
        let half = (budget - fixed) / 2;
        Ok(WalkShares {
            threads: threads.min((half / TREE_THREAD_BYTES) as usize).max(1),
            read_ahead: half.min(READ_AHEAD_MAX),
        })
    }

    /// A [`Loading`] whose read-ahead holds at most this walk's share.
    pub fn loading(&self) -> Loading {
        let loading = Loading::default();
        loading.read_ahead.limit(self.read_ahead);
        loading
    }
}

/// Finds the node at `path` (absolute, inside the snapshot; any bytes, not only UTF-8) without
/// following symlinks. Returns `None` for `/` (the root tree itself).
pub fn resolve(repo: &Repository, root: &BlobId, path: &Path, snapshot: &str) -> Result<Option<Node>> {
    let mut tree_id = *root;
    let mut found = None;
    let not_found = || Error::PathNotFound {
        path: path.to_string_lossy().into_owned(),
        snapshot: snapshot.to_string(),
        note: String::new(),
    };
    let parts: Vec<&[u8]> =
        path.as_os_str().as_bytes().split(|b| *b == b'/').filter(|p| !p.is_empty() && *p != b".").collect();
    for (i, part) in parts.iter().enumerate() {
        let tree = repo.read_tree(&tree_id)?;
        let node = tree.nodes.into_iter().find(|n| n.name == *part).ok_or_else(not_found)?;
        if i + 1 < parts.len() {
            tree_id = node.subtree.ok_or_else(not_found)?;
        }
        found = Some(node);
    }
    Ok(found)
}

/// `path` without trailing slashes; `None` for the root (`/`, or nothing).
pub fn below_root(path: &Path) -> Option<&Path> {
    let bytes = path.as_os_str().as_bytes();
    let end = bytes.iter().rposition(|b| *b != b'/').map_or(0, |i| i + 1);
    (end > 0).then(|| Path::new(OsStr::from_bytes(&bytes[..end])))
}

/// Loads every distinct tree below `roots` (the roots included), level by level on `threads`
/// threads, and calls `visit` once per tree with the tree or why it could not be loaded (not
/// in any index, damaged). The subtrees of a tree that loaded are visited next; `visit`
/// returning an error stops the walk with it.
pub fn for_each_tree(
    repo: &Repository,
    roots: impl IntoIterator<Item = BlobId>,
    threads: usize,
    loading: &Loading,
    mut visit: impl FnMut(BlobId, Result<TreeBytes>) -> Result<()> + Send,
) -> Result<()> {
    let mut seen: IdSet<BlobId> = IdSet::default();
    let mut level: Vec<BlobId> = roots.into_iter().filter(|id| seen.insert(*id)).collect();
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
        // Each tree is visited as it is decoded and dropped after: a level of a million files'
        // directories held parsed took hundreds of MiB (`stats` of `many`: 454 MB).
        let walked = Mutex::new((Vec::new(), &mut seen, &mut visit, Ok(())));
        load_level_each(repo, &level, threads, loading, &|id, tree: Result<TreeBytes>| {
            let mut w = walked.lock().expect("walk lock");
            let (next, seen, visit, failed) = &mut *w;
            if failed.is_err() {
                return;
            }
            if let Ok(tree) = &tree {
                next.extend(tree.subtrees().iter().filter(|sub| seen.insert(**sub)));
            }
            // After an error the rest of the level is read but not visited.
            if let Err(e) = visit(id, tree) {
                *failed = Err(e);
            }
        })?;
        let (mut next, _, _, failed) = walked.into_inner().expect("walk lock");
        failed?;
        next.sort_unstable();
        level = next;
    }
    loading.read_ahead.release();
    Ok(())
}

/// Loads one level's trees: from the metadata cache where it holds them, the rest with
/// coalesced reads cut small enough that every thread has some to decode (trees lie side by
/// side in a few packs, and one read per level left one core decoding while the other waited).
/// A read that fails is retried tree by tree, so each tree gets its own error. A walker that
/// chooses which subtrees to descend into (`diff` loads only those whose IDs differ) calls
/// this once per level with the trees it wants.
pub fn load_level<T: TreeForm + Send>(
    repo: &Repository,
    level: &[BlobId],
    threads: usize,
    loading: &Loading,
) -> Result<Vec<(BlobId, Result<T>)>> {
    let loaded = Mutex::new(Vec::with_capacity(level.len()));
    load_level_each(repo, level, threads, loading, &|id, tree: Result<T>| {
        loaded.lock().expect("lock").push((id, tree))
    })?;
    Ok(loaded.into_inner().expect("lock"))
}

/// [`load_level`], giving `each` every tree as it is decoded (on the loading threads) instead of
/// collecting them: what is held at once is the reads in flight, each at most [`TREE_READ_MAX`]
/// of stored trees, whatever the level's size.
pub fn load_level_each<T: TreeForm>(
    repo: &Repository,
    level: &[BlobId],
    threads: usize,
    loading: &Loading,
    each: &(dyn Fn(BlobId, Result<T>) + Sync),
) -> Result<()> {
    let index = repo.index();
    let mut located = Vec::with_capacity(level.len());
    let mut held = Vec::new();
    for id in level {
        if let Some(t) = repo.cached_tree_as(id) {
            each(*id, Ok(t));
            continue;
        }
        match index.get(id) {
            Some(loc) => match loading.read_ahead.take(&loc) {
                Some((bytes, at)) => held.push((loc, bytes, at)),
                None => located.push(loc),
            },
            None => each(*id, Err(crate::engine::sorted_index::not_found(&index, "tree", id))),
        }
    }
    drop(index);
    let level_bytes: u64 = located.iter().map(|l| u64::from(l.entry.length) + u64::from(l.entry.raw_length)).sum();
    let share = (level_bytes / (threads.max(1) as u64 * 4)).clamp(TREE_READ_MIN, TREE_READ_MAX);
    let pack_nos: IdMap<PackId, u32> = located.iter().map(|l| (l.pack, l.pack_no)).collect();
    let mut reads = coalesce(located, share, coalesce_gap(repo));
    for read in &mut reads {
        loading.read_ahead.extend(repo, read, pack_nos[&read.pack]);
    }
    let next = AtomicUsize::new(0);
    let next_held = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, (reads.len() + held.len()).max(1)) {
            s.spawn(|| {
                while let Some(read) = reads.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if loading.cancel.load(Ordering::Relaxed) {
                        return;
                    }
                    match read_trees(repo, read, &loading.read_ahead) {
                        Ok(trees) => trees.into_iter().for_each(|(id, t)| each(id, Ok(t))),
                        Err(_) => read.blobs.iter().for_each(|b| each(b.id, repo.read_tree_as(&b.id))),
                    }
                    loading.reads_done.fetch_add(1, Ordering::Relaxed);
                }
                // Trees read ahead by an earlier level: only decoded (a damaged one is read again).
                while let Some((loc, bytes, at)) = held.get(next_held.fetch_add(1, Ordering::Relaxed)) {
                    if loading.cancel.load(Ordering::Relaxed) {
                        return;
                    }
                    each(loc.entry.id, decode_held(repo, loc, bytes, *at));
                }
            });
        }
    });
    // Reads a cancel left unread must not keep other walkers waiting for them.
    for read in &reads {
        loading.read_ahead.finished(read);
    }
    if loading.cancel.load(Ordering::Relaxed) {
        return Err(Error::Interrupted);
    }
    Ok(())
}

/// Tree `id`: from the bytes `ahead` holds, else by reading its whole pack (the first time)
/// or its own range. Whatever fails is read again on its own, so the error is the read's.
fn load_through(repo: &Repository, id: &BlobId, ahead: &ReadAhead) -> Result<TreeBytes> {
    if let Some(t) = repo.cached_tree_as(id) {
        return Ok(t);
    }
    let Some(loc) = repo.index().get(id) else { return repo.read_tree_bytes(id) };
    if let Some((bytes, at)) = ahead.take(&loc) {
        return decode_held(repo, &loc, &bytes, at);
    }
    let mut read =
        PackRead::range(loc.pack, loc.salt, u64::from(loc.entry.offset), u64::from(loc.entry.length), vec![loc.entry]);
    ahead.extend(repo, &mut read, loc.pack_no);
    match read_trees(repo, &read, ahead) {
        Ok(mut trees) if !trees.is_empty() => Ok(trees.swap_remove(0).1),
        _ => repo.read_tree_bytes(id),
    }
}

/// Runs a whole pack read from [`ReadAhead::all_tree_packs`]: its bytes are held for the walk
/// (a read that fails lets the trees waiting for it read their own).
pub(crate) fn read_whole(repo: &Repository, read: &PackRead, ahead: &ReadAhead) {
    let _ = read_trees::<TreeBytes>(repo, read, ahead);
}

/// The tree at `loc`, decoded from `bytes` (held by a [`ReadAhead`]) where it lies at `at`; a
/// damaged copy is read again on its own, so the error is the read's.
fn decode_held<T: TreeForm>(repo: &Repository, loc: &BlobLocation, bytes: &[u8], at: usize) -> Result<T> {
    let sealed = &bytes[at..at + loc.entry.length as usize];
    repo.decode_tree(&repo.key().object_key(&loc.salt), &loc.entry, sealed, &pack_path(&loc.pack))
        .or_else(|_| repo.read_tree_as(&loc.entry.id))
}

/// Reads one coalesced range of tree blobs (again, if the transfer came back damaged) and
/// keeps each verified tree in the metadata cache; a range read further back than its first
/// tree is held in `ahead` for the levels to come.
fn read_trees<T: TreeForm>(repo: &Repository, read: &PackRead, ahead: &ReadAhead) -> Result<Vec<(BlobId, T)>> {
    let path = pack_path(&read.pack);
    let key = repo.key().object_key(&read.salt);
    // A whole pack the start hint had read while the repository opened is taken from there
    // (once: a damaged copy is read again from the storage).
    let mut opened = if read.offset == 0 { repo.take_preloaded_pack(&read.pack, read.length) } else { None };
    let trees = crate::engine::storage::retry_damaged(|| {
        let bytes = Arc::new(match opened.take() {
            Some(b) => b,
            None => repo.storage().read_range(&path, read.offset, read.length)?,
        });
        ahead.hold(read, &bytes);
        read.blobs
            .iter()
            .map(|b| {
                let start = (u64::from(b.offset) - read.offset) as usize;
                Ok((b.id, repo.decode_tree(&key, b, &bytes[start..start + b.length as usize], &path)?))
            })
            .collect()
    });
    ahead.finished(read);
    trees
}

/// Visits every node below tree `root` depth first, in tree order, with its absolute path
/// (`base` joined with the names on the way). Trees are loaded a bounded window ahead of the
/// walk on `threads` threads ([`Ahead`]), so memory holds the walk's path and the window, not
/// the whole snapshot's trees.
pub fn walk(
    repo: &Repository,
    root: BlobId,
    base: &Path,
    threads: usize,
    visit: impl FnMut(&Path, &Node) -> Result<()>,
) -> Result<()> {
    struct Visit<F>(F);
    impl<F: FnMut(&Path, &Node) -> Result<()>> Walker for Visit<F> {
        fn visit(&mut self, path: &Path, node: &Node) -> Result<()> {
            (self.0)(path, node)
        }
    }
    walk_with(repo, root, base, threads, &IdSet::default(), &mut Visit(visit))
}

/// What [`walk_with`] tells its caller, and asks it.
pub trait Walker {
    /// An entry, with its absolute path.
    fn visit(&mut self, path: &Path, node: &Node) -> Result<()>;
    /// The walk goes into the tree `id` (a directory's, or the root).
    fn entered(&mut self, _id: &BlobId) {}
    /// The walk has left the tree `id` (entered before) and everything below it.
    fn left(&mut self, _id: BlobId) {}
}

/// [`walk`], telling `walker` where it enters and leaves trees, and neither reading nor
/// entering the trees in `skip`.
pub fn walk_with(
    repo: &Repository,
    root: BlobId,
    base: &Path,
    threads: usize,
    skip: &IdSet<BlobId>,
    walker: &mut impl Walker,
) -> Result<()> {
    if skip.contains(&root) {
        return Ok(());
    }
    walker.entered(&root);
    std::thread::scope(|s| {
        let loader = TreeLoader::start(s, repo, threads.max(1));
        let mut ahead = Ahead::new(repo, &loader, WALK_TREES_AHEAD, WALK_BYTES_AHEAD).skipping(skip);
        // The trees on the walk's path, each with its nodes still to visit.
        let mut stack: Vec<(PathBuf, BlobId, Nodes)> =
            vec![(base.to_path_buf(), root, ahead.take(&root)?.into_nodes())];
        while let Some((dir, _, nodes)) = stack.last_mut() {
            let Some(node) = nodes.next() else {
                let (_, id, _) = stack.pop().expect("a tree on the path");
                ahead.left();
                walker.left(id);
                continue;
            };
            let path = dir.join(OsStr::from_bytes(&node.name));
            walker.visit(&path, &node)?;
            if let Some(sub) = node.subtree {
                if stack.len() > MAX_DEPTH {
                    return Err(Error::invalid(
                        format!("tree {}", sub.short()),
                        format!("directories nested deeper than {MAX_DEPTH} levels"),
                    ));
                }
                if skip.contains(&sub) {
                    continue;
                }
                walker.entered(&sub);
                let nodes = ahead.take(&sub)?.into_nodes();
                stack.push((path, sub, nodes));
            }
        }
        Ok(())
    })
}

/// Trees [`walk`] loads ahead at most, and their bytes as stored (beyond the next one).
const WALK_TREES_AHEAD: usize = 64;
const WALK_BYTES_AHEAD: u64 = 8 * 1024 * 1024;

/// Every tree of `ids` (those the index lists), read at once through the read path with
/// `concurrency` reads in flight within `max_memory`: `each` is given each tree's verified
/// plaintext, or why it could not be read, on the decode threads as it comes (a caller notes
/// what it needs of a tree as it parses it, e.g. with [`cairn_format::tree::for_each_node`], and keeps
/// neither the bytes nor the nodes: a directory of 250,000 entries takes about 100 MB parsed).
/// IDs no index lists are left out.
pub fn load_listed(
    repo: &Repository,
    ids: impl IntoIterator<Item = BlobId>,
    concurrency: usize,
    max_memory: u64,
    cancel: Arc<AtomicBool>,
    each: &(dyn Fn(BlobId, Result<&[u8]>) + Sync),
) {
    let index = repo.index();
    let located: Vec<_> = ids.into_iter().filter_map(|id| index.get(&id)).collect();
    drop(index);
    let reads = coalesce(located, max_memory.min(crate::engine::read::MAX_READ * 2), coalesce_gap(repo));
    let reader = Reader::new(repo, max_memory, cancel);
    std::thread::scope(|s| {
        let sink = ToTrees { each };
        for w in reader.start(s, &reads, concurrency, crate::engine::platform::cores(), sink) {
            w.join().expect("a tree reader panicked");
        }
    });
}

/// [`load_listed`]'s end of the read path: each verified tree blob's plaintext.
#[derive(Clone)]
struct ToTrees<'s> {
    each: &'s (dyn Fn(BlobId, Result<&[u8]>) + Sync),
}

impl<'s> Sink<'s> for ToTrees<'s> {
    fn blobs(&self, _read: ReadRef<'s>, blobs: Vec<Decoded<'s>>) -> bool {
        for b in &blobs {
            (self.each)(b.id, Ok(&b.data));
        }
        true
    }

    fn failed(&self, _read: ReadRef<'s>, blob: &BlobEntry, why: &Error) {
        (self.each)(blob.id, Err(Error::corrupt(format!("tree {}", blob.id.short()), why.to_string())));
    }
}

/// Loads trees on a few threads ahead of a walker that asks for them one directory at a time
/// (a backup's walk of its parent snapshot), so the walker does not wait for one storage read
/// per directory.
pub struct TreeLoader {
    requests: Sender<(BlobId, Sender<Loaded>)>,
}

/// A tree (kept as its bytes, see [`TreeBytes`]), or why it could not be read.
pub type Loaded = std::result::Result<TreeBytes, String>;

impl TreeLoader {
    /// Starts `threads` loaders in `scope`; they stop when the loader is dropped.
    pub fn start<'scope>(
        scope: &'scope std::thread::Scope<'scope, '_>,
        repo: &'scope Repository,
        threads: usize,
    ) -> Self {
        Self::start_with(scope, repo, threads, None)
    }

    /// As [`TreeLoader::start`], reading each tree pack whole the first time a tree in it is
    /// wanted and keeping it in `ahead` (see [`ReadAhead`]): a walk then waits one round trip
    /// per tree pack, not one per directory level.
    pub fn start_with<'scope>(
        scope: &'scope std::thread::Scope<'scope, '_>,
        repo: &'scope Repository,
        threads: usize,
        ahead: Option<&'scope ReadAhead>,
    ) -> Self {
        let (requests, rx) = bounded::<(BlobId, Sender<Loaded>)>(threads * 64);
        for _ in 0..threads {
            let rx = rx.clone();
            scope.spawn(move || {
                for (id, reply) in rx {
                    let tree = match ahead {
                        Some(ahead) => load_through(repo, &id, ahead),
                        None => repo.read_tree_bytes(&id),
                    };
                    // The walker may have stopped early; then nobody wants the tree.
                    let _ = reply.send(tree.map_err(|e| e.to_string()));
                }
            });
        }
        TreeLoader { requests }
    }

    /// Asks for tree `id`; it arrives on the returned channel.
    pub fn request(&self, id: BlobId) -> Receiver<Loaded> {
        let (tx, rx) = bounded(1);
        // The loaders live as long as this sender, so the send only fails if one panicked.
        let _ = self.requests.send((id, tx));
        rx
    }
}

/// Trees wanted in the order of a depth-first walk, loaded up to a bounded number ahead of it
/// on a [`TreeLoader`]'s threads, so a walker that goes one directory at a time keeps only its
/// own path and the window in memory, not the whole snapshot's trees, yet rarely waits.
///
/// The walker [`take`](Ahead::take)s each tree as it descends into it (its subtrees join the
/// order at once, before the rest of its parent's), and says when it has [`left`](Ahead::left)
/// it. What is loaded next follows the walk: the current tree's subtrees first, then its
/// parent's remaining ones, and so on up; a loaded tree's own subtrees come right after it.
pub struct Ahead<'l> {
    repo: &'l Repository,
    loader: &'l TreeLoader,
    /// For each tree on the walker's path: its subtrees not yet descended into, in order.
    todo: Vec<std::collections::VecDeque<BlobId>>,
    /// Trees requested or loaded ahead, with their size as stored (unpacked).
    slots: IdMap<BlobId, (Slot, u64)>,
    window: usize,
    bytes: u64,
    /// Trees the walker will not enter: never loaded ahead.
    skip: Option<&'l IdSet<BlobId>>,
}

enum Slot {
    Loading(Receiver<Loaded>),
    Ready(Loaded),
}

impl<'l> Ahead<'l> {
    /// Loads through `loader`, keeping at most `window` trees, and (beyond the next one) at
    /// most `bytes` of them as stored, requested or loaded ahead.
    pub fn new(repo: &'l Repository, loader: &'l TreeLoader, window: usize, bytes: u64) -> Self {
        Ahead { repo, loader, todo: Vec::new(), slots: IdMap::default(), window: window.max(1), bytes, skip: None }
    }

    /// Never loads the trees in `skip` ahead (the walker will not enter them).
    pub fn skipping(mut self, skip: &'l IdSet<BlobId>) -> Self {
        self.skip = Some(skip).filter(|s| !s.is_empty());
        self
    }

    /// Whether the walker will want `id`.
    fn wanted(&self, id: &BlobId) -> bool {
        self.skip.is_none_or(|s| !s.contains(id))
    }

    /// The tree `id`, which the walker now descends into (the next of its parent's subtrees
    /// in order, or a root). A tree that could not be loaded ahead is read again here, so the
    /// error is the read's own.
    pub fn take(&mut self, id: &BlobId) -> Result<TreeBytes> {
        if let Some(queue) = self.todo.last_mut() {
            // Subtrees before it that the walker skipped will not be wanted any more.
            if let Some(at) = queue.iter().position(|q| q == id) {
                queue.drain(..=at);
            }
        }
        let loaded = match self.slots.remove(id) {
            Some((Slot::Ready(t), _)) => t,
            Some((Slot::Loading(rx), _)) => rx.recv().unwrap_or_else(|_| Err("tree loader stopped".into())),
            // Not asked for ahead (a root): through the loader too, which may read its pack whole.
            None => self.loader.request(*id).recv().unwrap_or_else(|_| Err("tree loader stopped".into())),
        };
        let tree = match loaded {
            Ok(t) => t,
            Err(_) => self.repo.read_tree_bytes(id)?,
        };
        self.todo.push(tree.subtrees().iter().filter(|id| self.wanted(id)).copied().collect());
        self.refill();
        Ok(tree)
    }

    /// The walker has left the tree it last took (and everything below it).
    pub fn left(&mut self) {
        self.todo.pop();
    }

    /// Requests the next trees in walk order until `window` are requested or loaded.
    fn refill(&mut self) {
        let mut room = self.window;
        let mut bytes = 0u64;
        // Bounds the look through loaded trees, so each call costs at most a few windows.
        let mut looks = self.window * 8;
        let mut order: Vec<BlobId> = Vec::new();
        for queue in &self.todo {
            order.extend(queue.iter().rev());
        }
        // `order` is a stack: its last element is the next tree the walk will want.
        let mut seen = IdSet::default();
        while let Some(id) = order.pop() {
            if room == 0 || looks == 0 {
                break;
            }
            looks -= 1;
            seen.insert(id);
            if let Some((Slot::Loading(rx), len)) = self.slots.get(&id) {
                if let Ok(loaded) = rx.try_recv() {
                    let len = *len;
                    self.slots.insert(id, (Slot::Ready(loaded), len));
                }
            }
            match self.slots.get(&id) {
                None => {
                    let len = self.repo.index().get(&id).map_or(0, |l| u64::from(l.entry.raw_length));
                    if bytes > 0 && bytes + len > self.bytes {
                        break;
                    }
                    bytes += len;
                    self.slots.insert(id, (Slot::Loading(self.loader.request(id)), len));
                    room -= 1;
                }
                Some((Slot::Loading(_), len)) => {
                    bytes += len;
                    room -= 1;
                }
                Some((Slot::Ready(loaded), len)) => {
                    bytes += len;
                    room -= 1;
                    if let Ok(tree) = loaded {
                        order.extend(tree.subtrees().iter().rev().filter(|id| self.wanted(id)));
                    }
                }
            }
        }
        // Trees the walk skipped or that fell out of the window are let go.
        self.slots.retain(|id, _| seen.contains(id));
    }
}

/// Writes the repository's start hint (FORMAT.md §14) from its loaded index: the packs that hold
/// its trees, when a restore would read them all at its start, go into it beside the key file.
pub fn write_hint(repo: &Repository) {
    let ends = repo.index().pack_ends();
    let tree_packs = whole_tree_packs(repo, &ends, READ_AHEAD_MAX)
        .unwrap_or_default()
        .into_iter()
        .map(|(pack, _, length)| cairn_format::hint::TreePack { pack, length })
        .collect();
    repo.write_hint(tree_packs);
}

#[cfg(test)]
mod read_ahead_tests {
    use super::*;
    use cairn_format::compress::Codec;
    use cairn_format::crypto::SALT_LEN;
    use cairn_format::pack::BlobKind;

    fn blob(n: u8, offset: u32, length: u32) -> BlobEntry {
        BlobEntry { id: BlobId([n; 32]), kind: BlobKind::Tree, codec: Codec::None, offset, length, raw_length: length }
    }

    /// A tree met twice (an identical directory elsewhere, a walk that takes it again) counts
    /// once: the range is let go only when every blob in it was taken, not after that many
    /// takes (which made a restore read most trees of a pack on their own, one request each).
    #[test]
    fn a_held_range_is_let_go_once_every_blob_was_taken_however_often_one_was() {
        let pack = PackId([7; 32]);
        let blobs = [blob(1, 0, 10), blob(2, 10, 10), blob(3, 20, 10)];
        let at = |b: &BlobEntry| BlobLocation { pack, pack_no: 0, salt: [0; SALT_LEN], entry: *b };
        let ahead = ReadAhead::default();
        let read = PackRead::range(pack, [0; SALT_LEN], 0, 30, vec![blobs[0]]);
        ahead.hold(&read, &Arc::new(vec![0; 30]));
        for _ in 0..3 {
            assert_eq!(ahead.take(&at(&blobs[1])).map(|(_, at)| at), Some(10));
        }
        assert_eq!(ahead.take(&at(&blobs[2])).map(|(_, at)| at), Some(20), "let go before its last blob was taken");
        assert!(ahead.take(&at(&blobs[0])).is_none(), "every blob was taken: the range is let go");
    }

    /// A whole pack stays held after its every tree was taken (a tree met again, an identical
    /// or empty directory's, is not read on its own one round trip later) until its room is
    /// needed; then the oldest goes first.
    #[test]
    fn a_whole_pack_stays_until_its_room_is_needed() {
        let ahead = ReadAhead::default();
        let at = |pack: PackId, b: &BlobEntry| BlobLocation { pack, pack_no: 0, salt: [0; SALT_LEN], entry: *b };
        let blobs = [blob(1, 0, 10), blob(2, 10, 10)];
        let (p1, p2) = (PackId([1; 32]), PackId([2; 32]));
        for pack in [p1, p2] {
            let whole = PackRead::range(pack, [0; SALT_LEN], 0, 20, vec![blobs[0]]);
            ahead.held.lock().unwrap().pending.insert(pack, 20);
            ahead.bytes.fetch_add(20, Ordering::Relaxed);
            ahead.hold(&whole, &Arc::new(vec![0; 20]));
            ahead.finished(&whole);
            assert!(ahead.take(&at(pack, &blobs[1])).is_some());
        }
        // Every tree of both was taken; both are still there for a tree met again.
        assert_eq!(ahead.take(&at(p1, &blobs[1])).map(|(_, at)| at), Some(10));
        assert_eq!(ahead.take(&at(p2, &blobs[0])).map(|(_, at)| at), Some(0));
        // Room for one more pack of 20 under a limit of 45: the oldest is let go, not the other.
        ahead.make_room(20, 45);
        assert_eq!(ahead.bytes.load(Ordering::Relaxed), 20);
        assert!(ahead.take(&at(p1, &blobs[1])).is_none());
        assert!(ahead.take(&at(p2, &blobs[1])).is_some());
        ahead.release();
        assert_eq!(ahead.bytes.load(Ordering::Relaxed), 0, "what is released is given back");
    }

    /// A tree of a pack whose whole read is in flight waits for that read instead of sending
    /// its own request one round trip behind it (a restore's sixth serial round trip at 50 ms);
    /// a whole read that fails lets it go to read its own.
    #[test]
    fn a_tree_of_a_pack_being_read_whole_waits_for_that_read() {
        let pack = PackId([7; 32]);
        let blobs = [blob(1, 0, 10), blob(2, 10, 10)];
        let at = |b: &BlobEntry| BlobLocation { pack, pack_no: 0, salt: [0; SALT_LEN], entry: *b };
        let whole = PackRead::range(pack, [0; SALT_LEN], 0, 20, vec![blobs[0]]);
        for lands in [true, false] {
            let ahead = ReadAhead::default();
            ahead.held.lock().unwrap().pending.insert(pack, 20);
            std::thread::scope(|s| {
                let (tx, rx) = crossbeam_channel::bounded(1);
                let (ahead, at) = (&ahead, &at);
                s.spawn(move || tx.send(ahead.take(&at(&blobs[1])).map(|(_, at)| at)).unwrap());
                assert!(
                    rx.recv_timeout(std::time::Duration::from_millis(200)).is_err(),
                    "went on before the whole read landed"
                );
                if lands {
                    ahead.hold(&whole, &Arc::new(vec![0; 20]));
                }
                ahead.finished(&whole);
                assert_eq!(rx.recv().unwrap(), lands.then_some(10));
            });
        }
    }
}
