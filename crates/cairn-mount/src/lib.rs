//! `cairn mount`: every snapshot of a repository as a read-only FUSE file system.
//!
//! The layout is restic's: `snapshots/TIME` (and `latest`), `ids/SHORT-ID`, `hosts/HOST/TIME`,
//! `tags/TAG/TIME`, each a directory holding the snapshot's tree with the sizes, modes,
//! owners, times, symlinks, hard links (one inode number per group) and extended attributes
//! the snapshot recorded; holes read as zeros.
//!
//! Reads go through the shared read path ([`cairn_core::engine::read`]): one long-lived pipeline per
//! mount reads ahead for every reader — a large file read in order, the small files along a
//! walk of the snapshot's tree from the one opened — many coalesced reads in flight, blobs
//! decoded once on all cores into a cache of verified plaintext kept within a byte budget
//! (`content`, `prefetch`, `walk`, `cache`). Trees are loaded lazily, one directory when it is first
//! visited (`inodes`, through the repository's tree reader and its metadata cache).
//!
//! [`disk`] serves one file of a snapshot (a disk image) the same way, as the block device
//! `cairn nbd` exports ([`cairn_nbd`]).
//!
//! This crate keeps FUSE out of `cairn-core`: it depends on the core, never the other way.

mod cache;
mod content;
pub mod disk;
mod fs;
mod inodes;
mod layout;
pub mod live;
mod prefetch;
mod walk;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_core::engine::repository::Repository;
use cairn_core::error::{Error, Result};
use cairn_format::id::SnapshotId;
use cairn_format::snapshot::Snapshot;
use fuser::{MountOption, Session, SessionACL};

pub use disk::{Disk, DiskOptions};
pub use layout::time_name;
pub use live::{LiveEvent, LiveRestore};

/// How a mount reads and who may use it.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Byte budget for decoded blobs: half for the cache of plaintext, half for the
    /// read pipeline's reads in flight.
    pub max_memory: u64,
    /// Reads in flight in the read pipeline; `None`: the storage's own default.
    pub fetch_concurrency: Option<usize>,
    /// Decode workers of the read pipeline; `None`: one per core.
    pub decode_threads: Option<usize>,
    /// Threads answering the kernel's requests; `None`: four.
    pub fuse_threads: Option<usize>,
    /// Let other users (not only the one who mounted) use the mount (`allow_other`; for a
    /// user other than root, /etc/fuse.conf must say `user_allow_other`).
    pub allow_other: bool,
}

/// A mounted repository, not yet serving requests: [`Mounted::serve`] answers the kernel until
/// the file system is unmounted (by [`Unmounter::unmount`] or `fusermount3 -u`).
pub struct Mounted {
    session: Session<fs::CairnFs>,
    point: PathBuf,
    snapshots: usize,
}

/// Unmounts a [`Mounted`] file system from another thread (a signal handler's).
pub struct Unmounter {
    session: fuser::SessionUnmounter,
    point: PathBuf,
}

/// How an unmount went.
#[derive(Debug, PartialEq, Eq)]
pub enum Unmounted {
    /// Unmounted: the serving thread returns.
    Done,
    /// Files were open in it: it was detached (the mount point is free, those files fail from
    /// now on), but the session ends only when they are closed or the process exits.
    Detached,
}

impl Unmounter {
    /// Unmounts; detaches the file system if files are still open in it.
    pub fn unmount(&mut self) -> Result<Unmounted> {
        match self.session.unmount() {
            Ok(()) => Ok(Unmounted::Done),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                detach(&self.point).map_err(|e| Error::io(&self.point, "cannot unmount", e))?;
                Ok(Unmounted::Detached)
            }
            Err(e) => Err(Error::io(&self.point, "cannot unmount", e)),
        }
    }
}

/// Lazily unmounts `point` (`umount2(MNT_DETACH)` as root, else `fusermount3 -u -z`).
fn detach(point: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(point.as_os_str().as_bytes())?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    let out = std::process::Command::new("fusermount3").arg("-u").arg("-z").arg("--").arg(point).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()))
    }
}

impl Mounted {
    /// A handle that unmounts this file system.
    pub fn unmounter(&mut self) -> Unmounter {
        Unmounter { session: self.session.unmount_callable(), point: self.point.clone() }
    }

