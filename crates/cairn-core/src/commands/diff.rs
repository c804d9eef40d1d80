//! Differences between two snapshots (or two directories or files inside them): the paths
//! added, removed and changed, with sizes, and how much file data is new or gone.
//!
//! Only trees whose IDs differ are read: a directory with the same subtree ID on both sides is
//! identical all the way down (trees are content-addressed, FORMAT.md §9) and is skipped
//! unread. The trees wanted are loaded level by level with [`crate::engine::trees::load_level`], both
//! sides' trees of a level in one round of coalesced reads, so a remote repository waits one
//! round trip per directory level, not per directory.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::engine::memory::MaxMemory;
use crate::engine::repository::Repository;
use crate::engine::select::SnapshotFilter;
use crate::engine::trees::{below_root, load_level, resolve, Loading, WalkShares, MAX_DEPTH};
use crate::error::{Error, Result};
use cairn_format::id::{BlobId, IdMap, IdSet};
use cairn_format::tree::{Chunk, Node, NodeKind, TreeBytes};

/// What happened to a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Change {
    /// Only in the second snapshot (`+`).
    Added,
    /// Only in the first snapshot (`-`).
    Removed,
    /// A file's content, a symlink's target or a device's number changed (`M`).
    Modified,
    /// The kind of object changed, e.g. a file became a directory (`T`).
    TypeChanged,
    /// Only metadata changed: mode, owner, modification time, extended attributes or ACLs (`U`;
    /// reported with [`DiffOptions::metadata`]).
    Metadata,
}

impl Change {
    /// The one-letter code of a change (restic's): `+`, `-`, `M`, `T`, `U`.
    pub fn code(self) -> char {
        match self {
            Change::Added => '+',
            Change::Removed => '-',
            Change::Modified => 'M',
            Change::TypeChanged => 'T',
            Change::Metadata => 'U',
        }
    }

    /// The change's name: `added`, `removed`, `modified`, `type`, `metadata`.
    pub fn name(self) -> &'static str {
        match self {
            Change::Added => "added",
            Change::Removed => "removed",
            Change::Modified => "modified",
            Change::TypeChanged => "type",
            Change::Metadata => "metadata",
        }
    }
}

/// One side of a changed path: its kind and size (a file's length, a symlink target's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Side {
    /// Kind of object.
    pub kind: NodeKind,
    /// Size in bytes.
    pub size: u64,
}

impl Side {
    fn of(n: &Node) -> Side {
        Side { kind: n.kind, size: n.size }
    }
}

/// A path that differs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// What happened.
    pub change: Change,
    /// The path, relative to the compared roots, starting with `/`.
    pub path: PathBuf,
    /// The object in the first snapshot.
    pub before: Option<Side>,
    /// The object in the second snapshot.
    pub after: Option<Side>,
}

/// Added, removed and changed objects of one kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    /// Only in the second snapshot.
    pub added: u64,
    /// Only in the first snapshot.
    pub removed: u64,
    /// In both, with different content.
    pub changed: u64,
}

/// The totals of a diff.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiffStats {
    /// Regular files.
    pub files: Counts,
    /// Directories (a directory is never "changed": its entries are).
    pub dirs: Counts,
    /// Symlinks, devices and FIFOs.
    pub others: Counts,
    /// Objects whose kind changed (each also counted as removed and added).
    pub type_changes: u64,
    /// Objects whose metadata alone changed (counted with [`DiffOptions::metadata`]).
    pub metadata_changes: u64,
    /// Data blobs the second snapshot's added and changed files use that the first snapshot's
    /// removed and changed files do not.
    pub blobs_added: u64,
    /// Data blobs the first snapshot's removed and changed files used that the second
    /// snapshot's added and changed files do not.
    pub blobs_removed: u64,
    /// Plaintext bytes of [`DiffStats::blobs_added`]: the new data.
    pub bytes_added: u64,
    /// Plaintext bytes of [`DiffStats::blobs_removed`]: the data gone.
    pub bytes_removed: u64,
    /// Trees read (those whose IDs differ).
    pub trees_read: u64,
}

