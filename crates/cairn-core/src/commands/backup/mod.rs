//! Backup: a pipeline of concurrent stages, one module each, joined by bounded channels.
//!
//! ```text
//! walk ──ReadJob──▶ read ×R ─▶ chunk ─▶ store ──Job──▶ packer ×C ──pack──▶ upload ×U ──▶ commit
//! (1 thread)       (--read-concurrency)   (dedup)      (compress+encrypt)  (--upload-     (index files,
//!                                                                           concurrency)   snapshot)
//! ```
//!
//! `walk` stats entries and reuses unchanged files from the parent snapshot ([`parent`]);
//! `read` reads the rest; `chunk` cuts, hashes and looks each chunk up on the reader's thread;
//! `store` drops known and in-flight blobs; the shared pack writer ([`crate::engine::packwrite`])
//! compresses and encrypts into packs, stores them and writes index files as packs are stored;
//! the snapshot is written last. Directory trees complete asynchronously ([`pending`]): a reader moves on as soon as
//! its file is read. Standard input ([`stdin`]) replaces `walk` and `read` with one stream.

mod chunk;
mod command;
mod links;
mod memory;
mod parent;
mod pending;
mod progress;
mod read;
mod select;
mod stdin;
mod store;
mod treebuf;
mod walk;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crossbeam_channel::bounded;

pub use command::backup_command;
pub use parent::ParentChoice;
pub use progress::Progress;
pub use select::{absolute, read_files_from, SelectOptions};
pub use stdin::backup_stdin;

use crate::engine::chunker::ChunkerKind;
use crate::engine::packwrite::{join_all, write_packs, WriteOptions, Written};
use crate::engine::platform;
use crate::engine::repository::Repository;
use crate::error::{Error, Result};
use cairn_format::compress::Codec;
use cairn_format::id::{BlobId, SnapshotId};
use cairn_format::snapshot::{Snapshot, Summary};
use links::Links;
use progress::Counters;
use select::{Filter, Selection};
use store::{BlobStore, StoreStats};

/// Files read at once unless `--read-concurrency` says otherwise; measured in docs/DESIGN.md
/// ("Backup: read concurrency").
pub const DEFAULT_READ_CONCURRENCY: usize = 2;

/// Packs stored at once unless `--upload-concurrency` says otherwise.
pub const DEFAULT_UPLOAD_CONCURRENCY: usize = 2;

pub use crate::engine::packwrite::DEFAULT_INDEX_EVERY;

/// How to back up.
#[derive(Clone, Debug)]
pub struct BackupOptions {
    /// Tags to record.
    pub tags: Vec<String>,
    /// Compression for new blobs (`None`: the repository's default).
    pub compression: Option<Codec>,
    /// Fixed-size chunks of this many bytes instead of content-defined chunking.
    pub fixed_chunk_size: Option<u32>,
    /// Files read at once.
    pub read_concurrency: usize,
    /// Threads that compress and encrypt.
    pub threads: usize,
    /// Packs stored at once.
    pub upload_concurrency: usize,
    /// Stored packs per index file.
    pub index_every: usize,
    /// Host name to record (`None`: this machine's).
    pub hostname: Option<String>,
    /// The snapshot's time (`None`: when the backup starts).
    pub time: Option<cairn_format::tree::Timestamp>,
    /// Which snapshot unchanged files are taken from.
    pub parent: ParentChoice,
    /// What to leave out.
    pub select: SelectOptions,
    /// Read and chunk everything, store nothing, write no snapshot.
    pub dry_run: bool,
    /// Count the files and bytes to expect alongside the backup (for a progress display).
    pub prescan: bool,
    /// The backup's memory bound (`--max-memory`; `None`: the threads' and uploads' counts
    /// alone bound the packs). See `memory.rs`.
    pub max_memory: Option<u64>,
}

impl BackupOptions {
    /// The host name the snapshot records, and that its parent must have been made on.
    fn host(&self) -> String {
        self.hostname.clone().unwrap_or_else(platform::hostname)
    }
}

