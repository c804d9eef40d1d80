//! Local-data stage, scanned between compare and fetch and copied beside the fetches: chunks
//! the target still needs that are already on this machine are copied from there instead of
//! fetched (Duplicati's "patch with local blocks"). It looks (a) in the files the snapshot was
//! taken from, at the snapshot's original paths, when they still exist and are not the target
//! itself, and (b) in files of the target the snapshot does not name (renamed or moved files)
//! or that the restore will rewrite (swapped files, or one renamed over another).
//!
//! `cost.rs` first decides, per file, whether its chunks are cheaper copied from here or
//! fetched (a local repository on a fast disk can beat reading local files; a remote one
//! rarely does), from the rates the batches before measured. `scan.rs` then finds where the
//! wanted chunks are: a source file is taken to hold them at the snapshot's offsets (a file
//! edited in place keeps its chunk boundaries) — unlooked-at for a local repository, after a
//! status call (and hashing, if it was written since) for a remote one ([`Look`]); one whose
//! size changed is cut with the repository's chunker (its content shifted); the target's files
//! are cut with the chunker. `copy.rs` then, on a thread of the pipeline beside the fetches of
//! everything else, reads each chunk found, hashes it with the repository's chunk-ID key and
//! compares it with the chunk's ID before it writes it: a local file's bytes are never trusted
//! unverified, and a file changed since the backup or the scan costs a fetch (fed to the same
//! pipeline as the copy finds it), never a wrong byte.
//!
//! Memory is bounded by the wanted chunks of the entries given (a map of their IDs and where
//! each was found) and one chunk buffer per thread. Symlinks below the source path and inside
//! the target are never followed: a file's parent directory is opened with `openat2`
//! (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`) and kept open for the files after it, the file by
//! its one name with `O_NOFOLLOW` ([`Lookups`]).

pub mod copy;
pub mod cost;
mod scan;

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustix::fs::{Mode, OFlags};

use super::dirs::{ParentDirs, Status};
use super::options::{LocalData, RestoreOptions};
use super::types::{FileState, NeededChunk, Plan};
use crate::engine::repository::Repository;
use crate::error::{Error, Result};
use cairn_format::config::ChunkerParams;
use cairn_format::crypto::MasterKey;
use cairn_format::id::{BlobId, IdSet};

/// What the local-data stage found for the entries of a plan, before the pipeline: the
/// chunks it copies beside the fetches ([`Scanned::copy`]) and where they are.
pub struct Scanned<'a> {
    /// The blobs to copy: the fetch plan gives them destinations but no read.
    pub local: IdSet<BlobId>,
    /// With a dry run, the bytes that would be copied from the source and from the target.
    pub dry_run: [u64; 2],
    /// Where to copy from (none: nothing to copy).
    copying: Option<(Ctx<'a>, scan::Found)>,
}

impl Scanned<'_> {
    /// Nothing to copy: everything is fetched.
    fn nothing() -> Self {
        Scanned { local: IdSet::default(), dry_run: [0; 2], copying: None }
    }

    /// Whether there is anything to copy.
    pub fn copies(&self) -> bool {
        self.copying.is_some()
    }

    /// How many chunks the copy takes on, and their bytes.
    pub fn chunks(&self) -> (usize, u64) {
        self.copying
            .as_ref()
            .map_or((0, 0), |(_, found)| (found.spots.len(), found.spots.values().map(|s| u64::from(s.len)).sum()))
    }

    /// Copies the chunks found into the files of `sh`'s plan, beside the fetches (`copy.rs`),
    /// handing those (with their lengths) that must be fetched after all to `fetch` as it
    /// finds them; returns how long the copy took once the directories were made.
    pub fn copy(&self, sh: &super::shared::Shared<'_>, fetch: &copy::Fetch<'_>) -> Duration {
        match &self.copying {
            Some((ctx, found)) => copy::copy(ctx, found, sh, fetch),
            None => Duration::ZERO,
        }
    }
}

