//! `cairn repair index|snapshots|packs`: bring a damaged repository back to a state `cairn
//! check` finds whole.

use std::process::ExitCode;

use anyhow::{bail, Result};
use cairn_core::commands::repair;
use cairn_format::id::PackId;
use cairn_format::lock::LockKind;
use clap::{Args as ClapArgs, Subcommand};

use super::{lock, open, Global, SnapshotArgs};

#[derive(Subcommand, Debug)]
pub enum Args {
    /// Rebuild the index from the pack headers (after index files were lost or damaged)
    Index(IndexArgs),
    /// Write new snapshots whose files that need missing data are cut to what can be read
    Snapshots(SnapshotsArgs),
    /// Copy the readable blobs of damaged packs into new packs, then remove the packs
    Packs(PacksArgs),
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
    let repo = open(g)?;
    let threads = repo.storage().default_concurrency().max(8);
    match a {
        Args::Index(a) => {
            let _lock = lock(&repo, LockKind::Exclusive)?;
            let r = repair::repair_index(&repo, a.read_all_packs, threads)?;
            for (file, why) in &r.failed {
                eprintln!("warning: {file} could not be indexed (left in place): {why}");
            }
            if g.json {
                outln!(
                    "{}",
                    serde_json::json!({"message_type": "summary", "kept": r.kept, "read": r.read, "missing": r.missing,
                        "bad_blobs": r.bad_blobs, "failed": r.failed.len(), "written": r.written, "removed": r.removed})
                );
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
            let _lock = lock(&repo, kind)?;
            repo.load_index()?;
            let done = repair::repair_snapshots(&repo, &a.snapshots.filter(), a.forget, a.dry_run)?;
            let verb = if a.dry_run { "would repair" } else { "repaired" };
            for r in &done {
                let new = r.new.map_or_else(|| "(dry run)".to_string(), |id| id.short());
                if g.json {
                    outln!(
                        "{}",
                        serde_json::json!({"message_type": "repaired", "old": r.old.to_hex(), "new": r.new.map(|i| i.to_hex()),
                            "cut": r.cut.iter().map(|(p, a, b)| serde_json::json!({"path": p, "size": a, "new_size": b})).collect::<Vec<_>>(),
                            "emptied": r.emptied, "forgotten": r.forgotten})
                    );
                    continue;
                }
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
        Args::Packs(a) => {
            let _lock = lock(&repo, LockKind::Exclusive)?;
            repo.load_index()?;
            let listed: Vec<PackId> = repo.list_packs()?.into_keys().collect();
            let mut ids = Vec::new();
            for spec in &a.ids {
                let spec = spec.to_ascii_lowercase();
                let found: Vec<&PackId> = listed.iter().filter(|id| id.to_hex().starts_with(&spec)).collect();
                match found.as_slice() {
                    [one] => ids.push(**one),
                    [] => bail!("no pack matches {spec:?}"),
                    _ => bail!("{spec:?} matches several packs; give more of the ID"),
                }
            }
            let r = repair::repair_packs(&repo, &ids)?;
            for (pack, blob) in &r.lost {
                outln!("lost blob {} of pack {}", blob.short(), pack.short());
            }
            if g.json {
                outln!(
                    "{}",
                    serde_json::json!({"message_type": "summary", "salvaged": r.salvaged, "elsewhere": r.elsewhere,
                        "lost": r.lost.len(), "reindexed": r.reindexed})
                );
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
