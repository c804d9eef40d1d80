//! Scan pass: where the chunks the target still needs are on this machine. A source file of
//! an entry with wanted chunks is taken to hold them at the snapshot's offsets: the copy pass
//! opens it, reads and verifies each chunk before writing it, so each byte is read and hashed
//! once. How much the scan looks at it first is [`Look`]'s: for a local repository not at all
//! (no call per file; the copy has what changed fetched as it finds it, and cuts a file whose
//! size changed for the chunks it missed, `copy.rs`); for a remote one its status, and a file
//! written since is hashed here (and cut if its size changed), so its changed chunks are
//! planned reads; in a dry run, which copies nothing, every file is hashed. Each file of the
//! target that the snapshot does not name, or that the restore will rewrite, is cut with the
//! chunker. Every piece cut is hashed with the chunk-ID key and looked up in the map of wanted
//! chunk IDs. It stops early once every wanted chunk has a verified place.

use std::collections::hash_map::Entry;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rustix::fs::AtFlags;

use super::{Ctx, Look, Lookups, Origin};
use crate::commands::restore::compare::chunk_id;
use crate::commands::restore::delete::extra_entries;
use crate::commands::restore::types::{FileState, NeededChunk, Plan};
use crate::engine::chunker::ChunkerKind;
use crate::engine::parallel::in_parallel_with;
use crate::error::{Error, Result};
use cairn_format::id::{BlobId, IdMap};

/// Where one local copy of a chunk is: a file of [`Found::files`], the offset in it and the
/// chunk's length.
#[derive(Clone, Copy, Debug)]
pub(super) struct Spot {
    pub file: u32,
    pub offset: u64,
    pub len: u32,
}

/// A local file with wanted chunks: which directory it is below, and its path there.
#[derive(Debug, Clone)]
pub(super) struct LocalFile {
    pub origin: Origin,
    pub rel: PathBuf,
    /// A file of the target this restore rewrites: what it holds may be gone before the copy
    /// reaches it (see `copy::stage`).
    pub rewritten: bool,
    /// Already open (a staging file, which has no name).
    pub open: Option<Arc<File>>,
    /// A source file whose chunks were taken unread: its size in the snapshot (the copy cuts
    /// the file for the chunks it misses if its size is another).
    pub size: Option<u64>,
    /// Taken unread after its status matched the snapshot's (a regular file of that size and
    /// time, [`Look::Changed`]), or with no status needed (one chunk, all of it:
    /// [`is_one_chunk`]): the copy opens it without taking its status.
    pub checked: bool,
}

impl LocalFile {
    /// The source file at `rel`; `size`: its size in the snapshot, if its chunks were taken
    /// unread (`checked`: after its status matched the snapshot's, or needing none:
    /// [`is_one_chunk`]).
    fn source(rel: PathBuf, size: Option<u64>, checked: bool) -> Self {
        LocalFile { origin: Origin::Source, rel, rewritten: false, open: None, size, checked }
    }

    /// The target's file at `rel` (`rewritten`: one this restore rewrites).
    fn target(rel: PathBuf, rewritten: bool) -> Self {
        LocalFile { origin: Origin::Target, rel, rewritten, open: None, size: None, checked: false }
    }
}

/// Whether a file of `size` bytes is the one chunk in `needed`, all of it. Its copy reads that
/// chunk at offset 0 and verifies it whatever the file is now, and a changed one has nothing
/// else to find in it, so neither the scan nor the copy takes its status (a million small
/// files: a million calls each way fewer); a changed one is fetched once the copy finds it.
fn is_one_chunk(needed: &[NeededChunk], size: u64) -> bool {
    matches!(needed, [c] if c.offset == 0 && u64::from(c.len) == size)
}

/// The places of `needed` at the snapshot's offsets, taken unread.
fn at_offsets(needed: &[NeededChunk]) -> impl Iterator<Item = (BlobId, u64)> + '_ {
    needed.iter().map(|c| (c.id, c.offset))
}

