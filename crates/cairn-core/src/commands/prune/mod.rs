//! Prune: delete what no snapshot needs, beside running backups (docs/DESIGN.md, "Prune
//! beside backups"; FORMAT.md §13).
//!
//! ```text
//! finish earlier ─▶ mark ─▶ plan ─▶ repack ─▶ manifest ─▶ wait ─▶ finish
//! (their manifests)  (trees)  (fates)  (read path →   (deletions/)  (locks held   (rescue, index,
//!                                       pack writer)                 at manifest)  delete)
//! ```
//!
//! A prune holds a prune lock, which backups ignore. Before deleting anything it writes a
//! deletion manifest; backups that start later do not deduplicate against the packs it names,
//! and the packs are deleted once every lock held when it was written is gone, except those a
//! snapshot written meanwhile needs. `cairn recompress` is a prune whose plan re-encodes blobs.

mod finish;
mod mark;
mod memory;
mod plan;
mod repack;
mod trust;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

pub use cairn_format::pack::{count_codec, CodecUse};
pub use finish::Finished;
pub use memory::Shares;
pub use plan::{Fate, Limit, Plan, PlanOptions, PlanStats, PlannedPack, Recompress};
pub use repack::RepackOptions;

use crate::engine::lock::Lock;
use crate::engine::packwrite::Written;
use crate::engine::profile::{in_seconds, PhaseClock};
use crate::engine::repository::Repository;
use crate::engine::trees::Loading;
use crate::error::{Error, Result};
use cairn_format::deletion::{self, Deletion};
use cairn_format::id::{BlobId, IdSet, IndexId, SnapshotId};
use cairn_format::index::IndexedPack;
use cairn_format::layout;
use cairn_format::snapshot::Snapshot;

/// How to prune.
#[derive(Clone, Debug)]
pub struct PruneOptions {
    /// What the plan may do.
    pub plan: PlanOptions,
    /// How repacking reads and writes.
    pub repack: RepackOptions,
    /// Memory the whole prune may hold (see [`Shares`]).
    pub max_memory: crate::engine::memory::MaxMemory,
    /// Plan and report only.
    pub dry_run: bool,
    /// Longest to wait for operations that started before the prune decided; after that the
    /// deletion is left for the next prune.
    pub max_wait: Duration,
}

/// What a prune did.
#[derive(Debug, Default, Serialize)]
pub struct PruneReport {
    /// Earlier prunes' deletions finished first.
    pub earlier: Vec<Finished>,
    /// Snapshots whose needs were counted.
    pub snapshots: u64,
    /// The plan's numbers.
    pub plan: PlanStats,
    /// New packs written by repacking, and their bytes.
    pub written_packs: u64,
    /// See `written_packs`.
    pub written_bytes: u64,
    /// The deletion, once finished.
    pub finished: Option<Finished>,
    /// Whether the deletion was left for the next prune (operations that started before it
    /// decided still ran after `max_wait`).
    pub deferred: bool,
    /// The needed blobs by codec after the prune (when it repacked anything): with
    /// `plan.by_codec`, what a recompress changed.
    pub by_codec_after: Option<std::collections::BTreeMap<String, CodecUse>>,
    /// Bytes of packs before and after.
    pub size_before: u64,
    /// See `size_before`.
    pub size_after: u64,
    /// Seconds per phase, in order.
    pub phases: Vec<(String, f64)>,
}

