//! Reading ahead while a repository is being opened: listings and sealed files that need no key
//! to fetch (issue #18, "start at once").
//!
//! Opening waits for the key files to be listed, one to be read and its key derived. Listing
//! `index/`, `snapshots/` and `deletions/` needs no key, and neither does fetching the files
//! they name (each is checked against its name, a hash); only decrypting them does. So
//! `Repository::open_preloaded` lists and fetches them beside the key's round trips, and the
//! repository's own listing and reading take these results once instead of asking again: a
//! restore at 50 ms per request waits two round trips before it knows its index and snapshot,
//! not six.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::engine::parallel::map_parallel;
use crate::engine::storage::{ObjectInfo, Storage};
use crate::error::Result;
use cairn_format::id::PackId;
use cairn_format::layout::{self, Dir};

/// Most files fetched at once per directory.
const PRELOAD_THREADS: usize = 32;
/// Most bytes of index files fetched ahead: a larger index is read a few files at a time as it
/// loads (it may go to disk, `sorted_index`), never held whole.
pub const PRELOAD_INDEX_MAX: u64 = 64 << 20;

/// Whether the index of the index files `wanted` is not to be fetched ahead: it goes to disk
/// for a command allowed `max_memory`, or its files pass [`PRELOAD_INDEX_MAX`].
fn index_goes_to_disk(wanted: &[&ObjectInfo], max_memory: Option<u64>) -> bool {
    use crate::engine::sorted_index::Placement;
    // A bad CAIRN_INDEX is refused when the index loads; here it fetches nothing ahead.
    let placement = Placement::from_env().unwrap_or(Placement::Disk);
    placement.on_disk(wanted.iter().copied(), max_memory)
        || wanted.iter().map(|o| o.size).sum::<u64>() > PRELOAD_INDEX_MAX
}

/// What to read ahead while opening.
#[derive(Clone, Debug, Default)]
pub struct Preload {
    /// List `index/` and `deletions/` (a command that loads the index).
    pub index: bool,
    /// List `snapshots/`, and fetch the snapshots this names: `latest` all of them, anything
    /// else those whose ID starts with it (a command that opens one snapshot).
    pub snapshot: Option<String>,
    /// Fetch the listed files' bytes too (not when a metadata cache will serve them).
    pub fetch_files: bool,
    /// List `keys/` and fetch every key file (a check parses them all).
    pub keys: bool,
    /// List `data/` (a check compares the packs there with the index; no pack is fetched).
    pub packs: bool,
    /// The key file that opened the repository last time (`cache::key_hint`): read and tried
    /// at once, beside the listing of `keys/`.
    pub key: Option<cairn_format::id::KeyId>,
    /// Most bytes of the tree packs the start hint names to read whole once the key opens,
    /// beside the index files (a restore that reads every tree pack at its start; 0: none).
    pub tree_packs: u64,
    /// The command's memory budget, when it has one: index files are fetched ahead only while
    /// the index they make stays in memory ([`crate::engine::sorted_index::Placement`]); an
    /// index on disk reads them a few at a time as it builds its file, or not at all once the
    /// file is built, and held here they would take the memory it saves.
    pub max_memory: Option<u64>,
}

impl Preload {
    /// Read nothing ahead.
    pub fn none() -> Self {
        Preload::default()
    }

    /// What a command that reads snapshot `spec` with the index needs.
    pub fn snapshot(spec: &str, fetch_files: bool) -> Self {
        Preload { index: true, snapshot: Some(spec.to_ascii_lowercase()), fetch_files, ..Preload::default() }
    }

    /// What a command that reads every file of the repository but the packs' contents needs
    /// (`check`): the index, every snapshot, the key files, and the listing of the packs.
    pub fn everything(fetch_files: bool) -> Self {
        Preload {
            index: true,
            snapshot: Some("latest".into()),
            fetch_files,
            keys: true,
            packs: true,
            ..Preload::default()
        }
    }

    /// This, for a command allowed `max_memory` bytes (see [`Preload::max_memory`]).
    pub fn with_max_memory(self, max_memory: u64) -> Self {
        Preload { max_memory: Some(max_memory), ..self }
    }

    /// This, with the start hint's tree packs read ahead up to `bytes` (when the files are
    /// fetched at all: a metadata cache serves the trees otherwise).
    pub fn with_tree_packs(self, bytes: u64) -> Self {
        let tree_packs = if self.fetch_files { bytes } else { 0 };
        Preload { tree_packs, ..self }
    }

    fn dirs(&self) -> Vec<Dir> {
        let mut dirs = Vec::new();
        if self.keys {
            dirs.push(Dir::Keys);
        }
        if self.packs {
            dirs.push(Dir::Data);
        }
        if self.index {
            dirs.extend([Dir::Index, Dir::Deletions]);
        }
        if self.snapshot.is_some() {
            dirs.push(Dir::Snapshots);
        }
        dirs
    }

