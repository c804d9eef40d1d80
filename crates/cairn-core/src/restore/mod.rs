//! Restore: `plan → check → create → fetch → decode → write → finish`, one module per stage.
//!
//! The plan lists the entries; the check stage compares an existing target with them so only
//! missing or different chunks are fetched. Then three pools run at once, joined by bounded
//! channels and a byte budget: fetch workers issue coalesced ranged pack reads, decode workers
//! decrypt, decompress and verify, write workers do positioned writes and finish each file's
//! metadata as its last chunk lands. Directories get their metadata last, deepest first.

mod budget;
mod buffers;
mod check;
mod create;
mod decode;
mod dirs;
mod dump;
mod fetch;
mod finish;
mod plan;
mod profile;
mod verify;
mod write;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::bounded;

pub use check::Overwrite;
pub use dump::{dump, DumpStats};
#[doc(hidden)]
pub use plan::chunk_offsets; // for cairn_core::fuzzing (fuzz targets and property tests)
pub use plan::{Filter, Plan};
pub use profile::{StageTimes, STAGE_NAMES};

use crate::error::{Error, Result};
use crate::id::{BlobId, IdMap};
use crate::parallel::in_parallel;
use crate::repository::Repository;
use crate::snapshot::Snapshot;
use crate::tree::{Chunk, Node, NodeKind};
use budget::Budget;
use check::FileState;
use plan::{Fetches, Top};
use profile::StageClock;

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
            _ => Err(Error::Usage(format!("unknown --sparse {s:?}: use auto, always or never"))),
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

/// New files this large have their data ranges reserved before they are written, on ext4 and
/// XFS only: on tmpfs reserving means zeroing pages about to be overwritten, and on btrfs
/// reserved ranges are written without compression. On ext4 the
/// writes then fill reserved extents instead of taking delayed-allocation bookkeeping per page:
/// restoring the 4 GiB `disk.img` the write stage was busy 1.1–1.3 s instead of 2.0–2.1 s
/// (`--profile`). For small files the extra call costs more than it saves (the Linux tree with
/// every file reserved: +1 s of system time).
pub const RESERVE_MIN: u64 = 1024 * 1024;

/// How to restore.
#[derive(Clone, Debug)]
pub struct RestoreOptions {
    /// Ranged reads in flight.
    pub fetch_concurrency: usize,
    /// Threads that decrypt, decompress and verify.
    pub decode_threads: usize,
    /// Threads that write files (and check an existing target).
    pub write_threads: usize,
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
}

/// Default byte budget: 256 MiB (see docs/DESIGN.md).
pub const DEFAULT_MAX_MEMORY: u64 = 256 * 1024 * 1024;