/// Where the files the restored entries were taken from are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    /// The directory the plan's paths are relative to.
    dir: PathBuf,
    /// When a single file is restored: its name in `dir`, in place of the plan's name.
    file_name: Option<OsString>,
}

impl Source {
    /// Where the original files of a restore of `base` (below the snapshot's root; `None` for
    /// the whole snapshot) are for `local`; `into_dir` says whether the plan's entries are the
    /// contents of `base` (a directory) rather than `base` itself (a file). `None`: nowhere.
    pub fn locate(local: &LocalData, base: Option<&Path>, into_dir: bool) -> Option<Source> {
        let original = Path::new("/").join(base.unwrap_or(Path::new("")));
        let path = match local {
            LocalData::Off => return None,
            LocalData::SnapshotPaths => original,
            LocalData::SourceAt(p) => p.clone(),
        };
        if into_dir {
            return Some(Source { dir: path, file_name: None });
        }
        let dir = path.parent().unwrap_or(Path::new("/")).to_path_buf();
        Some(Source {
            dir: if dir.as_os_str().is_empty() { PathBuf::from(".") } else { dir },
            file_name: path.file_name().map(OsString::from),
        })
    }

    /// The path, relative to [`Source::dir`], of the entry at `rel` in the plan.
    fn rel<'a>(&self, rel: &'a Path) -> std::borrow::Cow<'a, Path> {
        match &self.file_name {
            None => rel.into(),
            Some(name) => {
                let mut parts = rel.components();
                parts.next();
                let mut p = PathBuf::from(name);
                p.extend(parts.filter(|c| matches!(c, Component::Normal(_))));
                p.into()
            }
        }
    }
}

/// Where a local copy of a chunk was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// A file the snapshot was taken from.
    Source = 0,
    /// A file of the target the snapshot does not name.
    Target = 1,
}

/// How the scan looks at the source files, whose chunks it takes to be at the snapshot's
/// offsets (`scan.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Look {
    /// Not at all: the copy, which opens each file and verifies every chunk anyway, finds the
    /// changed ones and has them fetched as it goes. For a local repository (a round trip
    /// under [`cost::NEAR`]), where a changed chunk costs no round trip but a status call per
    /// file costs the scan seconds (a million files: 1.4 s of its 2.8).
    Not,
    /// Takes the status of each file of more than one chunk; one of the snapshot's size and
    /// time is taken as it is, one written since is hashed (and cut if its size changed), so
    /// its changed chunks are planned reads, fetched from the pipeline's start rather than
    /// found by the copy. For a remote repository, whose round trips those reads are. A file of
    /// one chunk is taken as with [`Look::Not`]: its status would cost as much as its copy's
    /// read, and its chunk, if changed, is one read the copy hands on as it finds it.
    Changed,
    /// Hashes every file (and cuts one whose size changed): a dry run, which copies nothing.
    All,
}

/// What the scan and copy passes share: the key to verify with, the open directories to read
/// below, the threads and the cancel flag.
struct Ctx<'a> {
    key: &'a MasterKey,
    chunker: ChunkerParams,
    source: Option<(Source, OwnedFd)>,
    target: &'a Path,
    target_dir: Option<OwnedFd>,
    threads: usize,
    cancel: &'a AtomicBool,
    /// How the scan looks at the source files (see [`Look`]).
    look: Look,
    /// For tests: a shell command the copy runs as it starts
    /// ([`RestoreOptions::local_scanned_hook`]).
    hook: Option<&'a str>,
}

impl Ctx<'_> {
    /// The open directory files of `origin` are relative to.
    fn dir(&self, origin: Origin) -> Option<BorrowedFd<'_>> {
        match origin {
            Origin::Source => self.source.as_ref().map(|(_, fd)| fd.as_fd()),
            Origin::Target => self.target_dir.as_ref().map(|fd| fd.as_fd()),
        }
    }

    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }
}

