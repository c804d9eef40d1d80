//! Decode stage (CPU pool): decrypt, decompress, and recompute the blob ID before any byte is
//! handed on. A worker decodes the blobs of one read (in place, without copying them out) and
//! hands them to the sink together. A blob stored uncompressed is handed on inside the read it
//! came in (a restore writes it straight from there).

use std::ops::{Deref, Range};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Receiver;

use super::buffers::Buf;
use super::fetch::Fetched;
use super::{keeps_no_plaintext, Reader, Sink};
use crate::engine::memory::Reservation;
use crate::engine::profile::work;
use cairn_format::id::BlobId;
use cairn_format::pack::{decode_blob_into, verify_stored};

/// A verified blob's plaintext.
pub struct Decoded<'b> {
    /// The blob.
    pub id: BlobId,
    /// Its plaintext.
    pub data: Plain<'b>,
    /// Released when the blob is dropped (none for a blob inside its read, whose bytes the
    /// read's reservation covers).
    pub _reservation: Option<Reservation<'b>>,
}

/// Where a decoded blob's plaintext lies.
pub enum Plain<'b> {
    /// Decompressed into a buffer of its own.
    Own(Vec<u8>),
    /// Stored uncompressed: decrypted in place inside its read, at this range.
    InRead(Arc<DecodedRead<'b>>, Range<usize>),
}

/// A read whose uncompressed blobs are written straight from it: its memory and its share of
/// the budget are released when the last of them has been written.
pub struct DecodedRead<'b> {
    buf: Buf<'b>,
    _reservation: Reservation<'b>,
}

impl Deref for Plain<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Plain::Own(b) => b,
            Plain::InRead(read, range) => &read.buf[range.clone()],
        }
    }
}

/// Most bytes of decode buffer a worker keeps between reads (a larger one, for a large blob, is
/// let go after its read, as its reservation is).
const SCRATCH_KEPT: usize = 1024 * 1024;

/// Runs until `input` is drained or the sink refuses a batch.
pub fn decode_worker<'s, S: Sink<'s>>(r: &'s Reader<'_>, input: Receiver<Fetched<'s>>, sink: S) {
    let clock = &r.clocks[1];
    // The one buffer a sink that keeps no plaintext has its blobs decoded into (its fetched
    // reads reserved only their ranges).
    let mut scratch = Vec::new();
    loop {
        let t = Instant::now();
        let Ok(f) = input.recv() else { return };
        r.room.notify_one();
        clock.idle(t);
        if r.cancelled() {
            continue; // drain so upstream never blocks
        }
        let read = f.read;
        // A large buffer the last read grew is let go; while a read is decoded, its buffer is
        // reserved: at once, never waiting (the reads that would free the budget wait for this
        // worker).
        if scratch.capacity() > SCRATCH_KEPT {
            scratch = Vec::new();
        }
        let _scratch_held = keeps_no_plaintext(&sink).then(|| {
            let largest = read.blobs.iter().map(|b| u64::from(b.raw_length)).max().unwrap_or(0);
            r.budget.force(largest.max(scratch.capacity() as u64))
        });
        if sink.verify_only() {
            let count = work(clock, || verify_read(r, f, &sink, &mut scratch));
            let t = Instant::now();
            if !sink.verified(read, count) {
                return;
            }
            clock.blocked(t);
            continue;
        }
        let batch = if sink.stored_only() {
            work(clock, || stored_read(r, f, &sink, &mut scratch))
        } else {
            work(clock, || decode_read(r, f, &sink))
        };
        if batch.is_empty() {
            continue;
        }
        let t = Instant::now();
        if !sink.blobs(read, batch) {
            return;
        }
        clock.blocked(t);
    }
}

/// Verifies the blobs of one read, each decoded into one reused buffer; returns how many
/// verified (a blob that does not is given to the sink as failed).
fn verify_read<'s, S: Sink<'s>>(r: &'s Reader<'_>, mut f: Fetched<'s>, sink: &S, scratch: &mut Vec<u8>) -> usize {
    sink.fetched(f.read, &f.range);
    verify_blobs(r, &mut f, sink, scratch).len()
}

