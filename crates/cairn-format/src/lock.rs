//! Lock objects (FORMAT.md §12): `locks/<random id>`, a small JSON object naming the holding
//! process and its kind. How locks are taken, refreshed and found stale is `cairn-core`'s
//! `engine::lock`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How often a held lock is rewritten.
pub const REFRESH_EVERY: Duration = Duration::from_secs(5 * 60);
/// A lock not refreshed for this long belongs to a process that is gone or cut off.
pub const STALE_AFTER: Duration = Duration::from_secs(30 * 60);

/// Shared (backup, restore), prune, or exclusive (repairs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    /// Many holders at once; excludes only exclusive locks.
    Shared,
    /// One prune at a time beside any number of shared locks; excludes other prune locks and
    /// exclusive locks.
    Prune,
    /// One holder; excludes every other lock.
    Exclusive,
}

impl LockKind {
    /// Whether a lock of this kind may not be held beside one of `other`'s.
    pub fn conflicts(self, other: LockKind) -> bool {
        use LockKind::*;
        matches!((self, other), (Exclusive, _) | (_, Exclusive) | (Prune, Prune))
    }
}

/// The content of a lock object.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct LockInfo {
    /// Format of this object: 1.
    pub version: u32,
    /// Whether the lock is exclusive.
    pub exclusive: bool,
    /// Whether the lock is a prune's (absent in locks of older versions: false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prune: bool,
    /// Host of the holding process.
    pub hostname: String,
    /// User of the holding process.
    pub username: String,
    /// Process ID of the holder (meaningful on `hostname` only).
    pub pid: u32,
    /// When the lock was first taken (Unix seconds).
    pub created: u64,
    /// When it was last rewritten (Unix seconds).
    pub refreshed: u64,
}

impl LockInfo {
    /// The kind of lock this is.
    pub fn kind(&self) -> LockKind {
        match (self.exclusive, self.prune) {
            (true, _) => LockKind::Exclusive,
            (false, true) => LockKind::Prune,
            (false, false) => LockKind::Shared,
        }
    }

    /// Who holds the lock: the same across refreshes (which rename the lock object).
    pub fn holder(&self) -> Holder {
        Holder { hostname: self.hostname.clone(), pid: self.pid, created: self.created }
    }

    /// E.g. "shared lock of process 42 (alice@host), taken 10s ago".
    pub fn describe(&self) -> String {
        let kind = match self.kind() {
            LockKind::Exclusive => "exclusive",
            LockKind::Prune => "prune",
            LockKind::Shared => "shared",
        };
        format!(
            "{kind} lock of process {} ({}@{}), taken {}s ago",
            self.pid,
            self.username,
            self.hostname,
            age(self.created)
        )
    }
}

/// The process holding a lock, which stays the same when the lock is refreshed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Holder {
    /// Its host.
    pub hostname: String,
    /// Its process ID on that host.
    pub pid: u32,
    /// When it took the lock (Unix seconds).
    pub created: u64,
}

impl LockInfo {
    /// A lock taken now by `hostname`/`username`'s process `pid`.
    pub fn new(kind: LockKind, hostname: String, username: String, pid: u32) -> Self {
        let now = unix_now();
        LockInfo {
            version: 1,
            exclusive: kind == LockKind::Exclusive,
            prune: kind == LockKind::Prune,
            hostname,
            username,
            pid,
            created: now,
            refreshed: now,
        }
    }

    /// Parses a lock object; `name` is its path, for errors.
    pub fn parse(name: &str, bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes).map_err(|e| Error::corrupt(name, format!("unreadable lock: {e}")))
    }

    /// The object's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a lock serializes")
    }

    /// Seconds since the lock was last rewritten.
    pub fn idle(&self) -> u64 {
        age(self.refreshed)
    }
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn age(t: u64) -> u64 {
    unix_now().saturating_sub(t)
}
