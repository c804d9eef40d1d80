//! `cairn dump`: one file raw, or a directory as a tar stream, written in order to any writer.
//!
//! Blobs are fetched and decoded (the same ranged reads and [`decode_blob`] as a restore) by a
//! pool of workers that runs ahead of the writer by a bounded window, across file boundaries;
//! the writer takes them in order.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::path::Path;

use crossbeam_channel::{bounded, Receiver, Sender};

use super::plan::{self, Entry, Filter, Top};
use crate::error::{Error, Result};
use crate::id::BlobId;
use crate::pack::{decode_blob, pack_path};
use crate::repository::Repository;
use crate::snapshot::Snapshot;
use crate::tree::{Chunk, NodeKind};

/// What a dump wrote.
#[derive(Debug, Default)]
pub struct DumpStats {
    /// Entries written (1 for a single file).
    pub entries: u64,
    /// Bytes of file content.
    pub bytes: u64,
}

type Fetched = (u64, Result<Vec<u8>>);

/// Delivers the data blobs of a dump in order, fetched ahead by a worker pool.
struct Ordered<'a> {
    wanted: &'a [BlobId],
    next_request: usize,
    next_take: usize,
    window: usize,
    jobs: Option<Sender<(u64, BlobId)>>,
    results: Receiver<Fetched>,
    early: HashMap<u64, Result<Vec<u8>>>,
}

impl Ordered<'_> {
    fn top_up(&mut self) {
        while self.next_request < self.wanted.len() && self.next_request < self.next_take + self.window {
            let job = (self.next_request as u64, self.wanted[self.next_request]);
            if self.jobs.as_ref().is_none_or(|j| j.send(job).is_err()) {
                return;
            }
            self.next_request += 1;
        }
    }

    fn take(&mut self) -> Result<Vec<u8>> {
        self.top_up();
        let seq = self.next_take as u64;
        self.next_take += 1;
        loop {
            if let Some(r) = self.early.remove(&seq) {
                self.top_up();
                return r;
            }
            let (s, r) = self.results.recv().map_err(|_| Error::Internal("dump workers stopped".into()))?;
            self.early.insert(s, r);
        }
    }
}

fn fetch_and_decode(repo: &Repository, id: &BlobId) -> Result<Vec<u8>> {
    let loc = repo.index().get(id).ok_or_else(|| Error::NotFound(format!("blob {} (not in any index)", id.short())))?;
    let path = pack_path(&loc.pack);
    let sealed = repo.storage().read_range(&path, u64::from(loc.entry.offset), u64::from(loc.entry.length))?;
    decode_blob(repo.key(), &repo.key().object_key(&loc.salt), &loc.entry, sealed, &path)
}

/// Reads one file's content from the ordered stream.
struct ContentReader<'o, 'a> {
    ordered: &'o mut Ordered<'a>,
    chunks: std::slice::Iter<'o, Chunk>,
    current: Vec<u8>,
    pos: usize,
    zeros_left: u64,
}

impl Read for ContentReader<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.zeros_left > 0 {
                let n = (buf.len() as u64).min(self.zeros_left) as usize;
                buf[..n].fill(0);
                self.zeros_left -= n as u64;
                return Ok(n);
            }
            if self.pos < self.current.len() {
                let n = buf.len().min(self.current.len() - self.pos);
                buf[..n].copy_from_slice(&self.current[self.pos..self.pos + n]);
                self.pos += n;
                return Ok(n);
            }
            match self.chunks.next() {
                None => return Ok(0),
                Some(Chunk::Zero { len }) => self.zeros_left = *len,
                Some(Chunk::Data { len, .. }) => {
                    let data = self.ordered.take().map_err(io::Error::other)?;
                    if data.len() != *len as usize {
                        return Err(io::Error::other("a chunk's recorded length differs from its blob"));
                    }
                    self.current = data;
                    self.pos = 0;
                }
            }
        }
    }
}

