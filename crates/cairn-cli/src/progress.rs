//! Progress display and summaries for people (a bar on a terminal) and scripts (`--json`).

use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cairn_core::commands::backup::{self, BackupOutcome};
use cairn_core::commands::json;
use cairn_core::commands::restore::{DryRun, Progress, RestoreOutcome, STAGE_NAMES};
use cairn_core::engine::signal::{RaiseOnDrop, Signal};
use indicatif::{ProgressBar, ProgressStyle};

use crate::output::{bytes, count, rate};

/// Runs `work` while `show` displays progress on a thread of its own; `show` is told to stop
/// when the work ends (also when it unwinds) by a [`Signal`] it waits on between updates, so it
/// stops at once (a plain sleep of 100 ms between checks made every command end up to 100 ms
/// after its work did).
pub fn while_showing<T>(show: impl FnOnce(&Signal) + Send, work: impl FnOnce() -> T) -> T {
    let done = Signal::default();
    std::thread::scope(|s| {
        let reporter = s.spawn(|| show(&done));
        let out = {
            let _stop = RaiseOnDrop(&done);
            work()
        };
        reporter.join().expect("progress thread");
        out
    })
}

/// How often a progress display updates.
const TICK: Duration = Duration::from_millis(100);

/// A progress bar on stderr when it is a terminal and `--json` is off.
fn terminal_bar(json: bool) -> Option<ProgressBar> {
    let tty = std::io::stderr().is_terminal();
    (tty && !json).then(|| {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template("{bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}")
                .expect("valid template"),
        );
        bar
    })
}

