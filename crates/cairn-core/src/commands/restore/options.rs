//! What a restore is asked to do and what it reports: the options (and what they resolve to
//! for a target), the live progress counters, a dry run's findings and the outcome.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::types::{FileState, NeededChunk, Plan};
use crate::engine::profile::StageTimes;
use crate::error::{Error, Result};
use cairn_format::tree::{Chunk, NodeKind};

/// What to do with a file that already exists in the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overwrite {
    /// Compare the existing content chunk by chunk and rewrite only what differs (default).
    Always,
    /// Trust an existing file whose size and modification time match; rewrite it otherwise.
    IfChanged,
    /// Rewrite an existing file only if the snapshot's copy is newer.
    IfNewer,
    /// Never touch an existing file.
    Never,
}

impl std::str::FromStr for Overwrite {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "always" => Ok(Overwrite::Always),
            "if-changed" => Ok(Overwrite::IfChanged),
            "if-newer" => Ok(Overwrite::IfNewer),
            "never" => Ok(Overwrite::Never),
            _ => Err(Error::Usage(format!("unknown overwrite mode {s:?}: use always, if-changed, if-newer or never"))),
        }
    }
}

/// Where a restore looks for chunks that are already on this machine before it fetches them
/// (the local-data stage, `local/`). Every chunk found is verified against its ID as it is
/// copied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LocalData {
    /// Nowhere: everything the target lacks is fetched (`--no-local-data`).
    Off,
    /// In the files the snapshot was taken from, at its original paths, unless those are the
    /// target itself; and in the target's files the snapshot does not name (renamed, moved).
    #[default]
    SnapshotPaths,
    /// As [`LocalData::SnapshotPaths`], but the restored path's original files are read from
    /// this path instead (`--use-source=PATH`, e.g. the old disk mounted elsewhere).
    SourceAt(PathBuf),
}

/// What happens to zero ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SparseMode {
    /// Zero chunks and holes become holes (default).
    Auto,
    /// Also leave 4 KiB blocks of zeros inside data chunks as holes.
    Always,
    /// Allocate every byte: no holes.
    Never,
}

impl std::str::FromStr for SparseMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(SparseMode::Auto),
            "always" => Ok(SparseMode::Always),
            "never" => Ok(SparseMode::Never),
            _ => Err(Error::Usage(format!("unknown sparse mode {s:?}: use auto, always or never"))),
        }
    }
}

/// The effective way new files are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sparse {
    /// Holes for zero chunks.
    Auto,
    /// Holes for zero chunks and zero blocks.
    Always,
    /// Fully allocated.
    Never,
    /// Holes for zero chunks, data ranges reserved up front.
    Preallocate,
    /// Holes for zero chunks, data ranges of files of [`RESERVE_MIN`] or more reserved up
    /// front (the default on ext4 and XFS).
    ReserveLarge,
}

impl Sparse {
    /// How new files in `target` are laid out with `opts`.
    pub(super) fn choose(opts: &RestoreOptions, target: &Path) -> Sparse {
        match (opts.sparse, opts.preallocate) {
            (SparseMode::Never, _) => Sparse::Never,
            (_, true) => Sparse::Preallocate,
            (SparseMode::Always, false) => Sparse::Always,
            (SparseMode::Auto, false) if crate::engine::platform::reserves_cheaply(target) => Sparse::ReserveLarge,
            (SparseMode::Auto, false) => Sparse::Auto,
        }
    }
}

/// New files this large have their data ranges reserved before they are written, on ext4 and
/// XFS only: on tmpfs reserving means zeroing pages about to be overwritten, and on btrfs
/// reserved ranges are written without compression. On ext4 the
/// writes then fill reserved extents instead of taking delayed-allocation bookkeeping per page:
/// restoring the 4 GiB `disk.img` the write stage was busy 1.1–1.3 s instead of 2.0–2.1 s
/// (`--profile`). For small files the extra call costs more than it saves (the Linux tree with
/// every file reserved: +1 s of system time).
pub const RESERVE_MIN: u64 = 1024 * 1024;

/// Where a range of chunks found on this machine comes from (`local/cost.rs` chooses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalCost {
    /// Copied from a local file (verified first).
    Local,
    /// Fetched from the repository.
    Repository,
}

impl LocalCost {
    /// The choice a value of `CAIRN_LOCAL_COST` names: `local` or `repository`.
    pub fn parse(value: &str) -> Option<LocalCost> {
        match value {
            "local" => Some(LocalCost::Local),
            "repository" => Some(LocalCost::Repository),
            _ => None,
        }
    }
}