/// The chunks each entry of a plan needs that are looked for here: an entry's needed chunks if
/// the cost model chose to copy them (`cost.rs`), none otherwise. Borrowed, not copied: a
/// copy of every entry's list cost an allocation per file on the thread that runs the batch.
#[derive(Clone, Copy)]
pub(super) struct Wanted<'n> {
    pub needed: &'n [Vec<NeededChunk>],
    pub chosen: &'n [bool],
}

impl<'n> Wanted<'n> {
    /// The wanted chunks of entry `i`.
    pub fn of(&self, i: usize) -> &'n [NeededChunk] {
        if self.chosen[i] {
            &self.needed[i]
        } else {
            &[]
        }
    }

    /// The wanted chunks of each entry, in the plan's order.
    pub fn each(self) -> impl Iterator<Item = &'n [NeededChunk]> {
        (0..self.needed.len()).map(move |i| self.of(i))
    }
}

/// What the scan found: one place for each wanted chunk found.
#[derive(Debug, Default, Clone)]
pub(super) struct Found {
    pub spots: IdMap<BlobId, Spot>,
    pub files: Vec<LocalFile>,
}

impl Found {
    /// Adds `file` with the places of wanted chunks in it (`hits`, of chunks in `wanted`) that
    /// have none yet; returns how many chunks it found that were not found before. A place
    /// taken unread (a source file's, `file.size` set) is a guess; one hashed (a cut) is
    /// known: it takes the chunk from a guess, and only known places count as found (a source
    /// file that is gone does not stop the scan before the target's files that hold its
    /// chunks).
    fn add(
        &mut self,
        file: LocalFile,
        hits: impl IntoIterator<Item = (BlobId, u64)>,
        wanted: &IdMap<BlobId, u32>,
    ) -> usize {
        let unread = file.size.is_some();
        let at = self.files.len() as u32;
        let (mut used, mut known) = (false, 0);
        for (id, offset) in hits {
            let spot = Spot { file: at, offset, len: wanted[&id] };
            match self.spots.entry(id) {
                Entry::Vacant(v) => {
                    v.insert(spot);
                    used = true;
                    known += usize::from(!unread);
                }
                Entry::Occupied(mut o) if !unread && self.files[o.get().file as usize].size.is_some() => {
                    o.insert(spot);
                    used = true;
                    known += 1;
                }
                Entry::Occupied(_) => {}
            }
        }
        if used {
            self.files.push(file);
        }
        known
    }
}

/// A file to look in.
enum Candidate {
    /// The source file of the plan's entry with this index.
    Source(usize),
    /// A file of the target: one the plan does not name, or (`true`) one it will rewrite.
    Target(PathBuf, bool),
}

