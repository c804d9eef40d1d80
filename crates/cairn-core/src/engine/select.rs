//! Choosing snapshots: by ID (or `latest`), host, tag, path and the token that stored them — the
//! filters every command that takes snapshots shares, whether it works on one (`restore`, `dump`,
//! `ls`, `nbd`, `diff`: [`SnapshotFilter::find`]) or on several (`snapshots`, `forget`, `check`,
//! `find`, `mount`, `copy`, …: [`SnapshotFilter::select`]).

use std::path::Path;

use crate::engine::repository::Repository;
use crate::engine::snapshot_name::SnapshotName;
use crate::engine::storage::Provenance;
use crate::error::{Error, Result};
use cairn_format::id::{BlobId, SnapshotId};
use cairn_format::snapshot::Snapshot;

/// How many of the newest snapshots are searched for a path that `latest` lacks, to name the
/// newest that holds it.
pub const HOLDER_SEARCH: usize = 200;

/// Which snapshots a command works on. Empty lists select everything; IDs (or `latest`) select
/// those snapshots, and the other filters then narrow them (`latest` is the newest snapshot
/// that passes them).
#[derive(Clone, Debug, Default)]
pub struct SnapshotFilter {
    /// Unique ID prefixes, or `latest`.
    pub ids: Vec<String>,
    /// Snapshots of any of these hosts.
    pub hosts: Vec<String>,
    /// Snapshots with any of these tag lists ([`split_tags`]: `a,b` is a snapshot with both; an
    /// empty list, a snapshot without tags).
    pub tags: Vec<String>,
    /// Snapshots that backed up exactly these paths (any order).
    pub paths: Vec<String>,
    /// Snapshots that a `cairn serve` server recorded as stored by one of these tokens (by
    /// name, FORMAT.md §15.4). Refused where no server keeps that record.
    pub stored_by: Vec<String>,
}

/// The tags of one option value: `a,b` is the tags `a` and `b`, as restic reads it; `\,` is a
/// comma inside a tag (`a\,b` is the one tag `a,b`). Empty tags are dropped.
pub fn split_tags(list: &str) -> Vec<String> {
    let mut tags = vec![String::new()];
    let mut chars = list.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&',') => {
                tags.last_mut().expect("one tag at least").push(chars.next().expect("peeked"))
            }
            ',' => tags.push(String::new()),
            c => tags.last_mut().expect("one tag at least").push(c),
        }
    }
    tags.retain(|t| !t.is_empty());
    tags
}

/// Whether `snap` has every tag of the list `list` ([`split_tags`]); an empty list: whether it
/// has no tags.
pub fn has_tags(snap: &Snapshot, list: &str) -> bool {
    let wanted = split_tags(list);
    if wanted.is_empty() {
        return snap.tags.is_empty();
    }
    wanted.iter().all(|t| snap.tags.contains(t))
}

