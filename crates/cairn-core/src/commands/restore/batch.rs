//! One batch of a restore: `dirs → compare → schedule → pipeline → finish`, over the entries
//! the plan stage handed on; and what the batches hand each other (the directories with a
//! default ACL, the directories and hard-link targets that failed, the counts so far).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::options::{DryRun, Progress, RestoreOptions, RestoreOutcome, Sparse};
use super::plan::{self, Filter, Gap};
use super::shared::{Failures, Gate, Shared};
use super::types::Plan;
use super::watchdog::Base;
use super::{compare, create, delete, finish, local, pipeline, verify, writers};
use crate::engine::profile::{add_phase, PhaseClock};
use crate::engine::read::{link_gap, FetchTuner, Reader, MAX_READ};
use crate::engine::repository::Repository;
use crate::error::{Error, Result};
use cairn_format::id::BlobId;
use cairn_format::tree::NodeKind;

/// A restore in progress: what it was asked, and what its batches hand each other.
pub struct Run<'a> {
    pub repo: &'a Repository,
    pub target: &'a Path,
    pub opts: &'a RestoreOptions,
    pub progress: &'a Progress,
    pub filter: &'a Filter,
    /// The restore's path inside the snapshot (for the filters `--delete` respects).
    pub base_path: &'a Path,
    /// The path inside the snapshot asked for (`SNAP:PATH`), if any (where the local-data
    /// stage finds the source).
    pub snapshot_path: Option<&'a Path>,
    /// Whether the restore's entries go into the target (so `--delete` looks through it).
    pub into_dir: bool,
    /// The target was empty when the restore began: nothing to compare.
    pub empty: bool,
    pub is_root: bool,
    pub threads: usize,
    pub cancel: Arc<AtomicBool>,
    /// The share of `--max-memory` for the data in flight ([`plan::BatchLimit::data_budget`]).
    pub data_budget: u64,
    /// Whether the first batch has begun (and made the target).
    pub started: bool,
    /// Directories (relative to the target) with a default ACL.
    pub acl: HashSet<PathBuf>,
    /// Directories that could not be made: their metadata is not set.
    pub failed_dirs: HashSet<PathBuf>,
    /// Hard-linked files (their first entry) that failed, with why: their links fail too.
    pub failed_links: HashMap<PathBuf, String>,
    /// Bytes done and fetched by the batches before.
    pub base: Base,
    /// The fetch concurrency's controller as the batch before left it (auto-tuned only).
    pub tuner: Option<FetchTuner>,
    /// The writers' controller as the batch before left it (auto-tuned only).
    pub writers: Option<writers::Controller>,
    /// Stored bytes per second the batch before fetched (for the coalescing gap).
    pub fetch_rate: Option<f64>,
    /// Bytes per second the local-data stage copied, and the fetch pipeline wrote, in the
    /// last batch that measured each (`local::cost`: which ranges are worth copying).
    pub local_rate: Option<f64>,
    pub repository_rate: Option<f64>,
    /// The share of the chunks the last batch that copied local data copied whose copy failed
    /// (a read each, at most): how many small reads the next such batch plans for.
    pub late_share: Option<f64>,
    /// What the batches did.
    pub out: RestoreOutcome,
    /// Set by the plan thread once its walk is over (no tree is read after it).
    pub walk_done: &'a AtomicBool,
}

