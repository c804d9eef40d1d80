//! Opening a repository for a command: the one way every front end (the `cairn` binary, a
//! server, an agent) does it.
//!
//! [`open`] finds the key (trying first the key file that opened this location last time on
//! this machine, and remembering it when it changes), reads ahead what the command will need
//! ([`Preload`]), attaches the metadata cache, and takes the command's lock. The lock's round
//! trips (see that the config exists, write the lock, list the others) run on a thread beside
//! the key's (list the keys and read the config, read a key file, derive the key) instead of
//! after them. If either fails, the lock is removed; where there is no repository, none is
//! written. [`open_then`] also runs the command's first work beside the lock being taken.
//!
//! The front end keeps what is its own: where the password comes from and what it prints.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::cache::Cache;
use crate::engine::lock::{FoundLock, Lock};
use crate::engine::preload::Preload;
use crate::engine::repository::Repository;
use crate::engine::select::SnapshotFilter;
use crate::engine::signal::Signal;
use crate::engine::storage::{
    Faults, FaultyStorage, LimitedStorage, Location, OpendalStorage, RemoteOptions, ServerStorage, Storage,
};
use crate::error::{Error, Result};
use cairn_format::id::SnapshotId;
use cairn_format::layout;
use cairn_format::lock::LockKind;
use cairn_format::snapshot::Snapshot;

/// The storage at `location` (`/path`, `s3:…`, `sftp:…`, `cairn+https://…`). With
/// `CAIRN_INJECT_FAULTS` set (tests and benchmarks, docs/DESIGN.md), the real backend is wrapped
/// in the faults it names; with bandwidth limits in `remote`, that is wrapped in them.
pub fn storage_at(location: &str, remote: &RemoteOptions) -> Result<Arc<dyn Storage>> {
    let location = Location::parse(location)?;
    let storage = match location {
        Location::Server { .. } => with_faults(ServerStorage::open(&location, &remote.server)?)?,
        _ => with_faults(OpendalStorage::open(&location, remote)?)?,
    };
    if remote.limits.is_none() {
        return Ok(storage);
    }
    Ok(Arc::new(LimitedStorage::new(storage, remote.limits)))
}

fn with_faults<S: Storage + 'static>(real: S) -> Result<Arc<dyn Storage>> {
    match std::env::var("CAIRN_INJECT_FAULTS") {
        Ok(spec) if !spec.is_empty() => Ok(Arc::new(FaultyStorage::new(real, Faults::parse(&spec)?))),
        _ => Ok(Arc::new(real)),
    }
}

/// Whether there is a repository in `storage`: [`Error::NoRepository`] where there is neither a
/// config nor a key file, as the open would find (a front end asks before it asks for a
/// password; an open finds it out beside its other round trips).
pub fn ensure_repository(storage: &dyn Storage) -> Result<()> {
    if storage.exists(layout::CONFIG)? {
        return Ok(());
    }
    match storage.list(layout::Dir::Keys.name()) {
        Ok(keys) if !keys.is_empty() => Ok(()),
        Ok(_) | Err(Error::NotFound(_)) => Err(Error::NoRepository(storage.location().to_string())),
        Err(e) => Err(e),
    }
}

/// Where this machine keeps what it learns about repositories (the key file that opened each,
/// the check's record of packs read, the metadata cache), as a front end's options choose it.
#[derive(Clone, Debug, Default)]
pub struct MachineState {
    /// The directory (`None`: nothing is remembered and nothing cached).
    pub dir: Option<PathBuf>,
    /// Cache a local repository's metadata too (the caller named the directory); a remote
    /// repository's is cached whenever there is a directory.
    pub cache_local: bool,
}

impl MachineState {
    /// `dir` if given, else the default cache directory ([`Cache::default_base`]); nothing with
    /// `disabled`. A directory given is used for local repositories' metadata too.
    pub fn new(dir: Option<PathBuf>, disabled: bool) -> Self {
        match (dir, disabled) {
            (_, true) => MachineState::default(),
            (Some(dir), false) => MachineState { dir: Some(dir), cache_local: true },
            (None, false) => MachineState { dir: Cache::default_base(), cache_local: false },
        }
    }