/// Verifies the blobs of one read (each decoded into one reused buffer) and hands on their
/// stored bytes inside the read, in the read's order.
fn stored_read<'s, S: Sink<'s>>(
    r: &'s Reader<'_>,
    mut f: Fetched<'s>,
    sink: &S,
    scratch: &mut Vec<u8>,
) -> Vec<Decoded<'s>> {
    sink.fetched(f.read, &f.range);
    let done = verify_blobs(r, &mut f, sink, scratch);
    let read = Arc::new(DecodedRead { buf: f.range, _reservation: f.range_reservation });
    done.into_iter()
        .map(|(id, d)| match d {
            Stored::InRead(range) => Decoded { id, data: Plain::InRead(read.clone(), range), _reservation: None },
            Stored::Own(own) => Decoded { id, data: Plain::Own(own), _reservation: None },
        })
        .collect()
}

/// Verifies each blob of a read, decrypting it in place: where its stored bytes lie in the
/// read, or (for a copy that failed and was read again) the stored bytes themselves. A blob
/// that fails even when read again is given to the sink as failed and left out.
fn verify_blobs<'s, S: Sink<'s>>(
    r: &'s Reader<'_>,
    f: &mut Fetched<'s>,
    sink: &S,
    scratch: &mut Vec<u8>,
) -> Vec<(BlobId, Stored)> {
    let mut done = Vec::with_capacity(f.read.blobs.len());
    for b in &f.read.blobs {
        let start = f.read.position(u64::from(b.offset));
        let sealed = &mut f.range[start..start + b.length as usize];
        match verify_stored(r.repo.key(), &f.key, b, sealed, &f.pack, scratch) {
            Ok(stored) => done.push((b.id, Stored::InRead(start + stored.start..start + stored.end))),
            // A copy that fails authentication may be a damaged transfer: read that blob again.
            Err(_) => match r.repo.reread_stored(&f.pack, &f.key, b, scratch, !sink.verify_only()) {
                Ok(own) => done.push((b.id, Stored::Own(own))),
                Err(e) => sink.failed(f.read, b, &e),
            },
        }
    }
    done
}

/// Where a verified blob's stored bytes are.
enum Stored {
    /// At this range of its read.
    InRead(Range<usize>),
    /// Read again, in a buffer of their own.
    Own(Vec<u8>),
}

/// Decodes the blobs of one read, in the read's order; a blob that cannot be decoded is
/// recorded as failed.
fn decode_read<'s, S: Sink<'s>>(r: &'s Reader<'_>, mut f: Fetched<'s>, sink: &S) -> Vec<Decoded<'s>> {
    /// Where a blob's verified plaintext is before it is handed on.
    enum Done {
        Own(Vec<u8>),
        InRead(Range<usize>),
    }
    sink.fetched(f.read, &f.range);
    let mut done = Vec::with_capacity(f.read.blobs.len());
    for (b, reservation) in f.read.blobs.iter().zip(f.blob_reservations.drain(..)) {
        let start = f.read.position(u64::from(b.offset));
        let sealed = &mut f.range[start..start + b.length as usize];
        let mut out = Vec::new();
        match decode_blob_into(r.repo.key(), &f.key, b, sealed, &f.pack, &mut out) {
            Ok(Some(plain)) => done.push((b.id, Done::InRead(start + plain.start..start + plain.end), reservation)),
            Ok(None) => done.push((b.id, Done::Own(out), reservation)),
            // A copy that fails authentication may be a damaged transfer: read that blob again.
            Err(_) => match r.repo.reread_blob(&f.pack, &f.key, b) {
                Ok(data) => done.push((b.id, Done::Own(data), reservation)),
                Err(e) => sink.failed(f.read, b, &e),
            },
        }
    }
    // Blobs stored uncompressed are handed on inside the read when they are most of it: it
    // stays in memory and in the budget (its reservation goes with it) until they are dropped. A
    // few small ones among compressed blobs are copied out instead, so a whole read is not
    // held for them; then the read leaves memory and the budget here.
    let stored: usize = done.iter().map(|(_, d, _)| if let Done::InRead(r) = d { r.len() } else { 0 }).sum();
    let read = Arc::new(DecodedRead { buf: f.range, _reservation: f.range_reservation });
    let keep = stored > 0 && stored * 2 >= read.buf.len();
    done.into_iter()
        .map(|(id, d, reservation)| match d {
            Done::Own(data) => Decoded { id, data: Plain::Own(data), _reservation: Some(reservation) },
            Done::InRead(range) if keep => Decoded { id, data: Plain::InRead(read.clone(), range), _reservation: None },
            Done::InRead(range) => {
                Decoded { id, data: Plain::Own(read.buf[range].to_vec()), _reservation: Some(reservation) }
            }
        })
        .collect()
}
