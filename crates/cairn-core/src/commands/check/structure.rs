//! The index against the packs: every pack an index names exists with the size the index
//! implies and a header that agrees with it (read with one small ranged read of its end); packs
//! no index lists; blobs listed twice; and every blob the chosen snapshots' trees need.

use std::sync::Mutex;

use super::{CheckOptions, CheckReport, Finding, FindingKind, Progress};
use crate::engine::parallel::in_parallel;
use crate::engine::repository::Repository;
use crate::engine::trees::load_listed;
use crate::error::{Error, Result};
use cairn_format::crypto::SALT_LEN;
use cairn_format::id::{BlobId, IdMap, IdSet, PackId, SnapshotId};
use cairn_format::layout::pack_path;
use cairn_format::pack::{header_tail_len, read_header_tail, BlobEntry, BlobKind};
use cairn_format::snapshot::Snapshot;
use cairn_format::tree::{for_each_node, Chunk, NodeKind};

/// A pack as its (first) index file lists it.
#[derive(Clone, Debug)]
pub struct IndexedPackInfo {
    /// The pack.
    pub id: PackId,
    /// Its salt.
    pub salt: [u8; SALT_LEN],
    /// Its blobs, by offset.
    pub blobs: Vec<BlobEntry>,
    /// The size its entries imply.
    pub size: u64,
    /// The index file that lists it.
    pub index_file: String,
}

/// Blobs that more than one pack holds: one notice with their count.
pub fn duplicates(packs: &IdMap<PackId, IndexedPackInfo>, report: &mut CheckReport) {
    let mut ids: Vec<BlobId> = packs.values().flat_map(|p| p.blobs.iter().map(|b| b.id)).collect();
    ids.sort_unstable();
    let total = ids.len();
    ids.dedup();
    if ids.len() < total {
        let n = total - ids.len();
        report.findings.push(Finding::new(
            FindingKind::DuplicateBlob,
            None,
            format!("{n} blobs are stored in more than one pack (concurrent backups do this; nothing is lost)"),
        ));
    }
}

/// Checks `packs` against storage (on `threads` requests at once); returns those that exist.
pub fn packs(
    repo: &Repository,
    packs: &[&IndexedPackInfo],
    listed: &IdMap<PackId, u64>,
    threads: usize,
    report: &mut CheckReport,
    progress: &Progress,
) -> IdSet<PackId> {
    let mut present = IdSet::default();
    let mut to_read = Vec::new();
    for &p in packs {
        let file = pack_path(&p.id);
        match listed.get(&p.id) {
            None => report.findings.push(lost(
                FindingKind::MissingPack,
                p,
                format!("{file} does not exist, but {} lists {} blobs in it", p.index_file, p.blobs.len()),
            )),
            Some(&size) if size != p.size => {
                present.insert(p.id);
                report.findings.push(lost(
                    FindingKind::PackSize,
                    p,
                    format!("{file} has {size} bytes, but the entries {} lists imply {}", p.index_file, p.size),
                ));
            }
            Some(_) => {
                present.insert(p.id);
                to_read.push(p);
            }
        }
    }
    progress.phase("packs", to_read.len() as u64);
    let found = Mutex::new(Vec::new());
    in_parallel(&to_read, threads, |_, p| {
        if let Err(why) = header_agrees(repo, p) {
            found.lock().expect("findings lock").push(lost(FindingKind::PackHeader, p, why));
        }
        progress.step();
    });
    let mut found = found.into_inner().expect("findings lock");
    found.sort_by(|a, b| a.file.cmp(&b.file));
    report.findings.extend(found);
    present
}

