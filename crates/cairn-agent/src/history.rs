//! The history of runs, on disk in the state directory: `history.jsonl`, one JSON line per
//! finished run, appended; `running/ID.json` while a run is in progress (a run whose agent was
//! killed is found there on the next start and recorded as interrupted); `logs/ID.log`, each
//! run's output.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::profiles::JobKind;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Exit 0.
    Success,
    /// Done, but some files could not be read (exit 3).
    Warning,
    /// Any other exit.
    Failed,
    /// Stopped by the agent's stop (or the agent died during it).
    Interrupted,
}

impl Outcome {
    /// The name pages and metrics use.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Warning => "warning",
            Outcome::Failed => "failed",
            Outcome::Interrupted => "interrupted",
        }
    }

    /// Whether the job did what it was for (a backup with unreadable files did: it stored a
    /// snapshot).
    pub fn ok(self) -> bool {
        matches!(self, Outcome::Success | Outcome::Warning)
    }
}

/// One run of a job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Run {
    /// Numbered from 1, never reused.
    pub id: u64,
    /// The profile.
    pub profile: String,
    /// The job.
    pub job: JobKind,
    /// Why it ran: `schedule`, `catch-up`, `run-now`, `retry 1`, …
    pub reason: String,
    /// Start and end, Unix seconds.
    pub started: i64,
    /// End (equal to `started` while it runs).
    pub ended: i64,
    /// How it ended.
    pub outcome: Outcome,
    /// The `cairn` process's exit code (none: killed by a signal, or not started).
    pub exit_code: Option<i32>,
    /// What went wrong (the last error line), or a short summary.
    pub message: String,
    /// A backup's files (new, changed and unmodified), bytes read and added, unreadable entries.
    #[serde(default)]
    pub files: u64,
    /// Bytes read from the files.
    #[serde(default)]
    pub bytes_read: u64,
    /// Bytes added to the repository.
    #[serde(default)]
    pub bytes_added: u64,
    /// Entries that could not be read.
    #[serde(default)]
    pub errors: u64,
    /// The snapshot a backup saved.
    #[serde(default)]
    pub snapshot: Option<String>,
}

impl Run {
    /// Its duration in seconds.
    pub fn seconds(&self) -> i64 {
        (self.ended - self.started).max(0)
    }
}

/// The runs so far, and where they are kept.
pub struct History {
    dir: PathBuf,
    runs: Vec<Run>,
    next_id: u64,
}

/// Runs kept in memory (the file keeps every one).
const KEPT: usize = 5000;

impl History {
    /// Reads the history in `dir` (made if missing), recording runs a killed agent left
    /// unfinished as interrupted.
    pub fn open(dir: &Path) -> Result<History> {
        for sub in ["logs", "running"] {
            fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("cannot make the agent's state directory {}", dir.join(sub).display()))?;
        }
        let mut runs = Vec::new();
        let path = dir.join("history.jsonl");
        if let Ok(f) = File::open(&path) {
            for line in BufReader::new(f).lines() {
                let line = line.with_context(|| format!("cannot read {}", path.display()))?;
                // A line cut short by a crash is skipped.
                if let Ok(run) = serde_json::from_str::<Run>(&line) {
                    runs.push(run);
                }
            }
        }
        let next_id = runs.iter().map(|r| r.id).max().unwrap_or(0) + 1;
        let mut h = History { dir: dir.to_path_buf(), runs, next_id };
        h.trim();
        for entry in fs::read_dir(dir.join("running"))? {
            let p = entry?.path();
            if let Some(mut run) = fs::read(&p).ok().and_then(|b| serde_json::from_slice::<Run>(&b).ok()) {
                run.outcome = Outcome::Interrupted;
                run.ended = fs::metadata(h.log_path(run.id))
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(run.started, |d| d.as_secs() as i64);
                run.message = "the agent stopped during this run".into();
                h.next_id = h.next_id.max(run.id + 1);
                h.finish(run)?;
            }
            let _ = fs::remove_file(&p);
        }
        Ok(h)
    }

    fn trim(&mut self) {
        if self.runs.len() > KEPT {
            self.runs.drain(..self.runs.len() - KEPT);
        }
    }

    /// A new run of `job`, marked as running on disk.
    pub fn start(&mut self, profile: &str, job: JobKind, reason: &str) -> Result<Run> {
        let now = crate::scheduler::now().timestamp();
        let run = Run {
            id: self.next_id,
            profile: profile.to_string(),
            job,
            reason: reason.to_string(),
            started: now,
            ended: now,
            outcome: Outcome::Interrupted,
            exit_code: None,
            message: String::new(),
            files: 0,
            bytes_read: 0,
            bytes_added: 0,
            errors: 0,
            snapshot: None,
        };
        self.next_id += 1;
        let marker = self.dir.join("running").join(format!("{}.json", run.id));
        fs::write(&marker, serde_json::to_vec(&run)?).with_context(|| format!("cannot write {}", marker.display()))?;
        Ok(run)
    }

    /// Records a finished run.
    pub fn finish(&mut self, run: Run) -> Result<()> {
        let path = self.dir.join("history.jsonl");
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        let mut line = serde_json::to_vec(&run)?;
        line.push(b'\n');
        f.write_all(&line).with_context(|| format!("cannot write {}", path.display()))?;
        let _ = fs::remove_file(self.dir.join("running").join(format!("{}.json", run.id)));
        self.runs.push(run);
        self.trim();
        Ok(())
    }

    /// Where run `id`'s output is kept.
    pub fn log_path(&self, id: u64) -> PathBuf {
        self.dir.join("logs").join(format!("{id}.log"))
    }

    /// Every run kept, oldest first.
    pub fn runs(&self) -> &[Run] {
        &self.runs
    }

    /// The last run of `profile`'s `job` (any job: `None`).
    pub fn last(&self, profile: &str, job: Option<JobKind>) -> Option<&Run> {
        self.runs.iter().rev().find(|r| r.profile == profile && job.is_none_or(|j| r.job == j))
    }

    /// The last run of `profile`'s `job` that did its work.
    pub fn last_ok(&self, profile: &str, job: JobKind) -> Option<&Run> {
        self.runs.iter().rev().find(|r| r.profile == profile && r.job == job && r.outcome.ok())
    }

    /// Run `id`.
    pub fn get(&self, id: u64) -> Option<&Run> {
        self.runs.iter().rev().find(|r| r.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn survives_a_restart_and_a_killed_agent() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = History::open(dir.path()).unwrap();
        let mut run = h.start("laptop", JobKind::Backup, "schedule").unwrap();
        run.outcome = Outcome::Success;
        run.files = 3;
        h.finish(run).unwrap();
        // Started, never finished: the agent was killed.
        let _ = h.start("laptop", JobKind::Check, "run-now").unwrap();
        drop(h);
        let h = History::open(dir.path()).unwrap();
        assert_eq!(h.runs().len(), 2);
        assert_eq!(h.last_ok("laptop", JobKind::Backup).unwrap().files, 3);
        let check = h.last("laptop", Some(JobKind::Check)).unwrap();
        assert_eq!((check.id, check.outcome), (2, Outcome::Interrupted));
        let mut h = History::open(dir.path()).unwrap();
        assert_eq!(h.runs().len(), 2, "the interrupted run is recorded once");
        assert_eq!(h.start("laptop", JobKind::Backup, "x").unwrap().id, 3);
    }
}
