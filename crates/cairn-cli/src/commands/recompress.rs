//! `cairn recompress`: store data with another codec (e.g. lz4 for restores faster than the
//! link), through prune's repack and its safe deletion of the old packs.

use std::process::ExitCode;

use anyhow::Result;
use cairn_core::commands::prune::{Limit, PlanOptions, Recompress};
use cairn_format::lock::LockKind;
use clap::Args as ClapArgs;

use super::prune::{run_plan, RunArgs};
use super::{open_holding, parse_codec, Global, SnapshotArgs};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// The codec to store blobs with: none, lz4, zstd or zstd:LEVEL
    #[arg(long, value_name = "CODEC")]
    to: String,
    /// Also try to compress blobs stored uncompressed (by default they are left: most are
    /// stored so because they did not compress)
    #[arg(long)]
    include_uncompressed: bool,
    /// Only the blobs of the snapshots chosen by these filters [default: every snapshot]
    #[command(flatten)]
    snapshots: SnapshotArgs,
    #[command(flatten)]
    run: RunArgs,
}

pub fn run(g: &Global, a: Args) -> Result<ExitCode> {
    let to = parse_codec(&a.to)?;
    let (repo, lock) = open_holding(g, LockKind::Prune)?;
    let filter = a.snapshots.filter();
    let blobs = if filter.is_empty() {
        None
    } else {
        repo.load_index()?;
        let chosen = filter.select(&repo)?;
        Some(cairn_core::commands::prune::needed_blobs(&repo, &chosen)?)
    };
    let plan = PlanOptions {
        max_unused: Limit::Unlimited,
        recompress: Some(Recompress { to, blobs, include_uncompressed: a.include_uncompressed }),
        ..PlanOptions::default()
    };
    run_plan(g, &repo, &lock, plan, &a.run)
}