/// Later listings of a pack that differ from its first (`differing`): each is checked against
/// the pack's header, and one that disagrees is a finding about its index file (planted, or
/// damaged before it was sealed). Nothing is lost by it: a blob it misplaces is read from the
/// place another index file gives (`Repository::reread_blob`); `repair index` drops it.
pub fn other_listings(
    repo: &Repository,
    differing: &[IndexedPackInfo],
    listed: &IdMap<PackId, u64>,
    report: &mut CheckReport,
) {
    for p in differing {
        let why = match listed.get(&p.id) {
            None => format!("{} does not exist", pack_path(&p.id)),
            Some(&size) => match header_agrees(repo, &IndexedPackInfo { size, ..p.clone() }) {
                Ok(()) => continue,
                Err(why) => why,
            },
        };
        report.findings.push(Finding::new(
            FindingKind::PackHeader,
            Some(p.index_file.clone()),
            format!(
                "{} lists {} blobs in {} that are not there ({why}): the index file is wrong (planted, or \
                 damaged before it was sealed); blobs it misplaces are read where other index files place them, and \
                 `cairn repair index` (admin) rebuilds the index without it",
                p.index_file,
                p.blobs.len(),
                pack_path(&p.id)
            ),
        ));
    }
}

/// Packs in `data/` that no index lists (and no prune is deleting): notices.
pub fn unindexed(
    packs: &IdMap<PackId, IndexedPackInfo>,
    doomed: &IdSet<PackId>,
    listed: &IdMap<PackId, u64>,
    report: &mut CheckReport,
) {
    let mut unindexed: Vec<(&PackId, &u64)> =
        listed.iter().filter(|(id, _)| !packs.contains_key(id) && !doomed.contains(id)).collect();
    unindexed.sort_unstable();
    for (id, size) in unindexed {
        let file = pack_path(id);
        let msg = format!("{file} ({size} bytes) is in no index (`cairn repair index` adds it)");
        report.findings.push(Finding::new(FindingKind::UnindexedPack, Some(file), msg));
    }
}

/// A finding about a whole pack: every blob in it is affected.
fn lost(kind: FindingKind, p: &IndexedPackInfo, message: String) -> Finding {
    let mut f = Finding::new(kind, Some(pack_path(&p.id)), message);
    f.blobs = p.blobs.iter().map(|b| b.id).collect();
    f
}

/// Reads the end of a pack and compares its header with the index's entries.
fn header_agrees(repo: &Repository, p: &IndexedPackInfo) -> std::result::Result<(), String> {
    let file = pack_path(&p.id);
    let tail_len = header_tail_len(p.blobs.len()).min(p.size);
    let tail = repo
        .read_pack_range(&file, p.size - tail_len, tail_len)
        .map_err(|e| format!("{file}: cannot read its header: {e}"))?;
    let (salt, mut entries) = read_header_tail(repo.key(), &file, &tail, p.size).map_err(|e| e.to_string())?;
    entries.sort_unstable_by_key(|b| b.offset);
    if salt != p.salt {
        return Err(format!("{file}: its salt differs from what {} says", p.index_file));
    }
    if entries != p.blobs {
        let why = match entries.iter().zip(&p.blobs).find(|(a, b)| a != b) {
            Some((_, b)) => format!("blob {} differs", b.id.short()),
            None => format!("{} blobs in the header, {} in the index", entries.len(), p.blobs.len()),
        };
        return Err(format!("{file}: its header disagrees with {}: {why}", p.index_file));
    }
    Ok(())
}

/// What the walk of [`trees`] keeps of a tree: its subtrees, and the data chunks its files name
/// that no index lists (all of them when `collect`). The trees themselves are dropped as they
/// are read: parsed, a million files' trees took hundreds of MiB.
struct Kept {
    subtrees: Vec<BlobId>,
    missing: Vec<BlobId>,
    chunks: Vec<BlobId>,
}