/// How to restore.
#[derive(Clone, Debug)]
pub struct RestoreOptions {
    /// Ranged reads in flight (with `fetch_auto`, [`restore`](super::restore) starts at the
    /// storage's own default instead).
    pub fetch_concurrency: usize,
    /// Move the reads in flight while restoring from what is measured (`read/tune.rs`); off
    /// when the user chose `--fetch-concurrency`.
    pub fetch_auto: bool,
    /// Threads that decrypt, decompress and verify.
    pub decode_threads: usize,
    /// Threads that write files (and compare an existing target with the snapshot); with
    /// `write_auto`, the files written at once at first.
    pub write_threads: usize,
    /// Move the files written at once while restoring from what is measured
    /// (`restore/writers.rs`); off when the user chose `--write-threads`.
    pub write_auto: bool,
    /// Cap on bytes in flight between fetch and write.
    pub max_memory: u64,
    /// What to do with existing files.
    pub overwrite: Overwrite,
    /// Remove entries the snapshot lacks from restored directories.
    pub delete: bool,
    /// Only report what would change.
    pub dry_run: bool,
    /// Re-read every restored file afterwards and check it.
    pub verify: bool,
    /// Zero ranges.
    pub sparse: SparseMode,
    /// Reserve data ranges up front.
    pub preallocate: bool,
    /// `--include` globs.
    pub include: Vec<String>,
    /// `--exclude` globs.
    pub exclude: Vec<String>,
    /// Report a stall after this long without progress.
    pub stall_timeout: Duration,
    /// Set to stop the restore early (for example on SIGINT).
    pub cancel: Option<Arc<AtomicBool>>,
    /// Where to look for chunks already on this machine.
    pub local_data: LocalData,
    /// For tests: a shell command the local-data copy runs as it starts, after the scan found
    /// its chunks and beside the fetches (to change a local file in between, or to wait for a
    /// fetched file).
    #[doc(hidden)]
    pub local_scanned_hook: Option<String>,
    /// For tests and benchmarks (`CAIRN_LOCAL_COST`): copy every chunk found locally, or fetch
    /// every one, whatever the measured costs say (`local/cost.rs`).
    #[doc(hidden)]
    pub local_cost: Option<LocalCost>,
    /// Fault injection (`CAIRN_INJECT_WRITE_LATENCY`): each write into the target waits this
    /// long first, as on a network file system, without using the CPU.
    #[doc(hidden)]
    pub write_latency: Duration,
    /// A live restore's target (`cairn restore --live`): every write of file data and every
    /// zeroing goes through it, so it can keep what a client wrote meanwhile.
    pub guard: Option<Guard>,
    /// The name the one file a restore of `SNAPSHOT:PATH` restores gets in the target (its
    /// own by default): a live restore's target file.
    pub file_name: Option<std::ffi::OsString>,
}

/// Where a live restore's writes go: into the blocks of the target a client has not written,
/// marking what they fill (`cairn_nbd::Live` behind it). A restore with a guard restores one
/// file that already exists at its final size, and never replaces it.
pub trait WriteGuard: Send + Sync {
    /// Writes the snapshot's `data` at `offset` of `file`, except where the client wrote.
    fn write(&self, file: &std::fs::File, offset: u64, data: &[u8]) -> std::io::Result<()>;
    /// Makes `[offset, offset + len)` of `file` zeros, except where the client wrote.
    fn zero(&self, file: &std::fs::File, offset: u64, len: u64) -> std::io::Result<()>;
    /// Whether `[offset, offset + len)` of the file is final already (a client's read brought
    /// it, or a client wrote it): the restore need not fetch what it would write there.
    fn present(&self, _offset: u64, _len: u64) -> bool {
        false
    }
}

/// A restore's [`WriteGuard`].
#[derive(Clone)]
pub struct Guard(pub Arc<dyn WriteGuard>);

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Guard")
    }
}

/// The restore's stages, for reports, in pipeline order (the read path's fetch and decode,
/// then write).
pub const STAGE_NAMES: [&str; 3] = ["fetch", "decode", "write"];

/// Default byte budget: the engine's (256 MiB, see docs/DESIGN.md).
pub use crate::engine::memory::DEFAULT_MAX_MEMORY;

impl RestoreOptions {
    /// These options with the user's choice of threads: a count given is kept fixed; `None`
    /// leaves the fetch concurrency and the files written at once tuned while restoring and the
    /// decoders at one per core.
    pub fn with_threads(mut self, fetch: Option<usize>, decode: Option<usize>, write: Option<usize>) -> Self {
        let defaults = RestoreOptions::default();
        self.fetch_concurrency = fetch.unwrap_or(defaults.fetch_concurrency);
        self.fetch_auto = fetch.is_none();
        self.decode_threads = decode.unwrap_or(defaults.decode_threads);
        self.write_threads = write.unwrap_or(defaults.write_threads);
        self.write_auto = write.is_none();
        self
    }
}

