//! Hooks: shell commands a front end runs around a command, as a profile sets them. `before`
//! hooks run first, in order; `after` hooks when the command succeeded, `failure` hooks when it
//! failed, then `finally` hooks either way. Each is run with `sh -c`, its standard input empty,
//! in a process group of its own, and is told the command and its outcome in environment
//! variables ([`Hooks::environment`]). What it prints (standard output and error) goes to the
//! front end's log line by line, never to cairn's standard output. A hook still running after
//! [`Hooks::timeout`] is killed, with every process it started, and counts as failed.
//!
//! A failing `before` hook stops the command ([`Error::Hook`], nothing is done) unless
//! [`Hooks::before_may_fail`]; a failing `after`, `failure` or `finally` hook is reported and
//! the others still run: the command's own outcome stands.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How long a hook may run when the profile sets no timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// How long output is still read after a hook has exited (from what it left running).
const DRAIN: Duration = Duration::from_secs(1);

/// When a hook runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Before the command; a failure stops it.
    Before,
    /// After the command succeeded.
    After,
    /// After the command failed.
    Failure,
    /// After the command, whatever its outcome.
    Finally,
}

impl Stage {
    /// Its name, as the profile's key and `CAIRN_HOOK` spell it.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Before => "before",
            Stage::After => "after",
            Stage::Failure => "failure",
            Stage::Finally => "finally",
        }
    }
}

/// The hooks of one command run.
#[derive(Clone, Debug)]
pub struct Hooks {
    /// Run before the command.
    pub before: Vec<String>,
    /// Run after it succeeded.
    pub after: Vec<String>,
    /// Run after it failed.
    pub failure: Vec<String>,
    /// Run after it, whatever the outcome (after `after` or `failure`).
    pub finally: Vec<String>,
    /// How long each hook may run before it is killed.
    pub timeout: Duration,
    /// A failing `before` hook is reported and the command runs anyway.
    pub before_may_fail: bool,
}

impl Default for Hooks {
    fn default() -> Self {
        Hooks {
            before: Vec::new(),
            after: Vec::new(),
            failure: Vec::new(),
            finally: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            before_may_fail: false,
        }
    }
}

/// What the hooks are told about the command: who runs it, and once it ended, how.
#[derive(Clone, Debug, Default)]
pub struct HookContext {
    /// The profile's name (`CAIRN_PROFILE`), if one is used.
    pub profile: Option<String>,
    /// The command (`CAIRN_COMMAND`: `backup`, `forget`, `repair index`).
    pub command: String,
}

/// How the command ended, for the `after`, `failure` and `finally` hooks.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Its exit code (`CAIRN_EXIT_CODE`).
    pub exit_code: u8,
    /// Its error, on one line (`CAIRN_ERROR`; empty on success).
    pub error: Option<String>,
    /// The snapshot it saved (`CAIRN_SNAPSHOT_ID`), if any.
    pub snapshot_id: Option<String>,
    /// The bytes it added to the repository (`CAIRN_BYTES_ADDED`), if it adds any.
    pub bytes_added: Option<u64>,
    /// How long it ran (`CAIRN_DURATION`, in seconds).
    pub duration: Duration,
}

impl Hooks {
    /// Whether there is no hook at all.
    pub fn is_empty(&self) -> bool {
        self.before.is_empty() && self.after.is_empty() && self.failure.is_empty() && self.finally.is_empty()
    }