impl Kept {
    /// Parses tree `id`'s plaintext a node at a time (as [`cairn_format::tree::Tree::from_bytes`]
    /// validates it), keeping only what the walk needs.
    fn of(id: BlobId, plain: &[u8], index: &cairn_format::index::Index, collect: bool) -> Result<Self> {
        let mut kept = Kept { subtrees: Vec::new(), missing: Vec::new(), chunks: Vec::new() };
        for_each_node(&format!("tree {}", id.short()), plain, |node| {
            kept.subtrees.extend(node.subtree);
            if node.kind != NodeKind::File {
                return;
            }
            for c in &node.content {
                if let Chunk::Data { id, .. } = c {
                    if collect {
                        kept.chunks.push(*id);
                    }
                    if !index.contains(id) {
                        kept.missing.push(*id);
                    }
                }
            }
        })?;
        kept.subtrees.shrink_to_fit();
        kept.missing.shrink_to_fit();
        kept.chunks.shrink_to_fit();
        Ok(kept)
    }
}

/// The trees `packs` list, of the packs that are `present` (trees in packs that are gone are
/// the missing pack's finding already).
pub fn listed_trees<'a>(
    packs: &'a IdMap<PackId, IndexedPackInfo>,
    present: &'a IdSet<PackId>,
) -> impl Iterator<Item = BlobId> + Send + 'a {
    packs
        .values()
        .filter(|p| present.contains(&p.id))
        .flat_map(|p| p.blobs.iter().filter(|b| b.kind == BlobKind::Tree).map(|b| b.id))
}

/// Loads every `listed` tree at once (through the read path, `budget` bytes of tree packs in
/// flight), keeping of each what the
/// walk needs ([`Kept`]), then walks the trees of `snapshots` and reports every blob they need
/// that no index lists; returns the blobs (trees and data) they need when the check is limited
/// to some snapshots.
pub fn trees(
    repo: &Repository,
    listed: impl Iterator<Item = BlobId> + Send,
    snapshots: &[(SnapshotId, Snapshot)],
    opts: &CheckOptions,
    budget: u64,
    report: &mut CheckReport,
    progress: &Progress,
) -> Result<Option<IdSet<BlobId>>> {
    progress.phase("trees", 0);
    let collect = !opts.filter.is_empty();
    let loaded: Mutex<IdMap<BlobId, Result<Kept>>> = Mutex::new(IdMap::default());
    let keep = |id: BlobId, plain: Result<&[u8]>| {
        let kept = plain.and_then(|p| Kept::of(id, p, &repo.index(), collect));
        loaded.lock().expect("lock").insert(id, kept);
    };
    load_listed(repo, listed, opts.fetches(repo), budget, opts.cancel.clone(), &keep);
    let loaded = loaded.into_inner().expect("lock");
    let mut needed: IdSet<BlobId> = IdSet::default();
    let mut missing: IdSet<BlobId> = IdSet::default();
    let mut seen: IdSet<BlobId> = IdSet::default();
    let mut stack: Vec<BlobId> = snapshots.iter().map(|(_, s)| s.tree).filter(|t| seen.insert(*t)).collect();
    let index = repo.index();
    while let Some(id) = stack.pop() {
        progress.step();
        report.trees += 1;
        if collect {
            needed.insert(id);
        }
        let tree = match loaded.get(&id) {
            Some(Ok(t)) => t,
            Some(Err(e)) => {
                report.findings.push(Finding::new(FindingKind::DamagedTree, None, e.to_string()).with_blob(id));
                continue;
            }
            None if index.contains(&id) => continue, // in a missing pack: reported with it
            None => {
                let msg = format!("tree {} is in no index", id.short());
                report.findings.push(Finding::new(FindingKind::MissingBlob, None, msg).with_blob(id));
                continue;
            }
        };
        stack.extend(tree.subtrees.iter().filter(|sub| seen.insert(**sub)));
        needed.extend(tree.chunks.iter().copied());
        for id in &tree.missing {
            if missing.insert(*id) {
                let msg = format!("blob {} is in no index", id.short());
                report.findings.push(Finding::new(FindingKind::MissingBlob, None, msg).with_blob(*id));
            }
        }
    }
    if opts.cancel.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(Error::Interrupted);
    }
    Ok(collect.then_some(needed))
}
