//! Serving file content: a read of a mounted file is cut at its chunks; zero chunks are
//! zeros, data chunks come from the [`BlobCache`], where read-ahead put them, or are read on
//! the spot (a random read).
//!
//! Which read-ahead feeds a file ([`Prefetch`] streams, one pipeline for the whole mount): a
//! large file read sequentially gets a stream of its own, from the chunk being read to the end
//! of the file, moved along as the reader goes, started again after a jump and cancelled when
//! the file is closed; a small file is fed by a walk of its snapshot from the first file opened
//! on, across directories in the order a `tar` or `cp -r` of the mount reads them, so their
//! blobs arrive in a few large coalesced reads ahead of the reader instead of one round trip
//! each, and the pipeline never drains between directories.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use cairn_core::engine::repository::Repository;
use cairn_core::error::{Error, Result};
use cairn_format::id::BlobId;
use cairn_format::tree::{Chunk, Node};

use crate::cache::{Blob, BlobCache};
use crate::prefetch::{Blobs, Prefetch, Source, Stream};
use crate::walk::{data_blobs, SMALL_FILE};

/// A read within this distance of where the last one ended counts as sequential (the kernel
/// reads ahead itself, several requests at once, not always in order).
const SEQUENTIAL_SLACK: u64 = 8 * 1024 * 1024;

/// Walks kept at once (two readers walking different trees each keep theirs; a third one
/// cancels the least recently used).
const WALKS: usize = 2;

/// An open file.
pub struct OpenFile {
    node: Arc<Node>,
    /// Where each chunk starts.
    starts: Vec<u64>,
    state: Mutex<Streaming>,
}

/// Where an open file is being read and what reads ahead for it.
struct Streaming {
    /// The walk that brings a small file, or a large file's own stream.
    ahead: Option<Arc<Stream>>,
    /// Whether `ahead` is the file's own (cancelled when the file is closed or read elsewhere).
    own: bool,
    /// Where the last read ended.
    end: u64,
}

impl OpenFile {
    /// The file's node.
    pub fn node(&self) -> &Node {
        &self.node
    }
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        let st = self.state.get_mut().expect("file lock");
        if let Some(a) = st.ahead.take().filter(|_| st.own) {
            a.cancel(true);
        }
    }
}

/// The content side of the mount: the cache, the read pipeline and the walks.
pub struct Content {
    repo: Arc<Repository>,
    cache: Arc<BlobCache>,
    prefetch: Prefetch,
    walks: Mutex<VecDeque<Arc<Stream>>>,
}

impl Content {
    /// Content of `repo`'s snapshots, decoded blobs kept in `cache`, read ahead by `prefetch`.
    pub fn new(repo: Arc<Repository>, cache: Arc<BlobCache>, prefetch: Prefetch) -> Self {
        Content { repo, cache, prefetch, walks: Mutex::new(VecDeque::new()) }
    }

    /// Opens a file; `walk` starts a walk of its snapshot from this file on (asked only when
    /// no walk brings the file already).
    pub fn open(&self, node: Arc<Node>, walk: impl FnOnce() -> Box<dyn Source>) -> OpenFile {
        let starts = node.content.iter().scan(0u64, |at, c| Some(std::mem::replace(at, *at + c.len()))).collect();
        let ahead = match data_blobs(&node.content).next() {
            Some(first) if node.size <= SMALL_FILE => Some(self.walk_ahead(&first, walk)),
            _ => None,
        };
        OpenFile { node, starts, state: Mutex::new(Streaming { ahead, own: false, end: 0 }) }
    }

    /// The walk that brings blob `first` (now wanted), started if there is none.
    fn walk_ahead(&self, first: &BlobId, walk: impl FnOnce() -> Box<dyn Source>) -> Arc<Stream> {
        let mut walks = self.walks.lock().expect("walks lock");
        if let Some(at) = walks.iter().position(|w| w.covers(first)) {
            let w = walks.remove(at).expect("found");
            walks.push_back(w.clone());
            drop(walks);
            w.want(first);
            return w;
        }
        let w = self.prefetch.stream(walk());
        walks.push_back(w.clone());
        let old = (walks.len() > WALKS).then(|| walks.pop_front()).flatten();
        drop(walks);
        if let Some(old) = old {
            old.cancel(true);
        }
        w
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
        if let Some(a) = self.ahead_for(file, i, id, sequential) {
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

    /// The stream that will bring chunk `i` of `file`: the file's own or its walk if it has
    /// not given the chunk up; for a sequential read of a large file a new one from chunk `i`
    /// on.
    fn ahead_for(&self, file: &OpenFile, i: usize, id: &BlobId, sequential: bool) -> Option<Arc<Stream>> {
        let mut st = file.state.lock().expect("file lock");
        if let Some(a) = st.ahead.as_ref().filter(|a| a.covers(id) && !a.gave_up(id)) {
            return Some(a.clone());
        }
        if !sequential || file.node.size <= SMALL_FILE {
            return None;
        }
        let wanted: Vec<BlobId> = data_blobs(&file.node.content[i..]).collect();
        if let Some(old) = st.ahead.take().filter(|_| st.own) {
            // The reader jumped: what the old stream brought beyond the jump may still be read.
            old.cancel(false);
        }
        let a = self.prefetch.stream(Box::new(Blobs(Some(wanted))));
        st.ahead = Some(a.clone());
        st.own = true;
        Some(a)
    }
}
