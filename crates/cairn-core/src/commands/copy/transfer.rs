//! Transfer stage: the blobs the destination lacks are read from the source through the shared
//! read path in *stored* mode — each verified (decrypted, decompressed, its ID recomputed under
//! the source's key) and handed on still compressed — and given to the shared pack writer, which
//! re-encrypts them under the destination's keys without recompressing.
//!
//! When the two repositories name blobs with different keys, each blob is also named under the
//! destination's key here (its plaintext hashed: decompressed once more, or as it is when stored
//! uncompressed); the destination may hold it already under that name, and then it is not
//! written again. The new names are kept in the marks (`marks.rs`) for the rewrite stage.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::Sender;

use super::marks::Marks;
use super::CopyProgress;
use crate::engine::packwrite::{Job, Payload};
use crate::engine::read::{coalesce, coalesce_gap, Decoded, PackRead, ReadRef, Reader, Sink};
use crate::engine::repository::Repository;
use crate::error::{Error, Result};
use cairn_format::compress::Codec;
use cairn_format::id::BlobId;
use cairn_format::index::BlobLocation;
use cairn_format::layout::pack_path;
use cairn_format::pack::BlobEntry;

/// How the transfer reads.
#[derive(Clone, Copy, Debug)]
pub struct ReadOptions {
    /// Reads in flight.
    pub fetchers: usize,
    /// Threads that verify (and, between unrelated repositories, rename) what was read.
    pub decoders: usize,
}

/// Where the copied blobs go, shared by the transfer's workers and the rewrite stage.
pub(super) struct Destination<'a> {
    /// The source (the marks are kept by its index's positions).
    pub src: &'a Repository,
    /// The destination.
    pub repo: &'a Repository,
    /// Whether blob IDs must be recomputed under the destination's key.
    pub rekey: bool,
    /// What is known of each source blob (its destination ID when `rekey`).
    pub marks: &'a Marks,
    /// Blobs given to the pack writer.
    pub blobs_written: AtomicU64,
}

impl Destination<'_> {
    /// Whether `id` (a destination ID) must be written: the destination has no live copy. (The
    /// walk meets each source blob once, and distinct source blobs have distinct plaintexts, so
    /// this copy never gives the pack writer one blob twice.)
    pub fn wants(&self, id: BlobId) -> bool {
        !self.repo.index().contains_live(&id)
    }

    /// Hands a blob to the pack writer; false if it stopped.
    pub fn send(&self, jobs: &Sender<Job>, job: Job) -> bool {
        self.blobs_written.fetch_add(1, Ordering::Relaxed);
        jobs.send(job).is_ok()
    }
}

/// Reads one batch of `blobs` (source locations) and hands those the destination lacks to
/// `jobs`. A blob that cannot be read is an error naming it.
pub(super) fn transfer(
    dst: &Destination<'_>,
    blobs: Vec<BlobLocation>,
    budget: u64,
    opts: &ReadOptions,
    jobs: &Sender<Job>,
    progress: &CopyProgress,
    cancel: Arc<AtomicBool>,
) -> Result<()> {
    let src = dst.src;
    let reads = coalesce(blobs, budget / 4, coalesce_gap(src));
    progress.total_bytes.fetch_add(reads.iter().map(|r| r.length).sum(), Ordering::Relaxed);
    let failures = Mutex::new(Vec::new());
    let reader = Reader::new(src, budget, cancel);
    std::thread::scope(|s| {
        let sink = ToDestination { jobs: jobs.clone(), dst, failures: &failures, progress };
        for w in reader.start(s, &reads, opts.fetchers, opts.decoders, sink) {
            w.join().expect("copy worker panicked");
        }
    });
    if reader.cancelled() {
        return Err(Error::Interrupted);
    }
    let failures = failures.into_inner().expect("failures lock");
    match failures.first() {
        Some(first) => Err(Error::Refused(format!(
            "{first}{}; no snapshot was copied: run `cairn check --read-data` on the source",
            if failures.len() > 1 { format!(" (and {} more blobs)", failures.len() - 1) } else { String::new() }
        ))),
        None => Ok(()),
    }
}

/// The copy's end of the read path: each verified blob becomes a job for the destination's
/// pack writer.
#[derive(Clone)]
struct ToDestination<'a> {
    jobs: Sender<Job>,
    dst: &'a Destination<'a>,
    failures: &'a Mutex<Vec<String>>,
    progress: &'a CopyProgress,
}

impl ToDestination<'_> {
    fn fail(&self, msg: String) {
        self.failures.lock().expect("failures lock").push(msg);
    }

    /// The blob's ID under the destination's key, from its stored bytes.
    fn renamed(&self, entry: &BlobEntry, stored: &[u8], read: &PackRead) -> Option<BlobId> {
        let key = self.dst.repo.key();
        let id = if entry.codec == Codec::None {
            key.blob_id(stored)
        } else {
            match entry.codec.decompress(stored, entry.raw_length as usize) {
                Ok(plain) => key.blob_id(&plain),
                Err(why) => {
                    self.fail(format!("{}: blob {}: {why}", pack_path(&read.pack), entry.id.short()));
                    return None;
                }
            }
        };
        let pos = self.dst.src.index().position(&entry.id)?;
        self.dst.marks.name(pos, id);
        Some(id)
    }
}

impl<'s> Sink<'s> for ToDestination<'s> {
    fn stored_only(&self) -> bool {
        true
    }

    fn blobs(&self, read: ReadRef<'s>, blobs: Vec<Decoded<'s>>) -> bool {
        for d in blobs {
            let Some(entry) = read.blobs.iter().find(|b| b.id == d.id) else { continue };
            self.progress.read_bytes.fetch_add(u64::from(entry.length), Ordering::Relaxed);
            let id = if self.dst.rekey {
                match self.renamed(entry, &d.data, read.read) {
                    Some(id) if self.dst.wants(id) => id,
                    _ => continue,
                }
            } else {
                entry.id
            };
            let payload = Payload::Stored { codec: entry.codec, raw_length: entry.raw_length, bytes: d.data.to_vec() };
            if !self.dst.send(&self.jobs, Job { id, kind: entry.kind, payload }) {
                return false;
            }
        }
        true
    }

    fn failed(&self, read: ReadRef<'s>, blob: &BlobEntry, why: &Error) {
        self.fail(format!("blob {} of the source's {} cannot be read: {why}", blob.id.short(), pack_path(&read.pack)));
    }
}
