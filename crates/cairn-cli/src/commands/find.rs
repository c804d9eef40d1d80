//! `cairn find`: entries matching glob patterns across snapshots (`cairn_core::commands::find`).
//!
//! Text: a table of snapshot, modification time, size and path. JSON (`--json`): one object
//! per match per line.

use std::process::ExitCode;

use anyhow::Result;
use cairn_core::commands::find::{self, Matcher};
use cairn_core::commands::json;
use cairn_format::lock::LockKind;
use cairn_format::tree::{NodeKind, Timestamp};
use clap::Args as ClapArgs;

use super::{max_memory, open_locked, plural, Global, SnapshotArgs, WalkMemory};
use crate::output;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Glob patterns (any may match): on the entry's name, or with a `/` on its whole path
    /// (`/etc/*.conf` from the root, `src/*.rs` at any depth; `**` crosses directories)
    #[arg(value_name = "PATTERN", required = true)]
    patterns: Vec<String>,
    /// Match case-insensitively
    #[arg(short = 'i', long)]
    ignore_case: bool,
    /// Only entries modified at or after this local time (YYYY-MM-DD[ HH:MM:SS])
    #[arg(short = 'O', long, value_name = "TIME", value_parser = parse_time)]
    oldest: Option<Timestamp>,
    /// Only entries modified at or before this local time (YYYY-MM-DD[ HH:MM:SS]; a date alone
    /// means its end)
    #[arg(short = 'N', long, value_name = "TIME", value_parser = parse_end_time)]
    newest: Option<Timestamp>,
    #[command(flatten)]
    snapshots: SnapshotArgs,
    #[command(flatten)]
    memory: WalkMemory,
}

pub fn run(g: &Global, a: Args) -> Result<ExitCode> {
    let mut matcher = Matcher::new(&a.patterns, a.ignore_case)?;
    matcher.oldest = a.oldest;
    matcher.newest = a.newest;
    let max_memory = max_memory(a.memory.max_memory.as_deref())?;
    let (repo, _lock) = open_locked(g, LockKind::Shared)?;
    if !g.json {
        outln!("{:<10} {:<19} {:>11}  path", "snapshot", "modified", "size");
    }
    let (mut matches, mut in_snapshots, mut last) = (0u64, 0usize, None);
    let searched = find::find_selected(&repo, &a.snapshots.filter(), &matcher, max_memory, |id, snap, path, node| {
        matches += 1;
        if last != Some(*id) {
            in_snapshots += 1;
            last = Some(*id);
        }
        if g.json {
            outln!("{}", json::line(&json::FindMatch::new(id, snap, path, node)));
        } else {
            let size = if node.kind == NodeKind::Dir { String::new() } else { output::bytes(node.size) };
            let slash = if node.kind == NodeKind::Dir { "/" } else { "" };
            let time = cairn_core::engine::platform::format_local(node.mtime);
            outln!("{:<10} {time:<19} {size:>11}  {}{slash}", id.short(), path.display());
        }
        Ok(())
    })?;
    if !g.json {
        let found = if matches == 1 { "1 match".to_string() } else { format!("{} matches", output::count(matches)) };
        outln!("{found} in {} (of {} searched)", plural(in_snapshots, "snapshot"), searched);
    }
    Ok(ExitCode::SUCCESS)
}

/// A local time `YYYY-MM-DD HH:MM:SS`, or a date alone (its start).
fn parse_time(s: &str) -> Result<Timestamp> {
    let s = s.trim().replacen('T', " ", 1);
    let full = if s.len() == 10 { format!("{s} 00:00:00") } else { s };
    Ok(cairn_core::engine::platform::parse_local(&full)?)
}

/// As [`parse_time`], a date alone meaning its last second.
fn parse_end_time(s: &str) -> Result<Timestamp> {
    let t = s.trim();
    if t.len() == 10 {
        return Ok(cairn_core::engine::platform::parse_local(&format!("{t} 23:59:59"))
            .map(|ts| Timestamp { secs: ts.secs, nanos: 999_999_999 })?);
    }
    parse_time(t)
}
