//! A set of blobs kept as one bit per blob of the index, by its [`Index::position`]: a million
//! blobs take 125 KiB, where a hash set of their IDs took about 70 MB (and as much again while
//! it grew). Blobs the index does not list, which a healthy repository has none of, are kept
//! by ID beside the bits.
//!
//! The positions are those of the index the set was filled with: it must not gain packs
//! meanwhile.

use fixedbitset::FixedBitSet;

use cairn_format::id::{BlobId, IdSet};
use cairn_format::index::Index;

/// A set of blobs of one index.
pub struct BlobSet {
    bits: FixedBitSet,
    unlisted: IdSet<BlobId>,
}

impl BlobSet {
    /// An empty set for the blobs of `index`.
    pub fn new(index: &Index) -> Self {
        BlobSet { bits: FixedBitSet::with_capacity(index.len()), unlisted: IdSet::default() }
    }

    /// Adds `id`, `index` the one the set was made for.
    pub fn insert(&mut self, index: &Index, id: BlobId) {
        match index.position(&id) {
            Some(pos) => self.bits.insert(pos),
            None => {
                self.unlisted.insert(id);
            }
        }
    }

    /// Number of blobs in the set.
    pub fn len(&self) -> usize {
        self.bits.count_ones(..) + self.unlisted.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the blob at `pos` of the index is in the set.
    pub fn at(&self, pos: usize) -> bool {
        self.bits.contains(pos)
    }

    /// The positions of the blobs in the set that the index lists, in order.
    pub fn positions(&self) -> impl Iterator<Item = usize> + '_ {
        self.bits.ones()
    }

    /// The blobs in the set that the index does not list.
    pub fn unlisted(&self) -> &IdSet<BlobId> {
        &self.unlisted
    }

    /// The IDs of the blobs in the set, `index` the one it was made for.
    pub fn ids(&self, index: &Index) -> crate::error::Result<IdSet<BlobId>> {
        let listed = self.positions().map(|pos| index.at(pos).map(|l| l.entry.id));
        let mut ids = listed.collect::<Option<IdSet<BlobId>>>().ok_or_else(crate::engine::sorted_index::damaged)?;
        ids.extend(self.unlisted.iter().copied());
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::compress::Codec;
    use cairn_format::id::PackId;
    use cairn_format::index::IndexedPack;
    use cairn_format::pack::{BlobEntry, BlobKind};

    #[test]
    fn blobs_are_kept_by_position_and_unlisted_ones_by_id() {
        let entry = |n: u8| BlobEntry {
            id: BlobId([n; 32]),
            kind: BlobKind::Data,
            codec: Codec::None,
            offset: 0,
            length: 1,
            raw_length: 1,
        };
        let pack = IndexedPack { id: PackId([9; 32]), salt: [0; 32], blobs: (1..=100).map(entry).collect() };
        let index = Index::from_packs([pack]);
        let mut set = BlobSet::new(&index);
        assert!(set.is_empty());
        for n in [7, 3, 7, 200, 99] {
            set.insert(&index, BlobId([n; 32]));
        }
        assert_eq!(set.len(), 4, "7 counted once");
        let listed: Vec<u8> = set.positions().map(|p| index.at(p).unwrap().entry.id.0[0]).collect();
        assert_eq!(listed, [3, 7, 99], "in the index's order");
        assert!(set.at(index.position(&BlobId([3; 32])).unwrap()));
        assert!(!set.at(index.position(&BlobId([4; 32])).unwrap()));
        assert_eq!(set.unlisted().iter().copied().collect::<Vec<_>>(), [BlobId([200; 32])]);
        let ids = set.ids(&index).unwrap();
        assert_eq!(ids.len(), 4);
        assert!(ids.contains(&BlobId([200; 32])) && ids.contains(&BlobId([99; 32])));
    }
}
