//! `repair packs`: copy every blob of a damaged pack that still verifies into new packs, write
//! the index files that listed the pack again without it, then delete it. What could not be
//! saved is named; `repair snapshots` then fixes the snapshots that needed it.

use crate::engine::repository::Repository;
use crate::error::{Error, Result};
use cairn_format::id::{BlobId, IdSet, PackId};
use cairn_format::index::IndexedPack;
use cairn_format::layout::{index_path, pack_path};
use cairn_format::pack::{decode_blob, read_header, BlobEntry, BlobKind};

/// What `repair packs` did.
#[derive(Debug, Default)]
pub struct PackRepair {
    /// Blobs copied into new packs.
    pub salvaged: u64,
    /// Blobs another pack already held (nothing to copy).
    pub elsewhere: u64,
    /// Blobs that could not be read: (pack, blob).
    pub lost: Vec<(PackId, BlobId)>,
    /// Index files written again without the damaged packs.
    pub reindexed: u64,
}

/// The packs `names` name: full IDs or unique prefixes (any case), as `check` prints them.
pub fn find_packs(repo: &Repository, names: &[String]) -> Result<Vec<PackId>> {
    let listed: Vec<PackId> = repo.list_packs()?.into_keys().collect();
    names
        .iter()
        .map(|name| {
            let prefix = name.to_ascii_lowercase();
            let found: Vec<&PackId> = listed.iter().filter(|id| id.to_hex().starts_with(&prefix)).collect();
            match found.as_slice() {
                [one] => Ok(**one),
                [] => Err(Error::Usage(format!("no pack matches {prefix:?}; `cairn check` names the damaged packs"))),
                _ => Err(Error::Usage(format!("{prefix:?} matches several packs; give more of the ID"))),
            }
        })
        .collect()
}

/// Salvages `packs` (the index must be loaded; the caller holds the exclusive lock).
pub fn repair_packs(repo: &Repository, packs: &[PackId]) -> Result<PackRepair> {
    let mut out = PackRepair::default();
    let damaged: IdSet<PackId> = packs.iter().copied().collect();
    let files = repo.index_files()?;
    let pack_size = repo.config().pack_size as usize;
    let mut batch: Vec<(BlobKind, Vec<u8>)> = Vec::new();
    let mut batch_bytes = 0;
    let mut copied: IdSet<BlobId> = IdSet::default();
    for id in packs {
        let file = pack_path(id);
        let read = repo.storage().read(&file);
        // What the index says is in the pack; without an index entry, what its header says.
        let mut entries: Vec<(BlobEntry, [u8; 32])> = files
            .iter()
            .filter_map(|(_, f)| f.as_ref().ok())
            .flatten()
            .filter(|p| p.id == *id)
            .flat_map(|p| p.blobs.iter().map(|b| (*b, p.salt)))
            .collect();
        if entries.is_empty() {
            if let Ok((salt, blobs)) =
                read.as_ref().map_err(|_| ()).and_then(|b| read_header(repo.key(), &file, b).map_err(|_| ()))
            {
                entries = blobs.into_iter().map(|b| (b, salt)).collect();
            }
        }
        entries.sort_unstable_by_key(|(b, _)| (b.id, b.offset));
        entries.dedup_by_key(|(b, _)| b.id);
        for (b, salt) in entries {
            if copied.contains(&b.id) {
                continue;
            }
            // Another intact pack holds it already: nothing to copy.
            if repo.index().get(&b.id).is_some_and(|loc| !damaged.contains(&loc.pack)) {
                out.elsewhere += 1;
                continue;
            }
            let range = b.offset as usize..b.offset as usize + b.length as usize;
            let plain = match &read {
                Ok(bytes) if range.end <= bytes.len() => {
                    decode_blob(repo.key(), &repo.key().object_key(&salt), &b, bytes[range].to_vec(), &file).ok()
                }
                _ => None,
            };
            match plain {
                Some(data) => {
                    copied.insert(b.id);
                    batch_bytes += data.len();
                    batch.push((b.kind, data));
                    if batch_bytes >= pack_size {
                        repo.write_pack(&std::mem::take(&mut batch), repo.config().codec())?;
                        batch_bytes = 0;
                    }
                }
                None => out.lost.push((*id, b.id)),
            }
        }
    }
    if !batch.is_empty() {
        repo.write_pack(&batch, repo.config().codec())?;
    }
    out.salvaged = copied.len() as u64;
    // Index files that list a damaged pack are written again without it, then removed.
    for (path, file) in &files {
        let Ok(list) = file else { continue };
        if !list.iter().any(|p| damaged.contains(&p.id)) {
            continue;
        }
        let kept: Vec<IndexedPack> = list.iter().filter(|p| !damaged.contains(&p.id)).cloned().collect();
        let new = if kept.is_empty() { None } else { Some(index_path(&repo.save_index(&kept)?)) };
        if new.as_deref() != Some(path.as_str()) {
            repo.storage().delete(path)?;
        }
        out.reindexed += 1;
    }
    for id in packs {
        repo.storage().delete(&pack_path(id))?;
    }
    Ok(out)
}
