//! `cairn key`: manage the key files that unlock the repository.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use cairn_core::keyfile::KdfParams;
use clap::Subcommand;

use super::{open, Global};
use crate::password;

#[derive(Subcommand, Debug)]
pub enum Args {
    /// Add a key file for a new password (from CAIRN_NEW_PASSWORD, --new-password-file or a prompt)
    Add {
        /// Read the new password from the first line of FILE
        #[arg(long, env = "CAIRN_NEW_PASSWORD_FILE", value_name = "FILE")]
        new_password_file: Option<PathBuf>,
    },
    /// List key files
    List,
}

pub fn run(g: &Global, k: Args) -> Result<ExitCode> {
    let repo = open(g)?;
    match k {
        Args::Add { new_password_file } => {
            let pw = password::get(new_password_file.as_deref(), "CAIRN_NEW_PASSWORD", "new password", true)?;
            let id = repo.add_key(&pw, KdfParams::default())?;
            outln!("added key {}", id.short());
        }
        Args::List => {
            for (id, kf) in repo.keys()? {
                let current = if repo.key_id() == Some(id) { "*" } else { " " };
                outln!("{current}{}  {}  {}@{}", id.short(), kf.created, kf.username, kf.hostname);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
