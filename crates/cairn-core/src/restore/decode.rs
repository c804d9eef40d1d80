//! Decode stage (CPU pool): decrypt, decompress, and recompute the blob ID before any byte is
//! written.

use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

use super::budget::Reservation;
use super::fetch::Fetched;
use super::profile::work;
use super::Shared;
use crate::id::BlobId;
use crate::pack::decode_blob;

/// A verified blob's plaintext.
pub struct Decoded<'b> {
    /// The blob.
    pub id: BlobId,
    /// Its plaintext, shared by all of its destinations.
    pub data: Arc<Vec<u8>>,
    /// Released when the blob has been written everywhere.
    pub reservation: Reservation<'b>,
}

/// Runs until `input` is drained or `out` is closed.
pub fn decode_worker<'s>(sh: &'s Shared<'_>, input: Receiver<Fetched<'s>>, out: Sender<Decoded<'s>>) {
    let clock = &sh.clocks[1];
    loop {
        let t = Instant::now();
        let Ok(f) = input.recv() else { return };
        clock.idle(t);
        if sh.cancelled() {
            continue; // drain so upstream never blocks
        }
        let decoded = work(clock, || {
            let sealed = f.range[f.start..f.start + f.entry.length as usize].to_vec();
            // A copy that fails authentication may be a damaged transfer: read that blob again.
            decode_blob(sh.repo.key(), &f.key, &f.entry, sealed, &f.pack)
                .or_else(|_| sh.repo.reread_blob(&f.pack, &f.key, &f.entry))
        });
        drop(f.range_reservation);
        match decoded {
            Ok(data) => {
                let t = Instant::now();
                let job = Decoded { id: f.entry.id, data: Arc::new(data), reservation: f.reservation };
                if out.send(job).is_err() {
                    return;
                }
                clock.blocked(t);
            }
            Err(e) => sh.failures.blob(&f.entry.id, &e.to_string()),
        }
    }
}
