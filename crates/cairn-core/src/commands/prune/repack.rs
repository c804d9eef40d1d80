//! Repack stage: the blobs still needed from packs being repacked are read through the shared
//! read path (verified: decrypted, decompressed and their IDs recomputed) and handed to the
//! shared pack writer as they are stored — compressed bytes copied, only re-encrypted under
//! the new pack's key — or, when the plan re-encodes them, as plaintext for the new codec.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use crossbeam_channel::Sender;

use super::memory::Shares;
use super::plan::{PlanOptions, PlannedPack};
use crate::engine::packwrite::{write_packs, Job, Payload, WriteOptions, Written};
use crate::engine::read::{coalesce, coalesce_gap, Decoded, ReadRef, Reader, Sink};
use crate::engine::repository::Repository;
use crate::error::{Error, Result};
use cairn_format::index::BlobLocation;
use cairn_format::layout::pack_path;
use cairn_format::pack::BlobEntry;

/// How a repack reads and writes (in memory, within [`Shares`]).
#[derive(Clone, Copy, Debug)]
pub struct RepackOptions {
    /// Reads in flight.
    pub fetchers: usize,
    /// Threads that verify what was read.
    pub decoders: usize,
    /// How new packs are written.
    pub write: WriteOptions,
}

impl RepackOptions {
    /// The defaults for `plan` in `repo`: `fetchers` reads in flight if given, else the
    /// backend's concurrency (at least 8); decoders on every core. Copying stored blobs only
    /// encrypts (one packer keeps up with the reads and holds one pack in memory); re-encoding
    /// compresses, on every core.
    pub fn new(repo: &Repository, plan: &PlanOptions, fetchers: Option<usize>) -> Self {
        let cores = crate::engine::platform::cores();
        let codec = plan.recompress.as_ref().map_or_else(|| repo.config().codec(), |r| r.to);
        let reencodes = plan.recompress.is_some() || plan.repack_uncompressed;
        let packers = if reencodes { cores } else { 1 };
        RepackOptions {
            fetchers: fetchers.unwrap_or(repo.storage().default_concurrency().max(8)).max(1),
            decoders: cores,
            write: WriteOptions::rewriting(repo, codec, packers),
        }
    }
}

/// `packs` cut into batches of whole packs (at least one each) whose claimed blobs number at
/// most `most`, so a repack of a million blobs does not plan them all at once (150 MB of
/// `many`'s prune).
fn batches<'p, 'q>(packs: &'p [&'q PlannedPack], most: usize) -> Vec<&'p [&'q PlannedPack]> {
    let mut out = Vec::new();
    let (mut first, mut blobs) = (0, 0);
    for (i, p) in packs.iter().enumerate() {
        if i > first && blobs + p.claimed_count() > most {
            out.push(&packs[first..i]);
            (first, blobs) = (i, 0);
        }
        blobs += p.claimed_count();
    }
    if first < packs.len() {
        out.push(&packs[first..]);
    }
    out
}

/// Copies the claimed blobs of `packs` into new packs (and index files for them, listed in
/// `written`), a batch of packs at a time. A blob that cannot be read is an error naming it:
/// the prune then deletes nothing.
pub fn repack(
    repo: &Repository,
    packs: &[&PlannedPack],
    plan: &PlanOptions,
    opts: &RepackOptions,
    shares: &Shares,
    written: &Written,
    cancel: Arc<AtomicBool>,
) -> Result<()> {
    let failures = Mutex::new(Vec::new());
    let write = WriteOptions { memory: Some(shares.write), ..opts.write };
    write_packs(repo, &write, written, |jobs| {
        for batch in batches(packs, shares.batch_blobs) {
            let located: Vec<BlobLocation> = batch
                .iter()
                .enumerate()
                .flat_map(|(no, p)| {
                    p.claimed().map(move |&entry| BlobLocation {
                        pack: p.pack.id,
                        pack_no: no as u32,
                        salt: p.pack.salt,
                        entry,
                    })
                })
                .collect();
            let budget = shares.read / 2;
            let reads = coalesce(located, budget / 4, coalesce_gap(repo));
            let reader = Reader::new(repo, budget, cancel.clone());
            std::thread::scope(|s| {
                let sink = ToPacks { jobs: jobs.clone(), plan, failures: &failures };
                for w in reader.start(s, &reads, opts.fetchers, opts.decoders, sink) {
                    w.join().expect("repack worker panicked");
                }
            });
            if reader.cancelled() {
                return Err(Error::Interrupted);
            }
            if !failures.lock().expect("failures lock").is_empty() {
                break;
            }
        }
        match failures.lock().expect("failures lock").drain(..).next() {
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

    fn blobs(&self, read: ReadRef<'s>, blobs: Vec<Decoded<'s>>) -> bool {
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

    fn failed(&self, read: ReadRef<'s>, blob: &BlobEntry, why: &Error) {
        self.fail(format!("blob {} of {} cannot be read: {why}", blob.id.short(), pack_path(&read.pack)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::prune::plan::Fate;
    use cairn_format::compress::Codec;
    use cairn_format::id::{BlobId, PackId};
    use cairn_format::index::IndexedPack;
    use cairn_format::pack::BlobKind;

    fn pack(claimed: usize) -> PlannedPack {
        let entry = BlobEntry {
            id: BlobId([1; 32]),
            kind: BlobKind::Data,
            codec: Codec::None,
            offset: 0,
            length: 1,
            raw_length: 1,
        };
        PlannedPack {
            pack: IndexedPack {
                id: PackId([2; 32]),
                salt: [0; cairn_format::crypto::SALT_LEN],
                blobs: vec![entry; claimed],
            },
            size: 1,
            fate: Fate::Repack,
            claimed: (0..claimed as u32).collect(),
        }
    }

    /// Whole packs, in order, each batch within the budget's blobs unless one pack alone is over.
    #[test]
    fn batches_are_whole_packs_within_the_blobs_the_budget_allows() {
        let owned: Vec<PlannedPack> = [10, 20, 10, 5, 100, 1, 39].into_iter().map(pack).collect();
        let packs: Vec<&PlannedPack> = owned.iter().collect();
        let sizes: Vec<Vec<usize>> =
            batches(&packs, 40).iter().map(|b| b.iter().map(|p| p.claimed_count()).collect()).collect();
        assert_eq!(sizes, [vec![10, 20, 10], vec![5], vec![100], vec![1, 39]]);
        assert!(batches(&[], 40).is_empty());
    }
}
