//! The agent's metrics in Prometheus' text format, served at `/metrics` and written to
//! `--metrics-file` (the node exporter's textfile collector reads the same format).

use std::fmt::Write;

use crate::profiles::JobKind;
use crate::Agent;

/// The metrics as Prometheus text.
pub fn render(agent: &Agent) -> String {
    let st = agent.state.lock().unwrap();
    let mut out = String::new();
    let mut family = |name: &str, help: &str, rows: Vec<(String, f64)>| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (labels, v) in rows {
            if labels.is_empty() {
                let _ = writeln!(out, "{name} {v}");
            } else {
                let _ = writeln!(out, "{name}{{{labels}}} {v}");
            }
        }
    };
    let label = |p: &str, j: Option<JobKind>| match j {
        Some(j) => format!("profile=\"{}\",job=\"{}\"", escape(p), j.name()),
        None => format!("profile=\"{}\"", escape(p)),
    };
    let per_job = |f: &dyn Fn(&str, JobKind) -> Option<f64>| -> Vec<(String, f64)> {
        let mut rows = Vec::new();
        for p in &agent.profiles {
            for j in JobKind::ALL {
                if let Some(v) = f(&p.profile, j) {
                    rows.push((label(&p.profile, Some(j)), v));
                }
            }
        }
        rows
    };
    let h = &st.history;
    family(
        "cairn_last_success_timestamp_seconds",
        "When the job last succeeded (Unix time).",
        per_job(&|p, j| h.last_ok(p, j).map(|r| r.ended as f64)),
    );
    family(
        "cairn_last_run_timestamp_seconds",
        "When the job last ended, whatever its outcome (Unix time).",
        per_job(&|p, j| h.last(p, Some(j)).map(|r| r.ended as f64)),
    );
    family(
        "cairn_last_run_success",
        "1 if the job's last run succeeded, else 0.",
        per_job(&|p, j| h.last(p, Some(j)).map(|r| if r.outcome.ok() { 1.0 } else { 0.0 })),
    );
    family(
        "cairn_last_run_duration_seconds",
        "How long the job's last run took.",
        per_job(&|p, j| h.last(p, Some(j)).map(|r| r.seconds() as f64)),
    );
    let backup = |f: fn(&crate::history::Run) -> u64| -> Vec<(String, f64)> {
        agent
            .profiles
            .iter()
            .filter_map(|p| h.last_ok(&p.profile, JobKind::Backup).map(|r| (label(&p.profile, None), f(r) as f64)))
            .collect()
    };
    family("cairn_backup_files", "Files in the last successful backup.", backup(|r| r.files));
    family("cairn_backup_read_bytes", "Bytes read by the last successful backup.", backup(|r| r.bytes_read));
    family("cairn_backup_added_bytes", "Bytes the last successful backup added.", backup(|r| r.bytes_added));
    family("cairn_backup_errors", "Entries the last successful backup could not read.", backup(|r| r.errors));
    family(
        "cairn_repository_size_bytes",
        "The repository's packs after the profile's last job.",
        agent
            .profiles
            .iter()
            .zip(&st.profiles)
            .filter_map(|(p, s)| s.repo_size.map(|b| (label(&p.profile, None), b as f64)))
            .collect(),
    );
    family(
        "cairn_next_run_timestamp_seconds",
        "When the job is next scheduled (Unix time).",
        agent
            .profiles
            .iter()
            .zip(&st.profiles)
            .flat_map(|(p, s)| s.next.iter().map(|(j, at)| (label(&p.profile, Some(*j)), at.timestamp() as f64)))
            .collect(),
    );
    let running = st.profiles.iter().filter(|p| p.running.is_some()).count();
    family("cairn_agent_jobs_running", "Jobs running now.", vec![(String::new(), running as f64)]);
    family("cairn_agent_jobs_queued", "Jobs waiting for their turn.", vec![(String::new(), st.queue.len() as f64)]);
    out
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
