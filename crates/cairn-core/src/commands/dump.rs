//! `cairn dump`: one file raw, or a directory as a tar stream, written in order to any writer.
//!
//! The blobs are read through the read path ([`crate::engine::read`]): the plan turns the stream's
//! chunks, in order, into ranged reads (neighbours in one pack merged), the reader fetches and
//! decodes them ahead of the writer by a bounded window of reads, and the writer takes each
//! read's blobs in order.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crossbeam_channel::{unbounded, Receiver, Sender};

use super::restore::plan::{self, BatchLimit, Filter, Top};
use super::restore::types::{Entry, Link};
use crate::engine::read::{coalesce_gap, ordered_reads, Decoded, Pace, Paced, Plain, ReadRef, Reader, Sink, MAX_READ};
use crate::engine::repository::Repository;
use crate::error::{Error, Result};
use cairn_format::id::BlobId;
use cairn_format::pack::BlobEntry;
use cairn_format::snapshot::Snapshot;
use cairn_format::tree::{Chunk, NodeKind};

/// What a dump wrote.
#[derive(Debug, Default)]
pub struct DumpStats {
    /// Entries written (1 for a single file).
    pub entries: u64,
    /// Bytes of file content.
    pub bytes: u64,
}

/// What arrived for one read: its blobs, or why one of them could not be read.
enum Arrival<'s> {
    Blobs(Vec<Decoded<'s>>),
    Failed(Error),
}

/// The dump's end of the read path: every read's outcome goes to the writer, keyed by its
/// place in the list of reads (the reader numbers them in the order it was given them).
#[derive(Clone)]
struct ToStream<'s> {
    arrived: Sender<(usize, Arrival<'s>)>,
}

impl<'s> Sink<'s> for ToStream<'s> {
    fn blobs(&self, read: ReadRef<'s>, blobs: Vec<Decoded<'s>>) -> bool {
        self.arrived.send((read.seq, Arrival::Blobs(blobs))).is_ok()
    }

    fn failed(&self, read: ReadRef<'s>, blob: &BlobEntry, why: &Error) {
        let why =
            Error::corrupt(cairn_format::layout::pack_path(&read.pack), format!("blob {}: {why}", blob.id.short()));
        let _ = self.arrived.send((read.seq, Arrival::Failed(why)));
    }
}

/// The blobs of a dump in order, as the writer takes them.
struct Stream<'s> {
    next_read: usize,
    arrived: Receiver<(usize, Arrival<'s>)>,
    early: HashMap<usize, Arrival<'s>>,
    current: VecDeque<Decoded<'s>>,
    last: Option<Decoded<'s>>,
    pace: &'s Pace,
    /// The library error behind the last failed read (reported instead of the I/O error the
    /// tar writer wraps it in).
    error: Option<Error>,
}

impl<'s> Stream<'s> {
    /// Makes blob `id` the current one: the same as the last, or the next one delivered.
    fn advance(&mut self, id: &BlobId) -> Result<&[u8]> {
        if self.last.as_ref().is_none_or(|l| l.id != *id) {
            if self.current.is_empty() {
                self.current = self.next_read()?.into();
            }
            let mut blob = self.current.pop_front().filter(|b| b.id == *id);
            if self.current.is_empty() {
                // The last blob of its read is kept as a copy of its own, so the read's
                // reservation is free before the next read is waited for: with a budget too
                // small for two reads, holding it would stop the next from ever starting.
                blob = blob.map(|b| Decoded { id: b.id, data: Plain::Own(b.data.to_vec()), _reservation: None });
            }
            self.last = Some(blob.ok_or_else(|| Error::Internal("the dump stream is out of order".into()))?);
        }
        Ok(&self.last.as_ref().expect("just set").data)
    }

    fn next_read(&mut self) -> Result<Vec<Decoded<'s>>> {
        let seq = self.next_read;
        self.next_read += 1;
        self.pace.reach(self.next_read);
        loop {
            match self.early.remove(&seq) {
                Some(Arrival::Blobs(b)) => return Ok(b),
                Some(Arrival::Failed(e)) => return Err(e),
                None => {}
            }
            let (s, a) = self.arrived.recv().map_err(|_| Error::Internal("the dump's readers stopped early".into()))?;
            // The first outcome of a read counts: a failure is sent before the rest of its blobs.
            self.early.entry(s).or_insert(a);
        }
    }
}

/// Reads one file's content from the stream.
struct ContentReader<'o, 's> {
    stream: &'o mut Stream<'s>,
    chunks: std::slice::Iter<'o, Chunk>,
    pos: usize,
    in_blob: usize,
    zeros_left: u64,
}

