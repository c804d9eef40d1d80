//! A backup's `--max-memory`: what of it the packs may hold (docs/DESIGN.md, "Backup memory").
//!
//! The packs being filled, waiting and being stored are the one part of a backup's memory set
//! by configuration rather than by the data (pack size × threads and uploads: 160 MiB with the
//! defaults on two cores), so they are what the budget bounds: half of what the index leaves.
//! The other half is for what grows with the data — the largest directory's entries, its
//! parent tree, the blobs added to the index — and for the files being read.

use crate::error::{Error, Result};
use crate::memory::mib;
use crate::packwrite::{pack_buffer, PACKS_MIN};
use crate::repository::Repository;

/// The bytes the pack writer may hold for a backup of `repo` within `max_memory`, or why it
/// cannot run within it.
pub(super) fn pack_share(repo: &Repository, max_memory: u64) -> Result<u64> {
    let index = repo.index().memory_bytes();
    let share = max_memory.saturating_sub(index) / 2;
    let least = PACKS_MIN * pack_buffer(repo);
    if share < least {
        return Err(Error::Usage(format!(
            "--max-memory {} MiB is too small for this repository: its index takes {} MiB and half of \
             the rest goes to packs, which need {} MiB at least ({} packs of {} MiB); give at least {} MiB",
            mib(max_memory),
            mib(index),
            mib(least),
            PACKS_MIN,
            mib(pack_buffer(repo)),
            mib(index + 2 * least).max(1),
        )));
    }
    Ok(share)
}
