//! The pipeline runner: the read path's fetch and decode workers, one queue and one write
//! worker per writer, the create stage on a thread of its own alongside, and the watchdog.

use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_channel::bounded;

use super::options::{Progress, RestoreOptions};
use super::shared::Shared;
use super::watchdog::{self, Base};
use super::write;
use crate::error::Error;
use crate::pack::BlobEntry;
use crate::read::{spawn_named, Decoded, PackRead, Sink};

/// The restore's end of the read path: each read's verified blobs go to the writer of their
/// files.
#[derive(Clone)]
struct ToWriters<'s> {
    sh: &'s Shared<'s>,
    queues: Vec<crossbeam_channel::Sender<Vec<Decoded<'s>>>>,
}

impl<'s> Sink<'s> for ToWriters<'s> {
    fn blobs(&self, _read: &'s PackRead, batch: Vec<Decoded<'s>>) -> bool {
        // Writes to one file from two threads serialize on the file's inode lock, and spinning
        // on it cost more than it gained (a 4 GiB image: write busy 1.9 s with one writer,
        // 5.2 s with two). So a file's chunks always go to one writer, chosen by the batch's
        // first file; neighbouring entries (mostly one directory) share a writer as well.
        let first = self.sh.fetches.dests.get(&batch[0].id).and_then(|d| d.first()).map_or(0, |d| d.entry as usize);
        self.queues[(first / 16) % self.queues.len()].send(batch).is_ok()
    }

    fn failed(&self, _read: &'s PackRead, blob: &BlobEntry, why: &Error) {
        self.sh.failures.blob(&blob.id, &why.to_string());
    }
}

/// Runs fetch, decode and write, with `create` (which opens `sh.dirs_ready`) on a thread of
/// its own alongside.
pub fn run(
    sh: &Shared<'_>,
    opts: &RestoreOptions,
    progress: &Progress,
    base: Base,
    stalls: &mut Vec<String>,
    create: impl FnOnce() + Send,
) {
    if sh.fetches.reads.is_empty() {
        create();
        return;
    }
    let writers = opts.write_threads.max(1);
    let finished = AtomicBool::new(false);
    std::thread::scope(|s| {
        // One queue per writer: a file's chunks always go to the same writer (see ToWriters).
        let (to_writers, writer_queues): (Vec<_>, Vec<_>) = (0..writers).map(|_| bounded(4)).unzip();
        let mut workers = vec![spawn_named(s, "create", create)];
        let sink = ToWriters { sh, queues: to_writers };
        workers.extend(sh.reader.start(s, &sh.fetches.reads, opts.fetch_concurrency, opts.decode_threads, sink));
        for rx in writer_queues {
            workers.push(spawn_named(s, "write", move || write::write_worker(sh, rx)));
        }
        let watchdog = s.spawn(|| watchdog::pipeline(sh, opts.stall_timeout, progress, base, &finished));
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
        if let Some(p) = panicked {
            std::panic::resume_unwind(p);
        }
    });
}
