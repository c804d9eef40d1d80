//! Create stage: makes directories, symlinks, device nodes and FIFOs, clears whatever stands in
//! the way of an entry, and prepares files fixed in place. New files with data are created by
//! the write stage when their first chunk arrives. Nothing is ever followed: a symlink where a
//! directory belongs is removed and replaced, so no write lands outside the target.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use super::compare::FileState;
use super::plan::{Entry, Plan};
use super::{is_fatal, Sparse};
use crate::error::Error;
use crate::platform::cstring;
use crate::tree::{Chunk, Node, NodeKind};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Removes whatever is at `path` (a directory with everything in it).
pub fn remove_any(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(md) if md.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether the existing entry at `path` already is what `node` describes (metadata aside).
fn already_there(path: &Path, node: &Node) -> io::Result<bool> {
    let md = match fs::symlink_metadata(path) {
        Ok(md) => md,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let ft = md.file_type();
    Ok(match node.kind {
        NodeKind::Dir => ft.is_dir(),
        NodeKind::Symlink => ft.is_symlink() && fs::read_link(path)?.as_os_str().as_bytes() == node.target,
        NodeKind::Fifo => ft.is_fifo(),
        NodeKind::CharDevice => ft.is_char_device() && md.rdev() == node.rdev,
        NodeKind::BlockDevice => ft.is_block_device() && md.rdev() == node.rdev,
        NodeKind::File => false,
    })
}

/// The directories [`directories`] made or could not make.
#[derive(Debug, Default)]
pub struct Directories {
    /// Directories that could not be made: `(entry, why)`.
    pub failed: Vec<(usize, String)>,
    /// Directories (relative to the target, `""` for the target) with a default ACL.
    pub acl: HashSet<PathBuf>,
}

/// Makes the plan's directories, parents before children, in `target` (which exists). Into an
/// `empty` target a directory is simply made (one call instead of four); otherwise, or if
/// something is in the way, the entry is examined and replaced. A disk full or read-only
/// target stops it with an error, and so does `cancel`; `done` counts the directories made.
pub fn directories(
    target: &Path,
    plan: &Plan,
    empty: bool,
    is_root: bool,
    done: &AtomicU64,
    cancel: &AtomicBool,
) -> Result<Directories, Error> {
    let mut out = Directories::default();
    if has_default_acl(target) {
        out.acl.insert(PathBuf::new());
    }
    for (i, entry) in plan.entries.iter().enumerate() {
        if entry.node.kind != NodeKind::Dir {
            continue;
        }
        if cancel.load(Ordering::Relaxed) {
            return Err(Error::Interrupted);
        }
        done.fetch_add(1, Ordering::Relaxed);
        let path = target.join(&entry.rel);
        let made = if empty { fs::create_dir(&path) } else { Err(io::ErrorKind::AlreadyExists.into()) };
        let made = match made {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                prepare(&path, entry, &FileState::NotFile, false, Sparse::Auto, is_root)
            }
            other => other,
        };
        // A directory this restore made has a default ACL only by inheriting its parent's.
        let parent = entry.rel.parent().unwrap_or(Path::new(""));
        let may_have_acl = !empty || out.acl.contains(parent);
        match made {
            Err(e) if is_fatal(&e) => return Err(Error::io(path, "cannot create", e)),
            Err(e) => out.failed.push((i, format!("cannot create: {e}"))),
            Ok(()) if may_have_acl && has_default_acl(&path) => {
                out.acl.insert(entry.rel.clone());
            }
            Ok(()) => {}
        }
    }
    Ok(out)
}

/// Prepares one entry; `has_data` says whether the write stage will write to it.
pub fn prepare(
    path: &Path,
    entry: &Entry,
    state: &FileState,
    has_data: bool,
    sparse: Sparse,
    is_root: bool,
) -> io::Result<()> {
    let node = &entry.node;
    if entry.link_of.is_some() {
        return Ok(()); // hard links are made once their file is complete
    }
    match node.kind {
        NodeKind::File => prepare_file(path, node, state, has_data, sparse),
        _ if already_there(path, node)? => Ok(()),
        NodeKind::Dir => {
            remove_any(path)?;
            fs::create_dir(path)
        }
        NodeKind::Symlink => {
            remove_any(path)?;
            std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&node.target), path)
        }
        NodeKind::Fifo => {
            remove_any(path)?;
            mknod(path, libc::S_IFIFO | node.mode, 0)
        }
        NodeKind::CharDevice | NodeKind::BlockDevice if is_root => {
            remove_any(path)?;
            let kind = if node.kind == NodeKind::CharDevice { libc::S_IFCHR } else { libc::S_IFBLK };
            mknod(path, kind | node.mode, node.rdev)
        }
        NodeKind::CharDevice | NodeKind::BlockDevice => {
            Err(io::Error::new(io::ErrorKind::PermissionDenied, "device nodes can only be restored as root"))
        }
    }
}

