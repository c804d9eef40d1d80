//! The profile's hooks around the command being run (the library runs them:
//! `cairn_core::engine::hooks`): which hooks, what they are told, and their output on stderr.

use std::sync::Mutex;
use std::time::Instant;

use cairn_core::engine::hooks::{HookContext, Hooks, Outcome, Stage, DEFAULT_TIMEOUT};

/// Commands that run no hooks (they neither read nor write a repository).
const WITHOUT_HOOKS: [&str; 4] = ["config", "completions", "man", "help"];

/// What the command reports for the hooks that run after it: the snapshot it saved and the
/// bytes it added.
static REPORTED: Mutex<(Option<String>, Option<u64>)> = Mutex::new((None, None));

/// Tells the `after`, `failure` and `finally` hooks of the snapshot a backup saved.
pub(crate) fn report_snapshot(id: Option<String>, bytes_added: u64) {
    *REPORTED.lock().expect("hook report") = (id, Some(bytes_added));
}

/// The hooks of this run, if the profile sets any.
pub(crate) struct Run {
    hooks: Hooks,
    ctx: HookContext,
    started: Instant,
}

impl Run {
    /// The hooks the profile sets for the command being run (none without a profile).
    pub(crate) fn for_command() -> Option<Run> {
        let loaded = crate::profile::loaded();
        let profile = loaded.profile.as_ref()?;
        let command = loaded.command.first()?;
        if WITHOUT_HOOKS.contains(&command.as_str()) {
            return None;
        }
        let set = profile.hooks(command);
        if set.is_empty() {
            return None;
        }
        let hooks = Hooks {
            before: set.before,
            after: set.after,
            failure: set.failure,
            finally: set.finally,
            timeout: set.timeout.unwrap_or(DEFAULT_TIMEOUT),
            before_may_fail: set.before_may_fail,
        };
        let ctx = HookContext { profile: Some(profile.name.clone()), command: loaded.command.join(" ") };
        Some(Run { hooks, ctx, started: Instant::now() })
    }

    /// Runs the `before` hooks: an error means the command must not run.
    pub(crate) fn before(&self) -> cairn_core::Result<()> {
        self.hooks.run_before(&self.ctx, &log)
    }

    /// Runs the hooks after the command, which ended with `exit_code` and `error`.
    pub(crate) fn after(&self, exit_code: u8, error: Option<String>) {
        let (snapshot_id, bytes_added) = REPORTED.lock().expect("hook report").clone();
        let outcome = Outcome { exit_code, error, snapshot_id, bytes_added, duration: self.started.elapsed() };
        self.hooks.run_after(&self.ctx, &outcome, &log);
    }
}

/// A hook's output line (or its failure), on stderr: the log of a command run from a timer.
fn log(stage: Stage, line: &str) {
    eprintln!("cairn: {} hook: {line}", stage.name());
}
