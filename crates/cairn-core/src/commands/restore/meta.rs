//! Metadata, applied and compared: extended attributes, ownership (as root), mode, ACLs, then
//! times, through an open file (the write stage, as a file's last chunk lands) or a path never
//! followed (the finish stage). Metadata that already matches is left alone; the compare stage
//! asks whether it matches so a no-op restore need not look at a file again.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use super::dirs::Status;
use crate::engine::platform::{cstring, At};
use cairn_format::tree::{Node, NodeKind, Timestamp};

const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

/// Something metadata can be applied to: an open file or a path (never followed).
trait Target {
    fn chown(&self, uid: u32, gid: u32) -> io::Result<()>;
    fn chmod(&self, mode: u32) -> io::Result<()>;
    fn set_times(&self, times: &[libc::timespec; 2]) -> io::Result<()>;
    fn list_xattrs(&self) -> io::Result<Vec<OsString>>;
    fn get_xattr(&self, name: &OsStr) -> io::Result<Option<Vec<u8>>>;
    fn set_xattr(&self, name: &OsStr, value: &[u8]) -> io::Result<()>;
    fn remove_xattr(&self, name: &OsStr) -> io::Result<()>;
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Target for File {
    fn chown(&self, uid: u32, gid: u32) -> io::Result<()> {
        // SAFETY: fchown on a descriptor we own.
        check(unsafe { libc::fchown(self.as_raw_fd(), uid, gid) })
    }
    fn chmod(&self, mode: u32) -> io::Result<()> {
        // SAFETY: as above.
        check(unsafe { libc::fchmod(self.as_raw_fd(), mode as libc::mode_t) })
    }
    fn set_times(&self, times: &[libc::timespec; 2]) -> io::Result<()> {
        // SAFETY: `times` points at two valid timespecs.
        check(unsafe { libc::futimens(self.as_raw_fd(), times.as_ptr()) })
    }
    fn list_xattrs(&self) -> io::Result<Vec<OsString>> {
        // Most files have no extended attributes or a few short ones: one call into a buffer on
        // the stack (a no-op restore asks for every file); a longer list is read as usual.
        let mut small = [0u8; 512];
        match rustix::fs::flistxattr(self, &mut small[..]) {
            Ok(n) => Ok(small[..n]
                .split(|&b| b == 0)
                .filter(|name| !name.is_empty())
                .map(OsStr::from_bytes)
                .map(OsStr::to_os_string)
                .collect()),
            Err(rustix::io::Errno::RANGE) => Ok(xattr::FileExt::list_xattr(self)?.collect()),
            Err(e) => Err(e.into()),
        }
    }
    fn get_xattr(&self, name: &OsStr) -> io::Result<Option<Vec<u8>>> {
        xattr::FileExt::get_xattr(self, name)
    }
    fn set_xattr(&self, name: &OsStr, value: &[u8]) -> io::Result<()> {
        xattr::FileExt::set_xattr(self, name, value)
    }
    fn remove_xattr(&self, name: &OsStr) -> io::Result<()> {
        xattr::FileExt::remove_xattr(self, name)
    }
}

/// An entry named by a path of any length: its directory and name ([`At`]) for the `*at`
/// calls, and a path the kernel accepts for the extended-attribute calls, which have none.
struct PathTarget {
    at: At,
    c: CString,
    xattr_path: PathBuf,
}

impl PathTarget {
    fn new(path: &Path) -> io::Result<Self> {
        let at = At::new(path)?;
        let c = cstring(at.name())?;
        let xattr_path = at.path().into_owned();
        Ok(PathTarget { at, c, xattr_path })
    }
}

impl Target for PathTarget {
    fn chown(&self, uid: u32, gid: u32) -> io::Result<()> {
        // SAFETY: a valid descriptor (or AT_FDCWD) and a NUL-terminated name for the call;
        // AT_SYMLINK_NOFOLLOW changes a symlink's own owner.
        check(unsafe {
            libc::fchownat(self.at.dir().as_raw_fd(), self.c.as_ptr(), uid, gid, libc::AT_SYMLINK_NOFOLLOW)
        })
    }
    fn chmod(&self, mode: u32) -> io::Result<()> {
        // SAFETY: as above.
        check(unsafe { libc::fchmodat(self.at.dir().as_raw_fd(), self.c.as_ptr(), mode as libc::mode_t, 0) })
    }
    fn set_times(&self, times: &[libc::timespec; 2]) -> io::Result<()> {
        // SAFETY: as above; AT_SYMLINK_NOFOLLOW sets a symlink's own times.
        check(unsafe {
            libc::utimensat(self.at.dir().as_raw_fd(), self.c.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW)
        })
    }
    fn list_xattrs(&self) -> io::Result<Vec<OsString>> {
        Ok(xattr::list(&self.xattr_path)?.collect())
    }
    fn get_xattr(&self, name: &OsStr) -> io::Result<Option<Vec<u8>>> {
        xattr::get(&self.xattr_path, name)
    }
    fn set_xattr(&self, name: &OsStr, value: &[u8]) -> io::Result<()> {
        xattr::set(&self.xattr_path, name, value)
    }
    fn remove_xattr(&self, name: &OsStr) -> io::Result<()> {
        xattr::remove(&self.xattr_path, name)
    }
}

fn annotate(what: &str) -> impl Fn(io::Error) -> io::Error + '_ {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn timespecs(atime: Timestamp, mtime: Timestamp) -> [libc::timespec; 2] {
    let ts = |t: Timestamp| libc::timespec { tv_sec: t.secs as libc::time_t, tv_nsec: t.nanos as libc::c_long };
    [ts(atime), ts(mtime)]
}

