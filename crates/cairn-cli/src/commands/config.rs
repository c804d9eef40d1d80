//! `cairn config show`: the effective settings and where each came from.

use std::process::ExitCode;

use anyhow::Result;
use clap::Subcommand;

use super::Global;
use crate::profile;

#[derive(Subcommand, Debug)]
pub enum Args {
    /// Print the effective settings of the profile (-p NAME) and the command line, each with
    /// where it came from: FILE:LINE, environment VAR, flag or default; secrets masked
    Show,
}

pub fn run(_g: &Global, a: Args) -> Result<ExitCode> {
    match a {
        Args::Show => show(),
    }
}

fn show() -> Result<ExitCode> {
    let l = profile::loaded();
    match (&l.file, &l.profile) {
        (Some(f), Some(p)) => {
            outln!("# profile {} from {} (inherits: {})", p.name, f.display(), p.chain[1..].join(" -> "))
        }
        (Some(f), None) => outln!("# configuration file {} (no profile chosen)", f.display()),
        (None, _) => outln!("# no configuration file"),
    }
    let width = l.shown.iter().map(|s| s.key.len() + s.value.len() + 3).max().unwrap_or(0);
    for s in &l.shown {
        let kv = format!("{} = {}", s.key, s.value);
        outln!("{kv:width$}  # {}", s.source);
    }
    outln!("# password: {}", password_source());
    Ok(ExitCode::SUCCESS)
}

/// Where the repository password will come from, first match wins.
fn password_source() -> String {
    let l = profile::loaded();
    let find = |key: &str| l.shown.iter().find(|s| s.key == key);
    if std::env::var_os("CAIRN_PASSWORD").is_some() {
        return "environment CAIRN_PASSWORD".into();
    }
    for key in ["password-command", "password-file", "password"] {
        if let Some(s) = find(key) {
            return format!("{key} ({})", s.source);
        }
    }
    "asked on the terminal".into()
}
