//! Choosing how many ranged reads to keep in flight while reading (issue #18, part 3).
//!
//! Without an explicit `--fetch-concurrency`, a [`Reader`](super::Reader) starts fetch workers
//! for [`AUTO_MAX`] reads in flight (more for a batch of small reads,
//! [`Controller::fit_reads`]) but lets only `limit` of them have a request out at a time (a
//! [`Gate`]), and a [`Controller`] moves `limit` from what it measures every sample:
//!
//! - **throughput** (stored bytes fetched per second) and **latency** (mean time per request);
//! - **downstream pressure**: the share of the reads' time in flight spent blocked handing them
//!   to the decode stage or waiting for the memory budget. When that is high, decoding (the CPU)
//!   or the budget is the bottleneck, and more requests in flight would only hold more memory;
//! - **the machine's CPU**: the share of the cores' time busy (Linux's `/proc/stat`, so a
//!   storage server on the same machine counts; elsewhere this process's CPU time). At
//!   [`CORES_FULL`] or more the cores have no room, and a sample that measured more came from
//!   the workload, not from the reads in flight.
//!
//! It climbs like TCP's slow start: while throughput grows by at least [`GAIN`] it doubles the
//! limit; once a step gains nothing it goes back to the best limit seen and holds there,
//! probing a quarter higher every [`HOLD`] samples (a link can get faster). Pressure from
//! downstream holds the limit where it is, and so do cores with no room: it stops climbing and
//! probing, but does not lower it (an earlier version lowered it by a quarter each time and
//! settled at 3–5 reads in flight at 0–50 ms, where the CPU is busy decoding: the decoders then
//! went idle whenever a few requests were slow, 0.72–0.82 of the best fixed setting; the memory
//! those reads hold is bounded by the budget either way). It rises, even under pressure, to
//! what Little's law says the measured throughput needs at the measured latency. It never passes
//! what the budget can hold: the budget divided by the mean bytes one read reserves (so
//! `--max-memory` bounds it, besides the budget itself blocking fetches). Every change is logged
//! with its reason for `--profile`.
//!
//! Going back after a step that gained nothing is bounded below by Little's law with the link's
//! round trip: the reads in flight at the current limit carried `limit × read size ÷ request
//! time` bytes per second, and keeping that rate needs at least `rate × round trip ÷ read size =
//! limit × round trip ÷ request time` reads in flight however fast the link transfers. On a
//! link where requests take about the round trip (200 ms per request, 8 MiB read in a few
//! milliseconds) that is the current limit itself: the reads in flight were waiting out the
//! round trip, not slowing each other, so a sample that measured less came from the workload
//! (small files written slowly, few reads planned, a slow moment of the machine), not from the
//! limit, and says nothing about it; the controller keeps the limit, and keeps climbing. Where
//! requests grew slower with more in flight (a local disk, a saturated link) the floor is low and
//! it goes back as before. An earlier version went back to the best limit after one such sample:
//! the Linux tree at 200 ms fell from 8 to 4 in flight in two of three runs and climbed back a
//! quarter at a time (0.84 of the best fixed setting).
//!
//! The first reader of a restore starts where the round trip measured while opening the
//! repository puts it ([`Controller::for_link`]), not at the storage's default.
//!
//! A restore runs in batches, each with a reader of its own; the controller is handed from one
//! to the next ([`Reader::tuned_from`](super::Reader::tuned_from)), so a later batch starts
//! where the one before settled instead of learning the link again.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

use super::gap::PRIOR_RATE;

/// Most fetch threads a reader starts, and most reads an auto-tuned one keeps in flight but for
/// a batch of small reads.
pub const AUTO_MAX: usize = 64;

/// Most reads in flight for a batch of small reads ([`Controller::fit_reads`]).
pub const SMALL_READS_MAX: usize = 1024;

/// Reads of a batch that average less than this are small ([`Controller::fit_reads`]).
pub const SMALL_READ: u64 = 64 * 1024;

/// Least relative throughput gain that counts as growth (5%: less is noise).
const GAIN: f64 = 1.05;

/// The read size [`Controller::for_link`] starts from: the reads of a restore of many small
/// files, coalesced through gaps of about this much at the start limit (see `read/gap.rs`).
const START_READ: u64 = 1 << 20;

/// Fewest reads in flight [`Controller::for_link`] starts with (a local disk's default).
const START_LEAST: usize = 4;

/// Samples to hold at the best limit before probing higher again.
const HOLD: u32 = 4;

/// Downstream pressure (share of fetch-worker time blocked) above which the limit is lowered
/// (down to what the measured throughput needs at the measured latency).
const PRESSURE: f64 = 0.5;

/// Share of the machine's CPU time busy at or above which the cores have no room: throughput
/// that grew then came from the workload, not from more reads in flight, and the limit holds.
const CORES_FULL: f64 = 0.9;

