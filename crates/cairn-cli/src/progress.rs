//! Progress display and summaries for people (a bar on a terminal) and scripts (`--json`).

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cairn_core::restore::{DryRun, Progress, RestoreOutcome, STAGE_NAMES};
use indicatif::{ProgressBar, ProgressStyle};

use crate::output::{bytes, count, rate};

/// Shows restore progress until `done`: a bar on a terminal, JSON lines with `--json`.
pub fn restore(p: &Progress, done: &AtomicBool, json: bool) {
    let tty = std::io::stderr().is_terminal();
    let bar = (tty && !json).then(|| {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template("{bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}")
                .expect("valid template"),
        );
        bar
    });
    let started = Instant::now();
    let mut last_json = Instant::now();
    while !done.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
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
            let secs = started.elapsed().as_secs_f64();
            println!(
                "{}",
                serde_json::json!({
                    "message_type": "status", "seconds_elapsed": secs, "bytes_done": now, "total_bytes": total,
                    "files_done": files.0, "total_files": files.1,
                    "fetched_bytes": p.fetched_bytes.load(Ordering::Relaxed), "stall": stall,
                })
            );
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
        let stages: Vec<_> = STAGE_NAMES
            .iter()
            .zip(&out.profile)
            .map(|(n, t)| {
                serde_json::json!({"stage": n, "busy_s": t.busy.as_secs_f64(), "idle_s": t.idle.as_secs_f64(), "blocked_s": t.blocked.as_secs_f64()})
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({
                "message_type": "summary", "snapshot_id": snapshot, "files": out.files, "dirs": out.dirs,
                "others": out.others, "bytes_total": out.bytes_total, "bytes_written": out.bytes_written,
                "bytes_fetched": out.bytes_fetched, "bytes_in_place": out.bytes_in_place, "bytes_zero": out.bytes_zero,
                "deleted": out.deleted, "verified": out.verified, "failed": out.failed.len(),
                "warnings": out.warnings.len(), "stalls": out.stalls, "seconds": secs, "profile": stages,
            })
        );
        return;
    }
    println!(
        "restored {} files, {} in {secs:.1} s ({}): fetched {}, {} already in place, {} zero",
        count(out.files),
        bytes(out.bytes_total),
        rate(out.bytes_total, secs),
        bytes(out.bytes_fetched),
        bytes(out.bytes_in_place),
        bytes(out.bytes_zero)
    );
    if out.deleted > 0 {
        println!("deleted {} entries the snapshot lacks", count(out.deleted));
    }
    if out.verified > 0 {
        println!("verified {} files against the snapshot", count(out.verified));
    }
    if profile {
        let phases: Vec<String> = out.phases.iter().map(|(n, d)| format!("{n} {:.2} s", d.as_secs_f64())).collect();
        println!("phases: {}", phases.join(", "));
        println!("{:<8} {:>9} {:>9} {:>9}", "stage", "busy s", "idle s", "blocked s");
        for (name, t) in STAGE_NAMES.iter().zip(&out.profile) {
            println!(
                "{name:<8} {:>9.2} {:>9.2} {:>9.2}",
                t.busy.as_secs_f64(),
                t.idle.as_secs_f64(),
                t.blocked.as_secs_f64()
            );
        }
    }
}

/// Prints what a dry run found.
pub fn print_dry_run(dry: &DryRun, out: &RestoreOutcome, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::json!({
                "message_type": "dry_run", "create": dry.create, "update": dry.update,
                "unchanged": dry.unchanged, "delete": dry.delete, "bytes_to_fetch": out.bytes_fetched,
            })
        );
        return;
    }
    for p in &dry.create {
        println!("create {}", p.display());
    }
    for p in &dry.update {
        println!("update {}", p.display());
    }
    for p in &dry.delete {
        println!("delete {}", p.display());
    }
    println!(
        "would create {} files, update {}, leave {} unchanged, delete {}; fetch {}",
        count(dry.create.len() as u64),
        count(dry.update.len() as u64),
        count(dry.unchanged),
        count(dry.delete.len() as u64),
        bytes(out.bytes_fetched)
    );
}
