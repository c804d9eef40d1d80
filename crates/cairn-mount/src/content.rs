//! Serving file content: a read of a mounted file is cut at its chunks; zero chunks are
//! zeros, data chunks come from the [`BlobCache`], where read-ahead put them, or are read on
//! the spot (a random read).
//!
//! Which read-ahead feeds a file: a large file read sequentially gets one of its own, from
//! the chunk being read to the end of the file, moved along as the reader goes and started
//! again after a jump; a small file is fed by its directory's, which brings the small files of
//! the directory in order from the first one opened (a `tar` or `cp -r` of the mount reads them
//! one after another, so their blobs arrive in a few large coalesced reads instead of one
//! round trip each).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use cairn_core::error::{Error, Result};
use cairn_core::id::BlobId;
use cairn_core::repository::Repository;
use cairn_core::tree::{Chunk, Node, NodeKind};

use crate::cache::{Blob, BlobCache};
use crate::inodes::Ino;
use crate::readahead::{Limits, ReadAhead};

/// Files up to this size are read ahead with their directory; larger ones on their own.
const SMALL_FILE: u64 = 4 * 1024 * 1024;

/// A read within this distance of where the last one ended counts as sequential (the kernel
/// reads ahead itself, several requests at once, not always in order).
const SEQUENTIAL_SLACK: u64 = 8 * 1024 * 1024;

/// Most files and plaintext bytes one directory read-ahead plans (a larger directory gets
/// another one when its reader gets there).
const DIR_FILES: usize = 4096;
const DIR_BYTES: u64 = 512 * 1024 * 1024;

/// Directory read-aheads kept at once (a `tar` goes into a subdirectory and comes back).
const DIR_READAHEADS: usize = 2;

/// An open file.
pub struct OpenFile {
    node: Arc<Node>,
    /// Where each chunk starts.
    starts: Vec<u64>,
    state: Mutex<Streaming>,
}

/// Where an open file is being read and what reads ahead for it.
struct Streaming {
    ahead: Option<Arc<ReadAhead>>,
    /// Where the last read ended.
    end: u64,
}

impl OpenFile {
    /// The file's node.
    pub fn node(&self) -> &Node {
        &self.node
    }
}

/// The content side of the mount: the cache, the read-ahead limits and the directories'
/// read-aheads.
pub struct Content {
    repo: Arc<Repository>,
    cache: Arc<BlobCache>,
    limits: Limits,
    dirs: Mutex<VecDeque<(Ino, Arc<ReadAhead>)>>,
}

impl Content {
    /// Content of `repo`'s snapshots, decoded blobs kept within `cache_bytes`, each read-ahead
    /// within `limits`.
    pub fn new(repo: Arc<Repository>, cache_bytes: u64, limits: Limits) -> Self {
        Content { repo, cache: Arc::new(BlobCache::new(cache_bytes)), limits, dirs: Mutex::new(VecDeque::new()) }
    }

    /// Opens a file of directory `parent`; `siblings` gives the files of that directory from
    /// this one on, in order (asked only when a directory read-ahead has to start).
    pub fn open(&self, node: Arc<Node>, parent: Ino, siblings: impl FnOnce() -> Vec<Arc<Node>>) -> OpenFile {
        let starts = node.content.iter().scan(0u64, |at, c| Some(std::mem::replace(at, *at + c.len()))).collect();
        let ahead = match first_blob(&node) {
            Some(first) if node.size <= SMALL_FILE => self.dir_ahead(parent, &first, siblings),
            _ => None,
        };
        OpenFile { node, starts, state: Mutex::new(Streaming { ahead, end: 0 }) }
    }

    /// The directory read-ahead of `parent` that brings `first`, started if there is none.
    fn dir_ahead(
        &self,
        parent: Ino,
        first: &BlobId,
        siblings: impl FnOnce() -> Vec<Arc<Node>>,
    ) -> Option<Arc<ReadAhead>> {
        let mut dirs = self.dirs.lock().expect("dirs lock");
        if let Some((_, a)) = dirs.iter().find(|(p, a)| *p == parent && a.covers(first) && !a.passed(first)) {
            return Some(a.clone());
        }
        let (mut files, mut bytes, mut wanted) = (0, 0, Vec::new());
        for n in siblings() {
            if n.kind != NodeKind::File || n.size > SMALL_FILE || first_blob(&n).is_none() {
                continue;
            }
            files += 1;
            bytes += n.size;
            wanted.extend(data_blobs(&n.content));
            if files >= DIR_FILES || bytes >= DIR_BYTES {
                break;
            }
        }
        // A blob missing from the index is reported when the file is read.
        let ahead = Arc::new(ReadAhead::start(&self.repo, &self.cache, &wanted, self.limits).ok()?);
        dirs.push_back((parent, ahead.clone()));
        let old = (dirs.len() > DIR_READAHEADS).then(|| dirs.pop_front());
        drop(dirs);
        drop(old); // stopped outside the lock
        Some(ahead)
    }

