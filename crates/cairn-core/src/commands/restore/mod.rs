//! Restore: `plan → compare → create → [read path: fetch → decode] → write → finish`, one file
//! per stage or job; this file sequences them.
//!
//! The plan lists the entries; the compare stage compares an existing target with them so only
//! missing or different chunks are fetched. Then the pipeline runs (`pipeline.rs`): the read
//! path's fetch and decode workers ([`crate::engine::read`]) and the write workers, joined by bounded
//! channels and a byte budget, with the create stage alongside; the write workers finish each
//! file's metadata as its last chunk lands. Directories get their metadata last, deepest first.
//!
//! The plan stage hands its entries on in batches (`batch.rs` runs one: dirs, compare,
//! schedule, pipeline, finish), so a restore holds one batch in memory, not the whole tree.
//!
//! Besides the stages: `options.rs` (what a restore is asked and reports), `types.rs` (what the
//! stages hand each other), `shared.rs` (the pipeline's shared state), `fsops.rs` and `dirs.rs`
//! (file-system calls), `meta.rs` (metadata), `watchdog.rs`, `delete.rs`, `verify.rs`, `dump.rs`.

mod batch;
mod compare;
mod create;
mod delete;
mod dirs;
mod finish;
mod fsops;
mod local;
mod meta;
mod options;
mod pipeline;
pub(crate) mod plan;
mod shared;
pub(crate) mod types;
mod verify;
mod watchdog;
mod write;
mod writers;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

pub use crate::engine::profile::StageTimes;
pub use options::Step as WriteStep;
pub use options::{
    DryRun, Guard, LocalCost, LocalData, Overwrite, Progress, RestoreOptions, RestoreOutcome, Sparse, SparseMode,
    WriteGuard, DEFAULT_MAX_MEMORY, RESERVE_MIN, STAGE_NAMES,
};
pub use plan::Filter;
pub use types::Plan;

use crate::engine::open::{self, OpenOptions, Opened};
use crate::engine::preload::Preload;
use crate::engine::repository::Repository;
use crate::engine::select::SnapshotFilter;
use crate::engine::storage::Storage;
use crate::error::{Error, Result};
use batch::Run;
use cairn_format::id::SnapshotId;
use cairn_format::lock::LockKind;
use cairn_format::snapshot::Snapshot;
use std::sync::Arc;

/// Bytes of whole tree packs a restore within `max_memory` holds at its start: what the start
/// hint may read while the repository opens ([`crate::engine::preload::Preload::with_tree_packs`]).
pub fn tree_pack_share(max_memory: u64) -> u64 {
    plan::BatchLimit::for_memory(max_memory).tree_packs()
}

/// Opens the repository at `storage` and restores the snapshot `name` (`latest` or an ID
/// prefix, as `filter` chooses it: [`SnapshotFilter::find`]), or `path` inside it, into
/// `target`, as `cairn restore` does. The index, the snapshot
/// and the tree packs the start hint names (within the walk's share of the memory) are read
/// beside the lock and the key's round trips; the restore runs while the shared lock is being
/// taken (if it cannot be had, the restore stops — what it wrote by then is verified data in the
/// target, as after an interrupted restore — and the lock's error is returned); once the restore
/// reads nothing more from the repository, the lock is let go beside its last writes
/// (docs/DESIGN.md, "Starting at once"). The restore's own outcome comes second, after the
/// open's, so a front end can tell an interrupted restore from a failed open.
#[allow(clippy::too_many_arguments)]
pub fn open_and_restore(
    storage: Arc<dyn Storage>,
    password: &[u8],
    name: &str,
    filter: &SnapshotFilter,
    path: Option<&Path>,
    target: &Path,
    opts: &RestoreOptions,
    open: OpenOptions<'_>,
    progress: &Progress,
) -> Result<(Opened, SnapshotId, Result<RestoreOutcome>)> {
    let stop = opts.cancel.clone();
    let open = OpenOptions {
        lock: Some(LockKind::Shared),
        preload: Preload::snapshot(name, true)
            .with_tree_packs(tree_pack_share(opts.max_memory))
            .with_max_memory(opts.max_memory),
        stop: stop.as_deref(),
        release: Some(&progress.reads_over),
        ..open
    };
    let (opened, (id, result)) = open::open_then(storage, password, open, |repo| -> Result<_> {
        repo.load_index_within(Some(opts.max_memory))?;
        let (id, snap) = filter.find(repo, name)?;
        let restored = restore(repo, &snap, &id.short(), path, target, opts, progress);
        Ok((id, restored.map_err(|e| filter.explain_not_found(repo, name, e))))
    })?;
    Ok((opened, id, result))
}

