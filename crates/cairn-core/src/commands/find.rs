//! Finding files across snapshots by glob patterns on their names or paths, and by their
//! modification times.
//!
//! Each snapshot is walked with its trees loaded a bounded window ahead ([`crate::engine::trees::walk_with`]),
//! so memory holds the walk's path and the window, however many files. A tree walked in an
//! earlier snapshot without a match anywhere below it is not read again: the snapshots of one
//! machine share most of their directories, and those are walked once. (Loading every tree of
//! every snapshot at once held them all: 1.07 GB for `find` on a million files' repository.)

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use crate::engine::memory::MaxMemory;
use crate::engine::repository::Repository;
use crate::engine::select::SnapshotFilter;
use crate::engine::trees::{walk_with, WalkShares, Walker};
use crate::error::{Error, Result};
use cairn_format::id::{BlobId, IdSet, SnapshotId};
use cairn_format::snapshot::Snapshot;
use cairn_format::tree::{Node, Timestamp};

/// What a search matches: glob patterns (any of them) and a range of modification times.
///
/// A pattern without `/` matches an entry's name (`*.rs`); a pattern with `/` matches its whole
/// path, `*` not crossing a `/` and `**` crossing any number: `/etc/*.conf` from the root,
/// `src/*.rs` (not starting with `/`) at any depth, as `**/src/*.rs`.
#[derive(Clone, Debug)]
pub struct Matcher {
    names: GlobSet,
    paths: GlobSet,
    /// Only entries modified at or after this time.
    pub oldest: Option<Timestamp>,
    /// Only entries modified at or before this time.
    pub newest: Option<Timestamp>,
}

impl Matcher {
    /// Compiles `patterns` (case-insensitive with `ignore_case`); an invalid pattern is an
    /// error naming it.
    pub fn new(patterns: &[String], ignore_case: bool) -> Result<Self> {
        if patterns.is_empty() {
            return Err(Error::Usage("no pattern given: give at least one, e.g. '*.conf'".into()));
        }
        let (mut names, mut paths) = (GlobSetBuilder::new(), GlobSetBuilder::new());
        for p in patterns {
            let (set, glob) = if p.contains('/') {
                let anchored = p.starts_with('/') || p.starts_with("**");
                (&mut paths, if anchored { p.clone() } else { format!("**/{p}") })
            } else {
                (&mut names, p.clone())
            };
            let glob = GlobBuilder::new(&glob)
                .case_insensitive(ignore_case)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map_err(|e| Error::Usage(format!("invalid pattern {p:?}: {e}")))?;
            set.add(glob);
        }
        let build = |b: GlobSetBuilder| b.build().map_err(|e| Error::Usage(format!("invalid pattern: {e}")));
        Ok(Matcher { names: build(names)?, paths: build(paths)?, oldest: None, newest: None })
    }

    /// Whether the entry `node` at `path` matches.
    pub fn matches(&self, path: &Path, node: &Node) -> bool {
        if self.oldest.is_some_and(|t| node.mtime < t) || self.newest.is_some_and(|t| node.mtime > t) {
            return false;
        }
        self.names.is_match(Path::new(std::ffi::OsStr::from_bytes(&node.name))) || self.paths.is_match(path)
    }
}

/// `cairn find`: loads the index of `repo` (opened and locked by the caller), then searches the
/// snapshots `filter` selects within `max_memory` ([`find`]). Returns how many snapshots were
/// searched.
pub fn find_selected(
    repo: &Repository,
    filter: &SnapshotFilter,
    matcher: &Matcher,
    max_memory: MaxMemory,
    found: impl FnMut(&SnapshotId, &Snapshot, &Path, &Node) -> Result<()>,
) -> Result<usize> {
    repo.load_index()?;
    let snapshots = filter.select(repo)?;
    let threads = WalkShares::of(repo, max_memory, repo.storage().default_concurrency(), 0)?.threads;
    find(repo, &snapshots, matcher, threads, found)?;
    Ok(snapshots.len())
}

