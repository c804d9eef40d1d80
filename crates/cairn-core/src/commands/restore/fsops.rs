//! File-system calls that more than one stage makes: removing what is in the way, sizing a new
//! file (holes, reserved ranges), fixing an existing one in place, hard links, and telling
//! errors that stop the whole restore from those that fail one entry.

use std::fs;
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use super::options::{Sparse, RESERVE_MIN};
use crate::engine::platform;
use cairn_format::tree::{Chunk, Node};

/// Errors that no other entry will escape either: the restore stops.
pub fn is_fatal(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EROFS) | Some(libc::EDQUOT))
}

/// Whether `target` is missing or an empty directory.
pub fn target_is_empty(target: &Path) -> bool {
    match std::fs::read_dir(target) {
        Ok(mut rd) => rd.next().is_none(),
        Err(_) => true,
    }
}

/// Removes whatever is at `path` (a directory with everything in it).
pub fn remove_any(path: &Path) -> io::Result<()> {
    match platform::lstat(path) {
        Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => platform::remove_dir_all(path),
        Ok(_) => platform::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Makes a hard link at `path` to `first`, replacing what is there unless it already is one.
pub fn hard_link(first: &Path, path: &Path) -> io::Result<()> {
    if let (Ok(a), Ok(b)) = (platform::lstat(first), platform::lstat(path)) {
        if a.st_ino == b.st_ino && a.st_dev == b.st_dev {
            return Ok(());
        }
    }
    remove_any(path)?;
    platform::hard_link(first, path)
}

/// The permission bits a file restored with `mode` is created with: its own, plus owner read
/// and write so the restore can fill it (the finish stage sets the exact mode).
pub fn new_file_mode(mode: u32) -> u32 {
    (mode & 0o777) | 0o600
}

/// Gives an existing file the node's size and turns `zero_fix` ranges into holes.
pub fn fix_in_place(
    f: &fs::File,
    node: &Node,
    zero_fix: &[(u64, u64)],
    resize: bool,
    guard: Option<&dyn super::options::WriteGuard>,
) -> io::Result<()> {
    if resize {
        f.set_len(node.size)?;
    }
    for &(off, len) in zero_fix {
        match guard {
            Some(g) => g.zero(f, off, len)?,
            None => punch_hole(f, off, len)?,
        }
    }
    Ok(())
}

/// Gives a new file its final size: zero ranges stay holes, except with `--sparse never`
/// (everything allocated) or `--preallocate` (data ranges reserved).
pub fn size_new_file(f: &fs::File, node: &Node, sparse: Sparse) -> io::Result<()> {
    let reserve = match sparse {
        Sparse::Preallocate => true,
        Sparse::ReserveLarge => node.size >= RESERVE_MIN,
        _ => false,
    };
    // Writes extend the file themselves; only trailing zeros need the size set.
    let extended_by_writes = matches!(sparse, Sparse::Auto | Sparse::ReserveLarge) && !reserve;
    if !extended_by_writes || !matches!(node.content.last(), Some(Chunk::Data { .. })) {
        f.set_len(node.size)?;
    }
    if sparse == Sparse::Never && node.size > 0 {
        fallocate(f, 0, node.size)
    } else if reserve {
        match reserve_data_runs(f, node) {
            // Reserving by default is only a speed-up: where the file system will not, the
            // writes allocate as they go. Out of space is out of space either way.
            Err(e) if sparse == Sparse::ReserveLarge && !is_fatal(&e) => Ok(()),
            other => other,
        }
    } else {
        Ok(())
    }
}

/// Reserves the node's data ranges: one call per run of adjacent data chunks, so the file
/// stays in few extents.
fn reserve_data_runs(f: &fs::File, node: &Node) -> io::Result<()> {
    let mut off = 0u64;
    let mut run: Option<(u64, u64)> = None;
    for c in &node.content {
        match (c, run.as_mut()) {
            (Chunk::Data { .. }, Some((_, len))) => *len += c.len(),
            (Chunk::Data { .. }, None) => run = Some((off, c.len())),
            (Chunk::Zero { .. }, _) => {
                if let Some((start, len)) = run.take() {
                    fallocate(f, start, len)?;
                }
            }
        }
        off += c.len();
    }
    if let Some((start, len)) = run {
        fallocate(f, start, len)?;
    }
    Ok(())
}

fn fallocate(f: &fs::File, off: u64, len: u64) -> io::Result<()> {
    // SAFETY: fallocate on a descriptor we own; mode 0 allocates without changing the size
    // (the file was already sized).
    if unsafe { libc::fallocate(f.as_raw_fd(), 0, off as i64, len as i64) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
            return Err(e);
        }
    }
    Ok(())
}

fn punch_hole(f: &fs::File, off: u64, len: u64) -> io::Result<()> {
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: as above.
    if unsafe { libc::fallocate(f.as_raw_fd(), mode, off as i64, len as i64) } == 0 {
        return Ok(());
    }
    // No hole punching here: write zeros instead.
    let zeros = vec![0u8; len.min(1 << 20) as usize];
    let mut at = off;
    while at < off + len {
        let n = (off + len - at).min(zeros.len() as u64) as usize;
        std::os::unix::fs::FileExt::write_all_at(f, &zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;
    use cairn_format::id::BlobId;
    use cairn_format::tree::NodeKind;

    /// A 4 MiB file: 1 MiB of data, a 2 MiB hole, 1 MiB of data.
    fn image() -> Node {
        let mut node = Node::new(b"img".to_vec(), NodeKind::File);
        let data = Chunk::Data { id: BlobId([1; 32]), len: 1 << 20 };
        node.content = vec![data, Chunk::Zero { len: 2 << 20 }, data];
        node.size = 4 << 20;
        node
    }

    fn allocated_after_sizing(sparse: Sparse, node: &Node) -> (u64, u64) {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = fs::File::create(dir.path().join("f")).expect("create");
        size_new_file(&f, node, sparse).expect("size");
        let md = f.metadata().expect("stat");
        (md.len(), md.blocks() * 512)
    }

    #[test]
    fn large_files_have_their_data_ranges_reserved_before_any_write() {
        let node = image();
        let (len, reserved) = allocated_after_sizing(Sparse::ReserveLarge, &node);
        assert_eq!(len, node.size);
        // Both data MiBs, not the hole (a little slack for file system metadata).
        assert!((2 << 20..=(2 << 20) + (64 << 10)).contains(&reserved), "{reserved} bytes reserved");
        // Plain auto: nothing allocated until written; the writes set the size.
        assert_eq!(allocated_after_sizing(Sparse::Auto, &node), (0, 0));
        // A file below the threshold is left to its writes as well.
        let mut small = Node::new(b"small".to_vec(), NodeKind::File);
        small.content = vec![Chunk::Data { id: BlobId([2; 32]), len: 4096 }];
        small.size = 4096;
        assert_eq!(allocated_after_sizing(Sparse::ReserveLarge, &small), (0, 0));
    }
}
