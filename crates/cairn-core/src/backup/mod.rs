//! Backup: `walk → read → store → commit`, one module per stage.

mod read;
mod store;
mod walk;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

pub use walk::absolute;

use crate::chunker::ChunkerKind;
use crate::compress::Codec;
use crate::error::{Error, Result};
use crate::id::SnapshotId;
use crate::platform::{self, NameCache};
use crate::repository::Repository;
use crate::snapshot::{Snapshot, Summary};
use store::{BlobStore, StoreStats};
use walk::{Selection, Walker};

/// How to back up.
#[derive(Clone, Debug)]
pub struct BackupOptions {
    /// Tags to record.
    pub tags: Vec<String>,
    /// Compression for new blobs (`None`: the repository's default).
    pub compression: Option<Codec>,
    /// Fixed-size chunks of this many bytes instead of content-defined chunking.
    pub fixed_chunk_size: Option<u32>,
    /// Compression threads.
    pub threads: usize,
    /// Host name to record (`None`: this machine's).
    pub hostname: Option<String>,
}

impl Default for BackupOptions {
    fn default() -> Self {
        BackupOptions {
            tags: Vec::new(),
            compression: None,
            fixed_chunk_size: None,
            threads: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2),
            hostname: None,
        }
    }
}

/// A problem with one entry; the backup went on without it.
#[derive(Clone, Debug)]
pub struct Warning {
    /// The entry.
    pub path: PathBuf,
    /// What went wrong.
    pub message: String,
}

/// Running counts of a backup.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    /// Files read.
    pub files_new: u64,
    /// Directories walked.
    pub dirs: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Entries that could not be read.
    pub errors: u64,
}

/// The result of a backup.
#[derive(Debug)]
pub struct BackupOutcome {
    /// The new snapshot.
    pub id: SnapshotId,
    /// Its content.
    pub snapshot: Snapshot,
    /// Entries that could not be read (the exit code is then 3).
    pub warnings: Vec<Warning>,
}

/// Backs up `paths` into `repo` and writes a snapshot.
pub fn backup(repo: &Repository, paths: &[PathBuf], opts: &BackupOptions) -> Result<BackupOutcome> {
    if paths.is_empty() {
        return Err(Error::Usage("nothing to back up: give at least one path".into()));
    }
    let started = Instant::now();
    let time = platform::now();
    let abs: Vec<PathBuf> = paths.iter().map(|p| absolute(p)).collect::<Result<_>>()?;
    for p in &abs {
        std::fs::symlink_metadata(p).map_err(|e| Error::io(p, "cannot back up", e))?;
    }
    let chunker = match opts.fixed_chunk_size {
        Some(n) => ChunkerKind::Fixed(n),
        None => ChunkerKind::Cdc(repo.config().chunker),
    };
    let codec = opts.compression.unwrap_or_else(|| repo.config().codec());
    let stats = StoreStats::default();
    let mut counters = Counters::default();
    let mut warnings = Vec::new();
    let selection = Selection::new(&abs);

    let (root, packs) = std::thread::scope(|s| -> Result<_> {
        let store = BlobStore::start(s, repo, codec, opts.threads, &stats);
        let mut walker = Walker {
            store: &store,
            chunker,
            counters: &mut counters,
            warnings: &mut warnings,
            names: NameCache::default(),
            hardlinks: Default::default(),
        };
        let root = walker.selection_tree(Path::new("/"), &selection);
        let packs = store.finish();
        Ok((root?, packs?))
    })?;
    if !packs.is_empty() {
        repo.save_index(&packs)?;
    }
    let snapshot = Snapshot {
        time,
        tree: root,
        paths: abs.iter().map(|p| p.to_string_lossy().into_owned()).collect(),
        hostname: opts.hostname.clone().unwrap_or_else(platform::hostname),
        username: platform::username(),
        uid: uzers::get_current_uid(),
        gid: uzers::get_current_gid(),
        tags: opts.tags.clone(),
        parent: None,
        program_version: format!("cairn {}", env!("CARGO_PKG_VERSION")),
        summary: Summary {
            files_new: counters.files_new,
            files_changed: 0,
            files_unmodified: 0,
            dirs: counters.dirs,
            bytes_read: counters.bytes_read,
            bytes_added: stats.bytes_added.load(Ordering::Relaxed),
            bytes_stored: stats.bytes_stored.load(Ordering::Relaxed),
            errors: counters.errors,
            duration_ms: started.elapsed().as_millis() as u64,
        },
    };
    let id = repo.save_snapshot(&snapshot)?;
    Ok(BackupOutcome { id, snapshot, warnings })
}
