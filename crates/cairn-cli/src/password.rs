//! Where the password comes from: `CAIRN_PASSWORD`, a password file, or a no-echo prompt.

use std::io::IsTerminal;
use std::path::Path;

use anyhow::{bail, Context, Result};

/// Reads the first line of a password file.
fn from_file(path: &Path) -> Result<Vec<u8>> {
    let text = std::fs::read(path).with_context(|| format!("cannot read password file {}", path.display()))?;
    let line = text.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        bail!("password file {} is empty", path.display());
    }
    Ok(line.to_vec())
}

/// The repository password. `confirm` asks twice at a prompt (for `init`).
pub fn get(file: Option<&Path>, env_var: &str, what: &str, confirm: bool) -> Result<Vec<u8>> {
    if let Some(p) = std::env::var_os(env_var) {
        if p.is_empty() {
            bail!("{env_var} is set but empty");
        }
        return Ok(p.into_encoded_bytes());
    }
    if let Some(f) = file {
        return from_file(f);
    }
    if !std::io::stdin().is_terminal() {
        bail!("no {what}: set {env_var}, give a password file, or run in a terminal to be asked");
    }
    let pw = rpassword::prompt_password(format!("enter {what}: ")).context("cannot read the password")?;
    if pw.is_empty() {
        bail!("an empty {what} is not allowed");
    }
    if confirm {
        let again = rpassword::prompt_password(format!("enter {what} again: ")).context("cannot read the password")?;
        if again != pw {
            bail!("the passwords do not match");
        }
    }
    Ok(pw.into_bytes())
}
