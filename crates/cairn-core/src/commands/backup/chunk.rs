//! Chunk stage: cut content into chunks, hash each, and hand new ones to the store (which
//! drops what the repository or another worker already has). All-zero chunks are recorded as
//! [`Chunk::Zero`] without data. Runs on the reader's thread, so a file's chunk list is known
//! when its last byte is read; storing the blobs goes on without the reader.

use std::io::Read;

use super::store::BlobStore;
use crate::engine::chunker::{is_zero, ChunkerKind};
use crate::error::{Error, Result};
use cairn_format::pack::BlobKind;
use cairn_format::tree::Chunk;

/// Appends `len` zero bytes to `content`, merging with a zero run before it.
pub(super) fn push_zero(content: &mut Vec<Chunk>, len: u64) {
    if let Some(Chunk::Zero { len: prev }) = content.last_mut() {
        *prev += len;
    } else {
        content.push(Chunk::Zero { len });
    }
}

/// Why chunking stopped: reading failed, or storing a chunk did.
pub(super) enum ChunkError {
    /// The input could not be read.
    Read(std::io::Error),
    /// The store stage failed (fatal for the backup).
    Store(Error),
}

impl From<std::io::Error> for ChunkError {
    fn from(e: std::io::Error) -> Self {
        ChunkError::Read(e)
    }
}

/// Chunks everything `reader` yields (about `len` bytes) onto `content`; returns the number
/// of bytes consumed.
pub(super) fn chunk_into(
    reader: impl Read,
    len: u64,
    chunker: &ChunkerKind,
    store: &BlobStore<'_>,
    content: &mut Vec<Chunk>,
) -> std::result::Result<u64, ChunkError> {
    let mut got = 0u64;
    chunker.chunk(reader, len, |data: Vec<u8>| -> std::result::Result<(), ChunkError> {
        got += data.len() as u64;
        if is_zero(&data) {
            push_zero(content, data.len() as u64);
        } else {
            let len = data.len() as u32;
            let id = store.save(BlobKind::Data, data).map_err(ChunkError::Store)?;
            content.push(Chunk::Data { id, len });
        }
        Ok(())
    })?;
    Ok(got)
}

/// Chunks a whole stream (standard input) into a chunk list; `what` names it for errors.
pub(super) fn chunk_stream(
    reader: impl Read,
    what: &str,
    chunker: &ChunkerKind,
    store: &BlobStore<'_>,
) -> Result<(Vec<Chunk>, u64)> {
    let mut content = Vec::new();
    let n = chunk_into(reader, u64::MAX, chunker, store, &mut content).map_err(|e| match e {
        ChunkError::Read(e) => Error::io(what, "cannot read", e),
        ChunkError::Store(e) => e,
    })?;
    Ok((content, n))
}
