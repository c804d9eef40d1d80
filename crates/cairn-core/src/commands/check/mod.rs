//! `cairn check`: is the repository whole?
//!
//! ```text
//! files → structure (index ↔ packs ↔ headers) → trees (every blob a snapshot needs) → data → affected
//! ```
//!
//! - `files.rs`: every key, index and snapshot file decrypts and parses.
//! - `structure.rs`: every pack an index names exists with the size the index implies, its header
//!   (read with a small ranged read of its end) agrees with the index; packs no index lists and
//!   blobs listed twice.
//! - trees (`structure.rs`, through [`crate::engine::trees::load_listed`]): every tree the index lists
//!   is read at once through the read path, and only what the walk needs of it is kept; every
//!   tree of the chosen snapshots loads and every blob they need is in the index.
//! - `data.rs`: with `--read-data*`, packs read in full through the read path ([`crate::engine::read`]):
//!   each pack's bytes hashed against its name, every blob decrypted, decompressed and its ID
//!   recomputed; which packs, from a subset and the record of earlier runs (`record.rs`).
//! - `affected.rs`: the snapshots and paths that need what was found missing or damaged.
//!
//! Every problem is a typed [`Finding`]; requests run many at once, so a remote repository waits
//! a round trip per batch, not per file.

mod affected;
mod data;
mod files;
mod memory;
mod packhash;
mod record;
mod structure;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

pub use data::Subset;

use crate::engine::open::{self, OpenOptions, Opened};
use crate::engine::preload::Preload;
use crate::engine::repository::Repository;
use crate::engine::select::SnapshotFilter;
use crate::engine::storage::Storage;
use crate::error::Result;
use cairn_format::id::{BlobId, IdSet, PackId};
use cairn_format::lock::LockKind;

/// What kind of problem a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// A key file does not parse.
    DamagedKey,
    /// An index file does not decrypt or parse.
    DamagedIndex,
    /// A snapshot file does not decrypt or parse.
    DamagedSnapshot,
    /// A pack an index names does not exist.
    MissingPack,
    /// A pack's size differs from what its index entries imply.
    PackSize,
    /// A pack's header cannot be read or disagrees with the index.
    PackHeader,
    /// A pack no index lists (a notice: an interrupted backup leaves these; `repair index`
    /// indexes it).
    UnindexedPack,
    /// A prune's deletion manifest does not decrypt or parse (a notice: it is ignored, its packs
    /// stay, and the next prune removes it).
    DamagedDeletion,
    /// The start hint does not parse or decrypt (a notice: it is ignored, and the next backup
    /// rewrites it).
    DamagedHint,
    /// Blobs stored in more than one pack (a notice: concurrent backups do this).
    DuplicateBlob,
    /// A blob some snapshot needs is in no index.
    MissingBlob,
    /// A tree cannot be read.
    DamagedTree,
    /// A pack's bytes do not hash to its name.
    DamagedPack,
    /// A blob fails decryption, decompression or its ID check.
    DamagedBlob,
    /// A pack cannot be read at all.
    UnreadablePack,
}

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Something is wrong: data may be lost (exit code 1).
    Error,
    /// Worth knowing, nothing lost.
    Notice,
}

/// A snapshot and a path in it whose data depends on a finding.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Affected {
    /// The snapshot's short ID.
    pub snapshot: String,
    /// The absolute path inside it.
    pub path: String,
}

/// One problem found.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    /// What kind of problem.
    pub kind: FindingKind,
    /// How bad.
    pub severity: Severity,
    /// The repository file it is about.
    pub file: Option<String>,
    /// The blob it is about (hex).
    pub blob: Option<String>,
    /// What is wrong, in one line.
    pub message: String,
    /// Snapshots and paths whose data needs what is missing or damaged.
    pub affected: Vec<Affected>,
    /// Blobs (including every blob of a missing pack) the affected paths are found by.
    #[serde(skip)]
    pub(crate) blobs: Vec<BlobId>,
}

impl Finding {
    fn new(kind: FindingKind, file: Option<String>, message: String) -> Self {
        let severity = match kind {
            FindingKind::UnindexedPack
            | FindingKind::DuplicateBlob
            | FindingKind::DamagedDeletion
            | FindingKind::DamagedHint => Severity::Notice,
            _ => Severity::Error,
        };
        Finding { kind, severity, file, blob: None, message, affected: Vec::new(), blobs: Vec::new() }
    }

