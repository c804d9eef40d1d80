//! Compare stage: compares what is already in the target with the snapshot, so a restore into
//! a half-damaged target rewrites only what differs (restic's `--overwrite` semantics).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::dirs::ParentDirs;
use super::meta::{file_matches, path_matches};
use super::options::Overwrite;
use super::types::{Entry, FileState, NeededChunk, Plan};
use crate::engine::chunker::is_zero;
use crate::engine::parallel::map_parallel_with;
use crate::engine::platform::{data_regions, open_noatime};
use cairn_format::crypto::MasterKey;
use cairn_format::id::BlobId;
use cairn_format::tree::chunk_offsets;
use cairn_format::tree::{Chunk, Node, NodeKind};

/// Compares every file entry with the target, on `threads` threads. Besides each file's
/// state, says which complete files already carry their metadata (nothing left to do).
///
/// A thread takes [`BLOCK`] consecutive entries at a time: they mostly share a directory (kept
/// open, [`ParentDirs`]), and the threads meet once per block, not once per file.
pub fn compare(
    target: &Path,
    plan: &Plan,
    key: &MasterKey,
    mode: Overwrite,
    threads: usize,
    is_root: bool,
) -> (Vec<FileState>, Vec<bool>) {
    let blocks: Vec<&[Entry]> = plan.entries.chunks(BLOCK).collect();
    let init = || Here { dirs: ParentDirs::new(target), buf: Vec::new() };
    let compared = map_parallel_with(&blocks, threads, init, |here, block| {
        block
            .iter()
            .map(|entry| {
                if entry.node.kind != NodeKind::File || entry.link_of.is_some() {
                    return (FileState::NotFile, false);
                }
                compare_file(here, target, &entry.rel, &entry.node, key, mode, is_root)
            })
            .collect::<Vec<_>>()
    });
    compared.into_iter().flatten().unzip()
}

/// Entries a compare thread takes at a time.
const BLOCK: usize = 64;

/// The states for an empty target, where there is nothing to compare: every file is created,
/// and none carries its metadata yet.
pub fn fresh(plan: &Plan) -> (Vec<FileState>, Vec<bool>) {
    let states = plan
        .entries
        .iter()
        .map(|e| {
            if e.node.kind == NodeKind::File && e.link_of.is_none() {
                FileState::Create { clear: false }
            } else {
                FileState::NotFile
            }
        })
        .collect();
    (states, vec![false; plan.entries.len()])
}

/// A compare worker's open directory and read buffer, reused from file to file.
struct Here<'t> {
    dirs: ParentDirs<'t>,
    buf: Vec<u8>,
}

/// The state of the file at `rel` (below `target`), and for a complete one whether its
/// metadata matches too.
fn compare_file(
    here: &mut Here<'_>,
    target: &Path,
    rel: &Path,
    node: &Node,
    key: &MasterKey,
    mode: Overwrite,
    is_root: bool,
) -> (FileState, bool) {
    if mode == Overwrite::Always {
        return compare_content(here, rel, node, key, is_root);
    }
    let Ok(st) = here.dirs.status(rel) else {
        return (FileState::Create { clear: false }, false);
    };
    // Not a plain file, or a file with other names (possibly outside the target): replace it,
    // never write through it.
    if !st.is_file() || st.nlink > 1 {
        return (FileState::Create { clear: true }, false);
    }
    let keep = match mode {
        Overwrite::Never => return (FileState::Skip, false),
        Overwrite::IfNewer if st.mtime >= node.mtime => return (FileState::Skip, false),
        Overwrite::IfChanged => st.size == node.size && st.mtime == node.mtime,
        Overwrite::IfNewer | Overwrite::Always => false,
    };
    if keep {
        return (FileState::Complete, path_matches(&target.join(rel), &st, node, is_root));
    }
    (FileState::Create { clear: true }, false)
}

/// [`compare_file`] for `--overwrite always`: the file is opened first and its status taken
/// from the open descriptor (`fstat`), so its name is looked up once, not twice (a status by
/// name, then an open by name, was a fifth of a no-op restore's CPU time). The open never
/// follows a symlink (ELOOP) and never blocks (a FIFO opens at once with O_NONBLOCK, a socket
/// fails with ENXIO): whatever is not a plain file with one name is replaced, as before.
fn compare_content(here: &mut Here<'_>, rel: &Path, node: &Node, key: &MasterKey, is_root: bool) -> (FileState, bool) {
    let (file, st) = match here.dirs.open_existing(rel) {
        Ok(opened) => opened,
        // Nothing there: created without clearing anything.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return (FileState::Create { clear: false }, false),
        // A symlink, a socket, a file that cannot be read: replaced.
        Err(_) => return (FileState::Create { clear: true }, false),
    };
    if !st.is_file() || st.nlink > 1 {
        return (FileState::Create { clear: true }, false);
    }
    match compare_open(&file, node, key, st.size, &mut here.buf) {
        // The status was taken before reading, which leaves the access time alone (O_NOATIME).
        Ok(FileState::Complete) => (FileState::Complete, file_matches(&file, &st, node, is_root)),
        Ok(state) => (state, false),
        Err(_) => (FileState::Create { clear: true }, false),
    }
}

/// Compares the file at `path` with the node chunk by chunk.
pub fn compare_path(path: &Path, node: &Node, key: &MasterKey) -> io::Result<FileState> {
    let size = crate::engine::platform::lstat(path)?.st_size as u64;
    compare_open(&open_noatime(path)?, node, key, size, &mut Vec::new())
}

