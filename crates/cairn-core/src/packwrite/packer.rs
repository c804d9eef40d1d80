//! Pack stage: a pool of workers compresses and encrypts blobs. Each worker fills its own
//! pack, so no single thread encrypts for everyone; a full pack goes to the uploaders.

use crossbeam_channel::{Receiver, Sender};

use super::{stopped, Job, Payload};
use crate::compress::Codec;
use crate::crypto::SEAL_OVERHEAD;
use crate::error::Result;
use crate::pack::{BlobKind, FinishedPack, PackWriter};
use crate::repository::Repository;

/// Runs one packer until the job sender is dropped; flushes its last, partly full packs. Trees and
/// file data go to packs of their own (as in restic): loading a snapshot's trees never reads
/// file data, tree packs can be cached whole, and losing a data pack never loses a directory.
pub(super) fn run(repo: &Repository, jobs: Receiver<Job>, packs: Sender<FinishedPack>, codec: Codec) -> Result<()> {
    let target = repo.config().pack_size as usize;
    // A data pack's buffer is made this large once and never grows: a blob that would not fit
    // closes the pack first (growing a full 18 MiB buffer doubles it, and one such pack per
    // packer and per upload slot made prune's peak RSS 1.1x restic's).
    let limit = target + target / 8;
    // Trees are small: their pack starts small and grows as needed.
    let capacity = |kind| if kind == BlobKind::Tree { TREE_PACK_START } else { limit };
    let new_writer = |kind| PackWriter::new(repo.key(), capacity(kind));
    // Closes a pack and hands it to the uploaders, a new one taking its place.
    let close = |writer: &mut PackWriter, kind| {
        let full = std::mem::replace(writer, new_writer(kind));
        packs.send(full.finish()).map_err(|_| stopped("upload"))
    };
    let mut writers = [new_writer(BlobKind::Data), new_writer(BlobKind::Tree)];
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
        let writer = &mut writers[slot];
        if !writer.is_empty() && writer.len() + stored.len() + SEAL_OVERHEAD > limit {
            close(writer, job.kind)?;
        }
        writer.reserve(stored.len() + SEAL_OVERHEAD, limit);
        writer.add(job.id, job.kind, codec, raw_length, &stored);
        if writer.len() >= target {
            close(writer, job.kind)?;
        }
    }
    for writer in writers {
        if !writer.is_empty() {
            packs.send(writer.finish()).map_err(|_| stopped("upload"))?;
        }
    }
    Ok(())
}

/// Initial buffer of a tree pack.
const TREE_PACK_START: usize = 1 << 20;
