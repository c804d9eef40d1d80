//! The index: blob ID → pack, offset, length, raw length, codec (FORMAT.md §8).
//!
//! On storage, an index file is a sealed file whose plaintext is a list of packs, each
//! `pack ID(32) | salt(32) | blob count u32 LE | entry * count` with the 48-byte entries of the
//! pack header. In memory the index is one sorted vector of 52-byte entries (ten million blobs
//! take about 500 MiB and load with one sort), or a sorted index file on disk
//! ([`crate::sorted`]), plus a hash map for blobs added since loading.

use std::borrow::Borrow;

use crate::crypto::SALT_LEN;
use crate::error::{Error, Result};
use crate::id::{BlobId, IdMap, IdSet, PackId, ID_LEN};
use crate::pack::{BlobEntry, ENTRY_LEN};
use crate::sorted::{id_prefix, sort_slots, DiskSlots, PackInfo, Slot};

/// One pack as listed in an index file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexedPack {
    /// The pack.
    pub id: PackId,
    /// Its salt.
    pub salt: [u8; SALT_LEN],
    /// Its blobs.
    pub blobs: Vec<BlobEntry>,
}

/// Encodes the plaintext of an index file.
pub fn encode(packs: &[IndexedPack]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in packs {
        out.extend_from_slice(&p.id.0);
        out.extend_from_slice(&p.salt);
        out.extend_from_slice(&(p.blobs.len() as u32).to_le_bytes());
        for b in &p.blobs {
            b.encode(&mut out);
        }
    }
    out
}

/// Decodes the plaintext of an index file; `name` is its path, for errors.
pub fn decode(name: &str, mut b: &[u8]) -> Result<Vec<IndexedPack>> {
    let mut packs = Vec::new();
    while !b.is_empty() {
        if b.len() < ID_LEN + SALT_LEN + 4 {
            return Err(Error::corrupt(name, "index ends inside a pack record"));
        }
        let id = PackId(b[..ID_LEN].try_into().expect("32"));
        let salt = b[ID_LEN..ID_LEN + SALT_LEN].try_into().expect("32");
        let n = u32::from_le_bytes(b[64..68].try_into().expect("4")) as usize;
        b = &b[68..];
        if b.len() / ENTRY_LEN < n {
            return Err(Error::corrupt(name, "index ends inside a blob entry"));
        }
        let blobs = b[..n * ENTRY_LEN]
            .chunks_exact(ENTRY_LEN)
            .map(|c| BlobEntry::decode(c).map_err(|why| Error::corrupt(name, why)))
            .collect::<Result<Vec<_>>>()?;
        b = &b[n * ENTRY_LEN..];
        packs.push(IndexedPack { id, salt, blobs });
    }
    Ok(packs)
}

/// Fewest blobs added since loading that are merged into the sorted slots.
const RECENT_MERGE_MIN: usize = 65_536;

/// Where to find a blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlobLocation {
    /// The pack holding it.
    pub pack: PackId,
    /// Number of that pack in this index (stable while the index lives).
    pub pack_no: u32,
    /// The pack's salt.
    pub salt: [u8; SALT_LEN],
    /// The blob's entry.
    pub entry: BlobEntry,
}

/// The blobs loaded with the index, sorted by ID: in memory, or in a sorted index file
/// ([`crate::sorted`]) of which only the bucket table is in memory.
enum Store {
    Memory(MemorySlots),
    Disk(DiskSlots),
}

impl Default for Store {
    fn default() -> Self {
        Store::Memory(MemorySlots::default())
    }
}

#[derive(Default)]
struct MemorySlots {
    sorted: Vec<Slot>,
    /// `starts[b]` is the first slot whose ID's top `bucket_bits` bits are `b` or more (and
    /// `starts[2^bits]` the number of slots): a lookup goes straight to its few candidates
    /// instead of binary-searching a vector far larger than the CPU cache.
    starts: Vec<u32>,
    bucket_bits: u32,
}