impl SnapshotFilter {
    /// Whether the filter selects every snapshot.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty() && self.narrows_nothing()
    }

    /// Whether the host, tag, path and token filters are all empty.
    fn narrows_nothing(&self) -> bool {
        self.hosts.is_empty() && self.tags.is_empty() && self.paths.is_empty() && self.stored_by.is_empty()
    }

    /// Whether snapshot `id`, `snap` passes the host, tag, path and token filters (`provenance`:
    /// who stored each snapshot).
    pub fn matches(&self, id: &SnapshotId, snap: &Snapshot, provenance: &Provenance) -> bool {
        self.mismatch(id, snap, provenance).is_none()
    }

    /// Why snapshot `id`, `snap` does not pass the filters (the first it fails), if it does not.
    fn mismatch(&self, id: &SnapshotId, snap: &Snapshot, provenance: &Provenance) -> Option<String> {
        if !self.hosts.is_empty() && !self.hosts.contains(&snap.hostname) {
            return Some(format!("its host is {:?}", snap.hostname));
        }
        if !self.tags.is_empty() && !self.tags.iter().any(|list| has_tags(snap, list)) {
            return Some(match snap.tags.is_empty() {
                true => "it has no tags".to_string(),
                false => format!("its tags are {}", snap.tags.join(", ")),
            });
        }
        if !self.paths.is_empty() {
            let mut want: Vec<&str> = self.paths.iter().map(|p| p.trim_end_matches('/')).collect();
            let mut have: Vec<&str> = snap.paths.iter().map(|p| p.trim_end_matches('/')).collect();
            want.sort_unstable();
            have.sort_unstable();
            if want != have {
                return Some(format!("its paths are {}", snap.paths.join(", ")));
            }
        }
        if !self.stored_by.is_empty() {
            match provenance.stored_by(id) {
                Some(token) if self.stored_by.iter().any(|t| t == token) => {}
                Some(token) => return Some(format!("token {token:?} stored it")),
                None => return Some("the server has no record of who stored it".to_string()),
            }
        }
        None
    }

    /// The filters in words, for messages: `of host "laptop", with tag postgres, stored by
    /// token "laptop-append"`.
    fn describe(&self) -> String {
        let any = |what: &str, list: &[String]| -> Option<String> {
            (!list.is_empty()).then(|| {
                let quoted: Vec<String> = list.iter().map(|v| format!("{v:?}")).collect();
                format!("{what} {}", quoted.join(" or "))
            })
        };
        [
            any("of host", &self.hosts),
            any("with tags", &self.tags),
            any("of paths", &self.paths),
            any("stored by token", &self.stored_by),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(", ")
    }

    /// Who stored the snapshots of `repo`, as of its last listing of them; with a token filter,
    /// an error where no record exists (not a `cairn serve` repository, or a server that keeps
    /// none).
    pub fn provenance(&self, repo: &Repository) -> Result<Provenance> {
        let provenance = repo.storage().provenance();
        if self.stored_by.is_empty() {
            return Ok(provenance);
        }
        let location = repo.storage().location();
        match provenance {
            Provenance::NotServed => Err(Error::Usage(format!(
                "--stored-by: {location} is not behind `cairn serve`, and only a server records which token stored \
                 each snapshot: leave out --stored-by"
            ))),
            Provenance::NotRecorded => Err(Error::Usage(format!(
                "--stored-by: the server of {location} does not record which token stored each snapshot: upgrade it \
                 to cairn {} or later",
                env!("CARGO_PKG_VERSION")
            ))),
            recorded => Ok(recorded),
        }
    }

    /// The selected snapshots of `repo`, oldest first (every snapshot must be readable).
    pub fn select(&self, repo: &Repository) -> Result<Vec<(SnapshotId, Snapshot)>> {
        let all = repo.snapshots()?;
        self.choose(all, &self.provenance(repo)?)
    }

    /// The snapshots of `all` (oldest first) the filter selects, oldest first; `provenance` says
    /// who stored each ([`SnapshotFilter::provenance`]).
    pub fn choose(
        &self,
        all: Vec<(SnapshotId, Snapshot)>,
        provenance: &Provenance,
    ) -> Result<Vec<(SnapshotId, Snapshot)>> {
        let passes = |(id, s): &&(SnapshotId, Snapshot)| self.matches(id, s, provenance);
        if self.ids.is_empty() {
            return Ok(all.iter().filter(passes).cloned().collect());
        }
        let mut chosen: Vec<(SnapshotId, Snapshot)> = Vec::new();
        for spec in &self.ids {
            let name = SnapshotName::parse(spec);
            let one = match name {
                SnapshotName::Latest => self.newest(&all, provenance)?,
                SnapshotName::Prefix(_) => {
                    let found: Vec<&(SnapshotId, Snapshot)> = all.iter().filter(|(id, _)| name.may_name(id)).collect();
                    let one = name.the_one(found)?;
                    if !passes(&one) {
                        continue;
                    }
                    one
                }
            };
            if !chosen.iter().any(|(id, _)| *id == one.0) {
                chosen.push(one.clone());
            }
        }
        chosen.sort_by(|a, b| a.1.time.cmp(&b.1.time).then(a.0.cmp(&b.0)));
        Ok(chosen)
    }

    /// The newest of `all` (oldest first) that passes the filters: what `latest` names.
    fn newest<'a>(
        &self,
        all: &'a [(SnapshotId, Snapshot)],
        provenance: &Provenance,
    ) -> Result<&'a (SnapshotId, Snapshot)> {
        all.iter().rev().find(|(id, s)| self.matches(id, s, provenance)).ok_or_else(|| {
            Error::SnapshotSelect(match (all.len(), self.narrows_nothing()) {
                (0, _) => "the repository has no snapshots".to_string(),
                (_, true) => "no snapshot matches \"latest\"".to_string(),
                (n, false) => format!(
                    "no snapshot {} for \"latest\" ({n} snapshot{} in the repository; `cairn snapshots` lists them)",
                    self.describe(),
                    if n == 1 { "" } else { "s" }
                ),
            })
        })
    }

    /// The one snapshot `name` (`latest` or an ID prefix) names, as a command that works on one
    /// snapshot chooses it: `latest` is the newest snapshot that passes the host, tag, path and
    /// token filters; a snapshot named by ID must pass them too. (`ids` is not used.)
    pub fn find(&self, repo: &Repository, name: &str) -> Result<(SnapshotId, Snapshot)> {
        if self.narrows_nothing() {
            return repo.find_snapshot(name);
        }
        if SnapshotName::parse(name) == SnapshotName::Latest {
            let all = repo.snapshots()?;
            let provenance = self.provenance(repo)?;
            return self.newest(&all, &provenance).cloned();
        }
        let (id, snap) = repo.find_snapshot(name)?;
        match self.mismatch(&id, &snap, &self.provenance(repo)?) {
            None => Ok((id, snap)),
            Some(why) => {
                Err(Error::SnapshotSelect(format!("snapshot {} is not one {}: {why}", id.short(), self.describe())))
            }
        }
    }

    /// `e`, saying more when it is a path not found in the snapshot `latest` chose (`name` is how
    /// the command named its snapshot): which snapshot that was, and the newest snapshot that
    /// holds the path (searched among the [`HOLDER_SEARCH`] newest), so the user can name it or
    /// narrow `latest` to it. `repo`'s index must be loaded.
    pub fn explain_not_found(&self, repo: &Repository, name: &str, e: Error) -> Error {
        match e {
            Error::PathNotFound { path, snapshot, note } if note.is_empty() && name.eq_ignore_ascii_case("latest") => {
                let note = repo.snapshots().map(|all| holder_note(repo, &all, &path, &snapshot)).unwrap_or_default();
                Error::PathNotFound { path, snapshot, note }
            }
            e => e,
        }
    }
}

