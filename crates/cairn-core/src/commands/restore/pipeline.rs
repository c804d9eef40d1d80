//! The pipeline runner: the read path's fetch and decode workers, one queue and one write
//! worker per writer, the create stage on a thread of its own alongside, the watchdog, and
//! (auto-tuned) the writers' controller (`writers.rs`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Select};

use super::options::{Progress, RestoreOptions};
use super::shared::Shared;
use super::watchdog::{self, Base};
use super::write;
use super::writers::{self, Controller, Sample};
use crate::engine::read::{spawn_named, Decoded, ReadRef, Sink};
use crate::error::Error;
use cairn_format::pack::BlobEntry;

/// The restore's end of the read path: each read's verified blobs go to the writers of their
/// files, a handful at a time.
#[derive(Clone)]
struct ToWriters<'s> {
    sh: &'s Shared<'s>,
    queues: Vec<crossbeam_channel::Sender<Vec<Decoded<'s>>>>,
    /// How many of the queues (the first ones) are used: the writers at work.
    active: &'s AtomicUsize,
    /// The writers the restore started with (`--write-threads`' default, where the controller
    /// starts): above it, the controller found the writes waiting, not computing, and any
    /// writer takes any blob (see `blobs`).
    at_start: usize,
}

/// Most bytes handed to a writer at once (see [`ToWriters::blobs`]).
const HANDFUL_BYTES: usize = 256 << 10;

/// Most blobs handed to a writer at once: a read's small blobs are cut in about
/// [`HANDFULS_PER_WRITER`] handfuls for each writer at work, of at least [`HANDFUL_BLOBS`]
/// and at most [`HANDFUL_BLOBS_MOST`] blobs. Each handful handed on is a wake-up for a writer,
/// and once the writers' queues are full, one for a decoder too: restoring `many`'s million
/// blobs of 2 KiB in handfuls of 8 made 453,000–521,000 context switches, in handfuls of up
/// to 64 147,000–207,000. Few files to a handful keep a read of a few
/// slow writes (a network file system's) spread over the writers.
const HANDFUL_BLOBS: usize = 8;
const HANDFUL_BLOBS_MOST: usize = 64;
const HANDFULS_PER_WRITER: usize = 4;

/// The most blobs to a handful for a read of `blobs` blobs shared by `writers` writers.
fn handful_blobs(blobs: usize, writers: usize) -> usize {
    (blobs / (writers.max(1) * HANDFULS_PER_WRITER)).clamp(HANDFUL_BLOBS, HANDFUL_BLOBS_MOST)
}

/// `blobs` in order, in handfuls of at most [`HANDFUL_BYTES`] (or one larger blob) or `most`
/// blobs.
fn handfuls<'s>(blobs: impl IntoIterator<Item = Decoded<'s>>, most: usize) -> Handfuls<'s> {
    let (mut out, mut handful, mut bytes) = (VecDeque::new(), Vec::new(), 0);
    for blob in blobs {
        bytes += blob.data.len();
        handful.push(blob);
        if bytes >= HANDFUL_BYTES || handful.len() >= most {
            out.push_back(std::mem::take(&mut handful));
            bytes = 0;
        }
    }
    if !handful.is_empty() {
        out.push_back(handful);
    }
    out
}

impl<'s> ToWriters<'s> {
    /// The writers at work now, and whether any of them takes any blob (the controller has
    /// put more to work than the restore started with).
    fn at_work(&self) -> (usize, bool) {
        let active = self.active.load(Ordering::Relaxed).clamp(1, self.queues.len());
        (active, active > self.at_start)
    }