/// How to diff.
#[derive(Clone, Copy, Debug)]
pub struct DiffOptions {
    /// Report paths whose metadata alone changed (`U`).
    pub metadata: bool,
    /// Threads loading trees (reads in flight).
    pub threads: usize,
}

/// What is compared on one side: a tree (a snapshot's root or a directory in it) or one node
/// (a file, symlink or device at a path).
#[derive(Clone, Debug)]
pub enum Root {
    /// A directory's tree.
    Tree(BlobId),
    /// One object.
    Node(Box<Node>),
}

impl Root {
    fn into_node(self) -> Node {
        match self {
            Root::Tree(id) => {
                let mut n = Node::new(b"/".to_vec(), NodeKind::Dir);
                n.subtree = Some(id);
                n
            }
            Root::Node(n) => *n,
        }
    }
}

/// One side of `cairn diff` as the user names it: a snapshot (`latest` or an ID prefix) and
/// optionally a path inside it.
#[derive(Debug, Clone, Copy)]
pub struct Spec<'a> {
    /// `latest` or an ID prefix.
    pub snapshot: &'a str,
    /// A directory or file inside the snapshot; `None` (or `/`) is the whole snapshot.
    pub path: Option<&'a Path>,
}

/// What [`diff_snapshots`] found.
pub struct Compared {
    /// Each change, in path order.
    pub entries: Vec<Entry>,
    /// The totals.
    pub stats: DiffStats,
    /// The first side as shown: the snapshot's short ID, with `:PATH` if one was given.
    pub before: String,
    /// The second side as shown.
    pub after: String,
}

/// `cairn diff`: loads the index of `repo` (opened and locked by the caller), finds both sides
/// (each snapshot as `filter` chooses it: [`SnapshotFilter::find`]), and compares them within
/// `max_memory`. Two directories are compared with paths below them
/// shown from `/`; a file (or other object) on either side with its own path.
pub fn diff_snapshots(
    repo: &Repository,
    before: Spec<'_>,
    after: Spec<'_>,
    filter: &SnapshotFilter,
    metadata: bool,
    max_memory: MaxMemory,
) -> Result<Compared> {
    repo.load_index()?;
    let (before_shown, before_root, before_path) = side(repo, before, filter)?;
    let (after_shown, after_root, after_path) = side(repo, after, filter)?;
    let base = match (&before_root, &after_root) {
        (Root::Tree(_), Root::Tree(_)) => PathBuf::from("/"),
        _ => after_path.or(before_path).unwrap_or_else(|| PathBuf::from("/")),
    };
    let shares = WalkShares::of(repo, max_memory, repo.storage().default_concurrency(), 0)?;
    let opts = DiffOptions { metadata, threads: shares.threads };
    let (entries, stats) = diff(repo, before_root, after_root, &base, opts, &shares.loading())?;
    Ok(Compared { entries, stats, before: before_shown, after: after_shown })
}

/// One side: how it is shown, what to compare, and the path inside the snapshot.
fn side(repo: &Repository, spec: Spec<'_>, filter: &SnapshotFilter) -> Result<(String, Root, Option<PathBuf>)> {
    let (id, snap) = filter.find(repo, spec.snapshot)?;
    let Some(path) = spec.path.and_then(below_root) else {
        return Ok((id.short(), Root::Tree(snap.tree), None));
    };
    let shown = format!("{}:{}", id.short(), path.display());
    let found = resolve(repo, &snap.tree, path, &id.short());
    let root = match found.map_err(|e| filter.explain_not_found(repo, spec.snapshot, e))? {
        None => Root::Tree(snap.tree),
        Some(n) if n.kind == NodeKind::Dir => {
            Root::Tree(n.subtree.ok_or_else(|| Error::corrupt(shown.clone(), "a directory without a subtree"))?)
        }
        Some(n) => Root::Node(Box::new(n)),
    };
    Ok((shown, root, Some(path.to_path_buf())))
}

