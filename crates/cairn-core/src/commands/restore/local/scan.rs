//! Scan pass: where the chunks the target still needs are on this machine. A source file of
//! an entry with wanted chunks that still has the snapshot's size and modification time is
//! taken to hold them at the snapshot's offsets, unread: the copy pass reads and verifies each
//! before writing it, so each byte is read and hashed once (a dry run, which copies nothing,
//! hashes them here). One of the snapshot's size but another time was written since: its
//! chunks are hashed at those offsets here, so those that changed are fetched from the start,
//! beside the copy, not after it. One whose size changed is hashed at those offsets and then
//! cut with the repository's chunker; each file of the target that the snapshot does not name,
//! or that the restore will rewrite, is cut with the chunker. Every piece cut is hashed with
//! the chunk-ID key and looked up in the map of wanted chunk IDs. It stops early once every
//! wanted chunk has a place.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rustix::fs::AtFlags;

use super::{Ctx, Lookups, Origin};
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
}

/// What the scan found: one place for each wanted chunk found.
#[derive(Debug, Default, Clone)]
pub(super) struct Found {
    pub spots: IdMap<BlobId, Spot>,
    pub files: Vec<LocalFile>,
}

/// A file to look in.
enum Candidate {
    /// The source file of the plan's entry with this index.
    Source(usize),
    /// A file of the target: one the plan does not name, or (`true`) one it will rewrite.
    Target(PathBuf, bool),
}

/// Finds places for the chunks in `needed` (per entry of `plan`, in `states`).
pub(super) fn scan(ctx: &Ctx<'_>, plan: &Plan, states: &[FileState], needed: &[Vec<NeededChunk>]) -> Result<Found> {
    let mut wanted: IdMap<BlobId, u32> = IdMap::default();
    for c in needed.iter().flatten() {
        wanted.insert(c.id, c.len);
    }
    let mut candidates: Vec<Candidate> = Vec::new();
    if ctx.source.is_some() {
        candidates.extend((0..plan.entries.len()).filter(|&i| !needed[i].is_empty()).map(Candidate::Source));
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
    let found = Mutex::new(Found::default());
    let unfound = AtomicUsize::new(wanted.len());
    let init = || (Vec::new(), Lookups::new(ctx));
    in_parallel_with(&candidates, ctx.threads, init, |(buf, at), _, cand| {
        if unfound.load(Ordering::Relaxed) == 0 || ctx.cancelled() {
            return;
        }
        // A file that cannot be read holds nothing to reuse: its chunks are fetched.
        let (origin, rel, rewritten, hits) = match cand {
            Candidate::Source(i) => {
                let (source, _) = ctx.source.as_ref().expect("source candidates need a source");
                let rel = source.rel(&plan.entries[*i].rel).into_owned();
                let hits = scan_source(ctx, at, &rel, (plan, states, *i), &needed[*i], &wanted, buf);
                (Origin::Source, rel, false, hits)
            }
            Candidate::Target(rel, rewritten) => {
                (Origin::Target, rel.clone(), *rewritten, scan_target(ctx, at, rel, &wanted))
            }
        };
        let Ok(hits) = hits else { return };
        if hits.is_empty() {
            return;
        }
        let mut found = found.lock().expect("found lock");
        let file = found.files.len() as u32;
        let mut new = 0;
        for (id, offset) in hits {
            if let std::collections::hash_map::Entry::Vacant(v) = found.spots.entry(id) {
                v.insert(Spot { file, offset, len: wanted[&id] });
                new += 1;
            }
        }
        if new > 0 {
            found.files.push(LocalFile { origin, rel, rewritten, open: None });
            unfound.fetch_sub(new, Ordering::Relaxed);
        }
    });
    if ctx.cancelled() {
        return Err(Error::Interrupted);
    }
    Ok(found.into_inner().expect("found lock"))
}

/// The wanted chunks in the source file of entry `i` (at `rel` below the source directory):
/// its own needed chunks hashed where the snapshot has them, then, if some are not there and
/// its size changed, every chunk the chunker cuts.
fn scan_source(
    ctx: &Ctx<'_>,
    at: &mut Lookups<'_>,
    rel: &Path,
    (plan, states, i): (&Plan, &[FileState], usize),
    needed: &[NeededChunk],
    wanted: &IdMap<BlobId, u32>,
    buf: &mut Vec<u8>,
) -> io::Result<Vec<(BlobId, u64)>> {
    let st = at.status(Origin::Source, rel)?;
    let entry = &plan.entries[i];
    // The source file is the target's file (the target is inside the source, or a hard link):
    // the compare stage has already used what it holds.
    if states[i] != (FileState::Create { clear: false }) {
        if let Some(target) = &ctx.target_dir {
            if let Ok(there) = rustix::fs::statat(target.as_fd(), &entry.rel, AtFlags::SYMLINK_NOFOLLOW) {
                if (there.st_dev, there.st_ino) == st.file {
                    return Ok(Vec::new());
                }
            }
        }
    }
    let mut hits = Vec::new();
    let mut missed = false;
    // A file of the snapshot's size and time most likely holds its chunks where the snapshot
    // has them: those are taken as places unread, and the copy pass, which reads and verifies
    // every chunk before writing it, is their only reading and hashing — one pass over the
    // file, not two. One written since (an edit in place keeps the boundaries, but some chunks
    // changed) is hashed here, so its changed chunks are known before the fetches start. A
    // dry run writes nothing, so it hashes here. Only such a file is opened: the status is
    // all the scan needs of the others.
    if !ctx.hash_in_scan && st.size == entry.node.size && st.mtime == entry.node.mtime {
        return Ok(needed
            .iter()
            .filter(|c| c.offset + u64::from(c.len) <= st.size)
            .map(|c| (c.id, c.offset))
            .collect());
    }
    let (file, st) = at.open(Origin::Source, rel)?;
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
    Ok(hits)
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
fn cut(
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
