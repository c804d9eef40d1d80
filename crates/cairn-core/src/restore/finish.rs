//! Finish stage: metadata after content — extended attributes, ownership (as root), mode,
//! ACLs, then times; children before their directory, so directory times stay as recorded.

use std::io;
use std::path::Path;

use crate::platform::{cstring, write_xattrs};
use crate::tree::{Node, NodeKind, Timestamp};

/// Applies `node`'s metadata to `path` (which is never followed if it is a symlink).
pub fn apply_metadata(path: &Path, node: &Node, is_root: bool) -> io::Result<()> {
    let c = cstring(path)?;
    if node.kind != NodeKind::Symlink || is_root {
        write_xattrs(path, node).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot set extended attributes: {e}"))
        })?;
    }
    if is_root {
        // SAFETY: `c` is a valid path for the duration of the call.
        if unsafe { libc::lchown(c.as_ptr(), node.uid, node.gid) } != 0 {
            return Err(annotate("cannot change owner", io::Error::last_os_error()));
        }
    }
    if node.kind != NodeKind::Symlink {
        // SAFETY: as above.
        if unsafe { libc::chmod(c.as_ptr(), node.mode as libc::mode_t) } != 0 {
            return Err(annotate("cannot change mode", io::Error::last_os_error()));
        }
        // Access ACLs are written after the mode: chmod would otherwise rewrite their mask.
        if node.acl_access.is_some() {
            write_xattrs(
                path,
                &Node {
                    xattrs: Vec::new(),
                    acl_default: None,
                    ..node.clone()
                },
            )
            .map_err(|e| annotate("cannot set ACL", e))?;
        }
    }
    set_times(&c, node.atime, node.mtime).map_err(|e| annotate("cannot set times", e))
}

fn annotate(what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn set_times(c: &std::ffi::CStr, atime: Timestamp, mtime: Timestamp) -> io::Result<()> {
    let ts = |t: Timestamp| libc::timespec {
        tv_sec: t.secs as libc::time_t,
        tv_nsec: t.nanos as libc::c_long,
    };
    let times = [ts(atime), ts(mtime)];
    // SAFETY: `c` and `times` are valid for the duration of the call.
    if unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
