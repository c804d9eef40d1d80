//! A command's standard output as the source (`backup --stdin-from-command -- pg_dump db`): one
//! stream becomes one file named NAME at the top of the snapshot, and the snapshot is saved only
//! when the command exits 0. A non-zero exit or a signal is an [`Error::SourceCommand`] naming
//! the command, how it ended and the end of its standard error; whatever data was already
//! stored is left for prune, as a killed backup's is. Its standard error is passed on to cairn's
//! as it comes, whether it fails or not.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::stdin::backup_stream;
use super::{BackupOptions, BackupOutcome, Progress};
use crate::engine::repository::Repository;
use crate::error::{Error, Result};

/// How much of the command's standard error is kept for the error message.
const STDERR_TAIL: usize = 4096;
/// How many of its last lines the message shows.
const STDERR_LINES: usize = 3;

/// Environment variables holding cairn's passwords: the command does not inherit them.
const SECRET_ENV: [&str; 4] = ["CAIRN_PASSWORD", "CAIRN_NEW_PASSWORD", "CAIRN_FROM_PASSWORD", "CAIRN_PASSWORD_COMMAND"];

/// Runs `argv` (no shell) and backs up its standard output as the file `/NAME`.
pub fn backup_command(
    repo: &Repository,
    argv: &[OsString],
    name: &str,
    opts: &BackupOptions,
    progress: &Progress,
) -> Result<BackupOutcome> {
    let shown = argv.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ");
    let Some((program, args)) = argv.split_first() else {
        return Err(Error::Usage("no command given to back up the output of".into()));
    };
    let fail = |status: String, stderr: String| Error::SourceCommand { command: shown.clone(), status, stderr };
    let mut cmd = Command::new(program);
    cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for var in SECRET_ENV {
        cmd.env_remove(var);
    }
    let mut child = cmd.spawn().map_err(|e| fail(format!("could not be started ({e})"), String::new()))?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    // Its standard error goes on to cairn's as it comes (a warning of `pg_dump` reaches the
    // log whether or not the command fails), and its end is kept for the error message (a
    // grandchild may hold the pipe open after the command has exited: the message then shows
    // what had come by then).
    let kept = Arc::new(Mutex::new(Vec::new()));
    let reader = {
        let kept = Arc::clone(&kept);
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let _ = std::io::stderr().write_all(&buf[..n]);
                let mut k = kept.lock().expect("stderr tail");
                k.extend_from_slice(&buf[..n]);
                if k.len() > 2 * STDERR_TAIL {
                    let cut = k.len() - STDERR_TAIL;
                    k.drain(..cut);
                }
            }
        })
    };
    let mut guard = KillOnDrop(Some(child));
    let what = format!("the output of `{shown}`");
    let out = backup_stream(repo, stdout, &what, name, opts, progress, || {
        let status = guard.wait().map_err(|e| fail(format!("could not be waited for ({e})"), String::new()))?;
        // What it wrote last is passed on (and kept) before cairn goes on, whether it failed
        // or not: a warning printed just before a successful exit was lost when cairn exited
        // first. A grandchild holding the pipe is waited for a second at most.
        let deadline = Instant::now() + Duration::from_secs(1);
        while !reader.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if status.success() {
            return Ok(());
        }
        let tail = stderr_tail(&kept.lock().expect("stderr tail"));
        Err(fail(describe(&status), tail))
    });
    // On an error before the command ended (storage, memory): stop it.
    drop(guard);
    out
}

/// `exited with status N` or `was killed by signal N`.
fn describe(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        _ => format!("ended: {status}"),
    }
}

/// The last lines of the command's standard error, for the message.
fn stderr_tail(kept: &[u8]) -> String {
    let text = String::from_utf8_lossy(kept);
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    if lines.is_empty() {
        return String::new();
    }
    let last = &lines[lines.len().saturating_sub(STDERR_LINES)..];
    format!("; its standard error ended with: {}", last.join(" / "))
}

/// The child, killed and reaped if the backup ends before it does.
struct KillOnDrop(Option<Child>);

impl KillOnDrop {
    fn wait(&mut self) -> std::io::Result<ExitStatus> {
        let mut child = self.0.take().expect("waited once");
        child.wait()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
