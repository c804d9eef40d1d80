//! Create stage: makes every directory, file (at its final size, so zero ranges stay holes),
//! symlink, device node, FIFO and hard link before any content arrives. Nothing is followed:
//! whatever stands in the way of an entry (say a symlink where a directory belongs) is removed
//! and replaced, so no write ever lands outside the target.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use super::plan::{Entry, Plan};
use crate::platform::cstring;
use crate::tree::NodeKind;

/// Makes room for a new entry at `path`: keeps an existing real directory when a directory is
/// wanted, removes anything else.
fn clear_slot(path: &Path, want_dir: bool) -> io::Result<bool> {
    match fs::symlink_metadata(path) {
        Ok(md) if md.is_dir() => {
            if want_dir {
                return Ok(true);
            }
            fs::remove_dir_all(path)?;
        }
        Ok(_) => fs::remove_file(path)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    Ok(false)
}

/// Creates one entry; `target` is the restore target.
pub fn create_entry(target: &Path, plan: &Plan, entry: &Entry, is_root: bool) -> io::Result<()> {
    let path = target.join(&entry.rel);
    let node = &entry.node;
    if clear_slot(&path, node.kind == NodeKind::Dir)? {
        return Ok(());
    }
    if let Some(first) = entry.link_of {
        return fs::hard_link(target.join(&plan.entries[first].rel), &path);
    }
    match node.kind {
        NodeKind::Dir => fs::create_dir(&path),
        NodeKind::File => {
            let f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)?;
            f.set_len(node.size)
        }
        NodeKind::Symlink => {
            std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&node.target), &path)
        }
        NodeKind::Fifo => mknod(&path, libc::S_IFIFO | node.mode, 0),
        NodeKind::CharDevice | NodeKind::BlockDevice if is_root => {
            let kind = if node.kind == NodeKind::CharDevice {
                libc::S_IFCHR
            } else {
                libc::S_IFBLK
            };
            mknod(&path, kind | node.mode, node.rdev)
        }
        NodeKind::CharDevice | NodeKind::BlockDevice => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "device nodes can only be restored as root",
        )),
    }
}

fn mknod(path: &Path, mode: u32, rdev: u64) -> io::Result<()> {
    let c = cstring(path)?;
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    if unsafe { libc::mknod(c.as_ptr(), mode as libc::mode_t, rdev as libc::dev_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the entry at `path` is a regular file (not a symlink to one).
pub fn is_regular_file(path: &Path) -> bool {
    fs::symlink_metadata(path)
        .map(|m| m.file_type().is_file() && !m.file_type().is_fifo())
        .unwrap_or(false)
}