impl MemorySlots {
    fn new(sorted: Vec<Slot>) -> Self {
        let mut m = MemorySlots { sorted, ..Default::default() };
        // About one slot per bucket: 4 bytes per blob next to the slots' 52.
        m.bucket_bits = (m.sorted.len().max(1).next_power_of_two().trailing_zeros()).max(1);
        let buckets = 1usize << m.bucket_bits;
        m.starts = Vec::with_capacity(buckets + 1);
        let mut slot = 0;
        for b in 0..=buckets {
            while slot < m.sorted.len() && m.bucket(&m.sorted[slot].entry.id) < b {
                slot += 1;
            }
            m.starts.push(slot as u32);
        }
        m
    }

    /// The bucket of an ID: its top `bucket_bits` bits.
    fn bucket(&self, id: &BlobId) -> usize {
        (id_prefix(id) >> (64 - self.bucket_bits)) as usize
    }

    fn position(&self, id: &BlobId) -> Option<usize> {
        if self.starts.is_empty() {
            return None; // nothing loaded
        }
        let b = self.bucket(id);
        let (start, end) = (self.starts[b] as usize, self.starts[b + 1] as usize);
        self.sorted[start..end].iter().position(|s| s.entry.id == *id).map(|at| start + at)
    }
}

/// The index of every blob in the repository.
///
/// Packs a pending prune is about to delete (FORMAT.md §13) are *doomed*: where a blob is in a
/// doomed pack and another, the other copy is the one found, and [`Index::contains_live`] says
/// whether a blob has a copy that is not doomed (a backup stores a blob again rather than
/// deduplicate against one about to be deleted).
///
/// The blobs loaded with it are sorted in memory (52 bytes a blob), or, for an index too large
/// for a command's memory, in a sorted index file on disk ([`Index::on_disk`]): the callers
/// cannot tell which but by [`Index::memory_bytes`]. Blobs added since loading are kept in
/// memory either way. What commands ask of all of a pack's blobs ([`Index::pack_ends`],
/// [`Index::tree_packs`], [`Index::largest_tree`]) is counted into the pack table as blobs are
/// loaded or added, so no command walks every blob.
#[derive(Default)]
pub struct Index {
    packs: Vec<PackInfo>,
    store: Store,
    recent: IdMap<BlobId, Slot>,
}

impl Index {
    /// Builds an index from decoded index files.
    pub fn from_packs<P: Borrow<IndexedPack>>(all: impl IntoIterator<Item = P>) -> Self {
        Self::with_doomed(all, &IdSet::default())
    }

    /// Builds an index from decoded index files (owned, or borrowed by a caller that keeps
    /// them: no copy of them is made), the packs in `doomed` about to be deleted.
    pub fn with_doomed<P: Borrow<IndexedPack>>(all: impl IntoIterator<Item = P>, doomed: &IdSet<PackId>) -> Self {
        let all: Vec<P> = all.into_iter().collect();
        Self::from_parts(
            all.iter().map(|p| {
                let p = p.borrow();
                (p.id, p.salt, &p.blobs[..])
            }),
            doomed,
        )
    }

    /// Builds an index from each pack's ID, salt and blobs, wherever the caller keeps them (a
    /// check keeps its packs' blobs sorted by offset in a list of its own: no second copy).
    pub fn from_parts<'a>(
        all: impl IntoIterator<Item = (PackId, [u8; SALT_LEN], &'a [BlobEntry])>,
        doomed: &IdSet<PackId>,
    ) -> Self {
        let all: Vec<(PackId, [u8; SALT_LEN], &[BlobEntry])> = all.into_iter().collect();
        let mut packs = Vec::with_capacity(all.len());
        // Sized once: growing by doubling held up to three times the slots at the peak.
        let mut sorted = Vec::with_capacity(all.iter().map(|p| p.2.len()).sum());
        for (id, salt, blobs) in all {
            let pack = packs.len() as u32;
            let mut info = PackInfo::new(id, salt, doomed.contains(&id));
            blobs.iter().for_each(|e| info.count(e));
            packs.push(info);
            sorted.extend(blobs.iter().map(|&entry| Slot { entry, pack }));
        }
        // Of several copies of a blob, the first is kept: one in a pack that stays, if any.
        sort_slots(&mut sorted, |p| packs[p as usize].doomed);
        Index { packs, store: Store::Memory(MemorySlots::new(sorted)), recent: IdMap::default() }
    }

