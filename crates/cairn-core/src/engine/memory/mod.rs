//! Memory budgets. [`Budget`] bounds the bytes in flight through a read or a pack writer;
//! the functions below size the budget of a whole command: the
//! `--max-memory` of the commands whose fixed part grows with the repository (`prune`, `copy`,
//! and the walks of `ls`, `find`, `diff`, `stats`): the index and what they keep per blob come
//! first, and the rest is shared among their stages.

mod budget;

pub use budget::{Budget, Reservation};

use crate::error::{Error, Result};

/// The fewest packs a pack writer's memory must hold: one data and one tree pack being filled.
pub const PACKS_MIN: u64 = 2;

/// The smallest share for reads in flight: reads of 1 MiB, a few at once (a larger blob is read
/// alone).
pub const READ_MIN: u64 = 4 << 20;

/// The budget when none is given.
pub const DEFAULT_MAX_MEMORY: u64 = 256 << 20;

/// A command's `--max-memory`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxMemory {
    /// Given: a bound; a budget below what the repository needs is refused.
    Given(u64),
    /// Not given: [`DEFAULT_MAX_MEMORY`], raised to what the repository needs (a large
    /// repository's prune or copy runs rather than stopping to ask).
    Default,
}

impl MaxMemory {
    /// From an optional size given by the user.
    pub fn from_option(bytes: Option<u64>) -> Self {
        bytes.map_or(MaxMemory::Default, MaxMemory::Given)
    }

    /// The budget of a command that needs `least` bytes: `fixed` of them for what grows with
    /// the repository (named by `fixed_what`, e.g. "the index"), the rest for `what` (the rest's
    /// stages). A given budget below `least` is an error naming both and the least to give.
    pub fn budget(self, command: &str, fixed_what: &str, fixed: u64, what: &str, least: u64) -> Result<u64> {
        match self {
            MaxMemory::Given(b) if b < least => Err(Error::Usage(format!(
                "--max-memory {} MiB is too small for this {command}: {fixed_what}: {} MiB; {what}: {} MiB \
                 more; give at least {} MiB",
                mib(b),
                mib(fixed),
                mib(least - fixed),
                mib(least),
            ))),
            MaxMemory::Given(b) => Ok(b),
            MaxMemory::Default => Ok(DEFAULT_MAX_MEMORY.max(least)),
        }
    }
}

/// What a command that reads blobs and writes packs (`prune`, `copy`) has left of `max_memory`
/// beside `fixed` bytes (named by `fixed_what`), when it gives three eighths of that to a pack
/// writer whose packs take `pack_buffer` bytes each (two at least) and three eighths or more to
/// reads (4 MiB at least).
pub fn left_for_reads_and_packs(
    max_memory: MaxMemory,
    command: &str,
    fixed_what: &str,
    fixed: u64,
    pack_buffer: u64,
) -> Result<u64> {
    let least = fixed + (PACKS_MIN * pack_buffer).max(READ_MIN) * 8 / 3 + 1;
    let budget = max_memory.budget(command, fixed_what, fixed, "the reads and packs in flight", least)?;
    Ok(budget - fixed)
}

/// Whole MiB, rounded up.
pub fn mib(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_budget_bounds_and_the_default_grows_to_what_is_needed() {
        let least = 300 << 20;
        let err = MaxMemory::Given(64 << 20)
            .budget("prune", "the index and its files", 200 << 20, "reads", least)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "--max-memory 64 MiB is too small for this prune: the index and its files: 200 MiB; reads: 100 MiB \
             more; give at least 300 MiB"
        );
        assert_eq!(MaxMemory::Given(least).budget("prune", "x", 0, "y", least).unwrap(), least);
        assert_eq!(MaxMemory::Default.budget("prune", "x", 0, "y", least).unwrap(), least);
        assert_eq!(MaxMemory::Default.budget("prune", "x", 0, "y", 1).unwrap(), DEFAULT_MAX_MEMORY);
        assert_eq!(MaxMemory::from_option(None), MaxMemory::Default);
    }
}
