//! The watchdog: publishes progress and reports a stall (no progress for `--stall-timeout`),
//! naming the stage that is waiting, while the plan loads trees and while the pipeline runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::options::Progress;
use super::shared::Shared;
use crate::engine::profile;

/// What earlier batches (and the compare stage) did before this pipeline: its own counts are
/// added to these.
#[derive(Clone, Copy, Debug, Default)]
pub struct Base {
    /// Bytes done (written, in place or zero).
    pub bytes: u64,
    /// Stored bytes fetched.
    pub fetched: u64,
}

/// While the pipeline runs (until `finished`), publishes progress and reports a stall (no bytes
/// moved for `timeout`), naming the stage that is waiting.
pub fn pipeline(
    sh: &Shared<'_>,
    timeout: Duration,
    progress: &Progress,
    base: Base,
    finished: &AtomicBool,
) -> Vec<String> {
    let stalls = watch(
        timeout,
        progress,
        finished,
        || {
            let now = (sh.reader.fetched_bytes(), sh.written.load(Ordering::Relaxed));
            progress.fetched_bytes.store(base.fetched + now.0, Ordering::Relaxed);
            progress.done_bytes.store(base.bytes + now.1, Ordering::Relaxed);
            progress.done_files.store(sh.files_done.load(Ordering::Relaxed), Ordering::Relaxed);
            (now, sh.created.load(Ordering::Relaxed))
        },
        // Until the create stage is done the writers wait for it, and the fetchers for them.
        || {
            if sh.dirs_ready.is_open() {
                let [fetch, decode] = sh.reader.clocks();
                profile::stalled_stage(&[("fetch", fetch), ("decode", decode), ("write", &sh.write_clock)])
            } else {
                "create"
            }
        },
    );
    progress.done_bytes.store(base.bytes + sh.written.load(Ordering::Relaxed), Ordering::Relaxed);
    progress.fetched_bytes.store(base.fetched + sh.reader.fetched_bytes(), Ordering::Relaxed);
    stalls
}

/// Until `finished` (the caller unparks this thread after setting it, so it stops at once),
/// samples a measure of progress every tick; when it stays the same for `timeout`, reports a
/// stall naming the stage `stage()` says is waiting.
fn watch<T: PartialEq>(
    timeout: Duration,
    progress: &Progress,
    finished: &AtomicBool,
    mut sample: impl FnMut() -> T,
    stage: impl Fn() -> &'static str,
) -> Vec<String> {
    let tick = Duration::from_millis(100).min(timeout);
    let mut last = None;
    let mut since = Instant::now();
    let mut reported = false;
    let mut stalls = Vec::new();
    while !finished.load(Ordering::Relaxed) {
        std::thread::park_timeout(tick);
        let now = Some(sample());
        if now != last {
            last = now;
            since = Instant::now();
            reported = false;
            *progress.stall.lock().expect("stall lock") = None;
        } else if !reported && since.elapsed() >= timeout {
            let msg = format!("no progress for {} s; waiting in the {} stage", timeout.as_secs_f64().round(), stage());
            *progress.stall.lock().expect("stall lock") = Some(msg.clone());
            stalls.push(msg);
            reported = true;
        }
    }
    stalls
}

/// Runs `work` on this thread while [`watch`] samples `sample` on another; returns what `work`
/// returned and the stalls reported meanwhile.
pub fn while_running<T: PartialEq, R>(
    timeout: Duration,
    progress: &Progress,
    sample: impl FnMut() -> T + Send,
    stage: impl Fn() -> &'static str + Send,
    work: impl FnOnce() -> R,
) -> (R, Vec<String>) {
    let finished = AtomicBool::new(false);
    std::thread::scope(|s| {
        let dog = s.spawn(|| watch(timeout, progress, &finished, sample, stage));
        let done = work();
        finished.store(true, Ordering::Relaxed);
        dog.thread().unpark();
        (done, dog.join().expect("watchdog panicked"))
    })
}