impl Default for RestoreOptions {
    fn default() -> Self {
        let cores = crate::parallel::cores();
        RestoreOptions {
            fetch_concurrency: 4,
            decode_threads: cores,
            write_threads: cores.max(2),
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
    /// Set for `--dry-run`.
    pub dry_run: Option<DryRun>,
    /// Wall time of each phase: plan, dirs, check, schedule, pipeline, the create stage's own
    /// time (which ran alongside the pipeline), finish (and verify).
    pub phases: Vec<(&'static str, Duration)>,
    /// Wall time.
    pub duration: Duration,
}

/// Measures consecutive phases of a restore.
struct PhaseClock(Instant);

impl PhaseClock {
    fn new() -> Self {
        PhaseClock(Instant::now())
    }

    fn lap(&mut self, phases: &mut Vec<(&'static str, Duration)>, name: &'static str) {
        phases.push((name, self.0.elapsed()));
        self.0 = Instant::now();
    }
}

/// Failures collected while the pipeline runs.
pub struct Failures<'a> {
    dests: &'a IdMap<BlobId, Vec<plan::Dest>>,
    entries: Mutex<BTreeMap<usize, String>>,
}

impl Failures<'_> {
    /// Every file that needs blob `id` fails with `why`.
    pub fn blob(&self, id: &BlobId, why: &str) {
        for d in self.dests.get(id).into_iter().flatten() {
            self.entry(d.entry as usize, why);
        }
    }

    /// Entry `i` fails with `why` (the first reason is kept).
    pub fn entry(&self, i: usize, why: &str) {
        self.entries.lock().expect("failures lock").entry(i).or_insert_with(|| why.to_string());
    }
}

/// How a file's first write prepared it: done, or the OS error code and message of why not.
type Prepared = std::result::Result<(), (Option<i32>, String)>;

/// State shared by the pipeline's workers.
pub struct Shared<'a> {
    repo: &'a Repository,
    plan: &'a Plan,
    fetches: &'a Fetches,
    states: &'a [FileState],
    target: &'a Path,
    budget: Budget,
    /// Reused buffers for reads of large blobs.
    buffers: buffers::BufferPool,
    failures: Failures<'a>,
    clocks: [StageClock; 3],
    remaining: Vec<AtomicU32>,
    /// Set by a file's first write, once it is prepared (or with why that failed); a failed
    /// file nothing was written to is left as it was.
    touched: Vec<std::sync::OnceLock<Prepared>>,
    meta_done: Vec<AtomicBool>,
    fetched: AtomicU64,
    written: AtomicU64,
    files_done: AtomicU64,
    cancel: Arc<AtomicBool>,
    fatal: Mutex<Option<Error>>,
    warnings: Mutex<Vec<(PathBuf, String)>>,
    sparse: Sparse,
    is_root: bool,
    umask: u32,
    /// Directories (relative to the target) with a default ACL while files are written; set
    /// once they are made.
    acl_dirs: OnceLock<HashSet<PathBuf>>,
    /// Opens once the directories and the entries without data are made: writers wait for it.
    dirs_ready: Gate,
    /// Directories and other entries the create stage has made (the watchdog's measure of it).
    created: AtomicU64,
}

/// A one-way gate: closed until opened, then open for good.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().expect("gate lock") = true;
        self.opened.notify_all();
    }

    fn is_open(&self) -> bool {
        *self.open.lock().expect("gate lock")
    }

    fn wait(&self) {
        let mut open = self.open.lock().expect("gate lock");
        while !*open {
            open = self.opened.wait(open).expect("gate lock");
        }
    }
}

/// Opens its gate when dropped.
struct OpenOnDrop<'a>(&'a Gate);

impl Drop for OpenOnDrop<'_> {
    fn drop(&mut self) {
        self.0.open();
    }
}

impl Shared<'_> {
    /// Whether the pipeline is shutting down.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    /// Stops everything because of an error no other file would escape (disk full, read-only).
    fn fatal(&self, path: PathBuf, e: std::io::Error) {
        self.fail(Error::io(path, "cannot write", e));
    }

    /// Stops everything with `e` (the first such error is kept).
    fn fail(&self, e: Error) {
        self.fatal.lock().expect("fatal lock").get_or_insert(e);
        self.cancel.store(true, Ordering::Relaxed);
    }

    fn warn(&self, path: PathBuf, why: String) {
        self.warnings.lock().expect("warnings lock").push((path, why));
    }
}

/// Errors that no other entry will escape either: the restore stops.
pub(crate) fn is_fatal(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EROFS) | Some(libc::EDQUOT))
}

/// Finds the node at absolute `path` inside `snapshot` (`None` for `/`); `name` names the
/// snapshot in errors.
pub fn resolve_path(repo: &Repository, snapshot: &Snapshot, path: &str, name: &str) -> Result<Option<Node>> {
    plan::resolve(repo, &snapshot.tree, path, name)
}

