//! Copy pass: for each file, every chunk the scan found is read from its local place, hashed
//! with the chunk-ID key and compared with its ID, and only then written — the bytes written
//! are the bytes hashed, so a local file changed since the scan is caught here and the chunk is
//! fetched instead. A file is prepared (cleared, created and sized, or fixed in place) by its
//! first verified chunk, as the write stage would.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{Mode, OFlags};
use std::sync::Mutex;

use super::scan::{Found, LocalFile, Spot};
use super::{open_beneath, Ctx, Origin, Reused};
use crate::commands::restore::dirs::ParentDirs;
use crate::commands::restore::fsops::is_fatal;
use crate::commands::restore::options::Sparse;
use crate::commands::restore::types::{Entry, FileState, NeededChunk, Plan};
use crate::commands::restore::write::{prepare_file, write_data};
use crate::engine::parallel::in_parallel_with;
use crate::error::{Error, Result};
use cairn_format::id::BlobId;

/// What a dry run would reuse: every needed chunk the scan found a place for.
pub(super) fn dry_run(found: &Found, needed: &[Vec<NeededChunk>]) -> Reused {
    let mut out = Reused { prepared: vec![false; needed.len()], ..Reused::default() };
    for chunks in needed {
        let mut still = Vec::new();
        for c in chunks {
            match found.spots.get(&c.id) {
                Some(spot) => *out.counter(found.files[spot.file as usize].origin) += u64::from(c.len),
                None => still.push(*c),
            }
        }
        out.needed.push(still);
    }
    out
}

impl Reused {
    fn counter(&mut self, origin: Origin) -> &mut u64 {
        match origin {
            Origin::Source => &mut self.from_source,
            Origin::Target => &mut self.from_target,
        }
    }
}

/// A copy worker's state: its open target directory, the local file it read last and a
/// chunk buffer.
struct Worker<'t> {
    dirs: ParentDirs<'t>,
    open: Option<(u32, Arc<File>)>,
    buf: Vec<u8>,
}

/// What copying into one file did.
#[derive(Default)]
struct Copied {
    still: Vec<NeededChunk>,
    prepared: bool,
    from_source: u64,
    from_target: u64,
}

/// Copies the chunks `found` into the files of `plan` (in `states`) that `needed` them, on
/// `ctx.threads` threads; `parents_made` says whether the target's directories exist yet.
pub(super) fn copy(
    ctx: &Ctx<'_>,
    plan: &Plan,
    states: &[FileState],
    needed: &[Vec<NeededChunk>],
    found: &Found,
    sparse: Sparse,
    parents_made: bool,
) -> Result<Reused> {
    let staged = stage(ctx, found);
    let found = staged.as_ref().unwrap_or(found);
    let slots: Vec<Mutex<Option<Copied>>> = needed.iter().map(|_| Mutex::new(None)).collect();
    let fatal: Mutex<Option<Error>> = Mutex::new(None);
    let stop = || ctx.cancelled() || fatal.lock().expect("fatal lock").is_some();
    let init = || Worker { dirs: ParentDirs::new(ctx.target), open: None, buf: Vec::new() };
    in_parallel_with(needed, ctx.threads, init, |w, i, chunks| {
        if chunks.iter().all(|c| !found.spots.contains_key(&c.id)) || stop() {
            return;
        }
        let entry = &plan.entries[i];
        let job = FileJob { ctx, entry, state: &states[i], found, sparse, parents_made };
        match job.run(w, chunks) {
            Ok(done) => *slots[i].lock().expect("slot") = Some(done),
            Err(e) => {
                fatal.lock().expect("fatal lock").get_or_insert(Error::io(
                    ctx.target.join(&entry.rel),
                    "cannot write",
                    e,
                ));
            }
        }
    });
    if let Some(e) = fatal.into_inner().expect("fatal lock") {
        return Err(e);
    }
    let mut out = Reused::default();
    for (slot, chunks) in slots.into_iter().zip(needed) {
        match slot.into_inner().expect("slot") {
            Some(done) => {
                out.needed.push(done.still);
                out.prepared.push(done.prepared);
                out.from_source += done.from_source;
                out.from_target += done.from_target;
            }
            None => {
                out.needed.push(chunks.clone());
                out.prepared.push(false);
            }
        }
    }
    Ok(out)
}

/// Copying the chunks of one file.
struct FileJob<'a> {
    ctx: &'a Ctx<'a>,
    entry: &'a Entry,
    state: &'a FileState,
    found: &'a Found,
    sparse: Sparse,
    parents_made: bool,
}

