//! Create stage: makes directories, symlinks, device nodes and FIFOs, clears whatever stands in
//! the way of an entry, and prepares files fixed in place. New files with data are created by
//! the write stage when their first chunk arrives. Nothing is ever followed: a symlink where a
//! directory belongs is removed and replaced, so no write lands outside the target.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustix::fs::OFlags;

use super::fsops::{fix_in_place, is_fatal, new_file_mode, remove_any, size_new_file};
use super::options::{Sparse, WriteGuard};
use super::shared::{OpenOnDrop, Shared};
use super::types::{Entry, FileState, Plan};
use crate::engine::platform;
use crate::error::{Error, Result};
use cairn_format::tree::{Node, NodeKind};

/// Whether the existing entry at `path` already is what `node` describes (metadata aside).
fn already_there(path: &Path, node: &Node) -> io::Result<bool> {
    use rustix::fs::FileType;
    let st = match platform::lstat(path) {
        Ok(st) => st,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let ft = FileType::from_raw_mode(st.st_mode);
    Ok(match node.kind {
        NodeKind::Dir => ft == FileType::Directory,
        NodeKind::Symlink => ft == FileType::Symlink && platform::read_link(path)? == node.target,
        NodeKind::Fifo => ft == FileType::Fifo,
        NodeKind::CharDevice => ft == FileType::CharacterDevice && st.st_rdev == node.rdev,
        NodeKind::BlockDevice => ft == FileType::BlockDevice && st.st_rdev == node.rdev,
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
/// something is in the way, the entry is examined and replaced. `acl` lists the directories
/// made before (and the target) that have a default ACL. A disk full or read-only target stops
/// it with an error, and so does `cancel`; `done` counts the directories made.
pub fn directories(
    target: &Path,
    plan: &Plan,
    empty: bool,
    is_root: bool,
    acl: HashSet<PathBuf>,
    done: &AtomicU64,
    cancel: &AtomicBool,
) -> Result<Directories> {
    let mut out = Directories { acl, ..Default::default() };
    for (i, entry) in plan.entries.iter().enumerate() {
        if entry.node.kind != NodeKind::Dir {
            continue;
        }
        if cancel.load(Ordering::Relaxed) {
            return Err(Error::Interrupted);
        }
        done.fetch_add(1, Ordering::Relaxed);
        let path = target.join(&entry.rel);
        let made = if empty { platform::mkdir(&path, 0o777) } else { Err(io::ErrorKind::AlreadyExists.into()) };
        let made = match made {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                prepare(&path, entry, &FileState::NotFile, false, Sparse::Auto, None, is_root)
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
    guard: Option<&dyn WriteGuard>,
    is_root: bool,
) -> io::Result<()> {
    let node = &entry.node;
    if entry.link_of.is_some() {
        return Ok(()); // hard links are made once their file is complete
    }
    match node.kind {
        NodeKind::File => prepare_file(path, node, state, has_data, sparse, guard),
        _ if already_there(path, node)? => Ok(()),
        NodeKind::Dir => {
            remove_any(path)?;
            platform::mkdir(path, 0o777)
        }
        NodeKind::Symlink => {
            remove_any(path)?;
            platform::symlink(&node.target, path)
        }
        NodeKind::Fifo => {
            remove_any(path)?;
            platform::mknod(path, libc::S_IFIFO | node.mode, 0)
        }
        NodeKind::CharDevice | NodeKind::BlockDevice if is_root => {
            remove_any(path)?;
            let kind = if node.kind == NodeKind::CharDevice { libc::S_IFCHR } else { libc::S_IFBLK };
            platform::mknod(path, kind | node.mode, node.rdev)
        }
        NodeKind::CharDevice | NodeKind::BlockDevice => {
            Err(io::Error::new(io::ErrorKind::PermissionDenied, "device nodes can only be restored as root"))
        }
    }
}

fn prepare_file(
    path: &Path,
    node: &Node,
    state: &FileState,
    has_data: bool,
    sparse: Sparse,
    guard: Option<&dyn WriteGuard>,
) -> io::Result<()> {
    match state {
        FileState::Create { .. } if guard.is_some() => {
            Err(io::Error::other("the live restore's target is not a plain file of its size"))
        }
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
            let f = platform::open_flags(path, OFlags::WRONLY | OFlags::NOFOLLOW, 0)?;
            fix_in_place(&f, node, zero_fix, *resize, guard)
        }
        _ => Ok(()),
    }
}

/// Opens (creating if needed) a file for writing, never through a symlink.
pub fn create_file(path: &Path, mode: u32) -> io::Result<fs::File> {
    platform::open_flags(path, OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW, new_file_mode(mode))
}

/// Whether the directory at `path` has a default ACL (new files in it inherit an access ACL
/// and a mode masked by it, so their metadata must be set in full).
pub fn has_default_acl(path: &Path) -> bool {
    let Ok(at) = platform::At::new(path) else { return false };
    matches!(xattr::get(at.path(), "system.posix_acl_default"), Ok(Some(_)))
}

/// The create stage alongside the pipeline: the directories (unless `made` before; `acl` as
/// for [`directories`]), then the entries without data; opens `sh.dirs_ready` when done,
/// whatever happened. Returns how long it took.
pub fn run(sh: &Shared<'_>, made: Option<Directories>, acl: HashSet<PathBuf>) -> Duration {
    let t = Instant::now();
    let _open = OpenOnDrop(&sh.dirs_ready); // even if this panics: no writer waits forever
    let made = match made {
        Some(made) => Ok(made),
        None => directories(sh.target, sh.plan, true, sh.is_root, acl, &sh.created, &sh.cancel),
    };
    match made {
        Ok(made) => {
            for (entry, why) in &made.failed {
                sh.failures.entry(*entry, why);
            }
            sh.acl_dirs.set(made.acl).expect("directories are made once");
            if let Err(e) = create_entries(sh) {
                sh.fail(e);
            }
        }
        Err(e) => sh.fail(e),
    }
    t.elapsed()
}

/// Create stage for entries without data to write (directories are done): symlinks, devices,
/// FIFOs, empty files, files fixed in place without new data. Parents come before children.
fn create_entries(sh: &Shared<'_>) -> Result<()> {
    // Entries that already failed are not created: they could never be right.
    let failed_early: HashSet<usize> = sh.failures.entries.lock().expect("failures lock").keys().copied().collect();
    for (i, entry) in sh.plan.entries.iter().enumerate() {
        if entry.node.kind == NodeKind::Dir {
            continue;
        }
        let has_data = sh.remaining[i].load(Ordering::Relaxed) > 0;
        if failed_early.contains(&i)
            || entry.link_of.is_some()
            || (has_data && matches!(sh.states[i], FileState::Create { .. } | FileState::InPlace { .. }))
            || sh.touched[i].get().is_some()
            || matches!(sh.states[i], FileState::Complete | FileState::Skip)
        {
            // Prepared by its first write (write.rs) or by the local-data stage (local/),
            // linked once its file is complete, or a file with nothing to prepare (its content
            // is right or left alone: a no-op restore's million files cost nothing here).
            continue;
        }
        if sh.cancelled() {
            return Ok(()); // the restore ends with Interrupted (or the error that stopped it)
        }
        sh.created.fetch_add(1, Ordering::Relaxed);
        let path = sh.target.join(&entry.rel);
        if let Err(e) = prepare(&path, entry, &sh.states[i], has_data, sh.sparse, sh.guard, sh.is_root) {
            if is_fatal(&e) {
                return Err(Error::io(path, "cannot create", e));
            }
            sh.failures.entry(i, &format!("cannot create: {e}"));
        }
    }
    Ok(())
}
