//! Repository objects that cannot be read (damaged, foreign, undecryptable, truncated, of a
//! version this build does not know): a command that can do its work without one skips it and
//! says so once, naming the object (FORMAT.md §18 lists what each reader skips).
//!
//! One object a host may legally store, or one flipped bit in one index file, must not stop
//! every host's restores: only the commands that cannot do without an object (a prune, which
//! must know everything the repository needs) refuse because of it.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

/// Where warnings go: set once by the program (the CLI prints them on stderr); without one they
/// are tracing events.
type Handler = Box<dyn Fn(&str) + Send + Sync>;

static HANDLER: OnceLock<Handler> = OnceLock::new();

/// The objects already warned of in this process, by repository and path.
static SAID: Mutex<Option<HashSet<(String, String)>>> = Mutex::new(None);

/// Sends every warning of this module to `handler` from now on (the first call wins).
pub fn set_handler(handler: impl Fn(&str) + Send + Sync + 'static) {
    let _ = HANDLER.set(Box::new(handler));
}

/// Says once per process that `path` of the repository at `repo` cannot be read (`why`) and
/// was skipped; `then` says what the command does without it.
pub fn skipped(repo: &str, path: &str, why: &dyn std::fmt::Display, then: &str) {
    if !first_time(repo, path) {
        return;
    }
    // Most errors name the object first already: it is said once.
    let why = why.to_string();
    let why = why.strip_prefix(path).map_or_else(|| format!("cannot be read ({why})"), |w| w.trim_start().to_string());
    warn(&format!(
        "{path} {why}; skipped: {then} (`cairn check` names every such object; an admin removes it with `cairn \
         repair index` for index files, `cairn repair unreadable` for the others)"
    ));
}

/// Says `text` once per process for the key (`repo`, `what`).
pub fn once(repo: &str, what: &str, text: &str) {
    if first_time(repo, what) {
        warn(text);
    }
}

fn first_time(repo: &str, what: &str) -> bool {
    let mut said = SAID.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    said.get_or_insert_with(HashSet::new).insert((repo.to_string(), what.to_string()))
}

fn warn(text: &str) {
    match HANDLER.get() {
        Some(h) => h(text),
        None => tracing::warn!("{text}"),
    }
}
