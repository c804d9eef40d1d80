//! A check's `--max-memory` (docs/DESIGN.md, "Check memory"): the whole check's bound.
//!
//! What a check holds from start to end grows with the repository: the index (56 bytes a
//! blob), the list of packs it checks with their blobs (56 bytes a blob, moved out of the
//! index files, not copied), the largest tree's plaintext twice (a decoder holds it while the
//! walk notes it), what its walk keeps of each tree, the sorted blob IDs of the
//! duplicate count, and, for a check of some snapshots, the set of blobs they need. Those are
//! counted first; the rest is for pack data in flight (the tree packs' reads, and the packs
//! `--read-data` reads).

use std::mem::size_of;

use super::structure::IndexedPackInfo;
use super::DEFAULT_MAX_MEMORY as DEFAULT_READS;
use crate::engine::memory::{MaxMemory, READ_MIN};
use crate::engine::repository::Repository;
use crate::error::Result;
use cairn_format::id::{BlobId, IdMap, PackId};
use cairn_format::pack::{BlobEntry, BlobKind};

/// What the walk keeps of one tree beside its subtrees' IDs: its map entry and the three lists
/// of `structure::Kept`.
const KEPT_PER_TREE: u64 = 160;

/// Per pack beside its blobs: its entry in the packs' map, the storage listing's entry, the
/// sets and lists of packs the check builds from them, and its index file's name.
const PER_PACK: u64 = 320;

/// Bytes a blob takes in a hash set of IDs (a check of some snapshots collects those they
/// need), allowing for the set's spare room.
const SET_PER_BLOB: u64 = 80;

/// The bytes of pack data in flight a check of `repo` may hold within `max_memory`, once the
/// index and `packs` are loaded, or why it cannot run within it. `filtered`: the check is of
/// some snapshots only. Without `--max-memory` the reads keep their own default
/// ([`super::data_budget`]: 16 MiB, more over a slow link) and the whole is not refused.
pub fn read_share(
    repo: &Repository,
    packs: &IdMap<PackId, IndexedPackInfo>,
    filtered: bool,
    max_memory: Option<u64>,
) -> Result<u64> {
    let index = repo.index();
    // The largest tree's plaintext, as its decoder holds it while the walk notes it (once per
    // decode thread at most; two are counted, as the walks of `ls` and `restore` do).
    let fixed = fixed_bytes(index.memory_bytes() + 2 * index.largest_tree(), packs, filtered);
    drop(index);
    share(fixed, max_memory, || super::data_budget(repo, None))
}

/// What is left for reads of a given `max_memory` beside `fixed` bytes, or why it is too small;
/// `default_reads` without one.
fn share(fixed: u64, max_memory: Option<u64>, default_reads: impl FnOnce() -> u64) -> Result<u64> {
    let least = fixed + READ_MIN.max(DEFAULT_READS / 4);
    let what = "the index, the packs it lists and what the walk keeps of each tree";
    let given = MaxMemory::from_option(max_memory);
    let budget = given.budget("check", what, fixed, "pack data in flight", least)?;
    Ok(match given {
        MaxMemory::Given(_) => budget - fixed,
        MaxMemory::Default => default_reads(),
    })
}

/// What a check holds whatever its reads (see the module's comment), beside `index` bytes for
/// the index and the largest trees being parsed.
fn fixed_bytes(index: u64, packs: &IdMap<PackId, IndexedPackInfo>, filtered: bool) -> u64 {
    let (mut blobs, mut entries, mut trees) = (0u64, 0u64, 0u64);
    for p in packs.values() {
        blobs += p.blobs.len() as u64;
        entries += (p.blobs.capacity() * size_of::<BlobEntry>()) as u64;
        trees += p.blobs.iter().filter(|b| b.kind == BlobKind::Tree).count() as u64;
    }
    let per_pack = packs.len() as u64 * (PER_PACK + size_of::<IndexedPackInfo>() as u64);
    // Each tree is some other tree's subtree at least once.
    let walk = trees * (KEPT_PER_TREE + size_of::<BlobId>() as u64);
    let needed = if filtered { blobs * SET_PER_BLOB } else { blobs * size_of::<BlobId>() as u64 };
    index + entries + per_pack + walk + needed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixed_part_counts_every_blob_listed_and_a_check_of_some_snapshots_more() {
        let blobs: Vec<BlobEntry> = (0..1000u32)
            .map(|i| BlobEntry {
                id: BlobId([i as u8; 32]),
                kind: if i % 10 == 0 { BlobKind::Tree } else { BlobKind::Data },
                codec: cairn_format::compress::Codec::None,
                offset: i * 100,
                length: 100,
                raw_length: 60,
            })
            .collect();
        let mut packs = IdMap::default();
        let info = IndexedPackInfo {
            id: PackId([1; 32]),
            salt: [0; cairn_format::crypto::SALT_LEN],
            blobs,
            size: 100_000,
            index_file: "x".into(),
        };
        packs.insert(info.id, info);
        let all = fixed_bytes(56_000, &packs, false);
        let entry = size_of::<BlobEntry>() as u64;
        assert!(all >= 56_000 + 1000 * (entry + 32) + 100 * 160, "{all}");
        assert!(fixed_bytes(56_000, &packs, true) > all);
        // A budget below the fixed part and the least reads is refused in one line naming the
        // least; exactly that least runs, its reads the rest; without one the reads' default.
        let err = share(all, Some(1 << 20), || 0).unwrap_err().to_string();
        assert!(err.contains("too small for this check") && err.contains("give at least"), "{err}");
        assert_eq!(err.lines().count(), 1);
        let least = all + READ_MIN.max(DEFAULT_READS / 4);
        assert_eq!(share(all, Some(least), || 0).unwrap(), least - all);
        assert_eq!(share(all, Some(least + 100), || 0).unwrap(), least + 100 - all);
        assert_eq!(share(all, None, || 7).unwrap(), 7);
    }
}
