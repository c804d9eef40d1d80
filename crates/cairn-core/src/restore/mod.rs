//! Restore: `plan → compare → create → [read path: fetch → decode] → write → finish`, one file
//! per stage or job; this file sequences them.
//!
//! The plan lists the entries; the compare stage compares an existing target with them so only
//! missing or different chunks are fetched. Then the pipeline runs (`pipeline.rs`): the read
//! path's fetch and decode workers ([`crate::read`]) and the write workers, joined by bounded
//! channels and a byte budget, with the create stage alongside; the write workers finish each
//! file's metadata as its last chunk lands. Directories get their metadata last, deepest first.
//!
//! Besides the stages: `options.rs` (what a restore is asked and reports), `types.rs` (what the
//! stages hand each other), `shared.rs` (the pipeline's shared state), `fsops.rs` and `dirs.rs`
//! (file-system calls), `meta.rs` (metadata), `watchdog.rs`, `delete.rs`, `verify.rs`, `dump.rs`.

mod compare;
mod create;
mod delete;
mod dirs;
mod dump;
mod finish;
mod fsops;
mod meta;
mod options;
mod pipeline;
mod plan;
mod shared;
mod types;
mod verify;
mod watchdog;
mod write;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub use crate::profile::StageTimes;
pub use dump::{dump, DumpStats};
pub use options::{
    DryRun, Overwrite, Progress, RestoreOptions, RestoreOutcome, Sparse, SparseMode, DEFAULT_MAX_MEMORY, RESERVE_MIN,
    STAGE_NAMES,
};
pub use plan::Filter;
#[doc(hidden)]
pub use types::chunk_offsets;
pub use types::Plan; // for cairn_core::fuzzing (fuzz targets and property tests)

use crate::error::{Error, Result};
use crate::profile::StageClock;
use crate::read::Reader;
use crate::repository::Repository;
use crate::snapshot::Snapshot;
use shared::{Failures, Gate, Shared};

/// Measures consecutive phases of a restore.
struct PhaseClock(Instant);