impl Default for RestoreOptions {
    fn default() -> Self {
        let cores = crate::engine::platform::cores();
        RestoreOptions {
            fetch_concurrency: 4,
            fetch_auto: true,
            decode_threads: cores,
            write_threads: cores.max(2),
            write_auto: true,
            max_memory: DEFAULT_MAX_MEMORY,
            overwrite: Overwrite::Always,
            delete: false,
            dry_run: false,
            verify: false,
            sparse: SparseMode::Auto,
            preallocate: false,
            include: Vec::new(),
            exclude: Vec::new(),
            stall_timeout: Duration::from_secs(60),
            cancel: None,
            local_data: LocalData::SnapshotPaths,
            local_scanned_hook: None,
            local_cost: None,
            write_latency: Duration::ZERO,
            guard: None,
            file_name: None,
        }
    }
}

/// Live counters, for a progress display.
#[derive(Debug, Default)]
pub struct Progress {
    /// Bytes of file content to restore in total.
    pub total_bytes: AtomicU64,
    /// Bytes done (written, already in place, or zero).
    pub done_bytes: AtomicU64,
    /// Files to restore.
    pub total_files: AtomicU64,
    /// Files whose content is complete.
    pub done_files: AtomicU64,
    /// Stored bytes fetched.
    pub fetched_bytes: AtomicU64,
    /// Set when the watchdog sees a stall: which stage is waiting.
    pub stall: Mutex<Option<String>>,
    /// Raised once the restore reads nothing more from the repository: its walk is over and
    /// the last batch's read workers have ended (the caller may let its lock go then).
    pub reads_over: crate::engine::signal::Signal,
}

/// What a dry run found.
#[derive(Debug, Default, Clone)]
pub struct DryRun {
    /// Files that would be created.
    pub create: Vec<PathBuf>,
    /// Files whose content would be partly rewritten.
    pub update: Vec<PathBuf>,
    /// Files already correct (metadata may still be updated).
    pub unchanged: u64,
    /// Entries `--delete` would remove.
    pub delete: Vec<PathBuf>,
}

impl DryRun {
    /// What restoring `plan` over files in `states` would create, update and leave alone.
    pub(super) fn listed(plan: &Plan, states: &[FileState]) -> DryRun {
        let mut dry = DryRun::default();
        for (e, st) in plan.entries.iter().zip(states) {
            match st {
                FileState::Create { .. } => dry.create.push(e.rel.clone()),
                FileState::InPlace { .. } => dry.update.push(e.rel.clone()),
                FileState::Complete => dry.unchanged += 1,
                _ => {}
            }
        }
        dry
    }

    /// Adds what another batch found.
    pub(super) fn add(&mut self, other: DryRun) {
        self.create.extend(other.create);
        self.update.extend(other.update);
        self.unchanged += other.unchanged;
        self.delete.extend(other.delete);
    }
}