/// Restores `snapshot` (named `name` in messages), or its `path` (absolute inside the
/// snapshot), into `target`.
pub fn restore(
    repo: &Repository,
    snapshot: &Snapshot,
    name: &str,
    path: Option<&str>,
    target: &Path,
    opts: &RestoreOptions,
    progress: &Progress,
) -> Result<RestoreOutcome> {
    let started = Instant::now();
    let base = path.map(|p| p.trim_end_matches('/')).filter(|p| !p.is_empty());
    // `SNAP:DIR` restores DIR's contents into the target, which then takes DIR's metadata.
    let mut target_node = None;
    let (top, into_dir) = match base {
        None => (Top::Tree(snapshot.tree), true),
        Some(p) => match plan::resolve(repo, &snapshot.tree, p, name)? {
            None => (Top::Tree(snapshot.tree), true),
            Some(node) if node.kind == NodeKind::Dir => {
                let tree = Top::Tree(node.subtree.expect("validated dir"));
                target_node = Some(node);
                (tree, true)
            }
            Some(node) => (Top::Node(Box::new(node)), false),
        },
    };
    let filter = Filter::new(&opts.include, &opts.exclude)?;
    let base_path = PathBuf::from(base.unwrap_or("/"));
    let mut phase = PhaseClock::new();
    let mut out_phases = Vec::new();
    // Loading the trees reads the repository too: SIGINT stops it, and the watchdog covers it.
    let cancel = opts.cancel.clone().unwrap_or_default();
    let loading = plan::Loading { cancel: cancel.clone(), ..Default::default() };
    let planned = AtomicBool::new(false);
    let (plan, plan_stalls) = std::thread::scope(|s| {
        let dog = s.spawn(|| {
            watch(opts.stall_timeout, progress, &planned, || loading.reads_done.load(Ordering::Relaxed), || "plan")
        });
        let plan = plan::build(repo, top, &base_path, &filter, opts.fetch_concurrency, &loading);
        planned.store(true, Ordering::Relaxed);
        dog.thread().unpark();
        (plan, dog.join().expect("watchdog panicked"))
    });
    let plan = plan?;
    phase.lap(&mut out_phases, "plan");
    let threads = opts.write_threads.max(1);
    let is_root = crate::platform::is_root();
    let empty = target_is_empty(target);
    if !opts.dry_run {
        std::fs::create_dir_all(target).map_err(|e| Error::io(target, "cannot create restore target", e))?;
    }
    // Into an empty target the directories are made alongside the pipeline (run_pipeline):
    // nothing there needs checking, and fetching and decoding need no directory. Otherwise
    // they come first, so the check below never looks through a symlink standing where a
    // directory belongs (it is replaced by a real directory here).
    let dirs_alongside = empty && !opts.dry_run;
    let dirs_made = if opts.dry_run || dirs_alongside {
        None
    } else {
        Some(create::directories(target, &plan, false, is_root, &AtomicU64::new(0), &cancel)?)
    };
    phase.lap(&mut out_phases, "dirs");
    let (states, meta_ok) = if empty {
        let states = plan
            .entries
            .iter()
            .map(|e| {
                if e.node.kind == NodeKind::File && e.link_of.is_none() {
                    FileState::Create { clear: false }
                } else {
                    FileState::NotFile
                }
            })
            .collect();
        (states, vec![false; plan.entries.len()])
    } else {
        check::check(target, &plan, repo.key(), opts.overwrite, threads, is_root)
    };
    let files_already_done = meta_ok.iter().filter(|&&ok| ok).count() as u64;
    let needed: Vec<Vec<check::NeededChunk>> =
        plan.entries.iter().zip(&states).map(|(e, s)| s.needed(&e.node)).collect();
    phase.lap(&mut out_phases, "check");
    let fetches = plan::fetches(repo, &plan, &needed, opts.max_memory);
    phase.lap(&mut out_phases, "schedule");

    let mut out = RestoreOutcome { phases: out_phases, stalls: plan_stalls, ..Default::default() };
    for ((e, st), needed) in plan.entries.iter().zip(&states).zip(&needed) {
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
    progress.total_bytes.store(out.bytes_total, Ordering::Relaxed);
    progress.total_files.store(out.files, Ordering::Relaxed);

    if opts.dry_run {
        let mut dry = DryRun::default();
        for (e, st) in plan.entries.iter().zip(&states) {
            match st {
                FileState::Create { .. } => dry.create.push(e.rel.clone()),
                FileState::InPlace { .. } => dry.update.push(e.rel.clone()),
                FileState::Complete => dry.unchanged += 1,
                _ => {}
            }
        }
        if opts.delete {
            dry.delete = extra_entries(target, &plan, into_dir, |rel| filter.selects(&base_path, rel));
        }
        out.bytes_fetched = fetches.fetch_bytes;
        out.dry_run = Some(dry);
        out.duration = started.elapsed();
        return Ok(out);
    }

    let sparse = match (opts.sparse, opts.preallocate) {
        (SparseMode::Never, _) => Sparse::Never,
        (_, true) => Sparse::Preallocate,
        (SparseMode::Always, false) => Sparse::Always,
        (SparseMode::Auto, false) if crate::platform::reserves_cheaply(target) => Sparse::ReserveLarge,
        (SparseMode::Auto, false) => Sparse::Auto,
    };
    let mut remaining: Vec<AtomicU32> = (0..plan.entries.len()).map(|_| AtomicU32::new(0)).collect();
    for dests in fetches.dests.values() {
        for d in dests {
            *remaining[d.entry as usize].get_mut() += 1;
        }
    }
    let sh = Shared {
        repo,
        plan: &plan,
        fetches: &fetches,
        states: &states,
        target,
        budget: Budget::new(opts.max_memory),
        buffers: buffers::BufferPool::new(opts.max_memory),
        failures: Failures { dests: &fetches.dests, entries: Mutex::new(BTreeMap::new()) },
        clocks: Default::default(),
        remaining,
        touched: (0..plan.entries.len()).map(|_| std::sync::OnceLock::new()).collect(),
        // Files the check found complete with their metadata need nothing more.
        meta_done: meta_ok.into_iter().map(AtomicBool::new).collect(),
        fetched: AtomicU64::new(0),
        written: AtomicU64::new(0),
        files_done: AtomicU64::new(files_already_done),
        cancel,
        fatal: Mutex::new(None),
        warnings: Mutex::new(Vec::new()),
        sparse,
        is_root,
        umask: crate::platform::umask(),
        acl_dirs: OnceLock::new(),
        dirs_ready: Gate::default(),
        created: AtomicU64::new(0),
    };
    for &(entry, id) in &fetches.missing {
        sh.failures.entry(entry, &format!("blob {} is not in the repository index", id.short()));
    }
    for &(entry, id) in &fetches.mismatched {
        sh.failures.entry(entry, &format!("a chunk's recorded length differs from blob {}", id.short()));
    }
    let base_done: u64 = out.bytes_in_place + out.bytes_zero;
    progress.done_bytes.store(base_done, Ordering::Relaxed);
    progress.done_files.store(files_already_done, Ordering::Relaxed);
    let create_took = Mutex::new(Duration::ZERO);
    // Directories (unless made above) and the entries without data, while fetching starts;
    // writers wait for it (Shared::dirs_ready).
    let create = || {
        let t = Instant::now();
        let _open = OpenOnDrop(&sh.dirs_ready); // even if this panics: no writer waits forever
        let made = match dirs_made {
            Some(made) => Ok(made),
            None => create::directories(target, &plan, true, is_root, &sh.created, &sh.cancel),
        };
        match made {
            Ok(made) => {
                for (entry, why) in &made.failed {
                    sh.failures.entry(*entry, why);
                }
                sh.acl_dirs.set(made.acl).expect("directories are made once");
                if let Err(e) = create_entries(&sh) {
                    sh.fail(e);
                }
            }
            Err(e) => sh.fail(e),
        }
        *create_took.lock().expect("create clock") = t.elapsed();
    };
    run_pipeline(&sh, opts, progress, base_done, &mut out.stalls, create);
    phase.lap(&mut out.phases, "pipeline");
    // The create stage ran alongside the pipeline: its own time is listed after it.
    out.phases.push(("(create, alongside)", create_took.into_inner().expect("create clock")));
    if let Some(e) = sh.fatal.lock().expect("fatal lock").take() {
        return Err(e);
    }
    if sh.cancelled() {
        return Err(Error::Interrupted);
    }
    out.bytes_written = sh.written.load(Ordering::Relaxed);
    out.bytes_fetched = sh.fetched.load(Ordering::Relaxed);
    out.profile = [sh.clocks[0].times(), sh.clocks[1].times(), sh.clocks[2].times()];

    let mut failed = std::mem::take(&mut *sh.failures.entries.lock().expect("failures lock"));
    for (&i, why) in failed.iter_mut() {
        let was_there = matches!(sh.states[i], FileState::InPlace { .. } | FileState::Create { clear: true });
        if was_there && sh.touched[i].get().is_none() {
            why.push_str("; what was already at this path is left as it was");
        }
    }
    finish_all(&sh, &failed, opts, progress);
    if opts.delete {
        for p in extra_entries(target, &plan, into_dir, |rel| filter.selects(&base_path, rel)) {
            match create::remove_any(&target.join(&p)) {
                Ok(()) => out.deleted += 1,
                Err(e) => sh.warn(p, format!("cannot delete: {e}")),
            }
        }
    }
    finish_dirs(&sh, &failed, threads);
    if let Some(node) = &target_node {
        if let Err(e) = finish::apply_to_path(target, node, is_root) {
            sh.warn(PathBuf::from("."), e.to_string());
        }
    }
    phase.lap(&mut out.phases, "finish");
    if opts.verify {
        let (checked, bad) = verify::verify(target, &plan, &states, &failed, repo.key(), threads);
        out.verified = checked;
        out.failed.extend(bad);
    }
    for (i, why) in failed {
        match plan.entries[i].node.kind {
            NodeKind::File => out.files -= 1,
            NodeKind::Dir => out.dirs -= 1,
            _ => out.others -= 1,
        }
        out.failed.push((plan.entries[i].rel.clone(), why));
    }
    out.failed.sort();
    out.warnings = std::mem::take(&mut *sh.warnings.lock().expect("warnings lock"));
    out.warnings.sort();
    if opts.verify {
        phase.lap(&mut out.phases, "verify");
    }
    out.duration = started.elapsed();
    Ok(out)
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
        {
            continue; // prepared by its first write (write.rs), or linked once its file is complete
        }
        if sh.cancelled() {
            return Ok(()); // the restore ends with Interrupted (or the error that stopped it)
        }
        sh.created.fetch_add(1, Ordering::Relaxed);
        let path = sh.target.join(&entry.rel);
        if let Err(e) = create::prepare(&path, entry, &sh.states[i], has_data, sh.sparse, sh.is_root) {
            if is_fatal(&e) {
                return Err(Error::io(path, "cannot create", e));
            }
            sh.failures.entry(i, &format!("cannot create: {e}"));
        }
    }
    Ok(())
}

