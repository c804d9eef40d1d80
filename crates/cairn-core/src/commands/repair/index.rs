//! `repair index`: rebuild the index after index files were lost or damaged. The entries of
//! good index files are kept for packs that exist; every other pack's header is read (with
//! `read_all`, every pack is read in full and only blobs that verify are indexed); new index
//! files are written, then the old ones removed.

use std::sync::Mutex;

use crate::engine::parallel::in_parallel;
use crate::engine::repository::Repository;
use crate::error::{Error, Result};
use cairn_format::id::{IdMap, IdSet, PackId};
use cairn_format::index::IndexedPack;
use cairn_format::layout::{self, pack_path};
use cairn_format::pack::{decode_blob, read_header};

/// Packs per new index file.
const PACKS_PER_INDEX: usize = 2000;

/// What `repair index` did.
#[derive(Debug, Default)]
pub struct IndexRepair {
    /// Packs whose entries came from good index files.
    pub kept: u64,
    /// Packs whose headers (or contents) were read.
    pub read: u64,
    /// Packs listed in index files that no longer exist (left out).
    pub missing: u64,
    /// Blobs left out because they failed verification (`read_all` only).
    pub bad_blobs: u64,
    /// Packs that could not be indexed, with why (they stay in `data/`).
    pub failed: Vec<(String, String)>,
    /// Index files written.
    pub written: u64,
    /// Index files removed.
    pub removed: u64,
}

/// Rebuilds the index, reading pack headers many at once. The caller holds the exclusive lock.
pub fn repair_index(repo: &Repository, read_all: bool) -> Result<IndexRepair> {
    // Header reads are small: many in flight whatever the storage's own default.
    let threads = repo.storage().default_concurrency().max(8);
    // Credentials that may not delete are refused before a new index file is written.
    super::may_delete(repo, layout::Dir::Index)?;
    let mut out = IndexRepair::default();
    let listed: IdMap<PackId, u64> = repo.list_packs()?;
    let files = repo.index_files()?;
    let mut kept: IdMap<PackId, IndexedPack> = IdMap::default();
    let mut damaged = 0;
    let mut named: IdSet<PackId> = IdSet::default();
    let mut disputed: IdSet<PackId> = IdSet::default();
    for (_, file) in &files {
        let Ok(packs) = file else {
            damaged += 1;
            continue;
        };
        for p in packs {
            named.insert(p.id);
            if listed.contains_key(&p.id) && !read_all && !disputed.contains(&p.id) {
                // Two index files that list a pack differently, or a listing that implies
                // another size than the pack's: one is wrong (planted, or damaged before it was
                // sealed), and the pack's own header decides.
                if kept.get(&p.id).is_some_and(|k| k != p) || listed.get(&p.id) != Some(&implied_size(p)) {
                    kept.remove(&p.id);
                    disputed.insert(p.id);
                } else {
                    kept.entry(p.id).or_insert_with(|| p.clone());
                }
            }
        }
    }
    out.missing = named.iter().filter(|id| !listed.contains_key(id)).count() as u64;
    let mut to_read: Vec<(PackId, u64)> =
        listed.iter().filter(|(id, _)| !kept.contains_key(id)).map(|(id, s)| (*id, *s)).collect();
    to_read.sort_unstable();
    if to_read.is_empty() && damaged == 0 && out.missing == 0 && !read_all {
        out.kept = kept.len() as u64;
        return Ok(out); // nothing to repair
    }
    let found = Mutex::new(Vec::new());
    let failed = Mutex::new(Vec::new());
    let bad_blobs = std::sync::atomic::AtomicU64::new(0);
    in_parallel(&to_read, threads, |_, (id, size)| {
        let indexed = if read_all { read_whole(repo, id) } else { repo.read_pack_header(id, *size).map(|p| (p, 0)) };
        match indexed {
            Ok((p, bad)) => {
                bad_blobs.fetch_add(bad, std::sync::atomic::Ordering::Relaxed);
                found.lock().expect("lock").push(p);
            }
            Err(e) => failed.lock().expect("lock").push((pack_path(id), e.to_string())),
        }
    });
    out.kept = kept.len() as u64;
    let found = found.into_inner().expect("lock");
    out.read = found.len() as u64;
    out.bad_blobs = bad_blobs.into_inner();
    out.failed = failed.into_inner().expect("lock");
    out.failed.sort();
    let mut all: Vec<IndexedPack> = kept.into_values().chain(found).collect();
    all.sort_unstable_by_key(|p| p.id);
    // New index files first, then the old ones go: a crash in between leaves both (harmless).
    // A new file may be an old one again (same content, same name): that one stays.
    let mut new_files: IdSet<String> = IdSet::default();
    for group in all.chunks(PACKS_PER_INDEX) {
        new_files.insert(layout::index_path(&repo.save_index(group)?));
        out.written += 1;
    }
    for (path, _) in &files {
        if !new_files.contains(path) {
            repo.storage().delete(path)?;
            out.removed += 1;
        }
    }
    repo.set_index(all);
    Ok(out)
}

/// A pack read in full: its header, and only the blobs that verify. Returns the pack and how
/// many blobs were left out.
fn read_whole(repo: &Repository, id: &PackId) -> Result<(IndexedPack, u64)> {
    let file = pack_path(id);
    let bytes = repo.storage().read(&file)?;
    let (salt, entries) = read_header(repo.key(), &file, &bytes)?;
    let key = repo.key().object_key(&salt);
    let total = entries.len();
    let blobs: Vec<_> = entries
        .into_iter()
        .filter(|e| {
            let range = e.offset as usize..e.offset as usize + e.length as usize;
            decode_blob(repo.key(), &key, e, bytes[range].to_vec(), &file).is_ok()
        })
        .collect();
    if blobs.is_empty() && total > 0 {
        return Err(Error::corrupt(&file, "no blob in it verifies"));
    }
    let bad = (total - blobs.len()) as u64;
    Ok((IndexedPack { id: *id, salt, blobs }, bad))
}

/// The size of a pack whose blobs are as `p` lists them: where the last ends, then its header
/// and trailer.
fn implied_size(p: &IndexedPack) -> u64 {
    let end = p.blobs.iter().map(|b| u64::from(b.offset) + u64::from(b.length)).max().unwrap_or(0);
    end + cairn_format::pack::header_tail_len(p.blobs.len())
}
