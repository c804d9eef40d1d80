//! A prune's `--max-memory` (docs/DESIGN.md, "Prune memory"): the whole prune's bound.
//!
//! What the prune holds from start to end grows with the repository: the index (56 bytes a
//! blob), the index files it read (kept for the plan: 56 bytes a blob listed) and the plan's
//! claims and marks (about 4 bytes a blob). Of what they leave, three eighths are for the new
//! packs being filled and stored, an eighth for the batch of blobs being located, and the
//! rest for reads in flight.

use std::mem::size_of;

use super::plan::PlannedPack;
use crate::engine::memory::{left_for_reads_and_packs, MaxMemory};
use crate::engine::packwrite::pack_buffer;
use crate::engine::repository::Repository;
use crate::error::Result;
use cairn_format::id::IndexId;
use cairn_format::index::IndexedPack;
use cairn_format::pack::BlobEntry;

/// Bytes a blob of a batch takes with its location and its read.
const BATCH_BLOB_BYTES: u64 = 200;

/// The shares of a prune's `--max-memory`.
#[derive(Clone, Copy, Debug)]
pub struct Shares {
    /// Bytes of reads in flight (the reader admits half as many, because a read's reused
    /// buffer may be up to twice its size).
    pub read: u64,
    /// Bytes of new packs in memory.
    pub write: u64,
    /// Blobs located for one batch of the repack.
    pub batch_blobs: usize,
}

impl Shares {
    /// The shares of `max_memory` for a prune of `repo`, whose index is built from `files`,
    /// or why it cannot run within it.
    pub fn of(repo: &Repository, files: &[(IndexId, Vec<IndexedPack>)], max_memory: MaxMemory) -> Result<Shares> {
        let fixed = repo.index().memory_bytes() + held_bytes(files);
        let what = "the index and the index files it plans from";
        let left = left_for_reads_and_packs(max_memory, "prune", what, fixed, pack_buffer(repo))?;
        let (write, batches) = (left * 3 / 8, left / 8);
        let read = left - write - batches;
        let batch_blobs = (batches / BATCH_BLOB_BYTES).clamp(16, 262_144) as usize;
        Ok(Shares { read, write, batch_blobs })
    }
}

/// Bytes of the decoded index files once they are the plan's packs, with the plan's claims
/// (a number a blob) and its two bits a blob (needed, claimed).
fn held_bytes(files: &[(IndexId, Vec<IndexedPack>)]) -> u64 {
    let per_blob = size_of::<BlobEntry>() + size_of::<u32>();
    files
        .iter()
        .flat_map(|(_, packs)| packs)
        .map(|p| (size_of::<PlannedPack>() + p.blobs.capacity() * per_blob + p.blobs.len().div_ceil(4)) as u64)
        .sum()
}