/// Directories last, so their times stay as recorded: deepest first (a directory whose mode
/// locks out its owner does not stop its children's), each depth on `threads` threads.
fn finish_dirs(sh: &Shared<'_>, failed: &BTreeMap<usize, String>, threads: usize) {
    let mut by_depth: Vec<Vec<usize>> = Vec::new();
    for (i, entry) in sh.plan.entries.iter().enumerate() {
        if entry.node.kind == NodeKind::Dir && !failed.contains_key(&i) {
            let depth = entry.rel.components().count();
            if by_depth.len() <= depth {
                by_depth.resize_with(depth + 1, Vec::new);
            }
            by_depth[depth].push(i);
        }
    }
    for level in by_depth.iter().rev().filter(|l| !l.is_empty()) {
        in_parallel(level, threads, |_, &i| {
            let entry = &sh.plan.entries[i];
            if let Err(e) = finish::apply_to_path(&sh.target.join(&entry.rel), &entry.node, sh.is_root) {
                sh.warn(entry.rel.clone(), e.to_string());
            }
        });
    }
}

fn target_is_empty(target: &Path) -> bool {
    match std::fs::read_dir(target) {
        Ok(mut rd) => rd.next().is_none(),
        Err(_) => true,
    }
}

/// Hard links, then metadata of every file and other entry the write stage did not finish;
/// failed files are removed so none is left with wrong content.
fn finish_all(sh: &Shared<'_>, failed: &BTreeMap<usize, String>, opts: &RestoreOptions, progress: &Progress) {
    let plan = sh.plan;
    in_parallel(&plan.entries, opts.write_threads, |i, entry| {
        if entry.node.kind == NodeKind::Dir || entry.link_of.is_some() {
            return;
        }
        let path = sh.target.join(&entry.rel);
        if failed.contains_key(&i) {
            // A file written in part is removed: a file is either exact or absent. One that
            // nothing was written to still holds what it held before.
            if entry.node.kind == NodeKind::File
                && matches!(sh.states[i], FileState::Create { .. } | FileState::InPlace { .. })
                && sh.touched[i].get().is_some()
            {
                let _ = std::fs::remove_file(&path);
            }
            return;
        }
        if sh.meta_done[i].load(Ordering::Acquire) || sh.states[i] == FileState::Skip {
            return;
        }
        if let Err(e) = finish::apply_to_path(&path, &entry.node, sh.is_root) {
            sh.warn(entry.rel.clone(), e.to_string());
        }
        if entry.node.kind == NodeKind::File {
            progress.done_files.fetch_add(1, Ordering::Relaxed);
        }
    });
    for (i, entry) in plan.entries.iter().enumerate() {
        let Some(first) = entry.link_of else { continue };
        if let Some(why) = failed.get(&first) {
            sh.failures.entry(i, &format!("its hard-link target failed: {why}"));
            continue;
        }
        if let Err(e) = create::hard_link(&sh.target.join(&plan.entries[first].rel), &sh.target.join(&entry.rel)) {
            sh.warn(entry.rel.clone(), format!("cannot create hard link: {e}"));
        }
    }
}

