//! What Cairn needs from the operating system: who and where we are, and reading a file
//! system entry's metadata (the restore side lives in `restore::meta`).

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use crate::tree::{Node, NodeKind, Timestamp, Xattr};

/// This machine's host name.
pub fn hostname() -> String {
    gethostname::gethostname().to_string_lossy().into_owned()
}

/// The current user's name (or numeric ID when it has none).
pub fn username() -> String {
    let uid = uzers::get_current_uid();
    uzers::get_user_by_uid(uid).map(|u| u.name().to_string_lossy().into_owned()).unwrap_or_else(|| uid.to_string())
}

/// The current time.
pub fn now() -> Timestamp {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Timestamp { secs: d.as_secs() as i64, nanos: d.subsec_nanos() }
}

/// The current time in whole seconds since the Unix epoch.
pub fn now_secs() -> u64 {
    now().secs.max(0) as u64
}

/// Parses a byte size: a number with an optional K, M, G or T suffix (binary units).
pub fn parse_size(s: &str) -> crate::Result<u64> {
    let t = s.trim().to_ascii_uppercase();
    let t = t.strip_suffix("IB").or_else(|| t.strip_suffix('B')).unwrap_or(&t);
    let (num, mult) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        Some('T') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let bad = || crate::Error::Usage(format!("invalid size {s:?}: use a number with K, M, G or T"));
    let n: u64 = num.trim().parse().map_err(|_| bad())?;
    n.checked_mul(mult).ok_or_else(|| crate::Error::Usage(format!("size {s:?} is too large")))
}

/// Parses a duration: a number with an s, m, h or d suffix (`90s`, `10m`, `2h`; seconds without).
pub fn parse_duration(s: &str) -> crate::Result<std::time::Duration> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = match t.chars().last() {
        Some('s') => (&t[..t.len() - 1], 1.0),
        Some('m') => (&t[..t.len() - 1], 60.0),
        Some('h') => (&t[..t.len() - 1], 3600.0),
        Some('d') => (&t[..t.len() - 1], 86400.0),
        _ => (&t[..], 1.0),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| crate::Error::Usage(format!("invalid duration {s:?}: use e.g. 90s, 10m or 2h")))?;
    if !(n.is_finite() && n >= 0.0) {
        return Err(crate::Error::Usage(format!("invalid duration {s:?}: use e.g. 90s, 10m or 2h")));
    }
    Ok(std::time::Duration::from_secs_f64(n * mult))
}

/// The current time as RFC 3339 (UTC).
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Formats a timestamp in local time, `YYYY-MM-DD HH:MM:SS`.
pub fn format_local(t: Timestamp) -> String {
    use chrono::TimeZone;
    match chrono::Local.timestamp_opt(t.secs, t.nanos) {
        chrono::LocalResult::Single(dt) => dt.format("%Y-%m-%d %H:%M:%S").to_string(),
        _ => format!("@{}", t.secs),
    }
}

/// Whether `path` is on a file system where reserving a file's blocks before writing them
/// costs little and changes nothing else: ext4 or XFS (false when that cannot be told).
pub fn reserves_cheaply(path: &Path) -> bool {
    const XFS_SUPER_MAGIC: u64 = 0x5846_5342;
    let Ok(s) = rustix::fs::statfs(path) else { return false };
    let kind = s.f_type as u64;
    kind == libc::EXT4_SUPER_MAGIC as u64 || kind == XFS_SUPER_MAGIC
}

/// Whether the process runs as root (and so may restore ownership and device nodes).
pub fn is_root() -> bool {
    uzers::get_effective_uid() == 0
}

/// The process umask (read by setting it and putting it back, as POSIX offers no getter).
pub fn umask() -> u32 {
    // SAFETY: umask cannot fail; the old mask is restored at once.
    unsafe {
        let old = libc::umask(0o022);
        libc::umask(old);
        old as u32
    }
}

/// Caches user and group names by ID.
#[derive(Default)]
pub struct NameCache {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl NameCache {
    /// The name of user `uid`, or "" if it has none.
    pub fn user(&mut self, uid: u32) -> String {
        self.users
            .entry(uid)
            .or_insert_with(|| {
                uzers::get_user_by_uid(uid).map(|u| u.name().to_string_lossy().into_owned()).unwrap_or_default()
            })
            .clone()
    }

