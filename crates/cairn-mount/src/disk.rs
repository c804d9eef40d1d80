//! One file of a snapshot as a block device (`cairn nbd`): the export [`cairn_nbd`] serves.
//!
//! Reads are the mount's ([`crate::content`]): cut at the file's chunks, zero chunks are zeros
//! without a read, data chunks come from the decoded-blob cache, from read-ahead (a sequential
//! reader — a boot, a `dd`, `nbdcopy` — gets a stream of its own running ahead of it through the
//! shared pipeline) or, for a random read, are read on the spot, beside the read-ahead's queue
//! rather than behind it; every request of every connection is one such read, so a client's
//! queue depth is the number of blobs in flight. `base:allocation` comes from the chunk list
//! alone: zero chunks (holes and zeros the backup never stored) are holes.
//!
//! Every fetch of the export (its reads and its read-ahead) is in the download limit's
//! foreground lane (`--limit-download`): a live restore's client does not wait behind the
//! background restore's traffic.

use std::io;
use std::path::Path;
use std::sync::Arc;

use cairn_core::engine::repository::Repository;
use cairn_core::error::{Error, Result};
use cairn_format::id::SnapshotId;
use cairn_format::snapshot::Snapshot;
use cairn_format::tree::{Chunk, NodeKind};
use cairn_nbd::proto::{STATE_HOLE, STATE_ZERO};
use cairn_nbd::Extent;

use crate::cache::BlobCache;
use crate::content::{Content, OpenFile};
use crate::prefetch::{Blobs, Limits, Prefetch};
use crate::walk::data_blobs;

/// How a disk export reads.
#[derive(Clone, Debug)]
pub struct DiskOptions {
    /// Byte budget for decoded blobs: half for the cache, half for the reads in flight.
    pub max_memory: u64,
    /// Reads in flight in the read-ahead pipeline.
    pub fetch_concurrency: usize,
    /// Decode workers of the read-ahead pipeline.
    pub decode_threads: usize,
}

/// Most extents one block status reply lists.
const MAX_EXTENTS: usize = 4096;

/// A regular file of a snapshot, served as a read-only block device.
pub struct Disk {
    content: Content,
    file: OpenFile,
    /// Where each chunk starts.
    starts: Vec<u64>,
    identity: [u8; 32],
}

impl Disk {
    /// The file at `path` of snapshot `id` (`snapshot`) of `repo` (its index loaded).
    pub fn open(
        repo: Arc<Repository>,
        id: &SnapshotId,
        snapshot: &Snapshot,
        path: &Path,
        opts: &DiskOptions,
    ) -> Result<Disk> {
        let node = cairn_core::engine::trees::resolve(&repo, &snapshot.tree, path, &id.short())?;
        let node = match node {
            Some(n) if n.kind == NodeKind::File => n,
            _ => {
                return Err(Error::Usage(format!(
                    "{} is not a regular file of snapshot {}: an export is one file (a disk image)",
                    path.display(),
                    id.short()
                )))
            }
        };
        let budget = (opts.max_memory / 2).max(cairn_core::engine::read::MAX_READ * 4);
        let cache = Arc::new(BlobCache::new(budget));
        let limits = Limits {
            budget,
            window: budget / 2,
            fetchers: opts.fetch_concurrency.max(1),
            decoders: opts.decode_threads.max(1),
            // What a client waits for: with a download limit it goes ahead of any background
            // work sharing it (a live restore's restore).
            foreground: true,
        };
        let prefetch = Prefetch::start(repo.clone(), cache.clone(), limits)?;
        let content = Content::new(repo, cache, prefetch);
        let starts = node.content.iter().scan(0u64, |at, c| Some(std::mem::replace(at, *at + c.len()))).collect();
        let mut label = blake3::Hasher::new();
        label.update(b"cairn nbd export\0");
        label.update(&id.0);
        label.update(path.as_os_str().as_encoded_bytes());
        let identity = *label.finalize().as_bytes();
        let node = Arc::new(node);
        let whole = node.clone();
        let file = content.open(node, move || Box::new(Blobs(Some(data_blobs(&whole.content).collect()))));
        Ok(Disk { content, file, starts, identity })
    }

    /// The number of the chunk holding `offset`.
    fn chunk_at(&self, offset: u64) -> usize {
        self.starts.partition_point(|&s| s <= offset).saturating_sub(1)
    }

    /// What names this export (its snapshot and path): an overlay made for it records this.
    pub fn identity(&self) -> &[u8; 32] {
        &self.identity
    }
}

impl cairn_nbd::Export for Disk {
    fn size(&self) -> u64 {
        self.file.node().size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        // A read made here (a random read) is the client's: in the download limit's foreground.
        let read = cairn_core::engine::storage::foreground(|| self.content.read(&self.file, offset, buf.len() as u32));
        match read {
            Ok(data) if data.len() == buf.len() => {
                buf.copy_from_slice(&data);
                Ok(())
            }
            Ok(data) => {
                let e = format!("{} bytes at {offset}: the file's chunks hold only {}", buf.len(), data.len());
                eprintln!("cairn nbd: {e}");
                Err(io::Error::other(e))
            }
            Err(e) => {
                // The client sees EIO for this read; the log names the damaged blob.
                eprintln!("cairn nbd: reading {} bytes at {offset}: {e}", buf.len());
                Err(io::Error::other(e.to_string()))
            }
        }
    }

    fn read_unit(&self, offset: u64) -> std::ops::Range<u64> {
        let i = self.chunk_at(offset);
        match self.file.node().content.get(i) {
            Some(c @ Chunk::Data { .. }) => self.starts[i]..self.starts[i] + c.len(),
            _ => offset..offset,
        }
    }

    fn extents(&self, offset: u64, length: u64) -> io::Result<Vec<Extent>> {
        let chunks = &self.file.node().content;
        let end = offset.saturating_add(length).min(self.size());
        let mut i = self.chunk_at(offset);
        let mut at = offset;
        let mut out: Vec<Extent> = Vec::new();
        while at < end && i < chunks.len() {
            let c_end = (self.starts[i] + chunks[i].len()).min(end);
            let state = match chunks[i] {
                Chunk::Zero { .. } => STATE_HOLE | STATE_ZERO,
                Chunk::Data { .. } => 0,
            };
            let full = out.len() == MAX_EXTENTS;
            match out.last_mut() {
                Some(e) if e.state == state => e.length += c_end - at,
                _ if full => break,
                _ => out.push(Extent { length: c_end - at, state }),
            }
            at = c_end;
            i += 1;
        }
        Ok(out)
    }
}
