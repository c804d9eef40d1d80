//! Repository locks (FORMAT.md §12): backups and restores hold shared locks, repairs an
//! exclusive one. A prune holds a *prune* lock, which excludes other prunes and exclusive locks
//! but not shared ones: it never blocks a backup, and deletes nothing a lock held when it
//! decided still needs (docs/DESIGN.md, "Prune beside backups").
//!
//! A lock is a small JSON object `locks/<random id>`. Taking one writes it first and then lists
//! the others, so of two processes that race, the later one always sees the earlier. A lock is
//! refreshed (rewritten under a new name) while its operation runs; one whose process is gone
//! (same host) or that has not been refreshed for [`STALE_AFTER`] is *stale*: it is reported and
//! ignored, and `cairn unlock` removes it.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use cairn_format::lock::{unix_now, Holder, LockInfo, LockKind, REFRESH_EVERY};

use crate::engine::signal::Signal;
use crate::engine::storage::Storage;
use crate::error::{Error, Result};

/// A lock object found in the repository.
#[derive(Clone, Debug)]
pub struct FoundLock {
    /// Its path (`locks/<id>`).
    pub path: String,
    /// Its content, or why it could not be read.
    pub info: std::result::Result<LockInfo, String>,
}

impl FoundLock {
    /// Why the lock is stale (an unreadable lock is stale: no running Cairn wrote it).
    pub fn stale_reason(&self) -> Option<String> {
        match &self.info {
            Ok(info) => stale_reason(info),
            Err(why) => Some(why.clone()),
        }
    }
}

/// Why a lock is stale, or `None` if its holder may still be running (FORMAT.md §12): its
/// process no longer runs on this host, or it was not refreshed for
/// [`cairn_format::lock::STALE_AFTER`].
pub fn stale_reason(info: &LockInfo) -> Option<String> {
    if info.hostname == crate::engine::platform::hostname() && !process_alive(info.pid) {
        return Some(format!("process {} no longer runs on {}", info.pid, info.hostname));
    }
    let idle = info.idle();
    (idle > cairn_format::lock::STALE_AFTER.as_secs()).then(|| format!("not refreshed for {} minutes", idle / 60))
}

/// Every lock in the repository.
pub fn list(storage: &dyn Storage) -> Result<Vec<FoundLock>> {
    list_others(storage, "")
}

/// Every lock in the repository but the one at `ours` (which is not read).
fn list_others(storage: &dyn Storage, ours: &str) -> Result<Vec<FoundLock>> {
    let mut out = Vec::new();
    for obj in storage.list(cairn_format::layout::Dir::Locks.name())?.into_iter().filter(|o| o.path != ours) {
        let info = match storage.read(&obj.path) {
            Ok(bytes) => LockInfo::parse(&obj.path, &bytes).map_err(|e| e.to_string()),
            // Released between the list and the read.
            Err(Error::NotFound(_)) => continue,
            Err(e) => return Err(e),
        };
        out.push(FoundLock { path: obj.path, info });
    }
    Ok(out)
}

/// Removes stale locks (or, with `all`, every lock); returns what was removed and why.
pub fn remove(storage: &dyn Storage, all: bool) -> Result<Vec<(String, String)>> {
    let mut removed = Vec::new();
    for lock in list(storage)? {
        let why = match (lock.stale_reason(), &lock.info) {
            (Some(why), _) => why,
            (None, Ok(info)) if all => format!("removed on request: {}", info.describe()),
            (None, _) => continue,
        };
        storage.delete(&lock.path)?;
        removed.push((lock.path, why));
    }
    Ok(removed)
}

/// A held lock. Dropping it stops the refresher and removes the lock object.
pub struct Lock {
    storage: Arc<dyn Storage>,
    path: Arc<Mutex<String>>,
    stop: Arc<Signal>,
    refresher: Option<JoinHandle<()>>,
    stale: Vec<FoundLock>,
    holder: Holder,
}

impl Lock {
    /// Takes a lock of `kind`, or fails naming the lock that conflicts. Stale locks do not
    /// conflict; they are returned by [`Lock::stale`] so the caller can report them.
    pub fn acquire(storage: Arc<dyn Storage>, kind: LockKind) -> Result<Lock> {
        Lock::acquire_beside(storage, kind, || ()).map(|(lock, ())| lock)
    }

