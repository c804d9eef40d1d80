//! `cairn prune`: delete what no snapshot needs, beside running backups (it never blocks one).

use std::process::ExitCode;
use std::sync::Mutex;

use anyhow::Result;
use cairn_core::commands::json;
use cairn_core::commands::prune::{self, CodecUse, Limit, PlanOptions, PruneOptions, PruneReport, RepackOptions};
use cairn_core::engine::lock::Lock;
use cairn_core::engine::repository::Repository;
use cairn_format::lock::LockKind;
use clap::Args as ClapArgs;

use super::{cancel_on_sigint, max_memory, open_holding, parse_size, Global};
use crate::output::bytes;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Unused space to tolerate: a percentage of the repository (5%), a size (2G) or `unlimited`
    #[arg(long, value_name = "LIMIT", default_value = "5%")]
    max_unused: String,
    /// Repack at most this many bytes of packs (e.g. 10G)
    #[arg(long, value_name = "SIZE")]
    max_repack_size: Option<String>,
    /// Merge small packs even if there are only a few
    #[arg(long)]
    repack_small: bool,
    /// Compress blobs stored uncompressed (with the repository's default codec)
    #[arg(long)]
    repack_uncompressed: bool,
    #[command(flatten)]
    pub run: RunArgs,
}

/// What prune and recompress share: how to run, not what to do.
#[derive(ClapArgs, Debug)]
pub struct RunArgs {
    /// Show what would be deleted and repacked, and how much space it frees; change nothing
    #[arg(long, short = 'n')]
    pub dry_run: bool,
    /// Wait at most this long for backups and restores that started before the prune decided
    /// (e.g. 30m); after that the deletion is left for the next prune
    #[arg(long, value_name = "DURATION", default_value = "24h")]
    pub max_wait: String,
    /// Memory the whole prune may use: the index and index files it plans from, then reads
    /// and new packs while repacking; too small a budget is refused, naming the least that fits
    /// [default: 256M, or the least this repository needs]
    #[arg(long, value_name = "SIZE")]
    pub max_memory: Option<String>,
    /// Run at normal CPU priority (by default a prune lowers its own, so that backups running
    /// beside it keep their speed)
    #[arg(long)]
    pub foreground: bool,
    /// Pack reads in flight while repacking [default: 8, or the remote backend's concurrency]
    #[arg(long, value_name = "N")]
    pub fetch_concurrency: Option<usize>,
}

impl RunArgs {
    /// The defaults (those of `cairn prune`), for `forget --prune`.
    pub fn defaults(dry_run: bool) -> Self {
        RunArgs { dry_run, max_wait: "24h".into(), max_memory: None, fetch_concurrency: None, foreground: false }
    }
}

pub fn run(g: &Global, a: Args) -> Result<ExitCode> {
    let plan = PlanOptions {
        max_unused: a.max_unused.parse::<Limit>()?,
        max_repack: a.max_repack_size.as_deref().map(parse_size).transpose()?,
        repack_small: a.repack_small,
        repack_uncompressed: a.repack_uncompressed,
        recompress: None,
    };
    let (repo, lock) = open_holding(g, LockKind::Prune)?;
    run_plan(g, &repo, &lock, plan, &a.run)
}

/// Runs a prune with `plan` on `repo` under its prune `lock` and prints its report. The prune
/// reads the index files itself (it keeps them beside the index it builds).
pub(crate) fn run_plan(g: &Global, repo: &Repository, lock: &Lock, plan: PlanOptions, a: &RunArgs) -> Result<ExitCode> {
    cairn_core::engine::platform::keep_heap_small();
    let cancel = cancel_on_sigint()?;
    if !a.foreground {
        background_priority();
    }
    let opts = PruneOptions {
        repack: RepackOptions::new(repo, &plan, a.fetch_concurrency),
        plan,
        max_memory: max_memory(a.max_memory.as_deref())?,
        dry_run: a.dry_run,
        max_wait: cairn_core::engine::platform::parse_duration(&a.max_wait)?,
    };
    let last = Mutex::new(String::new());
    let say = |msg: &str| {
        if !g.json {
            eprintln!("{msg}");
        }
        *last.lock().expect("say lock") = msg.to_string();
    };
    let report = match prune::prune(repo, Some(lock), &opts, &say, cancel) {
        Err(cairn_core::Error::Interrupted) => {
            eprintln!("cairn: prune interrupted; the next prune finishes its work");
            return Ok(ExitCode::from(130));
        }
        other => other?,
    };
    print(&report, a.dry_run, g.json);
    Ok(ExitCode::SUCCESS)
}