/// Prunes `repo` under the prune lock `lock` (it reads the index files itself). `say` hears what the
/// prune is doing (for a status line). A dry run may go without the lock (it writes nothing, and
/// what it reports is what a prune would have done when it read the repository): the agent's
/// health page asks what is reclaimable that way, also with a token that may only read.
pub fn prune(
    repo: &Repository,
    lock: Option<&Lock>,
    opts: &PruneOptions,
    say: &dyn Fn(&str),
    cancel: Arc<AtomicBool>,
) -> Result<PruneReport> {
    let loading = Loading { cancel: cancel.clone(), ..Loading::default() };
    let mut report = PruneReport::default();
    let (mut clock, mut phases) = (PhaseClock(Instant::now()), Vec::new());
    let mine = lock.map(Lock::holder);
    let need_lock = || mine.ok_or_else(|| Error::Usage("a prune that deletes runs under the prune lock".into()));

    if !opts.dry_run {
        let mine = need_lock()?;
        let pending = pending(repo)?;
        if !pending.is_empty() {
            say(&format!("finishing {} earlier prune(s)", pending.len()));
            let waiting = finish::holders(repo, mine)?;
            if !finish::wait_for(repo, mine, waiting, opts.max_wait, say, &loading)? {
                report.deferred = true;
                return Ok(report);
            }
            for (id, d) in &pending {
                report.earlier.push(finish::finish(repo, *id, d, None, &loading)?);
            }
            clock.lap(&mut phases, "finish earlier");
        }
    }

    say("reading snapshots and index");
    let (snapshots, damaged) = repo.read_snapshots()?;
    if let Some((path, e)) = damaged.into_iter().next() {
        return Err(unreadable_snapshot(&path, &e));
    }
    report.snapshots = snapshots.len() as u64;
    let mut files = index_files(repo)?;
    let stored = repo.list_packs()?;
    // A pack index files list differently is taken from its header (trust.rs).
    trust::settle_disputes(repo, &mut files)?;
    // Listed after the snapshots, the index files cover every blob they need (a backup writes
    // its index files before its snapshot); the marking reads trees through this index.
    repo.set_index(files.iter().flat_map(|(_, p)| p));
    let shares = Shares::of(repo, &files, opts.max_memory)?;
    report.size_before = stored.values().sum();
    clock.lap(&mut phases, "list");

    say(&format!("marking what {} snapshots need", snapshots.len()));
    let used = mark::mark(repo, &snapshots, &loading)?;
    clock.lap(&mut phases, "mark");
    let plan = plan::plan(files, &stored, &used, &repo.index(), &opts.plan, u64::from(repo.config().pack_size))?;
    drop(used);
    if !opts.dry_run {
        // The copies kept in place of those that go are where the index says (trust.rs).
        trust::confirm_claims(repo, &plan)?;
    }
    report.plan = plan.stats.clone();
    report.size_after = report.size_before;
    if opts.dry_run || (plan.stats.delete_packs == 0 && plan.stats.repack_packs == 0) {
        report.phases = in_seconds(&phases);
        return Ok(report);
    }

    let written = Written::default();
    let repacks: Vec<&PlannedPack> = plan.with_fate(Fate::Repack).collect();
    if !repacks.is_empty() {
        say(&format!("repacking {} packs", repacks.len()));
        repack::repack(repo, &repacks, &opts.plan, &opts.repack, &shares, &written, cancel.clone())?;
        clock.lap(&mut phases, "repack");
    }
    report.written_packs = written.packs.load(std::sync::atomic::Ordering::Relaxed);
    report.written_bytes = written.bytes();
    if !repacks.is_empty() {
        // The needed blobs after the prune: those claimed in kept packs, and the copies in the
        // new packs.
        let mut after = written.by_codec.lock().expect("written lock").clone();
        for b in plan.with_fate(Fate::Keep).flat_map(PlannedPack::claimed) {
            count_codec(&mut after, b);
        }
        report.by_codec_after = Some(after);
    }

    let mut index_files = plan.index_files.clone();
    index_files.extend(written.index_files.lock().expect("written lock").iter().copied());
    let d = Deletion {
        version: deletion::VERSION,
        created: crate::engine::platform::now_secs(),
        packs: plan.packs.iter().filter(|p| p.fate != Fate::Keep).map(|p| p.pack.id).collect(),
        index_files,
    };
    // Finishing reads the index files again: the plan's copy of them and the index built from
    // it are not held beside that.
    drop(plan);
    repo.clear_index();
    let id = repo.save_deletion(&d)?;
    // Listed after the manifest is stored: a lock taken later belongs to an operation that
    // reads the manifest (each takes its lock before reading the index).
    let mine = need_lock()?;
    let waiting = finish::holders(repo, mine)?;
    clock.lap(&mut phases, "manifest");
    if !finish::wait_for(repo, mine, waiting, opts.max_wait, say, &loading)? {
        report.deferred = true;
        report.phases = in_seconds(&phases);
        return Ok(report);
    }
    clock.lap(&mut phases, "wait");
    say("deleting");
    let counted: IdSet<SnapshotId> = snapshots.iter().map(|(id, _)| *id).collect();
    report.finished = Some(finish::finish(repo, id, &d, Some(&counted), &loading)?);
    report.size_after = repo.list_packs()?.values().sum();
    clock.lap(&mut phases, "delete");
    report.phases = in_seconds(&phases);
    Ok(report)
}

/// The blobs `snapshots` need (their trees and the chunks they name); the index must be loaded.
pub fn needed_blobs(repo: &Repository, snapshots: &[(SnapshotId, Snapshot)]) -> Result<IdSet<BlobId>> {
    let needed = mark::mark(repo, snapshots, &Loading::default())?;
    repo.index_intact()?;
    needed.ids(&repo.index())
}

/// Refuses, with the line a prune would give, while a snapshot or an index file cannot be
/// read: `forget --prune` asks first, so a prune that would refuse leaves every snapshot as it
/// was (a command that cannot finish refuses before it changes anything).
pub fn refuses(repo: &Repository) -> Result<()> {
    let (_, damaged) = repo.read_snapshots()?;
    if let Some((path, e)) = damaged.into_iter().next() {
        return Err(unreadable_snapshot(&path, &e));
    }
    index_files(repo).map(|_| ())
}

/// Why a prune deletes nothing while snapshot `path` cannot be read: what it needs is unknown.
fn unreadable_snapshot(path: &str, e: &Error) -> Error {
    Error::Refused(format!(
        "{path} cannot be read ({e}); prune deletes nothing while a snapshot cannot be read (what it needs is \
         unknown): restore the file, or remove it with `cairn repair unreadable` (admin), then prune again"
    ))
}

/// Every index file with its ID (stray names left out). One that cannot be read stops the
/// prune: what it lists could not be told apart from what nothing needs.
fn index_files(repo: &Repository) -> Result<Vec<(IndexId, Vec<IndexedPack>)>> {
    let mut files = Vec::new();
    for (path, file) in repo.index_files()? {
        let Some(id) = layout::parse_index_path(&path) else { continue };
        let file = file.map_err(|e| {
            Error::Refused(format!(
                "{e}; prune deletes nothing while an index file cannot be read: run `cairn repair index`"
            ))
        })?;
        files.push((id, file));
    }
    Ok(files)
}

/// The deletion manifests of earlier prunes. One that cannot be read is removed: a manifest
/// only ever allows a deletion, so without it its packs stay (and the next plan counts them).
fn pending(repo: &Repository) -> Result<Vec<(cairn_format::id::DeletionId, Deletion)>> {
    let mut out = Vec::new();
    for (id, d) in repo.deletions()? {
        match d {
            Ok(d) => out.push((id, d)),
            Err(e) => {
                tracing::warn!("removing unreadable deletion manifest ({e}); its packs are kept");
                repo.storage().delete(&layout::deletion_path(&id))?;
            }
        }
    }
    Ok(out)
}
