//! Copy pass, beside the fetches: for each local file the scan found chunks in, each chunk is
//! read, hashed with the chunk-ID key and compared with its ID, and only then written to every
//! place it goes by the write stage's own `write_one` — so a file is prepared by its first
//! write and finished by its last, whether that is a copy or a fetched blob. The bytes written
//! are the bytes hashed: a local file changed since the scan is caught here, and its chunk is
//! fetched instead, by a read planned once the pass is over and fed to the fetch stage after
//! the planned ones (`Shared::reads`).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
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
use cairn_format::id::BlobId;

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

/// A chunk to copy: its offset in its local file, its ID and its length.
type Piece = (u64, BlobId, u32);

/// Most chunks of one local file a copy thread takes at a time.
const PIECE: usize = 64;

/// A copy worker's state: its open target directories, its lookups of local files and a
/// chunk buffer.
struct Worker<'t> {
    dirs: ParentDirs<'t>,
    at: Lookups<'t>,
    buf: Vec<u8>,
}

/// Copies every chunk `found` to its places in `sh`'s plan (the blobs' destinations of
/// `sh.fetches`), local file by local file, on `ctx.threads` threads, once the directories are
/// made. Returns the chunks (with their lengths) that could not be read or did not verify:
/// they must be fetched. A write that fails fails its file, or stops the restore, as in the
/// write stage. Also returns how long the copy took once the directories were made.
pub(super) fn copy(ctx: &Ctx<'_>, found: &Found, sh: &Shared<'_>) -> (Vec<(BlobId, u32)>, Duration) {
    // Each local file's chunks in the order they lie in it, in pieces of at most PIECE chunks:
    // a large file (a disk image) is copied by every thread, not by one.
    let mut by_file: Vec<Vec<Piece>> = vec![Vec::new(); found.files.len()];
    for (id, spot) in &found.spots {
        by_file[spot.file as usize].push((spot.offset, *id, spot.len));
    }
    let mut pieces: Vec<(usize, &[Piece])> = Vec::new();
    for (f, spots) in by_file.iter_mut().enumerate() {
        spots.sort_unstable_by_key(|s| s.0);
        pieces.extend(spots.chunks(PIECE).map(|p| (f, p)));
    }
    let failed = Mutex::new(Vec::new());
    sh.dirs_ready.wait();
    if let Some(cmd) = ctx.hook {
        let _ = std::process::Command::new("sh").arg("-c").arg(cmd).status();
    }
    let began = Instant::now();
    let init = || Worker { dirs: ParentDirs::new(sh.target), at: Lookups::new(ctx), buf: Vec::new() };
    in_parallel_with(&pieces, ctx.threads, init, |w, _, &(f, spots)| {
        if sh.cancelled() || ctx.cancelled() {
            return;
        }
        let local = &found.files[f];
        let copied = &sh.copied[local.origin as usize];
        let Worker { dirs, at, buf } = w;
        let file = at.local(&found.files, f);
        for &(offset, id, len) in spots {
            if sh.cancelled() {
                return;
            }
            // Unreadable, or no longer what the scan saw: fetched instead.
            let verified = file.is_some_and(|f| matches!(read_verified(ctx, f, offset, id, len, buf), Ok(true)));
            if !verified {
                failed.lock().expect("failed lock").push((id, len));
                continue;
            }
            let dests = sh.fetches.dests.get(&id).map_or(&[][..], Vec::as_slice);
            each_dest(sh, dests, |d| {
                write_one(sh, dirs, d, buf)?;
                copied.fetch_add(u64::from(len), Ordering::Relaxed);
                Ok(())
            });
        }
    });
    (failed.into_inner().expect("failed lock"), began.elapsed())
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
    });
    let mut buf = Vec::new();
    let mut lookups = Lookups::new(ctx);
    let mut at = 0u64;
    for (id, spot) in moving {
        if ctx.cancelled() {
            break;
        }
        let Some(file) = lookups.local(&found.files, spot.file as usize) else { continue };
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
