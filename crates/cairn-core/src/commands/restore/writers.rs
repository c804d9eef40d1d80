//! How many files are written at once, tuned while restoring (issue #18, "tune itself": the
//! decode/write split).
//!
//! Decoding is CPU work: past the cores, more decoders gain nothing, and the cores are shared
//! between decoders and writers by whoever is runnable (a full writer queue blocks the
//! decoders, an empty one idles the writers). What that sharing cannot balance is a write
//! that waits without using the CPU: a target on a network file system (sshfs, SMB, NFS
//! mounted `sync`), a FUSE mount, a slow or busy disk. There the writers sit in the kernel, the
//! decoders wait for them, and the cores idle.
//!
//! So without an explicit `--write-threads`, the pipeline starts [`most_writers`] writer
//! threads, each with a queue of its own, and routes the decoded blobs to only the first
//! `active` of them (a file's chunks to one writer, as before); the others wait on their empty
//! queues, costing no CPU, and the data queued for any writer is bounded by the read path's
//! budget. A [`Controller`] looks at each sample (at least [`SAMPLE_MIN`]) and raises
//! `active` while both of these hold:
//!
//! - the writes are what the data waits for: the decoders spent at least [`DECODE_BLOCKED`]
//!   of their time blocked handing blobs to the writers, or the writers at work were busy at
//!   least [`BUSY`] of it (a slow link or slow decoding leaves the writers idle instead; the
//!   decoders' count matters where a few writers' queues get most of the files);
//! - the process used at most [`CPU_IDLE`] of the cores' time: the writes wait, they do not
//!   compute (with the cores full, more writers would only take CPU from the decoders).
//!
//! It raises by as much as the idle cores say there is room for: [`CPU_IDLE`] over the share
//! used, two to four times (writes that wait 10 ms each leave the cores nearly idle at 2
//! writers, and doubling every sample took a third of a 2.5 s restore to reach 16). A raise is
//! kept unless the next sample wrote less than [`LOSS`] of the bytes per second before it while
//! the writes were still what the data waited for (one sample is noisy: a flat one keeps it, as
//! extra writers waiting on a target cost nothing; and a dip while the writers sat idle came
//! from upstream — the link, the budget — not from them); one that lost goes back, waits
//! [`HOLD`] samples, and from then on only doubles. It never
//! lowers `active` below where it started. The limit is handed from one batch to the
//! next, and every change is logged for `--profile` (`write_tuning` in the JSON summary).

use std::time::Duration;

use super::options::Step;

/// Least sample length: a few writes on a slow target, and several scheduler ticks.
pub const SAMPLE_MIN: Duration = Duration::from_millis(200);

/// A raise that writes less than this share of the bytes per second before it goes back (a
/// sample of a few hundred writes moves by 10–20% on its own).
const LOSS: f64 = 0.8;

/// Most a raise multiplies the writers at work by.
const MOST_FACTOR: usize = 4;

/// Samples to wait after going back before doubling again.
const HOLD: u32 = 4;

/// Share of the sample the writers at work busy that says the writes are the bottleneck.
const BUSY: f64 = 0.8;

/// Share of the decoders' time blocked on the writers that says the same.
const DECODE_BLOCKED: f64 = 0.3;

/// Most of the cores' time the process may have used for a raise (above, the CPU is busy and
/// more writers would take it from the decoders).
const CPU_IDLE: f64 = 0.85;

/// Writer threads an auto-tuned pipeline starts when it begins with `start` active: four times
/// that, at least 16.
pub fn most_writers(start: usize) -> usize {
    (start.max(1) * 4).max(16)
}

/// What the decode and write stages did during one sample.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    /// How long the sample lasted.
    pub elapsed: Duration,
    /// Decode workers, and their summed time blocked handing blobs to the writers.
    pub decoders: usize,
    pub decode_blocked: Duration,
    /// The writers' summed time writing.
    pub write_busy: Duration,
    /// Bytes the writers wrote.
    pub bytes: u64,
    /// CPU time (user and system) the whole process used, and the cores it may use.
    pub cpu: Duration,
    pub cores: usize,
}

impl Sample {
    fn share(part: Duration, of: Duration, workers: usize) -> f64 {
        part.as_secs_f64() / (of.as_secs_f64() * workers.max(1) as f64).max(1e-9)
    }

    /// Bytes written per second.
    pub fn rate(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The share of the cores' time the process used.
    pub fn cpu_share(&self) -> f64 {
        Self::share(self.cpu, self.elapsed, self.cores)
    }
}

/// Moves the number of writers at work from one [`Sample`] to the next (see the module doc).
#[derive(Clone, Debug)]
pub struct Controller {
    limit: usize,
    most: usize,
    /// The limit before the last doubling, until a sample has judged it.
    raised_from: Option<usize>,
    /// Bytes per second at the limit before the doubling being judged.
    before: f64,
    /// Samples still to wait before raising again (after a raise that lost).
    hold: u32,
    /// A raise lost: raises double from then on.
    cautious: bool,
}

impl Controller {
    /// Starts with `start` writers at work, up to `most`.
    pub fn new(start: usize, most: usize) -> Self {
        let limit = start.clamp(1, most.max(1));
        Controller { limit, most: most.max(limit), raised_from: None, before: 0.0, hold: 0, cautious: false }
    }