/// Where the local-data stage looks and writes.
pub struct Places<'a> {
    /// The restore's target.
    pub target: &'a Path,
    /// Whether the target was empty (nothing in it to reuse; its directories not made yet).
    pub empty: bool,
    /// Where the original files are.
    pub source: Option<Source>,
    /// What copying and fetching cost so far: which ranges are worth copying.
    pub costs: cost::Costs,
}

/// Finds the chunks in `needed` (per entry of `plan`, whose files are in `states` against the
/// target) that are already on this machine and cheaper copied than fetched, for the copy
/// beside the fetches ([`Scanned::copy`]). A chunk any file fetches is fetched for every file
/// that needs it (the one read serves them all); a chunk found in a file of the target this
/// restore rewrites is staged first (`copy::stage`), before any write can reach it.
pub fn scan<'a>(
    repo: &'a Repository,
    plan: &Plan,
    states: &[FileState],
    needed: &[Vec<NeededChunk>],
    places: Places<'a>,
    opts: &'a RestoreOptions,
) -> Result<Scanned<'a>> {
    let Places { target, empty, source, costs } = places;
    if opts.local_data == LocalData::Off {
        return Ok(Scanned::nothing());
    }
    // Each file's range goes where it is cheaper (cost.rs); those the repository wins are
    // neither read here nor looked for.
    let bytes = |chunks: &[NeededChunk]| chunks.iter().map(|c| u64::from(c.len)).sum::<u64>();
    let chosen = costs.choose_all(&needed.iter().map(|c| bytes(c)).collect::<Vec<_>>());
    let wanted = scan::Wanted { needed, chosen: &chosen };
    if wanted.each().all(<[_]>::is_empty) {
        return Ok(Scanned::nothing());
    }
    // Files of the target the snapshot does not name are cut whole: worth it only if their
    // chunks, all of them, are cheaper copied.
    let look_in_target = costs.choose(wanted.each().map(bytes).sum()) == cost::Choice::Local;
    let target_dir = open_dir(target).ok();
    // Restoring to where the snapshot was taken from: the compare stage already used what is
    // there.
    let source = source
        .and_then(|s| open_dir(&s.dir).ok().map(|fd| (s, fd)))
        .filter(|(_, fd)| target_dir.as_ref().is_none_or(|t| !same_file(fd.as_fd(), t.as_fd())));
    static NEVER: AtomicBool = AtomicBool::new(false);
    let ctx = Ctx {
        key: repo.key(),
        chunker: repo.config().chunker,
        source,
        target,
        // A live restore's target shares its directory with anything (other disk images): not
        // looked through.
        target_dir: if empty || opts.guard.is_some() || !look_in_target { None } else { target_dir },
        // The stage does the decoders' work (hashing) and the writers' (writing): as many threads
        // as both. On two busy cores the Linux tree's copy took 7.7 s on two threads and 5.3 s
        // on four (fetching it: 6.2 s), minimums of three.
        threads: (opts.write_threads + opts.decode_threads).max(1),
        cancel: opts.cancel.as_deref().unwrap_or(&NEVER),
        look: if opts.dry_run {
            Look::All
        } else if costs.near() {
            Look::Not
        } else {
            Look::Changed
        },
        hook: opts.local_scanned_hook.as_deref(),
    };
    if ctx.source.is_none() && ctx.target_dir.is_none() {
        return Ok(Scanned::nothing());
    }
    let mut found = scan::scan(&ctx, plan, states, wanted)?;
    if !opts.dry_run {
        if let Some(staged) = copy::stage(&ctx, &found) {
            found = staged;
        }
    }
    // A chunk fetched for one file is fetched for all: copied for none.
    for (chunks, _) in needed.iter().zip(&chosen).filter(|(_, &local)| !local) {
        for c in chunks {
            found.spots.remove(&c.id);
        }
    }
    if found.spots.is_empty() {
        return Ok(Scanned::nothing());
    }
    let local: IdSet<BlobId> = found.spots.keys().copied().collect();
    if opts.dry_run {
        return Ok(Scanned { dry_run: copy::dry_run(&found, needed), local, copying: None });
    }
    if ctx.cancelled() {
        return Err(Error::Interrupted);
    }
    Ok(Scanned { local, dry_run: [0; 2], copying: Some((ctx, found)) })
}

