//! `repair unreadable`: remove the snapshots, key files, start hint and deletion manifests that
//! cannot be read — planted by a host that may only add objects, or damaged on storage. Every
//! command already skips them with a warning ([`crate::engine::unreadable`]); this ends the
//! warnings. Index files are `repair index`'s: it rebuilds the index without them, from the
//! packs' headers. Only what cannot be read is removed, and only by credentials that may delete:
//! anything else is refused before a byte changes.

use crate::engine::repository::Repository;
use crate::error::{Error, Result};
use cairn_format::layout::{self, Dir};

/// What `repair unreadable` found (and removed, unless a dry run).
#[derive(Debug, Default)]
pub struct UnreadableRepair {
    /// Each object that cannot be read, with why.
    pub objects: Vec<(String, String)>,
    /// Whether they were removed (false for a dry run).
    pub removed: bool,
}

/// Finds every snapshot, key file, deletion manifest and start hint of `repo` that cannot be
/// read, and removes them unless `dry_run`. The caller holds the exclusive lock.
pub fn repair_unreadable(repo: &Repository, dry_run: bool) -> Result<UnreadableRepair> {
    let mut objects = Vec::new();
    let (_, snapshots) = repo.read_snapshots()?;
    objects.extend(snapshots.into_iter().filter(|(_, e)| e.is_damage()).map(|(p, e)| (p, e.to_string())));
    for (path, key) in repo.key_files(8)? {
        if let Err(e) = key.and_then(|k| {
            layout::parse_key_path(&path).ok_or_else(|| Error::corrupt(&path, "file name is not a key file ID"))?;
            Ok(k)
        }) {
            if e.is_damage() {
                objects.push((path, e.to_string()));
            }
        }
    }
    for (id, d) in repo.deletions()? {
        if let Err(e) = d {
            if e.is_damage() {
                objects.push((layout::deletion_path(&id), e.to_string()));
            }
        }
    }
    if let Some(why) = repo.hint_damage() {
        objects.push((cairn_format::hint::PATH.to_string(), why.to_string()));
    }
    objects.sort();
    if dry_run {
        return Ok(UnreadableRepair { objects, removed: false });
    }
    // Refused the same way whether or not there is anything to remove.
    may_delete(repo, Dir::Snapshots)?;
    for (path, _) in &objects {
        repo.storage().delete(path)?;
    }
    Ok(UnreadableRepair { objects, removed: true })
}

/// Refuses, before anything is written, credentials that may not delete in `dir` (a host's
/// append token through `cairn serve`): asks to delete a name no object has (a deletion of a
/// missing object succeeds where deleting is allowed, FORMAT.md §15.1).
pub fn may_delete(repo: &Repository, dir: Dir) -> Result<()> {
    let probe = format!("{}/{}", dir.name(), "0".repeat(64));
    match repo.storage().delete(&probe) {
        Ok(()) | Err(Error::NotFound(_)) => Ok(()),
        Err(e) => Err(Error::Refused(format!(
            "the storage refused a deletion ({e}): a repair removes objects, which needs credentials that may \
             delete (through `cairn serve`, an admin token); nothing was changed"
        ))),
    }
}