    /// Hands out the handfuls `own[q]` meant for writer `q` and those in `any` that any writer
    /// at work may take, each as soon as a writer it may go to has room; once the controller
    /// has put more writers to work than at the start, all of them to any, cut again in the
    /// handfuls of writes that wait ([`HANDFUL_BLOBS`]) if they were cut at `most` blobs, more.
    /// False if a writer is gone.
    fn hand_out(&self, own: &mut [Handfuls<'s>], any: &mut Handfuls<'s>, mut most: usize) -> bool {
        loop {
            let (active, raised) = self.at_work();
            if raised {
                own.iter_mut().for_each(|o| any.extend(o.drain(..)));
                if most > HANDFUL_BLOBS {
                    *any = handfuls(any.drain(..).flatten(), HANDFUL_BLOBS);
                    most = HANDFUL_BLOBS;
                }
            }
            let takes = |q: usize| own.get(q).is_some_and(|o| !o.is_empty()) || (q < active && !any.is_empty());
            let waiting: Vec<usize> = (0..self.queues.len()).filter(|&q| takes(q)).collect();
            if waiting.is_empty() {
                return true;
            }
            let mut select = Select::new();
            for &q in &waiting {
                select.send(&self.queues[q]);
            }
            // Looked at again now and then: the controller may put more writers to work.
            let Ok(op) = select.select_timeout(Duration::from_millis(50)) else { continue };
            let q = waiting[op.index()];
            // A writer waited on has a handful of its own or may take one of `any` (an empty
            // one would be harmless: a selected send must be completed).
            let handful = own.get_mut(q).and_then(VecDeque::pop_front).or_else(|| any.pop_front()).unwrap_or_default();
            if op.send(&self.queues[q], handful).is_err() {
                return false;
            }
        }
    }
}

/// Blobs gathered in handfuls, in order (see [`handfuls`]).
type Handfuls<'s> = VecDeque<Vec<Decoded<'s>>>;

impl<'s> Sink<'s> for ToWriters<'s> {
    fn blobs(&self, read: ReadRef<'s>, batch: Vec<Decoded<'s>>) -> bool {
        // The fetch's span so far: of the planned reads, or of the copy's failed chunks.
        let planned = self.sh.fetches.reads.as_ptr_range().contains(&std::ptr::from_ref(read.read));
        let span = if planned { &self.sh.planned_span } else { &self.sh.late_span };
        span.fetch_max(self.sh.began.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if planned {
            let bytes: usize = batch.iter().map(|b| b.data.len()).sum();
            self.sh.planned_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        }
        // Writes to one file from two threads serialize on the file's inode lock, and spinning
        // on it cost more than it gained (a 4 GiB image: write busy 1.9 s with one writer,
        // 5.2 s with two). So the chunks of a file with more still to write go to one writer,
        // chosen by the file; a file's last chunk (a small file's only one) goes to any. Once
        // the controller has put more writers to work, the writes wait rather than compute (no
        // CPU to spin on an inode lock with) and any writer at work takes any blob, so one
        // large file (a disk image) is written by all of them. A file may then get its chunks
        // from several writers: correct either way (positioned writes; whoever writes the last
        // chunk finishes the file).
        //
        // A read's blobs go out in handfuls, each as soon as a writer it may go to has room,
        // not all to one writer: a read of 8 MiB holds dozens of small files, and handing it
        // whole to the writer of its first file kept one or two writers busy however many
        // were at work (96 files of 256 KiB on a target where each write waits 30 ms: 2.0 s
        // with 2 writers and with 16), and what a writer's queue held before the controller put
        // more writers to work stayed with it.
        let (active, raised) = self.at_work();
        // Writes that wait (the controller raised the writers) spread over all of them in the
        // smallest handfuls: a wake-up costs little beside a write's wait.
        let most = if raised { HANDFUL_BLOBS } else { handful_blobs(batch.len(), active) };
        if raised || active == 1 {
            return self.hand_out(&mut [], &mut handfuls(batch, most), most);
        }
        let mut mine: Vec<Vec<Decoded<'s>>> = (0..active).map(|_| Vec::new()).collect();
        let mut anyone = Vec::new();
        for blob in batch {
            let file = self.sh.fetches.dests.get(&blob.id).and_then(|d| d.first()).map(|d| d.entry as usize);
            match file {
                Some(i) if self.sh.remaining[i].load(Ordering::Relaxed) > 1 => mine[i % active].push(blob),
                _ => anyone.push(blob),
            }
        }
        let mut own: Vec<_> = mine.into_iter().map(|m| handfuls(m, most)).collect();
        self.hand_out(&mut own, &mut handfuls(anyone, most), most)
    }

    fn failed(&self, _read: ReadRef<'s>, blob: &BlobEntry, why: &Error) {
        self.sh.failures.blob(&blob.id, &why.to_string());
    }
}

/// Runs fetch, decode and write, with `create` (which opens `sh.dirs_ready`) on a thread of
/// its own alongside, and `copy` (the local-data copy, which closes `sh.late` as it ends) on
/// another. With a writers' `tuner` (no `--write-threads`), it starts the most writers the
/// tuner may put to work, puts its limit of them to work and lets it move that; returns what
/// it changed.
#[allow(clippy::too_many_arguments)]
pub fn run(
    sh: &Shared<'_>,
    opts: &RestoreOptions,
    progress: &Progress,
    base: Base,
    stalls: &mut Vec<String>,
    tuner: Option<&mut Controller>,
    create: impl FnOnce() + Send,
    copy: Option<impl FnOnce() + Send>,
) -> Vec<super::options::Step> {
    if sh.fetches.reads.is_empty() && copy.is_none() {
        create();
        return Vec::new();
    }
    let (writers, at_work) = match &tuner {
        Some(c) => (c.most(), c.limit()),
        None => (opts.write_threads.max(1), opts.write_threads.max(1)),
    };
    let active = &AtomicUsize::new(at_work);
    let finished = &AtomicBool::new(false);
    let mut tuned = Vec::new();
    std::thread::scope(|s| {
        // One queue per writer: a file's chunks go to one writer (see ToWriters).
        let (to_writers, writer_queues): (Vec<_>, Vec<_>) = (0..writers).map(|_| bounded(4)).unzip();
        let mut workers = vec![spawn_named(s, "create", create)];
        workers.extend(copy.map(|copy| spawn_named(s, "copy", copy)));
        let sink = ToWriters { sh, queues: to_writers, active, at_start: opts.write_threads.max(1) };
        // A live restore does not fetch what a client brought into the target meanwhile: each
        // read is checked as it is fed to the fetchers, not when it was planned.
        let mut dirs = super::dirs::ParentDirs::new(sh.target);
        let reads = sh.reads().filter(move |r| !write::skip_present(sh, &mut dirs, r));
        workers.extend(sh.reader.start(s, reads, opts.fetch_concurrency, opts.decode_threads, sink));
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
) -> Vec<super::options::Step> {
    let began = Instant::now();
    let cores = crate::engine::platform::cores();
    let totals = || {
        let written = sh.written.load(Ordering::Relaxed);
        let cpu = crate::engine::platform::process_cpu_time();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::read::Plain;
    use cairn_format::id::BlobId;

    fn blob(len: usize) -> Decoded<'static> {
        Decoded { id: BlobId::hash_of(&len.to_le_bytes()), data: Plain::Own(vec![0; len]), _reservation: None }
    }

    #[test]
    fn blobs_go_out_in_handfuls_of_bounded_size_in_order() {
        let sizes =
            |h: &Handfuls<'_>| h.iter().map(|v| v.iter().map(|b| b.data.len()).collect()).collect::<Vec<Vec<_>>>();
        // Small blobs: at most `most` to a handful.
        let small = handfuls((1..=20).map(blob), 8);
        assert_eq!(sizes(&small), [(1..=8).collect::<Vec<_>>(), (9..=16).collect(), (17..=20).collect()]);
        // Large ones: a handful ends once it holds 256 KiB; one larger blob is a handful alone.
        let kib = 1 << 10;
        let large = handfuls([100 * kib, 100 * kib, 100 * kib, 1024 * kib, 10 * kib].map(blob), 64);
        assert_eq!(sizes(&large), [vec![100 * kib, 100 * kib, 100 * kib], vec![1024 * kib], vec![10 * kib]]);
        assert!(handfuls(Vec::new(), 8).is_empty());
    }

    #[test]
    fn a_read_of_many_small_blobs_goes_out_in_larger_handfuls() {
        let cut = |sizes: Vec<usize>, writers: usize| {
            let most = handful_blobs(sizes.len(), writers);
            handfuls(sizes.into_iter().map(blob), most).iter().map(Vec::len).collect::<Vec<_>>()
        };
        // A read of 2,000 blobs of 2 KiB for 2 writers: 64 to a handful, 32 handfuls in all.
        let small = cut(vec![2 << 10; 2000], 2);
        assert_eq!(small.len(), 32);
        assert!(small[..31].iter().all(|&n| n == HANDFUL_BLOBS_MOST) && small[31] == 2000 - 31 * 64);
        // In between: about four handfuls per writer.
        assert_eq!(cut(vec![2 << 10; 400], 4), vec![25; 16]);
        // A few files: eight to a handful, so slow writes spread over the writers.
        assert_eq!(cut(vec![2 << 10; 96], 16), vec![8; 12]);
        assert_eq!(cut(vec![2 << 10; 20], 2), [8, 8, 4]);
        // Large blobs: the bytes end a handful first (256 KiB: eight of 32 KiB, not 64).
        assert_eq!(cut(vec![32 << 10; 2000], 2), vec![8; 250]);
    }
}
