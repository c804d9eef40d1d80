//! `cairn diff`: what changed between two snapshots, or two directories or files in them
//! (`cairn_core::commands::diff`).
//!
//! Text: one line per path, `CODE SIZE PATH` (`+` added, `-` removed, `M` content changed, `T`
//! kind changed, `U` metadata only with --metadata; directories end in `/`), then the totals.
//! JSON (`--json`): one object per line, each change (`"message_type": "change"`) in path
//! order, then one `"message_type": "statistics"` object.

use std::ffi::OsString;
use std::process::ExitCode;

use anyhow::Result;
use cairn_core::commands::diff::{self, DiffStats, Entry, Spec};
use cairn_core::commands::json;
use cairn_format::lock::LockKind;
use cairn_format::tree::NodeKind;
use clap::Args as ClapArgs;

use super::{max_memory, open_locked, split_spec, FilterArgs, Global, WalkMemory};
use crate::output::{bytes, count};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// The first snapshot (`latest` or an ID prefix), optionally with :PATH inside it
    #[arg(value_name = "A[:PATH]")]
    before: OsString,
    /// The second snapshot, optionally with :PATH inside it
    #[arg(value_name = "B[:PATH]")]
    after: OsString,
    /// Also list paths whose metadata alone changed (mode, owner, modification time, extended
    /// attributes, ACLs) with `U`
    #[arg(long)]
    metadata: bool,
    #[command(flatten)]
    memory: WalkMemory,
    #[command(flatten)]
    filters: FilterArgs,
}

pub fn run(g: &Global, a: Args) -> Result<ExitCode> {
    let spec = |s| split_spec(s).map(|(snapshot, path)| Spec { snapshot, path });
    let (before, after) = (spec(&a.before)?, spec(&a.after)?);
    let max_memory = max_memory(a.memory.max_memory.as_deref())?;
    let (repo, _lock) = open_locked(g, LockKind::Shared)?;
    let c = diff::diff_snapshots(&repo, before, after, &a.filters.filter(&[]), a.metadata, max_memory)?;
    if g.json {
        for e in &c.entries {
            outln!("{}", json::line(&json::DiffChange::new(e)));
        }
        outln!("{}", json::line(&json::DiffStatistics::new(&c.stats, &c.before, &c.after)));
    } else {
        outln!("comparing snapshot {} to {}:", c.before, c.after);
        outln!("");
        for e in &c.entries {
            outln!("{}", change_line(e));
        }
        if !c.entries.is_empty() {
            outln!("");
        }
        print_stats(&c.stats);
    }
    Ok(ExitCode::SUCCESS)
}

/// `M    1.20 KiB  /path/to/file`; directories end in `/` and have no size.
fn change_line(e: &Entry) -> String {
    let shown = e.after.or(e.before).expect("a change has a side");
    let size = if shown.kind == NodeKind::Dir { String::new() } else { bytes(shown.size) };
    let slash = if shown.kind == NodeKind::Dir { "/" } else { "" };
    format!("{} {size:>11}  {}{slash}", e.change.code(), e.path.display())
}

fn print_stats(s: &DiffStats) {
    let c = |n: u64| count(n);
    outln!(
        "Files:      {:>9} new, {:>9} removed, {:>9} changed",
        c(s.files.added),
        c(s.files.removed),
        c(s.files.changed)
    );
    outln!("Dirs:       {:>9} new, {:>9} removed", c(s.dirs.added), c(s.dirs.removed));
    outln!(
        "Others:     {:>9} new, {:>9} removed, {:>9} changed",
        c(s.others.added),
        c(s.others.removed),
        c(s.others.changed)
    );
    if s.type_changes > 0 {
        outln!("Type changes: {}", c(s.type_changes));
    }
    if s.metadata_changes > 0 {
        outln!("Metadata only: {}", c(s.metadata_changes));
    }
    outln!("Data blobs: {:>9} new, {:>9} removed", c(s.blobs_added), c(s.blobs_removed));
    outln!("  Added:   {}", bytes(s.bytes_added));
    outln!("  Removed: {}", bytes(s.bytes_removed));
}
