//! Pack stage: a pool of workers compresses and encrypts blobs. Each worker fills its own
//! pack, so no single thread encrypts for everyone; a full pack goes to the uploaders.

use crossbeam_channel::{Receiver, Sender};

use super::{stopped, Job, Payload};
use crate::compress::Codec;
use crate::error::Result;
use crate::pack::{BlobKind, FinishedPack, PackWriter};
use crate::repository::Repository;

/// Runs one packer until the job sender is dropped; flushes its last, partly full packs. Trees and
/// file data go to packs of their own (as in restic): loading a snapshot's trees never reads
/// file data, tree packs can be cached whole, and losing a data pack never loses a directory.
pub(super) fn run(repo: &Repository, jobs: Receiver<Job>, packs: Sender<FinishedPack>, codec: Codec) -> Result<()> {
    let target = repo.config().pack_size as usize;
    // Trees are small: their pack starts small and grows as needed.
    let capacity = |kind| if kind == BlobKind::Tree { TREE_PACK_START } else { target + target / 8 };
    let new_writer = |kind| PackWriter::new(repo.key(), capacity(kind));
    let mut writers = [new_writer(BlobKind::Data), new_writer(BlobKind::Tree)];
    for job in jobs {
        let slot = usize::from(job.kind == BlobKind::Tree);
        let writer = &mut writers[slot];
        match job.payload {
            Payload::Plain(data) => writer.add_plain(job.id, job.kind, codec, &data),
            Payload::Stored { codec, raw_length, bytes } => writer.add(job.id, job.kind, codec, raw_length, &bytes),
        }
        if writer.len() >= target {
            let full = std::mem::replace(writer, new_writer(job.kind));
            packs.send(full.finish()).map_err(|_| stopped("upload"))?;
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
