//! One file per command: its arguments and a short `run` that turns them into a library call.

use std::sync::Arc;

use anyhow::{bail, Result};
use cairn_core::engine::lock::{FoundLock, Lock};
use cairn_core::engine::memory::MaxMemory;
use cairn_core::engine::open::{self, Held, MachineState, OpenOptions};
use cairn_core::engine::repository::Repository;
use cairn_core::engine::storage::{Limits, Location, RemoteOptions, Storage};
use cairn_format::compress::Codec;
use cairn_format::lock::LockKind;

pub(crate) use crate::cli::Global;
use crate::password;

pub mod agent;
pub mod backup;
pub mod check;
pub mod completions;
pub mod config;
pub mod copy;
pub mod diff;
pub mod dump;
pub mod find;
pub mod forget;
pub mod init;
pub mod key;
pub mod ls;
pub mod man;
pub mod mount;
pub mod nbd;
pub mod prune;
pub mod recompress;
pub mod repair;
pub mod restore;
pub mod serve;
pub mod snapshots;
pub mod stats;
pub mod tag;
pub mod unlock;

pub(crate) fn storage(global: &Global) -> Result<Arc<dyn Storage>> {
    let Some(repo) = &global.repo else {
        bail!("no repository given: use -r/--repo or set CAIRN_REPOSITORY");
    };
    storage_at(global, repo)
}

/// The storage at `repo` (a location as `-r` takes it), with the global remote options.
pub(crate) fn storage_at(global: &Global, repo: &str) -> Result<Arc<dyn Storage>> {
    let remote = RemoteOptions {
        limits: Limits { upload: global.limit_upload, download: global.limit_download },
        sftp_key: global.sftp_key.as_ref().map(|p| p.to_string_lossy().into_owned()),
        sftp_known_hosts: Some(global.sftp_known_hosts.clone()),
        // The token is read only for a server's location, as the password only when a key is needed.
        server: match Location::parse(repo)? {
            Location::Server { .. } => serve::server_options(global)?,
            _ => Default::default(),
        },
    };
    Ok(open::storage_at(repo, &remote)?)
}

/// The repository `-r` names and its password, in that order. Before a password is asked for,
/// or when the one given cannot be read, the repository is looked for (one round trip, as restic
/// does), so a wrong location is said first; a password given costs no look.
pub(crate) fn repository(global: &Global) -> Result<(Arc<dyn Storage>, Vec<u8>)> {
    let storage = storage(global)?;
    let pw = match password::given(global.password_file.as_deref(), "CAIRN_PASSWORD") {
        Some(Ok(pw)) => pw,
        unavailable => {
            open::ensure_repository(&*storage)?;
            match unavailable {
                Some(Err(e)) => return Err(e),
                _ => password::ask("CAIRN_PASSWORD", "repository password", false)?,
            }
        }
    };
    Ok((storage, pw))
}

/// The library's open options as the global options choose them: no lock, nothing read ahead,
/// the cache directory, stale locks warned of.
pub(crate) fn options(global: &Global) -> OpenOptions<'static> {
    OpenOptions { machine: machine(global), on_stale_lock: Some(&warn_stale), ..OpenOptions::default() }
}

/// Opens the repository `-r` names, taking no lock.
pub(crate) fn open(global: &Global) -> Result<Repository> {
    let (storage, pw) = repository(global)?;
    Ok(open::open(storage, &pw, options(global))?.repo)
}

/// Opens the repository `-r` names and takes a lock of `kind` beside the open
/// ([`open::open`]); the lock is held until the returned [`Held`] is dropped.
pub(crate) fn open_locked(global: &Global, kind: LockKind) -> Result<(Repository, Held)> {
    let (storage, pw) = repository(global)?;
    let opened = open::open(storage, &pw, OpenOptions { lock: Some(kind), ..options(global) })?;
    Ok((opened.repo, opened.lock))
}