/// The differences between `before` and `after`, paths in tree order. `base` is the path shown
/// for the roots themselves (entries below them are `base/NAME/...`).
pub fn diff(
    repo: &Repository,
    before: Root,
    after: Root,
    base: &Path,
    opts: DiffOptions,
    loading: &Loading,
) -> Result<(Vec<Entry>, DiffStats)> {
    let mut d =
        Differ { opts, entries: Vec::new(), stats: DiffStats::default(), next: Vec::new(), blobs: Blobs::default() };
    match (before, after) {
        // Two trees: their roots are not entries, only what is below them.
        (Root::Tree(a), Root::Tree(b)) if a == b => {}
        (Root::Tree(a), Root::Tree(b)) => d.descend(base.to_path_buf(), Some(a), Some(b)),
        (a, b) => d.compare(base.to_path_buf(), Some(&a.into_node()), Some(&b.into_node())),
    }
    for depth in 0.. {
        if d.next.is_empty() {
            break;
        }
        if depth > MAX_DEPTH {
            return Err(Error::invalid(
                format!("a tree at {}", d.next[0].path.display()),
                format!("directories nested deeper than {MAX_DEPTH} levels"),
            ));
        }
        let level = std::mem::take(&mut d.next);
        let mut wanted: IdSet<BlobId> = IdSet::default();
        wanted.extend(level.iter().flat_map(|p| [p.before, p.after]).flatten());
        let wanted: Vec<BlobId> = wanted.into_iter().collect();
        d.stats.trees_read += wanted.len() as u64;
        // Kept encoded, each node decoded as the merge reaches it: a level's trees parsed whole
        // took most of the diff's memory on a million files (374 MB).
        let mut trees: IdMap<BlobId, TreeBytes> = IdMap::default();
        for (id, tree) in load_level(repo, &wanted, opts.threads, loading)? {
            trees.insert(id, tree.map_err(|e| unreadable(id, e))?);
        }
        for p in level {
            let nodes = |side: Option<BlobId>| side.into_iter().flat_map(|id| trees[&id].nodes());
            d.merge(&p.path, nodes(p.before), nodes(p.after));
        }
    }
    d.entries.sort_by(|x, y| x.path.cmp(&y.path));
    d.stats.bytes_added = d.blobs.only_after();
    d.stats.bytes_removed = d.blobs.only_before();
    d.stats.blobs_added = d.blobs.after.keys().filter(|id| !d.blobs.before.contains_key(id)).count() as u64;
    d.stats.blobs_removed = d.blobs.before.keys().filter(|id| !d.blobs.after.contains_key(id)).count() as u64;
    Ok((d.entries, d.stats))
}

fn unreadable(id: BlobId, e: Error) -> Error {
    Error::Refused(format!("tree {} cannot be read ({e}); run `cairn check`, then `cairn repair`", id.short()))
}

/// A pair of directories to compare at the next level (one side absent: added or removed).
struct Pending {
    path: PathBuf,
    before: Option<BlobId>,
    after: Option<BlobId>,
}

/// The data blobs (with their lengths) of the files each side has that differ.
#[derive(Default)]
struct Blobs {
    before: IdMap<BlobId, u32>,
    after: IdMap<BlobId, u32>,
}

impl Blobs {
    fn add(side: &mut IdMap<BlobId, u32>, n: &Node) {
        for c in &n.content {
            if let Chunk::Data { id, len } = *c {
                side.insert(id, len);
            }
        }
    }

    fn only_after(&self) -> u64 {
        self.after.iter().filter(|(id, _)| !self.before.contains_key(id)).map(|(_, l)| u64::from(*l)).sum()
    }

    fn only_before(&self) -> u64 {
        self.before.iter().filter(|(id, _)| !self.after.contains_key(id)).map(|(_, l)| u64::from(*l)).sum()
    }
}

struct Differ {
    opts: DiffOptions,
    entries: Vec<Entry>,
    stats: DiffStats,
    next: Vec<Pending>,
    blobs: Blobs,
}