/// Entries in restored directories that the restore does not contain and that `selected`
/// (given their path relative to the target) says the restore's filters cover.
fn extra_entries(target: &Path, plan: &Plan, include_root: bool, selected: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
    let mut children: HashMap<PathBuf, HashSet<OsString>> = HashMap::new();
    if include_root {
        children.entry(PathBuf::new()).or_default();
    }
    for e in &plan.entries {
        if e.node.kind == NodeKind::Dir {
            children.entry(e.rel.clone()).or_default();
        }
        let parent = e.rel.parent().map(Path::to_path_buf).unwrap_or_default();
        if let Some(name) = e.rel.file_name() {
            children.entry(parent).or_default().insert(name.to_os_string());
        }
    }
    let mut out = Vec::new();
    for (dir, names) in &children {
        let Ok(rd) = std::fs::read_dir(target.join(dir)) else {
            continue;
        };
        for ent in rd.flatten() {
            let rel = dir.join(ent.file_name());
            if !names.contains(&ent.file_name()) && selected(&rel) {
                out.push(rel);
            }
        }
    }
    out.sort();
    out
}

/// Starts a scoped thread named `cairn-NAME` (so profilers and `top -H` show the stages).
fn spawn_named<'scope, F>(
    s: &'scope std::thread::Scope<'scope, '_>,
    name: &str,
    f: F,
) -> std::thread::ScopedJoinHandle<'scope, ()>
where
    F: FnOnce() + Send + 'scope,
{
    std::thread::Builder::new().name(format!("cairn-{name}")).spawn_scoped(s, f).expect("cannot start a restore thread")
}

