//! One file per command: its arguments and a short `run` that turns them into a library call.

use std::sync::Arc;

use anyhow::{bail, Result};
use cairn_core::engine::cache::Cache;
use cairn_core::engine::lock::Lock;
use cairn_core::engine::memory::MaxMemory;
use cairn_core::engine::preload::Preload;
use cairn_core::engine::repository::Repository;
use cairn_core::engine::storage::{Faults, FaultyStorage, Location, OpendalStorage, RemoteOptions, Storage};
use cairn_format::compress::Codec;
use cairn_format::lock::LockKind;

pub(crate) use crate::cli::Global;
use crate::password;

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
        sftp_key: global.sftp_key.as_ref().map(|p| p.to_string_lossy().into_owned()),
        sftp_known_hosts: Some(global.sftp_known_hosts.clone()),
    };
    let location = Location::parse(repo)?;
    if let Location::Server { .. } = location {
        return serve::client_storage(global, &location);
    }
    let real = OpendalStorage::open(&location, &remote)?;
    // Fault injection for tests and benchmarks (docs/DESIGN.md): wraps the real backend.
    match std::env::var("CAIRN_INJECT_FAULTS") {
        Ok(spec) if !spec.is_empty() => Ok(Arc::new(FaultyStorage::new(real, Faults::parse(&spec)?))),
        _ => Ok(Arc::new(real)),
    }
}

pub(crate) fn open(global: &Global) -> Result<Repository> {
    let storage = storage(global)?;
    let pw = password::get(global.password_file.as_deref(), "CAIRN_PASSWORD", "repository password", false)?;
    open_with(global, storage, &pw)
}

/// Opens the repository and takes a lock of `kind` at the same time: the lock's round trips
/// (see that the config exists, write the lock, list the others) run beside the key's (list the
/// keys and read the config, read a key file, derive the key) instead of after them. If either
/// fails, the lock is removed; where there is no repository, none is written.
pub(crate) fn open_locked(global: &Global, kind: LockKind) -> Result<(Repository, Lock)> {
    let (repo, lock, ()) = open_locked_then(global, kind, |_| Preload::none(), None, |_| Ok(()))?;
    Ok((repo, lock))
}

/// [`open_locked`], reading ahead beside both what `preload` asks for (given whether a
/// metadata cache will serve the repository's files), and doing `then` with the opened
/// repository while the lock is still being taken (it may read, not write). If the lock cannot
/// be taken, `stop` (when given) is set, for a long `then` to stop early. Errors come in that
/// order: opening, the lock, then `then`'s.
pub(crate) fn open_locked_then<T>(
    global: &Global,
    kind: LockKind,
    preload: impl FnOnce(bool) -> Preload,
    stop: Option<&std::sync::atomic::AtomicBool>,
    then: impl FnOnce(&Repository) -> Result<T>,
) -> Result<(Repository, Lock, T)> {
    let (repo, held, done) = open_locked_releasing(global, kind, preload, stop, None, then)?;
    let Held::Kept(lock) = held else { unreachable!("a lock without an early release is kept") };
    Ok((repo, lock, done))
}

/// What became of the lock of [`open_locked_releasing`].
pub(crate) enum Held {
    /// Still held: removed when dropped.
    Kept(Lock),
    /// Let go when `release` was raised, this long before `then` ended.
    LetGo(std::time::Duration),
}

/// What the lock thread of [`open_locked_releasing`] did with the lock it took.
enum Taken {
    Kept(Lock),
    /// Let go at this moment.
    LetGoAt(std::time::Instant),
}

