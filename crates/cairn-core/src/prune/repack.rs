//! Repack stage: the blobs still needed from packs being repacked are read through the shared
//! read path (verified: decrypted, decompressed and their IDs recomputed) and handed to the
//! shared pack writer as they are stored — compressed bytes copied, only re-encrypted under
//! the new pack's key — or, when the plan re-encodes them, as plaintext for the new codec.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use crossbeam_channel::Sender;

use super::plan::{PlanOptions, PlannedPack};
use crate::error::{Error, Result};
use crate::index::BlobLocation;
use crate::layout::pack_path;
use crate::pack::BlobEntry;
use crate::packwrite::{write_packs, Job, Payload, WriteOptions, Written};
use crate::read::{coalesce, coalesce_gap, Decoded, PackRead, Reader, Sink};
use crate::repository::Repository;

/// How a repack reads and writes.
#[derive(Clone, Copy, Debug)]
pub struct RepackOptions {
    /// Bytes in flight on the read side.
    pub max_memory: u64,
    /// Reads in flight.
    pub fetchers: usize,
    /// Threads that verify what was read.
    pub decoders: usize,
    /// How new packs are written.
    pub write: WriteOptions,
}

/// Copies the claimed blobs of `packs` into new packs (and index files for them, listed in
/// `written`). A blob that cannot be read is an error naming it: the prune then deletes nothing.
pub fn repack(
    repo: &Repository,
    packs: &[&PlannedPack],
    plan: &PlanOptions,
    opts: &RepackOptions,
    written: &Written,
    cancel: Arc<AtomicBool>,
) -> Result<()> {
    let located: Vec<BlobLocation> = packs
        .iter()
        .enumerate()
        .flat_map(|(no, p)| {
            p.claimed.iter().map(move |&entry| BlobLocation {
                pack: p.pack.id,
                pack_no: no as u32,
                salt: p.pack.salt,
                entry,
            })
        })
        .collect();
    let reads = coalesce(located, opts.max_memory / 4, coalesce_gap(repo));
    let failures = Mutex::new(Vec::new());
    let reader = Reader::new(repo, opts.max_memory, cancel);
    write_packs(repo, &opts.write, written, |jobs| {
        std::thread::scope(|s| {
            let sink = ToPacks { jobs, plan, failures: &failures };
            for w in reader.start(s, &reads, opts.fetchers, opts.decoders, sink) {
                w.join().expect("repack worker panicked");
            }
        });
        if reader.cancelled() {
            return Err(Error::Interrupted);
        }
        match failures.into_inner().expect("failures lock").into_iter().next() {
            Some(first) => Err(Error::Refused(format!(
                "{first}; prune deletes nothing: run `cairn check --read-data`, then `cairn repair packs`"
            ))),
            None => Ok(()),
        }
    })
}

/// The repack's end of the read path: each verified blob becomes a job for the pack writer.
#[derive(Clone)]
struct ToPacks<'a> {
    jobs: Sender<Job>,
    plan: &'a PlanOptions,
    failures: &'a Mutex<Vec<String>>,
}

impl ToPacks<'_> {
    fn fail(&self, msg: String) {
        self.failures.lock().expect("failures lock").push(msg);
    }
}

impl<'s> Sink<'s> for ToPacks<'s> {
    fn stored_only(&self) -> bool {
        true
    }

    fn blobs(&self, read: &'s PackRead, blobs: Vec<Decoded<'s>>) -> bool {
        for d in blobs {
            let Some(entry) = read.blobs.iter().find(|b| b.id == d.id) else { continue };
            let payload = if self.plan.reencodes(entry) {
                match entry.codec.decompress(&d.data, entry.raw_length as usize) {
                    Ok(plain) => Payload::Plain(plain),
                    Err(why) => {
                        self.fail(format!("{}: blob {}: {why}", pack_path(&read.pack), entry.id.short()));
                        continue;
                    }
                }
            } else {
                Payload::Stored { codec: entry.codec, raw_length: entry.raw_length, bytes: d.data.to_vec() }
            };
            if self.jobs.send(Job { id: entry.id, kind: entry.kind, payload }).is_err() {
                return false;
            }
        }
        true
    }

    fn failed(&self, read: &'s PackRead, blob: &BlobEntry, why: &Error) {
        self.fail(format!("blob {} of {} cannot be read: {why}", blob.id.short(), pack_path(&read.pack)));
    }
}
