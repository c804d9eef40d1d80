//! Fetch stage: many ranged reads of packs in flight, each reserved against the memory budget
//! first; each read is then cut into its blobs.

use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

use super::budget::Reservation;
use super::plan::PackRead;
use super::profile::work;
use super::Shared;
use crate::crypto::ObjectKey;
use crate::pack::{pack_path, BlobEntry};

/// One blob as read from storage, still encrypted.
pub struct Fetched<'b> {
    /// Its pack entry.
    pub entry: BlobEntry,
    /// The pack's key.
    pub key: Arc<ObjectKey>,
    /// The pack's path, for errors.
    pub pack: Arc<str>,
    /// The whole range read, shared by its blobs.
    pub range: Arc<Vec<u8>>,
    /// Where this blob starts in `range`.
    pub start: usize,
    /// Budget for the plaintext this blob decodes to (the range's own share is released when
    /// the last blob of the range is decoded).
    pub reservation: Reservation<'b>,
    /// Keeps the range's budget until every blob of it is decoded.
    pub range_reservation: Arc<Reservation<'b>>,
}

/// Runs until `reads` is drained, the pipeline is cancelled, or `out` is closed.
pub fn fetch_worker<'s>(sh: &'s Shared<'_>, reads: Receiver<&PackRead>, out: Sender<Fetched<'s>>) {
    let clock = &sh.clocks[0];
    loop {
        let t = Instant::now();
        let Ok(read) = reads.recv() else { return };
        clock.idle(t);
        if sh.cancelled() {
            return;
        }
        let Some(mut reservation) = sh.budget.reserve(read.length + read.raw_bytes(), || sh.cancelled()) else {
            return;
        };
        let path: Arc<str> = pack_path(&read.pack).into();
        let bytes = match work(clock, || sh.repo.read_pack_range(&path, read.offset, read.length)) {
            Ok(b) => b,
            Err(e) => {
                for b in &read.blobs {
                    sh.failures.blob(&b.id, &e.to_string());
                }
                continue;
            }
        };
        sh.fetched.fetch_add(read.length, std::sync::atomic::Ordering::Relaxed);
        let key = Arc::new(sh.repo.key().object_key(&read.salt));
        let range = Arc::new(bytes);
        let blob_parts: Vec<Reservation<'s>> =
            read.blobs.iter().map(|b| reservation.split(u64::from(b.raw_length))).collect();
        let range_reservation = Arc::new(reservation);
        for (b, part) in read.blobs.iter().zip(blob_parts) {
            let job = Fetched {
                entry: *b,
                key: key.clone(),
                pack: path.clone(),
                range: range.clone(),
                start: (u64::from(b.offset) - read.offset) as usize,
                reservation: part,
                range_reservation: range_reservation.clone(),
            };
            let t = Instant::now();
            if out.send(job).is_err() {
                return;
            }
            clock.blocked(t);
        }
    }
}