    /// Where the metadata cache for `storage` lives, if there is one.
    pub fn cache_base(&self, storage: &dyn Storage) -> Option<PathBuf> {
        self.dir.clone().filter(|_| self.cache_local || storage.is_remote())
    }
}

/// How to open: what [`open`] and [`open_then`] take besides the storage and the password.
#[derive(Default)]
pub struct OpenOptions<'a> {
    /// The lock the command holds (`None`: none; [`lock`] takes one later).
    pub lock: Option<LockKind>,
    /// What to read ahead beside the key's round trips. Its `fetch_files` and `tree_packs` are
    /// decided here: the files are fetched unless a metadata cache will serve them.
    pub preload: Preload,
    /// The key hint, the metadata cache.
    pub machine: MachineState,
    /// Raised if the lock cannot be taken, for a long [`open_then`] to stop early.
    pub stop: Option<&'a AtomicBool>,
    /// Once raised (a restore raises it when it reads nothing more from the repository), the
    /// lock is let go beside the end of the work instead of after it: [`Held::LetGo`].
    pub release: Option<&'a Signal>,
    /// Told of each stale lock ignored while the lock is taken (a front end warns).
    pub on_stale_lock: Option<&'a (dyn Fn(&FoundLock) + Sync)>,
}

/// What became of the lock an open took.
pub enum Held {
    /// None was asked for.
    None,
    /// Still held: removed when dropped.
    Kept(Lock),
    /// Let go when `release` was raised, this long before the work of [`open_then`] ended.
    LetGo(Duration),
}

/// An opened repository and its lock.
pub struct Opened {
    /// The repository (its index not loaded unless the work of [`open_then`] loaded it).
    pub repo: Repository,
    /// Held until dropped: bind it for as long as the command runs.
    pub lock: Held,
}

/// Opens the repository in `storage` with `password`, as `opts` say.
pub fn open(storage: Arc<dyn Storage>, password: &[u8], opts: OpenOptions<'_>) -> Result<Opened> {
    open_then(storage, password, opts, |_| Ok::<_, Error>(())).map(|(opened, ())| opened)
}

/// [`open`], doing `then` with the opened repository while the lock is still being taken (it may
/// read, not write). Errors come in that order: opening, the lock, then `then`'s. A prune that
/// stored a manifest while the repository was being opened (its index was read ahead) is an
/// error: what was read may be out of date. `then` may fail with an error of the caller's own
/// (a front end's that also holds the library's).
pub fn open_then<T, E: From<Error>>(
    storage: Arc<dyn Storage>,
    password: &[u8],
    opts: OpenOptions<'_>,
    then: impl FnOnce(&Repository) -> std::result::Result<T, E>,
) -> std::result::Result<(Opened, T), E> {
    let OpenOptions { lock: kind, mut preload, machine, stop, release, on_stale_lock } = opts;
    let cache_base = machine.cache_base(&*storage);
    preload.fetch_files = cache_base.is_none();
    if !preload.fetch_files {
        preload.tree_packs = 0;
    }
    let Some(kind) = kind else {
        let repo = open_keyed(storage, password, &preload, &machine)?;
        let done = then(&repo)?;
        return Ok((Opened { repo, lock: Held::None }, done));
    };
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
                    if !storage.exists(layout::CONFIG)? {
                        return Err(Error::NoRepository(storage.location().to_string()));
                    }
                    let manifests = || relist.then(|| storage.list(layout::Dir::Deletions.name()));
                    let (lock, listed) = Lock::acquire_beside(storage.clone(), kind, manifests)?;
                    tell_stale(&lock, on_stale_lock);
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
            .map_err(|e| Error::io("lock", "cannot start a thread", e))?;
        // However `then` ends (a panic included), the lock thread stops waiting for `release`.
        struct Finished<'a>(&'a AtomicBool, Option<&'a Signal>);
        impl Drop for Finished<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
                if let Some(r) = self.1 {
                    r.raise();
                }
            }
        }
        let guard = Finished(&finished, release);
        let opened = open_keyed(storage.clone(), password, &preload, &machine).map(|repo| {
            let done = then(&repo);
            (repo, done)
        });
        drop(guard);
        let ended = Instant::now();
        let held = locking.join().expect("the lock thread panicked").map(|(taken, listed)| match taken {
            Taken::Kept(lock) => (Held::Kept(lock), listed),
            Taken::LetGoAt(at) => (Held::LetGo(ended.saturating_duration_since(at)), listed),
        });
        Ok::<_, Error>((opened, held))
    })?;
    let (repo, done) = opened?;
    let (held, listed) = held?;
    if let (Some(listed), Some(seen)) = (listed, repo.deletions_seen()) {
        let new = listed.iter().filter_map(|p| layout::parse_deletion_path(p)).find(|id| !seen.contains(id));
        if let Some(new) = new {
            return Err(Error::ChangedWhileOpening(layout::deletion_path(&new)).into());
        }
    }
    Ok((Opened { repo, lock: held }, done?))
}

