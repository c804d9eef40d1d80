//! Copy pass, beside the fetches: for each local file the scan found chunks in, each chunk is
//! read, hashed with the chunk-ID key and compared with its ID, and only then written to every
//! place it goes by the write stage's own `write_one` — so a file is prepared by its first
//! write and finished by its last, whether that is a copy or a fetched blob. The bytes written
//! are the bytes hashed: a local file changed since the backup (or since the scan) is caught
//! here, and its chunk is fetched instead, by a read planned as the copy finds it and fed to
//! the fetch stage between the planned ones (`Shared::reads`), so the changed chunks are
//! fetched while the copy goes on. A source file whose size changed is cut with the chunker
//! for the chunks missed at the snapshot's offsets, once the rest is copied.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags};
use std::sync::Mutex;

use super::scan::{Found, LocalFile, Spot};
use super::{Ctx, Lookups, Origin};
use crate::commands::restore::dirs::ParentDirs;
use crate::commands::restore::shared::Shared;
use crate::commands::restore::types::NeededChunk;
use crate::commands::restore::write::{each_dest, write_one};
use crate::engine::parallel::in_parallel_with;
use cairn_format::id::{BlobId, IdMap, IdSet};

/// What a dry run would copy, from the source and from the target: every needed chunk the
/// scan found a place for, at each place it goes.
pub(super) fn dry_run(found: &Found, needed: &[Vec<NeededChunk>]) -> [u64; 2] {
    let mut out = [0; 2];
    for c in needed.iter().flatten() {
        if let Some(spot) = found.spots.get(&c.id) {
            out[found.files[spot.file as usize].origin as usize] += u64::from(c.len);
        }
    }
    out
}

/// A chunk to copy: its local file (of [`Found::files`]), its offset there, its ID and its
/// length.
type Piece = (u32, u64, BlobId, u32);

/// Most chunks of one local file a copy thread takes at a time.
const PIECE: usize = 64;

/// Where the copy hands the chunks (with their lengths) it could not copy: they are fetched.
pub type Fetch<'f> = dyn Fn(&[(BlobId, u32)]) + Sync + 'f;

/// Chunks whose copy failed that a copy thread gathers before handing them on together (their
/// reads coalesce what lies side by side in a pack and join what lies apart in it,
/// `read::join_parts`: one read for a group's chunks of one pack) ...
const LATE_GROUP: usize = 64;

/// ... or once the first of them has waited this long (the fetch stage may have nothing else).
const LATE_WAIT: Duration = Duration::from_millis(5);

/// A copy thread's chunks to fetch, not yet handed on; handed on when dropped (the thread's
/// work is over).
struct Late<'f> {
    chunks: Vec<(BlobId, u32)>,
    since: Instant,
    fetch: &'f Fetch<'f>,
}

impl Late<'_> {
    fn push(&mut self, id: BlobId, len: u32) {
        if self.chunks.is_empty() {
            self.since = Instant::now();
        }
        self.chunks.push((id, len));
    }

    /// Hands the chunks on if there are enough, or the first has waited long enough.
    fn hand_on(&mut self, now: bool) {
        if !self.chunks.is_empty() && (now || self.chunks.len() >= LATE_GROUP || self.since.elapsed() >= LATE_WAIT) {
            (self.fetch)(&self.chunks);
            self.chunks.clear();
        }
    }
}

impl Drop for Late<'_> {
    fn drop(&mut self) {
        // A thread that panicked is taking the restore down: nothing more to fetch.
        if !std::thread::panicking() {
            self.hand_on(true);
        }
    }
}

/// A copy worker's state: its open target directories, its lookups of local files, a chunk
/// buffer and its chunks to fetch.
struct Worker<'t, 'f> {
    dirs: ParentDirs<'t>,
    at: Lookups<'t>,
    buf: Vec<u8>,
    late: Late<'f>,
}