impl Default for BackupOptions {
    fn default() -> Self {
        BackupOptions {
            tags: Vec::new(),
            compression: None,
            fixed_chunk_size: None,
            read_concurrency: DEFAULT_READ_CONCURRENCY,
            threads: crate::engine::platform::cores(),
            upload_concurrency: DEFAULT_UPLOAD_CONCURRENCY,
            index_every: DEFAULT_INDEX_EVERY,
            hostname: None,
            time: None,
            parent: ParentChoice::Auto,
            select: SelectOptions::default(),
            dry_run: false,
            prescan: false,
            max_memory: None,
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
    /// Whether the entry's data is missing from the snapshot or may be inconsistent (a socket
    /// skipped by design is not).
    pub error: bool,
}

/// Directories by how they compare with the parent snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirCounts {
    /// Not in the parent.
    pub new: u64,
    /// Tree differs from the parent's.
    pub changed: u64,
    /// Same tree as the parent's.
    pub unmodified: u64,
}

/// The result of a backup.
#[derive(Debug)]
pub struct BackupOutcome {
    /// The new snapshot (`None` for a dry run).
    pub id: Option<SnapshotId>,
    /// Its content.
    pub snapshot: Snapshot,
    /// Directory counts (the snapshot records only the total).
    pub dirs: DirCounts,
    /// Entries that could not be read (the exit code is then 3).
    pub warnings: Vec<Warning>,
}

/// What every stage of one backup shares.
pub(crate) struct Shared<'a> {
    repo: &'a Repository,
    store: &'a BlobStore<'a>,
    chunker: ChunkerKind,
    counters: &'a Counters,
    progress: &'a Progress,
    warnings: &'a Mutex<Vec<Warning>>,
    links: Links,
    root: Mutex<Option<BlobId>>,
}

impl Shared<'_> {
    /// Reports an entry that could not be backed up (completely).
    fn warn(&self, path: &Path, message: String) {
        Counters::bump(&self.counters.errors);
        self.warnings.lock().expect("warnings lock").push(Warning { path: path.to_path_buf(), message, error: true });
    }

    /// Reports an entry left out by design.
    fn note(&self, path: &Path, message: String) {
        self.warnings.lock().expect("warnings lock").push(Warning { path: path.to_path_buf(), message, error: false });
    }
}

/// The error a stage returns when the next one stopped; the next one's own error is the one
/// reported.
fn stopped(next: &str) -> Error {
    Error::Internal(format!("the backup's {next} stage stopped early"))
}

/// Backs up `paths` into `repo` and writes a snapshot.
pub fn backup(
    repo: &Repository,
    paths: &[PathBuf],
    opts: &BackupOptions,
    progress: &Progress,
) -> Result<BackupOutcome> {
    if paths.is_empty() {
        return Err(Error::Usage("nothing to back up: give at least one path".into()));
    }
    let abs: Vec<PathBuf> = paths.iter().map(|p| absolute(p)).collect::<Result<_>>()?;
    for p in &abs {
        std::fs::symlink_metadata(p).map_err(|e| Error::io(p, "cannot back up", e))?;
    }
    let filter = Filter::new(&opts.select)?;
    let selection = Selection::new(&abs);
    let snap_paths: Vec<String> = abs.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let parent = parent::choose(repo, &opts.parent, &opts.host(), &snap_paths)?;
    let parent_tree = parent.as_ref().map(|(_, s)| s.tree);
    let parent_id = parent.map(|(id, _)| id);
    run(repo, opts, progress, snap_paths, parent_id, |sh| {
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            if opts.prescan {
                s.spawn(|| progress.prescan(&abs, &filter, &stop));
            }
            let (jobs_tx, jobs_rx) = bounded(opts.read_concurrency.max(1) * 4);
            let readers: Vec<_> = (0..opts.read_concurrency.max(1))
                .map(|_| {
                    let rx = jobs_rx.clone();
                    s.spawn(move || read::run(sh, rx))
                })
                .collect();
            drop(jobs_rx);
            let trees = parent::TreeLoader::start(s, repo, parent::TREE_LOADERS);
            let walked = walk::Walker::new(sh, &filter, jobs_tx, &trees).run(&selection, parent_tree);
            drop(trees);
            let read = join_all(readers);
            stop.store(true, Ordering::Relaxed);
            read.and(walked)
        })
    })
}