/// Takes a lock of `kind` on an opened repository (after the open, not beside it), telling
/// `on_stale_lock` of each stale lock it ignores.
pub fn lock(repo: &Repository, kind: LockKind, on_stale_lock: Option<&(dyn Fn(&FoundLock) + Sync)>) -> Result<Lock> {
    let lock = Lock::acquire(repo.storage().clone(), kind)?;
    tell_stale(&lock, on_stale_lock);
    Ok(lock)
}

/// A snapshot opened for reading with a shared lock: what [`open_snapshot`] returns.
pub struct OpenedSnapshot {
    /// The repository (its index loaded) and the lock.
    pub opened: Opened,
    /// The snapshot's ID.
    pub id: SnapshotId,
    /// The snapshot.
    pub snapshot: Snapshot,
}

/// Opens the repository for reading the snapshot `name` (`latest` or an ID prefix) as `filter`
/// chooses it ([`SnapshotFilter::find`]): a shared lock, the index, and the snapshot. The index and snapshot files are listed and fetched
/// beside the lock and the key's round trips (unless a metadata cache holds them), so a remote
/// repository waits two round trips, not six, before the first tree. (The trees are not
/// loaded: their walk belongs to the command.) `opts.lock` and `opts.preload` are set here.
pub fn open_snapshot(
    storage: Arc<dyn Storage>,
    password: &[u8],
    name: &str,
    filter: &SnapshotFilter,
    opts: OpenOptions<'_>,
) -> Result<OpenedSnapshot> {
    let opts = OpenOptions { lock: Some(LockKind::Shared), preload: Preload::snapshot(name, true), ..opts };
    let (opened, (id, snapshot)) = open_then(storage, password, opts, |repo| {
        repo.load_index()?;
        filter.find(repo, name)
    })?;
    Ok(OpenedSnapshot { opened, id, snapshot })
}

/// What the lock thread of [`open_then`] did with the lock it took.
enum Taken {
    Kept(Lock),
    /// Let go at this moment.
    LetGoAt(Instant),
}

fn tell_stale(lock: &Lock, on_stale_lock: Option<&(dyn Fn(&FoundLock) + Sync)>) {
    if let Some(tell) = on_stale_lock {
        lock.stale().iter().for_each(tell);
    }
}

/// Opens with `password`, reading ahead what `preload` asks for while the key is found. The key
/// file that opened the repository last time on this machine is tried first (one round trip
/// instead of two), and remembered when it changes; the metadata cache is attached.
fn open_keyed(
    storage: Arc<dyn Storage>,
    password: &[u8],
    preload: &Preload,
    machine: &MachineState,
) -> Result<Repository> {
    let location = storage.location().to_string();
    let hint = machine.dir.as_deref().and_then(|b| crate::engine::cache::key_hint(b, &location));
    let mut repo = Repository::open_preloaded(storage, password, &Preload { key: hint, ..preload.clone() })?;
    if let (Some(base), Some(id)) = (&machine.dir, repo.key_id()) {
        if hint != Some(id) {
            crate::engine::cache::remember_key(base, &location, &id);
        }
    }
    // Sorted index files are kept for local repositories too: they are built, not downloaded.
    if let Some(dir) = machine.dir.as_deref().and_then(|b| crate::engine::sorted_index::dir_in(b, &repo.config().id)) {
        repo.set_index_dir(dir);
    }
    if let Some(base) = machine.cache_base(&**repo.storage()) {
        repo.set_cache(Cache::open(&base, &repo.config().id)?);
    }
    Ok(repo)
}
