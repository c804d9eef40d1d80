//! Decode stage (CPU pool): decrypt, decompress, and recompute the blob ID before any byte is
//! written. A worker decodes the blobs of one read (in place, without copying them out) and
//! hands them to the write stage together, always to the writer that writes their file.

use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

use super::budget::Reservation;
use super::fetch::Fetched;
use super::profile::work;
use super::Shared;
use crate::id::BlobId;
use crate::pack::decode_blob_in_place;

/// A verified blob's plaintext.
pub struct Decoded<'b> {
    /// The blob.
    pub id: BlobId,
    /// Its plaintext, shared by all of its destinations.
    pub data: Arc<Vec<u8>>,
    /// Released when the blob has been written everywhere.
    pub reservation: Reservation<'b>,
}

/// Runs until `input` is drained or a writer's queue is closed.
pub fn decode_worker<'s>(sh: &'s Shared<'_>, input: Receiver<Fetched<'s>>, writers: Vec<Sender<Vec<Decoded<'s>>>>) {
    let clock = &sh.clocks[1];
    loop {
        let t = Instant::now();
        let Ok(mut f) = input.recv() else { return };
        clock.idle(t);
        if sh.cancelled() {
            continue; // drain so upstream never blocks
        }
        let batch = work(clock, || {
            let mut batch = Vec::with_capacity(f.read.blobs.len());
            for (b, reservation) in f.read.blobs.iter().zip(f.blob_reservations.drain(..)) {
                let start = (u64::from(b.offset) - f.read.offset) as usize;
                let sealed = &mut f.range[start..start + b.length as usize];
                // A copy that fails authentication may be a damaged transfer: read that blob again.
                match decode_blob_in_place(sh.repo.key(), &f.key, b, sealed, &f.pack)
                    .or_else(|_| sh.repo.reread_blob(&f.pack, &f.key, b))
                {
                    Ok(data) => batch.push(Decoded { id: b.id, data: Arc::new(data), reservation }),
                    Err(e) => sh.failures.blob(&b.id, &e.to_string()),
                }
            }
            batch
        });
        drop(f.range); // decoded: the range leaves memory and the budget
        drop(f.range_reservation);
        if batch.is_empty() {
            continue;
        }
        // Writes to one file from two threads serialize on the file's inode lock, and spinning
        // on it cost more than it gained (a 4 GiB image: write busy 1.9 s with one writer,
        // 5.2 s with two). So a file's chunks always go to one writer, chosen by the batch's
        // first file; neighbouring entries (mostly one directory) share a writer as well.
        let first = sh.fetches.dests.get(&batch[0].id).and_then(|d| d.first()).map_or(0, |d| d.entry as usize);
        let t = Instant::now();
        if writers[(first / 16) % writers.len()].send(batch).is_err() {
            return;
        }
        clock.blocked(t);
    }
}