/// Bounds how many reads may be out at once (each holds a place from its budget to its hand-off).
pub struct Gate {
    state: Mutex<(usize, usize)>, // (limit, active)
    changed: Condvar,
}

/// A place taken at a [`Gate`], given back when dropped. Only the gate makes one, and only for a
/// place it counted: a place made for a refusal (as `bool::then_some` would, building its value
/// before it looks at the condition) would give back one never taken, and once the count wrapped
/// below zero every fetch worker would wait at the gate for good.
#[must_use = "the place is given back when dropped"]
pub struct GatePlace<'g>(&'g Gate);

impl Drop for GatePlace<'_> {
    fn drop(&mut self) {
        let mut st = self.0.state.lock().expect("gate lock");
        st.1 -= 1;
        self.0.changed.notify_one();
    }
}

impl Gate {
    /// A gate letting `limit` requests through at once.
    pub fn new(limit: usize) -> Self {
        Gate { state: Mutex::new((limit.max(1), 0)), changed: Condvar::new() }
    }

    /// Waits for a free place; `None` if `stop()` said so first.
    pub fn enter(&self, stop: impl Fn() -> bool) -> Option<GatePlace<'_>> {
        let mut st = self.state.lock().expect("gate lock");
        while st.1 >= st.0 {
            if stop() {
                return None;
            }
            st = self.changed.wait_timeout(st, Duration::from_millis(100)).expect("gate lock").0;
        }
        st.1 += 1;
        Some(GatePlace(self))
    }

    /// Takes a free place if there is one now.
    pub fn try_enter(&self) -> Option<GatePlace<'_>> {
        let mut st = self.state.lock().expect("gate lock");
        if st.1 >= st.0 {
            return None;
        }
        st.1 += 1;
        Some(GatePlace(self))
    }

    /// Sets how many requests may be out at once.
    pub fn set_limit(&self, limit: usize) {
        let mut st = self.state.lock().expect("gate lock");
        st.0 = limit.max(1);
        self.changed.notify_all();
    }

    /// The current limit.
    #[cfg(test)]
    fn limit(&self) -> usize {
        self.state.lock().expect("gate lock").0
    }

    /// Places taken and not given back.
    #[cfg(test)]
    fn active(&self) -> usize {
        self.state.lock().expect("gate lock").1
    }
}

/// What the fetch stage did during one sample.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    /// How long the sample lasted.
    pub elapsed: Duration,
    /// Requests completed.
    pub requests: u64,
    /// Stored bytes they fetched.
    pub bytes: u64,
    /// Their summed time from start to end.
    pub request_time: Duration,
    /// Summed time reads spent blocked on the decode stage or the budget (a worker blocked
    /// handing one on holds up each of its reads).
    pub blocked: Duration,
    /// Mean bytes one read reserves against the budget (range plus plaintext).
    pub reserved_per_read: u64,
    /// The link's round trip as measured so far (the shortest small request, see
    /// `storage::LinkMeter`), if any was timed.
    pub round_trip: Option<Duration>,
    /// The share of the machine's CPU time that was busy (this process, and a storage server
    /// on the same machine), if measured.
    pub cpu_busy: Option<f64>,
}

impl Sample {
    fn throughput(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn latency(&self) -> Duration {
        self.request_time.checked_div(self.requests.max(1) as u32).unwrap_or_default()
    }

    /// Whether the machine's cores were busy [`CORES_FULL`] of the sample or more.
    fn cores_full(&self) -> bool {
        self.cpu_busy.is_some_and(|b| b >= CORES_FULL)
    }
}

/// One decision of the controller, for `--profile`.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// Time since reading started.
    pub at: Duration,
    /// Reads in flight allowed from then on.
    pub limit: usize,
    /// Throughput measured in the sample that led to it (bytes per second).
    pub throughput: f64,
    /// Mean request time in that sample.
    pub latency: Duration,
    /// The share of the machine's CPU time busy in that sample, if measured.
    pub cpu_busy: Option<f64>,
    /// Why.
    pub reason: &'static str,
}

/// Moves the number of reads in flight from one [`Sample`] to the next (see the module doc).
#[derive(Clone, Debug)]
pub struct Controller {
    limit: usize,
    budget: u64,
    best: f64,
    best_limit: usize,
    held: u32,
    /// Still doubling (no step has failed to gain yet).
    starting: bool,
    /// The shortest round trip seen: the link's, or a sample's mean request time if shorter.
    round_trip: Option<Duration>,
    /// Where it started and why, when that was the link's round trip, until logged.
    start: Option<Step>,
    /// Most reads in flight: [`AUTO_MAX`], or up to [`SMALL_READS_MAX`] for a batch of small
    /// reads ([`Controller::fit_reads`]).
    most: usize,
}

