//! `cairn diff`: what changed between two snapshots, or two directories or files in them
//! (`cairn_core::commands::diff`).
//!
//! Text: one line per path, `CODE SIZE PATH` (`+` added, `-` removed, `M` content changed, `T`
//! kind changed, `U` metadata only with --metadata; directories end in `/`), then the totals.
//! JSON (`--json`): one object per line, each change (`"message_type": "change"`) in path
//! order, then one `"message_type": "statistics"` object.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use cairn_core::commands::diff::{self, DiffOptions, DiffStats, Entry, Root};
use cairn_core::commands::json;
use cairn_core::engine::repository::Repository;
use cairn_core::engine::trees::{below_root, resolve};
use cairn_format::lock::LockKind;
use cairn_format::tree::NodeKind;
use clap::Args as ClapArgs;

use super::{open_locked, split_spec, Global, WalkMemory};
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
}

pub fn run(g: &Global, a: Args) -> Result<ExitCode> {
    let (repo, _lock) = open_locked(g, LockKind::Shared)?;
    repo.load_index()?;
    let (before_id, before, before_path) = side(&repo, &a.before)?;
    let (after_id, after, after_path) = side(&repo, &a.after)?;
    // Two directories: paths below them from `/`; one object on either side: its path.
    let base = match (&before, &after) {
        (Root::Tree(_), Root::Tree(_)) => PathBuf::from("/"),
        _ => after_path.or(before_path).unwrap_or_else(|| PathBuf::from("/")),
    };
    let shares = a.memory.shares(&repo, 0)?;
    let opts = DiffOptions { metadata: a.metadata, threads: shares.threads };
    let (entries, stats) = diff::diff(&repo, before, after, &base, opts, &shares.loading())?;
    if g.json {
        for e in &entries {
            outln!("{}", json::line(&json::DiffChange::new(e)));
        }
        outln!("{}", json::line(&json::DiffStatistics::new(&stats, &before_id, &after_id)));
    } else {
        outln!("comparing snapshot {before_id} to {after_id}:");
        outln!("");
        for e in &entries {
            outln!("{}", change_line(e));
        }
        if !entries.is_empty() {
            outln!("");
        }
        print_stats(&stats);
    }
    Ok(ExitCode::SUCCESS)
}

/// One side of the comparison: the snapshot's short ID (with `:PATH` if given), what to
/// compare, and the path inside the snapshot.
fn side(repo: &Repository, spec: &std::ffi::OsStr) -> Result<(String, Root, Option<PathBuf>)> {
    let (name, path) = split_spec(spec)?;
    let (id, snap) = repo.find_snapshot(name)?;
    let Some(path) = path.and_then(below_root) else {
        return Ok((id.short(), Root::Tree(snap.tree), None));
    };
    let shown = format!("{}:{}", id.short(), path.display());
    let root = match resolve(repo, &snap.tree, path, &id.short())? {
        None => Root::Tree(snap.tree),
        Some(n) if n.kind == NodeKind::Dir => Root::Tree(n.subtree.context("directory without a subtree")?),
        Some(n) => Root::Node(Box::new(n)),
    };
    Ok((shown, root, Some(path.to_path_buf())))
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
