//! `cairn restore --live`: a file of a snapshot restored into a target file in the background
//! by the restore engine, while the target is served as a writable NBD export
//! ([`cairn_nbd::Live`]: reads of blocks not restored yet are read at once through the disk
//! export's read path, [`crate::Disk`], written to the target and served; the client's writes go
//! to the target and the restore's writes go around them, through [`WriteGuard`]).
//!
//! The restore is the restore engine's ([`restore::restore`]: compare with what the target
//! holds, local data, fetch, decode, write), so a resumed live restore fetches only what the
//! target lacks. While it runs the state file is checkpointed every [`CHECKPOINT`] (and on every
//! flush of the client); once it has ended without a failure the target is complete, the state
//! file removed, and the export goes on serving the target as a plain file.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_core::commands::restore::{self, Guard, Progress, RestoreOptions, RestoreOutcome, WriteGuard};
use cairn_core::engine::repository::Repository;
use cairn_core::error::{Error, Result};
use cairn_format::id::SnapshotId;
use cairn_format::snapshot::Snapshot;
use cairn_nbd::{Config, Export, Live, Server};

use crate::disk::{Disk, DiskOptions};

/// How often the state file is brought up to date while the restore runs.
pub const CHECKPOINT: Duration = Duration::from_secs(2);

/// The restore's writes into the live target.
struct Into(Arc<Live<Disk>>);

impl WriteGuard for Into {
    fn write(&self, _file: &File, offset: u64, data: &[u8]) -> io::Result<()> {
        // The same file, through the export's own descriptor.
        self.0.restore_write(offset, data)
    }

    fn zero(&self, _file: &File, offset: u64, len: u64) -> io::Result<()> {
        self.0.restore_zero(offset, len)
    }

    fn present(&self, offset: u64, len: u64) -> bool {
        self.0.is_present(offset, len)
    }
}

/// What happened to the background restore.
#[derive(Debug)]
pub enum LiveEvent {
    /// It ended: complete if nothing failed (the state file is gone), else what failed.
    Restored(Box<RestoreOutcome>),
    /// It stopped with an error (or was interrupted, on stop); the state file is kept.
    Stopped(Error),
}

/// A live restore of `path` of snapshot `id` into `target`.
pub struct LiveRestore {
    repo: Arc<Repository>,
    live: Arc<Live<Disk>>,
    id: SnapshotId,
    snapshot: Snapshot,
    path: PathBuf,
    target: PathBuf,
}

impl LiveRestore {
    /// Opens the live restore: resumes the one `target.cairn-live` records, or starts one (the
    /// target created, or kept and compared, at the file's size).
    pub fn open(
        repo: Arc<Repository>,
        id: &SnapshotId,
        snapshot: &Snapshot,
        path: &Path,
        target: &Path,
        opts: &DiskOptions,
    ) -> Result<LiveRestore> {
        let disk = Disk::open(repo.clone(), id, snapshot, path, opts)?;
        let identity = *disk.identity();
        let live = Live::open(disk, target, &identity).map_err(|e| match e.kind() {
            io::ErrorKind::InvalidData => Error::Usage(e.to_string()),
            _ => Error::io(target, "cannot open the live restore's target", e),
        })?;
        Ok(LiveRestore {
            repo,
            live: Arc::new(live),
            id: *id,
            snapshot: snapshot.clone(),
            path: path.to_path_buf(),
            target: target.to_path_buf(),
        })
    }

    /// The export clients are served.
    pub fn export(&self) -> &dyn Export {
        &*self.live
    }

    /// The state file.
    pub fn state_path(&self) -> &Path {
        self.live.state_path()
    }

    /// Bytes of the target present (restored or written by a client).
    pub fn present_bytes(&self) -> u64 {
        self.live.present_bytes()
    }

    /// Runs the background restore to its end (checkpointing the state file meanwhile); when
    /// nothing failed, completes the target.
    pub fn restore(&self, opts: &RestoreOptions, progress: &Progress) -> Result<RestoreOutcome> {
        // The file is restored as `target` itself: into its directory, under its name.
        let dir = match self.target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let opts = RestoreOptions {
            guard: Some(Guard(Arc::new(Into(self.live.clone())))),
            file_name: self.target.file_name().map(|n| n.to_os_string()),
            // The directory may hold anything else (other disk images): no directory's metadata
            // is touched, and the file's own metadata is set at its end.
            ..opts.clone()
        };
        let done = AtomicBool::new(false);
        let outcome = std::thread::scope(|s| {
            let saver = s.spawn(|| {
                while !done.load(Ordering::Acquire) {
                    std::thread::park_timeout(CHECKPOINT);
                    if let Err(e) = self.live.checkpoint() {
                        eprintln!("cairn: cannot save {}: {e}", self.live.state_path().display());
                    }
                }
            });
            let name = self.id.short();
            let out = restore::restore(&self.repo, &self.snapshot, &name, Some(&self.path), dir, &opts, progress);
            done.store(true, Ordering::Release);
            saver.thread().unpark();
            let _ = saver.join();
            out
        })?;
        let sync = |e| Error::io(&self.target, "cannot sync the live restore's target", e);
        if outcome.failed.is_empty() {
            self.live.complete().map_err(sync)?;
        } else {
            self.live.checkpoint().map_err(sync)?;
        }
        Ok(outcome)
    }

    /// Serves the target on `server` until it is stopped, restoring in the background; tells
    /// `on_event` how the restore ended. On stop, a restore still running is interrupted (the
    /// state file saved: a second live restore resumes it) and the target synced.
    pub fn serve(
        &self,
        server: &Server,
        config: &Config,
        opts: &RestoreOptions,
        progress: &Progress,
        on_event: &(dyn Fn(LiveEvent) + Sync),
        on_error: &(dyn Fn(io::Error) + Sync),
    ) -> Result<()> {
        let cancel = opts.cancel.clone().unwrap_or_default();
        let opts = RestoreOptions { cancel: Some(cancel.clone()), ..opts.clone() };
        let served = std::thread::scope(|s| {
            let restorer = std::thread::Builder::new()
                .name("live-restore".into())
                .spawn_scoped(s, || match self.restore(&opts, progress) {
                    Ok(out) => on_event(LiveEvent::Restored(Box::new(out))),
                    Err(e) => on_event(LiveEvent::Stopped(e)),
                })
                .map_err(|e| Error::io("live restore", "cannot start a thread", e))?;
            let served = server.run(self.export(), config, on_error);
            cancel.store(true, Ordering::Relaxed);
            let _ = restorer.join();
            served.map_err(|e| Error::io("NBD server", "failed", e))
        });
        let flushed = self.live.flush().map_err(|e| Error::io(&self.target, "cannot sync", e));
        served.and(flushed)
    }
}
