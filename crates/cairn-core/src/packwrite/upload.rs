//! Upload stage: workers write finished packs to the storage, then pass them on to be indexed.
//! A pack is indexed only once it is stored.

use std::sync::atomic::Ordering;

use crossbeam_channel::{Receiver, Sender};

use super::{stopped, Sealed, Written};
use crate::error::Result;
use crate::index::IndexedPack;
use crate::layout::pack_path;
use crate::repository::Repository;

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
