//! The index on this machine's disk: a sorted index file (FORMAT.md §17) for an index too large
//! for a command's memory.
//!
//! An index whose slots would take more than a quarter of the command's `--max-memory` (256 MiB
//! for commands without one: about 4.8 million blobs) is built into a file of fixed-size records
//! sorted by ID, in the metadata cache directory (`<cache>/<repository ID>/index-sorted/<key>`,
//! local repositories included), named by the BLAKE3 of the index files and doomed packs it was
//! built from: a second command on an unchanged repository opens it (reads its tables: 80 bytes
//! a pack, 8 a bucket of about 8 blobs) instead of reading every index file. A change of index
//! files builds a new one, and the others are removed. Without a cache directory (`--no-cache`)
//! the file is an unnamed temporary file in the system's temporary directory, built by every
//! command and gone when it ends.
//!
//! The build reads the index files a few at a time and writes each blob's record to one of up
//! to 256 run files by its ID's top bits (IDs are hashes: the runs are even), then sorts each run
//! in memory (about 8 MiB each) and appends it: it holds neither the whole index nor every index
//! file at once. Lookups read one bucket with `pread` (not `mmap`: a file that another process
//! truncates while mapped kills the reader with SIGBUS, and the pages a mapping touches count in
//! the command's resident memory) and check it against its sum.
//!
//! `CAIRN_INDEX=disk` or `=memory` forces either (tests and benchmarks).

use std::fs::File;
use std::io::{BufWriter, Read, Seek, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::engine::parallel::map_parallel;
use crate::engine::storage::ObjectInfo;
use crate::error::{Error, Result};
use cairn_format::id::{IdSet, PackId};
use cairn_format::index::{Index, IndexedPack};
use cairn_format::pack::ENTRY_LEN;
use cairn_format::sorted::{self, DiskSlots, PackInfo, Slot, SortedFile, RECORD_LEN, TRAILER_LEN};

/// The share of a command's memory budget past which the index goes to disk: a quarter.
pub const BUDGET_SHARE: u64 = 4;
/// Where the index goes to disk for commands without a memory budget.
pub const DEFAULT_LIMIT: u64 = 256 << 20;
/// Bytes of memory a loaded blob takes in the in-memory index (its slot and lookup table).
pub const MEMORY_PER_BLOB: u64 = 56;
/// Bytes of records a run holds, about: what the build sorts in memory at once.
const RUN_BYTES: u64 = 8 << 20;
/// Most run files (each open, with a 16 KiB buffer, while the index files are read).
const MAX_RUN_BITS: u32 = 8;

/// Where the index is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// In memory if it fits in its share of the budget, else on disk.
    Auto,
    /// In memory.
    Memory,
    /// On disk.
    Disk,
}

impl Placement {
    /// What `CAIRN_INDEX` asks for (`disk`, `memory`; unset or empty: [`Placement::Auto`]).
    pub fn from_env() -> Result<Self> {
        match std::env::var("CAIRN_INDEX") {
            Err(_) => Ok(Placement::Auto),
            Ok(v) => match v.as_str() {
                "" => Ok(Placement::Auto),
                "disk" => Ok(Placement::Disk),
                "memory" => Ok(Placement::Memory),
                _ => Err(Error::invalid(
                    "CAIRN_INDEX",
                    format!("{v:?} is neither `disk` nor `memory`: use one of them or unset it"),
                )),
            },
        }
    }

    /// Whether an index of the index files `files` goes to disk for a command allowed
    /// `max_memory` bytes.
    pub fn on_disk(self, files: &[ObjectInfo], max_memory: Option<u64>) -> bool {
        match self {
            Placement::Memory => false,
            Placement::Disk => true,
            Placement::Auto => {
                let limit = max_memory.map_or(DEFAULT_LIMIT, |m| m / BUDGET_SHARE);
                estimated_blobs(files).saturating_mul(MEMORY_PER_BLOB) > limit
            }
        }
    }
}

/// About how many blobs the index files list (a 48-byte entry each, and a little more).
fn estimated_blobs(files: &[ObjectInfo]) -> u64 {
    files.iter().map(|f| f.size / ENTRY_LEN as u64).sum()
}