/// Opens a directory to read files below.
fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let at = crate::engine::platform::At::new(path)?;
    Ok(rustix::fs::openat(at.dir(), at.name(), OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?)
}

/// Whether two open files are the same file.
fn same_file(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> bool {
    match (rustix::fs::fstat(a), rustix::fs::fstat(b)) {
        (Ok(a), Ok(b)) => a.st_dev == b.st_dev && a.st_ino == b.st_ino,
        _ => false,
    }
}

/// A scan or copy worker's lookups of local files: below the source directory and below the
/// target, each through the parent directory of the last file looked up, kept open (a worker
/// takes files in plan order, so most share a directory with the one before: a million small
/// files cost one single-name call each, not a walk of the whole path). Never through a
/// symlink, never out of the directory ([`ParentDirs::beneath`]), never updating a file's
/// access time where that is permitted; a FIFO is not waited on, and anything but a regular
/// file is refused (a file the scan just found regular is not asked again: if it was replaced
/// since, what it reads fails its chunk's hash and the chunk is fetched).
struct Lookups<'a> {
    source: Option<ParentDirs<'a>>,
    target: Option<ParentDirs<'a>>,
    /// The local file of [`scan::Found::files`] opened last, by its index (`None` in it: it
    /// could not be opened).
    last: Option<(usize, Option<Opened>)>,
}

impl<'a> Lookups<'a> {
    fn new(ctx: &'a Ctx<'_>) -> Self {
        Lookups {
            source: ctx.dir(Origin::Source).map(ParentDirs::beneath),
            target: ctx.dir(Origin::Target).map(ParentDirs::beneath),
            last: None,
        }
    }

    /// The local file `f` of `files` the scan found chunks in, with its size, opened once for
    /// as many of its chunks as come one after another (a large file's pieces often come to
    /// the same worker in a row); `None` if it cannot be opened.
    fn local(&mut self, files: &[scan::LocalFile], f: usize) -> Option<(&File, u64)> {
        if self.last.as_ref().is_none_or(|(open, _)| *open != f) {
            let local = &files[f];
            let file = match (&local.open, local.size) {
                (Some(file), _) => file.metadata().ok().map(|m| (file.clone(), m.len())),
                // The scan found it a regular file of the snapshot's size a moment ago, or it is
                // one chunk, all of it, whatever its size now: one call fewer per file (a
                // million on `many`). Each chunk read is still verified.
                (None, Some(size)) if local.checked => {
                    let file = self.dirs(local.origin).and_then(|dirs| dirs.open_unchecked(&local.rel));
                    file.ok().map(|file| (Arc::new(file), size))
                }
                (None, _) => self.open(local.origin, &local.rel).ok().map(|(file, st)| (Arc::new(file), st.size)),
            };
            self.last = Some((f, file));
        }
        self.last.as_ref().and_then(|(_, file)| file.as_ref()).map(|(file, size)| (&**file, *size))
    }

    fn dirs(&mut self, origin: Origin) -> io::Result<&mut ParentDirs<'a>> {
        let dirs = match origin {
            Origin::Source => self.source.as_mut(),
            Origin::Target => self.target.as_mut(),
        };
        dirs.ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    /// The status of the regular file at `rel` below `origin`'s directory.
    fn status(&mut self, origin: Origin, rel: &Path) -> io::Result<Status> {
        regular(self.dirs(origin)?.status(rel)?)
    }