impl Controller {
    /// A controller starting at `start` reads in flight, within `budget` bytes.
    pub fn new(start: usize, budget: u64) -> Self {
        let start = start.clamp(1, AUTO_MAX);
        Controller {
            limit: start,
            budget,
            best: 0.0,
            best_limit: start,
            held: 0,
            starting: true,
            round_trip: None,
            start: None,
            most: AUTO_MAX,
        }
    }

    /// A controller for a link whose round trip was measured before reading (the requests that
    /// opened the repository): it starts where Little's law puts it for [`PRIOR_RATE`] in reads
    /// of [`START_READ`], `rate × round trip ÷ read size`, and at least [`START_LEAST`]; with
    /// no round trip measured, at `default` (the storage's concurrency).
    ///
    /// Climbing from the storage's default doubles once per sample, and a sample spans several
    /// round trips: at 200 ms the Linux tree's restore spent its first second at 8–16 in flight
    /// and ended at 0.88 of fixed 64. Starting at S3's 32 on MinIO over loopback (a round trip
    /// of about a millisecond, decoding on two cores the bottleneck, so the limit holds) kept
    /// the Linux tree at 0.88 of fixed 4.
    pub fn for_link(default: usize, round_trip: Option<Duration>, budget: u64) -> Self {
        let Some(rtt) = round_trip else { return Controller::new(default, budget) };
        let mut c = Controller::new(in_flight_for(rtt, START_READ).max(START_LEAST), budget);
        if c.limit != default.clamp(1, AUTO_MAX) {
            c.start = Some(Step::at_start(c.limit, rtt, "the round trip of the open needs it at the assumed rate"));
        }
        c
    }

    /// Before a batch's reads: raises the limit (lowered only to [`AUTO_MAX`] after a batch of
    /// small reads) to what Little's law puts it at for [`PRIOR_RATE`] in reads of the batch's
    /// mean size (`bytes` in `reads`) across the `round_trip`, at most one per read. The changed chunks of a tree whose other chunks are
    /// copied from local data are thousands of reads of a few KiB: each read carries little,
    /// so many must be in flight, and while the copy fills the cores the controller would hold
    /// rather than climb (the gain from more in flight shows as the cores' work, not as
    /// throughput).
    ///
    /// Reads smaller than [`SMALL_READ`] may have as many in flight as that needs, up to
    /// [`SMALL_READS_MAX`] (each holds a few KiB of the budget; at 50 ms, 8,000 reads took 6 s
    /// at 64 in flight); a batch of larger reads, or of small ones across a round trip that
    /// needs fewer (a local disk), is held to [`AUTO_MAX`]. They are carried by at most
    /// [`AUTO_MAX`] fetch threads, many reads each (read/fetch.rs): when each read was a thread,
    /// 1,024 cost more than they gained (a tenth of `many` changed, at 50 ms, took 50
    /// CPU-seconds and 28–31 s at 1,024 against 37 and 26.4 s at 256).
    pub fn fit_reads(&mut self, round_trip: Option<Duration>, reads: usize, bytes: u64) {
        let mean = (bytes / (reads.max(1) as u64)).max(1);
        let needed = round_trip.map_or(0, |rtt| in_flight_for(rtt, mean).min(reads));
        self.most = if mean < SMALL_READ { needed.clamp(AUTO_MAX, SMALL_READS_MAX) } else { AUTO_MAX };
        self.limit = self.limit.min(self.most);
        self.best_limit = self.best_limit.min(self.most);
        let Some(rtt) = round_trip else { return };
        if reads == 0 {
            return;
        }
        let wanted = in_flight_for(rtt, mean).min(reads).clamp(1, self.most);
        if wanted > self.limit {
            self.limit = wanted;
            self.best_limit = self.best_limit.max(wanted);
            self.start = Some(Step::at_start(wanted, rtt, "a batch of small reads needs it at the round trip"));
        }
    }

    /// Why it starts away from the storage's default, once (for the log of `--profile`).
    pub fn take_start(&mut self) -> Option<Step> {
        self.start.take()
    }

    /// The current limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Most reads it may put in flight (the fetch workers a reader starts for it).
    pub fn most(&self) -> usize {
        self.most
    }

    /// Most reads in flight the budget holds at `reserved_per_read` bytes each.
    fn ceiling(&self, reserved_per_read: u64) -> usize {
        let fit = self.budget / reserved_per_read.max(1);
        usize::try_from(fit).unwrap_or(usize::MAX).clamp(1, self.most)
    }

