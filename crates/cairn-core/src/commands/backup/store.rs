//! Store stage: deduplicate. `save` runs on the reader (or walker) that met the blob: a blob
//! the repository already holds, or one another worker met first (in-flight dedup), is
//! dropped at once; a new one goes to the packers through a bounded queue.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crossbeam_channel::Sender;

use super::stopped;
use crate::engine::packwrite::{Job, Payload};
use crate::engine::repository::Repository;
use crate::error::Result;
use cairn_format::id::{BlobId, IdSet};
use cairn_format::pack::BlobKind;

/// Byte counts of what a backup added.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// Plaintext bytes of new blobs.
    pub bytes_added: AtomicU64,
}

/// The store stage's entry point, shared by every worker.
pub(super) struct BlobStore<'a> {
    repo: &'a Repository,
    jobs: Sender<Job>,
    /// Blobs this backup has queued that the index may not hold yet: the in-flight dedup set.
    seen: Mutex<InFlight>,
    stats: &'a StoreStats,
    /// Count what would be added, store nothing (`--dry-run`).
    dry_run: bool,
}

impl<'a> BlobStore<'a> {
    /// A store feeding `jobs`; dropping it tells the packers that no more blobs come.
    pub fn new(repo: &'a Repository, jobs: Sender<Job>, stats: &'a StoreStats, dry_run: bool) -> Self {
        BlobStore { repo, jobs, seen: Mutex::new(InFlight::default()), stats, dry_run }
    }

    /// Stores a blob unless the repository has it or it is already on its way. Returns its ID.
    pub fn save(&self, kind: BlobKind, data: Vec<u8>) -> Result<BlobId> {
        let id = self.repo.key().blob_id(&data);
        if self.repo.index().contains_live(&id) || !self.seen.lock().expect("dedup lock").insert(id, self.repo) {
            return Ok(id);
        }
        self.stats.bytes_added.fetch_add(data.len() as u64, Ordering::Relaxed);
        if !self.dry_run {
            self.jobs.send(Job { id, kind, payload: Payload::Plain(data) }).map_err(|_| stopped("pack"))?;
        }
        Ok(id)
    }
}

/// The blobs a backup has queued and the index does not hold yet. Stored packs are indexed as
/// they are stored (`packwrite`), so their blobs are dropped from here now and then: the set
/// stays about as large as what is on its way, not as large as everything the backup added
/// (32 MB and more for a million new blobs, on top of the index that holds them too).
pub(super) struct InFlight {
    ids: IdSet<BlobId>,
    /// Size at which the indexed IDs are dropped next.
    prune_at: usize,
}

/// Fewest IDs held before indexed ones are dropped.
const IN_FLIGHT_PRUNE_MIN: usize = 16_384;

impl Default for InFlight {
    fn default() -> Self {
        InFlight { ids: IdSet::default(), prune_at: IN_FLIGHT_PRUNE_MIN }
    }
}

impl InFlight {
    /// Records `id` as queued; false if it is queued already or the index has it. The index is
    /// asked again here, under the set's lock: an ID dropped because its pack was indexed is
    /// then found in the index, never queued twice.
    fn insert(&mut self, id: BlobId, repo: &Repository) -> bool {
        let index = repo.index();
        if index.contains_live(&id) {
            return false;
        }
        if self.ids.len() >= self.prune_at {
            self.ids.retain(|id| !index.contains_live(id));
            self.prune_at = (self.ids.len() * 2).max(IN_FLIGHT_PRUNE_MIN);
        }
        self.ids.insert(id)
    }
}
