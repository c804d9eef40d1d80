//! `cairn key`: manage the key files that unlock the repository. Each wraps the same master
//! secret under its own password, so any one opens the repository.
//!
//! `remove` and `passwd` take the exclusive lock: they delete a key file, and no other command
//! should be opening the repository with it meanwhile. `add` only adds a file (shared lock).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use cairn_core::commands::json;
use cairn_core::engine::open::Held;
use cairn_format::keyfile::KdfParams;
use cairn_format::lock::LockKind;
use clap::{Args as ClapArgs, Subcommand};

use super::{open, open_locked, Global};
use crate::password;

#[derive(Subcommand, Debug)]
pub enum Args {
    /// Add a key file for a new password (from CAIRN_NEW_PASSWORD, --new-password-file or a prompt)
    Add(NewPassword),
    /// List key files; `*` marks the one in use (whose password opened the repository)
    List,
    /// Remove a key file (not the last one, nor the one in use)
    Remove {
        /// The key file's ID (a unique prefix)
        #[arg(value_name = "ID")]
        id: String,
    },
    /// Change the password: add a key file for a new password, then remove the one in use
    Passwd(NewPassword),
}

/// Where the new password comes from.
#[derive(ClapArgs, Debug)]
pub struct NewPassword {
    /// Read the new password from the first line of FILE
    #[arg(long, env = "CAIRN_NEW_PASSWORD_FILE", value_name = "FILE")]
    new_password_file: Option<PathBuf>,
}

impl NewPassword {
    fn get(&self) -> Result<Vec<u8>> {
        password::get(self.new_password_file.as_deref(), "CAIRN_NEW_PASSWORD", "new password", true)
    }
}

pub fn run(g: &Global, k: Args) -> Result<ExitCode> {
    // Adding a key is as safe beside other commands as a backup; removing one is not.
    let kind = match k {
        Args::List => None,
        Args::Add(_) => Some(LockKind::Shared),
        Args::Remove { .. } | Args::Passwd(_) => Some(LockKind::Exclusive),
    };
    let (mut repo, _lock) = match kind {
        Some(kind) => open_locked(g, kind)?,
        None => (open(g)?, Held::None),
    };
    match k {
        Args::Add(new) => {
            let id = repo.add_key(&new.get()?, KdfParams::default())?;
            outln!("added key {}", id.short());
        }
        Args::List => list(g, &repo)?,
        Args::Remove { id } => {
            let id = repo.remove_key_by_prefix(&id)?;
            outln!("removed key {}", id.short());
        }
        Args::Passwd(new) => {
            let pw = new.get()?;
            let old = repo.key_id();
            let id = repo.change_password(&pw, KdfParams::default())?;
            match old {
                Some(old) => outln!("changed the password: added key {}, removed key {}", id.short(), old.short()),
                None => outln!("added key {}", id.short()),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn list(g: &Global, repo: &cairn_core::engine::repository::Repository) -> Result<()> {
    let keys = repo.keys()?;
    if g.json {
        let list: Vec<_> =
            keys.iter().map(|(id, kf)| json::KeyEntry::new(id, kf, repo.key_id() == Some(*id))).collect();
        outln!("{}", json::line(&list));
        return Ok(());
    }
    outln!(" {:<10} {:<16} {:<20} created", "ID", "user", "host");
    for (id, kf) in &keys {
        let current = if repo.key_id() == Some(*id) { "*" } else { " " };
        outln!("{current}{:<10} {:<16} {:<20} {}", id.short(), kf.username, kf.hostname, kf.created);
    }
    Ok(())
}