    /// An index whose loaded blobs are in a sorted index file, with its pack table (see
    /// [`crate::sorted`]).
    pub fn on_disk(packs: Vec<PackInfo>, slots: DiskSlots) -> Self {
        Index { packs, store: Store::Disk(slots), recent: IdMap::default() }
    }

    /// Whether the loaded blobs are in a sorted index file.
    pub fn is_on_disk(&self) -> bool {
        matches!(self.store, Store::Disk(_))
    }

    /// Whether a lookup in the sorted index file found it damaged (later lookups of loaded
    /// blobs answer "not found"; the file has been told, and is rebuilt by the next command).
    pub fn is_damaged(&self) -> bool {
        matches!(&self.store, Store::Disk(d) if d.is_damaged())
    }

    /// Moves the blobs added since loading into the sorted slots once they are a quarter as
    /// many (and at least [`RECENT_MERGE_MIN`]): a hash map entry costs about three times a
    /// slot, and growing the map held its old and new tables at once, so a backup adding a
    /// million blobs peaked at 267 MB for them instead of about 60 MB. Each merge copies
    /// the slots once; growing by a quarter each time, that is a few copies of each in all.
    /// (Slots in a sorted index file stay there: what is added stays in memory.)
    fn merge_recent_if_large(&mut self) {
        let Store::Memory(m) = &mut self.store else { return };
        if self.recent.len() < RECENT_MERGE_MIN.max(m.sorted.len() / 4) {
            return;
        }
        let mut sorted = std::mem::take(&mut m.sorted);
        sorted.reserve_exact(self.recent.len());
        sorted.extend(std::mem::take(&mut self.recent).into_values());
        let packs = &self.packs;
        sort_slots(&mut sorted, |p| packs[p as usize].doomed);
        *m = MemorySlots::new(sorted);
    }

    /// Adds the blobs of a pack written since loading.
    pub fn add_pack(&mut self, p: &IndexedPack) {
        let pack = self.packs.len() as u32;
        let mut info = PackInfo::new(p.id, p.salt, false);
        p.blobs.iter().for_each(|e| info.count(e));
        self.packs.push(info);
        for &entry in &p.blobs {
            self.recent.entry(entry.id).or_insert(Slot { entry, pack });
        }
        self.merge_recent_if_large();
    }

    fn location(&self, slot: Slot) -> BlobLocation {
        let p = &self.packs[slot.pack as usize];
        BlobLocation { pack: p.id, pack_no: slot.pack, salt: p.salt, entry: slot.entry }
    }

    /// Finds an ID among the loaded slots: a restore looks up every chunk of the tree (binary
    /// search took 129 ms for the Linux tree's 80,000 chunks, nearly all of it cache misses).
    fn find_loaded(&self, id: &BlobId) -> Option<(usize, Slot)> {
        match &self.store {
            Store::Memory(m) => m.position(id).map(|at| (at, m.sorted[at])),
            Store::Disk(d) => d.find(id, self.packs.len()),
        }
    }

    /// Finds a blob.
    pub fn get(&self, id: &BlobId) -> Option<BlobLocation> {
        let slot = match self.find_loaded(id) {
            Some((_, s)) => s,
            None => *self.recent.get(id)?,
        };
        Some(self.location(slot))
    }