/// Lowers this process's CPU priority (nice 10) before the prune starts its workers, which
/// inherit it: maintenance yields the CPU to backups and restores running beside it.
fn background_priority() {
    // SAFETY: setpriority only changes the calling thread's scheduling priority (on Linux a
    // nice value is per thread, and threads started later inherit it). Failing to lower it
    // changes nothing but speed.
    let _ = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) };
}

fn print(r: &PruneReport, dry_run: bool, json: bool) {
    if json {
        outln!("{}", json::line(&json::PruneSummary::new(r, dry_run)));
        return;
    }
    for e in &r.earlier {
        outln!("finished an earlier prune: deleted {} packs ({})", e.deleted_packs, bytes(e.deleted_bytes));
    }
    let p = &r.plan;
    if p.packs > 0 {
        outln!("{} snapshots need {} blobs, {} stored", r.snapshots, p.used_blobs, bytes(p.used_bytes));
        outln!(
            "{} packs, {}: {} unused ({:.1}%)",
            p.packs,
            bytes(p.size),
            bytes(p.unused_bytes),
            percent(p.unused_bytes, p.size)
        );
        print_codecs(&p.by_codec);
        let verb = if dry_run { "would delete" } else { "delete" };
        outln!(
            "{verb} {} packs ({}){}, repack {} packs ({}, copying {}{})",
            p.delete_packs,
            bytes(p.delete_bytes),
            if p.unindexed_packs > 0 {
                format!(" of which {} no index names", p.unindexed_packs)
            } else {
                String::new()
            },
            p.repack_packs,
            bytes(p.repack_bytes),
            bytes(p.copy_bytes),
            if p.reencode_blobs > 0 { format!(", re-encoding {} blobs", p.reencode_blobs) } else { String::new() },
        );
        outln!(
            "after: {} packs + new ones, about {}, {} unused ({:.1}%)",
            p.keep_packs,
            bytes(p.size_after),
            bytes(p.unused_after),
            percent(p.unused_after, p.size_after)
        );
    }
    if r.deferred {
        outln!("operations that started before this prune decided still run: the deletion is left for the next `cairn prune`");
    }
    if let Some(after) = &r.by_codec_after {
        outln!("stored after:");
        print_codecs(after);
    }
    if let Some(f) = &r.finished {
        if f.rescued_packs > 0 {
            outln!("kept {} packs that snapshots written meanwhile need", f.rescued_packs);
        }
    }
    if !dry_run {
        let secs: f64 = r.phases.iter().map(|(_, s)| s).sum();
        let phases: Vec<String> = r.phases.iter().map(|(n, s)| format!("{n} {s:.1}s")).collect();
        // A recompress to a faster codec can make the repository larger.
        let change = if r.size_after > r.size_before {
            format!("grew by {} from {}", bytes(r.size_after - r.size_before), bytes(r.size_before))
        } else {
            format!("freed {} of {}", bytes(r.size_before - r.size_after), bytes(r.size_before))
        };
        outln!("{change} in {secs:.1}s ({})", phases.join(", "));
    }
}

/// One line per codec: blobs, stored and plaintext bytes.
pub(crate) fn print_codecs(by_codec: &std::collections::BTreeMap<String, CodecUse>) {
    for (codec, c) in by_codec {
        outln!("  {codec:<8} {:>9} blobs {:>12} stored {:>12} raw", c.blobs, bytes(c.stored), bytes(c.raw));
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}