    /// The environment variables a hook of `stage` is given: `CAIRN_HOOK`, `CAIRN_PROFILE`,
    /// `CAIRN_COMMAND`, and once the command ended `CAIRN_EXIT_CODE`, `CAIRN_ERROR`,
    /// `CAIRN_SNAPSHOT_ID`, `CAIRN_BYTES_ADDED`, `CAIRN_DURATION` (each empty when it does not
    /// apply).
    pub fn environment(stage: Stage, ctx: &HookContext, outcome: Option<&Outcome>) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("CAIRN_HOOK", stage.name().to_string()),
            ("CAIRN_PROFILE", ctx.profile.clone().unwrap_or_default()),
            ("CAIRN_COMMAND", ctx.command.clone()),
        ];
        if let Some(o) = outcome {
            env.extend([
                ("CAIRN_EXIT_CODE", o.exit_code.to_string()),
                ("CAIRN_ERROR", o.error.clone().unwrap_or_default()),
                ("CAIRN_SNAPSHOT_ID", o.snapshot_id.clone().unwrap_or_default()),
                ("CAIRN_BYTES_ADDED", o.bytes_added.map(|b| b.to_string()).unwrap_or_default()),
                ("CAIRN_DURATION", format!("{:.3}", o.duration.as_secs_f64())),
            ]);
        }
        env
    }

    /// Runs the `before` hooks in order. The first that fails is the error (the command must not
    /// run), unless [`Hooks::before_may_fail`]: then each failure goes to `log` and the rest run.
    pub fn run_before(&self, ctx: &HookContext, log: &dyn Fn(Stage, &str)) -> Result<()> {
        let env = Self::environment(Stage::Before, ctx, None);
        for cmd in &self.before {
            if let Err(e) = run_hook(Stage::Before, cmd, &env, self.timeout, log) {
                if !self.before_may_fail {
                    return Err(e);
                }
                log(Stage::Before, &format!("{e}; going on (before-failure = \"continue\")"));
            }
        }
        Ok(())
    }

    /// Runs the `after` hooks (if the command succeeded: exit code 0) or the `failure` hooks,
    /// then the `finally` hooks. Every hook runs; those that failed are returned (each was also
    /// told to `log`).
    pub fn run_after(&self, ctx: &HookContext, outcome: &Outcome, log: &dyn Fn(Stage, &str)) -> Vec<Error> {
        let first = if outcome.exit_code == 0 { Stage::After } else { Stage::Failure };
        let mut failed = Vec::new();
        for (stage, cmds) in [(first, self.of(first)), (Stage::Finally, &self.finally)] {
            let env = Self::environment(stage, ctx, Some(outcome));
            for cmd in cmds {
                if let Err(e) = run_hook(stage, cmd, &env, self.timeout, log) {
                    log(stage, &e.to_string());
                    failed.push(e);
                }
            }
        }
        failed
    }

    fn of(&self, stage: Stage) -> &Vec<String> {
        match stage {
            Stage::Before => &self.before,
            Stage::After => &self.after,
            Stage::Failure => &self.failure,
            Stage::Finally => &self.finally,
        }
    }
}

/// Runs one hook: `sh -c CMD` with `env` added, its output lines to `log`, killed (its whole
/// process group) after `timeout`.
fn run_hook(
    stage: Stage,
    cmd: &str,
    env: &[(&str, String)],
    timeout: Duration,
    log: &dyn Fn(Stage, &str),
) -> Result<()> {
    let fail = |how: String| Error::Hook { stage: stage.name(), command: cmd.to_string(), how };
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| fail(format!("could not be started ({e})")))?;
    let (tx, lines) = mpsc::channel::<String>();
    // The readers end when the pipes close: when the hook and whatever it started have exited
    // or been killed with its process group.
    if let Some(o) = child.stdout.take() {
        forward_lines(o, tx.clone());
    }
    if let Some(e) = child.stderr.take() {
        forward_lines(e, tx);
    }
    let deadline = Instant::now() + timeout;
    let mut status: Option<ExitStatus> = None;
    // Once the hook has exited, what it left running in the background (a daemon it started)
    // may hold its pipes: their output is read for a moment more, not waited for.
    let mut drain_until = deadline;
    let mut open = true;
    let status = loop {
        if status.is_none() {
            status = child.try_wait().map_err(|e| fail(format!("could not be waited for ({e})")))?;
            if status.is_some() {
                drain_until = deadline.min(Instant::now() + DRAIN);
            }
        }
        let now = Instant::now();
        match status {
            Some(s) if !open || now >= drain_until => break s,
            None if now >= deadline => {
                kill_group(&mut child);
                while let Ok(line) = lines.try_recv() {
                    log(stage, &line);
                }
                return Err(fail(format!("was stopped after its timeout of {}", seconds(timeout))));
            }
            _ => {}
        }
        let wait = drain_until.min(deadline).saturating_duration_since(now).min(Duration::from_millis(20));
        if !open {
            std::thread::sleep(wait);
            continue;
        }
        match lines.recv_timeout(wait) {
            Ok(line) => log(stage, &line),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => open = false,
        }
    };
    if status.success() {
        Ok(())
    } else {
        Err(fail(describe(&status)))
    }
}

