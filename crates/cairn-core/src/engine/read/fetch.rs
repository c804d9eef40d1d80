//! Fetch stage: many ranged reads of packs in flight, each reserved against the budget first. A
//! read goes to the decode stage whole, with the blobs it covers.
//!
//! A fetch worker is a thread with up to `most` reads of its own in flight
//! ([`Storage::read_range_async`](crate::engine::storage::Storage::read_range_async)): a
//! storage that waits on a network waits on the I/O runtime, so the reads across a far link
//! (a round trip of [`NEAR`](crate::engine::storage::NEAR) or more) are carried by a thread per
//! core ([`far_threads`]), however many are in flight. More threads only cost wake-ups: each
//! read that arrives, or that a worker with nothing in flight is given, wakes a thread, and on
//! a thread of its own each of them is a context switch. Restoring `many` with a tenth changed
//! at 20 ms a request (the copy's changed chunks fetched as some 90,000 single small reads), 64
//! threads made 377,000–392,000 context switches and 2 threads 219,000–249,000 (`perf stat`,
//! three runs each, alternated). Each read is polled as soon as it is started, so a storage that
//! reads at once (a local disk) completes it there and it is handed on before the next is
//! taken: one read in flight per worker, as a thread per read had, so a near link keeps a
//! thread per read in flight, up to [`AUTO_MAX`](super::AUTO_MAX). A worker waits for the next
//! read, a place or the budget only while it has nothing in flight; otherwise it takes a read
//! only when a place is free (so reads it cannot start stay in the feed for the workers that
//! can) and hands on each read as it arrives.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;

use super::buffers::{Buf, BufferPool};
use super::tune::GatePlace;
use super::{keeps_no_plaintext, ReadRef, Reader, Sink, POOLED_BLOB};
use crate::engine::memory::Reservation;
use crate::error::{Error, Result};
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

/// Fetch threads for a far link: one per core (the reads wait on the I/O runtime, the threads
/// only hand them on).
pub fn far_threads() -> usize {
    crate::engine::platform::cores()
}

/// A place at an auto-tuned reader's gate (nothing for a fixed one), given back when dropped.
struct Place<'g> {
    _held: Option<GatePlace<'g>>,
}

impl<'g> Place<'g> {
    /// Waits for a place; `None` if the reader was cancelled meanwhile.
    fn enter(r: &'g Reader<'_>) -> Option<Self> {
        match r.gate() {
            Some(g) => g.enter(|| r.cancelled()).map(|p| Place { _held: Some(p) }),
            None => Some(Place { _held: None }),
        }
    }

    /// A place if one is free now.
    fn try_enter(r: &'g Reader<'_>) -> Option<Self> {
        match r.gate() {
            Some(g) => g.try_enter().map(|p| Place { _held: Some(p) }),
            None => Some(Place { _held: None }),
        }
    }
}

/// A read in flight: its place at the gate, its budget and the buffer it fills.
struct Flight<'s> {
    read: ReadRef<'s>,
    pack: String,
    place: Place<'s>,
    range_reservation: Reservation<'s>,
    range: Buf<'s>,
    /// Budget for its plaintext, inside `range_reservation` (0 for a sink keeping none).
    plain: u64,
    requested: Instant,
}

/// A read taken from the feed with a place, waiting for the budget since `since`.
struct Waiting<'s> {
    read: ReadRef<'s>,
    place: Place<'s>,
    since: Instant,
}

/// Counts a request as in flight (the fetch clock's `working`, and the reader's peak of it) from
/// its first poll until it is done or dropped.
struct Requesting<'s>(&'s Reader<'s>);

impl<'s> Requesting<'s> {
    fn new(r: &'s Reader<'s>) -> Self {
        let now = r.clocks[0].working.fetch_add(1, Relaxed) + 1;
        r.meter.in_flight_peak.fetch_max(now, Relaxed);
        Requesting(r)
    }
}

impl Drop for Requesting<'_> {
    fn drop(&mut self) {
        self.0.clocks[0].working.fetch_sub(1, Relaxed);
    }
}

/// How long a worker with reads in flight waits before trying the budget again for a read it
/// holds a place for (the budget is freed by the decode and write stages, which do not wake it).
const BUDGET_RETRY: std::time::Duration = std::time::Duration::from_millis(5);

