//! `cairn unlock`: remove stale locks (or every lock).

use std::process::ExitCode;

use anyhow::Result;
use cairn_core::engine::lock;
use clap::Args as ClapArgs;

use super::{open, Global};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Also remove locks of processes that may still be running
    #[arg(long)]
    pub remove_all: bool,
}

pub fn run(g: &Global, a: Args) -> Result<ExitCode> {
    let repo = open(g)?;
    let removed = lock::remove(&**repo.storage(), a.remove_all)?;
    for (path, why) in &removed {
        outln!("removed {path}: {why}");
    }
    outln!("{} locks removed", removed.len());
    Ok(ExitCode::SUCCESS)
}