    fn with_blob(mut self, id: BlobId) -> Self {
        self.blob = Some(id.to_hex());
        self.blobs.push(id);
        self
    }
}

/// How much pack data to read.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum ReadData {
    /// Structure only: headers with small ranged reads, no blob decoded.
    #[default]
    None,
    /// Every pack in full.
    All,
    /// Some of the packs.
    Subset(Subset),
}

/// How to check.
#[derive(Clone, Debug)]
pub struct CheckOptions {
    /// Pack data to read.
    pub read_data: ReadData,
    /// The machine's directory for what it learns about repositories (the cache directory):
    /// the record of packs read (and when) is kept in `DIR/<repository ID>/check-verified`;
    /// with `resume`, subsets pick the packs read longest ago. Updated whenever packs are read
    /// in full. `None`: no record.
    pub record_dir: Option<PathBuf>,
    /// Pick subsets from the record (never-read packs first) instead of at random.
    pub resume: bool,
    /// Stop handing out pack reads after this long (what was read is recorded).
    pub max_duration: Option<Duration>,
    /// Limit the check to what these snapshots need.
    pub filter: SnapshotFilter,
    /// Requests in flight; `None`: the storage's own default, at least 8.
    pub concurrency: Option<usize>,
    /// Threads that decode.
    pub decode_threads: usize,
    /// Bound on the whole check (`check/memory.rs`): the index, the packs and what the walk
    /// keeps are counted first, the rest is pack data in flight; without one, those and 16 MiB
    /// of reads (more over a slow link).
    pub max_memory: Option<u64>,
    /// Set to stop early.
    pub cancel: Arc<AtomicBool>,
}

impl CheckOptions {
    /// The requests in flight on `repo`.
    pub(crate) fn fetches(&self, repo: &Repository) -> usize {
        self.concurrency.unwrap_or_else(|| repo.storage().default_concurrency().max(8)).max(1)
    }
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            read_data: ReadData::None,
            record_dir: None,
            resume: false,
            max_duration: None,
            filter: SnapshotFilter::default(),
            concurrency: None,
            decode_threads: crate::engine::platform::cores(),
            max_memory: None,
            cancel: Arc::default(),
        }
    }
}

/// Live counters, for a progress display.
#[derive(Debug, Default)]
pub struct Progress {
    /// What is being done ("index", "packs", "trees", "data", "paths").
    pub phase: Mutex<&'static str>,
    /// Units (files, packs, trees) of the phase done.
    pub done: AtomicU64,
    /// Units of the phase in all (0 while unknown).
    pub total: AtomicU64,
    /// Pack bytes read in full so far.
    pub bytes_read: AtomicU64,
    /// Pack bytes to read in full.
    pub bytes_to_read: AtomicU64,
}