    /// Where `id` lies among the blobs loaded with the index, in `0..self.len()`: a dense number
    /// a command can key a side table by (a bit or an ID per blob instead of a hash map
    /// entry). Stable until a pack is added; `None` for blobs added since loading and unknown
    /// ones.
    pub fn position(&self, id: &BlobId) -> Option<usize> {
        self.find_loaded(id).map(|(at, _)| at)
    }

    /// The blob at `pos` (of [`Index::position`]); `None` only where a sorted index file turned
    /// out damaged.
    pub fn at(&self, pos: usize) -> Option<BlobLocation> {
        let slot = match &self.store {
            Store::Memory(m) => m.sorted[pos],
            Store::Disk(d) => d.at(pos, self.packs.len())?,
        };
        Some(self.location(slot))
    }

    /// Whether the repository holds this blob.
    pub fn contains(&self, id: &BlobId) -> bool {
        self.find_loaded(id).is_some() || self.recent.contains_key(id)
    }

    /// Whether the repository holds this blob in a pack no pending prune is about to delete.
    pub fn contains_live(&self, id: &BlobId) -> bool {
        match self.find_loaded(id) {
            Some((_, s)) => !self.packs[s.pack as usize].doomed,
            None => self.recent.contains_key(id),
        }
    }

    /// Whether pack number `pack_no` (of a [`BlobLocation`]) is about to be deleted.
    pub fn is_doomed(&self, pack_no: u32) -> bool {
        self.packs.get(pack_no as usize).is_some_and(|p| p.doomed)
    }

    fn loaded(&self) -> usize {
        match &self.store {
            Store::Memory(m) => m.sorted.len(),
            Store::Disk(d) => d.len(),
        }
    }