    /// Whether the listed file `path` of `dir` is worth fetching ahead.
    fn wants(&self, dir: Dir, path: &str) -> bool {
        match (dir, &self.snapshot) {
            // Packs are listed, never read ahead; key files are small, few, and never cached.
            (Dir::Data, _) => false,
            (Dir::Keys, _) => true,
            _ if !self.fetch_files => false,
            (Dir::Snapshots, Some(spec)) => {
                let name = crate::engine::snapshot_name::SnapshotName::parse(spec);
                name == crate::engine::snapshot_name::SnapshotName::Latest
                    || layout::parse_snapshot_path(path).is_some_and(|id| name.may_name(&id))
            }
            _ => true,
        }
    }
}

/// Listings and files read ahead, each handed out once (a second listing asks the storage
/// again, so a long-running command never works from an old one).
#[derive(Default)]
pub struct Preloaded {
    listings: Mutex<HashMap<Dir, Vec<ObjectInfo>>>,
    files: Mutex<HashMap<String, Vec<u8>>>,
}

impl Preloaded {
    /// Lists and fetches what `what` asks for, each directory on its own thread and its files
    /// `threads` at a time. What fails is left out: the repository asks again when it needs it
    /// and reports the error then.
    pub fn fetch(storage: &dyn Storage, what: &Preload, threads: usize) -> Self {
        let out = Preloaded::default();
        std::thread::scope(|s| {
            for dir in what.dirs() {
                let out = &out;
                let started = std::thread::Builder::new().name("cairn-preload".into()).spawn_scoped(s, move || {
                    let Ok(listed) = storage.list(dir.name()) else { return };
                    let mut wanted: Vec<&ObjectInfo> = listed.iter().filter(|o| what.wants(dir, &o.path)).collect();
                    if dir == Dir::Index && index_goes_to_disk(&wanted, what.max_memory) {
                        wanted.clear();
                    }
                    // All at once (up to [`PRELOAD_THREADS`]): a few at a time would wait a
                    // round trip per few files.
                    let threads = threads.max(wanted.len().min(PRELOAD_THREADS));
                    let read =
                        map_parallel(&wanted, threads, |o| crate::engine::storage::read_checked(storage, &o.path));
                    let mut files = out.files.lock().expect("preload lock");
                    for (o, bytes) in wanted.iter().zip(read) {
                        if let Ok(bytes) = bytes {
                            files.insert(o.path.clone(), bytes);
                        }
                    }
                    drop(files);
                    out.listings.lock().expect("preload lock").insert(dir, listed);
                });
                // Without a thread the repository lists and reads as usual.
                if let Err(e) = started {
                    tracing::warn!("cannot start a thread to read ahead: {e}");
                }
            }
        });
        out
    }

    /// `dir`'s listing, from the read-ahead if it holds one, else from `storage`.
    pub fn list(&self, storage: &dyn Storage, dir: Dir) -> Result<Vec<ObjectInfo>> {
        match self.listings.lock().expect("preload lock").remove(&dir) {
            Some(listed) => Ok(listed),
            None => storage.list(dir.name()),
        }
    }

    /// The bytes of `path` if they were read ahead (already checked against its name).
    pub fn take_file(&self, path: &str) -> Option<Vec<u8>> {
        self.files.lock().expect("preload lock").remove(path)
    }
}

/// Whole tree packs read on the start hint's word (FORMAT.md §14), from their first byte. The
/// reads start once the key opens and run on threads of their own, not waited for by the open:
/// a read that stalls then stalls the walk that takes it, where the restore's watchdog reports
/// it and SIGINT stops it, not the open. Each pack is taken once; a taker of a pack whose read
/// is still in flight waits for it.
#[derive(Default)]
pub struct HintedPacks {
    /// Pack → `None` while its read is in flight, then its bytes (or `None` if it failed).
    slots: Mutex<HashMap<PackId, Option<Option<Vec<u8>>>>>,
    landed: std::sync::Condvar,
}