    /// Opens the regular file at `rel` below `origin`'s directory for reading, with the
    /// status taken from the open descriptor.
    fn open(&mut self, origin: Origin, rel: &Path) -> io::Result<(File, Status)> {
        let (file, st) = self.dirs(origin)?.open_existing(rel)?;
        Ok((file, regular(st)?))
    }
}

/// A local file open for reading, and its size when it was opened.
type Opened = (Arc<File>, u64);

/// `st` if it is a regular file's.
fn regular(st: Status) -> io::Result<Status> {
    if !st.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn located(local: &LocalData, base: Option<&str>, into_dir: bool, rel: &str) -> Option<PathBuf> {
        let s = Source::locate(local, base.map(Path::new), into_dir)?;
        Some(s.dir.join(s.rel(Path::new(rel))))
    }

    #[test]
    fn originals_are_found_below_the_snapshot_path_or_the_given_one() {
        let snap = LocalData::SnapshotPaths;
        // The whole snapshot: its root tree is the file system from `/`.
        assert_eq!(located(&snap, None, true, "home/me/a.txt"), Some(PathBuf::from("/home/me/a.txt")));
        // A directory of it: the plan's paths are below that directory.
        assert_eq!(located(&snap, Some("home/me"), true, "a.txt"), Some(PathBuf::from("/home/me/a.txt")));
        // A single file: the plan's one entry is named after it.
        assert_eq!(located(&snap, Some("home/me/a.txt"), false, "a.txt"), Some(PathBuf::from("/home/me/a.txt")));
        // --use-source=PATH stands for the restored path, whatever its name.
        let at = LocalData::SourceAt(PathBuf::from("/mnt/old/me"));
        assert_eq!(located(&at, Some("home/me"), true, "d/a.txt"), Some(PathBuf::from("/mnt/old/me/d/a.txt")));
        let file = LocalData::SourceAt(PathBuf::from("/mnt/old/renamed.txt"));
        assert_eq!(located(&file, Some("home/me/a.txt"), false, "a.txt"), Some(PathBuf::from("/mnt/old/renamed.txt")));
        assert_eq!(located(&LocalData::Off, Some("home/me"), true, "a.txt"), None);
    }

    #[test]
    fn opening_below_a_directory_follows_no_symlink() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("real")).unwrap();
        std::fs::write(dir.path().join("real/f"), b"data").unwrap();
        std::fs::write(dir.path().join("top"), b"data").unwrap();
        std::os::unix::fs::symlink(dir.path().join("real"), dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("real/f"), dir.path().join("real/flink")).unwrap();
        let fd = open_dir(dir.path()).unwrap();
        rustix::fs::mknodat(fd.as_fd(), "fifo", rustix::fs::FileType::Fifo, Mode::from_raw_mode(0o600), 0).unwrap();
        let mut at = Lookups { source: Some(ParentDirs::beneath(fd.as_fd())), target: None, last: None };
        for rel in ["real/f", "top", "real/f"] {
            assert!(at.open(Origin::Source, Path::new(rel)).is_ok(), "{rel}");
            assert_eq!(at.status(Origin::Source, Path::new(rel)).unwrap().size, 4, "{rel}");
        }
        for (rel, why) in [
            ("link/f", "a symlinked directory is not followed"),
            ("real/flink", "a symlinked file is not followed"),
            ("../x", "nothing outside the directory"),
            ("real/../../x", "nothing outside the directory"),
            ("real", "only regular files"),
            ("fifo", "a FIFO is refused without waiting"),
        ] {
            assert!(at.open(Origin::Source, Path::new(rel)).is_err(), "{rel}: {why}");
            assert!(at.status(Origin::Source, Path::new(rel)).is_err(), "{rel}: {why}");
        }
        assert!(at.open(Origin::Target, Path::new("top")).is_err(), "no target directory: nothing there");
    }
}
