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
    pub fn on_disk<'a>(self, files: impl IntoIterator<Item = &'a ObjectInfo>, max_memory: Option<u64>) -> bool {
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
fn estimated_blobs<'a>(files: impl IntoIterator<Item = &'a ObjectInfo>) -> u64 {
    files.into_iter().map(|f| f.size / ENTRY_LEN as u64).sum()
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

/// Removes from `dir` the sorted index file of `files` and `doomed`, if there is one (it was
/// built without an index file that could not be read: the next command builds its own).
pub fn forget(dir: Option<&Path>, files: &[ObjectInfo], doomed: &IdSet<PackId>) {
    if let Some(d) = dir {
        let _ = std::fs::remove_file(d.join(hex::encode(key(files, doomed))));
    }
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
                    let run =
                        if run_bits == 0 { 0 } else { (sorted::id_prefix(&entry.id) >> (64 - run_bits)) as usize };
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

/// The error for `what` (`blob`, `tree`) `id` that `index` did not find: not in any index, or
/// [`damaged`] if the index's sorted index file turned out damaged.
pub fn not_found(index: &Index, what: &str, id: &cairn_format::id::BlobId) -> Error {
    if index.is_damaged() {
        return damaged();
    }
    Error::NotFound(format!("{what} {} (not in any index)", id.short()))
}

/// The directory of sorted index files for the repository `repo_id` under the cache base `base`.
pub fn dir_in(base: &Path, repo_id: &str) -> Option<PathBuf> {
    let plain = !repo_id.is_empty() && repo_id.bytes().all(|b| b.is_ascii_alphanumeric());
    plain.then(|| base.join(repo_id).join("index-sorted"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::compress::Codec;
    use cairn_format::id::BlobId;
    use cairn_format::index::encode;
    use cairn_format::pack::{BlobEntry, BlobKind};
    use proptest::prelude::*;

    /// Blob `n`'s ID: a hash, so IDs spread over every bucket as real ones do.
    fn id(n: u16) -> BlobId {
        BlobId(*blake3::hash(&n.to_le_bytes()).as_bytes())
    }

    fn entry() -> impl Strategy<Value = BlobEntry> {
        (0u16..400, any::<bool>(), any::<u32>(), 64u32..1000, any::<u32>()).prop_map(
            |(n, tree, offset, length, raw)| BlobEntry {
                id: id(n),
                kind: if tree { BlobKind::Tree } else { BlobKind::Data },
                codec: Codec::Lz4,
                offset: offset / 2,
                length,
                raw_length: raw,
            },
        )
    }

    fn pack() -> impl Strategy<Value = IndexedPack> {
        (any::<[u8; 32]>(), any::<[u8; 32]>(), proptest::collection::vec(entry(), 0..40))
            .prop_map(|(id, salt, blobs)| IndexedPack { id: PackId(id), salt, blobs })
    }

    /// The index files `files` (each a list of packs) as a listing and a reader.
    fn listing(files: &[Vec<IndexedPack>]) -> Vec<ObjectInfo> {
        let infos = files.iter().enumerate();
        infos.map(|(n, f)| ObjectInfo { path: format!("index/{n:02}"), size: encode(f).len() as u64 }).collect()
    }

    fn reader(files: &[Vec<IndexedPack>]) -> impl Fn(&str) -> Result<Vec<IndexedPack>> + Sync + '_ {
        |path: &str| Ok(files[path["index/".len()..].parse::<usize>().unwrap()].clone())
    }

    fn on_disk(dir: &Path, files: &[Vec<IndexedPack>], doomed: &IdSet<PackId>) -> Index {
        load(Some(dir), &listing(files), doomed, reader(files), 2).unwrap()
    }

    /// Every question gets the same answer from both indexes.
    fn same(a: &Index, b: &Index) -> std::result::Result<(), TestCaseError> {
        prop_assert_eq!(a.len(), b.len());
        prop_assert_eq!(a.largest_tree(), b.largest_tree());
        prop_assert_eq!(a.tree_packs(), b.tree_packs());
        prop_assert_eq!(a.pack_ends(), b.pack_ends());
        for n in 0..a.pack_ends().len() as u32 + 2 {
            prop_assert_eq!(a.is_doomed(n), b.is_doomed(n));
        }
        for n in 0..420 {
            let id = id(n);
            prop_assert_eq!(a.get(&id), b.get(&id));
            prop_assert_eq!(a.position(&id), b.position(&id));
            prop_assert_eq!(a.contains(&id), b.contains(&id));
            prop_assert_eq!(a.contains_live(&id), b.contains_live(&id));
            if let Some(pos) = a.position(&id) {
                prop_assert_eq!(a.at(pos), b.at(pos));
                prop_assert_eq!(a.at(pos).map(|l| l.entry.id), Some(id));
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// A sorted index file answers every question as the in-memory index does, doomed
        /// packs, copies of a blob in several packs and packs added since loading included;
        /// opened a second time it is read, not built again.
        #[test]
        fn disk_and_memory_indexes_answer_alike(
            files in proptest::collection::vec(proptest::collection::vec(pack(), 0..4), 0..5),
            doomed_picks in proptest::collection::vec(any::<prop::sample::Index>(), 0..3),
            added in proptest::collection::vec(pack(), 0..3),
        ) {
            let all: Vec<&IndexedPack> = files.iter().flatten().collect();
            let doomed: IdSet<PackId> =
                if all.is_empty() { IdSet::default() } else { doomed_picks.iter().map(|i| i.get(&all).id).collect() };
            let dir = tempfile::tempdir().unwrap();
            let mut memory = Index::with_doomed(files.iter().flatten(), &doomed);
            let mut disk = on_disk(dir.path(), &files, &doomed);
            prop_assert!(disk.is_on_disk() && !memory.is_on_disk());
            same(&memory, &disk)?;
            let built = std::fs::read_dir(dir.path()).unwrap().count();
            prop_assert_eq!(built, 1);
            let again = load(Some(dir.path()), &listing(&files), &doomed, |_: &str| panic!("read again"), 2).unwrap();
            same(&memory, &again)?;
            for p in &added {
                memory.add_pack(p);
                disk.add_pack(p);
            }
            same(&memory, &disk)?;
        }
    }

    fn some_files() -> Vec<Vec<IndexedPack>> {
        let blob = |n: u16| BlobEntry {
            id: id(n),
            kind: if n.is_multiple_of(7) { BlobKind::Tree } else { BlobKind::Data },
            codec: Codec::None,
            offset: u32::from(n) * 100,
            length: 100,
            raw_length: 60,
        };
        (0..3u8)
            .map(|f| {
                let blobs = (0..2000).filter(|n| n % 3 == u16::from(f)).map(blob).collect();
                vec![IndexedPack { id: PackId([f; 32]), salt: [f; 32], blobs }]
            })
            .collect()
    }

    fn the_file(dir: &Path) -> PathBuf {
        let mut names: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(names.len(), 1, "one sorted index file: {names:?}");
        names.pop().unwrap()
    }

    /// A sorted index file cut short, or with a byte of its tables changed, is found damaged
    /// when opened and built again; one with a byte of its records changed is found damaged by
    /// the lookup that reads them (which answers "not found", never a wrong entry), removed,
    /// and built again by the next load.
    #[test]
    fn a_damaged_file_is_rebuilt_never_trusted() {
        let files = some_files();
        let doomed = IdSet::default();
        let dir = tempfile::tempdir().unwrap();
        let good = Index::from_packs(files.iter().flatten());
        on_disk(dir.path(), &files, &doomed);
        let path = the_file(dir.path());
        let bytes = std::fs::read(&path).unwrap();
        let tables_at = 2000 * RECORD_LEN;
        for damage in
            [Damage::Cut(1), Damage::Cut(bytes.len() - 10), Damage::Flip(tables_at + 5), Damage::Flip(bytes.len() - 40)]
        {
            let mut bad = bytes.clone();
            match damage {
                Damage::Cut(n) => bad.truncate(bad.len() - n),
                Damage::Flip(at) => bad[at] ^= 0x20,
            }
            std::fs::write(&path, &bad).unwrap();
            let index = on_disk(dir.path(), &files, &doomed);
            assert_eq!(std::fs::read(the_file(dir.path())).unwrap(), bytes, "{damage:?}: rebuilt whole");
            for n in 0..2100 {
                assert_eq!(index.get(&id(n)), good.get(&id(n)), "{damage:?}");
            }
        }
        // A record's byte changed: the lookups reading its bucket say "not found", the others
        // still answer, and the file is gone.
        let mut bad = bytes.clone();
        bad[RECORD_LEN * 1000 + 10] ^= 1;
        std::fs::write(&path, &bad).unwrap();
        let index = on_disk(dir.path(), &files, &doomed);
        let damaged = Index::from_packs(files.iter().flatten()).at(1000).unwrap().entry.id;
        assert_eq!(index.get(&damaged), None);
        assert!(index.is_damaged());
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "the damaged file is removed");
        let index = on_disk(dir.path(), &files, &doomed);
        assert_eq!(index.get(&damaged), good.get(&damaged));
        assert!(!index.is_damaged());
    }

    #[derive(Debug, Clone, Copy)]
    enum Damage {
        Cut(usize),
        Flip(usize),
    }

    /// Built from other index files (one more, or another pack doomed), a new file is built
    /// and the old one removed; without a directory, a temporary file serves.
    #[test]
    fn other_index_files_build_another_file() {
        let mut files = some_files();
        let dir = tempfile::tempdir().unwrap();
        on_disk(dir.path(), &files[..2], &IdSet::default());
        let first = the_file(dir.path());
        let index = on_disk(dir.path(), &files, &IdSet::default());
        assert_ne!(the_file(dir.path()), first);
        assert_eq!(index.len(), 2000);
        let doomed: IdSet<PackId> = [PackId([1; 32])].into_iter().collect();
        let index = on_disk(dir.path(), &files, &doomed);
        assert!(index.is_doomed(1) && !index.contains_live(&id(1)) && index.contains_live(&id(0)));
        files.push(Vec::new());
        let temp = load(None, &listing(&files), &doomed, reader(&files), 1).unwrap();
        assert!(temp.is_on_disk() && temp.len() == 2000);
    }

    #[test]
    fn cairn_index_names_a_placement() {
        let files = [ObjectInfo { path: "index/a".into(), size: 48 << 20 }];
        assert!(Placement::Auto.on_disk(&files, Some(64 << 20)));
        assert!(!Placement::Auto.on_disk(&files, Some(4 << 30)));
        assert!(!Placement::Memory.on_disk(&files, Some(1)));
        assert!(Placement::Disk.on_disk(&[], None));
    }
}
