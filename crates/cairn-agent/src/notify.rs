//! Alerts: on a job's failure, on its recovery, and when a profile has had no successful backup
//! for its `alert-after` time. A webhook gets the event as a JSON body (HTTP POST); a command
//! (`sh -c`) gets it on standard input and in `CAIRN_EVENT`, `CAIRN_PROFILE`, `CAIRN_JOB`,
//! `CAIRN_HOST` and `CAIRN_MESSAGE`.

use std::process::Stdio;
use std::time::Duration;

use serde::Serialize;
use tokio::io::AsyncWriteExt;

use crate::profiles::Jobs;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A job failed (after its retries).
    Failure,
    /// A job succeeded after failing.
    Recovery,
    /// No successful backup for longer than `alert-after`.
    Overdue,
}

/// One alert, as the webhook's body.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// What happened.
    pub event: Kind,
    /// This machine's name.
    pub host: String,
    /// The profile.
    pub profile: String,
    /// The job (`backup`, `forget`, `check`).
    pub job: String,
    /// One line for people: host, profile and what failed.
    pub message: String,
    /// The run it is about, if one.
    pub run: Option<u64>,
    /// When, RFC 3339.
    pub time: String,
}

/// Sends `event` to the profile's webhook and command; a failure to deliver is logged on
/// standard error (an alert about alerts has nowhere else to go).
pub async fn send(jobs: &Jobs, event: &Event) {
    let body = serde_json::to_string(event).unwrap_or_default();
    if let Some(url) = &jobs.webhook {
        if let Err(e) = post(url, &body).await {
            eprintln!(
                "cairn agent: profile {}: cannot deliver the {:?} alert to {url}: {e}",
                jobs.profile, event.event
            );
        }
    }
    if let Some(cmd) = &jobs.notify_command {
        if let Err(e) = command(cmd, event, &body).await {
            eprintln!("cairn agent: profile {}: notify-command `{cmd}` failed: {e}", jobs.profile);
        }
    }
}

async fn post(url: &str, body: &str) -> anyhow::Result<()> {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
    let resp = client.post(url).header("content-type", "application/json").body(body.to_string()).send().await?;
    if !resp.status().is_success() {
        anyhow::bail!("the receiver answered {}", resp.status());
    }
    Ok(())
}

async fn command(cmd: &str, event: &Event, body: &str) -> anyhow::Result<()> {
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .env("CAIRN_EVENT", serde_json::to_value(event.event)?.as_str().unwrap_or_default())
        .env("CAIRN_PROFILE", &event.profile)
        .env("CAIRN_JOB", &event.job)
        .env("CAIRN_HOST", &event.host)
        .env("CAIRN_MESSAGE", &event.message)
        .stdin(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(body.as_bytes()).await;
    }
    let status = tokio::time::timeout(Duration::from_secs(120), child.wait()).await??;
    if !status.success() {
        anyhow::bail!("{status}");
    }
    Ok(())
}

/// This machine's name.
pub fn host() -> String {
    gethostname::gethostname().to_string_lossy().into_owned()
}