/// [`open_locked_then`], letting the lock go as soon as `release` is raised (a restore raises it
/// once it reads nothing more from the repository): its removal, a round trip, then runs beside
/// the end of `then` instead of after it.
pub(crate) fn open_locked_releasing<T>(
    global: &Global,
    kind: LockKind,
    preload: impl FnOnce(bool) -> Preload,
    stop: Option<&std::sync::atomic::AtomicBool>,
    release: Option<&cairn_core::engine::signal::Signal>,
    then: impl FnOnce(&Repository) -> Result<T>,
) -> Result<(Repository, Held, T)> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;
    let storage = storage(global)?;
    let preload = preload(cache_base(global, &*storage).is_some());
    let pw = password::get(global.password_file.as_deref(), "CAIRN_PASSWORD", "repository password", false)?;
    // The open lists `deletions/` beside the lock's write, maybe before it: the lock lists it
    // again once written, so a prune's manifest stored in between is not missed.
    let relist = preload.index;
    let finished = AtomicBool::new(false);
    let (opened, held) = std::thread::scope(|s| {
        let locking = std::thread::Builder::new()
            .name("cairn-lock-take".into())
            .spawn_scoped(s, || -> Result<(Taken, Option<Vec<String>>)> {
                let taken = (|| -> Result<(Lock, Option<Vec<String>>)> {
                    // Where there is no repository, nothing is written (the open says so).
                    if !storage.exists(cairn_format::layout::CONFIG)? {
                        return Err(cairn_core::Error::NoRepository(storage.location().to_string()).into());
                    }
                    let manifests = || relist.then(|| storage.list(cairn_format::layout::Dir::Deletions.name()));
                    let (lock, listed) = take_lock_beside(storage.clone(), kind, manifests)?;
                    Ok((lock, listed.transpose()?.map(|l| l.into_iter().map(|o| o.path).collect())))
                })();
                if let (Err(_), Some(stop)) = (&taken, stop) {
                    stop.store(true, Ordering::Relaxed);
                }
                let (lock, listed) = taken?;
                let Some(release) = release else { return Ok((Taken::Kept(lock), listed)) };
                release.wait();
                if finished.load(Ordering::Acquire) {
                    return Ok((Taken::Kept(lock), listed));
                }
                let at = Instant::now();
                drop(lock); // removed here, beside the command's last work
                Ok((Taken::LetGoAt(at), listed))
            })
            .map_err(|e| cairn_core::Error::io("lock", "cannot start a thread", e))?;
        // However `then` ends (a panic included), the lock thread stops waiting for `release`.
        struct Finished<'a>(&'a AtomicBool, Option<&'a cairn_core::engine::signal::Signal>);
        impl Drop for Finished<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
                if let Some(r) = self.1 {
                    r.raise();
                }
            }
        }
        let guard = Finished(&finished, release);
        let opened = open_preloaded(global, storage.clone(), &pw, &preload).map(|repo| {
            let done = then(&repo);
            (repo, done)
        });
        drop(guard);
        let ended = Instant::now();
        let held = locking.join().expect("the lock thread panicked").map(|(taken, listed)| match taken {
            Taken::Kept(lock) => (Held::Kept(lock), listed),
            Taken::LetGoAt(at) => (Held::LetGo(ended.saturating_duration_since(at)), listed),
        });
        Ok::<_, cairn_core::Error>((opened, held))
    })?;
    let (repo, done) = opened?;
    let (held, listed) = held?;
    if let (Some(listed), Some(seen)) = (listed, repo.deletions_seen()) {
        let mut listed = listed.iter().filter_map(|p| cairn_format::layout::parse_deletion_path(p));
        if let Some(new) = listed.find(|id| !seen.contains(id)).map(|id| cairn_format::layout::deletion_path(&id)) {
            bail!(
                "a prune stored {new} while this command was opening the repository, so what it read may be out of \
                 date: run it again"
            );
        }
    }
    Ok((repo, held, done?))
}

/// Opens the repository in `storage` with `pw`, with the metadata cache the global options
/// choose.
pub(crate) fn open_with(global: &Global, storage: Arc<dyn Storage>, pw: &[u8]) -> Result<Repository> {
    open_preloaded(global, storage, pw, &Preload::none())
}

/// [`open_with`], reading ahead what `preload` asks for while the key is found.
/// The key file that opened the repository last time on this machine is tried first (one round
/// trip instead of two), and remembered when it changes.
fn open_preloaded(global: &Global, storage: Arc<dyn Storage>, pw: &[u8], preload: &Preload) -> Result<Repository> {
    let hints = state_base(global);
    let location = storage.location().to_string();
    let hint = hints.as_deref().and_then(|b| cairn_core::engine::cache::key_hint(b, &location));
    let mut repo = Repository::open_preloaded(storage, pw, &Preload { key: hint, ..preload.clone() })?;
    if let (Some(base), Some(id)) = (&hints, repo.key_id()) {
        if hint != Some(id) {
            cairn_core::engine::cache::remember_key(base, &location, &id);
        }
    }
    if let Some(base) = cache_base(global, &**repo.storage()) {
        repo.set_cache(Cache::open(&base, &repo.config().id)?);
    }
    Ok(repo)
}