impl Progress {
    fn phase(&self, name: &'static str, total: u64) {
        *self.phase.lock().expect("progress lock") = name;
        self.done.store(0, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
    }

    fn step(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
    }
}

/// What a check found and did.
#[derive(Debug, Default, Serialize)]
pub struct CheckReport {
    /// Packs the index lists (or, with a filter, that the chosen snapshots need).
    pub packs: u64,
    /// Their stored bytes.
    pub bytes: u64,
    /// Blobs in the index.
    pub blobs: u64,
    /// Snapshots checked.
    pub snapshots: u64,
    /// Trees loaded.
    pub trees: u64,
    /// Packs read in full.
    pub packs_read: u64,
    /// Their bytes.
    pub bytes_read: u64,
    /// Blobs decoded and verified.
    pub blobs_read: u64,
    /// Packs that `--read-data*` would read but were left for a later run (time budget).
    pub packs_left: u64,
    /// Whether the time budget ended the data check early.
    pub stopped_early: bool,
    /// With a record: packs never read in full by a check, and the age in seconds of the
    /// oldest read among the others (`None` without a record).
    pub never_read: Option<u64>,
    /// See `never_read`.
    pub oldest_read_secs: Option<u64>,
    /// Everything found.
    pub findings: Vec<Finding>,
    /// Wall time.
    #[serde(serialize_with = "secs")]
    pub duration: Duration,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl CheckReport {
    /// Findings that are errors.
    pub fn errors(&self) -> usize {
        self.findings.iter().filter(|f| f.severity == Severity::Error).count()
    }

    /// Findings that are notices.
    pub fn notices(&self) -> usize {
        self.findings.len() - self.errors()
    }
}

/// Default cap on pack data in flight over a fast link. Packs are read in pieces of an eighth of
/// it (at least 1 MiB) and each blob is verified and dropped, so even a small budget keeps many
/// requests in flight.
pub const DEFAULT_MAX_MEMORY: u64 = 16 * 1024 * 1024;

/// Most the default budget grows to over a slow link.
const SLOW_LINK_MAX_MEMORY: u64 = 64 * 1024 * 1024;

/// What a check decodes per second on a small machine (the Linux tree's repository, 2 cores:
/// about 330 MiB/s): over a link, twice what this fills in a round trip is kept in flight.
const DECODE_RATE: f64 = 320.0 * 1024.0 * 1024.0;

/// The cap on pack data in flight: `given`, else [`DEFAULT_MAX_MEMORY`], raised over a slow link
/// to twice what [`DECODE_RATE`] fills in the link's measured round trip (at most
/// [`SLOW_LINK_MAX_MEMORY`]). Bytes in flight over the round trip bound a remote read: 16 MiB
/// at 50 ms per request is 320 MiB/s at best, and by hand kept 59% of the 0 ms
/// throughput, 32 MiB 84%. A local check keeps the smaller peak (80 MB, restic's 85-109 MiB).
pub fn data_budget(repo: &Repository, given: Option<u64>) -> u64 {
    given.unwrap_or_else(|| {
        let over_link = repo.link().latency().map_or(0.0, |rtt| 2.0 * DECODE_RATE * rtt.as_secs_f64());
        (over_link as u64).clamp(DEFAULT_MAX_MEMORY, SLOW_LINK_MAX_MEMORY)
    })
}

/// How much of a repository this machine's data checks have read in full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verification {
    /// Pack files in the repository.
    pub packs: u64,
    /// Of those, packs no data check on this machine has read in full.
    pub never: u64,
    /// How long ago (seconds) the least recently read of the others was read.
    pub oldest_secs: Option<u64>,
}

/// Of `repo`'s packs, how many the data checks recorded in `record_dir` (as
/// [`CheckOptions::record_dir`]) never read, and how long ago the least recently read of the
/// others was read.
pub fn verification(repo: &Repository, record_dir: &std::path::Path) -> Result<Verification> {
    let record = record::Record::load(&record_dir.join(&repo.config().id).join("check-verified"))?;
    let packs: Vec<PackId> = repo.list_packs()?.into_keys().collect();
    let (never, oldest_secs) = record.coverage(&packs);
    Ok(Verification { packs: packs.len() as u64, never, oldest_secs })
}

/// Opens the repository at `storage` and checks it, as `cairn check` does: keys, index files,
/// snapshots and the pack listing are fetched beside the lock and the key's round trips, and
/// the check starts while the shared lock is still being taken (it only reads; if the lock
/// cannot be had it stops, and the lock's error is returned). The check's own outcome comes
/// second, after the open's, so a front end can tell an interrupted check from a failed open.
pub fn open_and_check(
    storage: Arc<dyn Storage>,
    password: &[u8],
    opts: &CheckOptions,
    open: OpenOptions<'_>,
    progress: &Progress,
) -> Result<(Opened, Result<CheckReport>)> {
    let open = OpenOptions {
        lock: Some(LockKind::Shared),
        preload: Preload::everything(true),
        stop: Some(&opts.cancel),
        ..open
    };
    open::open_then(storage, password, open, |repo| Ok::<_, crate::Error>(check(repo, opts, progress)))
}

/// Small requests (headers, index and snapshot files) in flight at once.
const HEADER_READS: usize = 32;

/// Checks `repo` (its index need not be loaded: the check reads the index files itself).
pub fn check(repo: &Repository, opts: &CheckOptions, progress: &Progress) -> Result<CheckReport> {
    let started = Instant::now();
    let mut report = CheckReport::default();
    // Listings, small files and pack headers: tiny requests, many in flight (a remote one waits
    // a round trip; a local one costs a thread).
    let threads = opts.fetches(repo).max(HEADER_READS);
    // Keys, index files, snapshots and the pack listing do not depend on each other: they are
    // read at once, so a remote repository waits for the slowest, not for the sum.
    progress.phase("index", 0);
    let (keys, index, snapshots, listed) = std::thread::scope(|s| {
        let keys = s.spawn(|| files::keys(repo, threads));
        let snapshots = s.spawn(|| {
            let mut found = Vec::new();
            files::snapshots(repo, &opts.filter, &mut found).map(|s| (s, found))
        });
        let listed = s.spawn(|| repo.list_packs());
        let mut found = Vec::new();
        let index = files::index(repo, &mut found, progress).map(|p| (p, found));
        let panicked = "a check thread panicked";
        (keys.join().expect(panicked), index, snapshots.join().expect(panicked), listed.join().expect(panicked))
    });
    report.findings.extend(keys?);
    if let Some(why) = repo.hint_damage() {
        report.findings.push(Finding::new(
            FindingKind::DamagedHint,
            Some(cairn_format::hint::PATH.into()),
            format!("{why}; ignored, and the next backup rewrites it"),
        ));
    }
    let ((packs, doomed, differing), found) = index?;
    report.findings.extend(found);
    let (snapshots, found) = snapshots?;
    report.findings.extend(found);
    let listed = listed?;
    // Counted once the index and the packs are in, before anything large is read: a budget too
    // small for them is refused before the trees are loaded.
    let reads = memory::read_share(repo, &packs, !opts.filter.is_empty(), opts.max_memory)?;
    report.snapshots = snapshots.len() as u64;
    let listed_and_indexed: IdSet<PackId> = packs.keys().filter(|id| listed.contains_key(id)).copied().collect();
    // Without a filter every pack is in scope, and the headers are read beside the trees (a
    // remote repository waits one round trip for both); with one, only the packs the chosen
    // snapshots need are checked, counted and read, which the trees tell.
    let mut every_pack: Vec<&structure::IndexedPackInfo> = packs.values().collect();
    every_pack.sort_unstable_by_key(|p| p.id);
    let trees = structure::listed_trees(&packs, &listed_and_indexed);
    let (needed, headers) = std::thread::scope(|s| {
        let headers = opts.filter.is_empty().then(|| {
            s.spawn(|| {
                let mut found = CheckReport::default();
                let present = structure::packs(repo, &every_pack, &listed, threads, &mut found, &Progress::default());
                (present, found.findings)
            })
        });
        let needed = structure::trees(repo, trees, &snapshots, opts, reads, &mut report, progress);
        (needed, headers.map(|h| h.join().expect("the header check panicked")))
    });
    let needed = needed?;
    let in_scope: Vec<&structure::IndexedPackInfo> = match &needed {
        None => every_pack,
        Some(n) => every_pack.into_iter().filter(|p| p.blobs.iter().any(|b| n.contains(&b.id))).collect(),
    };
    let present = match headers {
        Some((present, found)) => {
            report.findings.extend(found);
            present
        }
        None => structure::packs(repo, &in_scope, &listed, threads, &mut report, progress),
    };
    if needed.is_none() {
        structure::other_listings(repo, &differing, &listed, &mut report);
        structure::duplicates(&packs, &mut report);
        structure::unindexed(&packs, &doomed, &listed, &mut report);
    }
    let chosen: Vec<&structure::IndexedPackInfo> = in_scope.into_iter().filter(|p| present.contains(&p.id)).collect();
    report.packs = chosen.len() as u64;
    report.bytes = chosen.iter().map(|p| p.size).sum();
    report.blobs = chosen.iter().map(|p| p.blobs.len() as u64).sum();
    let record_path = opts.record_dir.as_ref().map(|d| d.join(&repo.config().id).join("check-verified"));
    let mut record = match &record_path {
        Some(path) => Some(record::Record::load(path)?),
        None => None,
    };
    if opts.read_data != ReadData::None {
        let deadline = opts.max_duration.map(|d| started + d);
        let limits = data::Limits { deadline, bytes_in_flight: reads };
        data::read(repo, &chosen, opts, record.as_mut(), limits, &mut report, progress)?;
        if let (Some(rec), Some(path)) = (&record, &record_path) {
            rec.save(path)?;
        }
    }
    if let Some(rec) = &record {
        let ids: Vec<PackId> = chosen.iter().map(|p| p.id).collect();
        let (never, oldest) = rec.coverage(&ids);
        report.never_read = Some(never);
        report.oldest_read_secs = oldest;
    }
    let bad: IdSet<BlobId> = report.findings.iter().flat_map(|f| f.blobs.iter().copied()).collect();
    if !bad.is_empty() {
        progress.phase("paths", snapshots.len() as u64);
        affected::name(repo, &snapshots, &mut report.findings, &opts.cancel, progress)?;
    }
    if opts.cancel.load(Ordering::Relaxed) {
        return Err(crate::Error::Interrupted);
    }
    report.duration = started.elapsed();
    Ok(report)
}
