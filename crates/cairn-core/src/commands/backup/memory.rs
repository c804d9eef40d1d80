//! A backup's `--max-memory`: what of it the packs may hold (docs/DESIGN.md, "Backup memory").
//!
//! The packs being filled, waiting and being stored are the one part of a backup's memory set
//! by configuration rather than by the data (pack size × threads and uploads: 160 MiB with the
//! defaults on two cores), so they are what the budget bounds: half of what the index leaves.
//! The other half is for what grows with the data — the largest directory's entries, its
//! parent tree, the blobs added to the index — and for the files being read.

use crate::engine::memory::PACKS_MIN;
use crate::engine::memory::{mib, MaxMemory};
use crate::engine::packwrite::pack_buffer;
use crate::engine::repository::Repository;
use crate::error::Result;

/// The bytes the pack writer may hold for a backup of `repo` within `max_memory`, or why it
/// cannot run within it.
pub(super) fn pack_share(repo: &Repository, max_memory: u64) -> Result<u64> {
    let index = repo.index().memory_bytes();
    let least = PACKS_MIN * pack_buffer(repo);
    let what = format!(
        "the packs ({PACKS_MIN} of {} MiB at least) and, as much again, what is being read",
        mib(pack_buffer(repo))
    );
    let budget = MaxMemory::Given(max_memory).budget("backup", "the index", index, &what, index + 2 * least)?;
    Ok((budget - index) / 2)
}
