//! Pack stage: a pool of workers compresses and encrypts new blobs. Each worker fills its
//! own pack, so no single thread encrypts for everyone; a full pack goes to the uploaders.

use crossbeam_channel::{Receiver, Sender};

use super::stopped;
use super::store::Job;
use crate::compress::Codec;
use crate::error::Result;
use crate::pack::{FinishedPack, PackWriter};
use crate::repository::Repository;

/// Runs one packer until the store stage closes; flushes its last, partly full pack.
pub(super) fn run(repo: &Repository, jobs: Receiver<Job>, packs: Sender<FinishedPack>, codec: Codec) -> Result<()> {
    let target = repo.config().pack_size as usize;
    let new_writer = || PackWriter::new(repo.key(), target + target / 8);
    let mut writer = new_writer();
    for job in jobs {
        let raw_length = job.data.len() as u32;
        match codec.compress(&job.data) {
            Some(c) => writer.add(job.id, job.kind, codec, raw_length, &c),
            None => writer.add(job.id, job.kind, Codec::None, raw_length, &job.data),
        }
        if writer.len() >= target {
            let full = std::mem::replace(&mut writer, new_writer());
            packs.send(full.finish()).map_err(|_| stopped("upload"))?;
        }
    }
    if !writer.is_empty() {
        packs.send(writer.finish()).map_err(|_| stopped("upload"))?;
    }
    Ok(())
}
