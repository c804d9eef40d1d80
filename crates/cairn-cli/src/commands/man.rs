//! `cairn man [DIR]`: manual pages generated from the command line definition
//! (`clap_mangen`): `cairn.1` on stdout, or with DIR `cairn.1` and one page per command
//! (`cairn-backup.1`, …) written there.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args as ClapArgs, CommandFactory};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Write cairn.1 and a page per command (cairn-COMMAND.1) into this directory (created if
    /// missing) instead of printing cairn.1
    #[arg(value_name = "DIR")]
    dir: Option<PathBuf>,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let cmd = crate::cli::Cli::command();
    let Some(dir) = a.dir else {
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut page).context("cannot render the manual page")?;
        outln!("{}", String::from_utf8_lossy(&page).trim_end());
        return Ok(ExitCode::SUCCESS);
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    clap_mangen::generate_to(cmd, &dir).with_context(|| format!("cannot write manual pages into {}", dir.display()))?;
    outln!("wrote manual pages into {}", dir.display());
    Ok(ExitCode::SUCCESS)
}