/// Runs the stages after `produce` (walk and read, or standard input), which fills the root
/// tree through the [`Shared`] it is given; then writes the snapshot.
fn run(
    repo: &Repository,
    opts: &BackupOptions,
    progress: &Progress,
    paths: Vec<String>,
    parent: Option<SnapshotId>,
    produce: impl FnOnce(&Shared<'_>) -> Result<()>,
) -> Result<BackupOutcome> {
    let started = Instant::now();
    let time = opts.time.unwrap_or_else(platform::now);
    if !opts.dry_run {
        // Temporary objects of killed processes; a failed write removed its own.
        if let Err(e) = repo.storage().remove_stale_temporaries(crate::engine::storage::STALE_TEMPORARY_AGE) {
            tracing::warn!("cannot remove stale temporary objects: {e}");
        }
    }
    let chunker = match opts.fixed_chunk_size {
        Some(n) => ChunkerKind::Fixed(n),
        None => ChunkerKind::Cdc(repo.config().chunker),
    };
    let codec = opts.compression.unwrap_or_else(|| repo.config().codec());
    let stats = StoreStats::default();
    let counters = Counters::default();
    let warnings = Mutex::new(Vec::new());
    let write = WriteOptions {
        codec,
        threads: opts.threads.max(1),
        uploads: opts.upload_concurrency.max(1),
        index_every: opts.index_every,
        memory: opts.max_memory.map(|m| memory::pack_share(repo, m)).transpose()?,
        index_stored: true,
    };
    let written = Written::default();
    let root = write_packs(repo, &write, &written, |jobs| {
        // Dropping the store at the end of this closure tells the packers to finish.
        let store = BlobStore::new(repo, jobs, &stats, opts.dry_run);
        let sh = Shared {
            repo,
            store: &store,
            chunker,
            counters: &counters,
            progress,
            warnings: &warnings,
            links: Links::default(),
            root: Mutex::new(None),
        };
        produce(&sh)?;
        // Every source completes its root directory; this is a bug if it happens.
        sh.root
            .into_inner()
            .expect("root lock")
            .ok_or_else(|| Error::Internal("the backup ended without a root tree".into()))
    })?;

    let get = Counters::get;
    let snapshot = Snapshot {
        time,
        tree: root,
        paths,
        hostname: opts.host(),
        username: platform::username(),
        uid: uzers::get_current_uid(),
        gid: uzers::get_current_gid(),
        tags: opts.tags.clone(),
        parent,
        program_version: format!("cairn {}", env!("CARGO_PKG_VERSION")),
        summary: Summary {
            files_new: get(&counters.files_new),
            files_changed: get(&counters.files_changed),
            files_unmodified: get(&counters.files_unmodified),
            dirs: get(&counters.dirs_new) + get(&counters.dirs_changed) + get(&counters.dirs_unmodified),
            bytes_read: get(&counters.bytes_read),
            bytes_added: stats.bytes_added.load(Ordering::Relaxed),
            bytes_stored: written.bytes(),
            errors: get(&counters.errors),
            duration_ms: started.elapsed().as_millis() as u64,
        },
        original: None,
    };
    let id = if opts.dry_run { None } else { Some(repo.save_snapshot(&snapshot)?) };
    if id.is_some() {
        // The start hint names the key and the tree packs as they now are (a restore elsewhere
        // starts one round trip sooner).
        crate::engine::trees::write_hint(repo);
    }
    let dirs = DirCounts {
        new: get(&counters.dirs_new),
        changed: get(&counters.dirs_changed),
        unmodified: get(&counters.dirs_unmodified),
    };
    Ok(BackupOutcome { id, snapshot, dirs, warnings: warnings.into_inner().expect("warnings lock") })
}
