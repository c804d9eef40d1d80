//! What a running backup reports: counts for the summary, live progress for a display, and
//! the quick pre-scan that finds the totals while the backup runs.

use std::collections::BTreeSet;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use super::select::{list_dir, Filter};

/// Counts for the summary, updated by every stage.
#[derive(Debug, Default)]
pub struct Counters {
    /// Files not in the parent snapshot.
    pub files_new: AtomicU64,
    /// Files in the parent snapshot whose metadata changed (they were read again).
    pub files_changed: AtomicU64,
    /// Files whose chunk lists were reused from the parent snapshot without reading them.
    pub files_unmodified: AtomicU64,
    /// Directories not in the parent snapshot.
    pub dirs_new: AtomicU64,
    /// Directories whose tree differs from the parent snapshot's.
    pub dirs_changed: AtomicU64,
    /// Directories whose tree is the parent snapshot's.
    pub dirs_unmodified: AtomicU64,
    /// Bytes of file content read.
    pub bytes_read: AtomicU64,
    /// Entries that could not be read.
    pub errors: AtomicU64,
}

impl Counters {
    /// Adds one to `counter`.
    pub(super) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// Live progress of a backup, read by a display thread.
#[derive(Debug, Default)]
pub struct Progress {
    /// Files and bytes found by the pre-scan so far.
    pub total_files: AtomicU64,
    /// See `total_files`.
    pub total_bytes: AtomicU64,
    /// Set when the pre-scan has seen everything (the totals are final).
    pub scan_finished: AtomicBool,
    /// Files finished (read or reused).
    pub files_done: AtomicU64,
    /// Their sizes.
    pub bytes_done: AtomicU64,
    reading: Mutex<BTreeSet<PathBuf>>,
}

impl Progress {
    /// The files being read right now.
    pub fn reading(&self) -> Vec<PathBuf> {
        self.reading.lock().expect("progress lock").iter().cloned().collect()
    }

    pub(super) fn start_reading(&self, path: &Path) {
        self.reading.lock().expect("progress lock").insert(path.to_path_buf());
    }

    pub(super) fn stop_reading(&self, path: &Path) {
        self.reading.lock().expect("progress lock").remove(path);
    }

    pub(super) fn file_done(&self, size: u64) {
        self.files_done.fetch_add(1, Ordering::Relaxed);
        self.bytes_done.fetch_add(size, Ordering::Relaxed);
    }

    /// Counts the files and bytes the backup will see, applying the same exclusions, until
    /// done or `stop` is set. Runs alongside the backup: it only stats entries.
    pub(super) fn prescan(&self, roots: &[PathBuf], filter: &Filter, stop: &AtomicBool) {
        use rustix::fs::{statat, AtFlags, FileType, Stat};
        let mut stack: Vec<(PathBuf, u64)> = Vec::new();
        let count =
            |path: &Path, st: &Stat, root_dev: u64, stack: &mut Vec<(PathBuf, u64)>| match FileType::from_raw_mode(
                st.st_mode,
            ) {
                FileType::RegularFile => {
                    self.total_files.fetch_add(1, Ordering::Relaxed);
                    self.total_bytes.fetch_add(st.st_size as u64, Ordering::Relaxed);
                }
                FileType::Directory if !filter.excludes_dir(path) && !filter.stops_at_device(root_dev, st.st_dev) => {
                    stack.push((path.to_path_buf(), root_dev));
                }
                _ => {}
            };
        for root in roots {
            if let Ok(st) = statat(rustix::fs::CWD, root, AtFlags::SYMLINK_NOFOLLOW) {
                count(root, &st, st.st_dev, &mut stack);
            }
        }
        while let Some((dir, root_dev)) = stack.pop() {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let listing = list_dir(&dir, |_| {});
            let Some(fd) = listing.dir else { continue };
            for name in listing.names {
                let name = Path::new(std::ffi::OsStr::from_bytes(&name));
                let path = dir.join(name);
                if filter.excludes_path(&path) {
                    continue;
                }
                // Relative to the open directory: no walk of the whole path per entry.
                if let Ok(st) = statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW) {
                    count(&path, &st, root_dev, &mut stack);
                }
            }
        }
        self.scan_finished.store(true, Ordering::Relaxed);
    }
}
