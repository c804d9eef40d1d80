//! Read stage: `--read-concurrency` workers turn files into chunk lists. Holes are found with
//! SEEK_DATA / SEEK_HOLE and never read. A reader is free for the next file as soon as the
//! last byte is read and chunked: storing the blobs and the directory's tree happen without it.

use std::io::{Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crossbeam_channel::Receiver;

use super::chunk::{chunk_into, push_zero, ChunkError};
use super::pending::Slot;
use super::Shared;
use crate::engine::platform::{data_regions, open_noatime};
use crate::error::{Error, Result};
use cairn_format::tree::{Chunk, Timestamp};

/// One file to read.
pub(super) struct ReadJob {
    /// Where it is.
    pub path: PathBuf,
    /// Its size and modification time when the walker saw it.
    pub size: u64,
    /// See `size`.
    pub mtime: Timestamp,
    /// Read by content though it is not a regular file (a block device given as a path).
    pub device: bool,
    /// Where the chunk list goes.
    pub slot: Slot,
    /// `(device, inode)` of a file with several hard links: the walker's other links to it
    /// wait for this read.
    pub link: Option<(u64, u64)>,
}

/// What reading a file found.
pub(super) struct ReadFile {
    /// The chunks, in order.
    pub content: Vec<Chunk>,
    /// Bytes read from the file.
    pub bytes_read: u64,
    /// Set when the file changed while it was read.
    pub changed: Option<String>,
}

/// Runs one reader until the walker is done.
pub(super) fn run(sh: &Shared<'_>, jobs: Receiver<ReadJob>) -> Result<()> {
    for job in jobs {
        sh.progress.start_reading(&job.path);
        let read = read_file(&job.path, job.size, job.mtime, job.device, sh);
        sh.progress.stop_reading(&job.path);
        sh.progress.file_done(job.size);
        let content = match read {
            Ok(r) => {
                sh.counters.bytes_read.fetch_add(r.bytes_read, std::sync::atomic::Ordering::Relaxed);
                if let Some(why) = r.changed {
                    sh.warn(&job.path, why);
                }
                Some(r.content)
            }
            Err(Error::Io { source, what, .. }) => {
                sh.warn(&job.path, format!("{what}: {source}; not backed up"));
                None
            }
            Err(e) => return Err(e),
        };
        let waiting = match job.link {
            Some(key) => sh.links.finish(key, content.clone()),
            None => Vec::new(),
        };
        for slot in std::iter::once(&job.slot).chain(&waiting) {
            finish(sh, slot, content.as_deref())?;
        }
    }
    Ok(())
}

/// Fills a file's slot with its content, or leaves it out when it could not be read.
pub(super) fn finish(sh: &Shared<'_>, slot: &Slot, content: Option<&[Chunk]>) -> Result<()> {
    match content {
        Some(c) => slot.fill(sh, |node| {
            node.content = c.to_vec();
            node.size = c.iter().map(Chunk::len).sum();
        }),
        None => slot.drop_entry(sh),
    }
}

/// Reads and chunks the file at `path`, which had `size` bytes and modification time `mtime`.
fn read_file(path: &Path, size: u64, mtime: Timestamp, device: bool, sh: &Shared<'_>) -> Result<ReadFile> {
    let mut file = open_noatime(path).map_err(|e| Error::io(path, "cannot open", e))?;
    let regions = if device { vec![(0, size)] } else { data_regions(&file, 0, size) };
    let mut content: Vec<Chunk> = Vec::new();
    let mut pos = 0u64;
    let mut bytes_read = 0u64;
    let mut shrunk = false;
    for (offset, len) in regions {
        if offset > pos {
            push_zero(&mut content, offset - pos);
        }
        file.seek(SeekFrom::Start(offset)).map_err(|e| Error::io(path, "cannot seek", e))?;
        let got =
            chunk_into(std::io::Read::take(&mut file, len), len, &sh.chunker, sh.store, &mut content).map_err(|e| {
                match e {
                    ChunkError::Read(e) => Error::io(path, "cannot read", e),
                    ChunkError::Store(e) => e,
                }
            })?;
        bytes_read += got;
        pos = offset + got;
        if got < len {
            shrunk = true; // the file shrank while we read it
            break;
        }
    }
    // A trailing hole (or a file that is one big hole), unless the file shrank.
    if !shrunk && pos < size {
        push_zero(&mut content, size - pos);
        pos = size;
    }
    if device {
        return Ok(ReadFile { content, bytes_read, changed: None });
    }
    let after = file.metadata().map_err(|e| Error::io(path, "cannot stat", e))?;
    let changed = if after.len() != size || pos != size {
        Some(format!(
            "changed while it was read: its size was {size} bytes, {pos} bytes were read, its size is now {}; stored as read",
            after.len()
        ))
    } else if after.mtime() != mtime.secs || after.mtime_nsec() as u32 != mtime.nanos {
        Some("modified while it was read; stored as read".to_string())
    } else {
        None
    };
    Ok(ReadFile { content, bytes_read, changed })
}
