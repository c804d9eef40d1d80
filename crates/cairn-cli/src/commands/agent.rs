//! `cairn agent`: run the profiles' jobs on their schedules and serve the web interface
//! (crates/cairn-agent); `agent status` and `agent run-now` talk to the running agent; `agent
//! once` runs one job in the foreground (systemd timers, cron).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use cairn_agent::profiles::JobKind;
use clap::{Args as ClapArgs, Subcommand};

use super::Global;

#[derive(ClapArgs, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: Option<AgentCommand>,
    #[command(flatten)]
    run: RunArgs,
    /// Where the agent keeps its history, logs, password and address (default: $STATE_DIRECTORY
    /// under systemd, else $XDG_STATE_HOME/cairn/agent or ~/.local/state/cairn/agent)
    #[arg(long, env = "CAIRN_AGENT_STATE", global = true, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Also write the metrics, in the node exporter's textfile format, to FILE after each job
    #[arg(long, global = true, value_name = "FILE")]
    metrics_file: Option<PathBuf>,
    /// The web interface's password (first line of FILE; default: one the agent makes and keeps
    /// in its state directory as `token`)
    #[arg(long, global = true, value_name = "FILE")]
    ui_password_file: Option<PathBuf>,
}

#[derive(ClapArgs, Debug)]
struct RunArgs {
    /// The address the web interface, the API and /metrics listen on (port 0: a free port)
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8090")]
    listen: SocketAddr,
    /// Serve HTTPS with this certificate chain (PEM); needed to listen beyond loopback
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum AgentCommand {
    /// Show the running agent's profiles: state, progress, last and next runs
    Status,
    /// Ask the running agent to run a profile's job now
    RunNow(JobArgs),
    /// Run one job of a profile now in the foreground, recorded in the agent's history (for a
    /// systemd timer or cron); exits as the job did
    Once(JobArgs),
}

#[derive(ClapArgs, Debug)]
struct JobArgs {
    /// The profile
    profile: String,
    /// backup, forget (forget --prune) or check
    #[arg(long, default_value = "backup", value_name = "JOB")]
    job: String,
}

pub fn run(g: &Global, a: Args) -> Result<ExitCode> {
    let state_dir = match a.state_dir {
        Some(d) => d,
        None => default_state_dir()?,
    };
    let ui_password = a.ui_password_file.as_deref().map(read_first_line).transpose()?;
    match a.command {
        Some(AgentCommand::Status) => {
            let s = cairn_agent::client::status(&state_dir, ui_password.as_deref())?;
            if g.json {
                outln!("{s}");
            } else {
                for line in cairn_agent::ui::status_lines(&s) {
                    outln!("{line}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(AgentCommand::RunNow(j)) => {
            let job = JobKind::parse(&j.job)?;
            let queued = cairn_agent::client::run_now(&state_dir, ui_password.as_deref(), &j.profile, job)?;
            match queued {
                true => outln!("{} of profile {} queued", job.name(), j.profile),
                false => outln!("{} of profile {} is already queued or running", job.name(), j.profile),
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(AgentCommand::Once(j)) => {
            let job = JobKind::parse(&j.job)?;
            let config = config(g, state_dir, a.metrics_file, None, &a.run)?;
            let run = cairn_agent::run_once(config, &j.profile, job)?;
            outln!("{} of profile {}: {} — {}", job.name(), j.profile, run.outcome.name(), run.message);
            Ok(ExitCode::from(run.exit_code.map_or(1, |c| c.clamp(0, 255) as u8)))
        }
        None => {
            let config = config(g, state_dir, a.metrics_file, ui_password, &a.run)?;
            let names: Vec<String> = config.profiles.iter().map(|p| p.profile.clone()).collect();
            cairn_agent::run(config, |s| {
                outln!(
                    "cairn agent: {} profiles ({}); web interface at {}://{}",
                    names.len(),
                    names.join(", "),
                    s.scheme,
                    s.address
                );
                if let Some(f) = &s.password_file {
                    outln!("password: in {}", f.display());
                }
            })?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The agent's configuration: the profiles of the configuration file, this binary, and a way
/// to open each profile's repository for the pages.
fn config(
    g: &Global,
    state_dir: PathBuf,
    metrics_file: Option<PathBuf>,
    password: Option<String>,
    r: &RunArgs,
) -> Result<cairn_agent::Config> {
    let file = crate::profile::config_file()?;
    let profiles = cairn_agent::profiles::from_config(&file)?;
    let (cache_dir, no_cache) = (g.cache_dir.clone(), g.no_cache);
    let check_record_dir = cairn_core::engine::open::MachineState::new(cache_dir.clone(), no_cache).dir;
    let remote = g.sftp_key.as_ref().map(|p| p.to_string_lossy().into_owned());
    let known_hosts = g.sftp_known_hosts.clone();
    let config_file = file.file().to_path_buf();
    let file = Arc::new(file);
    let opener: cairn_agent::Opener = Arc::new(move |name: &str| {
        let (repo, password) = crate::profile::repository_of(&file, name)?;
        let remote = cairn_core::engine::storage::RemoteOptions {
            sftp_key: remote.clone(),
            sftp_known_hosts: Some(known_hosts.clone()),
            ..Default::default()
        };
        let storage = cairn_core::engine::open::storage_at(&repo, &remote)?;
        let machine = cairn_core::engine::open::MachineState::new(cache_dir.clone(), no_cache);
        let options = cairn_core::engine::open::OpenOptions { machine, ..Default::default() };
        Ok(cairn_core::engine::open::open(storage, &password, options)?.repo)
    });
    Ok(cairn_agent::Config {
        config_file,
        profiles,
        exe: std::env::current_exe().context("cannot find the cairn binary for the jobs")?,
        state_dir,
        listen: r.listen,
        tls: match (&r.tls_cert, &r.tls_key) {
            (Some(cert), Some(key)) => {
                Some(cairn_server::tls::Certificate::Files { cert: cert.clone(), key: key.clone() })
            }
            _ => None,
        },
        password,
        metrics_file,
        opener,
        check_record_dir,
    })
}

fn read_first_line(path: &std::path::Path) -> Result<String> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let line = text.lines().next().unwrap_or("").trim().to_string();
    anyhow::ensure!(!line.is_empty(), "{} is empty", path.display());
    Ok(line)
}

fn default_state_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("STATE_DIRECTORY").filter(|v| !v.is_empty()) {
        // systemd's StateDirectory= (the first, if several).
        let first = d.to_string_lossy().split(':').next().unwrap_or_default().to_string();
        return Ok(PathBuf::from(first));
    }
    let base = match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").context("no HOME: give --state-dir")?).join(".local/state"),
    };
    Ok(base.join("cairn").join("agent"))
}
