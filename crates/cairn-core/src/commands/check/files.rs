//! Every key, index, snapshot and deletion manifest decrypts and parses; each one that does not
//! is a finding.

use super::structure::IndexedPackInfo;
use super::{Finding, FindingKind, Progress};
use crate::engine::repository::Repository;
use crate::engine::select::SnapshotFilter;
use crate::error::Result;
use cairn_format::id::{IdMap, IdSet, PackId, SnapshotId};
use cairn_format::index::IndexedPack;
use cairn_format::layout::deletion_path;
use cairn_format::pack::header_tail_len;
use cairn_format::snapshot::Snapshot;

/// Every key file parses (a check never tries the others' passwords).
pub fn keys(repo: &Repository, threads: usize) -> Result<Vec<Finding>> {
    Ok(repo
        .key_files(threads)?
        .into_iter()
        .filter_map(|(path, p)| p.err().map(|e| Finding::new(FindingKind::DamagedKey, Some(path), e.to_string())))
        .collect())
}

/// What [`index`] returns: each pack's first listing, the packs being deleted, and the later
/// listings that differ from the first.
pub type IndexedPacks = (IdMap<PackId, IndexedPackInfo>, IdSet<PackId>, Vec<IndexedPackInfo>);

/// Reads every index file; the good ones become the repository's in-memory index and the packs
/// they list are returned (the first listing of a pack counts), except packs a running or
/// interrupted prune is deleting (FORMAT.md §13), returned apart: they may vanish while the
/// check runs, and nothing needs them that another pack does not hold (or the prune keeps them).
///
/// A later listing of a pack that differs from the first is returned too (the third list): one
/// of the two index files is wrong, and the pack's header tells which
/// ([`super::structure::other_listings`]).
pub fn index(repo: &Repository, findings: &mut Vec<Finding>, progress: &Progress) -> Result<IndexedPacks> {
    // Manifests first: a prune removes its manifest only after the index files it replaces, so
    // index files read after the manifests name no pack deleted in between unnoticed.
    let mut doomed = IdSet::default();
    for (id, d) in repo.deletions()? {
        match d {
            Ok(d) => doomed.extend(d.packs),
            Err(e) => findings.push(Finding::new(
                FindingKind::DamagedDeletion,
                Some(deletion_path(&id)),
                format!("{e}; ignored (its packs stay), and the next prune removes it"),
            )),
        }
    }
    // Each pack's blobs are moved into its entry, not copied, and the in-memory index is built
    // from those entries: the index files' blobs are held once beside the index, not twice.
    let mut packs: IdMap<PackId, IndexedPackInfo> = IdMap::default();
    // Doomed packs and later listings of a pack: in the index, but not checked.
    let mut others: Vec<IndexedPack> = Vec::new();
    let mut differing = Vec::new();
    for (path, file) in repo.index_files()? {
        progress.step();
        match file {
            Ok(list) => {
                for p in list {
                    if doomed.contains(&p.id) || packs.contains_key(&p.id) {
                        let listing = IndexedPackInfo::new(p.clone(), &path);
                        if packs.get(&p.id).is_some_and(|first| first.blobs != listing.blobs || first.salt != p.salt) {
                            differing.push(listing);
                        }
                        others.push(p);
                    } else {
                        packs.insert(p.id, IndexedPackInfo::new(p, &path));
                    }
                }
            }
            Err(e) => findings.push(Finding::new(FindingKind::DamagedIndex, Some(path), e.to_string())),
        }
    }
    let parts = packs.values().map(|i| (i.id, i.salt, &i.blobs[..]));
    repo.set_index_parts(parts.chain(others.iter().map(|p| (p.id, p.salt, &p.blobs[..]))), &doomed);
    Ok((packs, doomed, differing))
}

impl IndexedPackInfo {
    fn new(p: IndexedPack, index_file: &str) -> Self {
        let mut blobs = p.blobs;
        blobs.sort_unstable_by_key(|b| b.offset);
        let end = blobs.iter().map(|b| u64::from(b.offset) + u64::from(b.length)).max().unwrap_or(0);
        IndexedPackInfo {
            id: p.id,
            salt: p.salt,
            size: end + header_tail_len(blobs.len()),
            blobs,
            index_file: index_file.to_string(),
        }
    }
}

/// Reads every snapshot file; returns the readable ones `filter` selects, oldest first.
pub fn snapshots(
    repo: &Repository,
    filter: &SnapshotFilter,
    findings: &mut Vec<Finding>,
) -> Result<Vec<(SnapshotId, Snapshot)>> {
    let (readable, damaged) = repo.read_snapshots()?;
    for (path, e) in damaged {
        findings.push(Finding::new(FindingKind::DamagedSnapshot, Some(path), e.to_string()));
    }
    filter.choose(readable, &filter.provenance(repo)?)
}
