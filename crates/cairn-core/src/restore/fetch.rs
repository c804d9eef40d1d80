//! Fetch stage: many ranged reads of packs in flight, each reserved against the memory budget
//! first. A read goes to the decode stage whole, with the blobs it covers.

use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

use super::budget::Reservation;
use super::buffers::{Buf, BufferPool};
use super::plan::PackRead;
use super::profile::work;
use super::Shared;
use crate::crypto::ObjectKey;
use crate::layout::pack_path;

/// Reads whose blobs average this size or more use the pipeline's reused buffers.
const POOLED_BLOB: u64 = 256 * 1024;

/// One ranged read of a pack, still encrypted.
pub struct Fetched<'b> {
    /// What was read: the pack, the range and the blobs in it.
    pub read: &'b PackRead,
    /// The pack's key.
    pub key: ObjectKey,
    /// The pack's path, for errors.
    pub pack: String,
    /// The bytes read (each blob is decrypted in place).
    pub range: Buf<'b>,
    /// Budget for the range, released once its blobs are decoded (or, when blobs stored
    /// uncompressed are written straight from it, once they are written).
    pub range_reservation: Reservation<'b>,
    /// Budget for each blob's plaintext, in the order of `read.blobs`; released as each blob
    /// has been written everywhere.
    pub blob_reservations: Vec<Reservation<'b>>,
}

/// Runs until `reads` is drained, the pipeline is cancelled, or `out` is closed.
pub fn fetch_worker<'s>(sh: &'s Shared<'_>, reads: Receiver<&'s PackRead>, out: Sender<Fetched<'s>>) {
    let clock = &sh.clocks[0];
    loop {
        let t = Instant::now();
        let Ok(read) = reads.recv() else { return };
        clock.idle(t);
        if sh.cancelled() {
            return;
        }
        let Some(mut range_reservation) = sh.budget.reserve(read.length + read.raw_bytes(), || sh.cancelled()) else {
            return;
        };
        let pack = pack_path(&read.pack);
        // A read of small blobs (source code: a few KiB each) is freed once decoded; pooling it
        // only kept memory idle without saving page faults.
        let mut range = if read.length / read.blobs.len().max(1) as u64 >= POOLED_BLOB {
            sh.buffers.take(read.length as usize)
        } else {
            BufferPool::adopt(Vec::with_capacity(read.length as usize))
        };
        if let Err(e) = work(clock, || sh.repo.read_pack_range_into(&pack, read.offset, read.length, &mut range)) {
            for b in &read.blobs {
                sh.failures.blob(&b.id, &e.to_string());
            }
            continue;
        }
        sh.fetched.fetch_add(read.length, std::sync::atomic::Ordering::Relaxed);
        let blob_reservations = read.blobs.iter().map(|b| range_reservation.split(u64::from(b.raw_length))).collect();
        let key = sh.repo.key().object_key(&read.salt);
        let job = Fetched { read, key, pack, range, range_reservation, blob_reservations };
        let t = Instant::now();
        if out.send(job).is_err() {
            return;
        }
        clock.blocked(t);
    }
}
