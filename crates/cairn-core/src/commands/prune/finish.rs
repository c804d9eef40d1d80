//! Finish stage: once no lock that was held when a deletion manifest was written remains,
//! keep what snapshots written meanwhile still need, replace the index files, delete the
//! packs, then the manifest (FORMAT.md §13; docs/DESIGN.md, "Prune beside backups").
//!
//! Each step may be interrupted (kill -9) and the next prune repeats the finish from the
//! start: index files are replaced before packs are deleted, and the manifest goes last.

use std::time::{Duration, Instant};

use crate::engine::lock;
use crate::engine::parallel::map_parallel;
use crate::engine::repository::Repository;
use crate::engine::trees::Loading;
use crate::error::Result;
use cairn_format::deletion::Deletion;
use cairn_format::id::{BlobId, DeletionId, IdSet, IndexId, PackId, SnapshotId};
use cairn_format::index::IndexedPack;
use cairn_format::layout::{self, pack_path};
use cairn_format::lock::Holder;
use cairn_format::pack::BlobKind;

/// Blobs per index file a prune writes.
const INDEX_FILE_BLOBS: usize = 50_000;

/// How often the locks a prune waits for are listed again: soon at first (most operations it
/// waits for are about to end), then less often.
const POLL_FIRST: Duration = Duration::from_millis(200);
/// See [`POLL_FIRST`].
const POLL_EVERY: Duration = Duration::from_secs(2);

/// What finishing a manifest did.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Finished {
    /// Packs deleted.
    pub deleted_packs: u64,
    /// Their bytes.
    pub deleted_bytes: u64,
    /// Packs kept after all because a snapshot written meanwhile needs them.
    pub rescued_packs: u64,
    /// Snapshots written while the prune ran that were checked for what they need.
    pub new_snapshots: u64,
    /// Index files written and removed.
    pub index_written: u64,
    /// See `index_written`.
    pub index_removed: u64,
}

/// The locks other than `mine` that are not stale: the holders a prune waits for.
pub fn holders(repo: &Repository, mine: &Holder) -> Result<Vec<(Holder, String)>> {
    Ok(lock::list(&**repo.storage())?
        .into_iter()
        .filter(|l| l.stale_reason().is_none())
        .filter_map(|l| l.info.ok())
        .map(|i| (i.holder(), i.describe()))
        .filter(|(h, _)| h != mine)
        .collect())
}

/// Waits until none of `waiting` holds a lock any more (or its lock went stale), at most
/// `max_wait`; `say` hears whom it waits for. Returns whether they are all gone.
pub fn wait_for(
    repo: &Repository,
    mine: &Holder,
    mut waiting: Vec<(Holder, String)>,
    max_wait: Duration,
    say: &dyn Fn(&str),
    loading: &Loading,
) -> Result<bool> {
    let start = Instant::now();
    let mut told = 0;
    let mut pause = POLL_FIRST;
    loop {
        let now: Vec<Holder> = holders(repo, mine)?.into_iter().map(|(h, _)| h).collect();
        waiting.retain(|(h, _)| now.contains(h));
        if waiting.is_empty() {
            return Ok(true);
        }
        if waiting.len() != told {
            told = waiting.len();
            say(&format!(
                "waiting for {} operation(s) that started before the prune decided, e.g. {}",
                waiting.len(),
                waiting[0].1
            ));
        }
        if start.elapsed() >= max_wait {
            return Ok(false);
        }
        if loading.cancel.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(crate::Error::Interrupted);
        }
        std::thread::sleep(pause.min(max_wait.saturating_sub(start.elapsed())).max(Duration::from_millis(50)));
        pause = (pause * 2).min(POLL_EVERY);
    }
}

