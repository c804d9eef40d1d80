//! `cairn agent`: a long-running service that runs each profile's jobs (backup, forget +
//! prune, check) on their schedules, one job per repository at a time, keeps their history on
//! disk, serves Prometheus metrics, sends alerts, and serves a web interface to watch the jobs
//! and browse, download and restore snapshots.
//!
//! - [`profiles`]: the `[profile.NAME.schedule]` sections; [`cairn_schedule`] the schedules.
//! - [`scheduler`]: deadlines, the queue, retries, catch-up; [`job`] runs one job as a `cairn`
//!   child process and reads its JSON status lines; [`history`] keeps the runs.
//! - [`metrics`], [`notify`]: Prometheus text and alerts.
//! - [`http`] serves [`ui`]'s pages (which read repositories through [`browse`], the library's
//!   read path, never the CLI) and the API [`client`] talks to.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use cairn_core::engine::repository::Repository;

pub mod browse;
pub mod client;
pub mod history;
pub mod http;
pub mod job;
pub mod metrics;
pub mod notify;
pub mod profiles;
pub mod scheduler;
pub mod ui;

use history::History;
use profiles::{JobKind, Jobs};
use scheduler::{ProfileState, Queued};

/// Opens profile `NAME`'s repository (the caller knows where its password comes from).
pub type Opener = Arc<dyn Fn(&str) -> Result<Repository> + Send + Sync>;

/// What the agent runs and where.
pub struct Config {
    /// The configuration file (each job runs `cairn --config FILE -p PROFILE …`).
    pub config_file: PathBuf,
    /// The agent's profiles.
    pub profiles: Vec<Jobs>,
    /// The `cairn` binary the jobs run.
    pub exe: PathBuf,
    /// Where the history, logs, token and address are kept.
    pub state_dir: PathBuf,
    /// The address the web interface and API listen on.
    pub listen: SocketAddr,
    /// HTTPS with this certificate; plain HTTP without (then only on a loopback address).
    pub tls: Option<cairn_server::tls::Certificate>,
    /// The password of the web interface and token of the API (default: the one in
    /// STATE_DIR/token, made on first start).
    pub password: Option<String>,
    /// Also write the metrics to this file after each job (node exporter's textfile format).
    pub metrics_file: Option<PathBuf>,
    /// Opens a profile's repository for the pages.
    pub opener: Opener,
    /// Where this machine's checks keep their record of packs read (the cache directory the
    /// jobs use), for the health page's "never verified"; `None`: no record is kept.
    pub check_record_dir: Option<PathBuf>,
}

/// The running agent, shared by the scheduler, the jobs and the web server.
pub struct Agent {
    pub(crate) profiles: Vec<Jobs>,
    pub(crate) launcher: job::Launcher,
    pub(crate) state: Mutex<State>,
    pub(crate) wake: tokio::sync::Notify,
    pub(crate) stopping: AtomicBool,
    pub(crate) host: String,
    /// When the agent started (Unix seconds): the overdue alert counts from here when a
    /// profile never had a successful backup.
    pub(crate) started: i64,
    pub(crate) metrics_file: Option<PathBuf>,
    pub(crate) opener: Opener,
    pub(crate) check_record_dir: Option<PathBuf>,
    pub(crate) repos: Mutex<HashMap<String, Arc<Repository>>>,
    pub(crate) restores: Mutex<Vec<Arc<browse::RestoreTask>>>,
    pub(crate) password: String,
    pub(crate) sessions: Mutex<HashMap<String, i64>>,
    /// Whether the pages are served over HTTPS (the session cookie is then `Secure`).
    pub(crate) https: bool,
}

/// What the scheduler and the pages share behind one lock.
pub struct State {
    /// One per profile, in [`Agent::profiles`]' order.
    pub profiles: Vec<ProfileState>,
    /// Jobs waiting.
    pub queue: VecDeque<Queued>,
    /// Runs so far.
    pub history: History,
}