/// Runs fetch, decode and write, with `create` (which opens `sh.dirs_ready`) on a thread of
/// its own alongside.
fn run_pipeline(
    sh: &Shared<'_>,
    opts: &RestoreOptions,
    progress: &Progress,
    base_done: u64,
    stalls: &mut Vec<String>,
    create: impl FnOnce() + Send,
) {
    if sh.fetches.reads.is_empty() {
        create();
        return;
    }
    let fetchers = opts.fetch_concurrency.max(1);
    let decoders = opts.decode_threads.max(1);
    let writers = opts.write_threads.max(1);
    let finished = AtomicBool::new(false);
    std::thread::scope(|s| {
        let (reads_tx, reads_rx) = bounded(fetchers);
        let (fetched_tx, fetched_rx) = bounded(decoders * 4);
        // One queue per writer: a file's chunks always go to the same writer (see decode.rs).
        let (to_writers, writer_queues): (Vec<_>, Vec<_>) = (0..writers).map(|_| bounded(4)).unzip();
        let mut workers = vec![spawn_named(s, "create", create)];
        for _ in 0..fetchers {
            let (rx, tx) = (reads_rx.clone(), fetched_tx.clone());
            workers.push(spawn_named(s, "fetch", move || fetch::fetch_worker(sh, rx, tx)));
        }
        for _ in 0..decoders {
            let (rx, txs) = (fetched_rx.clone(), to_writers.clone());
            workers.push(spawn_named(s, "decode", move || decode::decode_worker(sh, rx, txs)));
        }
        for rx in writer_queues {
            workers.push(spawn_named(s, "write", move || write::write_worker(sh, rx)));
        }
        drop((reads_rx, fetched_tx, fetched_rx, to_writers));
        let watchdog = s.spawn(|| watchdog(sh, opts.stall_timeout, progress, base_done, &finished));
        for read in &sh.fetches.reads {
            if sh.cancelled() || reads_tx.send(read).is_err() {
                break;
            }
        }
        drop(reads_tx);
        // A worker's panic is passed on only once the watchdog has stopped: the scope would
        // otherwise wait for it forever.
        let mut panicked = None;
        for w in workers {
            if let Err(p) = w.join() {
                panicked.get_or_insert(p);
            }
        }
        finished.store(true, Ordering::Relaxed);
        watchdog.thread().unpark();
        stalls.extend(watchdog.join().expect("watchdog panicked"));
        if let Some(p) = panicked {
            std::panic::resume_unwind(p);
        }
    });
}