/// Calls `found` for every entry of `snapshots` (oldest first) that `matcher` matches, snapshot
/// by snapshot, each in tree order. Loads trees on `threads` threads.
pub fn find(
    repo: &Repository,
    snapshots: &[(SnapshotId, Snapshot)],
    matcher: &Matcher,
    threads: usize,
    mut found: impl FnMut(&SnapshotId, &Snapshot, &Path, &Node) -> Result<()>,
) -> Result<()> {
    // Trees walked without a match below them: not read again in a later snapshot. Only where
    // no pattern looks at the path: a tree matches the same names and times wherever it is,
    // not the same paths.
    let mut barren: IdSet<BlobId> = IdSet::default();
    let remember = matcher.paths.is_empty();
    for (id, snap) in snapshots {
        let skip = barren.clone();
        let found = |path: &Path, node: &Node| found(id, snap, path, node);
        let mut search = Search { matcher, found, matched: Vec::new(), barren: remember.then_some(&mut barren) };
        walk_with(repo, snap.tree, Path::new("/"), threads, &skip, &mut search)?;
    }
    Ok(())
}

/// One snapshot's walk for [`find`]: for each tree on the walk's path, whether anything below
/// it matched so far.
struct Search<'a, F> {
    matcher: &'a Matcher,
    found: F,
    matched: Vec<bool>,
    barren: Option<&'a mut IdSet<BlobId>>,
}

impl<F: FnMut(&Path, &Node) -> Result<()>> Walker for Search<'_, F> {
    fn visit(&mut self, path: &Path, node: &Node) -> Result<()> {
        if self.matcher.matches(path, node) {
            if let Some(m) = self.matched.last_mut() {
                *m = true;
            }
            (self.found)(path, node)?;
        }
        Ok(())
    }

    fn entered(&mut self, _id: &BlobId) {
        self.matched.push(false);
    }

    fn left(&mut self, id: BlobId) {
        match self.matched.pop() {
            Some(true) => {
                if let Some(parent) = self.matched.last_mut() {
                    *parent = true;
                }
            }
            _ => {
                if let Some(barren) = self.barren.as_mut() {
                    barren.insert(id);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::tree::NodeKind;

    fn node(name: &str, mtime: i64) -> Node {
        let mut n = Node::new(name.as_bytes().to_vec(), NodeKind::File);
        n.mtime = Timestamp { secs: mtime, nanos: 0 };
        n
    }

    fn is(m: &Matcher, path: &str) -> bool {
        let name = path.rsplit('/').next().unwrap();
        m.matches(Path::new(path), &node(name, 100))
    }

    #[test]
    fn names_paths_and_case() {
        let m = Matcher::new(&["*.RS".into()], true).unwrap();
        assert!(is(&m, "/src/lib.rs"));
        assert!(!is(&m, "/src/lib.rsx"));
        let exact = Matcher::new(&["*.RS".into()], false).unwrap();
        assert!(!is(&exact, "/src/lib.rs"));
        // With a slash: the whole path; `*` stays inside one component.
        let p = Matcher::new(&["/etc/*.conf".into()], false).unwrap();
        assert!(is(&p, "/etc/a.conf"));
        assert!(!is(&p, "/etc/x/a.conf"));
        assert!(!is(&p, "/root/etc/a.conf"));
        let anywhere = Matcher::new(&["etc/*.conf".into()], false).unwrap();
        assert!(is(&anywhere, "/root/etc/a.conf"));
        let deep = Matcher::new(&["/home/**/*.txt".into()], false).unwrap();
        assert!(is(&deep, "/home/a/b/c.txt"));
        assert!(Matcher::new(&["a[".into()], false).unwrap_err().to_string().contains("\"a[\""));
    }

    #[test]
    fn time_range() {
        let mut m = Matcher::new(&["*".into()], false).unwrap();
        m.oldest = Some(Timestamp { secs: 50, nanos: 0 });
        m.newest = Some(Timestamp { secs: 150, nanos: 0 });
        assert!(m.matches(Path::new("/a"), &node("a", 100)));
        assert!(!m.matches(Path::new("/a"), &node("a", 10)));
        assert!(!m.matches(Path::new("/a"), &node("a", 200)));
    }
}