    /// The name of group `gid`, or "" if it has none.
    pub fn group(&mut self, gid: u32) -> String {
        self.groups
            .entry(gid)
            .or_insert_with(|| {
                uzers::get_group_by_gid(gid).map(|g| g.name().to_string_lossy().into_owned()).unwrap_or_default()
            })
            .clone()
    }
}

const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

/// Reads `path`'s metadata (without following a final symlink) into a node named `name`.
/// Returns `Ok(None)` for sockets, which cannot be backed up.
pub fn read_node(path: &Path, name: Vec<u8>, names: &mut NameCache) -> io::Result<Option<Node>> {
    read_node_at(rustix::fs::CWD, path, path, name, names)
}

/// [`read_node`] for the entry `at` (a name) in the open directory `dir`, whose path is
/// `path`: status and symlink target are read relative to the directory, so the kernel does
/// not walk the whole path again (extended attributes have no such call and use `path`).
pub fn read_node_at(
    dir: impl std::os::fd::AsFd,
    at: &Path,
    path: &Path,
    name: Vec<u8>,
    names: &mut NameCache,
) -> io::Result<Option<Node>> {
    use rustix::fs::{AtFlags, FileType};
    let st = rustix::fs::statat(&dir, at, AtFlags::SYMLINK_NOFOLLOW)?;
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => NodeKind::File,
        FileType::Directory => NodeKind::Dir,
        FileType::Symlink => NodeKind::Symlink,
        FileType::CharacterDevice => NodeKind::CharDevice,
        FileType::BlockDevice => NodeKind::BlockDevice,
        FileType::Fifo => NodeKind::Fifo,
        _ => return Ok(None),
    };
    let time = |secs: i64, nanos: u64| Timestamp { secs, nanos: nanos as u32 };
    let mut node = Node::new(name, kind);
    node.mode = st.st_mode & 0o7777;
    node.uid = st.st_uid;
    node.gid = st.st_gid;
    node.user = names.user(st.st_uid);
    node.group = names.group(st.st_gid);
    node.atime = time(st.st_atime, st.st_atime_nsec);
    node.mtime = time(st.st_mtime, st.st_mtime_nsec);
    node.ctime = time(st.st_ctime, st.st_ctime_nsec);
    node.inode = st.st_ino;
    node.device_id = st.st_dev;
    node.links = st.st_nlink;
    match kind {
        NodeKind::File => node.size = st.st_size as u64,
        NodeKind::Symlink => {
            node.target = rustix::fs::readlinkat(&dir, at, Vec::new())?.into_bytes();
            node.size = node.target.len() as u64;
        }
        NodeKind::CharDevice | NodeKind::BlockDevice => node.rdev = st.st_rdev,
        _ => {}
    }
    read_xattrs(path, &mut node)?;
    Ok(Some(node))
}

fn read_xattrs(path: &Path, node: &mut Node) -> io::Result<()> {
    let names = match xattr::list(path) {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(()),
        Err(e) => return Err(e),
    };
    for name in names {
        let Some(value) = xattr::get(path, &name)? else {
            continue;
        };
        match name.as_bytes() {
            ACL_ACCESS => node.acl_access = Some(value),
            ACL_DEFAULT => node.acl_default = Some(value),
            n => node.xattrs.push(Xattr { name: n.to_vec(), value }),
        }
    }
    node.xattrs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(())
}

/// The data regions `(offset, length)` of `[start, end)` of an open file, found with
/// SEEK_DATA / SEEK_HOLE; everything else is a hole. Backup and restore both use this, with one
/// rule: when in doubt, it is data (and gets read). Only ENXIO — "no data after this offset" —
/// makes the rest a hole; any other SEEK_DATA failure (a file system without it answers EINVAL
/// or EOPNOTSUPP) makes the rest one data region, and a failed SEEK_HOLE makes data run to `end`.
pub fn data_regions(file: &File, start: u64, end: u64) -> Vec<(u64, u64)> {
    let fd = file.as_raw_fd();
    let mut out = Vec::new();
    let mut pos = start;
    while pos < end {
        // SAFETY: lseek on a file descriptor we own; no memory is passed.
        let found = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
        let seek = if found < 0 { Err(io::Error::last_os_error()) } else { Ok(found as u64) };
        let Some(data) = data_after(seek, pos) else { break };
        if data >= end {
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data as libc::off_t, libc::SEEK_HOLE) };
        let hole = if hole < 0 { end } else { (hole as u64).clamp(data + 1, end) };
        out.push((data, hole - data));
        pos = hole;
    }
    out
}