/// Copies every chunk `found` to its places in `sh`'s plan (the blobs' destinations of
/// `sh.fetches`), local file by local file, on `ctx.threads` threads, once the directories are
/// made. The chunks that cannot be read or do not verify go to `fetch`, a few at a time as the
/// copy finds them; those of a source file whose size is no longer the snapshot's (its content
/// shifted) are first looked for by cutting the file, once the rest is copied. A write that
/// fails fails its file, or stops the restore, as in the write stage. Returns how long the copy
/// took once the directories were made.
pub(super) fn copy(ctx: &Ctx<'_>, found: &Found, sh: &Shared<'_>, fetch: &Fetch<'_>) -> Duration {
    // Each local file's chunks in the order they lie in it, in pieces of at most PIECE chunks:
    // a large file (a disk image) is copied by every thread, not by one. One list for all
    // files (a list per file cost an allocation per file).
    let mut all: Vec<Piece> = found.spots.iter().map(|(id, s)| (s.file, s.offset, *id, s.len)).collect();
    all.sort_unstable_by_key(|&(file, offset, ..)| (file, offset));
    let pieces: Vec<(usize, &[Piece])> =
        all.chunk_by(|a, b| a.0 == b.0).flat_map(|spots| spots.chunks(PIECE).map(|p| (p[0].0 as usize, p))).collect();
    // Chunks missed in files whose content shifted, by file: looked for once the rest is done.
    let shifted = Mutex::new(Vec::new());
    sh.dirs_ready.wait();
    if let Some(cmd) = ctx.hook {
        let _ = std::process::Command::new("sh").arg("-c").arg(cmd).status();
    }
    let began = Instant::now();
    let init = || Worker {
        dirs: ParentDirs::new(sh.target),
        at: Lookups::new(ctx),
        buf: Vec::new(),
        late: Late { chunks: Vec::new(), since: began, fetch },
    };
    in_parallel_with(&pieces, ctx.threads, init, |w, _, &(f, spots)| {
        if sh.cancelled() || ctx.cancelled() {
            return;
        }
        let local = &found.files[f];
        let copied = &sh.copied[local.origin as usize];
        let Worker { dirs, at, buf, late } = w;
        let file = at.local(&found.files, f);
        let moved = matches!((file, local.size), (Some((_, now)), Some(was)) if now != was);
        for &(_, offset, id, len) in spots {
            if sh.cancelled() {
                return;
            }
            // Unreadable, or no longer what the snapshot holds: fetched instead.
            let verified = file.is_some_and(|(f, _)| matches!(read_verified(ctx, f, offset, id, len, buf), Ok(true)));
            if !verified {
                if moved {
                    shifted.lock().expect("shifted lock").push((f, id, len));
                } else {
                    late.push(id, len);
                }
            } else {
                write_all(sh, dirs, id, buf, copied);
            }
            // Looked at after every chunk: a piece of a large file may take long to copy.
            late.hand_on(false);
        }
    });
    let shifted = shifted.into_inner().expect("shifted lock");
    if !shifted.is_empty() && !sh.cancelled() && !ctx.cancelled() {
        recut(ctx, found, sh, shifted, fetch);
    }
    began.elapsed()
}

/// Writes the verified chunk `id` (in `data`) to every place it goes, counting it in `copied`.
fn write_all(sh: &Shared<'_>, dirs: &mut ParentDirs<'_>, id: BlobId, data: &[u8], copied: &AtomicU64) {
    let dests = sh.fetches.dests.get(&id).map_or(&[][..], Vec::as_slice);
    each_dest(sh, dests, |d| {
        write_one(sh, dirs, d, data)?;
        copied.fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    });
}

/// The chunks (`(file, id, length)`) missed in source files whose size changed: each such file
/// is cut with the repository's chunker once (an insertion shifts the chunks after it, and
/// content-defined boundaries find them again), and every missed chunk found in any of them is
/// read again, verified and written; the rest go to `fetch`.
fn recut(ctx: &Ctx<'_>, found: &Found, sh: &Shared<'_>, shifted: Vec<(usize, BlobId, u32)>, fetch: &Fetch<'_>) {
    let wanted: IdMap<BlobId, u32> = shifted.iter().map(|&(_, id, len)| (id, len)).collect();
    let mut files: Vec<usize> = shifted.iter().map(|&(f, _, _)| f).collect();
    files.sort_unstable();
    files.dedup();
    let done: Mutex<IdSet<BlobId>> = Mutex::default();
    let init = || (ParentDirs::new(sh.target), Lookups::new(ctx), Vec::new());
    in_parallel_with(&files, ctx.threads, init, |(dirs, at, buf), _, &f| {
        if sh.cancelled() || ctx.cancelled() {
            return;
        }
        let Some((file, size)) = at.local(&found.files, f) else { return };
        let mut hits = Vec::new();
        if super::scan::cut(ctx, file, size, &wanted, &mut hits).is_err() {
            return;
        }
        let copied = &sh.copied[found.files[f].origin as usize];
        for (id, offset) in hits {
            if !done.lock().expect("recut lock").insert(id) {
                continue;
            }
            // Read again and verified: the file may have changed since the cut.
            if matches!(read_verified(ctx, file, offset, id, wanted[&id], buf), Ok(true)) {
                write_all(sh, dirs, id, buf, copied);
            } else {
                done.lock().expect("recut lock").remove(&id);
            }
        }
    });
    let done = done.into_inner().expect("recut lock");
    let rest: Vec<(BlobId, u32)> = wanted.into_iter().filter(|(id, _)| !done.contains(id)).collect();
    if !rest.is_empty() {
        fetch(&rest);
    }
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
pub(super) fn stage(ctx: &Ctx<'_>, found: &Found) -> Option<Found> {
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
        size: None,
        checked: false,
    });
    let mut buf = Vec::new();
    let mut lookups = Lookups::new(ctx);
    let mut at = 0u64;
    for (id, spot) in moving {
        if ctx.cancelled() {
            break;
        }
        let Some((file, _)) = lookups.local(&found.files, spot.file as usize) else { continue };
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