impl Differ {
    /// Compares two directories' entries (sorted by name, FORMAT.md §9) name by name.
    fn merge(&mut self, dir: &Path, a: impl Iterator<Item = Node>, b: impl Iterator<Item = Node>) {
        let (mut a, mut b) = (a.peekable(), b.peekable());
        loop {
            let order = match (a.peek(), b.peek()) {
                (None, None) => break,
                (Some(x), Some(y)) => x.name.cmp(&y.name),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
            };
            let (x, y) = match order {
                std::cmp::Ordering::Less => (a.next(), None),
                std::cmp::Ordering::Greater => (None, b.next()),
                std::cmp::Ordering::Equal => (a.next(), b.next()),
            };
            let name = x.as_ref().or(y.as_ref()).map(|n| n.name.as_slice()).unwrap_or_default();
            self.compare(dir.join(OsStr::from_bytes(name)), x.as_ref(), y.as_ref());
        }
    }

    /// Compares the objects at `path` on both sides.
    fn compare(&mut self, path: PathBuf, a: Option<&Node>, b: Option<&Node>) {
        match (a, b) {
            (None, None) => {}
            (None, Some(b)) => self.one_side(Change::Added, path, b),
            (Some(a), None) => self.one_side(Change::Removed, path, a),
            (Some(a), Some(b)) if a.kind != b.kind => {
                self.stats.type_changes += 1;
                self.count(a.kind, Change::Removed);
                self.count(b.kind, Change::Added);
                Blobs::add(&mut self.blobs.before, a);
                Blobs::add(&mut self.blobs.after, b);
                self.push(Change::TypeChanged, path.clone(), Some(a), Some(b));
                if a.kind == NodeKind::Dir {
                    self.descend(path, a.subtree, None);
                } else if b.kind == NodeKind::Dir {
                    self.descend(path, None, b.subtree);
                }
            }
            (Some(a), Some(b)) => {
                if a.kind == NodeKind::Dir && a.subtree != b.subtree {
                    self.descend(path.clone(), a.subtree, b.subtree);
                }
                if a.kind != NodeKind::Dir && !same_content(a, b) {
                    self.count(a.kind, Change::Modified);
                    Blobs::add(&mut self.blobs.before, a);
                    Blobs::add(&mut self.blobs.after, b);
                    self.push(Change::Modified, path, Some(a), Some(b));
                } else if self.opts.metadata && !same_metadata(a, b) {
                    self.stats.metadata_changes += 1;
                    self.push(Change::Metadata, path, Some(a), Some(b));
                }
            }
        }
    }

    /// An object only one side has (and, for a directory, everything below it).
    fn one_side(&mut self, change: Change, path: PathBuf, n: &Node) {
        self.count(n.kind, change);
        let (before, after) = match change {
            Change::Removed => (Some(n), None),
            _ => (None, Some(n)),
        };
        Blobs::add(if before.is_some() { &mut self.blobs.before } else { &mut self.blobs.after }, n);
        self.push(change, path.clone(), before, after);
        if n.kind == NodeKind::Dir {
            self.descend(path, before.and_then(|n| n.subtree), after.and_then(|n| n.subtree));
        }
    }

    fn descend(&mut self, path: PathBuf, before: Option<BlobId>, after: Option<BlobId>) {
        if before.is_some() || after.is_some() {
            self.next.push(Pending { path, before, after });
        }
    }

    fn count(&mut self, kind: NodeKind, change: Change) {
        let c = match kind {
            NodeKind::File => &mut self.stats.files,
            NodeKind::Dir => &mut self.stats.dirs,
            _ => &mut self.stats.others,
        };
        match change {
            Change::Added => c.added += 1,
            Change::Removed => c.removed += 1,
            _ => c.changed += 1,
        }
    }

    fn push(&mut self, change: Change, path: PathBuf, a: Option<&Node>, b: Option<&Node>) {
        self.entries.push(Entry { change, path, before: a.map(Side::of), after: b.map(Side::of) });
    }
}