impl io::Read for ContentReader<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.zeros_left > 0 {
                let n = (buf.len() as u64).min(self.zeros_left) as usize;
                buf[..n].fill(0);
                self.zeros_left -= n as u64;
                return Ok(n);
            }
            if self.pos < self.in_blob {
                let data = &self.stream.last.as_ref().expect("a current blob").data;
                let n = buf.len().min(self.in_blob - self.pos);
                buf[..n].copy_from_slice(&data[self.pos..self.pos + n]);
                self.pos += n;
                return Ok(n);
            }
            match self.chunks.next() {
                None => return Ok(0),
                Some(Chunk::Zero { len }) => self.zeros_left = *len,
                Some(Chunk::Data { id, len }) => {
                    let got = match self.stream.advance(id) {
                        Ok(data) => data.len(),
                        Err(e) => {
                            let msg = e.to_string();
                            self.stream.error = Some(e);
                            return Err(io::Error::other(msg));
                        }
                    };
                    if got != *len as usize {
                        let e = Error::invalid(
                            format!("blob {}", id.short()),
                            "a chunk's recorded length differs from its blob",
                        );
                        let msg = e.to_string();
                        self.stream.error = Some(e);
                        return Err(io::Error::other(msg));
                    }
                    self.in_blob = got;
                    self.pos = 0;
                }
            }
        }
    }
}

impl<'o, 's> ContentReader<'o, 's> {
    fn new(stream: &'o mut Stream<'s>, chunks: &'o [Chunk]) -> Self {
        ContentReader { stream, chunks: chunks.iter(), pos: 0, in_blob: 0, zeros_left: 0 }
    }
}

/// Writes `path` of `snapshot` to `out`: a regular file raw, a directory (or `/`) as a tar
/// stream. `fetchers` reads are in flight at once (`None`: the storage's own default);
/// `max_memory` bounds the whole dump (the
/// index, a batch of entries, the trees read ahead and the data in flight).
pub fn dump(
    repo: &Repository,
    snapshot: &Snapshot,
    name: &str,
    path: &Path,
    out: &mut dyn Write,
    fetchers: Option<usize>,
    max_memory: u64,
) -> Result<DumpStats> {
    let fetchers = fetchers.unwrap_or_else(|| repo.storage().default_concurrency()).max(1);
    let base = crate::engine::trees::below_root(path).unwrap_or(Path::new("/"));
    let (top, single) = match crate::engine::trees::resolve(repo, &snapshot.tree, base, name)? {
        None => (Top::Tree(snapshot.tree), false),
        Some(n) if n.kind == NodeKind::Dir => (Top::Tree(n.subtree.expect("validated dir")), false),
        Some(n) if n.kind == NodeKind::File => (Top::Node(Box::new(n)), true),
        Some(_) => {
            return Err(Error::Usage(format!("{} is neither a file nor a directory; nothing to dump", path.display())))
        }
    };
    let fetchers = fetchers.max(1);
    if single {
        let plan =
            plan::build(repo, top, base, &Filter::default(), fetchers, &crate::engine::trees::Loading::default())?;
        // One entry: all but the index is for the data in flight.
        let budget = max_memory.saturating_sub(repo.index().memory_bytes()).max(max_memory / 4);
        return read_entries(repo, &plan.entries, budget, fetchers, |stream| write_raw(&plan.entries[0], stream, out));
    }
    // A directory streams in batches, as a restore does (restore/plan.rs): memory holds one
    // batch of entries, the walk's path and the data in flight, however many files there are.
    let limit = BatchLimit::for_memory(max_memory);
    let budget = limit.data_budget(max_memory, super::restore::fixed_memory(repo));
    let loading = crate::engine::trees::Loading::default();
    loading.read_ahead.limit(limit.tree_packs());
    let mut tar = tar::Builder::new(out);
    let mut stats = DumpStats::default();
    let mut failed = None;
    let walked = plan::stream(repo, top, base, &Filter::default(), false, fetchers, &loading, limit, |batch| {
        let written = read_entries(repo, &batch.entries, budget, fetchers, |stream| {
            write_tar(&batch.entries, stream, &mut tar, &mut stats)
        });
        written.map_err(|e| failed = Some(e)).is_ok()
    });
    if let Some(e) = failed {
        return Err(e);
    }
    walked?;
    tar.finish().map_err(tar_error)?;
    Ok(stats)
}

