//! `cairn agent status` and `cairn agent run-now`: requests to the running agent, found by
//! the address and password it keeps in its state directory.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::profiles::JobKind;
use crate::{ADDRESS_FILE, TOKEN_FILE};

/// The running agent's address (`http://127.0.0.1:8090`) and password.
fn endpoint(state_dir: &Path, password: Option<&str>) -> Result<(String, String)> {
    let read = |name: &str| -> Result<String> {
        let p = state_dir.join(name);
        let text = std::fs::read_to_string(&p).with_context(|| {
            format!("cannot read {}: is the agent running with this state directory (--state-dir)?", p.display())
        })?;
        Ok(text.trim().to_string())
    };
    let url = read(ADDRESS_FILE)?;
    let password = match password {
        Some(p) => p.to_string(),
        None => read(TOKEN_FILE)?,
    };
    Ok((url, password))
}

fn call(state_dir: &Path, password: Option<&str>, post: bool, path: &str) -> Result<serde_json::Value> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (url, password) = endpoint(state_dir, password)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        // The agent on this machine, at the address it wrote: its certificate may be self-made.
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .danger_accept_invalid_certs(
                url.starts_with("https://127.")
                    || url.starts_with("https://[::1]")
                    || url.starts_with("https://localhost"),
            )
            .build()?;
        let full = format!("{url}{path}");
        let req = if post { client.post(&full) } else { client.get(&full) };
        let resp =
            req.bearer_auth(&password).send().await.with_context(|| format!("cannot reach the agent at {url}"))?;
        let status = resp.status();
        let body = resp.text().await?;
        if !status.is_success() {
            bail!("the agent at {url} answered {status}: {}", body.trim());
        }
        Ok(serde_json::from_str(&body)?)
    })
}

/// The agent's state: every profile's state, progress, last and next runs (the `/api/status`
/// body).
pub fn status(state_dir: &Path, password: Option<&str>) -> Result<serde_json::Value> {
    call(state_dir, password, false, "/api/status")
}

/// Asks the agent to run `job` of `profile` now; false if it was already queued or running.
pub fn run_now(state_dir: &Path, password: Option<&str>, profile: &str, job: JobKind) -> Result<bool> {
    let v = call(state_dir, password, true, &format!("/api/run/{}?job={}", crate::http::encode(profile), job.name()))?;
    Ok(v["queued"].as_bool().unwrap_or(false))
}