/// Restores `snapshot` (named `name` in messages), or its `path` (absolute inside the
/// snapshot), into `target`.
///
/// The plan stage walks the snapshot on a thread of its own and hands its entries on in
/// batches within a share of `--max-memory` ([`plan::BatchLimit`]); each batch is compared,
/// fetched, written and finished while the next is planned, so memory holds one batch and
/// the walk's path, however many files the snapshot has (docs/DESIGN.md, "Restore in
/// batches").
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
    // A tuned fetch starts at what the storage does best on its own.
    let resolved;
    let opts = if opts.fetch_auto {
        resolved = RestoreOptions { fetch_concurrency: repo.storage().default_concurrency(), ..opts.clone() };
        &resolved
    } else {
        opts
    };
    let base = path.and_then(crate::engine::trees::below_root);
    let (mut top, into_dir, target_node) = plan::start(repo, snapshot, name, base)?;
    match (&mut top, &opts.file_name) {
        (plan::Top::Node(node), Some(n)) => node.name = n.as_encoded_bytes().to_vec(),
        (_, Some(_)) => {
            return Err(Error::Usage(format!(
                "{}: not one file of snapshot {name}",
                base.unwrap_or(Path::new("/")).display()
            )))
        }
        _ => {}
    }
    let filter = Filter::new(&opts.include, &opts.exclude)?;
    let base_path = base.unwrap_or(Path::new("/")).to_path_buf();
    // Loading the trees reads the repository too: SIGINT stops it, and the watchdog covers it.
    let cancel = opts.cancel.clone().unwrap_or_default();
    let loading = crate::engine::trees::Loading { cancel: cancel.clone(), ..Default::default() };
    let limit = plan::BatchLimit::for_memory(opts.max_memory);
    loading.read_ahead.limit(limit.tree_packs());
    let empty = fsops::target_is_empty(target);
    let walk_done = std::sync::atomic::AtomicBool::new(false);
    let mut run = Run {
        repo,
        target,
        opts,
        progress,
        filter: &filter,
        base_path: &base_path,
        snapshot_path: base,
        into_dir,
        empty,
        is_root: crate::engine::platform::is_root(),
        threads: opts.write_threads.max(1),
        cancel: cancel.clone(),
        data_budget: limit.data_budget(opts.max_memory, fixed_memory(repo)),
        started: false,
        acl: HashSet::new(),
        failed_dirs: HashSet::new(),
        failed_links: HashMap::new(),
        base: Default::default(),
        tuner: None,
        writers: None,
        fetch_rate: None,
        local_rate: None,
        repository_rate: None,
        late_share: None,
        out: RestoreOutcome::default(),
        walk_done: &walk_done,
    };
    // Closed directories list their children for `--delete`, and for the local-data stage,
    // which looks for chunks in the target's files the snapshot does not name.
    let names = opts.delete || (opts.local_data != LocalData::Off && !empty);
    std::thread::scope(|s| -> Result<()> {
        let (tx, batches) = crossbeam_channel::bounded::<Plan>(0);
        // Restored batches go back to the plan thread, which frees them as it starts the next
        // one: freeing a batch's entries (three allocations each) took the main thread 3 ms a
        // batch while the compare threads waited for the next batch.
        let (done_tx, done_rx) = crossbeam_channel::bounded::<Plan>(1);
        let (filter, base_path, loading, walk_done) = (&filter, &base_path, &loading, &walk_done);
        let planner = std::thread::Builder::new()
            .name("plan".into())
            // The walk recurses once per directory level (at most trees::MAX_DEPTH).
            .stack_size(PLANNER_STACK)
            .spawn_scoped(s, move || {
                let emit = |batch| {
                    let sent = tx.send(batch).is_ok();
                    done_rx.try_iter().for_each(drop);
                    sent
                };
                let walked =
                    plan::stream(repo, top, base_path, filter, names, tree_threads(opts), loading, limit, emit);
                walk_done.store(true, Ordering::Release);
                walked
            })
            .map_err(|e| Error::io("plan thread", "cannot start", e))?;
        let mut done = Ok(());
        loop {
            let t = Instant::now();
            let (next, stalls) = watchdog::while_running(
                opts.stall_timeout,
                progress,
                || loading.reads_done.load(Ordering::Relaxed),
                || "plan",
                || batches.recv(),
            );
            run.out.stalls.extend(stalls);
            crate::engine::profile::add_phase(&mut run.out.phases, "plan (waited for)", t.elapsed());
            let Ok(next) = next else { break };
            if let Err(e) = run.batch(&next) {
                done = Err(e);
                break;
            }
            // A lookup that found the sorted index file damaged answered "not found": the
            // files it failed are not missing from the repository, so the restore stops and
            // says to run it again (the file is gone and the next command rebuilds it).
            if let Err(e) = repo.index_intact() {
                done = Err(e);
                break;
            }
            // Freed here only if the plan thread has not taken the one before (it has ended).
            let _ = done_tx.try_send(next);
        }
        // A batch that failed stops the walk: its next hand-over finds nobody listening.
        drop(batches);
        let planned = planner.join().expect("the plan thread panicked");
        done.and(planned).and_then(|()| repo.index_intact())
    })?;
    let mut out = run.out;
    if !opts.dry_run {
        if let Some(node) = &target_node {
            if let Err(e) = meta::apply_to_path(target, node, run.is_root) {
                out.warnings.push((PathBuf::from("."), e.to_string()));
            }
        }
    }
    out.failed.sort();
    out.warnings.sort();
    if let Some(dry) = &mut out.dry_run {
        dry.delete.sort();
    }
    out.duration = started.elapsed();
    Ok(out)
}

/// Stack of the plan thread (the walk recurses once per directory level).
const PLANNER_STACK: usize = 64 * 1024 * 1024;

/// Threads the walk loads trees on: the fetch concurrency given, or, when it is tuned, as many
/// as the fetch stage may grow to ([`crate::engine::read::AUTO_MAX`]; the walk's window bounds the trees
/// in flight). Tied to the tuned limit's start (4 on a local repository), a walk of the Linux
/// tree at 20 ms per request waited 20-28 s for its trees where fixed 64 waited 1 s.
fn tree_threads(opts: &RestoreOptions) -> usize {
    if opts.fetch_auto {
        crate::engine::read::AUTO_MAX
    } else {
        opts.fetch_concurrency
    }
}

/// What a restore holds whatever its batches: the index, and the largest directory's tree
/// (kept as its bytes while the walk is inside it; the walk may hold it while the next one
/// that large is read, hence twice).
pub(crate) fn fixed_memory(repo: &Repository) -> u64 {
    let index = repo.index();
    index.memory_bytes() + 2 * index.largest_tree()
}