impl PhaseClock {
    fn lap(&mut self, phases: &mut Vec<(&'static str, Duration)>, name: &'static str) {
        phases.push((name, self.0.elapsed()));
        self.0 = Instant::now();
    }
}

/// Restores `snapshot` (named `name` in messages), or its `path` (absolute inside the
/// snapshot), into `target`.
pub fn restore(
    repo: &Repository,
    snapshot: &Snapshot,
    name: &str,
    path: Option<&Path>,
    target: &Path,
    opts: &RestoreOptions,
    progress: &Progress,
) -> Result<RestoreOutcome> {
    let started = Instant::now();
    let base = path.and_then(crate::trees::below_root);
    let (top, into_dir, target_node) = plan::start(repo, snapshot, name, base)?;
    let filter = Filter::new(&opts.include, &opts.exclude)?;
    let base_path = base.unwrap_or(Path::new("/")).to_path_buf();
    let mut phase = PhaseClock(Instant::now());
    let mut phases = Vec::new();
    // Loading the trees reads the repository too: SIGINT stops it, and the watchdog covers it.
    let cancel = opts.cancel.clone().unwrap_or_default();
    let loading = crate::trees::Loading { cancel: cancel.clone(), ..Default::default() };
    let (plan, plan_stalls) = watchdog::while_running(
        opts.stall_timeout,
        progress,
        || loading.reads_done.load(Ordering::Relaxed),
        || "plan",
        || plan::build(repo, top, &base_path, &filter, opts.fetch_concurrency, &loading),
    );
    let plan = plan?;
    phase.lap(&mut phases, "plan");
    let threads = opts.write_threads.max(1);
    let is_root = crate::platform::is_root();
    let empty = fsops::target_is_empty(target);
    if !opts.dry_run {
        std::fs::create_dir_all(target).map_err(|e| Error::io(target, "cannot create restore target", e))?;
    }
    // Into an empty target the directories are made alongside the pipeline (create::run):
    // nothing there needs comparing, and fetching and decoding need no directory. Otherwise
    // they come first, so the compare stage never looks through a symlink standing where a
    // directory belongs (it is replaced by a real directory here).
    let dirs_made = if opts.dry_run || empty {
        None
    } else {
        Some(create::directories(target, &plan, false, is_root, &AtomicU64::new(0), &cancel)?)
    };
    phase.lap(&mut phases, "dirs");
    let (states, meta_ok) = if empty {
        compare::fresh(&plan)
    } else {
        compare::compare(target, &plan, repo.key(), opts.overwrite, threads, is_root)
    };
    let files_already_done = meta_ok.iter().filter(|&&ok| ok).count() as u64;
    let needed: Vec<_> = plan.entries.iter().zip(&states).map(|(e, s)| s.needed(&e.node)).collect();
    phase.lap(&mut phases, "compare");
    let fetches = plan::fetches(repo, &plan, &needed, opts.max_memory);
    phase.lap(&mut phases, "schedule");

    let mut out = RestoreOutcome { phases, stalls: plan_stalls, ..RestoreOutcome::counted(&plan, &states, &needed) };
    progress.total_bytes.store(out.bytes_total, Ordering::Relaxed);
    progress.total_files.store(out.files, Ordering::Relaxed);
    let selected = |rel: &Path| filter.selects(&base_path, rel);
    if opts.dry_run {
        let mut dry = DryRun::listed(&plan, &states);
        if opts.delete {
            dry.delete = delete::extra_entries(target, &plan, into_dir, selected);
        }
        out.bytes_fetched = fetches.fetch_bytes;
        out.dry_run = Some(dry);
        out.duration = started.elapsed();
        return Ok(out);
    }

    let sh = Shared {
        plan: &plan,
        fetches: &fetches,
        states: &states,
        target,
        reader: Reader::new(repo, opts.max_memory, cancel.clone()).auto_tuned(opts.fetch_auto),
        failures: Failures::new(&fetches),
        write_clock: StageClock::default(),
        remaining: shared::chunks_to_write(&plan, &fetches),
        touched: (0..plan.entries.len()).map(|_| OnceLock::new()).collect(),
        // Files the compare stage found complete with their metadata need nothing more.
        meta_done: meta_ok.into_iter().map(AtomicBool::new).collect(),
        written: AtomicU64::new(0),
        files_done: AtomicU64::new(files_already_done),
        cancel,
        fatal: Mutex::new(None),
        warnings: Mutex::new(Vec::new()),
        sparse: Sparse::choose(opts, target),
        is_root,
        umask: crate::platform::umask(),
        acl_dirs: OnceLock::new(),
        dirs_ready: Gate::default(),
        created: AtomicU64::new(0),
    };
    let base_done: u64 = out.bytes_in_place + out.bytes_zero;
    progress.done_bytes.store(base_done, Ordering::Relaxed);
    progress.done_files.store(files_already_done, Ordering::Relaxed);
    let create_took = Mutex::new(Duration::ZERO);
    // Directories (unless made above) and the entries without data, while fetching starts;
    // writers wait for it (Shared::dirs_ready).
    let create = || *create_took.lock().expect("create clock") = create::run(&sh, dirs_made);
    pipeline::run(&sh, opts, progress, base_done, &mut out.stalls, create);
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
    out.bytes_fetched = sh.reader.fetched_bytes();
    let [fetch, decode] = sh.reader.times();
    out.profile = [fetch, decode, sh.write_clock.times()];
    out.fetch_tuning = sh.reader.tuning_log();

    let failed = sh.take_failures();
    finish::finish_all(&sh, &failed, opts.write_threads, progress);
    if opts.delete {
        out.deleted = delete::delete_extra(&sh, into_dir, selected);
    }
    finish::finish_dirs(&sh, &failed, threads);
    if let Some(node) = &target_node {
        if let Err(e) = meta::apply_to_path(target, node, is_root) {
            sh.warn(PathBuf::from("."), e.to_string());
        }
    }
    phase.lap(&mut out.phases, "finish");
    if opts.verify {
        let (checked, bad) = verify::verify(target, &plan, &states, &failed, repo.key(), threads);
        out.verified = checked;
        out.failed.extend(bad);
    }
    out.add_failed(&plan, failed);
    out.failed.sort();
    out.warnings = std::mem::take(&mut *sh.warnings.lock().expect("warnings lock"));
    out.warnings.sort();
    if opts.verify {
        phase.lap(&mut out.phases, "verify");
    }
    out.duration = started.elapsed();
    Ok(out)
}
