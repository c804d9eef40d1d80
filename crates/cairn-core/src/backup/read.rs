//! Read stage: a file's content becomes a list of chunks. Holes are found with SEEK_DATA /
//! SEEK_HOLE and never read; all-zero chunks are recorded without data.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use super::store::BlobStore;
use crate::chunker::{is_zero, ChunkerKind};
use crate::error::{Error, Result};
use crate::pack::BlobKind;
use crate::platform::data_regions;
use crate::tree::{Chunk, Node};

/// What reading a file found.
pub struct ReadFile {
    /// The chunks, in order.
    pub content: Vec<Chunk>,
    /// Bytes read from the file.
    pub bytes_read: u64,
    /// Set when the file changed while it was read.
    pub changed: Option<String>,
}

/// Opens a file for reading without updating its access time where permitted.
fn open_noatime(path: &Path) -> std::io::Result<File> {
    match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOATIME | libc::O_NOFOLLOW).open(path) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path)
        }
        other => other,
    }
}

/// Reads and chunks the file at `path`, whose metadata is in `node`.
pub fn read_file(path: &Path, node: &Node, chunker: &ChunkerKind, store: &BlobStore<'_>) -> Result<ReadFile> {
    let mut file = open_noatime(path).map_err(|e| Error::io(path, "cannot open", e))?;
    let regions = data_regions(&file, node.size).map_err(|e| Error::io(path, "cannot find data regions", e))?;
    let mut content: Vec<Chunk> = Vec::new();
    let mut pos = 0u64;
    let mut bytes_read = 0u64;
    let mut shrunk = false;
    let push_zero = |content: &mut Vec<Chunk>, len: u64| {
        if let Some(Chunk::Zero { len: prev }) = content.last_mut() {
            *prev += len;
        } else {
            content.push(Chunk::Zero { len });
        }
    };
    for (offset, len) in regions {
        if offset > pos {
            push_zero(&mut content, offset - pos);
        }
        file.seek(SeekFrom::Start(offset)).map_err(|e| Error::io(path, "cannot seek", e))?;
        let mut got = 0u64;
        chunker
            .chunk((&mut file).take(len), len, |data: Vec<u8>| -> Result<(), ChunkError> {
                got += data.len() as u64;
                if is_zero(&data) {
                    push_zero(&mut content, data.len() as u64);
                } else {
                    let len = data.len() as u32;
                    let id = store.save(BlobKind::Data, data).map_err(ChunkError::Store)?;
                    content.push(Chunk::Data { id, len });
                }
                Ok(())
            })
            .map_err(|e| match e {
                ChunkError::Read(e) => Error::io(path, "cannot read", e),
                ChunkError::Store(e) => e,
            })?;
        bytes_read += got;
        pos = offset + got;
        if got < len {
            shrunk = true; // the file shrank while we read it
            break;
        }
    }
    // A trailing hole (or a file that is one big hole), unless the file shrank.
    if !shrunk && pos < node.size {
        push_zero(&mut content, node.size - pos);
        pos = node.size;
    }
    let after = file.metadata().map_err(|e| Error::io(path, "cannot stat", e))?;
    let changed = if after.len() != node.size || pos != node.size {
        Some(format!(
            "changed while it was read: its size was {} bytes, {pos} bytes were read, its size is now {}; stored as read",
            node.size,
            after.len()
        ))
    } else if after.mtime() != node.mtime.secs || after.mtime_nsec() as u32 != node.mtime.nanos {
        Some("modified while it was read; stored as read".to_string())
    } else {
        None
    };
    Ok(ReadFile { content, bytes_read, changed })
}

/// Why chunking a file stopped: reading it failed, or storing a chunk did.
enum ChunkError {
    Read(std::io::Error),
    Store(Error),
}

impl From<std::io::Error> for ChunkError {
    fn from(e: std::io::Error) -> Self {
        ChunkError::Read(e)
    }
}
