//! `cairn stats`: how big snapshots are (`cairn_core::commands::stats`): what a restore writes
//! (`--mode restore-size`) or the unique data they reference as stored (`--mode raw-data`).
//!
//! JSON (`--json`): one object with both parts, whatever the mode.

use std::process::ExitCode;

use anyhow::Result;
use cairn_core::commands::json;
use cairn_core::commands::stats;
use cairn_format::lock::LockKind;
use clap::{Args as ClapArgs, ValueEnum};

use super::{open_locked, FilterArgs, Global, WalkMemory};
use crate::output::{bytes, count};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Snapshots to count (ID prefixes or `latest`; none: every snapshot the filters select)
    #[arg(value_name = "SNAPSHOT")]
    ids: Vec<String>,
    /// What to count: restore-size (files and bytes a restore writes) or raw-data (the unique
    /// blobs referenced: plaintext and stored bytes, deduplication, compression, per codec)
    #[arg(long, value_enum, default_value_t = Mode::RestoreSize)]
    mode: Mode,
    #[command(flatten)]
    filters: FilterArgs,
    #[command(flatten)]
    memory: WalkMemory,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    RestoreSize,
    RawData,
}

pub fn run(g: &Global, a: Args) -> Result<ExitCode> {
    let (repo, _lock) = open_locked(g, LockKind::Shared)?;
    repo.load_index()?;
    let snaps = a.filters.filter(&a.ids).select(&repo)?;
    // Beside the walk: a bit for each blob of the index.
    let shares = a.memory.shares(&repo, repo.index().len().div_ceil(8) as u64)?;
    let s = stats::stats(&repo, &snaps, shares.threads, &shares.loading())?;
    if g.json {
        let mode = match a.mode {
            Mode::RestoreSize => "restore-size",
            Mode::RawData => "raw-data",
        };
        outln!("{}", json::line(&json::StatsReport::new(&s, mode)));
        return Ok(ExitCode::SUCCESS);
    }
    outln!("snapshots:      {}", count(s.snapshots));
    match a.mode {
        Mode::RestoreSize => {
            let r = &s.restore;
            let links =
                if r.hard_links > 0 { format!(" ({} of them hard links)", count(r.hard_links)) } else { String::new() };
            outln!("files:          {}{links}", count(r.files));
            outln!("directories:    {}", count(r.dirs));
            outln!("others:         {}", count(r.others));
            outln!("total size:     {} ({} bytes)", bytes(r.bytes), count(r.bytes));
        }
        Mode::RawData => {
            let raw = &s.raw;
            outln!("blobs:          {} data, {} trees", count(raw.data_blobs), count(raw.tree_blobs));
            outln!("plaintext:      {} ({} of file data)", bytes(raw.plain), bytes(raw.data_plain));
            outln!("stored:         {}", bytes(raw.stored));
            outln!(
                "deduplication:  {:.2}x ({} restored from {} of unique file data)",
                s.dedup_ratio(),
                bytes(s.restore.bytes),
                bytes(raw.data_plain)
            );
            outln!("compression:    {:.2}x", raw.compression_ratio());
            if raw.zero_bytes > 0 {
                outln!("zeros, not stored: {}", bytes(raw.zero_bytes));
            }
            outln!("by codec:");
            super::prune::print_codecs(&raw.by_codec);
        }
    }
    Ok(ExitCode::SUCCESS)
}