/// [`open_locked`] for a command that hands its lock to the library (a prune's).
pub(crate) fn open_holding(global: &Global, kind: LockKind) -> Result<(Repository, Lock)> {
    match open_locked(global, kind)? {
        (repo, Held::Kept(lock)) => Ok((repo, lock)),
        _ => bail!("the repository was opened without its {kind:?} lock"),
    }
}

/// Where this machine keeps what it learns about repositories (the check's record of packs
/// read, the key file that opened each, the metadata cache): the cache directory, also for
/// local repositories; nothing with `--no-cache`.
pub(crate) fn machine(global: &Global) -> MachineState {
    MachineState::new(global.cache_dir.clone(), global.no_cache)
}

/// Takes a lock for the rest of the command, after the open, reporting stale locks it ignores.
pub(crate) fn lock(repo: &Repository, kind: LockKind) -> Result<Lock> {
    Ok(open::lock(repo, kind, Some(&warn_stale))?)
}

fn warn_stale(l: &FoundLock) {
    let why = l.stale_reason().unwrap_or_default();
    eprintln!("warning: ignoring stale lock {} ({why}); `cairn unlock` removes it", l.path);
}

/// A flag that SIGINT sets (the library stops at the next unit of work).
pub(crate) fn cancel_on_sigint() -> Result<Arc<std::sync::atomic::AtomicBool>> {
    let cancel = Arc::new(std::sync::atomic::AtomicBool::new(false));
    set_on_sigint(&cancel)?;
    Ok(cancel)
}

/// Sets `cancel` on SIGINT (once per process).
pub(crate) fn set_on_sigint(cancel: &Arc<std::sync::atomic::AtomicBool>) -> Result<()> {
    let on_signal = cancel.clone();
    ctrlc::set_handler(move || on_signal.store(true, std::sync::atomic::Ordering::Relaxed))
        .map_err(|e| anyhow::anyhow!("cannot install the SIGINT handler: {e}"))
}

/// Splits `SNAPSHOT[:PATH]`: the snapshot name (UTF-8: `latest` or an ID prefix) and the path
/// inside it, taken as bytes (a file name need not be UTF-8).
pub(crate) fn split_spec(spec: &std::ffi::OsStr) -> Result<(&str, Option<&std::path::Path>)> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = spec.as_bytes();
    let (name, path) = match bytes.iter().position(|b| *b == b':') {
        Some(i) => (&bytes[..i], Some(std::path::Path::new(std::ffi::OsStr::from_bytes(&bytes[i + 1..])))),
        None => (bytes, None),
    };
    let Ok(name) = std::str::from_utf8(name) else {
        bail!("{:?} is not a snapshot: use `latest` or an ID prefix, then :PATH", spec);
    };
    Ok((name, path))
}

pub(crate) fn parse_codec(s: &str) -> Result<Codec> {
    Ok(s.parse::<Codec>()?)
}

/// Parses a byte size: a number with an optional K, M, G or T suffix (binary units).
pub(crate) fn parse_size(s: &str) -> Result<u64> {
    Ok(cairn_core::engine::platform::parse_size(s)?)
}

/// `1 snapshot`, `2 snapshots`.
pub(crate) fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// A `--max-memory` whose default grows with the repository (`prune`, `copy`, the walks).
pub(crate) fn max_memory(given: Option<&str>) -> Result<MaxMemory> {
    Ok(MaxMemory::from_option(given.map(parse_size).transpose()?))
}

/// `--max-memory` of the commands that walk snapshots' trees (`ls`, `find`, `diff`, `stats`).
#[derive(clap::Args, Debug)]
pub struct WalkMemory {
    /// Memory the walk may use: the index and the largest directory, then the trees being
    /// loaded and read ahead; too small a budget is refused, naming the least that fits
    /// [default: 256M, or the least this repository needs]
    #[arg(long, value_name = "SIZE")]
    pub max_memory: Option<String>,
}