    /// [`Lock::acquire`], running `beside` once the lock is written, beside the listing of the
    /// others (no round trip more): what it reads, it reads under the lock. A reader that
    /// listed `deletions/` while its lock was being taken lists it again here, so a prune's
    /// manifest stored in between is seen (docs/DESIGN.md, "Prune beside backups").
    pub fn acquire_beside<T: Send>(
        storage: Arc<dyn Storage>,
        kind: LockKind,
        beside: impl FnOnce() -> T + Send,
    ) -> Result<(Lock, T)> {
        let info = LockInfo::new(
            kind,
            crate::engine::platform::hostname(),
            crate::engine::platform::username(),
            std::process::id(),
        );
        let path = write_new(&*storage, &info)?;
        let (others, beside) = std::thread::scope(|s| {
            let beside = s.spawn(beside);
            (list_others(&*storage, &path), beside.join().expect("a lock's companion panicked"))
        });
        let others = match others {
            Ok(all) => all,
            Err(e) => {
                let _ = storage.delete(&path);
                return Err(e);
            }
        };
        let mut stale = Vec::new();
        for other in others {
            if other.stale_reason().is_some() {
                stale.push(other);
                continue;
            }
            let Ok(theirs) = &other.info else { continue };
            if kind.conflicts(theirs.kind()) {
                let _ = storage.delete(&path);
                return Err(Error::Locked {
                    repo: storage.location().to_string(),
                    holder: format!("{} ({})", theirs.describe(), other.path),
                });
            }
        }
        let holder = info.holder();
        let path = Arc::new(Mutex::new(path));
        let stop = Arc::new(Signal::default());
        let refresher = {
            let (storage, path, stop) = (storage.clone(), path.clone(), stop.clone());
            std::thread::Builder::new()
                .name("cairn-lock".into())
                .spawn(move || refresh_until_stopped(&*storage, info, &path, &stop, REFRESH_EVERY))
                .map_err(|e| Error::io("lock refresher", "cannot start a thread", e))?
        };
        Ok((Lock { storage, path, stop, refresher: Some(refresher), stale, holder }, beside))
    }

    /// This lock's holder (to tell it from the others in a listing).
    pub fn holder(&self) -> &Holder {
        &self.holder
    }

    /// Stale locks seen (and ignored) while taking this one.
    pub fn stale(&self) -> &[FoundLock] {
        &self.stale
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        self.stop.raise();
        if let Some(t) = self.refresher.take() {
            let _ = t.join();
        }
        let path = self.path.lock().expect("lock path").clone();
        if let Err(e) = self.storage.delete(&path) {
            tracing::warn!("could not remove {path}: {e}; `cairn unlock` removes it once it is stale");
        }
    }
}

/// Rewrites the lock every `every` under a new name, then removes the old one (a new
/// name rather than an overwrite, because SFTP cannot replace a file atomically).
fn refresh_until_stopped(
    storage: &dyn Storage,
    mut info: LockInfo,
    path: &Mutex<String>,
    stop: &Signal,
    every: Duration,
) {
    while !stop.wait_timeout(every) {
        info.refreshed = unix_now();
        match write_new(storage, &info) {
            Ok(new) => {
                let old = std::mem::replace(&mut *path.lock().expect("lock path"), new);
                let _ = storage.delete(&old);
            }
            Err(e) => tracing::warn!("could not refresh the repository lock: {e}"),
        }
    }
}

fn write_new(storage: &dyn Storage, info: &LockInfo) -> Result<String> {
    let mut id = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut id).expect("OS random numbers");
    let path = cairn_format::layout::lock_path(&hex::encode(id));
    storage.write(&path, info.to_bytes())?;
    Ok(path)
}

fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::storage::OpendalStorage;

    fn storage() -> (tempfile::TempDir, Arc<dyn Storage>) {
        let dir = tempfile::tempdir().unwrap();
        let s = OpendalStorage::local(dir.path().to_str().unwrap()).unwrap();
        (dir, Arc::new(s))
    }

    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    fn plant(s: &dyn Storage, exclusive: bool, pid: u32, refreshed_ago: u64) -> String {
        let t = unix_now() - refreshed_ago;
        let info = LockInfo {
            version: 1,
            exclusive,
            prune: false,
            hostname: crate::engine::platform::hostname(),
            username: "someone".into(),
            pid,
            created: t,
            refreshed: t,
        };
        write_new(s, &info).unwrap()
    }

    #[test]
    fn shared_locks_coexist_and_exclusive_excludes() {
        let (_d, s) = storage();
        let a = Lock::acquire(s.clone(), LockKind::Shared).unwrap();
        let b = Lock::acquire(s.clone(), LockKind::Shared).unwrap();
        let e = Lock::acquire(s.clone(), LockKind::Exclusive).err().expect("exclusive must wait for shared");
        assert!(e.to_string().contains("shared lock of process"), "{e}");
        drop((a, b));
        assert!(s.list("locks").unwrap().is_empty(), "released locks are removed");
        let x = Lock::acquire(s.clone(), LockKind::Exclusive).unwrap();
        let e = Lock::acquire(s.clone(), LockKind::Shared).err().expect("shared must wait for exclusive");
        assert!(e.to_string().contains("exclusive lock of process"), "{e}");
        // The failed attempt left nothing behind.
        assert_eq!(s.list("locks").unwrap().len(), 1);
        drop(x);
    }

    #[test]
    fn a_prune_lock_excludes_prunes_and_exclusive_locks_but_not_backups() {
        let (_d, s) = storage();
        let backup = Lock::acquire(s.clone(), LockKind::Shared).unwrap();
        let prune = Lock::acquire(s.clone(), LockKind::Prune).expect("a prune runs beside a backup");
        let another = Lock::acquire(s.clone(), LockKind::Shared).expect("a backup starts beside a prune");
        let e = Lock::acquire(s.clone(), LockKind::Prune).err().expect("two prunes must not run at once");
        assert!(e.to_string().contains("prune lock of process"), "{e}");
        assert!(Lock::acquire(s.clone(), LockKind::Exclusive).is_err());
        drop((backup, another));
        assert!(Lock::acquire(s.clone(), LockKind::Exclusive).is_err(), "a prune excludes repairs");
        drop(prune);
        let x = Lock::acquire(s.clone(), LockKind::Exclusive).unwrap();
        assert!(Lock::acquire(s.clone(), LockKind::Prune).is_err());
        drop(x);
        // A lock of an older version (no "prune" field) reads as shared.
        let old = br#"{"version":1,"exclusive":false,"hostname":"h","username":"u","pid":1,"created":1,"refreshed":1}"#;
        assert_eq!(serde_json::from_slice::<LockInfo>(old).unwrap().kind(), LockKind::Shared);
    }

    #[test]
    fn stale_locks_are_reported_ignored_and_removed_by_unlock() {
        let (_d, s) = storage();
        let dead = plant(&*s, true, dead_pid(), 0);
        let old = plant(&*s, true, std::process::id(), cairn_format::lock::STALE_AFTER.as_secs() + 120);
        let live = plant(&*s, false, std::process::id(), 0);
        let lock = Lock::acquire(s.clone(), LockKind::Shared).unwrap();
        let mut stale: Vec<_> = lock.stale().iter().map(|l| (l.path.clone(), l.stale_reason().unwrap())).collect();
        stale.sort();
        let mut want = vec![dead.clone(), old.clone()];
        want.sort();
        assert_eq!(stale.iter().map(|s| s.0.clone()).collect::<Vec<_>>(), want);
        assert!(stale.iter().any(|(_, why)| why.contains("no longer runs")), "{stale:?}");
        assert!(stale.iter().any(|(_, why)| why.contains("not refreshed for 32 minutes")), "{stale:?}");
        drop(lock);
        let removed = remove(&*s, false).unwrap();
        assert_eq!(removed.len(), 2);
        let left: Vec<_> = s.list("locks").unwrap().into_iter().map(|o| o.path).collect();
        assert_eq!(left, vec![live.clone()]);
        assert_eq!(remove(&*s, true).unwrap().len(), 1);
        assert!(s.list("locks").unwrap().is_empty());
    }

    #[test]
    fn a_held_lock_is_refreshed_under_a_new_name() {
        let (_d, s) = storage();
        let info = LockInfo {
            version: 1,
            exclusive: false,
            prune: false,
            hostname: "h".into(),
            username: "u".into(),
            pid: 1,
            created: 0,
            refreshed: 0,
        };
        let first = write_new(&*s, &info).unwrap();
        let path = Mutex::new(first.clone());
        let stop = Signal::default();
        std::thread::scope(|scope| {
            let t = scope.spawn(|| refresh_until_stopped(&*s, info.clone(), &path, &stop, Duration::from_millis(20)));
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while *path.lock().unwrap() == first {
                assert!(std::time::Instant::now() < deadline, "the lock was never refreshed");
                std::thread::sleep(Duration::from_millis(5));
            }
            stop.raise();
            t.join().unwrap();
        });
        let locks = list(&*s).unwrap();
        assert_eq!(locks.len(), 1, "the old name is removed after a refresh");
        assert_eq!(locks[0].path, *path.lock().unwrap());
        assert!(locks[0].info.as_ref().unwrap().refreshed > 0);
    }
}
