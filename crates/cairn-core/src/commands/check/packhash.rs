//! A pack's name, its BLAKE3 hash (FORMAT.md §1), computed from pieces of the file that arrive
//! in any order, so a data check reads packs in bounded pieces on many requests at once instead
//! of holding each pack whole.
//!
//! BLAKE3 is a tree hash. The file is cut into slices of [`SLICE`] bytes (a power of two of
//! 1 KiB chunks); each slice is a subtree of the hash's tree, hashed on its own
//! (`hazmat::HasherExt::set_input_offset` + `finalize_non_root`) as soon as a piece covers it,
//! and the slices' chaining values are merged into the root at the end, splitting as BLAKE3 does
//! (`hazmat::left_subtree_len`). A slice that two pieces share is copied into a buffer until both
//! halves are in (at most one slice per piece boundary). Tested against `blake3::hash` on random
//! lengths and random cuts.

use std::collections::HashMap;

use blake3::hazmat::{left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode};
use blake3::Hasher;

/// Bytes per slice: 64 chunks, enough for the SIMD hash of many chunks at once.
pub const SLICE: u64 = 64 * 1024;

/// What one piece contributes, computed without the pack's state (outside any lock).
#[derive(Debug, Default)]
pub struct Piece {
    /// Slices the piece covers whole, with their chaining values.
    cvs: Vec<(u64, ChainingValue)>,
    /// Parts of slices the piece covers only in part: slice, offset in it, bytes.
    parts: Vec<(u64, u64, Vec<u8>)>,
    /// Bytes in the piece.
    bytes: u64,
}

/// Hashes `bytes`, which sit at `offset` in a file of `len` bytes.
pub fn hash_piece(len: u64, offset: u64, bytes: &[u8]) -> Piece {
    let mut piece = Piece { bytes: bytes.len() as u64, ..Piece::default() };
    let end = offset + bytes.len() as u64;
    if bytes.is_empty() {
        return piece;
    }
    let first = offset / SLICE;
    let last = (end - 1) / SLICE;
    for i in first..=last {
        let (start, stop) = slice_range(len, i);
        let (from, to) = (start.max(offset), stop.min(end));
        let part = &bytes[(from - offset) as usize..(to - offset) as usize];
        if len > SLICE && from == start && to == stop {
            piece.cvs.push((i, slice_cv(i, part)));
        } else {
            piece.parts.push((i, from - start, part.to_vec()));
        }
    }
    piece
}

/// The byte range of slice `i` in a file of `len` bytes.
fn slice_range(len: u64, i: u64) -> (u64, u64) {
    (i * SLICE, ((i + 1) * SLICE).min(len))
}

/// The chaining value of slice `i` (of a file longer than one slice).
fn slice_cv(i: u64, bytes: &[u8]) -> ChainingValue {
    Hasher::new().set_input_offset(i * SLICE).update(bytes).finalize_non_root()
}

/// The hash of one pack, gathered piece by piece.
#[derive(Debug)]
pub struct PackHash {
    len: u64,
    cvs: Vec<Option<ChainingValue>>,
    /// Slices seen in part: their buffer and how many bytes are in.
    partial: HashMap<u64, (Vec<u8>, u64)>,
    seen: u64,
}

impl PackHash {
    /// Nothing seen yet of a file of `len` bytes.
    pub fn new(len: u64) -> Self {
        let slices = len.div_ceil(SLICE).max(1);
        PackHash { len, cvs: vec![None; slices as usize], partial: HashMap::new(), seen: 0 }
    }

    /// Adds a piece; returns false if it does not fit the file (past its end, or bytes given
    /// twice), after which the hash can no longer be computed.
    pub fn add(&mut self, piece: Piece) -> bool {
        self.seen += piece.bytes;
        let mut fits = self.seen <= self.len;
        for (i, cv) in piece.cvs {
            match self.cvs.get_mut(i as usize) {
                Some(slot @ None) => *slot = Some(cv),
                _ => fits = false,
            }
        }
        for (i, at, bytes) in piece.parts {
            let Some((start, stop)) = (i < self.cvs.len() as u64).then(|| slice_range(self.len, i)) else {
                fits = false;
                continue;
            };
            let size = stop - start;
            let (buf, filled) = self.partial.entry(i).or_insert_with(|| (vec![0; size as usize], 0));
            let Some(to) = buf.get_mut(at as usize..at as usize + bytes.len()) else {
                fits = false;
                continue;
            };
            to.copy_from_slice(&bytes);
            *filled += bytes.len() as u64;
            if *filled == size && self.len > SLICE {
                let (buf, _) = self.partial.remove(&i).expect("just filled");
                self.cvs[i as usize] = Some(slice_cv(i, &buf));
            }
        }
        fits
    }

