//! Marks: what the copy knows of each source blob, kept beside the source's index and keyed by
//! the blob's position in it ([`Index::position`]) instead of by its ID — one bit a blob for
//! "met already", and, between repositories with different IDs, the blob's destination ID. A
//! million blobs take 125 KiB of bits and 32 MB of names; the hash maps keyed by ID they
//! replace (`seen`, `queued`, `renamed`) took about 200 MB at their peaks.
//!
//! The source's index gains no packs while it is copied from, so the positions stay put.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};
use cairn_format::id::BlobId;
use cairn_format::index::{BlobLocation, Index};

/// A name no blob has: "not named yet".
const UNNAMED: BlobId = BlobId([0; 32]);

/// What the copy knows of each source blob.
pub(super) struct Marks {
    /// One bit a source blob: met by the walk already.
    met: Vec<AtomicU64>,
    /// Destination ID of each source blob (between repositories with different IDs; empty
    /// otherwise): [`UNNAMED`] until the transfer names it or an earlier copy told it.
    names: Mutex<Vec<BlobId>>,
}

impl Marks {
    /// Marks for the blobs of `index`; with `rename`, room for a destination ID each.
    pub fn new(index: &Index, rename: bool) -> Self {
        let n = index.len();
        let met = std::iter::repeat_with(AtomicU64::default).take(n.div_ceil(64)).collect();
        Marks { met, names: Mutex::new(if rename { vec![UNNAMED; n] } else { Vec::new() }) }
    }

    /// Bytes these marks take for an index of `blobs` blobs (what `--max-memory` counts).
    pub fn memory_bytes(blobs: usize, rename: bool) -> u64 {
        (blobs.div_ceil(64) * 8 + if rename { blobs * std::mem::size_of::<BlobId>() } else { 0 }) as u64
    }

    /// Marks the blob at `pos` met; true the first time.
    pub fn meet(&self, pos: usize) -> bool {
        let bit = 1u64 << (pos % 64);
        self.met[pos / 64].fetch_or(bit, Ordering::Relaxed) & bit == 0
    }

    /// Records `name` as the destination ID of the source blob at `pos`.
    pub fn name(&self, pos: usize, name: BlobId) {
        self.names.lock().expect("names lock")[pos] = name;
    }

    /// Whether the source blob at `pos` has a destination ID.
    pub fn named(&self, pos: usize) -> bool {
        self.names.lock().expect("names lock").get(pos).is_some_and(|n| *n != UNNAMED)
    }

    /// The destination ID of source blob `id`, if it was named.
    pub fn name_of(&self, index: &Index, id: &BlobId) -> Option<BlobId> {
        let pos = index.position(id)?;
        let name = self.names.lock().expect("names lock")[pos];
        (name != UNNAMED).then_some(name)
    }
}

/// The position and location of source blob `id`; a blob no source index lists is an error:
/// the source is damaged.
pub(super) fn locate(index: &Index, id: &BlobId) -> Result<(usize, BlobLocation)> {
    match index.position(id) {
        Some(pos) => Ok((pos, index.at(pos).ok_or_else(crate::engine::sorted_index::damaged)?)),
        None if index.is_damaged() => Err(crate::engine::sorted_index::damaged()),
        None => Err(Error::Refused(format!(
            "blob {} is in no index of the source; no snapshot was copied: run `cairn check` on the source",
            id.short()
        ))),
    }
}