/// Finds places for the chunks `needed` wants (per entry of `plan`, in `states`).
pub(super) fn scan(ctx: &Ctx<'_>, plan: &Plan, states: &[FileState], needed: Wanted<'_>) -> Result<Found> {
    let mut wanted: IdMap<BlobId, u32> = IdMap::default();
    for c in needed.each().flatten() {
        wanted.insert(c.id, c.len);
    }
    let mut found = Found::default();
    let mut candidates: Vec<Candidate> = Vec::new();
    if let Some((source, _)) = &ctx.source {
        for i in (0..plan.entries.len()).filter(|&i| !needed.of(i).is_empty()) {
            // Taken unread (see scan_source) without a call: no status to check, so no thread
            // and no lock (a million files cost 1.5 s through the parallel pass).
            let at_target = states[i] != (FileState::Create { clear: false }) && ctx.target_dir.is_some();
            let whole = is_one_chunk(needed.of(i), plan.entries[i].node.size);
            let unlooked = match ctx.look {
                Look::Not => true,
                Look::Changed => whole,
                Look::All => false,
            };
            if at_target || !unlooked {
                candidates.push(Candidate::Source(i));
            } else {
                let rel = source.rel(&plan.entries[i].rel).into_owned();
                let size = Some(plan.entries[i].node.size);
                found.add(LocalFile::source(rel, size, whole), at_offsets(needed.of(i)), &wanted);
            }
        }
    }
    if ctx.target_dir.is_some() {
        candidates.extend(extra_files(ctx.target, plan).into_iter().map(|rel| Candidate::Target(rel, false)));
        // Files the restore will rewrite may hold chunks other files want (files swapped, or
        // one renamed over another); the copy pass verifies what it reads, so one rewritten
        // first only costs a fetch.
        let replaced = |i: &usize| matches!(states[*i], FileState::InPlace { .. } | FileState::Create { clear: true });
        candidates.extend(
            (0..plan.entries.len()).filter(replaced).map(|i| Candidate::Target(plan.entries[i].rel.clone(), true)),
        );
    }
    // Places taken unread are not found yet (see Found::add).
    let unfound = AtomicUsize::new(wanted.len());
    let found = Mutex::new(found);
    let init = || (Vec::new(), Lookups::new(ctx));
    in_parallel_with(&candidates, ctx.threads, init, |(buf, at), _, cand| {
        if unfound.load(Ordering::Relaxed) == 0 || ctx.cancelled() {
            return;
        }
        // A file that cannot be read holds nothing to reuse: its chunks are fetched.
        let (file, hits) = match cand {
            Candidate::Source(i) => {
                let (source, _) = ctx.source.as_ref().expect("source candidates need a source");
                let rel = source.rel(&plan.entries[*i].rel).into_owned();
                let hits = scan_source(ctx, at, &rel, (plan, states, *i), needed.of(*i), &wanted, buf);
                let took = hits.as_ref().map_or(Took::Hashed, |&(_, took)| took);
                let size = (took != Took::Hashed).then_some(plan.entries[*i].node.size);
                (LocalFile::source(rel, size, took == Took::Checked), hits.map(|(hits, _)| hits))
            }
            Candidate::Target(rel, rewritten) => {
                (LocalFile::target(rel.clone(), *rewritten), scan_target(ctx, at, rel, &wanted))
            }
        };
        let Ok(hits) = hits else { return };
        if hits.is_empty() {
            return;
        }
        let known = found.lock().expect("found lock").add(file, hits, &wanted);
        unfound.fetch_sub(known, Ordering::Relaxed);
    });
    let found = found.into_inner().expect("found lock");
    if ctx.cancelled() {
        return Err(Error::Interrupted);
    }
    Ok(found)
}

/// How the scan took a source file's chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Took {
    /// Hashed here: the places are known.
    Hashed,
    /// Unread, with no status taken: the copy verifies each chunk.
    Unread,
    /// Unread, after the file's status matched the snapshot's: the copy verifies each chunk.
    Checked,
}