    /// Whether every byte has been added.
    pub fn complete(&self) -> bool {
        self.seen == self.len
    }

    /// The file's BLAKE3 hash, once every byte is in (None before, or if a piece did not fit).
    pub fn finish(&self) -> Option<[u8; 32]> {
        if !self.complete() {
            return None;
        }
        if self.len <= SLICE {
            let whole = match self.partial.get(&0) {
                Some((buf, filled)) if *filled == self.len => buf.as_slice(),
                None if self.len == 0 => &[],
                _ => return None,
            };
            return Some(*blake3::hash(whole).as_bytes());
        }
        let left = left_subtree_len(self.len);
        let (l, r) = (self.node(0, left)?, self.node(left, self.len)?);
        Some(*merge_subtrees_root(&l, &r, Mode::Hash).as_bytes())
    }

    /// The chaining value of the subtree over bytes `start..end` (`start` a multiple of
    /// [`SLICE`], and `end` too unless it is the file's end).
    fn node(&self, start: u64, end: u64) -> Option<ChainingValue> {
        if end - start <= SLICE {
            return self.cvs[(start / SLICE) as usize];
        }
        let mid = start + left_subtree_len(end - start);
        Some(merge_subtrees_non_root(&self.node(start, mid)?, &self.node(mid, end)?, Mode::Hash))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hash_in_pieces(data: &[u8], cuts: &[usize], order: &[usize]) -> Option<[u8; 32]> {
        let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
        bounds.extend([0, data.len()]);
        bounds.sort_unstable();
        bounds.dedup();
        let mut pieces: Vec<(usize, usize)> = bounds.windows(2).map(|w| (w[0], w[1])).collect();
        // Some order other than the file's.
        // (An empty pack has no pieces to reorder.)
        let n = pieces.len();
        for (i, o) in order.iter().enumerate().filter(|_| n > 1) {
            pieces.swap(i % n, o % n);
        }
        let mut h = PackHash::new(data.len() as u64);
        for (a, b) in pieces {
            assert!(h.add(hash_piece(data.len() as u64, a as u64, &data[a..b])));
        }
        h.finish()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        #[test]
        fn pieces_in_any_order_hash_like_the_whole(
            len in prop_oneof![0usize..3000, 60_000usize..70_000, 100_000usize..700_000],
            cuts in prop::collection::vec(any::<usize>(), 0..12),
            order in prop::collection::vec(any::<usize>(), 0..12),
            seed in any::<u8>(),
        ) {
            let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8).collect();
            prop_assert_eq!(hash_in_pieces(&data, &cuts, &order), Some(*blake3::hash(&data).as_bytes()));
        }
    }

    #[test]
    fn slice_boundaries_and_powers_of_two() {
        for len in [SLICE - 1, SLICE, SLICE + 1, 2 * SLICE, 3 * SLICE + 7, 16 * SLICE, 17 * SLICE - 1] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let l = len as usize;
            for cuts in [vec![], vec![l / 2], vec![1, l - 1], vec![SLICE as usize, 2 * SLICE as usize + 5]] {
                assert_eq!(hash_in_pieces(&data, &cuts, &[3, 1]), Some(*blake3::hash(&data).as_bytes()), "len {len}");
            }
        }
    }

    #[test]
    fn missing_or_doubled_bytes_give_no_hash() {
        let data = vec![7u8; 200_000];
        let mut h = PackHash::new(200_000);
        assert!(h.add(hash_piece(200_000, 0, &data[..150_000])));
        assert_eq!(h.finish(), None, "incomplete");
        assert!(!h.add(hash_piece(200_000, 100_000, &data[100_000..])), "overlap is refused");
        assert!(!PackHash::new(10).add(hash_piece(10, 5, &data[..20])), "past the end");
    }
}
