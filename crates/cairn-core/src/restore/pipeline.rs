//! The pipeline runner: the read path's fetch and decode workers, one queue and one write
//! worker per writer, the create stage on a thread of its own alongside, the watchdog, and
//! (auto-tuned) the writers' controller (`writers.rs`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::bounded;

use super::options::{Progress, RestoreOptions};
use super::shared::Shared;
use super::watchdog::{self, Base};
use super::write;
use super::writers::{self, Controller, Sample};
use crate::error::Error;
use crate::pack::BlobEntry;
use crate::read::{spawn_named, Decoded, PackRead, Sink};

/// The restore's end of the read path: each read's verified blobs go to the writer of their
/// files.
#[derive(Clone)]
struct ToWriters<'s> {
    sh: &'s Shared<'s>,
    queues: Vec<crossbeam_channel::Sender<Vec<Decoded<'s>>>>,
    /// How many of the queues (the first ones) are used: the writers at work.
    active: &'s AtomicUsize,
    /// The writers the restore started with (`--write-threads`' default, where the controller
    /// starts): above it, the controller found the writes waiting, not computing, and batches
    /// go round the writers (see `blobs`).
    at_start: usize,
    /// Batches handed on so far (for going round).
    handed: &'s AtomicUsize,
}

impl<'s> Sink<'s> for ToWriters<'s> {
    fn blobs(&self, _read: &'s PackRead, batch: Vec<Decoded<'s>>) -> bool {
        // Writes to one file from two threads serialize on the file's inode lock, and spinning
        // on it cost more than it gained (a 4 GiB image: write busy 1.9 s with one writer,
        // 5.2 s with two). So a file's chunks always go to one writer, chosen by the batch's
        // first file; neighbouring entries (mostly one directory) share a writer as well.
        // Once the controller has put more writers to work, the writes wait rather than
        // compute (no CPU to spin on an inode lock with) and batches go round the writers, so
        // one large file (a disk image) is written by all of them. A file may then get its
        // chunks from several writers: correct either way (positioned writes; whoever writes
        // the last chunk finishes the file).
        let active = self.active.load(Ordering::Relaxed).clamp(1, self.queues.len());
        let queue = if active > self.at_start {
            self.handed.fetch_add(1, Ordering::Relaxed) % active
        } else {
            let first = self.sh.fetches.dests.get(&batch[0].id).and_then(|d| d.first()).map_or(0, |d| d.entry as usize);
            (first / 16) % active
        };
        self.queues[queue].send(batch).is_ok()
    }

    fn failed(&self, _read: &'s PackRead, blob: &BlobEntry, why: &Error) {
        self.sh.failures.blob(&blob.id, &why.to_string());
    }
}

/// Runs fetch, decode and write, with `create` (which opens `sh.dirs_ready`) on a thread of
/// its own alongside. With a writers' `tuner` (no `--write-threads`), it starts the most
/// writers the tuner may put to work, puts its limit of them to work and lets it move that;
/// returns what it changed.
pub fn run(
    sh: &Shared<'_>,
    opts: &RestoreOptions,
    progress: &Progress,
    base: Base,
    stalls: &mut Vec<String>,
    tuner: Option<&mut Controller>,
    create: impl FnOnce() + Send,
) -> Vec<writers::Step> {
    if sh.fetches.reads.is_empty() {
        create();
        return Vec::new();
    }
    let (writers, at_work) = match &tuner {
        Some(c) => (c.most(), c.limit()),
        None => (opts.write_threads.max(1), opts.write_threads.max(1)),
    };
    let active = &AtomicUsize::new(at_work);
    let handed = &AtomicUsize::new(0);
    let finished = &AtomicBool::new(false);
    let mut tuned = Vec::new();
    std::thread::scope(|s| {
        // One queue per writer: a file's chunks go to one writer (see ToWriters).
        let (to_writers, writer_queues): (Vec<_>, Vec<_>) = (0..writers).map(|_| bounded(4)).unzip();
        let mut workers = vec![spawn_named(s, "create", create)];
        let sink = ToWriters { sh, queues: to_writers, active, at_start: opts.write_threads.max(1), handed };
        workers.extend(sh.reader.start(s, &sh.fetches.reads, opts.fetch_concurrency, opts.decode_threads, sink));
        for (i, rx) in writer_queues.into_iter().enumerate() {
            // A writer not at work yet does not count its wait as the stage's idle time.
            let working = i < at_work;
            workers.push(spawn_named(s, "write", move || write::write_worker(sh, rx, working)));
        }
        let decoders = opts.decode_threads.max(1);
        let tune = tuner.map(|c| s.spawn(move || tune_writers(sh, c, active, finished, decoders)));
        let watchdog = s.spawn(|| watchdog::pipeline(sh, opts.stall_timeout, progress, base, finished));
        // A worker's panic is passed on only once the watchdog has stopped: the scope would
        // otherwise wait for it forever.
        let mut panicked = None;
        for w in workers {
            if let Err(p) = w.join() {
                panicked.get_or_insert(p);
            }
        }
        finished.store(true, Ordering::Relaxed);
        watchdog.thread().unpark();
        stalls.extend(watchdog.join().expect("watchdog panicked"));
        if let Some(t) = tune {
            t.thread().unpark();
            tuned = t.join().expect("the writers' controller panicked");
        }
        if let Some(p) = panicked {
            std::panic::resume_unwind(p);
        }
    });
    tuned
}

/// The writers' controller loop: samples the decode and write stages and the process's CPU
/// time, and moves the writers at work (`active`) until the pipeline has `finished`.
fn tune_writers(
    sh: &Shared<'_>,
    c: &mut Controller,
    active: &AtomicUsize,
    finished: &AtomicBool,
    decoders: usize,
) -> Vec<writers::Step> {
    let began = Instant::now();
    let cores = crate::parallel::cores();
    let totals = || {
        let written = sh.written.load(Ordering::Relaxed);
        let cpu = crate::platform::process_cpu_time();
        (sh.reader.clocks()[1].times().blocked, sh.write_clock.times().busy, written, cpu)
    };
    let mut last = (Instant::now(), totals());
    let mut log = Vec::new();
    while !finished.load(Ordering::Relaxed) && !sh.cancelled() {
        // Woken at once when the pipeline ends.
        std::thread::park_timeout(Duration::from_millis(50));
        let now = Instant::now();
        if now - last.0 < writers::SAMPLE_MIN {
            continue;
        }
        let t = totals();
        let sample = Sample {
            elapsed: now - last.0,
            decoders,
            decode_blocked: t.0.saturating_sub(last.1 .0),
            write_busy: t.1.saturating_sub(last.1 .1),
            bytes: t.2.saturating_sub(last.1 .2),
            cpu: t.3.saturating_sub(last.1 .3),
            cores,
        };
        if let Some((limit, reason)) = c.step(&sample) {
            active.store(limit, Ordering::Relaxed);
            log.push(Controller::logged(began.elapsed(), limit, &sample, reason));
        }
        last = (now, t);
    }
    log
}
