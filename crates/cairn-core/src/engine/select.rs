//! Choosing snapshots: by ID (or `latest`), host, tag and path — the filters every command that
//! works on several snapshots shares (check, repair, and the lifecycle commands to come).

use crate::engine::repository::Repository;
use crate::engine::snapshot_name::SnapshotName;
use crate::error::Result;
use cairn_format::id::SnapshotId;
use cairn_format::snapshot::Snapshot;

/// Which snapshots a command works on. Empty lists select everything; IDs (or `latest`) select
/// those snapshots, and the other filters then narrow them.
#[derive(Clone, Debug, Default)]
pub struct SnapshotFilter {
    /// Unique ID prefixes, or `latest`.
    pub ids: Vec<String>,
    /// Snapshots of any of these hosts.
    pub hosts: Vec<String>,
    /// Snapshots with any of these tags (`a,b` in one entry: with both).
    pub tags: Vec<String>,
    /// Snapshots that backed up exactly these paths (any order).
    pub paths: Vec<String>,
}

impl SnapshotFilter {
    /// Whether the filter selects every snapshot.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty() && self.hosts.is_empty() && self.tags.is_empty() && self.paths.is_empty()
    }

    /// Whether `snap` passes the host, tag and path filters.
    pub fn matches(&self, snap: &Snapshot) -> bool {
        let host = self.hosts.is_empty() || self.hosts.contains(&snap.hostname);
        let tag = self.tags.is_empty()
            || self
                .tags
                .iter()
                .any(|set| set.split(',').filter(|t| !t.is_empty()).all(|t| snap.tags.iter().any(|s| s == t)));
        let path = self.paths.is_empty() || {
            let mut want: Vec<&str> = self.paths.iter().map(|p| p.trim_end_matches('/')).collect();
            let mut have: Vec<&str> = snap.paths.iter().map(|p| p.trim_end_matches('/')).collect();
            want.sort_unstable();
            have.sort_unstable();
            want == have
        };
        host && tag && path
    }

    /// The selected snapshots, oldest first (every snapshot must be readable).
    pub fn select(&self, repo: &Repository) -> Result<Vec<(SnapshotId, Snapshot)>> {
        self.choose(repo.snapshots()?)
    }

    /// The snapshots of `all` (oldest first) the filter selects, oldest first.
    pub fn choose(&self, all: Vec<(SnapshotId, Snapshot)>) -> Result<Vec<(SnapshotId, Snapshot)>> {
        if self.ids.is_empty() {
            return Ok(all.into_iter().filter(|(_, s)| self.matches(s)).collect());
        }
        let mut chosen: Vec<(SnapshotId, Snapshot)> = Vec::new();
        for spec in &self.ids {
            let name = SnapshotName::parse(spec);
            let found: Vec<&(SnapshotId, Snapshot)> = match name {
                SnapshotName::Latest => all.last().into_iter().collect(),
                SnapshotName::Prefix(_) => all.iter().filter(|(id, _)| name.may_name(id)).collect(),
            };
            let one = name.the_one(found)?;
            if !chosen.iter().any(|(id, _)| *id == one.0) {
                chosen.push(one.clone());
            }
        }
        chosen.sort_by(|a, b| a.1.time.cmp(&b.1.time).then(a.0.cmp(&b.0)));
        Ok(chosen.into_iter().filter(|(_, s)| self.matches(s)).collect())
    }
}