/// Shows restore progress until `done`: a bar on a terminal, JSON lines with `--json`.
pub fn restore(p: &Progress, done: &Signal, json: bool) {
    let bar = terminal_bar(json);
    let started = Instant::now();
    let mut last_json = Instant::now();
    while !done.wait_timeout(TICK) {
        let total = p.total_bytes.load(Ordering::Relaxed);
        let now = p.done_bytes.load(Ordering::Relaxed);
        let files = (p.done_files.load(Ordering::Relaxed), p.total_files.load(Ordering::Relaxed));
        let stall = p.stall.lock().expect("stall lock").clone();
        if let Some(bar) = &bar {
            bar.set_length(total);
            bar.set_position(now);
            let mut msg = format!("{}/{} files", count(files.0), count(files.1));
            if let Some(s) = stall {
                msg.push_str(&format!(" — stalled: {s}"));
            }
            bar.set_message(msg);
        } else if json && last_json.elapsed() >= Duration::from_secs(1) {
            last_json = Instant::now();
            outln!("{}", json::line(&json::RestoreStatus::new(p, started.elapsed())));
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
}

/// Shows a live restore's progress until `done`: the bytes of the target present (restored in
/// the background, or read or written by a client) out of its size, as a bar on a terminal or
/// a `live_status` JSON line a second with `--json` (the first after 100 ms).
pub fn live(p: &Progress, present: &dyn Fn() -> u64, size: u64, done: &Signal, json: bool) {
    let bar = terminal_bar(json);
    if let Some(bar) = &bar {
        bar.set_length(size);
    }
    let started = Instant::now();
    let mut last_json = None::<Instant>;
    while !done.wait_timeout(TICK) {
        if let Some(bar) = &bar {
            bar.set_position(present());
            let mut msg =
                format!("present; {} restored in the background, serving", bytes(p.done_bytes.load(Ordering::Relaxed)));
            if let Some(s) = p.stall.lock().expect("stall lock").clone() {
                msg.push_str(&format!(" — stalled: {s}"));
            }
            bar.set_message(msg);
        } else if json && last_json.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            last_json = Some(Instant::now());
            outln!("{}", json::line(&json::LiveStatus::new(p, present(), size, started.elapsed())));
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
}

/// Prints the end-of-restore summary (and, with `profile`, per-stage times).
pub fn print_restore_summary(snapshot: &str, out: &RestoreOutcome, json: bool, profile: bool) {
    let secs = out.duration.as_secs_f64();
    if json {
        outln!("{}", json::line(&json::RestoreSummary::new(snapshot, out)));
        return;
    }
    outln!(
        "restored {} files, {} in {secs:.1} s ({}): fetched {}, {} already in place, {} zero",
        count(out.files),
        bytes(out.bytes_total),
        rate(out.bytes_total, secs),
        bytes(out.bytes_fetched),
        bytes(out.bytes_in_place),
        bytes(out.bytes_zero)
    );
    if out.bytes_reused_source + out.bytes_reused_target > 0 {
        outln!("{}", reused_line("copied", out));
    }
    if out.deleted > 0 {
        outln!("deleted {} entries the snapshot lacks", count(out.deleted));
    }
    if out.verified > 0 {
        outln!("verified {} files against the snapshot", count(out.verified));
    }
    if profile {
        let phases: Vec<String> = out.phases.iter().map(|(n, d)| format!("{n} {:.2} s", d.as_secs_f64())).collect();
        outln!("phases: {} (in {} batches)", phases.join(", "), count(out.batches));
        outln!("{:<8} {:>9} {:>9} {:>9}", "stage", "busy s", "idle s", "blocked s");
        for (name, t) in STAGE_NAMES.iter().zip(&out.profile) {
            outln!(
                "{name:<8} {:>9.2} {:>9.2} {:>9.2}",
                t.busy.as_secs_f64(),
                t.idle.as_secs_f64(),
                t.blocked.as_secs_f64()
            );
        }
        print_tuning(&out.fetch_tuning);
        print_write_tuning(&out.write_tuning);
        print_gaps(&out.read_gaps);
    }
}

/// The writers' controller's choices (`--profile`): when (since its batch's pipeline started),
/// to what, and from what it measured.
fn print_write_tuning(steps: &[cairn_core::commands::restore::WriteStep]) {
    if steps.is_empty() {
        return;
    }
    outln!("files written at once, tuned while running:");
    for s in steps {
        outln!(
            "  {:>7.2} s  {:>3} writers  ({}: {}/s written, {:.0}% of the cores busy)",
            s.at.as_secs_f64(),
            s.limit,
            s.reason,
            bytes(s.rate as u64),
            s.cpu * 100.0
        );
    }
}

/// The fetch concurrency's controller's choices (`--profile`): when, to what, and from what
/// it measured.
fn print_tuning(steps: &[cairn_core::engine::read::TuneStep]) {
    if steps.is_empty() {
        return;
    }
    outln!("fetch concurrency, tuned while running:");
    for s in steps {
        let cpu = s.cpu_busy.map_or(String::new(), |b| format!(", the machine's CPU {:.0}% busy", b * 100.0));
        outln!(
            "  {:>7.2} s  {:>3} in flight  ({}: {}/s at {:.0} ms per request{cpu})",
            s.at.as_secs_f64(),
            s.limit,
            s.reason,
            bytes(s.throughput as u64),
            s.latency.as_secs_f64() * 1000.0
        );
    }
}

/// The coalescing gap of each batch's reads and what it came from (`--profile`).
fn print_gaps(gaps: &[cairn_core::engine::read::GapChoice]) {
    for (i, g) in gaps.iter().enumerate() {
        let why = match g.cost {
            Some(c) if g.gap > g.floor => format!(
                "a {:.1} ms round trip is worth {} at {}/s with {} in flight",
                c.latency.as_secs_f64() * 1000.0,
                bytes(g.gap),
                bytes(c.rate as u64),
                c.in_flight
            ),
            Some(c) => {
                format!("the storage's own: a {:.2} ms round trip is worth less", c.latency.as_secs_f64() * 1000.0)
            }
            None => "the storage's own: no round trip measured yet".to_string(),
        };
        outln!("batch {} reads through gaps of up to {} ({why})", i + 1, bytes(g.gap));
    }
}

/// With a tracing storage layer (fault injection), prints the longest chain of requests waited
/// for one after another before the first data fetch (`--profile`).
pub fn print_round_trips(storage: &dyn cairn_core::engine::storage::Storage, json: bool) {
    let Some(trace) = storage.trace() else { return };
    let path = trace.critical_path();
    let ms = |d: std::time::Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
    if json {
        outln!("{}", json::line(&json::RoundTrips::new(&path)));
    } else {
        let steps: Vec<String> =
            path.chain.iter().map(|s| format!("{} {:.0}–{:.0} ms", s.what, ms(s.start), ms(s.end))).collect();
        let first = match path.first_data {
            Some(t) => format!("; the first data fetch started at {:.0} ms", ms(t)),
            None => String::new(),
        };
        outln!("serial round trips before the first data fetch: {} ({}){first}", steps.len(), steps.join(" → "));
    }
}

/// With `--profile`: when the restore's lock was let go (`Held`).
pub fn print_lock_let_go(held: &cairn_core::engine::open::Held, json: bool) {
    let message = json::LockLetGo::new(held);
    let before_end = message.before_end();
    if json {
        outln!("{}", json::line(&message));
    } else if let Some(s) = before_end {
        outln!("lock let go once the reads were over, {s:.3} s before the restore ended");
    } else {
        outln!("lock held to the end");
    }
}

/// Prints what a dry run found.
pub fn print_dry_run(dry: &DryRun, out: &RestoreOutcome, json: bool) {
    if json {
        outln!("{}", json::line(&json::RestoreDryRun::new(dry, out)));
        return;
    }
    for p in &dry.create {
        outln!("create {}", p.display());
    }
    for p in &dry.update {
        outln!("update {}", p.display());
    }
    for p in &dry.delete {
        outln!("delete {}", p.display());
    }
    outln!(
        "would create {} files, update {}, leave {} unchanged, delete {}; fetch {}",
        count(dry.create.len() as u64),
        count(dry.update.len() as u64),
        count(dry.unchanged),
        count(dry.delete.len() as u64),
        bytes(out.bytes_fetched)
    );
    if out.bytes_reused_source + out.bytes_reused_target > 0 {
        outln!("{}", reused_line("would copy", out));
    }
}

/// What a restore copied (or would copy) from local files instead of fetching it.
fn reused_line(verb: &str, out: &RestoreOutcome) -> String {
    format!(
        "{verb} {} from local files instead of fetching: {} from the original files, {} from other files in the target",
        bytes(out.bytes_reused_source + out.bytes_reused_target),
        bytes(out.bytes_reused_source),
        bytes(out.bytes_reused_target)
    )
}

/// Shows backup progress until `done`: on a terminal the files being read right now, files
/// and bytes done of the pre-scan's totals, the rate and the time left; JSON lines with `--json`.
pub fn backup(p: &backup::Progress, done: &Signal, json: bool) {
    let bar = terminal_bar(json);
    let started = Instant::now();
    let mut last_json = Instant::now();
    while !done.wait_timeout(TICK) {
        let total = (p.total_files.load(Ordering::Relaxed), p.total_bytes.load(Ordering::Relaxed));
        let now = (p.files_done.load(Ordering::Relaxed), p.bytes_done.load(Ordering::Relaxed));
        let scanned = p.scan_finished.load(Ordering::Relaxed);
        let reading = p.reading();
        if let Some(bar) = &bar {
            bar.set_length(total.1.max(now.1));
            bar.set_position(now.1);
            let mut msg = format!("{}/{}{} files", count(now.0), count(total.0), if scanned { "" } else { "+" });
            for f in &reading {
                msg.push_str(&format!("\n  {}", f.display()));
            }
            bar.set_message(msg);
        } else if json && last_json.elapsed() >= Duration::from_secs(1) {
            last_json = Instant::now();
            outln!("{}", json::line(&json::BackupStatus::new(p, started.elapsed())));
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
}

/// Prints the end-of-backup summary.
pub fn print_backup_summary(out: &BackupOutcome, json: bool) {
    if json {
        outln!("{}", json::line(&json::BackupSummary::new(out)));
        return;
    }
    let s = &out.snapshot.summary;
    let secs = s.duration_ms as f64 / 1000.0;
    match out.snapshot.parent {
        Some(p) => outln!("using parent snapshot {}", p.short()),
        None => outln!("no parent snapshot: every file was read"),
    }
    outln!(
        "files: {} new, {} changed, {} unmodified",
        count(s.files_new),
        count(s.files_changed),
        count(s.files_unmodified)
    );
    outln!(
        "dirs:  {} new, {} changed, {} unmodified",
        count(out.dirs.new),
        count(out.dirs.changed),
        count(out.dirs.unmodified)
    );
    outln!(
        "read {} in {secs:.1} s ({}); added {} ({} stored)",
        bytes(s.bytes_read),
        rate(s.bytes_read, secs),
        bytes(s.bytes_added),
        bytes(s.bytes_stored)
    );
    match out.id {
        Some(id) => outln!("snapshot {} saved", id.short()),
        None => outln!("dry run: nothing was stored"),
    }
}

/// Shows check progress until `done`: the phase and its count on a terminal, JSON lines with
/// `--json`.
pub fn check(p: &cairn_core::commands::check::Progress, done: &Signal, json: bool) {
    let read = || (p.bytes_read.load(Ordering::Relaxed), p.bytes_to_read.load(Ordering::Relaxed));
    let counts =
        || (*p.phase.lock().expect("progress lock"), p.done.load(Ordering::Relaxed), p.total.load(Ordering::Relaxed));
    poll_phases(
        done,
        json,
        |bar| {
            let ((read, to_read), (phase, n, total)) = (read(), counts());
            bar.set_length(to_read);
            bar.set_position(read);
            let of = if total > 0 { format!("/{}", count(total)) } else { String::new() };
            bar.set_message(format!("{phase} {}{of}", count(n)));
        },
        |elapsed| json::line(&json::CheckStatus::new(p, elapsed)),
    );
}

/// Shows copy progress until `done`: a bar of the source bytes read on a terminal, JSON lines
/// with `--json`.
pub fn copy(p: &cairn_core::commands::copy::CopyProgress, done: &Signal, json: bool) {
    let now = || {
        let phase = *p.phase.lock().expect("phase lock");
        (phase, p.total_bytes.load(Ordering::Relaxed), p.read_bytes.load(Ordering::Relaxed), p.written.bytes())
    };
    poll_phases(
        done,
        json,
        |bar| {
            let (phase, total, read, written) = now();
            bar.set_length(total);
            bar.set_position(read);
            bar.set_message(format!("{phase}, {} written", bytes(written)));
        },
        |elapsed| json::line(&json::CopyStatus::new(p, elapsed)),
    );
}

/// Until `done`, every 100 ms: `show` updates the bar on a terminal; otherwise, with `--json`,
/// every second the status line `status` makes of the time since the start.
fn poll_phases(done: &Signal, json: bool, show: impl Fn(&ProgressBar), status: impl Fn(Duration) -> String) {
    let bar = terminal_bar(json);
    let started = Instant::now();
    let mut last_json = Instant::now();
    while !done.wait_timeout(TICK) {
        if let Some(bar) = &bar {
            show(bar);
        } else if json && last_json.elapsed() >= Duration::from_secs(1) {
            last_json = Instant::now();
            outln!("{}", status(started.elapsed()));
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
}
