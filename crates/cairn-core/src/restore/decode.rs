//! Decode stage (CPU pool): decrypt, decompress, and recompute the blob ID before any byte is
//! written. A worker decodes the blobs of one read (in place, without copying them out) and
//! hands them to the write stage together, always to the writer that writes their file. A blob
//! stored uncompressed is written straight from the read it came in.

use std::ops::{Deref, Range};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

use super::budget::Reservation;
use super::buffers::Buf;
use super::fetch::Fetched;
use super::profile::work;
use super::Shared;
use crate::id::BlobId;
use crate::pack::decode_blob_into;

/// A verified blob's plaintext.
pub struct Decoded<'b> {
    /// The blob.
    pub id: BlobId,
    /// Its plaintext, written to all of its destinations.
    pub data: Plain<'b>,
    /// Released when the blob has been written everywhere (none for a blob inside its read,
    /// whose bytes the read's reservation covers).
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

/// Runs until `input` is drained or a writer's queue is closed.
pub fn decode_worker<'s>(sh: &'s Shared<'_>, input: Receiver<Fetched<'s>>, writers: Vec<Sender<Vec<Decoded<'s>>>>) {
    let clock = &sh.clocks[1];
    loop {
        let t = Instant::now();
        let Ok(f) = input.recv() else { return };
        clock.idle(t);
        if sh.cancelled() {
            continue; // drain so upstream never blocks
        }
        let batch = work(clock, || decode_read(sh, f));
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

/// Decodes the blobs of one read, in the read's order; a blob that cannot be decoded is
/// recorded as failed.
fn decode_read<'s>(sh: &'s Shared<'_>, mut f: Fetched<'s>) -> Vec<Decoded<'s>> {
    /// Where a blob's verified plaintext is before it is handed on.
    enum Done {
        Own(Vec<u8>),
        InRead(Range<usize>),
    }
    let mut done = Vec::with_capacity(f.read.blobs.len());
    for (b, reservation) in f.read.blobs.iter().zip(f.blob_reservations.drain(..)) {
        let start = (u64::from(b.offset) - f.read.offset) as usize;
        let sealed = &mut f.range[start..start + b.length as usize];
        let mut out = Vec::new();
        match decode_blob_into(sh.repo.key(), &f.key, b, sealed, &f.pack, &mut out) {
            Ok(Some(plain)) => done.push((b.id, Done::InRead(start + plain.start..start + plain.end), reservation)),
            Ok(None) => done.push((b.id, Done::Own(out), reservation)),
            // A copy that fails authentication may be a damaged transfer: read that blob again.
            Err(_) => match sh.repo.reread_blob(&f.pack, &f.key, b) {
                Ok(data) => done.push((b.id, Done::Own(data), reservation)),
                Err(e) => sh.failures.blob(&b.id, &e.to_string()),
            },
        }
    }
    // Blobs stored uncompressed are written from the read when they are most of it: it stays
    // in memory and in the budget (its reservation goes with it) until they are written. A
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
