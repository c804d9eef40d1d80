//! Runs one job as a child process, `cairn --config FILE -p PROFILE --json COMMAND`: the same
//! options, hooks and limits as the command line, its memory returned when it ends, and a crash
//! of one job no crash of the agent. Its JSON status lines are the live progress; its output
//! is the run's log.

use std::path::Path;
use std::process::Stdio;

use anyhow::{Context, Result};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use crate::history::{Outcome, Run};
use crate::profiles::JobKind;

/// A running job's progress, as its status lines give it (a backup's; other jobs report none).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Progress {
    /// Files read so far, of the pre-scan's total.
    pub files_done: u64,
    /// Files the pre-scan counted.
    pub total_files: u64,
    /// Bytes read so far.
    pub bytes_done: u64,
    /// Bytes the pre-scan counted.
    pub total_bytes: u64,
    /// Seconds since the job started.
    pub seconds_elapsed: f64,
    /// The estimate of the time left.
    pub seconds_remaining: Option<f64>,
    /// The files being read now.
    pub current_files: Vec<String>,
}

impl Progress {
    /// Done, in percent of the bytes (0 until the pre-scan counted some).
    pub fn percent(&self) -> f64 {
        if self.total_bytes == 0 {
            0.0
        } else {
            (100.0 * self.bytes_done as f64 / self.total_bytes as f64).min(100.0)
        }
    }
}

/// What the job needs: the `cairn` binary and the configuration file.
pub struct Launcher {
    /// The `cairn` binary.
    pub exe: std::path::PathBuf,
    /// The configuration file the profiles are in.
    pub config: std::path::PathBuf,
}

/// Exit codes that say trying again will not help: bad arguments, no repository at the
/// location, wrong password.
const PERMANENT: [i32; 3] = [2, 10, 12];

/// Whether a failed run may succeed if tried again.
pub fn transient(run: &Run) -> bool {
    run.outcome == Outcome::Failed && !run.exit_code.is_some_and(|c| PERMANENT.contains(&c))
}

/// Runs `run`'s job to its end, writing its output to `log`; `on_start` gets the process ID,
/// `on_progress` each status. Fills in the run's outcome and numbers.
pub async fn run(
    cmd: &Launcher,
    run: &mut Run,
    log: &Path,
    on_start: impl FnOnce(u32),
    on_progress: impl Fn(Progress),
) -> Result<()> {
    let mut log = tokio::fs::File::create(log).await.with_context(|| format!("cannot write {}", log.display()))?;
    let mut child = Command::new(&cmd.exe);
    child
        .arg("--config")
        .arg(&cmd.config)
        .arg("-p")
        .arg(&run.profile)
        .arg("--json")
        .args(run.job.args())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(false);
    // SAFETY: prctl is async-signal-safe; it only sets a flag of the new process.
    unsafe {
        child.pre_exec(|| {
            // If the agent dies, the job stops as on Ctrl-C (the next run reuses what it stored).
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGINT);
            Ok(())
        });
    }
    let mut child = match child.spawn() {
        Ok(c) => c,
        Err(e) => {
            run.outcome = Outcome::Failed;
            run.message = format!("cannot start {}: {e}", cmd.exe.display());
            finish(run);
            return Ok(());
        }
    };
    on_start(child.id().unwrap_or(0));
    let mut out = BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut err = BufReader::new(child.stderr.take().expect("piped")).lines();
    let (mut out_open, mut err_open) = (true, true);
    let mut last_error = String::new();
    while out_open || err_open {
        tokio::select! {
            line = out.next_line(), if out_open => match line {
                Ok(Some(line)) => {
                    read_stdout(run, &line, &on_progress);
                    log.write_all(format!("{line}\n").as_bytes()).await?;
                }
                _ => out_open = false,
            },
            line = err.next_line(), if err_open => match line {
                Ok(Some(line)) => {
                    if !line.trim().is_empty() {
                        last_error = line.strip_prefix("cairn: ").unwrap_or(&line).to_string();
                    }
                    log.write_all(format!("{line}\n").as_bytes()).await?;
                }
                _ => err_open = false,
            },
        }
    }
    let status = child.wait().await.context("waiting for the job")?;
    log.flush().await?;
    run.exit_code = status.code();
    run.outcome = match status.code() {
        Some(0) => Outcome::Success,
        Some(3) => Outcome::Warning,
        Some(130) => Outcome::Interrupted,
        None if matches!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGINT | libc::SIGTERM)
        ) =>
        {
            Outcome::Interrupted
        }
        _ => Outcome::Failed,
    };
    if !run.outcome.ok() || run.job != JobKind::Backup {
        run.message = match (run.outcome, last_error.is_empty()) {
            (Outcome::Success, _) => "done".into(),
            (_, false) => last_error,
            (_, true) => format!("cairn {} {}", run.job.name(), exit_text(&status)),
        };
    }
    finish(run);
    Ok(())
}

fn finish(run: &mut Run) {
    run.ended = crate::scheduler::now().timestamp();
}

fn exit_text(status: &std::process::ExitStatus) -> String {
    match (status.code(), std::os::unix::process::ExitStatusExt::signal(status)) {
        (Some(c), _) => format!("exited with {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        _ => "ended".into(),
    }
}

/// One line of the job's standard output: a status (progress), a backup's summary, or other.
fn read_stdout(run: &mut Run, line: &str, on_progress: &impl Fn(Progress)) {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { return };
    let n = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
    match v.get("message_type").and_then(|m| m.as_str()) {
        Some("status") => on_progress(Progress {
            files_done: n("files_done"),
            total_files: n("total_files"),
            bytes_done: n("bytes_done"),
            total_bytes: n("total_bytes"),
            seconds_elapsed: v.get("seconds_elapsed").and_then(|x| x.as_f64()).unwrap_or(0.0),
            seconds_remaining: v.get("seconds_remaining").and_then(|x| x.as_f64()),
            current_files: v
                .get("current_files")
                .and_then(|x| x.as_array())
                .map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect())
                .unwrap_or_default(),
        }),
        Some("summary") if run.job == JobKind::Backup => {
            run.files = n("files_new") + n("files_changed") + n("files_unmodified");
            run.bytes_read = n("bytes_read");
            run.bytes_added = n("bytes_added");
            run.errors = n("errors");
            run.snapshot = v.get("snapshot_id").and_then(|s| s.as_str()).map(String::from);
            run.message = format!(
                "snapshot {} saved: {} files, {} read, {} added",
                run.snapshot.as_deref().map_or("-", |s| &s[..s.len().min(8)]),
                run.files,
                crate::ui::bytes(run.bytes_read),
                crate::ui::bytes(run.bytes_added)
            );
        }
        _ => {}
    }
}