/// Runs until `reads` is drained, the reader is cancelled, or `out` is closed, with up to `most`
/// reads of its own in flight.
pub fn fetch_worker<'s, S: Sink<'s>>(
    r: &'s Reader<'s>,
    reads: Receiver<ReadRef<'s>>,
    out: Sender<Fetched<'s>>,
    sink: S,
    most: usize,
) {
    let clock = &r.clocks[0];
    // A sink that keeps no plaintext has each blob decoded into its decode worker's one
    // buffer, which the worker reserves itself (read/decode.rs): a read reserves its range.
    let verify_only = keeps_no_plaintext(&sink);
    let most = most.max(1);
    let plain = |read: &ReadRef<'_>| if verify_only { 0 } else { read.raw_bytes() };
    // Not a runtime worker: this thread may block (on the feed, the gate, the budget or the
    // decoders) while the runtime's threads carry its reads' requests on.
    r.runtime.block_on(async {
        let mut flying = FuturesUnordered::new();
        let mut waiting: Option<Waiting<'s>> = None;
        loop {
            // Start reads while there is room, waiting only with nothing in flight.
            while flying.len() < most {
                let wait = flying.is_empty();
                let (read, place, since) = match waiting.take() {
                    Some(w) => (w.read, w.place, w.since),
                    // Nothing in flight: wait for a read and its place, as a thread per read did.
                    None if wait => {
                        let t = Instant::now();
                        let Ok(read) = reads.recv() else { return };
                        clock.idle(t);
                        if r.cancelled() {
                            return;
                        }
                        // An auto-tuned reader lets only so many reads be in flight at once
                        // (read/tune.rs); a place is held from the budget to the hand-off, so
                        // the time blocked there is the controller's measure of pressure.
                        let Some(place) = Place::enter(r) else { return };
                        (read, place, Instant::now())
                    }
                    // Reads in flight: take only what can start now.
                    None => {
                        let Some(place) = Place::try_enter(r) else { break };
                        let Ok(read) = reads.try_recv() else { break };
                        (read, place, Instant::now())
                    }
                };
                let (plain, bytes) = (plain(&read), read.length + plain(&read));
                let reserved =
                    if wait { r.budget.reserve(bytes, || r.cancelled()) } else { r.budget.try_reserve(bytes) };
                let Some(reserved) = reserved else {
                    if wait {
                        return; // cancelled
                    }
                    waiting = Some(Waiting { read, place, since });
                    break;
                };
                r.meter.budget_wait_nanos.fetch_add(since.elapsed().as_nanos() as u64, Relaxed);
                let flight = begin(r, read, place, reserved, plain);
                flying.push(fly(r, flight));
                // Polled at once: its request starts, and a read a local disk made is handed on now.
                while let Some(Some((flight, got))) = flying.next().now_or_never() {
                    if !hand_on(r, flight, got, &sink, &out, verify_only, flying.len() + 1).await {
                        return;
                    }
                }
                if r.cancelled() {
                    return;
                }
            }
            if flying.is_empty() {
                continue;
            }
            // Wait for a read to arrive; with room for more, also for the feed to offer one, or,
            // with a read waiting for the budget, for a moment to try again.
            let t = Instant::now();
            let arrived = if waiting.is_some() {
                tokio::select! {
                    biased;
                    done = flying.next() => done,
                    () = tokio::time::sleep(BUDGET_RETRY) => None,
                }
            } else if flying.len() < most {
                tokio::select! {
                    biased;
                    done = flying.next() => done,
                    () = r.offered.notified() => None,
                }
            } else {
                flying.next().await
            };
            clock.busy(t);
            if let Some((flight, got)) = arrived {
                if !hand_on(r, flight, got, &sink, &out, verify_only, flying.len() + 1).await {
                    return;
                }
            }
        }
    })
}

/// A read with its place and budget, ready to be requested.
fn begin<'s>(
    r: &'s Reader<'s>,
    read: ReadRef<'s>,
    place: Place<'s>,
    range_reservation: Reservation<'s>,
    plain: u64,
) -> Flight<'s> {
    let range = if read.length / read.blobs.len().max(1) as u64 >= POOLED_BLOB {
        r.buffers.take(read.length as usize)
    } else {
        BufferPool::adopt(Vec::with_capacity(read.length as usize))
    };
    if let Some(trace) = r.repo.storage().trace().filter(|_| read.blobs.iter().any(|b| b.kind == BlobKind::Data)) {
        trace.data_fetch_starts();
    }
    let pack = pack_path(&read.pack);
    Flight { read, pack, place, range_reservation, range, plain, requested: Instant::now() }
}

/// The request of `flight`, giving the flight back with what it read.
async fn fly<'s>(r: &'s Reader<'s>, mut flight: Flight<'s>) -> (Flight<'s>, Result<Vec<u8>>) {
    let requesting = Requesting::new(r);
    let buf = std::mem::take(&mut *flight.range);
    let read = flight.read;
    let got = if read.parts.is_empty() {
        r.repo.read_pack_range_async(&flight.pack, read.offset, read.length, buf).await
    } else {
        r.repo.read_pack_ranges_async(&flight.pack, &read.parts, buf).await
    };
    let got = match got {
        Err(e @ Error::Corrupt { .. }) if read.blobs.len() > 1 => apart(r, &flight.pack, read, e).await,
        got => got,
    };
    drop(requesting);
    (flight, got)
}