/// Where this machine keeps what it learns about repositories (the check's record of packs
/// read, the key file that opened each): the cache directory, also for local repositories;
/// nothing with `--no-cache`.
pub(crate) fn state_base(global: &Global) -> Option<std::path::PathBuf> {
    match (&global.cache_dir, global.no_cache) {
        (_, true) => None,
        (Some(dir), false) => Some(dir.clone()),
        (None, false) => Cache::default_base(),
    }
}

/// Where the metadata cache for `storage` lives, if the global options want one: where
/// [`state_base`] says, for a remote repository or one given `--cache-dir`.
fn cache_base(global: &Global, storage: &dyn Storage) -> Option<std::path::PathBuf> {
    state_base(global).filter(|_| global.cache_dir.is_some() || storage.is_remote())
}

/// Takes a lock for the rest of the command, reporting stale locks it ignores.
pub(crate) fn lock(repo: &Repository, kind: LockKind) -> Result<Lock> {
    take_lock_beside(repo.storage().clone(), kind, || ()).map(|(lock, ())| lock)
}

fn take_lock_beside<T: Send>(
    storage: Arc<dyn Storage>,
    kind: LockKind,
    beside: impl FnOnce() -> T + Send,
) -> Result<(Lock, T)> {
    let (held, done) = Lock::acquire_beside(storage, kind, beside)?;
    for l in held.stale() {
        let why = l.stale_reason().unwrap_or_default();
        eprintln!("warning: ignoring stale lock {} ({why}); `cairn unlock` removes it", l.path);
    }
    Ok((held, done))
}

/// Opens the repository for reading a snapshot: a shared lock, the index, and the snapshot
/// `SNAPSHOT[:PATH]` names, with the path inside it. The index and snapshot files are listed and
/// fetched beside the lock and the key's round trips (unless a metadata cache holds them), so
/// a remote repository waits two round trips, not six, before the first tree.
pub(crate) fn open_snapshot<'s>(g: &Global, spec: &'s std::ffi::OsStr) -> Result<Opened<'s>> {
    let (name, path) = split_spec(spec)?;
    // The index and the snapshot are loaded while the lock is taken. (The trees are not: their
    // walk belongs to the command, under its watchdog and SIGINT handler.)
    let (repo, lock, (id, snapshot)) = open_locked_then(
        g,
        LockKind::Shared,
        |cached| Preload::snapshot(name, !cached),
        None,
        |repo| {
            repo.load_index()?;
            let (id, snapshot) = repo.find_snapshot(name)?;
            Ok((id, snapshot))
        },
    )?;
    Ok(Opened { repo, _lock: lock, id, snapshot, path })
}

/// What [`open_snapshot`] opened.
pub(crate) struct Opened<'a> {
    pub repo: Repository,
    /// Held until the command ends: bind it (`_lock`); a pattern with `..` drops it at once.
    _lock: Lock,
    pub id: cairn_format::id::SnapshotId,
    pub snapshot: cairn_format::snapshot::Snapshot,
    pub path: Option<&'a std::path::Path>,
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

/// The host, tag and path filters (commands that take snapshot IDs as arguments add these).
#[derive(clap::Args, Debug, Default)]
pub struct FilterArgs {
    /// Only snapshots of this host (repeatable)
    #[arg(long = "host", value_name = "HOST")]
    pub hosts: Vec<String>,
    /// Only snapshots with this tag (repeatable; `a,b` needs both)
    #[arg(long = "tag", value_name = "TAG")]
    pub tags: Vec<String>,
    /// Only snapshots of exactly these paths (repeatable)
    #[arg(long = "path", value_name = "PATH")]
    pub paths: Vec<String>,
}

impl FilterArgs {
    /// The library's filter choosing `ids` (none: every snapshot) narrowed by these filters.
    pub fn filter(&self, ids: &[String]) -> cairn_core::engine::select::SnapshotFilter {
        cairn_core::engine::select::SnapshotFilter {
            ids: ids.to_vec(),
            hosts: self.hosts.clone(),
            tags: self.tags.clone(),
            paths: self.paths.clone(),
        }
    }
}
