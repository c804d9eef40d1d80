//! Store stage: deduplicate. `save` runs on the reader (or walker) that met the blob: a blob
//! the repository already holds, or one another worker met first (in-flight dedup), is
//! dropped at once; a new one goes to the packers through a bounded queue.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crossbeam_channel::Sender;

use super::stopped;
use crate::error::Result;
use crate::id::{BlobId, IdSet};
use crate::pack::BlobKind;
use crate::packwrite::{Job, Payload};
use crate::repository::Repository;

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
    /// Blobs this backup has queued: the in-flight dedup set.
    seen: Mutex<IdSet<BlobId>>,
    stats: &'a StoreStats,
    /// Count what would be added, store nothing (`--dry-run`).
    dry_run: bool,
}

impl<'a> BlobStore<'a> {
    /// A store feeding `jobs`; dropping it tells the packers that no more blobs come.
    pub fn new(repo: &'a Repository, jobs: Sender<Job>, stats: &'a StoreStats, dry_run: bool) -> Self {
        BlobStore { repo, jobs, seen: Mutex::new(IdSet::default()), stats, dry_run }
    }

    /// Stores a blob unless the repository has it or it is already on its way. Returns its ID.
    pub fn save(&self, kind: BlobKind, data: Vec<u8>) -> Result<BlobId> {
        let id = self.repo.key().blob_id(&data);
        if self.repo.index().contains_live(&id) || !self.seen.lock().expect("dedup lock").insert(id) {
            return Ok(id);
        }
        self.stats.bytes_added.fetch_add(data.len() as u64, Ordering::Relaxed);
        if !self.dry_run {
            self.jobs.send(Job { id, kind, payload: Payload::Plain(data) }).map_err(|_| stopped("pack"))?;
        }
        Ok(id)
    }
}
