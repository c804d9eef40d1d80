//! Changing the tags of snapshots. A snapshot file is named by the hash of its content, so a
//! changed snapshot is a new file: it is written first and the old one deleted after, so a
//! reader at any moment finds one of the two (FORMAT.md §10; the snapshot's other fields stay
//! as they were).

use crate::engine::repository::Repository;
use crate::error::{Error, Result};
use cairn_format::id::SnapshotId;
use cairn_format::layout::snapshot_path;
use cairn_format::snapshot::Snapshot;

/// How tags change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TagChange {
    /// Replace every tag with these (none: remove all tags).
    Set(Vec<String>),
    /// Add some tags and remove others.
    Edit {
        /// Tags to add (those already there stay where they are).
        add: Vec<String>,
        /// Tags to remove.
        remove: Vec<String>,
    },
}

impl TagChange {
    /// An edit; a tag both added and removed is an error.
    pub fn edit(add: Vec<String>, remove: Vec<String>) -> Result<TagChange> {
        if let Some(t) = add.iter().find(|t| remove.contains(t)) {
            return Err(Error::Usage(format!("tag {t:?} is both added and removed; give it once")));
        }
        Ok(TagChange::Edit { add, remove })
    }

    /// The tags `tags` become, or `None` when they stay the same set (order aside).
    pub fn apply(&self, tags: &[String]) -> Option<Vec<String>> {
        let new: Vec<String> = match self {
            TagChange::Set(set) => dedup(set.iter()),
            TagChange::Edit { add, remove } => dedup(tags.iter().filter(|t| !remove.contains(t)).chain(add)),
        };
        let sorted = |v: &[String]| {
            let mut v = v.to_vec();
            v.sort_unstable();
            v.dedup();
            v
        };
        (sorted(&new) != sorted(tags)).then_some(new)
    }
}

/// `tags` in order without repeats or empty names.
fn dedup<'a>(tags: impl Iterator<Item = &'a String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for t in tags {
        if !t.is_empty() && !out.contains(t) {
            out.push(t.clone());
        }
    }
    out
}

/// A snapshot whose tags changed.
#[derive(Clone, Debug)]
pub struct Retagged {
    /// The snapshot as it was (its file is gone).
    pub old: SnapshotId,
    /// The new snapshot file.
    pub new: SnapshotId,
    /// Its tags.
    pub tags: Vec<String>,
}

/// Changes the tags of `snaps`: each snapshot whose tags change is written anew and its old
/// file then deleted; the others are left alone.
pub fn retag(repo: &Repository, snaps: &[(SnapshotId, Snapshot)], change: &TagChange) -> Result<Vec<Retagged>> {
    let mut done = Vec::new();
    for (old, snap) in snaps {
        let Some(tags) = change.apply(&snap.tags) else { continue };
        let new = repo.save_snapshot(&Snapshot { tags: tags.clone(), ..snap.clone() })?;
        repo.storage().delete(&snapshot_path(old))?;
        done.push(Retagged { old: *old, new, tags });
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(tags: &[&str]) -> Vec<String> {
        tags.iter().map(|t| t.to_string()).collect()
    }

    #[test]
    fn edits_keep_order_and_report_no_change() {
        let edit = TagChange::edit(v(&["c", "a"]), v(&["b"])).unwrap();
        assert_eq!(edit.apply(&v(&["a", "b"])), Some(v(&["a", "c"])));
        assert_eq!(edit.apply(&v(&["a", "c"])), None);
        assert_eq!(TagChange::Set(v(&["b", "a", "b"])).apply(&v(&["x"])), Some(v(&["b", "a"])));
        assert_eq!(TagChange::Set(v(&["b", "a"])).apply(&v(&["a", "b"])), None);
        assert_eq!(TagChange::Set(v(&[])).apply(&v(&["a"])), Some(v(&[])));
        assert_eq!(TagChange::Set(v(&[])).apply(&v(&[])), None);
        let both = TagChange::edit(v(&["a"]), v(&["a"])).unwrap_err().to_string();
        assert!(both.contains("\"a\" is both added and removed"), "{both}");
    }
}