/// What a restore did.
#[derive(Debug, Default)]
pub struct RestoreOutcome {
    /// Regular files in the restore (hard links included).
    pub files: u64,
    /// Directories.
    pub dirs: u64,
    /// Other entries (symlinks, devices, FIFOs).
    pub others: u64,
    /// Bytes of file content.
    pub bytes_total: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Stored bytes fetched from the repository.
    pub bytes_fetched: u64,
    /// Bytes already correct in the target.
    pub bytes_in_place: u64,
    /// Bytes copied (with `--dry-run`: that would be copied) from the files the snapshot was
    /// taken from instead of fetched.
    pub bytes_reused_source: u64,
    /// Bytes copied (or that would be) from other files in the target instead of fetched.
    pub bytes_reused_target: u64,
    /// Bytes restored as holes.
    pub bytes_zero: u64,
    /// Entries removed by `--delete`.
    pub deleted: u64,
    /// Files checked by `--verify`.
    pub verified: u64,
    /// Entries that could not be restored, with the reason (the exit code is then non-zero).
    pub failed: Vec<(PathBuf, String)>,
    /// Metadata that could not be applied.
    pub warnings: Vec<(PathBuf, String)>,
    /// Stalls the watchdog reported.
    pub stalls: Vec<String>,
    /// Per-stage time: fetch, decode, write.
    pub profile: [StageTimes; 3],
    /// What the fetch concurrency's controller chose, and why (empty unless `fetch_auto`).
    pub fetch_tuning: Vec<crate::engine::read::TuneStep>,
    /// What the writers' controller chose, and why (empty unless `write_auto`).
    pub write_tuning: Vec<Step>,
    /// Most fetch threads a batch started.
    pub fetch_threads: usize,
    /// Most reads a batch had in flight at once (a fetch thread carries many where the storage
    /// waits on a network, read/fetch.rs).
    pub fetch_in_flight_peak: usize,
    /// The coalescing gap each batch's reads were planned with, and why.
    pub read_gaps: Vec<crate::engine::read::GapChoice>,
    /// Set for `--dry-run`.
    pub dry_run: Option<DryRun>,
    /// Wall time of each phase: plan, dirs, compare, schedule, pipeline, the create stage's own
    /// time (which ran alongside the pipeline), finish (and verify).
    pub phases: Vec<(&'static str, Duration)>,
    /// Batches the restore was planned and written in (see [`crate::commands::restore::restore`]).
    pub batches: u64,
    /// Wall time.
    pub duration: Duration,
}

impl RestoreOutcome {
    /// The counts of a restore of `plan` over files in `states` that still `needed` chunks
    /// written: entries of each kind, bytes in all, as holes and already in place.
    pub(super) fn counted(plan: &Plan, states: &[FileState], needed: &[Vec<NeededChunk>]) -> RestoreOutcome {
        let mut out = RestoreOutcome::default();
        for ((e, st), needed) in plan.entries.iter().zip(states).zip(needed) {
            match e.node.kind {
                NodeKind::File => out.files += 1,
                NodeKind::Dir => out.dirs += 1,
                _ => out.others += 1,
            }
            if e.node.kind != NodeKind::File || e.link_of.is_some() {
                continue;
            }
            let zero: u64 = e.node.content.iter().filter(|c| matches!(c, Chunk::Zero { .. })).map(Chunk::len).sum();
            out.bytes_total += e.node.size;
            out.bytes_zero += zero;
            let needed_bytes: u64 = needed.iter().map(|c| u64::from(c.len)).sum();
            if !matches!(st, FileState::Create { .. } | FileState::Skip) {
                out.bytes_in_place += e.node.size - zero - needed_bytes;
            }
        }
        out
    }

    /// Adds what another batch did (its counts, lists, stage and phase times).
    pub(super) fn absorb(&mut self, part: RestoreOutcome) {
        self.files += part.files;
        self.dirs += part.dirs;
        self.others += part.others;
        self.bytes_total += part.bytes_total;
        self.bytes_written += part.bytes_written;
        self.bytes_fetched += part.bytes_fetched;
        self.bytes_in_place += part.bytes_in_place;
        self.bytes_zero += part.bytes_zero;
        self.bytes_reused_source += part.bytes_reused_source;
        self.bytes_reused_target += part.bytes_reused_target;
        self.deleted += part.deleted;
        self.verified += part.verified;
        self.batches += part.batches;
        self.fetch_tuning.extend(part.fetch_tuning);
        self.write_tuning.extend(part.write_tuning);
        self.read_gaps.extend(part.read_gaps);
        self.fetch_threads = self.fetch_threads.max(part.fetch_threads);
        self.fetch_in_flight_peak = self.fetch_in_flight_peak.max(part.fetch_in_flight_peak);
        self.failed.extend(part.failed);
        self.warnings.extend(part.warnings);
        self.stalls.extend(part.stalls);
        for (mine, theirs) in self.profile.iter_mut().zip(part.profile) {
            mine.add(theirs);
        }
        if let Some(dry) = part.dry_run {
            self.dry_run.get_or_insert_with(DryRun::default).add(dry);
        }
        for (name, took) in part.phases {
            crate::engine::profile::add_phase(&mut self.phases, name, took);
        }
    }

    /// Lists the entries of `plan` that `failed` (with why), no longer counting them as
    /// restored.
    pub(super) fn add_failed(&mut self, plan: &Plan, failed: BTreeMap<usize, String>) {
        for (i, why) in failed {
            match plan.entries[i].node.kind {
                NodeKind::File => self.files -= 1,
                NodeKind::Dir => self.dirs -= 1,
                _ => self.others -= 1,
            }
            self.failed.push((plan.entries[i].rel.clone(), why));
        }
    }
}

/// One change of the writers at work, for `--profile`.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// Time since the batch's pipeline started.
    pub at: Duration,
    /// Writers at work from then on.
    pub limit: usize,
    /// Bytes written per second in the sample that led to it.
    pub rate: f64,
    /// The share of the cores' time the process used in that sample.
    pub cpu: f64,
    /// Why.
    pub reason: &'static str,
}