impl FileJob<'_> {
    /// Copies every chunk of `chunks` found locally and verified; the error is one that stops
    /// the restore (disk full, read-only).
    fn run(&self, w: &mut Worker<'_>, chunks: &[NeededChunk]) -> io::Result<Copied> {
        let mut out = Copied::default();
        let mut file: Option<File> = None;
        let fresh = matches!(self.state, FileState::Create { .. });
        for (n, c) in chunks.iter().enumerate() {
            let Some(spot) = self.found.spots.get(&c.id) else {
                out.still.push(*c);
                continue;
            };
            // Unreadable, or no longer what the scan saw: fetched instead.
            if !matches!(self.read_verified(w, spot, c), Ok(true)) {
                out.still.push(*c);
                continue;
            }
            if file.is_none() {
                match self.prepare(w) {
                    Ok(f) => {
                        file = Some(f);
                        out.prepared = true;
                    }
                    Err(e) if is_fatal(&e) => return Err(e),
                    // The write stage will try again and report why it cannot.
                    Err(_) => {
                        out.still.extend_from_slice(&chunks[n..]);
                        return Ok(out);
                    }
                }
            }
            let f = file.as_ref().expect("prepared above");
            match write_data(f, &w.buf, c.offset, fresh, self.sparse, self.ctx.guard) {
                Ok(()) => match self.found.files[spot.file as usize].origin {
                    Origin::Source => out.from_source += u64::from(c.len),
                    Origin::Target => out.from_target += u64::from(c.len),
                },
                Err(e) if is_fatal(&e) => return Err(e),
                Err(_) => out.still.push(*c),
            }
        }
        Ok(out)
    }

    /// Reads the chunk `c` at `spot` into the worker's buffer; whether its ID is `c`'s.
    fn read_verified(&self, w: &mut Worker<'_>, spot: &Spot, c: &NeededChunk) -> io::Result<bool> {
        if w.open.as_ref().is_none_or(|(n, _)| *n != spot.file) {
            w.open = None;
            w.open = Some((spot.file, open_local(self.ctx, &self.found.files[spot.file as usize])?));
        }
        let (_, file) = w.open.as_ref().expect("opened above");
        read_verified(self.ctx, file, spot.offset, c.id, c.len, &mut w.buf)
    }

    /// Prepares the file for its first write, making its parent directories first if the
    /// target's directories are not made yet (into an empty target they are made alongside
    /// the pipeline).
    fn prepare(&self, w: &mut Worker<'_>) -> io::Result<File> {
        match prepare_file(self.ctx.target, &mut w.dirs, self.entry, self.state, self.sparse, self.ctx.guard) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && !self.parents_made => {
                let parent = self.entry.rel.parent().unwrap_or(Path::new(""));
                std::fs::create_dir_all(self.ctx.target.join(parent))?;
                prepare_file(self.ctx.target, &mut w.dirs, self.entry, self.state, self.sparse, self.ctx.guard)
            }
            other => other,
        }
    }
}

/// Opens a local file the scan found chunks in.
fn open_local(ctx: &Ctx<'_>, local: &LocalFile) -> io::Result<Arc<File>> {
    if let Some(f) = &local.open {
        return Ok(f.clone());
    }
    let dir = ctx.dir(local.origin).ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
    Ok(Arc::new(open_beneath(dir, &local.rel)?))
}

/// Reads the `len` bytes at `offset` of `file` into `buf`; whether their ID is `id`.
fn read_verified(ctx: &Ctx<'_>, file: &File, offset: u64, id: BlobId, len: u32, buf: &mut Vec<u8>) -> io::Result<bool> {
    buf.resize(len as usize, 0);
    file.read_exact_at(buf, offset)?;
    Ok(ctx.key.blob_id(buf) == id)
}

/// Chunks found in files of the target that this restore rewrites may be gone before the copy
/// reaches them (two files swapped, one renamed over another: whichever is written first
/// destroys what the other wants). They are copied, verified, into an unnamed temporary file
/// in the target first (`O_TMPFILE`: nothing to clean up, whatever happens), and read from
/// there. Returns the places with those chunks moved, or `None` if none was (nothing to move,
/// or no temporary file: then each is read from where it was, if it is still there).
fn stage(ctx: &Ctx<'_>, found: &Found) -> Option<Found> {
    let mut moving: Vec<(BlobId, Spot)> =
        found.spots.iter().filter(|(_, s)| found.files[s.file as usize].rewritten).map(|(id, s)| (*id, *s)).collect();
    if moving.is_empty() {
        return None;
    }
    moving.sort_unstable_by_key(|(_, s)| (s.file, s.offset));
    let dir = ctx.dir(Origin::Target)?;
    let flags = OFlags::RDWR | OFlags::TMPFILE | OFlags::CLOEXEC;
    let tmp = Arc::new(File::from(rustix::fs::openat(dir, ".", flags, Mode::from_raw_mode(0o600)).ok()?));
    let mut out = found.clone();
    let staged = out.files.len() as u32;
    out.files.push(LocalFile {
        origin: Origin::Target,
        rel: PathBuf::from("(staged)"),
        rewritten: false,
        open: Some(tmp.clone()),
    });
    let mut buf = Vec::new();
    let mut open: Option<(u32, Arc<File>)> = None;
    let mut at = 0u64;
    for (id, spot) in moving {
        if ctx.cancelled() {
            break;
        }
        if open.as_ref().is_none_or(|(n, _)| *n != spot.file) {
            open = open_local(ctx, &found.files[spot.file as usize]).ok().map(|f| (spot.file, f));
        }
        let Some((_, file)) = &open else { continue };
        match read_verified(ctx, file, spot.offset, id, spot.len, &mut buf) {
            Ok(true) => {}
            // Changed already: fetched.
            _ => {
                out.spots.remove(&id);
                continue;
            }
        }
        // Out of space for staging: the rest stay where they are.
        if tmp.write_all_at(&buf, at).is_err() {
            break;
        }
        out.spots.insert(id, Spot { file: staged, offset: at, len: spot.len });
        at += u64::from(spot.len);
    }
    Some(out)
}