/// What a sorted index file is built from: the index files' names and the doomed packs, each
/// sorted, hashed.
pub fn key(files: &[ObjectInfo], doomed: &IdSet<PackId>) -> [u8; 32] {
    let mut names: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
    names.sort_unstable();
    let mut doomed: Vec<&PackId> = doomed.iter().collect();
    doomed.sort_unstable();
    let mut h = blake3::Hasher::new();
    h.update(b"cairn sorted index v1\n");
    for n in names {
        h.update(n.as_bytes());
        h.update(b"\n");
    }
    h.update(b"doomed\n");
    doomed.iter().for_each(|p| {
        h.update(&p.0);
    });
    *h.finalize().as_bytes()
}

/// The index of the index files `files` (read with `read`, `threads` at a time) on disk, the
/// packs in `doomed` about to be deleted: the sorted index file in `dir` built from them if
/// there is a sound one, else one built now (in `dir`, or without one a temporary file).
pub fn load(
    dir: Option<&Path>,
    files: &[ObjectInfo],
    doomed: &IdSet<PackId>,
    read: impl Fn(&str) -> Result<Vec<IndexedPack>> + Sync,
    threads: usize,
) -> Result<Index> {
    let key = key(files, doomed);
    let path = dir.map(|d| d.join(hex::encode(key)));
    if let Some(path) = &path {
        match File::open(path) {
            Ok(file) => match open(file, Some(path.clone()), &key) {
                Ok(index) => return Ok(index),
                Err(why) => {
                    tracing::warn!("the sorted index {} is damaged ({why}); rebuilding it", path.display());
                    let _ = std::fs::remove_file(path);
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("cannot open the sorted index {}: {e}; rebuilding it", path.display()),
        }
    }
    let dir = dir.and_then(|d| match std::fs::create_dir_all(d) {
        Ok(()) => Some(d),
        Err(e) => {
            tracing::warn!("cannot create {} ({e}): the sorted index is a temporary file", d.display());
            None
        }
    });
    let (file, path) = build(dir, files, doomed, &key, read, threads)?;
    let at = path.as_deref().unwrap_or(Path::new("a temporary file")).to_owned();
    open(file, path, &key).map_err(|why| Error::invalid(at.display().to_string(), format!("just built, {why}")))
}

/// A sorted index file read with `pread`.
struct IndexFile {
    file: File,
    /// Its name in the cache (removed when found damaged).
    path: Option<PathBuf>,
}

impl SortedFile for IndexFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn damaged(&self, why: &str) {
        let name = self.path.as_deref().map_or("(a temporary file)".into(), |p| p.display().to_string());
        tracing::warn!("the sorted index {name} is damaged ({why}); it is removed, and the next command rebuilds it");
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Opens a sorted index file built from `key`, checking its trailer and tables.
fn open(file: File, path: Option<PathBuf>, key: &[u8; 32]) -> std::result::Result<Index, String> {
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    if len < TRAILER_LEN as u64 {
        return Err(format!("{len} bytes: shorter than its trailer"));
    }
    let mut raw = [0u8; TRAILER_LEN];
    file.read_exact_at(&mut raw, len - TRAILER_LEN as u64).map_err(|e| e.to_string())?;
    let trailer = sorted::parse_trailer(&raw, len)?;
    if trailer.key != *key {
        return Err("built from other index files".into());
    }
    let mut tables = vec![0u8; trailer.tables_len() as usize];
    file.read_exact_at(&mut tables, trailer.tables_at()).map_err(|e| e.to_string())?;
    let mut tables = sorted::parse_tables(&trailer, &tables)?;
    let packs = std::mem::take(&mut tables.packs);
    let slots = DiskSlots::new(Box::new(IndexFile { file, path }), &trailer, tables);
    Ok(Index::on_disk(packs, slots))
}

fn io<'a>(at: &'a Path, what: &'static str) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |e| Error::io(at, what, e)
}

/// Builds the sorted index file (see the module's notes); returns it, and its name if in `dir`.
fn build(
    dir: Option<&Path>,
    files: &[ObjectInfo],
    doomed: &IdSet<PackId>,
    key: &[u8; 32],
    read: impl Fn(&str) -> Result<Vec<IndexedPack>> + Sync,
    threads: usize,
) -> Result<(File, Option<PathBuf>)> {
    let tmp_dir = dir.map_or_else(std::env::temp_dir, Path::to_path_buf);
    let records = estimated_blobs(files).max(1) * RECORD_LEN as u64;
    let run_bits = (records / RUN_BYTES).max(1).next_power_of_two().trailing_zeros().min(MAX_RUN_BITS);
    let temp = |what: &'static str| tempfile::tempfile_in(&tmp_dir).map_err(io(&tmp_dir, what));
    let mut runs = (0..1usize << run_bits)
        .map(|_| Ok(BufWriter::with_capacity(16 << 10, temp("cannot create a run file for the sorted index")?)))
        .collect::<Result<Vec<_>>>()?;
    let mut packs: Vec<PackInfo> = Vec::new();
    let mut count = 0u64;
    let mut rec = Vec::with_capacity(RECORD_LEN);
    let threads = threads.max(1);
    for some in files.chunks(threads) {
        for file in map_parallel(some, threads, |f| read(&f.path)) {
            for p in file? {
                let pack = u32::try_from(packs.len()).map_err(|_| Error::invalid("index", "more than 2^32 packs"))?;
                let mut info = PackInfo::new(p.id, p.salt, doomed.contains(&p.id));
                for &entry in &p.blobs {
                    info.count(&entry);
                    rec.clear();
                    Slot { entry, pack }.encode(&mut rec);
                    let run = if run_bits == 0 { 0 } else { (sorted::id_prefix(&entry.id) >> (64 - run_bits)) as usize };
                    runs[run].write_all(&rec).map_err(io(&tmp_dir, "cannot write a run file"))?;
                }
                count += p.blobs.len() as u64;
                packs.push(info);
            }
        }
    }
    // Buckets never span two runs: at least as many bucket bits as run bits.
    let mut writer = sorted::Writer::new(sorted::bits_for(count).max(run_bits));
    let (out, name) = match dir {
        Some(d) => {
            let named = tempfile::NamedTempFile::new_in(d).map_err(io(d, "cannot create the sorted index"))?;
            let (file, tmp) = named.into_parts();
            (file, Some(tmp))
        }
        None => (temp("cannot create the sorted index")?, None),
    };
    let mut out = BufWriter::with_capacity(1 << 20, out);
    let mut bytes = Vec::new();
    for run in runs {
        let mut run = run.into_inner().map_err(|e| Error::io(&tmp_dir, "cannot write a run file", e.into_error()))?;
        run.rewind().map_err(io(&tmp_dir, "cannot read a run file"))?;
        bytes.clear();
        run.read_to_end(&mut bytes).map_err(io(&tmp_dir, "cannot read a run file"))?;
        drop(run);
        let mut slots = bytes
            .chunks_exact(RECORD_LEN)
            .map(Slot::decode)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|why| Error::invalid("a run file of the sorted index", why))?;
        bytes = Vec::new();
        sorted::sort_slots(&mut slots, |p| packs[p as usize].doomed);
        let mut chunk = Vec::with_capacity(4096 * RECORD_LEN);
        for some in slots.chunks(4096) {
            chunk.clear();
            writer.records(some, &mut chunk).map_err(|why| Error::invalid("index", why))?;
            out.write_all(&chunk).map_err(io(&tmp_dir, "cannot write the sorted index"))?;
        }
    }
    out.write_all(&writer.finish(&packs, key)).map_err(io(&tmp_dir, "cannot write the sorted index"))?;
    let file = out.into_inner().map_err(|e| Error::io(&tmp_dir, "cannot write the sorted index", e.into_error()))?;
    let (Some(d), Some(tmp)) = (dir, name) else { return Ok((file, None)) };
    let path = d.join(hex::encode(key));
    tmp.persist(&path).map_err(|e| Error::io(&path, "cannot store the sorted index", e.error))?;
    // The files built from other index files are stale (a process reading one keeps it open).
    if let Ok(entries) = std::fs::read_dir(d) {
        for e in entries.flatten() {
            let stale = e.file_name().to_str().is_some_and(|n| !n.starts_with('.') && e.path() != path);
            if stale {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    Ok((file, Some(path)))
}

/// The error of a command whose sorted index file turned out damaged while it ran (the file
/// is removed: the next command builds it again).
pub fn damaged() -> Error {
    Error::invalid(
        "the sorted index",
        "turned out damaged while the command ran; it was removed: run the command again to rebuild it",
    )
}

/// The directory of sorted index files for the repository `repo_id` under the cache base `base`.
pub fn dir_in(base: &Path, repo_id: &str) -> Option<PathBuf> {
    let plain = !repo_id.is_empty() && repo_id.bytes().all(|b| b.is_ascii_alphanumeric());
    plain.then(|| base.join(repo_id).join("index-sorted"))
}