    /// How many snapshots the file system shows.
    pub fn snapshot_count(&self) -> usize {
        self.snapshots
    }

    /// Answers the kernel's requests until the file system is unmounted.
    pub fn serve(self) -> Result<()> {
        self.session.run().map_err(|e| Error::io("/dev/fuse", "the FUSE session failed", e))
    }
}

/// Checks that `mountpoint` is an existing directory, with errors that say so.
pub fn check_mountpoint(mountpoint: &Path) -> Result<()> {
    match std::fs::metadata(mountpoint) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(Error::Usage(format!(
            "mount point {} is not a directory: give an existing empty directory",
            mountpoint.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::Usage(format!(
            "mount point {} does not exist: create it first (mkdir -p {})",
            mountpoint.display(),
            mountpoint.display()
        ))),
        Err(e) => Err(Error::io(mountpoint, "cannot use the mount point", e)),
    }
}

/// Mounts the snapshots of `repo` (opened and locked by the caller) that `filter` selects at
/// `mountpoint`, loading the index first.
pub fn mount(
    repo: Repository,
    filter: &cairn_core::engine::select::SnapshotFilter,
    mountpoint: &Path,
    opts: &MountOptions,
) -> Result<Mounted> {
    check_mountpoint(mountpoint)?;
    repo.load_index()?;
    let snapshots = &filter.select(&repo)?;
    let repo = Arc::new(repo);
    let inodes = Arc::new(inodes::Inodes::new());
    layout::build(&inodes, snapshots, cairn_format::tree::Timestamp { secs: chrono::Utc::now().timestamp(), nanos: 0 });
    let budget = (opts.max_memory / 2).max(cairn_core::engine::read::MAX_READ * 4);
    let cache = Arc::new(cache::BlobCache::new((opts.max_memory / 2).max(cairn_core::engine::read::MAX_READ * 4)));
    let limits = prefetch::Limits {
        budget,
        // A stream's blobs handed out ahead of its reader fit in half the cache (ranges plus
        // plaintext count, so about a quarter of it in plaintext): read-ahead does not evict
        // what it brought before it is read.
        window: budget / 2,
        fetchers: opts.fetch_concurrency.unwrap_or_else(|| repo.storage().default_concurrency()).max(1),
        decoders: opts.decode_threads.unwrap_or_else(cairn_core::engine::platform::cores).max(1),
        foreground: false,
    };
    let prefetch = prefetch::Prefetch::start(repo.clone(), cache.clone(), limits)?;
    let content = content::Content::new(repo.clone(), cache, prefetch);
    let fs = fs::CairnFs::new(repo, inodes, content);
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::FSName("cairn".into()),
        MountOption::Subtype("cairn".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    config.acl = if opts.allow_other { SessionACL::All } else { SessionACL::Owner };
    config.n_threads = Some(opts.fuse_threads.unwrap_or(4).max(1));
    config.clone_fd = true;
    let session = Session::new(fs, mountpoint, &config).map_err(|e| {
        Error::Usage(format!(
            "cannot mount at {}: {e} (is /dev/fuse there and `fusermount3` installed — Debian's `fuse3`?)",
            mountpoint.display()
        ))
    })?;
    Ok(Mounted { session, point: mountpoint.to_path_buf(), snapshots: snapshots.len() })
}

/// What `cairn nbd` serves: the file at `path` of snapshot `id` of `repo` (its index loaded),
/// read-only, or with its writes kept in the copy-on-write `overlay` file (created if missing,
/// else checked to have been made for this snapshot and path).
pub fn nbd_export(
    repo: Repository,
    id: &SnapshotId,
    snapshot: &Snapshot,
    path: &Path,
    opts: &DiskOptions,
    overlay: Option<&Path>,
) -> Result<Box<dyn cairn_nbd::Export>> {
    let disk = Disk::open(Arc::new(repo), id, snapshot, path, opts)?;
    let Some(file) = overlay else { return Ok(Box::new(disk)) };
    let identity = *disk.identity();
    let overlaid = cairn_nbd::Overlay::open(disk, file, &identity).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidData => Error::Usage(e.to_string()),
        _ => Error::io(file, "cannot open the overlay file", e),
    })?;
    Ok(Box::new(overlaid))
}