/// Compares an open file of `size` bytes with the node chunk by chunk.
fn compare_open(file: &File, node: &Node, key: &MasterKey, size: u64, buf: &mut Vec<u8>) -> io::Result<FileState> {
    let mut needed = Vec::new();
    let mut zero_fix = Vec::new();
    // The ID of a chunk of zeros of the last length asked for: a data chunk over a hole in the
    // target (a sparse file made at its size, as a live restore's) is compared without reading.
    let mut zeros: Option<(u32, BlobId)> = None;
    for (off, chunk) in chunk_offsets(&node.content) {
        match *chunk {
            Chunk::Data { id, len } => {
                if off + u64::from(len) > size {
                    needed.push(NeededChunk { offset: off, id, len });
                    continue;
                }
                let found = if data_regions(file, off, off + u64::from(len)).is_empty() {
                    match zeros {
                        Some((l, z)) if l == len => z,
                        _ => {
                            let z = key.blob_id(&vec![0u8; len as usize]);
                            zeros = Some((len, z));
                            z
                        }
                    }
                } else {
                    chunk_id(file, off, len, key, buf)?
                };
                if found != id {
                    needed.push(NeededChunk { offset: off, id, len });
                }
            }
            Chunk::Zero { len } => {
                let end = (off + len).min(size);
                if off < end && !region_is_zero(file, off, end, buf)? {
                    zero_fix.push((off, end - off));
                }
            }
        }
    }
    let resize = size != node.size;
    if needed.is_empty() && zero_fix.is_empty() && !resize {
        return Ok(FileState::Complete);
    }
    Ok(FileState::InPlace { needed, zero_fix, resize })
}

/// Reads a piece at a time into a buffer that stays in the CPU cache while it is hashed: with
/// whole chunks (up to 8 MiB) the copy from the page cache cost as much as the hashing.
const HASH_PIECE: usize = 128 * 1024;

/// The blob ID of the `len` bytes of `file` at `off`.
pub(super) fn chunk_id(file: &File, off: u64, len: u32, key: &MasterKey, buf: &mut Vec<u8>) -> io::Result<BlobId> {
    let len = len as usize;
    // Grown once and never shrunk: zeroing the buffer for every chunk cost as much as a
    // tenth of the hashing of small files.
    if buf.len() < len.min(HASH_PIECE) {
        buf.resize(len.min(HASH_PIECE), 0);
    }
    if len <= HASH_PIECE {
        file.read_exact_at(&mut buf[..len], off)?;
        return Ok(key.blob_id(&buf[..len]));
    }
    let mut hasher = key.blob_hasher();
    let mut done = 0;
    while done < len {
        let n = (len - done).min(HASH_PIECE);
        file.read_exact_at(&mut buf[..n], off + done as u64)?;
        hasher.update(&buf[..n]);
        done += n;
    }
    Ok(BlobId(*hasher.finalize().as_bytes()))
}

/// Whether `[start, end)` of the file reads as zeros; holes are skipped without reading, and
/// anything [`data_regions`] cannot prove to be a hole is read.
fn region_is_zero(file: &File, start: u64, end: u64, buf: &mut Vec<u8>) -> io::Result<bool> {
    for (data, len) in data_regions(file, start, end) {
        let stop = data + len;
        let mut at = data;
        while at < stop {
            let n = (stop - at).min(1 << 20) as usize;
            buf.resize(n, 0);
            file.read_exact_at(&mut buf[..n], at)?;
            if !is_zero(&buf[..n]) {
                return Ok(false);
            }
            at += n as u64;
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn chunk_ids_read_piece_by_piece_equal_whole_chunk_ids() {
        let key = MasterKey::generate();
        let data: Vec<u8> = (0..3 * HASH_PIECE as u32 + 7).map(|i| (i.wrapping_mul(2654435761) >> 9) as u8).collect();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&data).unwrap();
        let mut buf = Vec::new();
        for (off, len) in
            [(0, 1), (5, HASH_PIECE), (3, HASH_PIECE + 1), (0, data.len()), (HASH_PIECE - 1, 2 * HASH_PIECE)]
        {
            let id = chunk_id(&f, off as u64, len as u32, &key, &mut buf).unwrap();
            assert_eq!(id, key.blob_id(&data[off..off + len]), "{len} bytes at {off}");
        }
        // A chunk running past the end of the file is an error, not a short hash.
        assert!(chunk_id(&f, 1, data.len() as u32, &key, &mut buf).is_err());
    }

    #[test]
    fn zero_check_reads_what_seek_data_cannot_place() {
        // procfs has no SEEK_DATA (EINVAL): its files must be read, not taken as holes.
        let len = std::fs::read("/proc/version").unwrap().len() as u64;
        let file = File::open("/proc/version").unwrap();
        assert!(!region_is_zero(&file, 0, len, &mut Vec::new()).unwrap(), "/proc/version taken as zeros");
        // A real hole, and zeros written as data, are zeros.
        let mut f = tempfile::tempfile().unwrap();
        f.set_len(1 << 20).unwrap();
        f.write_all(&[0; 4096]).unwrap();
        assert!(region_is_zero(&f, 0, 1 << 20, &mut Vec::new()).unwrap());
        f.write_all(&[7]).unwrap();
        assert!(!region_is_zero(&f, 0, 1 << 20, &mut Vec::new()).unwrap());
        assert!(region_is_zero(&f, 4097, 1 << 20, &mut Vec::new()).unwrap());
    }
}
