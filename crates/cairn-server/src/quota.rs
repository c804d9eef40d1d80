//! Per-repository quotas (FORMAT.md §15): how many bytes of objects a repository may hold
//! before the server refuses new ones with 507 and one line saying what to do.
//!
//! A repository's use is the sum of its objects' sizes, listed from the storage at most every
//! [`RECOUNT_AFTER`] (so space freed by a prune, or written by another server in front of the
//! same bucket, is seen within that time) plus what this server stored since. Locks, start
//! hints and deletion manifests are not counted against it (a client must always be able to
//! take a lock; deletion manifests are a prune's), nor is anything an admin token writes: a
//! prune, which frees space, must work on a full repository.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use cairn_core::engine::platform::format_size;
use cairn_core::engine::storage::Storage;
use cairn_format::protocol::Kind;

use crate::tokens::Role;

/// How long a listed use is trusted before the repository is listed again.
pub const RECOUNT_AFTER: Duration = Duration::from_secs(60);

/// The directories whose objects count against a quota (FORMAT.md §1): the history.
const COUNTED: [&str; 4] = ["data", "index", "snapshots", "keys"];

/// The quotas `cairn serve` was started with.
#[derive(Clone, Debug, Default)]
pub struct Quotas {
    /// For every repository without its own.
    pub default: Option<u64>,
    /// Per repository name.
    pub per_repo: HashMap<String, u64>,
}

impl Quotas {
    /// Adds one `--quota` value: `SIZE` (every repository) or `NAME=SIZE` (size as in
    /// `--pack-size`: a number with K, M, G or T).
    pub fn add(&mut self, spec: &str) -> Result<()> {
        let (name, size) = match spec.split_once('=') {
            Some((name, size)) => (Some(name.trim()), size),
            None => (None, spec),
        };
        let bytes = cairn_core::engine::platform::parse_size(size)
            .map_err(|_| anyhow::anyhow!("--quota {spec}: give SIZE or NAME=SIZE, a size like 500G or 2T"))?;
        match name {
            Some("") => bail!("--quota {spec}: the repository name before `=` is empty"),
            Some(n) => {
                self.per_repo.insert(n.to_string(), bytes);
            }
            None => self.default = Some(bytes),
        }
        Ok(())
    }

    /// The quota of repository `name`, if it has one.
    pub fn of(&self, name: &str) -> Option<u64> {
        self.per_repo.get(name).copied().or(self.default)
    }

    /// Whether a write of `kind` by `role` counts against a quota.
    pub fn counts(role: Role, kind: Kind) -> bool {
        role != Role::Admin && !matches!(kind, Kind::Lock | Kind::Hint | Kind::Deletion)
    }
}

/// What the server knows of each repository's use.
#[derive(Default)]
pub struct Usage {
    repos: Mutex<HashMap<String, Counted>>,
}

struct Counted {
    /// Listed, plus what this server stored since.
    bytes: u64,
    /// Announced by uploads in flight.
    reserved: u64,
    at: Instant,
}

impl Usage {
    /// Reserves `adding` bytes (the announced length of an upload) of repository `name`'s
    /// `quota`: the bytes the upload may bring at most (what is left of the quota, so a body
    /// without a length cannot pass it either), or the line to answer with if it would pass
    /// the quota. Lists the repository (blocking) if its count is old. Every reservation is
    /// [`Usage::settle`]d when its upload ends, so uploads in flight at once cannot together
    /// pass the quota.
    pub fn reserve(
        &self,
        name: &str,
        storage: &dyn Storage,
        quota: u64,
        adding: u64,
    ) -> cairn_core::Result<Result<u64, String>> {
        self.recount_if_old(name, storage)?;
        let mut repos = self.repos.lock().unwrap_or_else(|p| p.into_inner());
        let counted = repos.get_mut(name).expect("counted above");
        let used = counted.bytes.saturating_add(counted.reserved);
        if used.saturating_add(adding) > quota {
            return Ok(Err(over_quota(name, quota, used, adding)));
        }
        counted.reserved += adding;
        Ok(Ok(quota - used))
    }

    /// Ends a reservation of `reserved` bytes: the upload stored `stored` bytes (none if it
    /// failed).
    pub fn settle(&self, name: &str, reserved: u64, stored: u64) {
        if let Some(c) = self.repos.lock().unwrap_or_else(|p| p.into_inner()).get_mut(name) {
            c.reserved = c.reserved.saturating_sub(reserved);
            c.bytes = c.bytes.saturating_add(stored);
        }
    }

    /// Lists repository `name` again if its count is older than [`RECOUNT_AFTER`] (or missing).
    /// Reservations of uploads still in flight are kept.
    fn recount_if_old(&self, name: &str, storage: &dyn Storage) -> cairn_core::Result<()> {
        if let Some(c) = self.repos.lock().unwrap_or_else(|p| p.into_inner()).get(name) {
            if c.at.elapsed() < RECOUNT_AFTER {
                return Ok(());
            }
        }
        let mut bytes = 0;
        for dir in COUNTED {
            bytes += storage.list(dir)?.iter().map(|o| o.size).sum::<u64>();
        }
        let mut repos = self.repos.lock().unwrap_or_else(|p| p.into_inner());
        let reserved = repos.get(name).map_or(0, |c| c.reserved);
        repos.insert(name.to_string(), Counted { bytes, reserved, at: Instant::now() });
        Ok(())
    }
}

/// The line a write over repository `name`'s quota is refused with.
pub fn over_quota(name: &str, quota: u64, used: u64, adding: u64) -> String {
    format!(
        "repository {name} is over its quota of {} ({} used, {} more refused): nothing was stored; ask the \
         server's admin for a larger quota, or forget and prune old snapshots with an admin token",
        format_size(quota),
        format_size(used),
        format_size(adding)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_flags_parse_and_name_their_mistakes() {
        let mut q = Quotas::default();
        q.add("1T").unwrap();
        q.add("laptop=500G").unwrap();
        assert_eq!(q.of("laptop"), Some(500 << 30));
        assert_eq!(q.of("other"), Some(1 << 40));
        assert!(q.add("laptop=lots").unwrap_err().to_string().contains("give SIZE or NAME=SIZE"));
        assert!(q.add("=5G").unwrap_err().to_string().contains("name before `=` is empty"));
        assert_eq!(Quotas::default().of("x"), None);
    }

    #[test]
    fn only_history_written_by_hosts_counts() {
        assert!(Quotas::counts(Role::Append, Kind::Pack));
        assert!(!Quotas::counts(Role::Append, Kind::Lock));
        assert!(!Quotas::counts(Role::Admin, Kind::Pack));
    }
}