/// The wanted chunks in the source file of entry `i` (at `rel` below the source directory),
/// as [`Look`] says: its own needed chunks where the snapshot has them, taken unread (the copy
/// verifies each) or hashed there; then, if some are not there and its size changed, every
/// chunk the chunker cuts.
fn scan_source(
    ctx: &Ctx<'_>,
    at: &mut Lookups<'_>,
    rel: &Path,
    (plan, states, i): (&Plan, &[FileState], usize),
    needed: &[NeededChunk],
    wanted: &IdMap<BlobId, u32>,
    buf: &mut Vec<u8>,
) -> io::Result<(Vec<(BlobId, u64)>, Took)> {
    let entry = &plan.entries[i];
    let unread = |took| Ok((at_offsets(needed).collect(), took));
    let mut status = None;
    // The source file is the target's file (the target is inside the source, or a hard link):
    // the compare stage has already used what it holds. Only a path the target has a file at
    // can be that.
    if states[i] != (FileState::Create { clear: false }) {
        if let Some(target) = &ctx.target_dir {
            let st = at.status(Origin::Source, rel)?;
            if let Ok(there) = rustix::fs::statat(target.as_fd(), &entry.rel, AtFlags::SYMLINK_NOFOLLOW) {
                if (there.st_dev, there.st_ino) == st.file {
                    return Ok((Vec::new(), Took::Hashed));
                }
            }
            status = Some(st);
        }
    }
    // The copy pass reads and verifies every chunk before writing it, so a file taken unread
    // is read and hashed once; one that changed costs fetches the copy starts as it finds
    // them, or, where those are round trips, the hashing here that plans them first. Only
    // such a file is opened: the status is all the scan needs of the others.
    match ctx.look {
        Look::Not => return unread(Took::Unread),
        Look::Changed => {
            let st = match status {
                Some(st) => st,
                None => at.status(Origin::Source, rel)?,
            };
            if st.size == entry.node.size && st.mtime == entry.node.mtime {
                return unread(Took::Checked);
            }
        }
        Look::All => {}
    }
    let (file, st) = at.open(Origin::Source, rel)?;
    let mut hits = Vec::new();
    let mut missed = false;
    for c in needed {
        if c.offset + u64::from(c.len) <= st.size && chunk_id(&file, c.offset, c.len, ctx.key, buf)? == c.id {
            hits.push((c.id, c.offset));
        } else {
            missed = true;
        }
    }
    if missed && st.size != entry.node.size {
        cut(ctx, &file, st.size, wanted, &mut hits)?;
    }
    Ok((hits, Took::Hashed))
}

/// The wanted chunks in the target's file at `rel`.
fn scan_target(
    ctx: &Ctx<'_>,
    at: &mut Lookups<'_>,
    rel: &Path,
    wanted: &IdMap<BlobId, u32>,
) -> io::Result<Vec<(BlobId, u64)>> {
    let (file, st) = at.open(Origin::Target, rel)?;
    let mut hits = Vec::new();
    cut(ctx, &file, st.size, wanted, &mut hits)?;
    Ok(hits)
}

/// Cuts `file` (of `size` bytes) with the repository's chunker and adds each wanted chunk
/// with its offset to `hits`.
pub(super) fn cut(
    ctx: &Ctx<'_>,
    file: &File,
    size: u64,
    wanted: &IdMap<BlobId, u32>,
    hits: &mut Vec<(BlobId, u64)>,
) -> io::Result<()> {
    let mut offset = 0u64;
    ChunkerKind::Cdc(ctx.chunker).chunk::<_, io::Error>(file, size, |data| {
        let len = data.len() as u64;
        let id = ctx.key.blob_id(&data);
        if wanted.get(&id).is_some_and(|&l| u64::from(l) == len) {
            hits.push((id, offset));
        }
        offset += len;
        if ctx.cancelled() {
            return Err(io::Error::other("interrupted"));
        }
        Ok(())
    })
}

/// The regular files of the target that the plan does not name (relative to the target):
/// the entries of the directories this batch closes (whose children are all known) that the
/// snapshot lacks, and what is below those that are directories. Symlinks are not followed.
fn extra_files(target: &Path, plan: &Plan) -> Vec<PathBuf> {
    let mut files = Vec::new();
    // Below an extra directory, everything is extra.
    let mut todo: Vec<PathBuf> = extra_entries(target, &plan.closed, true, |_| true);
    while let Some(rel) = todo.pop() {
        let Ok(st) = crate::engine::platform::lstat(&target.join(&rel)) else { continue };
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG if st.st_size > 0 => files.push(rel),
            libc::S_IFDIR => {
                let Ok(names) = crate::engine::platform::list_names(&target.join(&rel)) else { continue };
                todo.extend(names.into_iter().map(|n| rel.join(std::ffi::OsString::from_vec(n))));
            }
            _ => {}
        }
    }
    files.sort();
    files
}