impl Run<'_> {
    /// Restores one batch.
    pub fn batch(&mut self, plan: &Plan) -> Result<()> {
        let (opts, target, is_root, threads) = (self.opts, self.target, self.is_root, self.threads);
        let mut phase = PhaseClock(Instant::now());
        let mut part = RestoreOutcome { batches: 1, ..Default::default() };
        if !self.started {
            self.started = true;
            // Made once the plan has its first batch: a plan that fails leaves no target.
            if !opts.dry_run {
                std::fs::create_dir_all(target).map_err(|e| Error::io(target, "cannot create restore target", e))?;
                if create::has_default_acl(target) {
                    self.acl.insert(PathBuf::new());
                }
            }
        }
        // Into an empty target the directories are made alongside the pipeline (create::run):
        // nothing there needs comparing, and fetching and decoding need no directory. Otherwise
        // they come first, so the compare stage never looks through a symlink standing where a
        // directory belongs (it is replaced by a real directory here).
        let dirs_made = if opts.dry_run || self.empty {
            None
        } else {
            let acl = std::mem::take(&mut self.acl);
            Some(create::directories(target, plan, false, is_root, acl, &AtomicU64::new(0), &self.cancel)?)
        };
        phase.lap(&mut part.phases, "dirs");
        let (states, meta_ok) = if self.empty {
            compare::fresh(plan)
        } else {
            compare::compare(target, plan, self.repo.key(), opts.overwrite, threads, is_root)
        };
        let files_already_done = meta_ok.iter().filter(|&&ok| ok).count() as u64;
        let needed: Vec<_> = plan.entries.iter().zip(&states).map(|(e, s)| s.needed(&e.node)).collect();
        phase.lap(&mut part.phases, "compare");
        if opts.fetch_auto && self.tuner.is_none() {
            // The first batch starts where the round trip of the open says it should.
            let round_trip = self.repo.link().latency();
            self.tuner = Some(FetchTuner::for_link(opts.fetch_concurrency, round_trip, self.data_budget));
        }
        let in_flight = self.tuner.as_ref().map_or(opts.fetch_concurrency, FetchTuner::limit);
        // Chunks already on this machine (local/): found now, where copying them is cheaper than
        // fetching them, and copied beside the fetches of the rest.
        let source = local::Source::locate(&opts.local_data, self.snapshot_path, self.into_dir);
        let costs = local::cost::Costs {
            local_rate: self.local_rate,
            repository_rate: self.repository_rate,
            latency: self.repo.link().latency(),
            in_flight,
            forced: opts.local_cost,
            failed: self.late_share,
        };
        let places = local::Places { target, empty: self.empty, source, costs };
        let scanned = local::scan(self.repo, plan, &states, &needed, places, opts)?;
        phase.lap(&mut part.phases, "local scan");
        // Where round trips are dear, reads go through the gaps between wanted chunks; not
        // through those local data supplies, beyond a share of what is fetched.
        let link = link_gap(self.repo, self.fetch_rate, in_flight);
        part.read_gaps.push(link);
        let gap = if scanned.local.is_empty() { Gap::Bytes(link.gap) } else { Gap::Within(link.gap) };
        let fetches = plan::fetches(self.repo, plan, &needed, &scanned.local, self.data_budget, gap);
        let (copying, copying_bytes) = scanned.chunks();
        if let Some(tuner) = &mut self.tuner {
            // Many small reads (the changed chunks between copied ones) need many in flight: the
            // planned ones, and the reads of the copied chunks the copy will find changed (the
            // share the batch before found, a tenth at first), counted as a read each: at most
            // that many (a copy thread's group of them is joined per pack, `plan::late_reads`).
            let late = (copying as f64 * self.late_share.unwrap_or(0.1)) as usize;
            let late_bytes = copying_bytes / copying.max(1) as u64 * late as u64;
            let (reads, bytes) = (fetches.reads.len() + late, fetches.fetch_bytes + late_bytes);
            tuner.fit_reads(self.repo.link().latency(), reads, bytes);
        }
        phase.lap(&mut part.phases, "schedule");

        let counted = RestoreOutcome::counted(plan, &states, &needed);
        let progress = self.progress;
        progress.total_bytes.fetch_add(counted.bytes_total, Ordering::Relaxed);
        progress.total_files.fetch_add(counted.files, Ordering::Relaxed);
        part.absorb(counted);
        if opts.dry_run {
            [part.bytes_reused_source, part.bytes_reused_target] = scanned.dry_run;
            let dry = self.out.dry_run.get_or_insert_with(DryRun::default);
            dry.add(DryRun::listed(plan, &states));
            if opts.delete {
                let selected = |rel: &Path| self.filter.selects(self.base_path, rel);
                dry.delete.extend(delete::extra_entries(target, &plan.closed, self.into_dir, selected));
            }
            part.bytes_fetched = fetches.fetch_bytes;
            self.out.absorb(part);
            return Ok(());
        }

        // The copy's bytes count as they are written (`Shared::written`).
        let base_done = self.base.bytes + part.bytes_in_place + part.bytes_zero;
        let files_before = progress.done_files.load(Ordering::Relaxed);
        // The last batch's reads end the restore's reading (the walk ended before it).
        let walk_done = self.walk_done;
        let reads_over = || {
            if walk_done.load(Ordering::Acquire) {
                progress.reads_over.raise();
            }
        };
        let sh = Shared {
            plan,
            fetches: &fetches,
            states: &states,
            target,
            reader: Reader::new(self.repo, self.data_budget, self.cancel.clone())
                .when_done(&reads_over)
                .auto_tuned(opts.fetch_auto)
                .tuned_from(self.tuner.take()),
            failures: Failures::new(&fetches),
            write_clock: Default::default(),
            remaining: super::shared::chunks_to_write(plan, &fetches),
            touched: plan.entries.iter().map(|_| OnceLock::new()).collect(),
            // Files the compare stage found complete with their metadata need nothing more.
            meta_done: meta_ok.into_iter().map(AtomicBool::new).collect(),
            written: AtomicU64::new(0),
            files_done: AtomicU64::new(files_before + files_already_done),
            cancel: self.cancel.clone(),
            fatal: Mutex::new(None),
            warnings: Mutex::new(Vec::new()),
            sparse: Sparse::choose(opts, target),
            guard: opts.guard.as_ref().map(|g| &*g.0),
            is_root,
            umask: crate::engine::platform::umask(),
            acl_dirs: OnceLock::new(),
            new_owners: Default::default(),
            dirs_ready: Gate::default(),
            created: AtomicU64::new(0),
            write_latency: opts.write_latency,
            late: Default::default(),
            copied: Default::default(),
            began: Instant::now(),
            planned_span: AtomicU64::new(0),
            planned_bytes: AtomicU64::new(0),
            late_span: AtomicU64::new(0),
        };
        if !scanned.copies() {
            sh.late.close();
        }
        progress.done_bytes.store(base_done, Ordering::Relaxed);
        progress.done_files.store(files_before + files_already_done, Ordering::Relaxed);
        let create_took = Mutex::new(Duration::ZERO);
        // Directories (unless made above) and the entries without data, while fetching starts;
        // writers wait for it (Shared::dirs_ready).
        let acl = std::mem::take(&mut self.acl);
        let create = || *create_took.lock().expect("create clock") = create::run(&sh, dirs_made, acl);
        let base = Base { bytes: base_done, fetched: self.base.fetched };
        if opts.write_auto && self.writers.is_none() {
            let start = opts.write_threads.max(1);
            self.writers = Some(writers::Controller::new(start, writers::most_writers(start)));
        }
        // The copy, beside the fetches; the chunks whose copy failed are fetched in the same
        // pipeline, as the copy finds them (`Shared::reads`).
        let copy_took = Mutex::new(None);
        let (repo, budget) = (self.repo, self.data_budget);
        // The changed chunks a copy thread found are read as the batch's planned reads are:
        // one read of several ranges per pack (`read::join_parts`), not one read each.
        let failed_chunks = AtomicUsize::new(0);
        let copy = scanned.copies().then_some(|| {
            // Dropped when the copy ends, however it ends: the feed then knows no more come.
            let Some(tx) = sh.late.sender() else { return };
            let fail = |entry: usize, why: &str| sh.failures.entry(entry, why);
            let fetch = |failed: &[(BlobId, u32)]| {
                failed_chunks.fetch_add(failed.len(), Ordering::Relaxed);
                sh.late.add(&tx, plan::late_reads(repo, &fetches, failed, budget, gap, fail));
            };
            let took = scanned.copy(&sh, &fetch);
            *copy_took.lock().expect("copy clock") = Some((took, sh.began.elapsed()));
        });
        let writers = self.writers.as_mut();
        part.write_tuning = pipeline::run(&sh, opts, progress, base, &mut part.stalls, writers, create, copy);
        let piped = sh.began.elapsed();
        phase.lap(&mut part.phases, "pipeline");
        // The create stage ran alongside the pipeline: its own time is listed after it.
        add_phase(&mut part.phases, "(create, alongside)", create_took.into_inner().expect("create clock"));
        if let Some(e) = sh.fatal.lock().expect("fatal lock").take() {
            return Err(e);
        }
        if sh.cancelled() {
            return Err(Error::Interrupted);
        }
        let written = sh.written.load(Ordering::Relaxed);
        part.bytes_written = written;
        [part.bytes_reused_source, part.bytes_reused_target] = sh.copied.each_ref().map(|c| c.load(Ordering::Relaxed));
        part.bytes_fetched = sh.reader.fetched_bytes();
        let [fetch, decode] = sh.reader.times();
        part.profile = [fetch, decode, sh.write_clock.times()];
        part.fetch_tuning = sh.reader.tuning_log();
        (part.fetch_threads, part.fetch_in_flight_peak) = sh.reader.fetch_threads_and_peak();
        self.tuner = sh.reader.tuner();
        if part.bytes_fetched >= MAX_READ {
            // Enough bytes to say what the link (or the stages after it) carries.
            self.fetch_rate = Some(part.bytes_fetched as f64 / piped.as_secs_f64().max(1e-3));
        }
        // Each side's rate over its own time (local::cost).
        let copied = part.bytes_reused_source + part.bytes_reused_target;
        if copying > 0 {
            self.late_share = Some(failed_chunks.into_inner() as f64 / copying as f64);
        }
        if let Some((took, ended)) = copy_took.into_inner().expect("copy clock") {
            // The copy's time, and how long after its end the last of its failed chunks was
            // handed to the writers (counted whether or not planned reads were still going: the
            // feed hands the failed chunks' reads out first). Where each request is dear (a
            // server on these cores) that wait is most of the copy's cost.
            let waited = Duration::from_nanos(sh.late_span.load(Ordering::Relaxed)).saturating_sub(ended);
            if let Some(rate) = local::cost::rate(copied, took + waited) {
                self.local_rate = Some(rate);
            }
        }
        let span = Duration::from_nanos(sh.planned_span.load(Ordering::Relaxed));
        if let Some(rate) = local::cost::rate(sh.planned_bytes.load(Ordering::Relaxed), span) {
            self.repository_rate = Some(rate);
        }

        let failed = sh.take_failures();
        finish::finish_all(&sh, &failed, &self.failed_links, threads, progress);
        for (&i, why) in &failed {
            let e = &plan.entries[i];
            match e.node.kind {
                NodeKind::Dir => {
                    self.failed_dirs.insert(e.rel.clone());
                }
                NodeKind::File if e.node.links > 1 && e.link_of.is_none() => {
                    self.failed_links.insert(e.rel.clone(), why.clone());
                }
                _ => {}
            }
        }
        if opts.delete {
            let selected = |rel: &Path| self.filter.selects(self.base_path, rel);
            part.deleted = delete::delete_extra(&sh, self.into_dir, selected);
        }
        finish::finish_dirs(&sh, &self.failed_dirs, threads);
        phase.lap(&mut part.phases, "finish");
        if opts.verify {
            let (checked, bad) = verify::verify(target, plan, &states, &failed, self.repo.key(), threads);
            part.verified = checked;
            part.failed.extend(bad);
            phase.lap(&mut part.phases, "verify");
        }
        part.add_failed(plan, failed);
        part.warnings = std::mem::take(&mut *sh.warnings.lock().expect("warnings lock"));
        self.acl = sh.acl_dirs.into_inner().unwrap_or_default();
        self.base = Base { bytes: base_done + written, fetched: self.base.fetched + part.bytes_fetched };
        self.out.absorb(part);
        Ok(())
    }
}