/// Where data begins at or after `pos`, given what `lseek(pos, SEEK_DATA)` returned: `None`
/// only when it said ENXIO (nothing but holes after `pos`); on any other error, `pos` itself
/// (see [`data_regions`]).
fn data_after(seek: io::Result<u64>, pos: u64) -> Option<u64> {
    match seek {
        Ok(data) => Some(data.max(pos)),
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => None,
        Err(_) => Some(pos),
    }
}

/// Opens a file for reading, never through a symlink, without updating its access time where
/// that is permitted (O_NOATIME needs the file's owner or root).
pub fn open_noatime(path: &Path) -> io::Result<File> {
    open_noatime_at(rustix::fs::CWD, path)
}

/// [`open_noatime`] for `name` relative to the open directory `dir`.
pub fn open_noatime_at<P: rustix::path::Arg + Copy>(dir: impl std::os::fd::AsFd, name: P) -> io::Result<File> {
    use rustix::fs::OFlags;
    Ok(File::from(openat_noatime(dir, name, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC)?))
}

/// Opens `name` (relative to `dir`) with `flags` plus O_NOATIME, or without it where it is not
/// permitted (EPERM: neither the file's owner nor root).
pub fn openat_noatime<P: rustix::path::Arg + Copy>(
    dir: impl std::os::fd::AsFd,
    name: P,
    flags: rustix::fs::OFlags,
) -> io::Result<std::os::fd::OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    match rustix::fs::openat(&dir, name, flags | OFlags::NOATIME, Mode::empty()) {
        Err(rustix::io::Errno::PERM) => Ok(rustix::fs::openat(&dir, name, flags, Mode::empty())?),
        other => Ok(other?),
    }
}

/// `path` as a C string.
pub fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_enxio_means_no_more_data() {
        let err = |code| Err(io::Error::from_raw_os_error(code));
        assert_eq!(data_after(Ok(8192), 100), Some(8192));
        assert_eq!(data_after(err(libc::ENXIO), 100), None);
        // Anything else is doubt, and doubt is data at `pos`: read it.
        for code in [libc::EINVAL, libc::EOPNOTSUPP, libc::EIO, libc::ESPIPE, libc::EBADF] {
            assert_eq!(data_after(err(code), 100), Some(100), "errno {code}");
        }
    }

    #[test]
    fn a_file_system_without_seek_data_is_all_data() {
        // procfs answers SEEK_DATA with EINVAL.
        let file = File::open("/proc/version").unwrap();
        // SAFETY: lseek on an open descriptor; no memory involved.
        let r = unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_DATA) };
        assert!(r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::ENXIO), "procfs has SEEK_DATA?");
        assert_eq!(data_regions(&file, 0, 50), vec![(0, 50)]);
        assert_eq!(data_regions(&file, 10, 50), vec![(10, 40)]);
    }

    #[test]
    fn holes_are_left_out() {
        use std::os::unix::fs::FileExt;
        let file = tempfile::tempfile().unwrap();
        file.set_len(3 << 20).unwrap();
        file.write_all_at(&[1; 4096], 1 << 20).unwrap();
        let regions = data_regions(&file, 0, 3 << 20);
        // tmpfs and most disks report the written block alone; a file system that cannot tell
        // reports more, never less.
        assert!(regions.iter().any(|&(o, l)| o <= 1 << 20 && o + l >= (1 << 20) + 4096), "{regions:?}");
        assert!(data_regions(&file, (2 << 20) + 1, 3 << 20).len() <= 1);
        assert_eq!(data_regions(&file, 5, 5), vec![]);
    }
}
