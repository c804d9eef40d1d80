//! The one pack-writing path: backup, prune's repacking and recompress all hand blobs to it.
//!
//! ```text
//! Job ──▶ packer ×C ──pack──▶ upload ×U ──▶ index
//!         (compress+encrypt)  (store)        (index files)
//! ```
//!
//! A [`Job`] carries a blob's plaintext (compressed here with the chosen codec) or its stored
//! bytes (already compressed: a repack copies them as they are, only re-encrypted under the new
//! pack's key). A pack is indexed only after it is stored (FORMAT.md §8), so a writer killed at
//! any moment leaves at most packs no index names, never an index naming a missing pack.

mod index;
mod packer;
mod upload;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::ScopedJoinHandle;

use crossbeam_channel::{bounded, Sender};

use crate::compress::Codec;
use crate::error::{Error, Result};
use crate::id::{BlobId, IndexId};
use crate::index::IndexedPack;
use crate::pack::{BlobKind, FinishedPack};
use crate::repository::Repository;

/// A blob on its way into a pack.
pub struct Job {
    /// Its ID.
    pub id: BlobId,
    /// Data or tree (each goes to packs of its own kind).
    pub kind: BlobKind,
    /// Its bytes.
    pub payload: Payload,
}

/// A blob's bytes as a [`Job`] carries them.
pub enum Payload {
    /// Plaintext, compressed by the packer with the writer's codec.
    Plain(Vec<u8>),
    /// Already compressed with `codec` (decrypted from another pack): stored as it is.
    Stored {
        /// How `bytes` were compressed.
        codec: Codec,
        /// Plaintext length.
        raw_length: u32,
        /// The compressed bytes.
        bytes: Vec<u8>,
    },
}

/// How to write packs.
#[derive(Clone, Copy, Debug)]
pub struct WriteOptions {
    /// Codec for [`Payload::Plain`] blobs.
    pub codec: Codec,
    /// Threads that compress and encrypt.
    pub threads: usize,
    /// Packs stored at once.
    pub uploads: usize,
    /// Stored packs per index file.
    pub index_every: usize,
}

/// What a pack writer wrote.
#[derive(Debug, Default)]
pub struct Written {
    /// Bytes of packs stored.
    pub bytes_stored: AtomicU64,
    /// Packs stored.
    pub packs: AtomicU64,
    /// Index files written, each naming the packs it lists.
    pub index_files: Mutex<Vec<(IndexId, Vec<IndexedPack>)>>,
}

impl Written {
    /// Bytes of packs stored so far.
    pub fn bytes(&self) -> u64 {
        self.bytes_stored.load(Ordering::Relaxed)
    }
}

/// Starts packers, uploaders and the indexer, runs `produce` with the sender their jobs come
/// from (dropping it, or returning, tells them no more blobs come), and waits for every pack to
/// be stored and indexed. The most downstream failure is the one returned: upstream stages only
/// saw the next one stop.
pub fn write_packs<T>(
    repo: &Repository,
    opts: &WriteOptions,
    written: &Written,
    produce: impl FnOnce(Sender<Job>) -> Result<T>,
) -> Result<T> {
    let uploads = opts.uploads.max(1);
    let threads = opts.threads.max(1);
    std::thread::scope(|s| {
        let (stored_tx, stored_rx) = bounded::<IndexedPack>(uploads * 2);
        let (packs_tx, packs_rx) = bounded::<FinishedPack>(uploads);
        let (jobs_tx, jobs_rx) = bounded::<Job>(threads * 4);
        let indexer = s.spawn(move || index::index_packs(repo, stored_rx, opts.index_every, written));
        let uploaders: Vec<_> = (0..uploads)
            .map(|_| {
                let (rx, tx) = (packs_rx.clone(), stored_tx.clone());
                s.spawn(move || upload::run(repo, rx, tx, written))
            })
            .collect();
        drop((stored_tx, packs_rx));
        let packers: Vec<_> = (0..threads)
            .map(|_| {
                let (rx, tx) = (jobs_rx.clone(), packs_tx.clone());
                s.spawn(move || packer::run(repo, rx, tx, opts.codec))
            })
            .collect();
        drop((packs_tx, jobs_rx));
        let produced = produce(jobs_tx);
        let packed = join_all(packers);
        let uploaded = join_all(uploaders);
        let indexed = indexer.join().expect("indexer panicked");
        indexed.and(uploaded).and(packed)?;
        produced
    })
}

/// Joins workers; the first error wins.
pub(crate) fn join_all(workers: Vec<ScopedJoinHandle<'_, Result<()>>>) -> Result<()> {
    workers.into_iter().map(|w| w.join().expect("worker panicked")).fold(Ok(()), Result::and)
}

/// The error a stage returns when the next one stopped; the next one's own error is the one
/// reported.
pub(crate) fn stopped(next: &str) -> Error {
    Error::Internal(format!("the pack writer's {next} stage stopped early"))
}