/// What [`SnapshotFilter::explain_not_found`] adds: `, which "latest" chose (…); the newest
/// snapshot that holds it is …`.
fn holder_note(repo: &Repository, all: &[(SnapshotId, Snapshot)], path: &str, latest: &str) -> String {
    let Some((_, chosen)) = all.iter().find(|(id, _)| id.short() == latest) else { return String::new() };
    let mut searched: Vec<BlobId> = Vec::new();
    let holder = all.iter().rev().filter(|(id, _)| id.short() != latest).take(HOLDER_SEARCH).find(|(id, s)| {
        // Snapshots of an unchanged tree hold the same paths: each tree is looked in once.
        if searched.contains(&s.tree) {
            return false;
        }
        searched.push(s.tree);
        matches!(crate::engine::trees::resolve(repo, &s.tree, Path::new(path), &id.short()), Ok(Some(_)))
    });
    let holder = match holder {
        Some((id, s)) => format!(
            "the newest snapshot that holds it is {} ({}): name it, or narrow \"latest\" with --host, --tag, --path or \
             --stored-by",
            id.short(),
            described(s)
        ),
        None => format!("none of the {} newest snapshots holds it either", searched.len().min(HOLDER_SEARCH)),
    };
    format!(", which \"latest\" chose ({}); {holder}", described(chosen))
}