fn prepare_file(path: &Path, node: &Node, state: &FileState, has_data: bool, sparse: Sparse) -> io::Result<()> {
    match state {
        FileState::Create { clear } => {
            if *clear {
                remove_any(path)?;
            }
            if !has_data {
                let f = create_file(path, node.mode)?;
                size_new_file(&f, node, sparse)?;
            }
            Ok(())
        }
        FileState::InPlace { zero_fix, resize, .. } => {
            let f = OpenOptions::new().write(true).custom_flags(libc::O_NOFOLLOW).open(path)?;
            fix_in_place(&f, node, zero_fix, *resize)
        }
        _ => Ok(()),
    }
}

/// Gives an existing file the node's size and turns `zero_fix` ranges into holes.
pub fn fix_in_place(f: &fs::File, node: &Node, zero_fix: &[(u64, u64)], resize: bool) -> io::Result<()> {
    if resize {
        f.set_len(node.size)?;
    }
    for &(off, len) in zero_fix {
        punch_hole(f, off, len)?;
    }
    Ok(())
}

/// The permission bits a file restored with `mode` is created with: its own, plus owner read
/// and write so the restore can fill it (the finish stage sets the exact mode).
pub fn new_file_mode(mode: u32) -> u32 {
    (mode & 0o777) | 0o600
}

/// Opens (creating if needed) a file for writing, never through a symlink.
pub fn create_file(path: &Path, mode: u32) -> io::Result<fs::File> {
    OpenOptions::new().write(true).create(true).mode(new_file_mode(mode)).custom_flags(libc::O_NOFOLLOW).open(path)
}

/// Gives a new file its final size: zero ranges stay holes, except with `--sparse never`
/// (everything allocated) or `--preallocate` (data ranges reserved).
pub fn size_new_file(f: &fs::File, node: &Node, sparse: Sparse) -> io::Result<()> {
    let reserve = match sparse {
        Sparse::Preallocate => true,
        Sparse::ReserveLarge => node.size >= super::RESERVE_MIN,
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
            Err(e) if sparse == Sparse::ReserveLarge && !super::is_fatal(&e) => Ok(()),
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

fn mknod(path: &Path, mode: u32, rdev: u64) -> io::Result<()> {
    let c = cstring(path)?;
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    if unsafe { libc::mknod(c.as_ptr(), mode as libc::mode_t, rdev as libc::dev_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the directory at `path` has a default ACL (new files in it inherit an access ACL
/// and a mode masked by it, so their metadata must be set in full).
pub fn has_default_acl(path: &Path) -> bool {
    matches!(xattr::get(path, "system.posix_acl_default"), Ok(Some(_)))
}

/// Makes a hard link at `path` to `first`, replacing what is there unless it already is one.
pub fn hard_link(first: &Path, path: &Path) -> io::Result<()> {
    if let (Ok(a), Ok(b)) = (fs::symlink_metadata(first), fs::symlink_metadata(path)) {
        if a.ino() == b.ino() && a.dev() == b.dev() {
            return Ok(());
        }
    }
    remove_any(path)?;
    fs::hard_link(first, path)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;
    use crate::id::BlobId;

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