    /// Takes one sample; returns the new limit and why, if it changed.
    pub fn step(&mut self, s: &Sample) -> Option<(usize, &'static str)> {
        if s.requests == 0 {
            return None; // nothing measured (everything waiting downstream, or done)
        }
        let ceiling = self.ceiling(s.reserved_per_read);
        let throughput = s.throughput();
        self.round_trip = [self.round_trip, s.round_trip, Some(s.latency())].into_iter().flatten().min();
        let pressure = s.blocked.as_secs_f64() / (s.elapsed.as_secs_f64() * self.limit as f64).max(1e-9);
        let (next, reason) = if pressure > PRESSURE {
            // Decoding or the budget holds the fetches back: more in flight gain nothing, so
            // stop climbing. Fewer would gain nothing either, but leave the decoders idle when
            // a few requests are slow: hold, at least at what it takes to keep this throughput
            // at this latency (Little's law: the requests in flight on average, with half again
            // to spare).
            self.starting = false;
            self.best = throughput;
            self.held = 0;
            let in_flight = s.request_time.as_secs_f64() / s.elapsed.as_secs_f64().max(1e-9);
            let needed = (in_flight * 1.5).ceil() as usize;
            self.best_limit = self.limit.max(needed);
            (self.best_limit, "decode or memory budget is the bottleneck")
        } else if throughput >= self.best * GAIN && !s.cores_full() {
            self.best = throughput;
            self.best_limit = self.limit;
            self.held = 0;
            let up = if self.starting { self.limit * 2 } else { self.limit + self.limit.div_ceil(4) };
            (up, "throughput grew")
        } else if throughput >= self.best * GAIN || (self.starting && throughput * GAIN >= self.best) {
            // Hold here, in two cases. Throughput grew with the cores full: they decode all
            // they can, so more reads in flight would only hold more memory and spread the
            // decoders' work over more of it; the gain came from the workload (a restore
            // passing from small files to large ones moves by more than GAIN), not from the
            // limit. Or slow start's last doubling gained nothing but lost nothing either: keep
            // it. A restore's throughput moves with what it writes (a directory of small files,
            // then large ones), so one flat sample says little, and going back cost most at high
            // latency (the Linux tree at 200 ms fell from 8 to 4 in flight and ran at 0.73 of
            // fixed 16); more in flight cost only memory, which the budget bounds.
            self.starting = false;
            self.best = self.best.max(throughput);
            self.best_limit = self.limit;
            self.held = 0;
            return self.clamp(self.limit, ceiling, "budget");
        } else if self.limit != self.best_limit {
            // The last step lost throughput (or a probe gained nothing): back to the best
            // limit, and hold there; but never below what the link's round trip needs to keep
            // what the reads in flight carried (Little's law, see the module doc).
            let floor = self.latency_floor(s);
            if floor >= self.limit {
                // The reads in flight were waiting out the round trip, not slowing each other:
                // this sample says nothing about the limit. Keep it, and what was learnt.
                return self.clamp(self.limit, ceiling, "budget");
            }
            self.starting = false;
            self.held = 0;
            self.best_limit = self.best_limit.max(floor);
            (self.best_limit, "no gain from more reads in flight")
        } else {
            self.held += 1;
            if self.held < HOLD || s.cores_full() {
                return self.clamp(self.limit, ceiling, "budget");
            }
            // Probe higher again; what was best is measured anew.
            self.held = 0;
            self.best = throughput;
            (self.limit + self.limit.div_ceil(4), "probing for more throughput")
        };
        self.clamp(next, ceiling, reason)
    }

    /// Reads in flight needed to keep the rate the current limit's reads carried, `limit × read
    /// size ÷ request time`, across the link's round trip (Little's law): `limit × round trip ÷
    /// mean request time`, rounded up; 0 before a round trip is known.
    fn latency_floor(&self, s: &Sample) -> usize {
        let (Some(rtt), latency) = (self.round_trip, s.latency()) else { return 0 };
        if latency.is_zero() {
            return 0;
        }
        let needed = self.limit as f64 * rtt.as_secs_f64() / latency.as_secs_f64();
        // A hair under a whole number is that number (the round trip is a mean's lower bound).
        (needed - 0.05).ceil().max(0.0) as usize
    }

    /// Applies `next` within the budget's ceiling; returns it if the limit changed.
    fn clamp(&mut self, next: usize, ceiling: usize, reason: &'static str) -> Option<(usize, &'static str)> {
        let (next, reason) = if next > ceiling { (ceiling, "memory budget") } else { (next, reason) };
        let next = next.max(1);
        if next == self.limit {
            return None;
        }
        self.limit = next;
        Some((next, reason))
    }

    /// The log entry for a change made from sample `s` at `at`.
    pub fn logged(at: Duration, limit: usize, s: &Sample, reason: &'static str) -> Step {
        Step { at, limit, throughput: s.throughput(), latency: s.latency(), cpu_busy: s.cpu_busy, reason }
    }
}

impl Step {
    /// Where a controller starts, before any sample: `limit` for [`PRIOR_RATE`] across `rtt`.
    fn at_start(limit: usize, rtt: Duration, reason: &'static str) -> Step {
        Step { at: Duration::ZERO, limit, throughput: PRIOR_RATE, latency: rtt, cpu_busy: None, reason }
    }
}

