//! What a prune trusts before it deletes: index files are claims (FORMAT.md §18), and a host
//! that may only add objects can store a validly sealed one that lies. A lie must never make a
//! prune delete the only true copy of a needed blob, so:
//!
//! - a pack two index files list differently is taken from its own header (the listings that
//!   disagree with it are dropped);
//! - before a pack holding a needed blob is deleted or repacked without copying that blob
//!   (because the plan claimed it in another pack), that other pack's header must list it as
//!   the index does; if it does not, the prune deletes nothing.
//!
//! Both read pack headers only where listings disagree or blobs are stored twice: none in a
//! repository no one tampered with and no concurrent backups duplicated.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use super::plan::{Fate, Plan};
use crate::engine::parallel::map_parallel;
use crate::engine::repository::Repository;
use crate::error::{Error, Result};
use cairn_format::id::{BlobId, IdMap, IdSet, IndexId, PackId};
use cairn_format::index::IndexedPack;
use cairn_format::layout::pack_path;
use cairn_format::pack::BlobEntry;

/// Header reads in flight.
const HEADER_READS: usize = 16;

/// Replaces every listing of a pack that index files list differently by its header's (read
/// once); returns how many packs were settled so. A prune's plan and its finish (which reads
/// the index files again to write their replacements) both do.
pub fn settle_disputes(repo: &Repository, files: &mut [(IndexId, Vec<IndexedPack>)]) -> Result<usize> {
    let mut first: IdMap<PackId, &IndexedPack> = IdMap::default();
    let mut disputed: IdSet<PackId> = IdSet::default();
    for p in files.iter().flat_map(|(_, packs)| packs) {
        match first.get(&p.id) {
            Some(f) if *f != p => {
                disputed.insert(p.id);
            }
            Some(_) => {}
            None => {
                first.insert(p.id, p);
            }
        }
    }
    if disputed.is_empty() {
        return Ok(0);
    }
    // Listed only now: a repository where no two index files disagree pays nothing.
    let stored = repo.list_packs()?;
    let mut to_read: Vec<(PackId, u64)> = disputed.iter().filter_map(|id| stored.get(id).map(|s| (*id, *s))).collect();
    to_read.sort_unstable();
    let headers = map_parallel(&to_read, HEADER_READS, |(id, size)| repo.read_pack_header(id, *size));
    let mut settled: IdMap<PackId, IndexedPack> = IdMap::default();
    for ((id, _), header) in to_read.iter().zip(headers) {
        let header = header.map_err(|e| {
            Error::Refused(format!(
                "index files list {} differently and its header cannot be read ({e}); prune deletes nothing: run \
                 `cairn check`, then `cairn repair index`",
                pack_path(id)
            ))
        })?;
        settled.insert(*id, header);
    }
    for (_, packs) in files.iter_mut() {
        for p in packs.iter_mut() {
            if let Some(h) = settled.get(&p.id) {
                *p = h.clone();
            }
        }
    }
    Ok(settled.len())
}

/// Checks, against their packs' headers, the claimed copies of needed blobs whose other copies
/// the plan drops (in a pack deleted, or repacked without them). Refuses if one is not there.
pub fn confirm_claims(repo: &Repository, plan: &Plan) -> Result<usize> {
    // Where each needed blob is claimed.
    let mut claimed_in: IdMap<BlobId, (usize, BlobEntry)> = IdMap::default();
    for (i, p) in plan.packs.iter().enumerate() {
        for b in p.claimed() {
            claimed_in.insert(b.id, (i, *b));
        }
    }
    // Packs whose claimed copies stand in for a copy that goes.
    let mut relied: HashMap<usize, Vec<BlobEntry>> = HashMap::new();
    for p in plan.packs.iter().filter(|p| p.fate != Fate::Keep) {
        let kept: IdSet<BlobId> = p.claimed().map(|b| b.id).collect();
        for b in p.pack.blobs.iter().filter(|b| !kept.contains(&b.id)) {
            if let Some((i, entry)) = claimed_in.get(&b.id) {
                relied.entry(*i).or_default().push(*entry);
            }
        }
    }
    let relied: Vec<(usize, Vec<BlobEntry>)> = relied.into_iter().collect();
    let wrong = Mutex::new(None);
    let checked = map_parallel(&relied, HEADER_READS, |(i, blobs)| {
        let p = &plan.packs[*i];
        let header = repo.read_pack_header(&p.pack.id, p.size)?;
        let listed: HashSet<(BlobId, u32, u32)> = header.blobs.iter().map(|b| (b.id, b.offset, b.length)).collect();
        if let Some(b) = blobs.iter().find(|b| !listed.contains(&(b.id, b.offset, b.length))) {
            *wrong.lock().expect("wrong lock") = Some((p.pack.id, b.id));
        }
        Ok::<(), Error>(())
    });
    for r in checked {
        r.map_err(|e| {
            Error::Refused(format!(
                "a pack holding the only copy a prune would keep of a needed blob cannot be read ({e}); prune deletes \
                 nothing: run `cairn check`"
            ))
        })?;
    }
    if let Some((pack, blob)) = wrong.into_inner().expect("wrong lock") {
        return Err(Error::Refused(format!(
            "an index file places blob {} in {}, but that pack's header does not list it there: the index file is \
             wrong (planted, or damaged before it was sealed); prune deletes nothing: `cairn check` names it and \
             `cairn repair index` (admin) rebuilds the index without it",
            blob.short(),
            pack_path(&pack)
        )));
    }
    Ok(relied.len())
}