/// Reads the content of `entries`' files through the read path (`budget` bytes in flight at
/// most, `fetchers` reads at once) and hands their blobs, in order, to `write`.
fn read_entries<T>(
    repo: &Repository,
    entries: &[Entry],
    budget: u64,
    fetchers: usize,
    write: impl FnOnce(&mut Stream<'_>) -> Result<T>,
) -> Result<T> {
    let wanted: Vec<BlobId> = entries
        .iter()
        .filter(|e| e.node.kind == NodeKind::File && e.link_of.is_none())
        .flat_map(|e| e.node.content.iter())
        .filter_map(|c| match c {
            Chunk::Data { id, .. } => Some(*id),
            Chunk::Zero { .. } => None,
        })
        .collect();
    let reads = ordered_reads(&repo.index(), &wanted, coalesce_gap(repo))?;
    let reader = Reader::new(repo, budget, Arc::new(AtomicBool::new(false)));
    // Reads in flight or waiting to be written: each reserves at most 2 × MAX_READ, so the
    // window always fits the budget and a read never waits for budget the writer cannot free.
    let window = (budget / (2 * MAX_READ)).max(1) as usize;
    let pace = Pace::default();
    std::thread::scope(|s| {
        let (tx, rx) = unbounded();
        let sink = ToStream { arrived: tx };
        let feed = Paced::new(&reads, window, &pace, || reader.cancelled());
        let workers = reader.start(s, feed, fetchers, crate::engine::platform::cores(), sink);
        let mut stream = Stream {
            next_read: 0,
            arrived: rx,
            early: HashMap::new(),
            current: VecDeque::new(),
            last: None,
            pace: &pace,
            error: None,
        };
        let result = write(&mut stream);
        reader.cancel(); // done or failed: the feeder and fetchers stop
        let result = match (result, stream.error.take()) {
            (Err(_), Some(damage)) => Err(damage),
            (r, _) => r,
        };
        drop(stream);
        for w in workers {
            w.join().expect("a dump worker panicked");
        }
        result
    })
}

fn write_raw(entry: &Entry, stream: &mut Stream<'_>, out: &mut dyn Write) -> Result<DumpStats> {
    let mut reader = ContentReader::new(stream, &entry.node.content);
    let bytes = io::copy(&mut reader, out).map_err(|e| Error::io("<stdout>", "cannot write", e))?;
    Ok(DumpStats { entries: 1, bytes })
}

/// Appends `entries` (one batch, in tree order) to the tar stream.
fn write_tar<W: Write>(
    entries: &[Entry],
    stream: &mut Stream<'_>,
    tar: &mut tar::Builder<W>,
    stats: &mut DumpStats,
) -> Result<()> {
    for e in entries {
        let n = &e.node;
        let mut h = tar::Header::new_gnu();
        h.set_mode(n.mode);
        h.set_uid(u64::from(n.uid));
        h.set_gid(u64::from(n.gid));
        h.set_mtime(n.mtime.secs.max(0) as u64);
        let _ = h.set_username(&n.user);
        let _ = h.set_groupname(&n.group);
        h.set_size(0);
        let path = &e.rel;
        // A hard link names its group's first path (in this batch or an earlier one).
        let first = match &e.link_of {
            Some(Link::Entry(first)) => Some(entries[*first].rel.as_path()),
            Some(Link::Earlier(rel)) => Some(rel.as_path()),
            None => None,
        };
        if let Some(first) = first {
            h.set_entry_type(tar::EntryType::Link);
            tar.append_link(&mut h, path, first).map_err(tar_error)?;
            stats.entries += 1;
            continue;
        }
        match n.kind {
            NodeKind::File => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(n.size);
                let reader = ContentReader::new(stream, &n.content);
                tar.append_data(&mut h, path, reader).map_err(tar_error)?;
                stats.bytes += n.size;
            }
            NodeKind::Dir => {
                h.set_entry_type(tar::EntryType::Directory);
                tar.append_data(&mut h, path, io::empty()).map_err(tar_error)?;
            }
            NodeKind::Symlink => {
                h.set_entry_type(tar::EntryType::Symlink);
                let target = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&n.target);
                tar.append_link(&mut h, path, target).map_err(tar_error)?;
            }
            NodeKind::Fifo | NodeKind::CharDevice | NodeKind::BlockDevice => {
                let kind = match n.kind {
                    NodeKind::Fifo => tar::EntryType::Fifo,
                    NodeKind::CharDevice => tar::EntryType::Char,
                    _ => tar::EntryType::Block,
                };
                h.set_entry_type(kind);
                let (major, minor) = (libc::major(n.rdev as libc::dev_t), libc::minor(n.rdev as libc::dev_t));
                h.set_device_major(major).map_err(tar_error)?;
                h.set_device_minor(minor).map_err(tar_error)?;
                tar.append_data(&mut h, path, io::empty()).map_err(tar_error)?;
            }
        }
        stats.entries += 1;
    }
    Ok(())
}

/// A failed write of the tar stream.
fn tar_error(e: std::io::Error) -> Error {
    Error::io("<stdout>", "cannot write the tar stream", e)
}
