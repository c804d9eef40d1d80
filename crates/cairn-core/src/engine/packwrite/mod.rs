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

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::ScopedJoinHandle;

use crossbeam_channel::{bounded, Sender};

use crate::engine::memory::{Budget, Reservation, PACKS_MIN};
use crate::engine::repository::Repository;
use crate::error::{Error, Result};
use cairn_format::compress::Codec;
use cairn_format::id::{BlobId, IndexId};
use cairn_format::index::IndexedPack;
use cairn_format::pack::CodecUse;
use cairn_format::pack::{BlobKind, FinishedPack};

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
    /// Bytes the packs being filled, waiting and being stored may hold together (`None`: no
    /// limit but the threads' and uploads' counts). Each pack reserves [`pack_buffer`] bytes
    /// when its first blob comes and frees them once stored; fewer packers run when the
    /// budget holds fewer than two packs for each (a packer fills a data and a tree pack at
    /// once, and one waiting for room while every pack in memory is still open would wait
    /// forever).
    pub memory: Option<u64>,
    /// Whether each stored pack joins the repository's in-memory index (a backup deduplicates
    /// against what it stored; a copy, whose walk meets each blob once, and a prune, which
    /// reads the index files again to finish, do not hold a million blobs' entries for
    /// nothing).
    pub index_stored: bool,
}

/// Stored packs per index file a pack writer writes unless told otherwise.
pub const DEFAULT_INDEX_EVERY: usize = 8;

impl WriteOptions {
    /// A writer of blobs read from another pack (a prune's repack, a copy) into `dst`, with
    /// `threads` packers: the uploads the destination's backend bears (2 to 8), no memory
    /// budget yet (the command sets its share), and the stored packs not joining the in-memory
    /// index.
    pub fn rewriting(dst: &Repository, codec: Codec, threads: usize) -> Self {
        WriteOptions {
            codec,
            threads,
            uploads: dst.storage().default_concurrency().clamp(2, 8),
            index_every: DEFAULT_INDEX_EVERY,
            memory: None,
            index_stored: false,
        }
    }
}

/// The bytes a pack of `repo` may take in memory while it is filled: its buffer is made this
/// large once (the target size and an eighth, so the blob that passes the target fits).
pub fn pack_buffer(repo: &Repository) -> u64 {
    let target = u64::from(repo.config().pack_size);
    target + target / 8
}

/// What a pack writer wrote.
#[derive(Debug, Default)]
pub struct Written {
    /// Bytes of packs stored.
    pub bytes_stored: AtomicU64,
    /// Packs stored.
    pub packs: AtomicU64,
    /// Index files written.
    pub index_files: Mutex<Vec<IndexId>>,
    /// The blobs of the packs indexed, by codec.
    pub by_codec: Mutex<BTreeMap<String, CodecUse>>,
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
    let buffer = pack_buffer(repo);
    let budget = opts.memory.map(|bytes| Budget::new(bytes.max(PACKS_MIN * buffer)));
    // Two packs in memory for each packer at least (see WriteOptions::memory).
    let fit = budget.as_ref().map_or(usize::MAX, |b| (b.limit() / buffer / PACKS_MIN).max(1) as usize);
    let threads = opts.threads.max(1).min(fit);
    let live_uploaders = AtomicUsize::new(uploads);
    std::thread::scope(|s| {
        let (stored_tx, stored_rx) = bounded::<IndexedPack>(uploads * 2);
        let (packs_tx, packs_rx) = bounded::<Sealed<'_>>(uploads);
        let (jobs_tx, jobs_rx) = bounded::<Job>(threads * 4);
        let indexer = s.spawn(move || index::index_packs(repo, stored_rx, opts, written));
        let live = &live_uploaders;
        let uploaders: Vec<_> = (0..uploads)
            .map(|_| {
                let (rx, tx) = (packs_rx.clone(), stored_tx.clone());
                s.spawn(move || {
                    let done = upload::run(repo, rx, tx, opts.index_stored, written);
                    live.fetch_sub(1, Ordering::Relaxed);
                    done
                })
            })
            .collect();
        drop((stored_tx, packs_rx));
        // A packer waiting for room gives up once no uploader is left to make it.
        let room = budget.as_ref().map(|b| packer::Room { budget: b, bytes: buffer, gone: live });
        let packers: Vec<_> = (0..threads)
            .map(|_| {
                let (rx, tx, room) = (jobs_rx.clone(), packs_tx.clone(), room.clone());
                s.spawn(move || packer::run(repo, rx, tx, opts.codec, room))
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

/// A finished pack on its way to be stored, with the room it holds in the writer's memory
/// budget (freed once it is stored).
pub(crate) struct Sealed<'b> {
    pack: FinishedPack,
    room: Option<Reservation<'b>>,
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