/// Publishes progress and reports a stall (no bytes moved for `timeout`), naming the stage
/// that is waiting.
fn watchdog(
    sh: &Shared<'_>,
    timeout: Duration,
    progress: &Progress,
    base_done: u64,
    finished: &AtomicBool,
) -> Vec<String> {
    let stalls = watch(
        timeout,
        progress,
        finished,
        || {
            let now = (sh.fetched.load(Ordering::Relaxed), sh.written.load(Ordering::Relaxed));
            progress.fetched_bytes.store(now.0, Ordering::Relaxed);
            progress.done_bytes.store(base_done + now.1, Ordering::Relaxed);
            progress.done_files.store(sh.files_done.load(Ordering::Relaxed), Ordering::Relaxed);
            (now, sh.created.load(Ordering::Relaxed))
        },
        // Until the create stage is done the writers wait for it, and the fetchers for them.
        || if sh.dirs_ready.is_open() { profile::stalled_stage(&sh.clocks) } else { "create" },
    );
    progress.done_bytes.store(base_done + sh.written.load(Ordering::Relaxed), Ordering::Relaxed);
    progress.fetched_bytes.store(sh.fetched.load(Ordering::Relaxed), Ordering::Relaxed);
    stalls
}

/// Until `finished` (the caller unparks this thread after setting it, so it stops at once),
/// samples a measure of progress every tick; when it stays the same for `timeout`, reports a
/// stall naming the stage `stage()` says is waiting.
fn watch<T: PartialEq>(
    timeout: Duration,
    progress: &Progress,
    finished: &AtomicBool,
    mut sample: impl FnMut() -> T,
    stage: impl Fn() -> &'static str,
) -> Vec<String> {
    let tick = Duration::from_millis(100).min(timeout);
    let mut last = None;
    let mut since = Instant::now();
    let mut reported = false;
    let mut stalls = Vec::new();
    while !finished.load(Ordering::Relaxed) {
        std::thread::park_timeout(tick);
        let now = Some(sample());
        if now != last {
            last = now;
            since = Instant::now();
            reported = false;
            *progress.stall.lock().expect("stall lock") = None;
        } else if !reported && since.elapsed() >= timeout {
            let msg = format!("no progress for {} s; waiting in the {} stage", timeout.as_secs_f64().round(), stage());
            *progress.stall.lock().expect("stall lock") = Some(msg.clone());
            stalls.push(msg);
            reported = true;
        }
    }
    stalls
}