/// Where the agent listens, said once it does.
pub struct Started {
    /// `http` or `https`.
    pub scheme: &'static str,
    /// The bound address (a port 0 made concrete).
    pub address: SocketAddr,
    /// Where the password is kept, if the agent made it.
    pub password_file: Option<PathBuf>,
}

/// The file in the state directory holding the password the agent made.
pub const TOKEN_FILE: &str = "token";
/// The file in the state directory holding the address the agent listens on.
pub const ADDRESS_FILE: &str = "address";

impl Agent {
    fn new(config: &Config, password: String) -> Result<Agent> {
        let history = History::open(&config.state_dir)?;
        Ok(Agent {
            profiles: config.profiles.clone(),
            launcher: job::Launcher { exe: config.exe.clone(), config: config.config_file.clone() },
            state: Mutex::new(State {
                profiles: vec![ProfileState::default(); config.profiles.len()],
                queue: VecDeque::new(),
                history,
            }),
            wake: tokio::sync::Notify::new(),
            stopping: AtomicBool::new(false),
            host: notify::host(),
            started: crate::scheduler::now().timestamp(),
            metrics_file: config.metrics_file.clone(),
            opener: config.opener.clone(),
            check_record_dir: config.check_record_dir.clone(),
            repos: Mutex::new(HashMap::new()),
            restores: Mutex::new(Vec::new()),
            password,
            sessions: Mutex::new(HashMap::new()),
            https: config.tls.is_some(),
        })
    }

    /// The index of profile `name`.
    pub(crate) fn profile_index(&self, name: &str) -> Option<usize> {
        self.profiles.iter().position(|p| p.profile == name)
    }

    /// Profile `name`'s repository, opened once and kept (with its index) until a job changes it.
    pub(crate) fn repository(&self, name: &str) -> Result<Arc<Repository>> {
        if let Some(r) = self.repos.lock().unwrap().get(name) {
            return Ok(r.clone());
        }
        let repo = (self.opener)(name)?;
        repo.load_index()?;
        let repo = Arc::new(repo);
        self.repos.lock().unwrap().insert(name.to_string(), repo.clone());
        Ok(repo)
    }

    /// Lets go of the pages' copy of `name`'s repository (a job changed it). Called on the
    /// scheduler's runtime: the repository may own a storage runtime of its own, which may not
    /// be dropped in an async context, so it is dropped on a thread of its own.
    fn forget_repository(&self, name: &str) {
        if let Some(repo) = self.repos.lock().unwrap().remove(name) {
            std::thread::spawn(move || drop(repo));
        }
    }

    /// The size of profile `i`'s repository (its packs), opening it off the runtime's thread
    /// (and not keeping it: the agent holds no index while it waits).
    async fn repository_size(self: &Arc<Self>, i: usize) -> Option<u64> {
        let opener = self.opener.clone();
        let name = self.profiles[i].profile.clone();
        tokio::task::spawn_blocking(move || {
            let repo = opener(&name).ok()?;
            let size: u64 = repo.list_packs().ok()?.values().sum();
            Some(size)
        })
        .await
        .ok()
        .flatten()
    }

    /// Writes the metrics file (if one was asked for): a temporary file renamed over it, so
    /// the node exporter never reads half of one.
    fn write_metrics_file(&self) {
        let Some(path) = &self.metrics_file else { return };
        let text = metrics::render(self);
        let tmp = path.with_extension("prom.tmp");
        let written = std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            eprintln!("cairn agent: cannot write the metrics file {}: {e}", path.display());
        }
    }
}