/// Whether xattrs are supported here at all (ENOTSUP means "none", not an error).
fn unsupported(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOTSUP)
}

/// Makes the target's xattrs (except the access ACL) equal the node's.
fn sync_xattrs(t: &impl Target, node: &Node) -> io::Result<()> {
    let wanted = |name: &[u8]| {
        node.xattrs.iter().any(|x| x.name == name)
            || (name == ACL_ACCESS && node.acl_access.is_some())
            || (name == ACL_DEFAULT && node.acl_default.is_some())
    };
    let existing = match t.list_xattrs() {
        Ok(v) => v,
        Err(e) if unsupported(&e) && node.xattrs.is_empty() => return Ok(()),
        Err(e) => return Err(e),
    };
    for name in existing {
        if !wanted(name.as_bytes()) {
            t.remove_xattr(&name)?;
        }
    }
    for x in &node.xattrs {
        t.set_xattr(OsStr::from_bytes(&x.name), &x.value)?;
    }
    if let Some(acl) = &node.acl_default {
        t.set_xattr(OsStr::from_bytes(ACL_DEFAULT), acl)?;
    }
    Ok(())
}

/// How a file this restore just created was made: with the node's permission bits less
/// `umask`, without extended attributes, and (as root) owned by `owner` if it is known.
#[derive(Clone, Copy)]
pub struct Created {
    pub umask: u32,
    pub owner: Option<(u32, u32)>,
}

fn apply(t: &impl Target, node: &Node, is_root: bool, created: Option<Created>) -> io::Result<()> {
    let symlink = node.kind == NodeKind::Symlink;
    let xattr_err = annotate("cannot set extended attributes");
    match created {
        // A new file has no xattrs: only set the ones the node has.
        Some(_) => {
            for x in &node.xattrs {
                t.set_xattr(OsStr::from_bytes(&x.name), &x.value).map_err(&xattr_err)?;
            }
        }
        None if !symlink || is_root => sync_xattrs(t, node).map_err(&xattr_err)?,
        None => {}
    }
    // A file this restore created usually has the right owner already (root restoring root's
    // files): a stat is much cheaper than a chown, which dirties the inode in the journal.
    if is_root && created.and_then(|c| c.owner) != Some((node.uid, node.gid)) {
        t.chown(node.uid, node.gid).map_err(annotate("cannot change owner"))?;
    }
    // Creation already set the permission bits unless the umask took some away; setuid,
    // setgid and sticky bits are always set here, after chown (which would clear them).
    let mode_ok = created.is_some_and(|c| node.mode & 0o7600 == 0o600 && node.mode & c.umask == 0);
    if !symlink && !mode_ok {
        t.chmod(node.mode).map_err(annotate("cannot change mode"))?;
    }
    if !symlink {
        // The access ACL goes after the mode: chmod would rewrite its mask.
        if let Some(acl) = &node.acl_access {
            t.set_xattr(OsStr::from_bytes(ACL_ACCESS), acl).map_err(annotate("cannot set ACL"))?;
        }
    }
    t.set_times(&timespecs(node.atime, node.mtime)).map_err(annotate("cannot set times"))
}

/// Applies `node`'s metadata through an open file (the write stage, after the last chunk);
/// `created` when this restore created the file.
pub fn apply_to_file(file: &File, node: &Node, is_root: bool, created: Option<Created>) -> io::Result<()> {
    apply(file, node, is_root, created)
}

/// Applies `node`'s metadata to `path` (never followed), unless it already matches.
pub fn apply_to_path(path: &Path, node: &Node, is_root: bool) -> io::Result<()> {
    let t = PathTarget::new(path)?;
    let st = rustix::fs::statat(t.at.dir(), t.at.name(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)?;
    if matches(&t, &Status::from(&st), node, is_root)? {
        return Ok(());
    }
    apply(&t, node, is_root, None)
}

/// Whether the open file `file`, whose status is `st`, already carries exactly the node's
/// metadata (the compare stage asks, so a no-op restore need not look at the file again).
pub fn file_matches(file: &File, st: &Status, node: &Node, is_root: bool) -> bool {
    matches(file, st, node, is_root).unwrap_or(false)
}

/// [`file_matches`] for an entry at `path` (never followed).
pub fn path_matches(path: &Path, st: &Status, node: &Node, is_root: bool) -> bool {
    let Ok(t) = PathTarget::new(path) else { return false };
    matches(&t, st, node, is_root).unwrap_or(false)
}

/// Whether the entry whose status is `st` already carries exactly the node's metadata.
fn matches(t: &impl Target, st: &Status, node: &Node, is_root: bool) -> io::Result<bool> {
    let same = (node.kind == NodeKind::Symlink || st.mode & 0o7777 == node.mode)
        && (!is_root || (st.uid == node.uid && st.gid == node.gid))
        && st.mtime == node.mtime
        && st.atime == node.atime;
    if !same {
        return Ok(false);
    }
    let names = match t.list_xattrs() {
        Ok(n) => n,
        Err(e) if unsupported(&e) => Vec::new(),
        Err(e) => return Err(e),
    };
    let want = node.xattrs.len() + usize::from(node.acl_access.is_some()) + usize::from(node.acl_default.is_some());
    if names.len() != want {
        return Ok(false);
    }
    for x in &node.xattrs {
        if t.get_xattr(OsStr::from_bytes(&x.name))?.as_deref() != Some(&x.value[..]) {
            return Ok(false);
        }
    }
    for (name, value) in [(ACL_ACCESS, &node.acl_access), (ACL_DEFAULT, &node.acl_default)] {
        if let Some(v) = value {
            if t.get_xattr(OsStr::from_bytes(name))?.as_deref() != Some(&v[..]) {
                return Ok(false);
            }
        }
    }
    Ok(true)
}
