//! `cairn check`: is the repository whole? Structure always; pack data in full, a subset, or
//! a slice per run with `--resume`.

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Result};
use cairn_core::commands::check::{self, CheckOptions, CheckReport, Progress, ReadData};
use cairn_core::commands::json;
use cairn_core::engine::open::Opened;
use clap::Args as ClapArgs;

use super::{machine, options, parse_size, repository, set_on_sigint, Global, SnapshotArgs};
use crate::output::{bytes, count};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Read every pack in full: decrypt, decompress and verify every blob
    #[arg(long, conflicts_with = "read_data_subset")]
    read_data: bool,
    /// Read some packs in full: N/M (packs by ID, deterministic), P% (at random) or SIZE (e.g. 50G)
    #[arg(long, value_name = "SUBSET")]
    read_data_subset: Option<String>,
    /// Pick the packs read longest ago (never read first) instead of random ones, from this
    /// machine's record of earlier checks (kept in the cache directory)
    #[arg(long)]
    resume: bool,
    /// Stop reading pack data after this long (e.g. 10m); the next --resume run carries on
    #[arg(long, value_name = "DURATION")]
    max_duration: Option<String>,
    #[command(flatten)]
    snapshots: SnapshotArgs,
    /// Requests in flight [default: 8 for a local repository, 32 for S3, 8 for SFTP]
    #[arg(long, value_name = "N")]
    fetch_concurrency: Option<usize>,
    /// Memory the whole check may use, e.g. 256M: the index, the packs it lists and what the
    /// walk keeps of each tree are counted first, the rest is pack data in flight (read in pieces
    /// of an eighth of it, at least 1 MiB); a budget too small is refused, naming the least
    /// [default: no bound on those, and 16M of pack data in flight, over a slow link twice what
    /// 320 MiB/s fills in its round trip, up to 64M]
    #[arg(long, value_name = "SIZE")]
    max_memory: Option<String>,
    /// Print the requests waited for one after another (with CAIRN_INJECT_FAULTS, which traces
    /// them) before the first pack data was fetched
    #[arg(long)]
    profile: bool,
}

pub fn run(g: &Global, a: Args) -> Result<ExitCode> {
    cairn_core::engine::platform::keep_heap_small();
    let read_data = match (&a.read_data_subset, a.read_data) {
        (Some(s), _) => ReadData::Subset(s.parse()?),
        (None, true) => ReadData::All,
        (None, false) => ReadData::None,
    };
    // The record of packs read lives in the cache directory (also for local repositories).
    let record_base = machine(g).dir;
    if a.resume && record_base.is_none() {
        bail!("--resume keeps its record in the cache directory: give --cache-dir (or drop --no-cache)");
    }
    let max_duration = a.max_duration.as_deref().map(cairn_core::engine::platform::parse_duration).transpose()?;
    let max_memory = a.max_memory.as_deref().map(parse_size).transpose()?;
    let cancel = Arc::new(AtomicBool::new(false));
    let opts = CheckOptions {
        read_data,
        record_dir: record_base,
        resume: a.resume,
        max_duration,
        filter: a.snapshots.filter(),
        concurrency: a.fetch_concurrency,
        max_memory,
        cancel: cancel.clone(),
        ..CheckOptions::default()
    };
    let progress = Progress::default();
    let (storage, pw) = repository(g)?;
    set_on_sigint(&cancel)?;
    let (Opened { repo, lock: _lock }, report) = crate::progress::while_showing(
        |done| crate::progress::check(&progress, done, g.json),
        || check::open_and_check(storage, &pw, &opts, options(g), &progress),
    )?;
    let report = match report {
        Err(cairn_core::Error::Interrupted) => {
            eprintln!("cairn: check interrupted");
            return Ok(ExitCode::from(130));
        }
        other => other?,
    };
    if a.profile {
        crate::progress::print_round_trips(&**repo.storage(), g.json);
    }
    print(&report, g.json);
    Ok(if report.errors() > 0 { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

fn print(r: &CheckReport, json: bool) {
    if json {
        outln!("{}", json::line(&json::CheckSummary::new(r)));
        return;
    }
    for f in &r.findings {
        let level = match f.severity {
            check::Severity::Error => "error",
            check::Severity::Notice => "notice",
        };
        outln!("{level}: {}", f.message);
        for a in &f.affected {
            outln!("    needed by snapshot {} at {}", a.snapshot, a.path);
        }
    }
    if r.packs_read > 0 || r.stopped_early {
        outln!(
            "read {} packs ({}) in full, {} blobs verified",
            count(r.packs_read),
            bytes(r.bytes_read),
            count(r.blobs_read)
        );
    }
    if r.stopped_early {
        outln!("stopped at the time limit: {} packs left for the next run (--resume)", count(r.packs_left));
    }
    match (r.never_read, r.oldest_read_secs) {
        (Some(0), Some(age)) => outln!("every pack was read in full within the last {}", age_text(age)),
        (Some(n), _) if n > 0 => outln!("{} packs have never been read in full by a check on this machine", count(n)),
        _ => {}
    }
    let verdict = match (r.errors(), r.notices()) {
        (0, 0) => "no errors".to_string(),
        (0, n) => format!("no errors, {n} notices"),
        (e, 0) => format!("{e} errors"),
        (e, n) => format!("{e} errors, {n} notices"),
    };
    outln!(
        "checked {} packs, {}, {} blobs, {} snapshots in {:.1} s: {verdict}",
        count(r.packs),
        bytes(r.bytes),
        count(r.blobs),
        count(r.snapshots),
        r.duration.as_secs_f64()
    );
}

fn age_text(secs: u64) -> String {
    match secs {
        s if s < 3600 => plural(s.div_ceil(60).max(1), "minute"),
        s if s < 2 * 86400 => plural(s.div_ceil(3600), "hour"),
        s => plural(s.div_ceil(86400), "day"),
    }
}

fn plural(n: u64, unit: &str) -> String {
    if n == 1 {
        format!("1 {unit}")
    } else {
        format!("{n} {unit}s")
    }
}
