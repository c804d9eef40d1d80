//! Upload stage: workers write finished packs to the storage, then pass them on to be indexed.
//! A pack is indexed only once it is stored.

use std::sync::atomic::Ordering;

use crossbeam_channel::{Receiver, Sender};

use super::{stopped, Sealed, Written};
use crate::engine::repository::Repository;
use crate::error::Result;
use cairn_format::index::IndexedPack;
use cairn_format::layout::pack_path;
use cairn_format::pack::{BlobEntry, BlobKind};

/// Runs one uploader until the packers are done.
pub(super) fn run(
    repo: &Repository,
    packs: Receiver<Sealed<'_>>,
    stored: Sender<IndexedPack>,
    index_stored: bool,
    written: &Written,
) -> Result<()> {
    for Sealed { pack, room } in packs {
        let len = pack.bytes.len() as u64;
        remember_trees(repo, &pack.bytes, &pack.entries);
        repo.storage().write(&pack_path(&pack.id), pack.bytes)?;
        // Stored: the pack's room in the writer's budget is free again.
        drop(room);
        written.bytes_stored.fetch_add(len, Ordering::Relaxed);
        written.packs.fetch_add(1, Ordering::Relaxed);
        let indexed = IndexedPack { id: pack.id, salt: pack.salt, blobs: pack.entries };
        if index_stored {
            repo.index_pack(&indexed);
        }
        stored.send(indexed).map_err(|_| stopped("index"))?;
    }
    Ok(())
}

/// Keeps the trees of a pack about to be stored in the metadata cache, if the repository has
/// one, as a read would: a restore or `ls` on the machine that wrote them then reads none of
/// them over the link. Before the upload, so the pack's bytes need no copy; a tree whose pack
/// is then not stored is never read from the cache, which takes only trees the index lists
/// (and authenticates each against its entry).
fn remember_trees(repo: &Repository, pack: &[u8], entries: &[BlobEntry]) {
    if !repo.has_cache() {
        return;
    }
    for e in entries.iter().filter(|e| e.kind == BlobKind::Tree) {
        let (start, len) = (e.offset as usize, e.length as usize);
        if let Some(sealed) = pack.get(start..start + len) {
            repo.remember_tree(&e.id, sealed);
        }
    }
}