impl WalkMemory {
    /// The walk's shares of the budget in `repo` (its index loaded), the command keeping
    /// `extra` bytes besides.
    pub fn shares(&self, repo: &Repository, extra: u64) -> Result<cairn_core::engine::trees::WalkShares> {
        let max = max_memory(self.max_memory.as_deref())?;
        Ok(cairn_core::engine::trees::WalkShares::of(repo, max, repo.storage().default_concurrency(), extra)?)
    }
}

/// The snapshot filters of commands that work on several snapshots.
#[derive(clap::Args, Debug, Default)]
pub struct SnapshotArgs {
    /// Only this snapshot (an ID prefix or `latest`; repeatable)
    #[arg(long = "snapshot", value_name = "ID")]
    pub ids: Vec<String>,
    #[command(flatten)]
    pub filters: FilterArgs,
}

impl SnapshotArgs {
    /// The library's filter.
    pub fn filter(&self) -> cairn_core::engine::select::SnapshotFilter {
        self.filters.filter(&self.ids)
    }
}

/// The host, tag, path and token filters (commands that take snapshot IDs as arguments add
/// these); `latest` is the newest snapshot that passes them.
#[derive(clap::Args, Debug, Default)]
pub struct FilterArgs {
    /// Only snapshots of this host (repeatable: any of them)
    #[arg(long = "host", value_name = "HOST")]
    pub hosts: Vec<String>,
    /// Only snapshots with this tag (repeatable: any of them; `a,b`: both; `a\,b`: the tag "a,b";
    /// '': no tags)
    #[arg(long = "tag", value_name = "TAG")]
    pub tags: Vec<String>,
    /// Only snapshots of exactly these paths (repeatable)
    #[arg(long = "path", value_name = "PATH")]
    pub paths: Vec<String>,
    /// Only snapshots this `cairn serve` token stored, by the token's name (repeatable: any of
    /// them); the server's record, shown by `cairn snapshots`
    #[arg(long = "stored-by", value_name = "TOKEN")]
    pub stored_by: Vec<String>,
}

impl FilterArgs {
    /// The library's filter choosing `ids` (none: every snapshot) narrowed by these filters.
    pub fn filter(&self, ids: &[String]) -> cairn_core::engine::select::SnapshotFilter {
        cairn_core::engine::select::SnapshotFilter {
            ids: ids.to_vec(),
            hosts: self.hosts.clone(),
            tags: self.tags.clone(),
            paths: self.paths.clone(),
            stored_by: self.stored_by.clone(),
        }
    }
}

/// An NBD server (`cairn nbd`, `restore --live`) listening on `socket`, else `listen`, else
/// 127.0.0.1:10809, which SIGINT, SIGTERM or SIGHUP stop: caught from before it serves, so no
/// signal can end the process with a client's writes unsynced.
pub(crate) struct NbdServer {
    pub server: cairn_nbd::Server,
    signals: signal_hook::iterator::Handle,
    watcher: std::thread::JoinHandle<()>,
}

impl NbdServer {
    /// Binds the server and starts watching the signals.
    pub fn bind(socket: Option<std::path::PathBuf>, listen: Option<String>) -> Result<NbdServer> {
        use anyhow::Context;
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let listen = match (socket, listen) {
            (Some(p), _) => cairn_nbd::Listen::Unix(p),
            (None, Some(addr)) => cairn_nbd::Listen::Tcp(addr),
            (None, None) => cairn_nbd::Listen::Tcp("127.0.0.1:10809".into()),
        };
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
            .context("cannot install the signal handlers")?;
        let server = cairn_nbd::Server::bind(&listen).context("cannot listen for NBD clients")?;
        let stopper = server.stopper();
        let handle = signals.handle();
        let watcher = std::thread::spawn(move || {
            if signals.forever().next().is_some() {
                stopper.stop();
            }
        });
        Ok(NbdServer { server, signals: handle, watcher })
    }

    /// Stops watching the signals, once the server has stopped.
    pub fn close(self) {
        self.signals.close();
        let _ = self.watcher.join();
    }
}