/// Whether two objects of the same kind hold the same content: a file's chunks, a symlink's
/// target, a device's number.
fn same_content(a: &Node, b: &Node) -> bool {
    a.size == b.size && a.content == b.content && a.target == b.target && a.rdev == b.rdev
}

/// Whether two objects have the same metadata a restore sets: mode, owner, modification time,
/// extended attributes and ACLs. Access and change times, inode and device numbers and link
/// counts are left out: they differ between backups of unchanged files.
fn same_metadata(a: &Node, b: &Node) -> bool {
    a.mode == b.mode
        && a.uid == b.uid
        && a.gid == b.gid
        && a.user == b.user
        && a.group == b.group
        && a.mtime == b.mtime
        && a.xattrs == b.xattrs
        && a.acl_access == b.acl_access
        && a.acl_default == b.acl_default
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, chunks: &[(u8, u32)]) -> Node {
        let mut n = Node::new(name.as_bytes().to_vec(), NodeKind::File);
        n.content = chunks.iter().map(|(b, len)| Chunk::Data { id: BlobId([*b; 32]), len: *len }).collect();
        n.size = chunks.iter().map(|(_, l)| u64::from(*l)).sum();
        n
    }

    fn differ(metadata: bool) -> Differ {
        Differ {
            opts: DiffOptions { metadata, threads: 1 },
            entries: Vec::new(),
            stats: DiffStats::default(),
            next: Vec::new(),
            blobs: Blobs::default(),
        }
    }

    #[test]
    fn merge_finds_added_removed_modified_and_metadata() {
        let a = cairn_format::tree::Tree {
            nodes: vec![file("a", &[(1, 10)]), file("b", &[(2, 20)]), file("c", &[(3, 30)])],
        };
        let mut c_touched = file("c", &[(3, 30)]);
        c_touched.mode = 0o600;
        let b =
            cairn_format::tree::Tree { nodes: vec![file("b", &[(2, 20), (4, 40)]), c_touched, file("d", &[(2, 20)])] };
        let mut d = differ(true);
        d.merge(Path::new("/x"), a.nodes.clone().into_iter(), b.nodes.clone().into_iter());
        let got: Vec<_> = d.entries.iter().map(|e| (e.change.code(), e.path.display().to_string())).collect();
        assert_eq!(got, [('-', "/x/a".into()), ('M', "/x/b".into()), ('U', "/x/c".into()), ('+', "/x/d".into())]);
        assert_eq!(d.stats.files, Counts { added: 1, removed: 1, changed: 1 });
        assert_eq!(d.stats.metadata_changes, 1);
        // Blob 4 is new; blob 1 is gone; blob 2 is on both sides.
        assert_eq!((d.blobs.only_after(), d.blobs.only_before()), (40, 10));
        // Without --metadata the mode change is not reported.
        let mut quiet = differ(false);
        quiet.merge(Path::new("/x"), a.nodes.into_iter(), b.nodes.into_iter());
        assert_eq!(quiet.entries.len(), 3);
    }

    #[test]
    fn type_change_descends_into_the_directory_side() {
        let a = cairn_format::tree::Tree { nodes: vec![file("p", &[(1, 5)])] };
        let mut dir = Node::new(b"p".to_vec(), NodeKind::Dir);
        dir.subtree = Some(BlobId([9; 32]));
        let b = cairn_format::tree::Tree { nodes: vec![dir] };
        let mut d = differ(false);
        d.merge(Path::new("/"), a.nodes.into_iter(), b.nodes.into_iter());
        assert_eq!(d.entries[0].change, Change::TypeChanged);
        assert_eq!((d.stats.files.removed, d.stats.dirs.added, d.stats.type_changes), (1, 1, 1));
        assert_eq!(d.next.len(), 1);
        assert_eq!((d.next[0].before, d.next[0].after), (None, Some(BlobId([9; 32]))));
    }
}
