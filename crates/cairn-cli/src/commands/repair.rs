//! `cairn repair index|snapshots|packs|unreadable`: bring a damaged repository back to a state `cairn
//! check` finds whole.

use std::process::ExitCode;

use anyhow::Result;
use cairn_core::commands::{json, repair};
use cairn_format::lock::LockKind;
use clap::{Args as ClapArgs, Subcommand};

use super::{open_locked, Global, SnapshotArgs};

#[derive(Subcommand, Debug)]
pub enum Args {
    /// Rebuild the index from the pack headers (after index files were lost or damaged)
    Index(IndexArgs),
    /// Write new snapshots whose files that need missing data are cut to what can be read
    Snapshots(SnapshotsArgs),
    /// Copy the readable blobs of damaged packs into new packs, then remove the packs
    Packs(PacksArgs),
    /// Remove the snapshots, key files, start hint and deletion manifests that cannot be read
    /// (every command skips them with a warning; index files: `repair index`)
    Unreadable(UnreadableArgs),
}

#[derive(ClapArgs, Debug)]
pub struct UnreadableArgs {
    /// Show what would be removed and remove nothing
    #[arg(long, short = 'n')]
    dry_run: bool,
}

#[derive(ClapArgs, Debug)]
pub struct IndexArgs {
    /// Read every pack in full and index only the blobs that verify
    #[arg(long)]
    read_all_packs: bool,
}

#[derive(ClapArgs, Debug)]
pub struct SnapshotsArgs {
    /// Remove each damaged original once its repaired copy is written
    #[arg(long)]
    forget: bool,
    /// Show what would change and write nothing
    #[arg(long, short = 'n')]
    dry_run: bool,
    #[command(flatten)]
    snapshots: SnapshotArgs,
}

#[derive(ClapArgs, Debug)]
pub struct PacksArgs {
    /// Packs to salvage (full IDs or unique prefixes, as `check` names them)
    #[arg(value_name = "ID", required = true)]
    ids: Vec<String>,
}

pub fn run(g: &Global, a: Args) -> Result<ExitCode> {
    match a {
        Args::Index(a) => {
            let (repo, _lock) = open_locked(g, LockKind::Exclusive)?;
            let r = repair::repair_index(&repo, a.read_all_packs)?;
            for (file, why) in &r.failed {
                eprintln!("warning: {file} could not be indexed (left in place): {why}");
            }
            if g.json {
                outln!("{}", json::line(&json::IndexRepairSummary::new(&r)));
            } else if r.written == 0 && r.removed == 0 {
                outln!("the index is whole: {} packs, nothing to repair", r.kept);
            } else {
                outln!(
                    "index rebuilt: {} packs kept from good index files, {} read, {} missing packs left out, {} blobs that failed verification left out; {} index files written, {} removed",
                    r.kept, r.read, r.missing, r.bad_blobs, r.written, r.removed
                );
            }
            Ok(if r.failed.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Args::Snapshots(a) => {
            let kind = if a.forget && !a.dry_run { LockKind::Exclusive } else { LockKind::Shared };
            let (repo, _lock) = open_locked(g, kind)?;
            repo.load_index()?;
            let done = repair::repair_snapshots(&repo, &a.snapshots.filter(), a.forget, a.dry_run)?;
            let verb = if a.dry_run { "would repair" } else { "repaired" };
            for r in &done {
                if g.json {
                    outln!("{}", json::line(&json::SnapshotRepaired::new(r)));
                    continue;
                }
                let new = r.new.map_or_else(|| "(dry run)".to_string(), |id| id.short());
                outln!(
                    "{verb} {} -> {new}: {} files cut, {} dirs emptied",
                    r.old.short(),
                    r.cut.len(),
                    r.emptied.len()
                );
                for (p, before, after) in &r.cut {
                    outln!("    cut {p}: {before} -> {after} bytes");
                }
                for p in &r.emptied {
                    outln!("    emptied {p}: the directory could not be read");
                }
                if r.forgotten {
                    outln!("    removed the damaged original {}", r.old.short());
                }
            }
            if !g.json {
                outln!("{} snapshots {verb}", done.len());
            }
            Ok(ExitCode::SUCCESS)
        }
        Args::Unreadable(a) => {
            let (repo, _lock) = open_locked(g, LockKind::Exclusive)?;
            let r = repair::repair_unreadable(&repo, a.dry_run)?;
            let verb = if r.removed { "removed" } else { "would remove" };
            for (path, why) in &r.objects {
                if g.json {
                    outln!("{}", json::line(&json::UnreadableRemoved::new(path, why, r.removed)));
                } else {
                    outln!("{verb} {path}: {why}");
                }
            }
            if !g.json {
                outln!("{} objects that cannot be read {verb}", r.objects.len());
            }
            Ok(ExitCode::SUCCESS)
        }
        Args::Packs(a) => {
            let (repo, _lock) = open_locked(g, LockKind::Exclusive)?;
            repo.load_index()?;
            let ids = repair::find_packs(&repo, &a.ids)?;
            let r = repair::repair_packs(&repo, &ids)?;
            for (pack, blob) in &r.lost {
                outln!("lost blob {} of pack {}", blob.short(), pack.short());
            }
            if g.json {
                outln!("{}", json::line(&json::PackRepairSummary::new(&r)));
            } else {
                outln!(
                    "{} packs removed: {} blobs copied into new packs, {} already elsewhere, {} lost{}",
                    ids.len(),
                    r.salvaged,
                    r.elsewhere,
                    r.lost.len(),
                    if r.lost.is_empty() { "" } else { " (run `cairn repair snapshots`)" }
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