/// Reads in flight that carry [`PRIOR_RATE`] across a round trip of `rtt` in reads of `read`
/// bytes (Little's law: rate × round trip ÷ read size).
fn in_flight_for(rtt: Duration, read: u64) -> usize {
    (PRIOR_RATE * rtt.as_secs_f64() / read.max(1) as f64).ceil() as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A storage with a fixed `latency` per request and a `bandwidth` shared by all requests,
    /// reads of `size` bytes, and a decoder that takes at most `decode` bytes per second: what
    /// `limit` reads in flight achieve in one second, as the reader would measure it.
    fn simulate(limit: usize, latency: f64, bandwidth: f64, size: u64, decode: f64) -> Sample {
        let per_request = latency + size as f64 / bandwidth * limit as f64; // bandwidth shared
        let offered = limit as f64 * size as f64 / per_request;
        let fetched = offered.min(bandwidth).min(decode);
        // Time the workers wait for the decoder: what they could have fetched beyond it.
        let blocked = if offered > decode { (1.0 - decode / offered) * limit as f64 } else { 0.0 };
        let requests = (fetched / size as f64).round().max(1.0) as u64;
        Sample {
            elapsed: Duration::from_secs(1),
            requests,
            bytes: requests * size,
            request_time: Duration::from_secs_f64(per_request * requests as f64),
            blocked: Duration::from_secs_f64(blocked),
            reserved_per_read: 2 * size,
            round_trip: Some(Duration::from_secs_f64(latency)),
            // The cores decode what is fetched (a decoder with no limit takes no CPU to speak of).
            cpu_busy: Some(if decode.is_finite() { fetched / decode } else { 0.05 }),
        }
    }

    /// `sample` with only `share` of its reads done (the rest never planned, or held up by the
    /// workload): the same time per request, fewer requests, less throughput.
    fn thinned(sample: Sample, share: f64) -> Sample {
        let requests = ((sample.requests as f64 * share).round() as u64).max(1);
        let per_request = sample.request_time / sample.requests as u32;
        Sample {
            requests,
            bytes: sample.bytes / sample.requests * requests,
            request_time: per_request * requests as u32,
            ..sample
        }
    }

    /// A fixed sequence of shares in [0.5, 1): a workload whose reads come unevenly.
    fn uneven(samples: usize) -> Vec<f64> {
        let mut x: u32 = 0x2545_f491;
        (0..samples)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                0.5 + f64::from(x % 1000) / 2000.0
            })
            .collect()
    }

    /// A batch of small reads raises the limit to what its round trip needs, up to
    /// [`SMALL_READS_MAX`] (and its most to that, at least [`AUTO_MAX`]); a batch of large
    /// reads holds it to [`AUTO_MAX`] again.
    #[test]
    fn a_batch_of_small_reads_starts_with_many_in_flight() {
        let ms = Duration::from_millis;
        let mut c = Controller::for_link(4, Some(ms(20)), 1 << 30);
        let start = c.limit();
        // 8,000 reads of 4 KiB at 20 ms: as many as a batch of small reads may have.
        c.fit_reads(Some(ms(20)), 8000, 8000 * 4096);
        assert_eq!((c.limit(), c.most()), (SMALL_READS_MAX, SMALL_READS_MAX));
        assert!(c.limit() > start);
        assert!(c.take_start().is_some_and(|s| s.limit == SMALL_READS_MAX));
        // The next batch's large reads are held to AUTO_MAX again.
        c.fit_reads(Some(ms(20)), 40, 40 * (8 << 20));
        assert_eq!((c.limit(), c.most()), (AUTO_MAX, AUTO_MAX));
        // Never more than one per read, and never lower than it was.
        let mut c = Controller::for_link(4, Some(ms(20)), 1 << 30);
        c.fit_reads(Some(ms(20)), 10, 10 * 4096);
        assert_eq!(c.limit(), 10);
        c.fit_reads(Some(ms(20)), 3, 3 * 4096);
        assert_eq!(c.limit(), 10);
        // Large reads, or no round trip known: left as it is.
        let mut c = Controller::for_link(4, Some(ms(20)), 1 << 30);
        c.fit_reads(Some(ms(20)), 40, 40 * (8 << 20));
        assert_eq!(c.limit(), start);
        c.fit_reads(None, 8000, 8000 * 4096);
        c.fit_reads(Some(ms(20)), 0, 0);
        assert_eq!(c.limit(), start);
        // Small reads across a round trip that needs fewer: no more workers than AUTO_MAX;
        // across one that needs more than AUTO_MAX but fewer than the most: as many as needed.
        let mut c = Controller::for_link(4, Some(Duration::from_micros(100)), 1 << 30);
        c.fit_reads(Some(Duration::from_micros(100)), 8000, 8000 * 4096);
        assert_eq!(c.most(), AUTO_MAX);
        assert!(c.limit() <= AUTO_MAX);
        let mut c = Controller::for_link(4, Some(ms(2)), 1 << 30);
        c.fit_reads(Some(ms(2)), 8000, 8000 * 4096);
        assert_eq!((c.limit(), c.most()), (in_flight_for(ms(2), 4096), in_flight_for(ms(2), 4096)));
        assert!((AUTO_MAX..SMALL_READS_MAX).contains(&c.most()));
    }

    /// A link measured before reading starts the limit where its round trip needs it (at least
    /// 4, even where the storage's default is higher); none measured starts at the default.
    #[test]
    fn a_slow_link_starts_with_the_reads_its_round_trip_needs() {
        let ms = Duration::from_millis;
        assert_eq!(Controller::for_link(4, None, 1 << 30).limit(), 4);
        assert_eq!(Controller::for_link(4, Some(ms(1)), 1 << 30).limit(), 4);
        assert_eq!(Controller::for_link(32, Some(ms(1)), 1 << 30).limit(), 4);
        assert_eq!(Controller::for_link(32, None, 1 << 30).limit(), 32);
        assert_eq!(Controller::for_link(16, Some(ms(20)), 1 << 30).limit(), 6);
        assert_eq!(Controller::for_link(4, Some(ms(50)), 1 << 30).limit(), 13);
        assert_eq!(Controller::for_link(4, Some(ms(200)), 1 << 30).limit(), 52);
        assert_eq!(Controller::for_link(4, Some(ms(1000)), 1 << 30).limit(), AUTO_MAX);
        // Logged once, with the round trip it came from.
        let mut c = Controller::for_link(4, Some(ms(200)), 1 << 30);
        assert_eq!(c.take_start().map(|s| (s.limit, s.latency)), Some((52, ms(200))));
        assert!(c.take_start().is_none());
        assert!(Controller::for_link(4, Some(ms(10)), 1 << 30).take_start().is_none());
        assert!(Controller::for_link(32, None, 1 << 30).take_start().is_none());
        assert_eq!(Controller::for_link(32, Some(ms(1)), 1 << 30).take_start().map(|s| s.limit), Some(4));
    }

    fn run(c: &mut Controller, samples: usize, model: impl Fn(usize) -> Sample) -> Vec<usize> {
        (0..samples)
            .map(|_| {
                c.step(&model(c.limit()));
                c.limit()
            })
            .collect()
    }

    #[test]
    fn at_high_latency_the_limit_climbs_until_bandwidth_is_full() {
        // 200 ms per request, 100 MB/s, 1 MiB reads: about 20 in flight fill the link.
        let mib = 1 << 20;
        let mut c = Controller::new(4, 1 << 30);
        let limits = run(&mut c, 30, |n| simulate(n, 0.2, 100e6, mib, f64::INFINITY));
        assert!(limits.iter().max().unwrap() >= &16, "rose: {limits:?}");
        let settled = *limits.last().unwrap();
        let best = simulate(64, 0.2, 100e6, mib, f64::INFINITY).throughput();
        assert!(simulate(settled, 0.2, 100e6, mib, f64::INFINITY).throughput() >= 0.8 * best, "{limits:?}");
    }

    #[test]
    fn at_no_latency_it_stays_low() {
        // A local disk: requests take only their transfer time, more in flight gain nothing.
        let mut c = Controller::new(4, 1 << 30);
        let limits = run(&mut c, 30, |n| simulate(n, 0.0, 1e9, 1 << 20, f64::INFINITY));
        assert!(limits.iter().all(|&l| l <= 10), "{limits:?}");
    }

    #[test]
    fn it_never_passes_what_the_budget_holds() {
        // 64 MiB budget, reads reserving 8 MiB each: at most 8 in flight, however slow the link.
        let mut c = Controller::new(4, 64 << 20);
        let limits = run(&mut c, 30, |n| simulate(n, 0.2, 1e9, 4 << 20, f64::INFINITY));
        assert!(limits.iter().all(|&l| l <= 8), "{limits:?}");
        assert_eq!(*limits.iter().max().unwrap(), 8, "{limits:?}");
    }

    #[test]
    fn when_decoding_is_the_bottleneck_it_holds_the_limit() {
        // A slow decoder (20 MB/s) behind a fast, slow-to-answer link: neither climbing nor
        // falling (the earlier controller lowered it to 3-5 and starved the decoders).
        let mut c = Controller::new(8, 1 << 30);
        let limits = run(&mut c, 20, |n| simulate(n, 0.05, 1e9, 1 << 20, 20e6));
        assert!(limits.iter().all(|&l| l == 8), "{limits:?}");
    }

    #[test]
    fn pressure_raises_it_to_what_the_throughput_needs_in_flight() {
        // A decoder at 100 MB/s behind 200 ms per request and 4 MiB reads: about 5 reads must be
        // in flight to keep it fed, so a limit of 2 rises to that however blocked the workers.
        let mut c = Controller::new(2, 1 << 30);
        let limits = run(&mut c, 20, |n| simulate(n, 0.2, 1e9, 4 << 20, 100e6));
        assert!(limits[2..].iter().all(|&l| l >= 5), "{limits:?}");
        let settled = *limits.last().unwrap();
        assert!(simulate(settled, 0.2, 1e9, 4 << 20, 100e6).throughput() >= 0.9 * 100e6, "{limits:?}");
    }

    #[test]
    fn at_every_latency_it_settles_within_a_tenth_of_the_best_fixed_limit() {
        // The sweep of bench/latency in the model: 8 MiB reads, a link of 1 GB/s, decoding at
        // 550 MB/s (two cores), a budget holding 10 reads; auto against fixed 4..64.
        let mib = 1 << 20;
        for latency in [0.0005, 0.02, 0.05, 0.2] {
            let model = |n: usize| simulate(n.min(10), latency, 1e9, 8 * mib, 550e6);
            let best = [4, 8, 16, 32, 64].map(|n| model(n).throughput()).into_iter().fold(0.0, f64::max);
            let mut c = Controller::new(4, 10 * 16 * mib);
            let limits = run(&mut c, 30, model);
            let settled = model(*limits.last().unwrap()).throughput();
            assert!(settled >= 0.9 * best, "{latency} s: {settled} of {best}, {limits:?}");
        }
    }

    #[test]
    fn with_the_cores_full_a_gain_holds_the_limit() {
        // 50 ms per request, decoding on the cores the bottleneck but the fetch workers seldom
        // blocked (the decoders keep up with what arrives), and every sample 10% faster than
        // the one before: the workload passing from small files to large ones, not the limit.
        // With the cores 95% busy the limit holds where it started, neither doubling nor
        // probing; with the cores idle the same samples climb.
        let sample = |i: i32, cpu: f64| Sample {
            elapsed: Duration::from_secs(1),
            requests: 40,
            bytes: (300e6 * 1.1f64.powi(i)) as u64,
            request_time: Duration::from_millis(40 * 60),
            blocked: Duration::from_millis(100),
            reserved_per_read: 16 << 20,
            round_trip: Some(Duration::from_millis(50)),
            cpu_busy: Some(cpu),
        };
        let limits = |cpu: f64| {
            let mut c = Controller::new(8, 1 << 30);
            (0..20)
                .map(|i| {
                    c.step(&sample(i, cpu));
                    c.limit()
                })
                .collect::<Vec<_>>()
        };
        let full = limits(0.95);
        assert!(full.iter().all(|&l| l == 8), "{full:?}");
        let idle = limits(0.4);
        assert!(idle.iter().max() > Some(&16), "{idle:?}");
        // Unmeasured CPU does not hold it.
        let mut c = Controller::new(8, 1 << 30);
        c.step(&Sample { cpu_busy: None, ..sample(0, 0.0) });
        assert_eq!(c.limit(), 16);
    }

    #[test]
    fn slow_start_keeps_a_doubling_that_lost_nothing() {
        // A link whose throughput is the same at 4 and 8 in flight (bandwidth-bound): the
        // doubling to 8 stays; a later probe higher that gains nothing goes back to 8.
        let mut c = Controller::new(4, 1 << 30);
        let limits = run(&mut c, 12, |n| simulate(n, 0.0, 1e9, 1 << 20, f64::INFINITY));
        assert_eq!(limits[..5], [8, 8, 8, 8, 8], "{limits:?}");
        assert!(limits.iter().all(|&l| (8..=10).contains(&l)), "{limits:?}");
        // One that lost throughput at 8 goes back to 4.
        let mut c = Controller::new(4, 1 << 30);
        let limits = run(&mut c, 3, |n| simulate(n, 0.0, 1e9 / (n as f64 / 4.0), 1 << 20, f64::INFINITY));
        assert_eq!(limits[1], 4, "{limits:?}");
    }

    #[test]
    fn at_high_latency_one_thin_sample_does_not_step_back() {
        // 200 ms per request and storage in memory (4 GB/s shared: the benchmark's injected
        // latency over tmpfs): requests take about the round trip whatever the limit. The
        // sample after the first doubling finds fewer reads to do (a directory of small files)
        // and measures half what the one before did: the reads in flight were not slower, so
        // the limit stays at 8, and climbs on like slow start once reads come again.
        let mib = 1 << 20;
        let model = |n: usize| simulate(n, 0.2, 4e9, 8 * mib, f64::INFINITY);
        let mut c = Controller::new(4, 1 << 30);
        c.step(&model(4));
        assert_eq!(c.limit(), 8);
        let thin = thinned(model(8), 0.27);
        assert!(thin.throughput() < model(4).throughput() / GAIN, "the sample lost throughput");
        assert_eq!(c.step(&thin), None, "kept at 8");
        assert_eq!(c.limit(), 8);
        let limits = run(&mut c, 6, model);
        assert!(limits.iter().all(|&l| l >= 8), "{limits:?}");
        assert!(*limits.last().unwrap() >= 16, "still climbing like slow start: {limits:?}");
    }

    #[test]
    fn at_high_latency_an_uneven_workload_keeps_the_limit_climbing() {
        // The same link with every sample's reads thinned by a fixed uneven sequence (half to
        // all of them done, throughput swinging by up to 2x; the first sample at 8 gets 40%,
        // less than the one at 4 got): once doubled to 8 the limit never goes back below it,
        // and it stays within one of what the budget holds (10 reads of 16 MiB reserved each:
        // where fixed 16 or 64 run). At 10 the requests take 10% longer than the round trip
        // (the transfer), so the floor there is 9.
        let mib = 1 << 20;
        let mut c = Controller::new(4, 10 * 16 * mib);
        let mut limits = Vec::new();
        for share in [1.0, 0.4].into_iter().chain(uneven(28)) {
            c.step(&thinned(simulate(c.limit(), 0.2, 4e9, 8 * mib, f64::INFINITY), share));
            limits.push(c.limit());
        }
        assert!(limits.iter().all(|&l| l >= 8), "never back to 4: {limits:?}");
        assert!(limits[5..].iter().all(|&l| l >= 9), "{limits:?}");
        assert_eq!(*limits.iter().max().unwrap(), 10, "{limits:?}");
    }

    #[test]
    fn where_more_in_flight_slow_the_requests_a_loss_still_steps_back() {
        // 20 ms per request, but a link that gets slower than its share with more in flight
        // (total bandwidth 400 MB/s at 4 reads, half that at 8): requests at 8 take far more
        // than the round trip, so the floor is low and the limit goes back to 4.
        let mib = 1 << 20;
        let bandwidth = |n: usize| 400e6 * (4.0 / n.max(4) as f64).powi(2);
        let model = |n: usize| simulate(n, 0.02, bandwidth(n), 8 * mib, f64::INFINITY);
        let mut c = Controller::new(4, 1 << 30);
        let limits = run(&mut c, 3, model);
        assert_eq!(limits[..2], [8, 4], "{limits:?}");
        // And without a known round trip the floor comes from the shortest mean request time,
        // which the slower requests at 8 exceed by more than the doubling: back to 4 as well.
        let mut c = Controller::new(4, 1 << 30);
        let limits = run(&mut c, 2, |n| Sample { round_trip: None, ..model(n) });
        assert_eq!(limits, [8, 4], "{limits:?}");
    }

    #[test]
    fn a_carried_controller_starts_where_the_last_batch_settled() {
        let mut c = Controller::new(4, 1 << 30);
        let limits = run(&mut c, 30, |n| simulate(n, 0.2, 100e6, 1 << 20, f64::INFINITY));
        let mut next = c.clone();
        assert_eq!(next.limit(), *limits.last().unwrap());
        // Its first sample of a new batch (the same link) moves it little, if at all.
        next.step(&simulate(next.limit(), 0.2, 100e6, 1 << 20, f64::INFINITY));
        assert!(next.limit() * 4 >= c.limit() * 3, "{} after {limits:?}", next.limit());
    }

    #[test]
    fn the_gate_lets_only_the_limit_through() {
        let gate = Gate::new(2);
        let (a, b) = (gate.enter(|| false), gate.enter(|| false));
        assert!(a.is_some() && b.is_some());
        assert!(gate.enter(|| true).is_none(), "a third waits (and gives up when told to stop)");
        gate.set_limit(3);
        let c = gate.enter(|| true);
        assert!(c.is_some());
        drop(c);
        gate.set_limit(1);
        assert_eq!(gate.limit(), 1);
        drop((a, b));
        assert_eq!(gate.active(), 0);
    }

    #[test]
    fn a_place_refused_gives_nothing_back() {
        let gate = Gate::new(2);
        let held = [gate.try_enter(), gate.try_enter()];
        assert!(held.iter().all(Option::is_some));
        for _ in 0..5 {
            assert!(gate.try_enter().is_none(), "the gate is full");
            assert!(gate.enter(|| true).is_none(), "the gate is full");
        }
        assert_eq!(gate.active(), 2, "refusals took no place back");
        drop(held);
        assert_eq!(gate.active(), 0, "each place taken was given back once");
        let again = [gate.try_enter(), gate.try_enter(), gate.try_enter()];
        assert_eq!(again.iter().filter(|p| p.is_some()).count(), 2, "still only the limit gets through");
    }
}