    /// Number of distinct blobs.
    pub fn len(&self) -> usize {
        self.loaded() + self.recent.len()
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the index takes in memory, which a command's `--max-memory` counts: in memory,
    /// about 56 a blob (its 52-byte slot and 4 of lookup table); in a sorted index file, 1 a
    /// blob (its bucket table) and 80 a pack; and the blobs added since loading.
    pub fn memory_bytes(&self) -> u64 {
        use std::mem::size_of;
        let recent = self.recent.capacity() * (size_of::<BlobId>() + size_of::<Slot>() + 8);
        let store = match &self.store {
            Store::Memory(m) => (m.sorted.capacity() * size_of::<Slot>() + m.starts.capacity() * 4) as u64,
            Store::Disk(d) => d.memory_bytes(),
        };
        store + (self.packs.capacity() * size_of::<PackInfo>() + recent) as u64
    }

    /// The plaintext length of the largest tree: what a walk holds at most for one directory
    /// (a restore counts it in its `--max-memory`).
    pub fn largest_tree(&self) -> u64 {
        self.packs.iter().map(|p| u64::from(p.largest_tree)).max().unwrap_or(0)
    }

    /// The packs holding trees (none a pending prune is about to delete): each one's number,
    /// ID and salt.
    pub fn tree_packs(&self) -> Vec<(u32, PackId, [u8; SALT_LEN])> {
        let packs = self.packs.iter().enumerate();
        packs.filter(|(_, p)| p.trees && !p.doomed).map(|(n, p)| (n as u32, p.id, p.salt)).collect()
    }

    /// Every pack the index lists.
    pub fn pack_ids(&self) -> IdSet<PackId> {
        self.packs.iter().map(|p| p.id).collect()
    }

    /// Where the last blob listed in each pack (by number) ends: how much of it a read of all
    /// its blobs takes.
    pub fn pack_ends(&self) -> Vec<u64> {
        self.packs.iter().map(|p| p.end).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::Codec;
    use crate::pack::BlobKind;

    fn entry(n: u8) -> BlobEntry {
        BlobEntry {
            id: BlobId([n; 32]),
            kind: BlobKind::Data,
            codec: Codec::Lz4,
            offset: n as u32,
            length: 100,
            raw_length: 200,
        }
    }

    #[test]
    fn encode_decode_lookup() {
        let packs = vec![
            IndexedPack { id: PackId([1; 32]), salt: [2; 32], blobs: vec![entry(5), entry(3)] },
            IndexedPack { id: PackId([9; 32]), salt: [8; 32], blobs: vec![entry(7)] },
        ];
        let bytes = encode(&packs);
        assert_eq!(decode("i", &bytes).unwrap(), packs);
        assert!(decode("i", &bytes[..bytes.len() - 1]).is_err());
        let mut idx = Index::from_packs(packs);
        assert_eq!(idx.get(&BlobId([7; 32])).unwrap().pack, PackId([9; 32]));
        assert_eq!(idx.get(&BlobId([3; 32])).unwrap().salt, [2; 32]);
        assert!(idx.get(&BlobId([4; 32])).is_none());
        idx.add_pack(&IndexedPack { id: PackId([4; 32]), salt: [0; 32], blobs: vec![entry(4)] });
        assert!(idx.contains(&BlobId([4; 32])));
        assert_eq!(idx.len(), 4);
    }

    #[test]
    fn a_copy_in_a_pack_that_stays_is_preferred_to_a_doomed_one() {
        let (a, b) = (PackId([1; 32]), PackId([2; 32]));
        let doomed_pack = IndexedPack { id: a, salt: [0; 32], blobs: vec![entry(5), entry(6)] };
        let live_pack = IndexedPack { id: b, salt: [0; 32], blobs: vec![entry(5)] };
        let doomed: IdSet<PackId> = [a].into_iter().collect();
        for packs in [vec![doomed_pack.clone(), live_pack.clone()], vec![live_pack, doomed_pack]] {
            let idx = Index::with_doomed(packs, &doomed);
            let found = idx.get(&BlobId([5; 32])).unwrap();
            assert_eq!(found.pack, b);
            assert!(!idx.is_doomed(found.pack_no));
            assert!(idx.contains_live(&BlobId([5; 32])));
            // Only in the doomed pack: found (a restore may still read it), but not live.
            let only = idx.get(&BlobId([6; 32])).unwrap();
            assert!(idx.is_doomed(only.pack_no));
            assert!(idx.contains(&BlobId([6; 32])));
            assert!(!idx.contains_live(&BlobId([6; 32])));
        }
    }

    #[test]
    fn every_blob_is_found_among_many_and_no_other() {
        // IDs spread over all buckets, some sharing their first eight bytes.
        let id = |i: u32| {
            let mut b = [0u8; 32];
            b[..4].copy_from_slice(&(i.wrapping_mul(2654435761) & !7).to_be_bytes());
            b[28..].copy_from_slice(&i.to_le_bytes());
            BlobId(b)
        };
        let blobs: Vec<BlobEntry> = (0..5000).map(|i| BlobEntry { id: id(i), offset: i, ..entry(0) }).collect();
        let idx = Index::from_packs(vec![IndexedPack { id: PackId([1; 32]), salt: [0; 32], blobs }]);
        for i in 0..5000 {
            assert_eq!(idx.get(&id(i)).map(|l| l.entry.offset), Some(i));
        }
        for i in 5000..6000 {
            assert!(!idx.contains(&id(i)));
        }
        assert!(Index::default().get(&id(1)).is_none());
        assert!(!Index::from_packs(Vec::<IndexedPack>::new()).contains(&id(1)));
    }

    /// Blobs added after loading, many enough to be merged into the sorted slots several times,
    /// are all found in their packs, with the loaded ones, and a re-stored copy of a blob in a
    /// doomed pack is the one found.
    #[test]
    fn blobs_added_since_loading_are_found_after_merging() {
        let id = |i: u32| {
            let mut b = [0u8; 32];
            b[..4].copy_from_slice(&i.wrapping_mul(2654435761).to_be_bytes());
            b[28..].copy_from_slice(&i.to_le_bytes());
            BlobId(b)
        };
        let blob = |i: u32| BlobEntry { id: id(i), offset: i, ..entry(0) };
        let doomed: IdSet<PackId> = [PackId([0; 32])].into_iter().collect();
        let loaded = IndexedPack { id: PackId([0; 32]), salt: [0; 32], blobs: (0..1000).map(blob).collect() };
        let mut idx = Index::with_doomed(vec![loaded], &doomed);
        let per_pack = 1000;
        let total = (RECENT_MERGE_MIN as u32) * 3;
        for (n, start) in (0..total).step_by(per_pack).enumerate() {
            let mut p = [0u8; 32];
            p[..4].copy_from_slice(&(n as u32 + 1).to_le_bytes());
            let blobs = (start..start + per_pack as u32).map(blob).collect();
            idx.add_pack(&IndexedPack { id: PackId(p), salt: [0; 32], blobs });
        }
        assert!(idx.recent.len() < total as usize / 2, "the added blobs were merged");
        for i in 0..total {
            let found = idx.get(&id(i)).unwrap_or_else(|| panic!("blob {i} not found"));
            assert_eq!(found.entry.offset, i);
            assert_eq!(found.pack_no, i / per_pack as u32 + 1, "blob {i} is found in the pack that stays");
            assert!(idx.contains_live(&id(i)));
        }
        assert!(!idx.contains(&id(u32::MAX)));
    }

    mod proptests {
        use super::super::*;
        use crate::pack::tests::proptests::entry;
        use proptest::prelude::*;

        fn pack() -> impl Strategy<Value = IndexedPack> {
            (any::<[u8; 32]>(), any::<[u8; 32]>(), proptest::collection::vec(entry(), 0..20))
                .prop_map(|(id, salt, blobs)| IndexedPack { id: PackId(id), salt, blobs })
        }

        proptest! {
            #[test]
            fn index_files_round_trip(packs in proptest::collection::vec(pack(), 0..6), cut in 1usize..100) {
                let bytes = encode(&packs);
                prop_assert_eq!(decode("i", &bytes).unwrap(), packs.clone());
                // Cut short, it is damaged, unless the cut falls between pack records (then it
                // lists the packs before the cut; the sealed envelope authenticates the length).
                let at = bytes.len() - cut.min(bytes.len());
                let mut end = 0;
                let mut before = None;
                for (i, p) in packs.iter().enumerate() {
                    if end == at {
                        before = Some(i);
                    }
                    end += ID_LEN + SALT_LEN + 4 + p.blobs.len() * ENTRY_LEN;
                }
                match before {
                    Some(n) => prop_assert_eq!(decode("i", &bytes[..at]).unwrap(), packs[..n].to_vec()),
                    None if at < bytes.len() => prop_assert!(decode("i", &bytes[..at]).is_err()),
                    None => {}
                }
                // Every blob is found, with an entry that a pack listing it has.
                let idx = Index::from_packs(packs.clone());
                for b in packs.iter().flat_map(|p| &p.blobs) {
                    let found = idx.get(&b.id).unwrap();
                    let from = packs.iter().find(|p| p.id == found.pack && p.salt == found.salt).unwrap();
                    prop_assert!(from.blobs.contains(&found.entry));
                    prop_assert_eq!(found.entry.id, b.id);
                }
                let distinct: std::collections::HashSet<_> = packs.iter().flat_map(|p| &p.blobs).map(|b| b.id).collect();
                prop_assert_eq!(idx.len(), distinct.len());
            }

            #[test]
            fn any_bytes_decode_or_fail(b in proptest::collection::vec(any::<u8>(), 0..400)) {
                if let Ok(packs) = decode("i", &b) {
                    prop_assert_eq!(encode(&packs).len(), b.len());
                }
            }
        }
    }
}