/// Writes `path` of `snapshot` to `out`: a regular file raw, a directory (or `/`) as a tar
/// stream. `workers` blobs are fetched at once.
pub fn dump(
    repo: &Repository,
    snapshot: &Snapshot,
    name: &str,
    path: &str,
    out: &mut dyn Write,
    workers: usize,
) -> Result<DumpStats> {
    let base = path.trim_end_matches('/');
    let (top, single) = match plan::resolve(repo, &snapshot.tree, base, name)? {
        None => (Top::Tree(snapshot.tree), false),
        Some(n) if n.kind == NodeKind::Dir => (Top::Tree(n.subtree.expect("validated dir")), false),
        Some(n) if n.kind == NodeKind::File => (Top::Node(Box::new(n)), true),
        Some(_) => return Err(Error::Usage(format!("{path:?} is neither a file nor a directory; nothing to dump"))),
    };
    let workers = workers.max(1);
    let base_path = Path::new(if base.is_empty() { "/" } else { base });
    let plan = plan::build(repo, top, base_path, &Filter::default(), workers, &plan::Loading::default())?;
    let wanted: Vec<BlobId> = plan
        .entries
        .iter()
        .filter(|e| e.node.kind == NodeKind::File && e.link_of.is_none())
        .flat_map(|e| e.node.content.iter())
        .filter_map(|c| match c {
            Chunk::Data { id, .. } => Some(*id),
            Chunk::Zero { .. } => None,
        })
        .collect();
    std::thread::scope(|s| {
        let (jobs_tx, jobs_rx) = bounded::<(u64, BlobId)>(workers * 4);
        let (res_tx, res_rx) = bounded::<Fetched>(workers * 4);
        for _ in 0..workers {
            let (rx, tx) = (jobs_rx.clone(), res_tx.clone());
            s.spawn(move || {
                for (seq, id) in rx {
                    if tx.send((seq, fetch_and_decode(repo, &id))).is_err() {
                        return;
                    }
                }
            });
        }
        drop((jobs_rx, res_tx));
        let mut ordered = Ordered {
            wanted: &wanted,
            next_request: 0,
            next_take: 0,
            window: workers * 4,
            jobs: Some(jobs_tx),
            results: res_rx,
            early: HashMap::new(),
        };
        let result = if single {
            write_raw(&plan.entries[0], &mut ordered, out)
        } else {
            write_tar(&plan.entries, &mut ordered, out)
        };
        ordered.jobs = None; // let the workers finish
        while ordered.results.recv().is_ok() {}
        result
    })
}

fn write_raw(entry: &Entry, ordered: &mut Ordered<'_>, out: &mut dyn Write) -> Result<DumpStats> {
    let mut reader =
        ContentReader { ordered, chunks: entry.node.content.iter(), current: Vec::new(), pos: 0, zeros_left: 0 };
    let bytes = io::copy(&mut reader, out).map_err(|e| Error::io("<stdout>", "cannot write", e))?;
    Ok(DumpStats { entries: 1, bytes })
}

fn write_tar(entries: &[Entry], ordered: &mut Ordered<'_>, out: &mut dyn Write) -> Result<DumpStats> {
    let mut tar = tar::Builder::new(out);
    let mut stats = DumpStats::default();
    let io_err = |e| Error::io("<stdout>", "cannot write the tar stream", e);
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
        if let Some(first) = e.link_of {
            h.set_entry_type(tar::EntryType::Link);
            tar.append_link(&mut h, path, &entries[first].rel).map_err(io_err)?;
            stats.entries += 1;
            continue;
        }
        match n.kind {
            NodeKind::File => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(n.size);
                let reader =
                    ContentReader { ordered, chunks: n.content.iter(), current: Vec::new(), pos: 0, zeros_left: 0 };
                tar.append_data(&mut h, path, reader).map_err(io_err)?;
                stats.bytes += n.size;
            }
            NodeKind::Dir => {
                h.set_entry_type(tar::EntryType::Directory);
                tar.append_data(&mut h, path, io::empty()).map_err(io_err)?;
            }
            NodeKind::Symlink => {
                h.set_entry_type(tar::EntryType::Symlink);
                let target = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&n.target);
                tar.append_link(&mut h, path, target).map_err(io_err)?;
            }
            NodeKind::Fifo | NodeKind::CharDevice | NodeKind::BlockDevice => {
                let kind = match n.kind {
                    NodeKind::Fifo => tar::EntryType::Fifo,
                    NodeKind::CharDevice => tar::EntryType::Char,
                    _ => tar::EntryType::Block,
                };
                h.set_entry_type(kind);
                let (major, minor) = (libc::major(n.rdev as libc::dev_t), libc::minor(n.rdev as libc::dev_t));
                h.set_device_major(major).map_err(io_err)?;
                h.set_device_minor(minor).map_err(io_err)?;
                tar.append_data(&mut h, path, io::empty()).map_err(io_err)?;
            }
        }
        stats.entries += 1;
    }
    tar.finish().map_err(io_err)?;
    Ok(stats)
}