    /// Writers at work now.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Most writers it may put to work: the writer threads a pipeline starts for it.
    pub fn most(&self) -> usize {
        self.most
    }

    /// Looks at one sample; returns the new limit and why, if it changes.
    pub fn step(&mut self, s: &Sample) -> Option<(usize, &'static str)> {
        let rate = s.rate();
        let busy = Sample::share(s.write_busy, s.elapsed, self.limit);
        let blocked = Sample::share(s.decode_blocked, s.elapsed, s.decoders);
        let writes_bound = busy >= BUSY || blocked >= DECODE_BLOCKED;
        if let Some(from) = self.raised_from.take() {
            if rate < self.before * LOSS && writes_bound {
                self.limit = from;
                self.hold = HOLD;
                self.cautious = true;
                return Some((from, "more writers wrote less: back"));
            }
        }
        if self.hold > 0 {
            self.hold -= 1;
            return None;
        }
        if self.limit >= self.most {
            return None;
        }
        if writes_bound && s.cpu_share() <= CPU_IDLE {
            // As much room as the idle cores leave, two to four times (twice once one lost).
            let room = (CPU_IDLE / s.cpu_share().max(1e-3)).floor() as usize;
            let factor = room.clamp(2, if self.cautious { 2 } else { MOST_FACTOR });
            self.raised_from = Some(self.limit);
            self.before = rate;
            self.limit = (self.limit * factor).min(self.most);
            return Some((self.limit, "writes wait and the cores idle: more at once"));
        }
        None
    }