/// Sends each line `from` yields to `to`, on a thread of its own.
fn forward_lines(from: impl Read + Send + 'static, to: mpsc::Sender<String>) {
    std::thread::spawn(move || {
        for line in BufReader::new(from).split(b'\n') {
            let Ok(line) = line else { break };
            if to.send(String::from_utf8_lossy(&line).trim_end_matches('\r').to_string()).is_err() {
                break;
            }
        }
    });
}

/// Kills the hook and every process in its group, and reaps it.
fn kill_group(child: &mut std::process::Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: sends a signal to the process group the hook leads (made by `process_group(0)`).
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
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

/// `1.5s`, `300s`.
fn seconds(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[allow(clippy::type_complexity)] // a test helper: the log and the function that fills it
    fn logged() -> (Mutex<Vec<String>>, impl Fn(&Mutex<Vec<String>>, Stage, &str)) {
        (Mutex::new(Vec::new()), |m: &Mutex<Vec<String>>, s: Stage, l: &str| {
            m.lock().unwrap().push(format!("{}: {l}", s.name()))
        })
    }

    #[test]
    fn output_goes_to_the_log_and_a_failing_before_hook_stops() {
        let (lines, push) = logged();
        let log = |s: Stage, l: &str| push(&lines, s, l);
        let ctx = HookContext { profile: Some("nas".into()), command: "backup".into() };
        let hooks = Hooks {
            before: vec![
                "echo out $CAIRN_PROFILE $CAIRN_COMMAND; echo err >&2".into(),
                "exit 3".into(),
                "echo never".into(),
            ],
            ..Hooks::default()
        };
        let e = hooks.run_before(&ctx, &log).unwrap_err().to_string();
        assert_eq!(e, "the before hook `exit 3` exited with status 3");
        let mut got = lines.lock().unwrap().clone();
        got.sort();
        assert_eq!(got, ["before: err", "before: out nas backup"]);

        let go_on = Hooks { before_may_fail: true, ..hooks };
        lines.lock().unwrap().clear();
        go_on.run_before(&ctx, &log).unwrap();
        assert!(lines.lock().unwrap().iter().any(|l| l == "before: never"), "{:?}", lines.lock().unwrap());
    }

    #[test]
    fn after_or_failure_then_finally_with_the_outcome() {
        let (lines, push) = logged();
        let log = |s: Stage, l: &str| push(&lines, s, l);
        let hooks = Hooks {
            after: vec!["echo ok $CAIRN_SNAPSHOT_ID $CAIRN_BYTES_ADDED".into()],
            failure: vec!["echo failed $CAIRN_EXIT_CODE \"$CAIRN_ERROR\"".into()],
            finally: vec!["exit 1".into(), "echo finally $CAIRN_HOOK $CAIRN_DURATION".into()],
            ..Hooks::default()
        };
        let ctx = HookContext { profile: None, command: "backup".into() };
        let ok = Outcome {
            snapshot_id: Some("ab12".into()),
            bytes_added: Some(42),
            duration: Duration::from_millis(1500),
            ..Outcome::default()
        };
        let failed = hooks.run_after(&ctx, &ok, &log);
        assert_eq!(failed.len(), 1);
        assert_eq!(
            *lines.lock().unwrap(),
            [
                "after: ok ab12 42",
                "finally: the finally hook `exit 1` exited with status 1",
                "finally: finally finally 1.500"
            ]
        );
        lines.lock().unwrap().clear();
        let bad = Outcome { exit_code: 12, error: Some("wrong password".into()), ..Outcome::default() };
        hooks.run_after(&ctx, &bad, &log);
        assert_eq!(lines.lock().unwrap()[0], "failure: failed 12 wrong password");
    }

    #[test]
    fn a_hook_that_hangs_is_killed_with_what_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("late");
        let hooks = Hooks {
            before: vec![format!("(sleep 2; touch {}) & sleep 30", marker.display())],
            timeout: Duration::from_millis(300),
            ..Hooks::default()
        };
        let start = Instant::now();
        let e = hooks.run_before(&HookContext::default(), &|_, _| {}).unwrap_err().to_string();
        assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
        assert!(e.ends_with("was stopped after its timeout of 0.3s"), "{e}");
        std::thread::sleep(Duration::from_millis(2500));
        assert!(!marker.exists(), "a process the hook started outlived it");
    }
}