    /// Reads up to `size` bytes of `file` at `offset` (fewer at the end of the file).
    pub fn read(&self, file: &OpenFile, offset: u64, size: u32) -> Result<Vec<u8>> {
        let end = file.node.size.min(offset.saturating_add(u64::from(size)));
        if offset >= end {
            return Ok(Vec::new());
        }
        let sequential = {
            let mut st = file.state.lock().expect("file lock");
            let seq = offset == 0 || offset.abs_diff(st.end) <= SEQUENTIAL_SLACK;
            st.end = end;
            seq
        };
        let mut out = Vec::with_capacity((end - offset) as usize);
        let mut i = file.starts.partition_point(|&s| s <= offset).saturating_sub(1);
        let mut pos = offset;
        while pos < end && i < file.node.content.len() {
            let (chunk, start) = (&file.node.content[i], file.starts[i]);
            let take = (end.min(start + chunk.len()) - pos) as usize;
            let within = (pos - start) as usize;
            match chunk {
                Chunk::Zero { .. } => out.resize(out.len() + take, 0),
                Chunk::Data { id, len } => {
                    let blob = self.blob(file, i, id, sequential)?;
                    if blob.len() != *len as usize {
                        return Err(Error::invalid(
                            format!("blob {}", id.short()),
                            "a chunk's recorded length differs from its blob",
                        ));
                    }
                    out.extend_from_slice(&blob[within..within + take]);
                }
            }
            pos += take as u64;
            i += 1;
        }
        Ok(out)
    }

    /// Data chunk `i` of `file` (blob `id`): from the cache, from read-ahead, or read now.
    fn blob(&self, file: &OpenFile, i: usize, id: &BlobId, sequential: bool) -> Result<Blob> {
        if let Some(b) = self.cache.get(id) {
            // Read-ahead brought it: its window moves on.
            if let Some(a) = file.state.lock().expect("file lock").ahead.as_ref() {
                a.want(id);
            }
            return Ok(b);
        }
        if let Some(a) = self.ahead_for(file, i, id, sequential)? {
            a.want(id);
            if let Some(b) = self.cache.wait(id, || a.gave_up(id)) {
                return Ok(b);
            }
        }
        // A random read, or read-ahead could not bring it: read it alone (its error, if any, is
        // the one reported).
        let b = Arc::new(self.repo.read_blob(id)?);
        self.cache.insert(*id, b.clone());
        Ok(b)
    }

    /// The read-ahead that will bring chunk `i` of `file`: the file's own or its directory's
    /// if it has not passed the chunk; for a sequential read of a large file a new one from
    /// chunk `i` on.
    fn ahead_for(&self, file: &OpenFile, i: usize, id: &BlobId, sequential: bool) -> Result<Option<Arc<ReadAhead>>> {
        let mut st = file.state.lock().expect("file lock");
        if let Some(a) = st.ahead.as_ref().filter(|a| a.covers(id) && !a.passed(id)) {
            return Ok(Some(a.clone()));
        }
        if !sequential || file.node.size <= SMALL_FILE {
            return Ok(None);
        }
        let wanted: Vec<BlobId> = data_blobs(&file.node.content[i..]).collect();
        let old = st.ahead.take();
        drop(old); // the old one stops before the new one starts reading
        let a = Arc::new(ReadAhead::start(&self.repo, &self.cache, &wanted, self.limits)?);
        st.ahead = Some(a.clone());
        Ok(Some(a))
    }
}

/// The blob of a file's first data chunk.
fn first_blob(node: &Node) -> Option<BlobId> {
    data_blobs(&node.content).next()
}

/// The blobs of `chunks`, in order.
fn data_blobs(chunks: &[Chunk]) -> impl Iterator<Item = BlobId> + '_ {
    chunks.iter().filter_map(|c| match c {
        Chunk::Data { id, .. } => Some(*id),
        Chunk::Zero { .. } => None,
    })
}
