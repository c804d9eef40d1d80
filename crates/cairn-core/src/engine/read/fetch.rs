//! Fetch stage: many ranged reads of packs in flight, each reserved against the budget first. A
//! read goes to the decode stage whole, with the blobs it covers.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

use super::buffers::{Buf, BufferPool};
use super::tune::Gate;
use super::{keeps_no_plaintext, ReadRef, Reader, Sink, POOLED_BLOB};
use crate::engine::memory::Reservation;
use crate::engine::profile::work;
use cairn_format::crypto::ObjectKey;
use cairn_format::layout::pack_path;
use cairn_format::pack::BlobKind;

/// One ranged read of a pack, still encrypted.
pub struct Fetched<'b> {
    /// What was read: the pack, the range and the blobs in it.
    pub read: ReadRef<'b>,
    /// The pack's key.
    pub key: ObjectKey,
    /// The pack's path, for errors.
    pub pack: String,
    /// The bytes read (each blob is decrypted in place).
    pub range: Buf<'b>,
    /// Budget for the range, released once its blobs are decoded (or, when blobs stored
    /// uncompressed are handed on inside it, once they are dropped).
    pub range_reservation: Reservation<'b>,
    /// Budget for each blob's plaintext, in the order of `read.blobs`; released as each blob is
    /// dropped by the sink (none for a verify-only or stored-only sink: the range's reservation
    /// covers its one decoded blob at a time).
    pub blob_reservations: Vec<Reservation<'b>>,
}

/// A place at an auto-tuned reader's gate (nothing for a fixed one), given back when dropped.
struct Place<'g>(Option<&'g Gate>);

impl<'g> Place<'g> {
    /// Waits for a place; `None` if the reader was cancelled meanwhile.
    fn enter(r: &'g Reader<'_>) -> Option<Self> {
        match r.gate() {
            Some(g) => g.enter(|| r.cancelled()).then_some(Place(Some(g))),
            None => Some(Place(None)),
        }
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if let Some(g) = self.0 {
            g.leave();
        }
    }
}

/// Runs until `reads` is drained, the reader is cancelled, or `out` is closed.
pub fn fetch_worker<'s, S: Sink<'s>>(
    r: &'s Reader<'_>,
    reads: Receiver<ReadRef<'s>>,
    out: Sender<Fetched<'s>>,
    sink: S,
) {
    let clock = &r.clocks[0];
    loop {
        let t = Instant::now();
        let Ok(read) = reads.recv() else { return };
        clock.idle(t);
        if r.cancelled() {
            return;
        }
        // A sink that keeps no plaintext has each blob decoded into its decode worker's one
        // buffer, which the worker reserves itself (read/decode.rs): a read reserves its range.
        let verify_only = keeps_no_plaintext(&sink);
        let plain = if verify_only { 0 } else { read.raw_bytes() };
        // An auto-tuned reader lets only so many workers fetch at once (read/tune.rs); a place
        // is held from the budget to the hand-off, so the time blocked there is the controller's
        // measure of pressure from downstream.
        let Some(_place) = Place::enter(r) else { return };
        let waited = Instant::now();
        let Some(mut range_reservation) = r.budget.reserve(read.length + plain, || r.cancelled()) else {
            return;
        };
        let requested = Instant::now();
        r.meter.budget_wait_nanos.fetch_add((requested - waited).as_nanos() as u64, Relaxed);
        let pack = pack_path(&read.pack);
        let mut range = if read.length / read.blobs.len().max(1) as u64 >= POOLED_BLOB {
            r.buffers.take(read.length as usize)
        } else {
            BufferPool::adopt(Vec::with_capacity(read.length as usize))
        };
        if let Some(trace) = r.repo.storage().trace().filter(|_| read.blobs.iter().any(|b| b.kind == BlobKind::Data)) {
            trace.data_fetch_starts();
        }
        let fetched = work(clock, || r.repo.read_pack_range_into(&pack, read.offset, read.length, &mut range));
        r.meter.requests.fetch_add(1, Relaxed);
        r.meter.request_nanos.fetch_add(requested.elapsed().as_nanos() as u64, Relaxed);
        r.meter.reserved.fetch_add(read.length + plain, Relaxed);
        if let Err(e) = fetched {
            sink.read_failed(read, &e);
            continue;
        }
        r.fetched.fetch_add(read.length, Relaxed);
        let blob_reservations = if verify_only {
            Vec::new()
        } else {
            read.blobs.iter().map(|b| range_reservation.split(u64::from(b.raw_length))).collect()
        };
        let key = r.repo.key().object_key(&read.salt);
        let job = Fetched { read, key, pack, range, range_reservation, blob_reservations };
        let t = Instant::now();
        if out.send(job).is_err() {
            return;
        }
        clock.blocked(t);
    }
}