/// A snapshot in a few words: `host db, tags postgres, 2024-05-01 03:00:00`.
fn described(s: &Snapshot) -> String {
    let mut words = vec![format!("host {}", s.hostname)];
    if !s.tags.is_empty() {
        words.push(format!("tags {}", s.tags.join(",")));
    }
    words.push(crate::engine::platform::format_local(s.time));
    words.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_lists_split_on_commas_and_keep_escaped_ones() {
        assert_eq!(split_tags("a,b"), ["a", "b"]);
        assert_eq!(split_tags("a"), ["a"]);
        assert_eq!(split_tags(",a,,b,"), ["a", "b"]);
        assert_eq!(split_tags(r"a\,b"), ["a,b"]);
        assert_eq!(split_tags(r"a\,b,c"), ["a,b", "c"]);
        assert_eq!(split_tags(r"a\b"), [r"a\b"]);
        assert!(split_tags("").is_empty());
    }

    fn snap(host: &str, tags: &[&str], secs: i64) -> Snapshot {
        Snapshot {
            time: cairn_format::tree::Timestamp { secs, nanos: 0 },
            tree: BlobId::hash_of(host.as_bytes()),
            paths: vec!["/x".into()],
            hostname: host.into(),
            username: "user".into(),
            uid: 0,
            gid: 0,
            tags: tags.iter().map(|t| t.to_string()).collect(),
            parent: None,
            program_version: "test".into(),
            summary: Default::default(),
            original: None,
        }
    }

    #[test]
    fn latest_is_the_newest_that_passes_the_filters() {
        let all: Vec<(SnapshotId, Snapshot)> =
            [("db", &["postgres"][..], 1), ("vm", &[][..], 2), ("db", &["other"][..], 3)]
                .iter()
                .map(|(h, t, s)| (SnapshotId::hash_of(format!("{h}{s}").as_bytes()), snap(h, t, *s)))
                .collect();
        let none = Provenance::NotServed;
        let latest = |f: SnapshotFilter| SnapshotFilter { ids: vec!["latest".into()], ..f }.choose(all.clone(), &none);
        assert_eq!(latest(SnapshotFilter::default()).unwrap()[0].1.time.secs, 3);
        let tagged = SnapshotFilter { tags: vec!["postgres".into()], ..Default::default() };
        assert_eq!(latest(tagged).unwrap()[0].1.time.secs, 1);
        let vm = SnapshotFilter { hosts: vec!["vm".into()], ..Default::default() };
        assert_eq!(latest(vm).unwrap()[0].1.time.secs, 2);
        let both = SnapshotFilter { tags: vec!["postgres,other".into()], ..Default::default() };
        let err = latest(both).unwrap_err().to_string();
        assert!(err.contains("no snapshot with tags \"postgres,other\"") && err.contains("3 snapshots"), "{err}");
        let untagged = SnapshotFilter { tags: vec![String::new()], ..Default::default() };
        assert_eq!(latest(untagged).unwrap()[0].1.hostname, "vm");
    }

    #[test]
    fn the_token_filter_needs_a_record() {
        let (id, s) = (SnapshotId::hash_of(b"a"), snap("h", &[], 1));
        let f = SnapshotFilter { stored_by: vec!["mine".into()], ..Default::default() };
        let recorded = |by: &str| {
            let mut r = crate::engine::storage::StoredBy { this_token: "mine".into(), ..Default::default() };
            r.snapshots.insert(id, by.to_string());
            Provenance::Recorded(r)
        };
        assert!(f.matches(&id, &s, &recorded("mine")));
        assert_eq!(f.mismatch(&id, &s, &recorded("theirs")).unwrap(), "token \"theirs\" stored it");
        assert!(!f.matches(&id, &s, &Provenance::Recorded(Default::default())));
        assert!(SnapshotFilter::default().matches(&id, &s, &Provenance::NotServed));
    }
}