impl HintedPacks {
    /// Starts reading `length` bytes from the start of each pack, each on a thread of its own
    /// (there are at most [`cairn_format::hint::TREE_PACKS_MAX`]). A pack whose thread cannot start is
    /// left out.
    pub(crate) fn start(
        storage: std::sync::Arc<dyn Storage>,
        packs: &[cairn_format::hint::TreePack],
    ) -> std::sync::Arc<Self> {
        let out = std::sync::Arc::new(HintedPacks::default());
        for p in packs {
            out.slots.lock().expect("hinted packs lock").insert(p.pack, None);
            let (storage, out2, p) = (storage.clone(), out.clone(), *p);
            let started = std::thread::Builder::new().name("cairn-hinted".into()).spawn(move || {
                let read = storage.read_range(&cairn_format::layout::pack_path(&p.pack), 0, p.length);
                let bytes = read.ok().filter(|b| b.len() as u64 == p.length);
                let mut slots = out2.slots.lock().expect("hinted packs lock");
                // Gone if the walk let go of the packs meanwhile.
                if let Some(slot) = slots.get_mut(&p.pack) {
                    *slot = Some(bytes);
                }
                out2.landed.notify_all();
            });
            if started.is_err() {
                out.slots.lock().expect("hinted packs lock").remove(&p.pack);
            }
        }
        out
    }

    /// The first `len` bytes of `pack` if it was read on the hint's word (waiting for its read
    /// if that is in flight) and at least that many came back. Not checked here: each blob in
    /// them is, when it is decrypted.
    pub(crate) fn take(&self, pack: &PackId, len: u64) -> Option<Vec<u8>> {
        let mut slots = self.slots.lock().expect("hinted packs lock");
        let mut bytes = loop {
            match slots.get(pack)? {
                None => slots = self.landed.wait(slots).expect("hinted packs lock"),
                Some(_) => break slots.remove(pack).flatten().flatten()?,
            }
        };
        let len = usize::try_from(len).ok().filter(|&l| l <= bytes.len())?;
        bytes.truncate(len);
        Some(bytes)
    }

    /// Lets go of the packs nothing took (a walk that read its trees otherwise), landed or not.
    pub(crate) fn clear(&self) {
        self.slots.lock().expect("hinted packs lock").clear();
        self.landed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_prefix_fetches_only_the_snapshots_it_names() {
        let path = |c: char| format!("snapshots/{}", c.to_string().repeat(64));
        let p = Preload::snapshot("AB", true);
        assert!(p.wants(Dir::Snapshots, &format!("snapshots/ab{}", "0".repeat(62))));
        assert!(!p.wants(Dir::Snapshots, &path('c')));
        assert!(p.wants(Dir::Index, "index/anything"));
        assert!(Preload::snapshot("latest", true).wants(Dir::Snapshots, &path('c')));
        assert!(!Preload::snapshot("latest", false).wants(Dir::Index, "index/x"));
        assert_eq!(Preload::none().dirs(), []);
    }

    /// A hinted pack is taken once, whole or as a prefix, after its read lands; a pack that
    /// is missing or shorter than the hint says is not there to take.
    #[test]
    fn hinted_packs_are_taken_once_and_only_as_read() {
        use cairn_format::hint::TreePack;
        let dir = tempfile::tempdir().unwrap();
        let storage: std::sync::Arc<dyn Storage> =
            std::sync::Arc::new(crate::engine::storage::OpendalStorage::local(dir.path().to_str().unwrap()).unwrap());
        storage.create().unwrap();
        let (here, short, gone) = (PackId([0xab; 32]), PackId([0xcd; 32]), PackId([0xef; 32]));
        let bytes: Vec<u8> = (0..100u8).collect();
        storage.write(&layout::pack_path(&here), bytes.clone()).unwrap();
        storage.write(&layout::pack_path(&short), bytes.clone()).unwrap();
        let packs = [
            TreePack { pack: here, length: 100 },
            TreePack { pack: short, length: 200 },
            TreePack { pack: gone, length: 10 },
        ];
        let hinted = HintedPacks::start(storage.clone(), &packs);
        assert_eq!(hinted.take(&here, 60), Some(bytes[..60].to_vec()));
        assert_eq!(hinted.take(&here, 60), None, "taken once");
        assert_eq!(hinted.take(&short, 100), None, "shorter than the hint said");
        assert_eq!(hinted.take(&gone, 10), None);
        assert_eq!(hinted.take(&PackId([1; 32]), 10), None, "never hinted");
        let again = HintedPacks::start(storage, &packs[..1]);
        again.clear();
        assert_eq!(again.take(&here, 100), None, "let go");
    }

    #[test]
    fn everything_lists_the_packs_without_fetching_them_and_fetches_keys_even_when_cached() {
        let all = Preload::everything(false);
        assert_eq!(all.dirs(), [Dir::Keys, Dir::Data, Dir::Index, Dir::Deletions, Dir::Snapshots]);
        assert!(!all.wants(Dir::Data, "data/00/00"));
        assert!(!Preload::everything(true).wants(Dir::Data, "data/00/00"));
        // Key files are never in a metadata cache.
        assert!(all.wants(Dir::Keys, "keys/k"));
        assert!(!all.wants(Dir::Index, "index/x"));
        assert!(Preload::everything(true).wants(Dir::Snapshots, &format!("snapshots/{}", "c".repeat(64))));
    }
}
