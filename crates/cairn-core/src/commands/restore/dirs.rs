//! Lookups relative to an open directory. A worker takes entries in plan order, so consecutive
//! entries mostly share a directory: keeping it open and using `*at()` calls with a
//! one-component name spares the kernel the walk of the whole path (target, snapshot path,
//! directories) on every call.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};

use super::fsops::new_file_mode;
use cairn_format::tree::Timestamp;

/// The directory of the last entry looked up, kept open.
pub struct ParentDirs<'t> {
    base: Base<'t>,
    open: Option<(PathBuf, OwnedFd)>,
}

/// What a [`ParentDirs`]' paths are relative to.
enum Base<'t> {
    /// The restore's target, whose directories the restore made (or checked to be
    /// directories) before any lookup.
    Target(&'t Path),
    /// An open directory the restore does not own (the source of local data): each parent is
    /// opened below it through no symlink and never out of it.
    Beneath(BorrowedFd<'t>),
}

impl<'t> ParentDirs<'t> {
    /// Lookups below the restore's `target`.
    pub fn new(target: &'t Path) -> Self {
        ParentDirs { base: Base::Target(target), open: None }
    }

    /// Lookups below the open directory `dir`, through no symlink: neither a parent nor the
    /// entry itself may be one (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` for the parent, then
    /// one name with `O_NOFOLLOW` or `AT_SYMLINK_NOFOLLOW`).
    pub fn beneath(dir: BorrowedFd<'t>) -> Self {
        ParentDirs { base: Base::Beneath(dir), open: None }
    }

    /// The open directory holding `rel` (relative to the base), and `rel`'s name in it.
    fn parent<'r>(&mut self, rel: &'r Path) -> io::Result<(BorrowedFd<'_>, &'r OsStr)> {
        let name = rel.file_name().ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        let dir = rel.parent().unwrap_or(Path::new(""));
        if self.open.as_ref().is_none_or(|(open, _)| open != dir) {
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
            let fd = match self.base {
                Base::Target(target) => {
                    let at = crate::engine::platform::At::new(&target.join(dir))?;
                    rustix::fs::openat(at.dir(), at.name(), flags, Mode::empty())?
                }
                Base::Beneath(base) => {
                    let how = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS;
                    let below = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
                    rustix::fs::openat2(base, below, flags, Mode::empty(), how)?
                }
            };
            self.open = Some((dir.to_path_buf(), fd));
        }
        let (_, fd) = self.open.as_ref().expect("opened above");
        Ok((fd.as_fd(), name))
    }

    /// The status of the entry at `rel`, never followed.
    pub fn status(&mut self, rel: &Path) -> io::Result<Status> {
        let (dir, name) = self.parent(rel)?;
        Ok(Status::from(&rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?))
    }

    /// Opens whatever is at `rel` for reading and takes its status from the open descriptor:
    /// one lookup of the name instead of two. Never follows a symlink (ELOOP), never blocks
    /// (O_NONBLOCK: a FIFO opens at once; a socket fails with ENXIO) and never makes a
    /// terminal the controlling one; the caller checks that it is a plain file before reading.
    pub fn open_existing(&mut self, rel: &Path) -> io::Result<(File, Status)> {
        let file = self.open_unchecked(rel)?;
        let st = Status::from(&rustix::fs::fstat(&file)?);
        Ok((file, st))
    }

    /// [`ParentDirs::open_existing`] without the status, for a file whose status was just
    /// taken by name or that is read only for one chunk: whatever it is now is read only
    /// through its hashed content (a FIFO or a directory fails the read, a device's bytes the
    /// hash).
    pub fn open_unchecked(&mut self, rel: &Path) -> io::Result<File> {
        let (dir, name) = self.parent(rel)?;
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        Ok(File::from(crate::engine::platform::openat_noatime(dir, name, flags)?))
    }

    /// Opens (creating if needed) the file at `rel` for writing, never through a symlink; a
    /// new file gets [`new_file_mode`]'s permission bits.
    pub fn create(&mut self, rel: &Path, mode: u32) -> io::Result<File> {
        let (dir, name) = self.parent(rel)?;
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(new_file_mode(mode)))?;
        Ok(File::from(fd))
    }
}

/// The parts of an entry's status that the compare and finish stages look at.
#[derive(Clone, Copy, Debug)]
pub struct Status {
    /// File type and permission bits (`st_mode`).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Number of hard links.
    pub nlink: u64,
    /// Size in bytes.
    pub size: u64,
    /// Modification time.
    pub mtime: Timestamp,
    /// Access time.
    pub atime: Timestamp,
    /// Device and inode: which file it is.
    pub file: (u64, u64),
}

impl Status {
    /// Whether this is a regular file.
    pub fn is_file(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFREG
    }
}

impl From<&rustix::fs::Stat> for Status {
    fn from(st: &rustix::fs::Stat) -> Self {
        let time = |secs: i64, nanos: u64| Timestamp { secs, nanos: nanos as u32 };
        Status {
            mode: st.st_mode,
            uid: st.st_uid,
            gid: st.st_gid,
            nlink: st.st_nlink,
            size: st.st_size as u64,
            mtime: time(st.st_mtime, st.st_mtime_nsec),
            atime: time(st.st_atime, st.st_atime_nsec),
            file: (st.st_dev, st.st_ino),
        }
    }
}

impl From<&std::fs::Metadata> for Status {
    fn from(md: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        let time = |secs: i64, nanos: i64| Timestamp { secs, nanos: nanos as u32 };
        Status {
            mode: md.mode(),
            uid: md.uid(),
            gid: md.gid(),
            nlink: md.nlink(),
            size: md.size(),
            mtime: time(md.mtime(), md.mtime_nsec()),
            atime: time(md.atime(), md.atime_nsec()),
            file: (md.dev(), md.ino()),
        }
    }
}
