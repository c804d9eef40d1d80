//! `cairn completions SHELL`: the shell completion script, generated from the command line
//! definition (`clap_complete`), printed to stdout.

use std::process::ExitCode;

use anyhow::Result;
use clap::{Args as ClapArgs, CommandFactory};
use clap_complete::Shell;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// The shell: bash, zsh, fish, elvish or powershell
    #[arg(value_name = "SHELL")]
    shell: Shell,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let mut cmd = crate::cli::Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "cairn", &mut script);
    outln!("{}", String::from_utf8_lossy(&script).trim_end());
    Ok(ExitCode::SUCCESS)
}
