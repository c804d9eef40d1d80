//! Where the password comes from: `CAIRN_PASSWORD`, a password command, a password file, the
//! profile's `password`, or a no-echo prompt.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};

/// Reads the first line of a password file.
pub fn from_file(path: &Path) -> Result<Vec<u8>> {
    let text = std::fs::read(path).with_context(|| format!("cannot read password file {}", path.display()))?;
    let line = text.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        bail!("password file {} is empty", path.display());
    }
    Ok(line.to_vec())
}

/// `--password-command`, for the repository password (`CAIRN_PASSWORD`'s).
static COMMAND: OnceLock<String> = OnceLock::new();

/// Before a command runs: records `--password-command`, and reads `--repository-file` into
/// `repo` when no `-r`/`CAIRN_REPOSITORY` gave one.
pub fn resolve(g: &mut crate::cli::Global) -> Result<()> {
    if let Some(cmd) = &g.password_command {
        let _ = COMMAND.set(cmd.clone());
    }
    if g.repo.is_none() {
        if let Some(f) = &g.repository_file {
            let text =
                std::fs::read_to_string(f).with_context(|| format!("cannot read repository file {}", f.display()))?;
            let line = text.lines().next().unwrap_or("").trim();
            if line.is_empty() {
                bail!("repository file {} is empty", f.display());
            }
            g.repo = Some(line.to_string());
        }
    }
    Ok(())
}

/// Runs a password command (`sh -c CMD`, standard error and input left to the user, so it may
/// ask); its first output line is the password.
pub fn from_command(cmd: &str) -> Result<Vec<u8>> {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run password command `{cmd}`"))?;
    if !out.status.success() {
        bail!("password command `{cmd}` failed ({})", crate::output::exit_status(&out.status));
    }
    let line = out.stdout.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        bail!("password command `{cmd}` printed no password");
    }
    Ok(line.to_vec())
}

/// The repository password. `confirm` asks twice at a prompt (for `init`).
pub fn get(file: Option<&Path>, env_var: &str, what: &str, confirm: bool) -> Result<Vec<u8>> {
    given(file, env_var).unwrap_or_else(|| ask(env_var, what, confirm))
}

/// The password `env_var`, a password command (for the repository password), `file` or the
/// profile give, or why it cannot be had from them; `None` when none of them gives one (it is
/// then asked for: [`ask`]).
pub fn given(file: Option<&Path>, env_var: &str) -> Option<Result<Vec<u8>>> {
    if let Some(p) = std::env::var_os(env_var) {
        if p.is_empty() {
            return Some(Err(anyhow::anyhow!("{env_var} is set but empty")));
        }
        return Some(Ok(p.into_encoded_bytes()));
    }
    let main = env_var == "CAIRN_PASSWORD";
    if let Some(cmd) = COMMAND.get().filter(|_| main) {
        return Some(from_command(cmd));
    }
    if let Some(f) = file {
        return Some(from_file(f));
    }
    crate::profile::literal_password().filter(|_| main).map(Ok)
}

/// Asks for the password `env_var` would give at a no-echo prompt (twice with `confirm`); an
/// error saying where a password may come from when there is no terminal to ask at.
pub fn ask(env_var: &str, what: &str, confirm: bool) -> Result<Vec<u8>> {
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
