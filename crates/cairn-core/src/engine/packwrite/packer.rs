//! Pack stage: a pool of workers compresses and encrypts blobs. Each worker fills its own
//! pack, so no single thread encrypts for everyone; a full pack goes to the uploaders.

use crossbeam_channel::{Receiver, Sender};

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{stopped, Job, Payload, Sealed};
use crate::engine::memory::{Budget, Reservation};
use crate::engine::repository::Repository;
use crate::error::Result;
use cairn_format::compress::Codec;
use cairn_format::crypto::SEAL_OVERHEAD;
use cairn_format::pack::{BlobKind, PackWriter};

/// Room in a pack writer's memory budget (see `WriteOptions::memory`): `bytes` for each pack,
/// given up waiting for once no uploader is left (`gone` counts the live ones).
#[derive(Clone)]
pub(super) struct Room<'b> {
    pub budget: &'b Budget,
    pub bytes: u64,
    pub gone: &'b AtomicUsize,
}

impl<'b> Room<'b> {
    /// Waits for a pack's room; `None` if no uploader is left to free any.
    fn take(&self) -> Option<Reservation<'b>> {
        self.budget.reserve(self.bytes, || self.gone.load(Ordering::Relaxed) == 0)
    }
}

/// A pack being filled, with its room in the budget once its first blob came.
struct Open<'b> {
    writer: PackWriter,
    room: Option<Reservation<'b>>,
}

/// Runs one packer until the job sender is dropped; flushes its last, partly full packs. Trees and
/// file data go to packs of their own (as in restic): loading a snapshot's trees never reads
/// file data, tree packs can be cached whole, and losing a data pack never loses a directory.
pub(super) fn run<'b>(
    repo: &Repository,
    jobs: Receiver<Job>,
    packs: Sender<Sealed<'b>>,
    codec: Codec,
    room: Option<Room<'b>>,
) -> Result<()> {
    let target = repo.config().pack_size as usize;
    // A data pack's buffer is made this large once and never grows: a blob that would not fit
    // closes the pack first (growing a full 18 MiB buffer doubles it, and one such pack per
    // packer and per upload slot made prune's peak RSS 1.1x restic's).
    let limit = target + target / 8;
    // Trees are small: their pack starts small and grows as needed.
    let capacity = |kind| if kind == BlobKind::Tree { TREE_PACK_START } else { limit };
    let new_pack = |kind| Open { writer: PackWriter::new(repo.key(), capacity(kind)), room: None };
    // Closes a pack and hands it to the uploaders with its room, a new one taking its place.
    let close = |open: &mut Open<'b>, kind| {
        let full = std::mem::replace(open, new_pack(kind));
        packs.send(Sealed { pack: full.writer.finish(), room: full.room }).map_err(|_| stopped("upload"))
    };
    let mut open = [new_pack(BlobKind::Data), new_pack(BlobKind::Tree)];
    for job in jobs {
        let slot = usize::from(job.kind == BlobKind::Tree);
        let (codec, raw_length, stored) = match job.payload {
            Payload::Plain(data) => {
                let raw_length = data.len() as u32;
                let (codec, stored) = codec.stored_form(data);
                (codec, raw_length, stored)
            }
            Payload::Stored { codec, raw_length, bytes } => (codec, raw_length, bytes),
        };
        let pack = &mut open[slot];
        if !pack.writer.is_empty() && pack.writer.len() + stored.len() + SEAL_OVERHEAD > limit {
            close(pack, job.kind)?;
        }
        if let (Some(room), true) = (&room, pack.room.is_none()) {
            pack.room = Some(room.take().ok_or_else(|| stopped("upload"))?);
        }
        pack.writer.reserve(stored.len() + SEAL_OVERHEAD, limit);
        pack.writer.add(job.id, job.kind, codec, raw_length, &stored);
        if pack.writer.len() >= target {
            close(pack, job.kind)?;
        }
    }
    for pack in open {
        if !pack.writer.is_empty() {
            packs.send(Sealed { pack: pack.writer.finish(), room: pack.room }).map_err(|_| stopped("upload"))?;
        }
    }
    Ok(())
}

/// Initial buffer of a tree pack.
const TREE_PACK_START: usize = 1 << 20;
