//! What the agent runs for each profile: its jobs' schedules and the options of its alerts and
//! retries, read from the `[profile.NAME.schedule]` section of the configuration file.
//!
//! ```toml
//! [profile.laptop.schedule]
//! backup = "daily 02:30"
//! forget = "sun 03:00"          # forget --prune, with the profile's [forget] keep rules
//! check = "mon..fri 04:00"      # check, with the profile's [check] options
//! random-delay = "10m"
//! retries = "3"                 # transient failures, each after a doubled delay
//! retry-delay = "1m"
//! alert-after = "26h"           # no successful backup for this long: alert
//! webhook = "https://hooks.example/cairn"
//! notify-command = "mail -s cairn admin@example.org"
//! ```
//!
//! A profile without a key in a `schedule` section is not the agent's (a base other profiles
//! inherit). A job without a schedule runs when asked to (`cairn agent run-now`, the web page).

use std::time::Duration;

use anyhow::{bail, Result};
use cairn_profile::{Config, Value};
use cairn_schedule::{parse_duration, Schedule};
use serde::{Deserialize, Serialize};

/// The section of a profile the agent reads.
pub const SECTION: &str = "schedule";

/// The keys of [`SECTION`] (each holds one value).
pub const KEYS: [&str; 9] =
    ["backup", "forget", "check", "random-delay", "retries", "retry-delay", "alert-after", "webhook", "notify-command"];

/// A kind of job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    /// `cairn backup` with the profile's paths and options.
    Backup,
    /// `cairn forget --prune` with the profile's keep rules.
    Forget,
    /// `cairn check` with the profile's check options.
    Check,
}

impl JobKind {
    /// Every kind, in the order pages list them.
    pub const ALL: [JobKind; 3] = [JobKind::Backup, JobKind::Forget, JobKind::Check];

    /// Its name in the configuration file, URLs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            JobKind::Backup => "backup",
            JobKind::Forget => "forget",
            JobKind::Check => "check",
        }
    }

    /// The `cairn` command line that runs it (after the global options).
    pub fn args(self) -> &'static [&'static str] {
        match self {
            JobKind::Backup => &["backup"],
            JobKind::Forget => &["forget", "--prune"],
            JobKind::Check => &["check"],
        }
    }

    /// The kind named `s`.
    pub fn parse(s: &str) -> Result<JobKind> {
        match JobKind::ALL.iter().find(|k| k.name() == s) {
            Some(k) => Ok(*k),
            None => bail!("{s:?} is not a job: use backup, forget or check"),
        }
    }
}

/// One profile's jobs and how they are run.
#[derive(Debug, Clone)]
pub struct Jobs {
    /// The profile's name.
    pub profile: String,
    /// Its repository's location: jobs of profiles with the same one wait for each other.
    pub repo: String,
    /// The jobs that run on a schedule.
    pub schedules: Vec<(JobKind, Schedule)>,
    /// Each scheduled run starts up to this much later (a random share of it).
    pub random_delay: Duration,
    /// How often a job that failed for a reason that may pass is tried again.
    pub retries: u32,
    /// The wait before the first retry; it doubles for each next one.
    pub retry_delay: Duration,
    /// Alert when the last successful backup is older than this.
    pub alert_after: Option<Duration>,
    /// POST a JSON body here on failure, recovery and a missing backup.
    pub webhook: Option<String>,
    /// Run this (`sh -c`) with the same body on standard input.
    pub notify_command: Option<String>,
}

impl Jobs {
    /// The schedule of `kind`, if it has one.
    pub fn schedule(&self, kind: JobKind) -> Option<&Schedule> {
        self.schedules.iter().find(|(k, _)| *k == kind).map(|(_, s)| s)
    }
}

/// The agent's profiles in `config`: each with a key in its `schedule` section, by name.
/// A bad value is an error naming its file, line and key.
pub fn from_config(config: &Config) -> Result<Vec<Jobs>> {
    let mut out = Vec::new();
    for name in config.names() {
        let p = config.profile(name)?;
        if p.section(SECTION).next().is_none() {
            continue;
        }
        let one = |key: &str| -> Option<(String, String)> {
            let s = p.get(SECTION, key)?;
            match &s.value {
                Value::One(v) => Some((v.clone(), s.origin.to_string())),
                other => Some((other.to_string(), s.origin.to_string())),
            }
        };
        let bad = |key: &str, origin: &str, why: &dyn std::fmt::Display| {
            anyhow::anyhow!("{origin}: profile.{name}.{SECTION}.{key}: {why}")
        };
        let mut schedules = Vec::new();
        for kind in JobKind::ALL {
            if let Some((text, origin)) = one(kind.name()) {
                let s = Schedule::parse(&text).map_err(|e| bad(kind.name(), &origin, &e))?;
                schedules.push((kind, s));
            }
        }
        let duration = |key: &str, default: Duration| -> Result<Duration> {
            match one(key) {
                Some((text, origin)) => parse_duration(&text).map_err(|e| bad(key, &origin, &e)),
                None => Ok(default),
            }
        };
        let retries = match one("retries") {
            Some((text, origin)) => text
                .parse::<u32>()
                .ok()
                .filter(|n| *n <= 20)
                .ok_or_else(|| bad("retries", &origin, &format!("{text:?} is not a count from 0 to 20")))?,
            None => 2,
        };
        let repo = match (p.get("", "repo"), p.get("", "repository-file")) {
            (Some(s), _) => s.value.to_string(),
            (None, Some(f)) => format!("file:{}", f.value),
            (None, None) => String::new(),
        };
        out.push(Jobs {
            profile: name.to_string(),
            repo: repo.trim_matches('"').to_string(),
            schedules,
            random_delay: duration("random-delay", Duration::ZERO)?,
            retries,
            retry_delay: duration("retry-delay", Duration::from_secs(60))?,
            alert_after: one("alert-after").map(|_| duration("alert-after", Duration::ZERO)).transpose()?,
            webhook: one("webhook").map(|(v, _)| v),
            notify_command: one("notify-command").map(|(v, _)| v),
        });
    }
    Ok(out)
}