/// Finishes manifest `id`: every lock held when it was written is gone. `counted` are the
/// snapshots the prune's plan counted (`None` when finishing another prune's manifest: then
/// every snapshot is checked); what they need has a copy outside the doomed packs by
/// construction (claimed in kept packs or copied into new ones).
pub fn finish(
    repo: &Repository,
    id: DeletionId,
    d: &Deletion,
    counted: Option<&IdSet<SnapshotId>>,
    loading: &Loading,
) -> Result<Finished> {
    let mut out = Finished::default();
    let mut doomed: IdSet<PackId> = d.packs.iter().copied().collect();
    let replaced: IdSet<IndexId> = d.index_files.iter().copied().collect();

    // Everything indexed now, including what backups wrote while the prune ran.
    let mut files = super::index_files(repo)?;
    // Their replacements are written from the packs' headers where index files disagree.
    super::trust::settle_disputes(repo, &mut files)?;
    // A doomed pack that an index file written since names is not ours to delete.
    for (file_id, packs) in &files {
        if !replaced.contains(file_id) {
            for p in packs {
                if doomed.remove(&p.id) {
                    out.rescued_packs += 1;
                }
            }
        }
    }
    // Snapshots the plan did not count may need blobs only doomed packs hold (a backup that
    // was running deduplicated against them): those packs stay.
    let (snapshots, damaged) = repo.read_snapshots()?;
    if let Some((path, e)) = damaged.into_iter().next() {
        return Err(super::unreadable_snapshot(&path, &e));
    }
    let new: Vec<_> = match counted {
        Some(counted) => snapshots.into_iter().filter(|(sid, _)| !counted.contains(sid)).collect(),
        None => snapshots,
    };
    out.new_snapshots = new.len() as u64;
    if !new.is_empty() {
        // Their trees are in packs indexed since the prune loaded the index.
        repo.set_index_doomed(files.iter().flat_map(|(_, p)| p), &doomed);
        let needed = super::mark::mark(repo, &new, loading)?;
        let index = repo.index();
        // The index finds a blob's copy outside the doomed packs if it has one.
        for pos in needed.positions() {
            let loc = index.at(pos).ok_or_else(crate::engine::sorted_index::damaged)?;
            if index.is_doomed(loc.pack_no) && doomed.remove(&loc.pack) {
                out.rescued_packs += 1;
            }
        }
        drop(index);
        repo.clear_index();
    }

    uncache_doomed_trees(repo, &files, &doomed);

    // Replace the index files, unless an interrupted finish already did (it removes them
    // only after writing their replacements).
    let present: IdSet<IndexId> = files.iter().map(|(f, _)| *f).collect();
    if replaced.iter().all(|f| present.contains(f)) {
        let mut seen = IdSet::default();
        let keep: Vec<IndexedPack> = files
            .into_iter()
            .filter(|(f, _)| replaced.contains(f))
            .flat_map(|(_, p)| p)
            .filter(|p| !doomed.contains(&p.id) && seen.insert(p.id))
            .collect();
        out.index_written = write_index_files(repo, keep)?;
    }
    let threads = repo.storage().default_concurrency().max(4);
    let removed = map_parallel(&d.index_files, threads, |f| repo.storage().delete(&layout::index_path(f)));
    removed.into_iter().collect::<Result<Vec<()>>>()?;
    out.index_removed = d.index_files.len() as u64;

    let doomed: Vec<PackId> = d.packs.iter().filter(|p| doomed.contains(*p)).copied().collect();
    let sizes = repo.list_packs()?;
    out.deleted_bytes = doomed.iter().filter_map(|p| sizes.get(p)).sum();
    let deleted = map_parallel(&doomed, threads, |p| repo.storage().delete(&pack_path(p)));
    deleted.into_iter().collect::<Result<Vec<()>>>()?;
    out.deleted_packs = doomed.len() as u64;
    repo.storage().delete(&layout::deletion_path(&id))?;
    Ok(out)
}

/// Drops from this machine's metadata cache the trees whose every copy is in a pack about to
/// be deleted (a tree repacked elsewhere keeps its entry, which the repack wrote anew), so the
/// cache does not keep what the repository no longer has.
fn uncache_doomed_trees(repo: &Repository, files: &[(IndexId, Vec<IndexedPack>)], doomed: &IdSet<PackId>) {
    if !repo.has_cache() {
        return;
    }
    let trees = |doomed_ones: bool| {
        files
            .iter()
            .flat_map(|(_, packs)| packs)
            .filter(move |p| doomed.contains(&p.id) == doomed_ones)
            .flat_map(|p| &p.blobs)
            .filter(|b| b.kind == BlobKind::Tree)
            .map(|b| b.id)
    };
    let mut gone: IdSet<BlobId> = trees(true).collect();
    if gone.is_empty() {
        return;
    }
    for id in trees(false) {
        gone.remove(&id);
    }
    for id in &gone {
        repo.uncache_tree(id);
    }
}

/// Writes `packs` into index files of about [`INDEX_FILE_BLOBS`] blobs each, several at once;
/// returns how many.
fn write_index_files(repo: &Repository, packs: Vec<IndexedPack>) -> Result<u64> {
    let mut groups: Vec<Vec<IndexedPack>> = vec![Vec::new()];
    let mut blobs = 0;
    for p in packs {
        if blobs + p.blobs.len() > INDEX_FILE_BLOBS && !groups.last().expect("one group").is_empty() {
            groups.push(Vec::new());
            blobs = 0;
        }
        blobs += p.blobs.len();
        groups.last_mut().expect("one group").push(p);
    }
    groups.retain(|g| !g.is_empty());
    let threads = repo.storage().default_concurrency().max(2);
    let written = map_parallel(&groups, threads, |g| repo.save_index(g));
    written.into_iter().collect::<Result<Vec<_>>>()?;
    Ok(groups.len() as u64)
}
