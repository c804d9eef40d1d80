//! Store stage: deduplicate, compress (CPU pool), encrypt and assemble packs, upload.
//!
//! `save` is called by the readers. A blob already in the index or already on its way is
//! dropped at once (in-flight dedup). New blobs go to a pool of compression workers, then to a
//! single packer thread that encrypts them into the current pack and uploads full packs.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::{Scope, ScopedJoinHandle};

use crossbeam_channel::{bounded, Receiver, Sender};

use crate::compress::Codec;
use crate::error::{Error, Result};
use crate::id::BlobId;
use crate::index::IndexedPack;
use crate::pack::{pack_path, BlobKind, PackWriter};
use crate::repository::Repository;

struct Job {
    id: BlobId,
    kind: BlobKind,
    data: Vec<u8>,
}

struct Compressed {
    id: BlobId,
    kind: BlobKind,
    codec: Codec,
    raw_length: u32,
    stored: Vec<u8>,
}

/// Byte counts of what a store added.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// Plaintext bytes of new blobs.
    pub bytes_added: AtomicU64,
    /// Bytes of new packs written.
    pub bytes_stored: AtomicU64,
}

/// The running store stage.
pub struct BlobStore<'scope> {
    repo: &'scope Repository,
    jobs: Option<Sender<Job>>,
    inflight: Mutex<HashSet<BlobId>>,
    workers: Vec<ScopedJoinHandle<'scope, ()>>,
    packer: Option<ScopedJoinHandle<'scope, Result<Vec<IndexedPack>>>>,
    stats: &'scope StoreStats,
}

impl<'scope> BlobStore<'scope> {
    /// Starts `threads` compression workers and the packer inside `scope`.
    pub fn start<'env>(
        scope: &'scope Scope<'scope, 'env>,
        repo: &'scope Repository,
        codec: Codec,
        threads: usize,
        stats: &'scope StoreStats,
    ) -> Self {
        let (jobs_tx, jobs_rx) = bounded::<Job>(threads * 2);
        let (packed_tx, packed_rx) = bounded::<Compressed>(threads * 2);
        let workers = (0..threads.max(1))
            .map(|_| {
                let rx = jobs_rx.clone();
                let tx = packed_tx.clone();
                scope.spawn(move || compress_worker(rx, tx, codec))
            })
            .collect();
        drop(packed_tx);
        let packer = scope.spawn(move || pack_and_upload(repo, packed_rx, stats));
        BlobStore {
            repo,
            jobs: Some(jobs_tx),
            inflight: Mutex::new(HashSet::new()),
            workers,
            packer: Some(packer),
            stats,
        }
    }

    /// Stores a blob unless the repository has it or it is already on its way. Returns its ID.
    pub fn save(&self, kind: BlobKind, data: Vec<u8>) -> Result<BlobId> {
        let id = self.repo.key().blob_id(&data);
        if self.repo.index().contains(&id) || !self.inflight.lock().expect("inflight lock").insert(id) {
            return Ok(id);
        }
        self.stats.bytes_added.fetch_add(data.len() as u64, Ordering::Relaxed);
        let jobs = self.jobs.as_ref().expect("store is running");
        if jobs.send(Job { id, kind, data }).is_err() {
            // The packer stopped early; its error is reported by `finish`.
            return Err(Error::Usage("the store stage stopped; see the error below".into()));
        }
        Ok(id)
    }

    /// Flushes everything; returns the packs written.
    pub fn finish(mut self) -> Result<Vec<IndexedPack>> {
        drop(self.jobs.take());
        for w in self.workers.drain(..) {
            w.join().expect("compression worker panicked");
        }
        self.packer.take().expect("packer").join().expect("packer panicked")
    }
}

fn compress_worker(rx: Receiver<Job>, tx: Sender<Compressed>, codec: Codec) {
    for job in rx {
        let raw_length = job.data.len() as u32;
        let (codec, stored) = match codec.compress(&job.data) {
            Some(c) => (codec, c),
            None => (Codec::None, job.data),
        };
        if tx.send(Compressed { id: job.id, kind: job.kind, codec, raw_length, stored }).is_err() {
            return;
        }
    }
}

fn pack_and_upload(repo: &Repository, rx: Receiver<Compressed>, stats: &StoreStats) -> Result<Vec<IndexedPack>> {
    let target = repo.config().pack_size as usize;
    let mut packs = Vec::new();
    let mut writer = PackWriter::new(repo.key(), target + target / 8);
    for blob in rx {
        writer.add(blob.id, blob.kind, blob.codec, blob.raw_length, &blob.stored);
        if writer.len() >= target {
            let full = std::mem::replace(&mut writer, PackWriter::new(repo.key(), target + target / 8));
            packs.push(upload(repo, full, stats)?);
        }
    }
    if !writer.is_empty() {
        packs.push(upload(repo, writer, stats)?);
    }
    Ok(packs)
}

fn upload(repo: &Repository, writer: PackWriter, stats: &StoreStats) -> Result<IndexedPack> {
    let pack = writer.finish();
    stats.bytes_stored.fetch_add(pack.bytes.len() as u64, Ordering::Relaxed);
    repo.storage().write(&pack_path(&pack.id), pack.bytes)?;
    let indexed = IndexedPack { id: pack.id, salt: pack.salt, blobs: pack.entries };
    repo.index_pack(&indexed);
    Ok(indexed)
}
