//! How a user names a snapshot: `latest` or a prefix of its hex ID (any case). The one place
//! that resolves such a name, whether against a listing (opening one snapshot, reading it
//! ahead) or against snapshots already read (a filter).

use crate::error::{Error, Result};
use cairn_format::id::SnapshotId;

/// A snapshot as a user names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotName {
    /// The newest snapshot.
    Latest,
    /// Those whose hex ID starts with this (lower case).
    Prefix(String),
}

impl SnapshotName {
    /// `latest` or an ID prefix, in any case.
    pub fn parse(spec: &str) -> Self {
        let spec = spec.to_ascii_lowercase();
        if spec == "latest" {
            SnapshotName::Latest
        } else {
            SnapshotName::Prefix(spec)
        }
    }

    /// Whether `id` may be the one named: any for `latest` (the newest is picked among them),
    /// else those with the prefix.
    pub fn may_name(&self, id: &SnapshotId) -> bool {
        match self {
            SnapshotName::Latest => true,
            SnapshotName::Prefix(p) => id.to_hex().starts_with(p.as_str()),
        }
    }

    /// The one of `found` (the snapshots this name names): none or several is an error saying
    /// so.
    pub fn the_one<T>(&self, found: Vec<T>) -> Result<T> {
        let n = found.len();
        let mut found = found.into_iter();
        match (found.next(), n) {
            (Some(one), 1) => Ok(one),
            (None, _) => {
                Err(Error::SnapshotSelect(format!("no snapshot matches {:?}; see `cairn snapshots`", self.text())))
            }
            _ => Err(Error::SnapshotSelect(format!("{:?} matches {n} snapshots; give more of the ID", self.text()))),
        }
    }

    /// The name as given (lower case).
    pub fn text(&self) -> &str {
        match self {
            SnapshotName::Latest => "latest",
            SnapshotName::Prefix(p) => p,
        }
    }
}