/// Blobs read again at once when a read of several fails ([`apart`]).
const APART_IN_FLIGHT: usize = 16;

/// A read of several blobs that came back short or damaged (a pack cut short, a range the
/// server could not serve), read again blob by blob, so that the damage fails only the blobs it
/// reaches: a blob that fails again is left as zeros, which fail authentication, and the
/// decoders read it again on its own and fail it, naming why (read/decode.rs). A read through
/// the gaps between blobs, or a joined read of several ranges, that a cut pack ends in the
/// middle of would otherwise fail the blobs before the cut with it. If every blob fails, the
/// read fails as it did (`first`). Other errors (a missing pack, a refused request) would
/// fail each blob the same way, and are not asked again blob by blob.
async fn apart(r: &Reader<'_>, pack: &str, read: ReadRef<'_>, first: Error) -> Result<Vec<u8>> {
    let each = read
        .blobs
        .iter()
        .map(|b| r.repo.read_pack_range_async(pack, u64::from(b.offset), u64::from(b.length), Vec::new()));
    let got: Vec<Result<Vec<u8>>> = futures_util::stream::iter(each).buffered(APART_IN_FLIGHT).collect().await;
    if got.iter().all(Result::is_err) {
        return Err(first);
    }
    let mut buf = vec![0; read.length as usize];
    for (b, blob) in read.blobs.iter().zip(got) {
        if let Ok(bytes) = blob {
            let at = read.position(u64::from(b.offset));
            let end = (at + bytes.len()).min(buf.len());
            buf[at..end].copy_from_slice(&bytes[..end - at]);
        }
    }
    Ok(buf)
}

/// How long a worker waiting for room in the decode stage's queue waits for a decode worker's
/// word before it looks again (a decode worker that ended says nothing).
const ROOM_RETRY: std::time::Duration = std::time::Duration::from_millis(5);

/// Hands a read that arrived to the decode stage (or its failure to the sink); false once the
/// decode stage is gone. `held` reads of this worker wait while it waits for room in the
/// decoders' queue: that time counts for each in the controller's measure of pressure. The wait
/// is on the decode workers' word of a read taken ([`Reader::room`]), not a blocking send,
/// whose spinning took the CPU the decoders needed: restoring `many` with a tenth changed (a
/// thousand small reads in flight across 50 ms), 64 fetch workers made about 330,000 of the
/// restore's 476,000 `sched_yield` calls waiting on a full queue.
async fn hand_on<'s, S: Sink<'s>>(
    r: &'s Reader<'s>,
    flight: Flight<'s>,
    got: Result<Vec<u8>>,
    sink: &S,
    out: &Sender<Fetched<'s>>,
    verify_only: bool,
    held: usize,
) -> bool {
    let Flight { read, pack, place, mut range_reservation, mut range, plain, requested } = flight;
    r.meter.requests.fetch_add(1, Relaxed);
    r.meter.request_nanos.fetch_add(requested.elapsed().as_nanos() as u64, Relaxed);
    r.meter.reserved.fetch_add(read.length + plain, Relaxed);
    match got {
        Ok(filled) => *range = filled,
        // A read that cannot be fetched goes on to the decoders as zeros, which fail its blobs
        // and read each where another index file places it, if one does (Repository::
        // reread_blob; asked there, off this runtime); a check judges this pack and does not
        // look elsewhere.
        Err(_) if !verify_only => *range = vec![0; read.length as usize],
        Err(e) => {
            sink.read_failed(read, &e);
            return true;
        }
    }
    r.fetched.fetch_add(read.length, Relaxed);
    let blob_reservations = if verify_only {
        Vec::new()
    } else {
        read.blobs.iter().map(|b| range_reservation.split(u64::from(b.raw_length))).collect()
    };
    let key = r.repo.key().object_key(&read.salt);
    let mut job = Fetched { read, key, pack, range, range_reservation, blob_reservations };
    let t = Instant::now();
    loop {
        match out.try_send(job) {
            Ok(()) => break,
            Err(TrySendError::Disconnected(_)) => return false,
            Err(TrySendError::Full(back)) => job = back,
        }
        tokio::select! {
            () = r.room.notified() => {}
            () = tokio::time::sleep(ROOM_RETRY) => {}
        }
    }
    r.clocks[0].blocked(t);
    r.meter.hand_off_nanos.fetch_add(t.elapsed().as_nanos() as u64 * held as u64, Relaxed);
    drop(place);
    true
}
