//! How big snapshots are: what a restore of each would write ([`RestoreSize`]), and the unique
//! data they reference as stored ([`RawData`]: plaintext and stored bytes, per codec, with the
//! deduplication and compression ratios).
//!
//! Every distinct tree of the snapshots is read once ([`crate::engine::trees::for_each_tree`], level by
//! level) and only its counts are kept ([`Counted`]: entries, file bytes, the hard-linked files
//! and the subtrees), not the tree: holding every tree of a million files took 1.16 GB. Each
//! snapshot's restore size is then summed over those counts; stored sizes come from the index,
//! so no pack is read.

use std::collections::{BTreeMap, HashSet};

use crate::engine::blobset::BlobSet;
use crate::engine::repository::Repository;
use crate::engine::trees::{for_each_tree, Loading};
use crate::error::{Error, Result};
use cairn_format::id::{BlobId, IdMap, SnapshotId};
use cairn_format::pack::BlobKind;
use cairn_format::pack::{count_codec, CodecUse};
use cairn_format::snapshot::Snapshot;
use cairn_format::tree::{Chunk, NodeKind, TreeBytes};

/// What restoring the snapshots (each in turn) would create and write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RestoreSize {
    /// Regular files (every path, hard links included).
    pub files: u64,
    /// Directories (below each snapshot's root).
    pub dirs: u64,
    /// Symlinks, devices and FIFOs.
    pub others: u64,
    /// Bytes of file content written: a file with several hard links once, as a restore
    /// writes it once and links the other paths to it.
    pub bytes: u64,
    /// Paths restored as hard links of a file already counted.
    pub hard_links: u64,
}

/// The unique blobs the snapshots reference, as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawData {
    /// Distinct data blobs (file chunks).
    pub data_blobs: u64,
    /// Distinct tree blobs (directories).
    pub tree_blobs: u64,
    /// Plaintext bytes of the distinct data blobs.
    pub data_plain: u64,
    /// Plaintext bytes of all distinct blobs, trees included.
    pub plain: u64,
    /// Stored bytes of all distinct blobs (compressed and encrypted, as in the packs).
    pub stored: u64,
    /// Bytes of file content that are zeros or holes: referenced, never stored.
    pub zero_bytes: u64,
    /// Blobs and bytes per codec.
    pub by_codec: BTreeMap<String, CodecUse>,
}

impl RawData {
    /// Plaintext bytes per stored byte (1.0 for nothing stored).
    pub fn compression_ratio(&self) -> f64 {
        ratio(self.plain, self.stored)
    }
}

/// The statistics of a set of snapshots.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Snapshots counted.
    pub snapshots: u64,
    /// What restoring each would write.
    pub restore: RestoreSize,
    /// The unique data referenced.
    pub raw: RawData,
}

impl Stats {
    /// File bytes a restore of every snapshot writes per byte of unique file data stored
    /// (plaintext): how much deduplication (and zero chunks) saved.
    pub fn dedup_ratio(&self) -> f64 {
        ratio(self.restore.bytes, self.raw.data_plain)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        1.0
    } else {
        a as f64 / b as f64
    }
}

/// Counts `snapshots`, loading trees on `threads` threads. A tree or blob the index does not
/// list is an error (the snapshot is damaged: `cairn check` says how).
pub fn stats(
    repo: &Repository,
    snapshots: &[(SnapshotId, Snapshot)],
    threads: usize,
    loading: &Loading,
) -> Result<Stats> {
    let mut s = Stats { snapshots: snapshots.len() as u64, ..Stats::default() };
    let mut trees: IdMap<BlobId, Counted> = IdMap::default();
    // One bit a blob of the index (a set of IDs took 70 MB for a million).
    let mut blobs = BlobSet::new(&repo.index());
    for_each_tree(repo, snapshots.iter().map(|(_, s)| s.tree), threads, loading, |id, tree| {
        let tree = tree?;
        let index = repo.index();
        blobs.insert(&index, id);
        for n in tree.nodes() {
            for c in &n.content {
                match *c {
                    Chunk::Data { id, .. } => blobs.insert(&index, id),
                    Chunk::Zero { len } => s.raw.zero_bytes += len,
                }
            }
        }
        trees.insert(id, Counted::of(&tree));
        Ok(())
    })?;
    for (_, snap) in snapshots {
        s.restore = add(s.restore, restore_size(&trees, snap.tree)?);
    }
    repo.index_intact()?;
    if let Some(id) = blobs.unlisted().iter().next() {
        return Err(Error::NotFound(format!(
            "blob {} (referenced by a snapshot, in no index; run `cairn check`)",
            id.short()
        )));
    }
    let index = repo.index();
    for pos in blobs.positions() {
        let e = index.at(pos).ok_or_else(crate::engine::sorted_index::damaged)?.entry;
        match e.kind {
            BlobKind::Data => {
                s.raw.data_blobs += 1;
                s.raw.data_plain += u64::from(e.raw_length);
            }
            BlobKind::Tree => s.raw.tree_blobs += 1,
        }
        s.raw.plain += u64::from(e.raw_length);
        s.raw.stored += u64::from(e.length);
        count_codec(&mut s.raw.by_codec, &e);
    }
    Ok(s)
}

/// What [`stats`] keeps of a tree: what its own entries add to a restore, the hard-linked files
/// among them (device, inode, size: counted once per snapshot), and its subtrees.
struct Counted {
    own: RestoreSize,
    linked: Vec<(u64, u64, u64)>,
    subtrees: Vec<BlobId>,
}

impl Counted {
    fn of(tree: &TreeBytes) -> Self {
        let mut c = Counted { own: RestoreSize::default(), linked: Vec::new(), subtrees: Vec::new() };
        for n in tree.nodes() {
            c.subtrees.extend(n.subtree);
            match n.kind {
                NodeKind::File => {
                    c.own.files += 1;
                    if n.links > 1 {
                        c.linked.push((n.device_id, n.inode, n.size));
                    } else {
                        c.own.bytes += n.size;
                    }
                }
                NodeKind::Dir => c.own.dirs += 1,
                _ => c.own.others += 1,
            }
        }
        c
    }
}

/// What restoring the tree `root` writes: each hard-linked file (same device and inode, more
/// than one link) counted once, as the restore writes it.
fn restore_size(trees: &IdMap<BlobId, Counted>, root: BlobId) -> Result<RestoreSize> {
    let mut r = RestoreSize::default();
    let mut linked: HashSet<(u64, u64)> = HashSet::new();
    // Every directory below the root, as often as the snapshot names it.
    let mut stack = vec![root];
    while let Some(id) = stack.pop() {
        let t = trees.get(&id).ok_or_else(|| Error::NotFound(format!("tree {} (not loaded)", id.short())))?;
        r = add(r, t.own);
        for &(device, inode, size) in &t.linked {
            if linked.insert((device, inode)) {
                r.bytes += size;
            } else {
                r.hard_links += 1;
            }
        }
        stack.extend(&t.subtrees);
    }
    Ok(r)
}

fn add(a: RestoreSize, b: RestoreSize) -> RestoreSize {
    RestoreSize {
        files: a.files + b.files,
        dirs: a.dirs + b.dirs,
        others: a.others + b.others,
        bytes: a.bytes + b.bytes,
        hard_links: a.hard_links + b.hard_links,
    }
}