/// The password of the web interface: the one given, or the one in STATE_DIR/token (made,
/// readable by the owner only, on first start).
fn password(config: &Config) -> Result<(String, Option<PathBuf>)> {
    if let Some(p) = &config.password {
        return Ok((p.clone(), None));
    }
    let path = config.state_dir.join(TOKEN_FILE);
    if let Ok(text) = std::fs::read_to_string(&path) {
        if !text.trim().is_empty() {
            return Ok((text.trim().to_string(), Some(path)));
        }
    }
    let mut b = [0u8; 18];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b)
        .map_err(|_| anyhow::anyhow!("no random numbers for the agent's token"))?;
    let token = hex::encode(b);
    write_private(&path, &token)?;
    Ok((token, Some(path)))
}

fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

/// Runs the agent until SIGTERM or SIGINT: then each running job is stopped as Ctrl-C stops
/// it (the next run reuses what it stored), and the agent waits for them to end.
pub fn run(config: Config, started: impl FnOnce(&Started)) -> Result<()> {
    if config.tls.is_none() && !config.listen.ip().is_loopback() {
        bail!(
            "the agent serves plain HTTP only on a loopback address, not {}: give --tls-cert and --tls-key",
            config.listen
        );
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    std::fs::create_dir_all(&config.state_dir)
        .with_context(|| format!("cannot make the agent's state directory {}", config.state_dir.display()))?;
    let tls = config.tls.as_ref().map(cairn_server::tls::load).transpose()?;
    let (password, password_file) = password(&config)?;
    let agent = Arc::new(Agent::new(&config, password)?);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(8)
        .build()
        .context("cannot start the agent's runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        let address = listener.local_addr()?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        write_private(&config.state_dir.join(ADDRESS_FILE), &format!("{scheme}://{address}\n"))?;
        started(&Started { scheme, address, password_file });
        agent.plan_first();
        agent.write_metrics_file();
        let server = tokio::spawn(http::serve(agent.clone(), listener, tls.map(|t| t.config)));
        let scheduler = tokio::spawn(agent.clone().schedule_loop());
        wait_for_stop().await?;
        agent.stop().await;
        server.abort();
        let _ = scheduler.await;
        Ok(())
    })
}

async fn wait_for_stop() -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

impl Agent {
    /// Stops: no new job starts, each running one gets SIGINT, and the agent waits for them.
    async fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        self.wake.notify_one();
        let pids: Vec<u32> = {
            let st = self.state.lock().unwrap();
            st.profiles.iter().filter_map(|p| p.running.as_ref().map(|l| l.pid)).filter(|p| *p > 0).collect()
        };
        for pid in pids {
            // SAFETY: a signal to a child this agent started and has not reaped yet.
            unsafe { libc::kill(pid as i32, libc::SIGINT) };
        }
        loop {
            if self.state.lock().unwrap().profiles.iter().all(|p| p.running.is_none()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Runs one job of one profile now, in the foreground (a systemd timer's or cron's run):
/// recorded in the same history, alerting the same way, and writing the metrics file if asked.
/// Returns the run.
pub fn run_once(config: Config, profile: &str, job: JobKind) -> Result<history::Run> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    std::fs::create_dir_all(&config.state_dir)
        .with_context(|| format!("cannot make the agent's state directory {}", config.state_dir.display()))?;
    let agent = Arc::new(Agent::new(&config, String::new())?);
    let Some(i) = agent.profile_index(profile) else {
        bail!("profile {profile:?} has no [profile.{profile}.schedule] section in {}", config.config_file.display());
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async move {
        let run = agent.state.lock().unwrap().history.start(profile, job, "once")?;
        let q = Queued {
            profile: i,
            job,
            reason: "once".into(),
            attempt: agent.profiles[i].retries,
            not_before: crate::scheduler::now(),
        };
        agent.state.lock().unwrap().profiles[i].running =
            Some(scheduler::Live { run: run.clone(), pid: 0, progress: job::Progress::default() });
        let id = run.id;
        agent.clone().run_job(q, run).await;
        let st = agent.state.lock().unwrap();
        st.history.get(id).cloned().context("the run was not recorded")
    })
}