    /// The log entry for a change made from sample `s` at `at`.
    pub fn logged(at: Duration, limit: usize, s: &Sample, reason: &'static str) -> Step {
        Step { at, limit, rate: s.rate(), cpu: s.cpu_share(), reason }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    /// One second measured on two cores with two decoders: milliseconds the decoders were
    /// blocked, the writers busy and the process on the CPU, and the bytes written.
    fn two_cores(decode_blocked_ms: u64, write_busy_ms: u64, bytes: u64, cpu_ms: u64) -> Sample {
        Sample {
            elapsed: SEC,
            decoders: 2,
            decode_blocked: Duration::from_millis(decode_blocked_ms),
            write_busy: Duration::from_millis(write_busy_ms),
            bytes,
            cpu: Duration::from_millis(cpu_ms),
            cores: 2,
        }
    }

    /// One second of a pipeline on `cores` cores whose decoding takes `decode_cpu` CPU-seconds
    /// per GB, writing to a target where each write of `chunk` bytes waits `wait` (no CPU) and
    /// costs `write_cpu` CPU-seconds per GB, with `writers` at work.
    fn simulate(writers: usize, wait: f64, chunk: f64, decode_cpu: f64, write_cpu: f64, cores: usize) -> Sample {
        // What the writers could take in a second, and what the cores could decode and write.
        let by_writers = writers as f64 * chunk / (wait + chunk * write_cpu / 1e9);
        let by_cpu = cores as f64 * 1e9 / (decode_cpu + write_cpu);
        let rate = by_writers.min(by_cpu);
        let cpu = rate * (decode_cpu + write_cpu) / 1e9;
        // Each write's wait and CPU, at most every writer all the time; the decoders (one per
        // core) wait for the writers whatever CPU they did not use.
        let write_busy = (rate / chunk * (wait + chunk * write_cpu / 1e9)).min(writers as f64);
        let decode_busy = rate * decode_cpu / 1e9;
        let decode_blocked = if by_writers < by_cpu { (cores as f64 - decode_busy).max(0.0) } else { 0.0 };
        Sample {
            elapsed: SEC,
            decoders: cores,
            decode_blocked: Duration::from_secs_f64(decode_blocked),
            write_busy: Duration::from_secs_f64(write_busy),
            bytes: rate as u64,
            cpu: Duration::from_secs_f64(cpu),
            cores,
        }
    }

    fn settle(c: &mut Controller, f: impl Fn(usize) -> Sample) -> Vec<usize> {
        let mut seen = vec![c.limit()];
        for _ in 0..12 {
            if let Some((limit, _)) = c.step(&f(c.limit())) {
                seen.push(limit);
            }
        }
        seen
    }

    #[test]
    fn writes_that_wait_get_more_writers_until_the_cores_are_busy() {
        // 20 ms per 1 MiB write, no CPU to speak of; decoding 0.5 CPU-s per GB on 2 cores
        // (4 GB/s): two writers carry 100 MB/s, sixteen 800.
        let mut c = Controller::new(2, most_writers(2));
        let seen = settle(&mut c, |w| simulate(w, 0.020, 1e6, 0.5, 0.01, 2));
        // The cores nearly idle: four times at once.
        assert_eq!(seen, [2, 8, 16], "{seen:?}");
        assert_eq!(c.limit(), 16);
        // Decoding that takes most of the cores once 4 writers are at work: twice, then no more
        // (at 8 writers the cores are full: 2 cores' 1.33 GB/s of decoding).
        let mut c = Controller::new(2, 16);
        let seen = settle(&mut c, |w| simulate(w, 0.005, 1e6, 1.5, 0.01, 2));
        assert_eq!(seen, [2, 4, 8], "{seen:?}");
    }

    #[test]
    fn a_busy_cpu_keeps_the_writers_where_they_started() {
        // Writes of the page cache: no waiting; decoding takes the cores.
        let mut c = Controller::new(2, 16);
        let seen = settle(&mut c, |w| simulate(w, 0.0, 1e6, 1.5, 0.3, 2));
        assert_eq!(seen, [2]);
        // Writes that wait, but the decoding alone fills the cores: nothing to gain either.
        let mut c = Controller::new(2, 16);
        let seen = settle(&mut c, |w| simulate(w, 0.002, 1e6, 4.0, 0.1, 2));
        assert_eq!(seen, [2], "{seen:?}");
    }

    #[test]
    fn writers_waiting_for_data_are_not_the_bottleneck() {
        // A slow link: the two writers busy a third of the time, the cores nearly idle.
        let mut c = Controller::new(2, 16);
        let s = two_cores(0, 660, 50_000_000, 100);
        assert_eq!(c.step(&s), None);
        assert_eq!(c.limit(), 2);
    }

    #[test]
    fn decoders_held_up_by_a_few_busy_writers_get_more_writers() {
        // Most files went to one of the two queues: the writers busy 60% of the time between
        // them, the decoders blocked nearly all of it, the cores idle.
        let mut c = Controller::new(2, 16);
        let s = two_cores(1800, 1200, 100_000_000, 300);
        // The cores 15% busy: four times.
        assert_eq!(c.step(&s).map(|(l, _)| l), Some(8));
    }

    #[test]
    fn a_raise_that_writes_less_goes_back_and_then_only_doubles() {
        // A target that writes a quarter as fast with more than 4 writers at it.
        let mut c = Controller::new(2, 16);
        let worse = |w: usize| {
            let mut s = simulate(w.min(4), 0.020, 1e6, 0.5, 0.01, 2);
            if w > 4 {
                s.bytes /= 4;
            }
            s
        };
        let seen = settle(&mut c, worse);
        // 8 wrote less than 2 did: back; after the hold, 4 (kept), 8 (back), and so on.
        assert_eq!(seen, [2, 8, 2, 4, 8, 4], "{seen:?}");
        assert_eq!(c.limit(), 4);
        // One that writes as fast keeps the raise (the writers cost nothing waiting).
        let mut c = Controller::new(2, 16);
        let flat = |w: usize| {
            let mut s = simulate(w, 0.020, 1e6, 0.5, 0.01, 2);
            s.bytes = 100_000_000;
            s
        };
        assert_eq!(settle(&mut c, flat), [2, 8, 16]);
        // A dip while the writers sat idle (the link paused) is not theirs: the raise stays.
        let mut c = Controller::new(2, 16);
        c.step(&simulate(2, 0.020, 1e6, 0.5, 0.01, 2));
        assert_eq!(c.limit(), 8);
        let idle = two_cores(0, 800, 20_000_000, 50);
        assert_eq!(c.step(&idle), None);
        assert_eq!(c.limit(), 8);
    }

    #[test]
    fn the_limit_stays_within_its_bounds() {
        let mut c = Controller::new(0, 0);
        assert_eq!(c.limit(), 1);
        let seen = settle(&mut c, |w| simulate(w, 0.020, 1e6, 0.5, 0.01, 2));
        assert_eq!(seen, [1], "at the most already: {seen:?}");
        assert_eq!(most_writers(2), 16);
        assert_eq!(most_writers(8), 32);
        let mut c = Controller::new(12, 16);
        let seen = settle(&mut c, |w| simulate(w, 0.020, 1e6, 0.5, 0.01, 2));
        assert_eq!(seen, [12, 16], "{seen:?}");
        // Nothing measured on the CPU: the most a raise may take.
        let mut s = simulate(2, 0.020, 1e6, 0.5, 0.01, 2);
        s.cpu = Duration::ZERO;
        assert_eq!(Controller::new(2, 16).step(&s).map(|(l, _)| l), Some(8));
    }
}
