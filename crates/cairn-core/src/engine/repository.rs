//! A repository: storage plus the master key, config and index, and typed access to every kind
//! of stored file (FORMAT.md §1).

use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

use crate::engine::cache::Cache;
use crate::engine::parallel::map_parallel;
use crate::engine::preload::{HintedPacks, Preload, Preloaded};
use crate::engine::snapshot_name::SnapshotName;
use crate::engine::storage::{LinkMeter, MeteredStorage, Storage};
use crate::error::{Error, Result};
use cairn_format::compress::Codec;
use cairn_format::config::Config;
use cairn_format::crypto::{MasterKey, ObjectKey};
use cairn_format::deletion::Deletion;
use cairn_format::id::{BlobId, DeletionId, IdSet, IndexId, KeyId, PackId, SnapshotId};
use cairn_format::index::{self, Index, IndexedPack};
use cairn_format::keyfile::{KdfParams, KeyFile};
use cairn_format::layout::{self, check_name, pack_path, Dir, CONFIG};
use cairn_format::pack::{decode_blob, verify_stored, BlobEntry, BlobKind, PackWriter};
use cairn_format::sealed::{self, SealedKind};
use cairn_format::snapshot::Snapshot;
use cairn_format::tree::{Tree, TreeBytes, TreeForm};

/// Repository files that could not be read, with why.
pub type DamagedFiles = Vec<(String, Error)>;

/// Choices made once, when a repository is created.
#[derive(Clone, Debug)]
pub struct InitOptions {
    /// Argon2id costs for the first key file.
    pub kdf: KdfParams,
    /// Chunk sizes (min, avg, max).
    pub chunk_sizes: (u32, u32, u32),
    /// Target pack size.
    pub pack_size: u32,
    /// Default compression.
    pub compression: cairn_format::compress::Codec,
    /// Another repository's chunker parameters and chunk-ID key, to use instead of new ones
    /// (`init --copy-chunker-params`): the same content then gets the same blob IDs in both.
    pub chunking: Option<cairn_format::config::Chunking>,
}

impl Default for InitOptions {
    fn default() -> Self {
        InitOptions {
            kdf: KdfParams::default(),
            chunk_sizes: cairn_format::config::DEFAULT_CHUNK_SIZES,
            pack_size: cairn_format::config::DEFAULT_PACK_SIZE,
            compression: cairn_format::compress::DEFAULT_CODEC,
            chunking: None,
        }
    }
}

/// An open repository.
pub struct Repository {
    storage: Arc<dyn Storage>,
    key: MasterKey,
    config: Config,
    index: RwLock<Index>,
    cache: Option<Cache>,
    /// Where sorted index files are kept (`None`: a temporary file each time).
    index_dir: Option<std::path::PathBuf>,
    /// The key file that opened the repository (or was made by `init`): its ID and bytes
    /// (carried by the start hint this repository writes).
    key_file: Option<(KeyId, Vec<u8>)>,
    /// The start hint read while opening (FORMAT.md §14): its body, or what was wrong with it.
    hint: Option<std::result::Result<cairn_format::hint::Hint, String>>,
    /// The tree packs the start hint had read, taken once by the walk.
    hinted: Arc<HintedPacks>,
    /// Listings and files read ahead while opening, each taken once.
    preloaded: Preloaded,
    /// The deletion manifests [`Repository::deletions`] listed first: what the index was
    /// loaded with (the packs of pending prunes it treats as doomed).
    deletions_seen: Mutex<Option<Vec<DeletionId>>>,
    /// Every request's time, timed by the [`MeteredStorage`] around `storage`.
    link: Arc<LinkMeter>,
    /// Where else index files place blobs than where the index finds them, read on the first
    /// blob that fails where the index placed it ([`Repository::other_locations`]).
    elsewhere: Mutex<Option<Arc<Elsewhere>>>,
}

/// Each blob's places other than the one the index finds it at: several index files may place
/// a blob (a copy written twice, or an index file that lies about where blobs are).
type Elsewhere = cairn_format::id::IdMap<BlobId, Vec<(PackId, [u8; cairn_format::crypto::SALT_LEN], BlobEntry)>>;

impl Repository {
    /// Creates a new repository with one key file for `password`.
    pub fn init(storage: Arc<dyn Storage>, password: &[u8], opts: &InitOptions) -> Result<Self> {
        storage.create()?;
        if storage.exists(CONFIG)? {
            return Err(Error::AlreadyInitialized(storage.location().to_string()));
        }
        let found = repository_objects(&*storage)?;
        if !found.is_empty() {
            return Err(Error::HoldsObjects { repo: storage.location().to_string(), found });
        }
        let mut config = Config::new(opts.chunk_sizes, opts.pack_size, opts.compression)?;
        let mut key = MasterKey::generate();
        if let Some(from) = &opts.chunking {
            config = config.with_chunking(from);
            key = key.with_chunk_id_key(from.chunk_id_key);
        }
        let (storage, link) = metered(storage);
        let mut repo = Repository {
            storage,
            key,
            config,
            index: RwLock::new(Index::default()),
            cache: None,
            index_dir: None,
            key_file: None,
            hint: None,
            hinted: Arc::default(),
            preloaded: Preloaded::default(),
            deletions_seen: Mutex::new(None),
            link,
            elsewhere: Mutex::new(None),
        };
        repo.key_file = Some(repo.write_key(password, opts.kdf)?);
        let body = serde_json::to_vec(&repo.config).expect("config serializes");
        repo.storage.write(CONFIG, sealed::seal(&repo.key, SealedKind::Config, &body))?;
        Ok(repo)
    }

    /// Adds a key file for `password`; returns its ID.
    pub fn add_key(&self, password: &[u8], kdf: KdfParams) -> Result<KeyId> {
        Ok(self.write_key(password, kdf)?.0)
    }

    /// Writes a key file for `password`; returns its ID and bytes.
    fn write_key(&self, password: &[u8], kdf: KdfParams) -> Result<(KeyId, Vec<u8>)> {
        let kf = KeyFile::create(
            &self.key,
            password,
            kdf,
            crate::engine::platform::now_rfc3339(),
            crate::engine::platform::hostname(),
            crate::engine::platform::username(),
        )?;
        let bytes = kf.to_bytes();
        let id = KeyId::hash_of(&bytes);
        self.storage.write(&layout::key_path(&id), bytes.clone())?;
        Ok((id, bytes))
    }

    /// Opens a repository: finds a key file that `password` unlocks, then reads the config.
    /// The index is not loaded; call [`Repository::load_index`].
    pub fn open(storage: Arc<dyn Storage>, password: &[u8]) -> Result<Self> {
        Self::open_preloaded(storage, password, &Preload::none())
    }

    /// [`Repository::open`], listing and fetching what `preload` names beside the key's round
    /// trips (see [`crate::engine::preload`]): the repository's first listings and reads of those
    /// files are then served from what was read ahead.
    pub fn open_preloaded(storage: Arc<dyn Storage>, password: &[u8], preload: &Preload) -> Result<Self> {
        // The link is measured from the first request: a command that got everything it needs
        // while opening (`check`) still knows its round trip after.
        let (storage, link) = metered(storage);
        let threads = crate::engine::platform::cores().max(storage.default_concurrency());
        let (opened, preloaded) = std::thread::scope(|s| {
            let ahead = std::thread::Builder::new()
                .name("cairn-preload".into())
                .spawn_scoped(s, || Preloaded::fetch(&*storage, preload, threads));
            let mut opened = Self::open_keyed(storage.clone(), link, password, preload.key.as_ref());
            // The tree packs the start hint names are read beside the index files.
            if let Ok(repo) = &mut opened {
                repo.start_hinted_reads(preload.tree_packs);
            }
            // Without a thread nothing is read ahead; the repository reads as usual.
            let preloaded = ahead.map(|t| t.join().expect("the read-ahead panicked")).unwrap_or_default();
            (opened, preloaded)
        });
        let mut repo = opened?;
        repo.preloaded = preloaded;
        Ok(repo)
    }

    /// Starts reading whole, side by side, the tree packs the start hint names, if they come
    /// to at most `max` bytes ([`HintedPacks`]: not waited for here).
    fn start_hinted_reads(&mut self, max: u64) {
        let Some(Ok(hint)) = &self.hint else { return };
        let total = hint.tree_packs.iter().fold(0u64, |t, p| t.saturating_add(p.length));
        if max > 0 && !hint.tree_packs.is_empty() && total <= max {
            self.hinted = HintedPacks::start(self.storage.clone(), &hint.tree_packs);
        }
    }

    /// The first `len` bytes of `pack` if the start hint had them read (taken once, waiting for
    /// a read in flight; not verified here: each blob is when it is decrypted).
    pub(crate) fn take_preloaded_pack(&self, pack: &PackId, len: u64) -> Option<Vec<u8>> {
        self.hinted.take(pack, len)
    }

    /// Lets go of the tree packs the start hint had read that no walk took.
    pub(crate) fn drop_preloaded_packs(&self) {
        self.hinted.clear();
    }

    /// The start hint read while opening, if it was sound.
    pub fn hint(&self) -> Option<&cairn_format::hint::Hint> {
        self.hint.as_ref()?.as_ref().ok()
    }

    /// What was wrong with the start hint read while opening, if it was damaged (ignored).
    pub fn hint_damage(&self) -> Option<&str> {
        self.hint.as_ref()?.as_ref().err().map(String::as_str)
    }

    /// Writes the start hint (FORMAT.md §14): the key file that opened the repository, and
    /// `tree_packs`, the packs holding its trees when a restore would read them all at its start
    /// (`trees::write_hint` finds them). The one before is deleted first (SFTP's
    /// rename does not replace a file); a reader in between finds none, which costs it a round
    /// trip, nothing else. A hint that cannot be written is logged, not an error: what the
    /// command saved is whole without it.
    pub fn write_hint(&self, tree_packs: Vec<cairn_format::hint::TreePack>) {
        if let Err(e) = self.try_write_hint(tree_packs) {
            tracing::warn!("the start hint was not written ({e}); what was saved is whole without it");
        }
    }

    fn try_write_hint(&self, tree_packs: Vec<cairn_format::hint::TreePack>) -> Result<()> {
        let Some((_, key_file)) = &self.key_file else { return Ok(()) };
        let hint = cairn_format::hint::Hint {
            version: cairn_format::hint::VERSION,
            written: crate::engine::platform::now_secs(),
            tree_packs,
        };
        let bytes = cairn_format::hint::join(key_file, &sealed::seal(&self.key, SealedKind::Hint, &hint.to_bytes()));
        let _ = self.storage.delete(cairn_format::hint::PATH);
        self.storage.write(cairn_format::hint::PATH, bytes)
    }

    fn open_keyed(
        storage: Arc<dyn Storage>,
        link: Arc<LinkMeter>,
        password: &[u8],
        hint: Option<&KeyId>,
    ) -> Result<Self> {
        // The config is read beside the key files (a remote repository waits one round trip
        // for both, not two in a row); it is decrypted once a key opens.
        let (config_bytes, key) = std::thread::scope(|s| {
            let config = std::thread::Builder::new()
                .name("cairn-config".into())
                .spawn_scoped(s, || storage.read(CONFIG))
                .map_err(|e| Error::io(CONFIG, "cannot start a thread", e))?;
            let key = unlock(&*storage, password, hint);
            Ok::<_, Error>((config.join().expect("the config reader panicked"), key))
        })?;
        let Unlocked { key, file: key_file, hint } = match key? {
            Some(k) => k,
            // Without key files or config there is no repository here.
            None if matches!(config_bytes, Err(Error::NotFound(_))) => {
                return Err(Error::NoRepository(storage.location().to_string()))
            }
            None => return Err(no_key_opens(storage.location(), 0, Vec::new())),
        };
        let mut prefetched = Some(config_bytes);
        let body = crate::engine::storage::retry_damaged(|| {
            let bytes = match prefetched.take() {
                Some(read) => read?,
                None => storage.read(CONFIG)?,
            };
            Ok(sealed::open(&key, SealedKind::Config, CONFIG, &bytes)?)
        })?;
        let config: Config =
            serde_json::from_slice(&body).map_err(|e| Error::corrupt(CONFIG, format!("not a config: {e}")))?;
        let chunk_id_key = match config.validate() {
            Ok(k) => k,
            Err(e @ cairn_format::Error::UnsupportedVersion { .. }) => return Err(e.into()),
            Err(e) => return Err(Error::invalid(CONFIG, e.to_string())),
        };
        // A repository made with `init --copy-chunker-params` names blobs with its source's key.
        let key = match chunk_id_key {
            Some(k) => key.with_chunk_id_key(k),
            None => key,
        };
        // A damaged hint is ignored (it only saves a round trip), said once; `check` reports it.
        let hint = hint.map(|bytes| {
            open_hint(&key, &bytes).map_err(|e| {
                let then = "the repository is opened without it (a round trip more), and the next backup rewrites it";
                crate::engine::unreadable::skipped(storage.location(), cairn_format::hint::PATH, &e, then);
                e.to_string()
            })
        });
        Ok(Repository {
            storage,
            key,
            config,
            index: RwLock::new(Index::default()),
            cache: None,
            index_dir: None,
            key_file: Some((KeyId::hash_of(&key_file), key_file)),
            hint,
            hinted: Arc::default(),
            preloaded: Preloaded::default(),
            deletions_seen: Mutex::new(None),
            link,
            elsewhere: Mutex::new(None),
        })
    }

    /// Reads every index file into memory, several at once (each is read, decrypted and
    /// decoded on its own, and a remote one waits a round trip), and the deletion manifests of
    /// pending prunes beside them: their packs are doomed (see [`Index`]). An index too large
    /// for the default share of memory goes to disk ([`Repository::load_index_within`]).
    pub fn load_index(&self) -> Result<()> {
        self.load_index_within(None)
    }

    /// [`Repository::load_index`] for a command allowed `max_memory` bytes: an index whose
    /// slots would take more than a quarter of it (256 MiB without a budget) is kept in a
    /// sorted index file on disk instead ([`crate::engine::sorted_index`]).
    pub fn load_index_within(&self, max_memory: Option<u64>) -> Result<()> {
        let placement = crate::engine::sorted_index::Placement::from_env()?;
        let (files, deletions) = std::thread::scope(|s| {
            let deletions = s.spawn(|| self.deletions());
            (self.list_index_files(), deletions.join().expect("deletion reader panicked"))
        });
        let files = files?;
        let mut doomed = IdSet::default();
        for (_, d) in deletions? {
            match d {
                Ok(d) => doomed.extend(d.packs),
                // Only a prune deletes what a manifest names, and it cannot read this one
                // either: its packs are treated as staying.
                Err(e) => tracing::warn!("ignoring a deletion manifest: {e}"),
            }
        }
        let skipped = Mutex::new(0usize);
        // An index file that cannot be read is skipped (said once); what it described is found
        // from the packs themselves below. A storage failure still fails the load.
        let usable = |path: &str, read: Result<Vec<IndexedPack>>| match read {
            Err(e) if e.is_damage() => {
                self.skipped(path, &e, "the packs no other index file describes are read instead");
                *skipped.lock().expect("skipped lock") += 1;
                Ok(Vec::new())
            }
            // Removed since the listing (a prune replaced it): what it listed is listed elsewhere.
            Err(Error::NotFound(_)) => Ok(Vec::new()),
            other => other,
        };
        if placement.on_disk(&files, max_memory) {
            self.clear_index();
            let read = |path: &str| usable(path, self.read_index_file(path));
            let dir = self.index_dir.as_deref();
            let index = crate::engine::sorted_index::load(dir, &files, &doomed, read, self.threads())?;
            if *skipped.lock().expect("skipped lock") > 0 {
                // Built without a file that cannot be read: not kept for the next command, which
                // would not know to read the packs that file described.
                crate::engine::sorted_index::forget(dir, &files, &doomed);
            }
            self.replace_index(|| index);
        } else {
            let mut packs = Vec::new();
            for (path, file) in self.read_index_files(files) {
                packs.extend(usable(&path, file)?);
            }
            self.set_index_doomed(packs, &doomed);
        }
        if skipped.into_inner().expect("skipped lock") > 0 {
            self.index_unindexed_packs()?;
        }
        Ok(())
    }

    /// Adds to the index the packs in `data/` that no loaded index file describes, from their
    /// own headers (read side by side, a ranged read of each pack's end): after an index file
    /// was skipped, the blobs it placed are found this way. Only those packs are read. A pack
    /// whose header cannot be read either is skipped with a warning.
    fn index_unindexed_packs(&self) -> Result<()> {
        let started = std::time::Instant::now();
        let stored = self.list_packs()?;
        let known = self.index().pack_ids();
        let mut unindexed: Vec<(PackId, u64)> = stored.into_iter().filter(|(id, _)| !known.contains(id)).collect();
        unindexed.sort_unstable();
        let threads = self.storage.default_concurrency().max(8);
        let read = map_parallel(&unindexed, threads, |(id, size)| self.read_pack_header(id, *size));
        let mut found = 0usize;
        for ((id, _), header) in unindexed.iter().zip(read) {
            match header {
                Ok(p) => {
                    self.index_pack(&p);
                    found += 1;
                }
                Err(e) => self.skipped(&pack_path(id), &e, "its blobs are not used"),
            }
        }
        crate::engine::unreadable::once(
            self.storage.location(),
            "unindexed packs",
            &format!(
                "read the headers of {found} of {} packs no readable index file describes ({:.2} s); \
                 `cairn repair index` (admin) writes an index of them",
                unindexed.len(),
                started.elapsed().as_secs_f64()
            ),
        );
        Ok(())
    }

    /// A pack's header, from a ranged read of its end (`size` is the pack's length): its salt
    /// and blobs, as its index record would give them.
    pub fn read_pack_header(&self, id: &PackId, size: u64) -> Result<IndexedPack> {
        let file = pack_path(id);
        let first = PACK_TAIL_READ.min(size);
        let mut tail = self.read_pack_range(&file, size - first, first)?;
        if tail.len() >= cairn_format::pack::TRAILER_LEN {
            let at = tail.len() - cairn_format::pack::TRAILER_LEN + cairn_format::crypto::SALT_LEN;
            let hlen = u64::from(u32::from_le_bytes(tail[at..at + 4].try_into().expect("4 bytes")));
            let need = hlen + cairn_format::pack::TRAILER_LEN as u64;
            if need > first && need <= size {
                tail = self.read_pack_range(&file, size - need, need)?;
            }
        }
        let (salt, blobs) = cairn_format::pack::read_header_tail(&self.key, &file, &tail, size)?;
        Ok(IndexedPack { id: *id, salt, blobs })
    }

    /// Threads that read files side by side: as many as the storage keeps requests in flight,
    /// at least one per core.
    fn threads(&self) -> usize {
        crate::engine::platform::cores().max(self.storage.default_concurrency())
    }

    /// Keeps sorted index files in `dir` from now on (see [`crate::engine::sorted_index`]).
    pub fn set_index_dir(&mut self, dir: std::path::PathBuf) {
        self.index_dir = Some(dir);
    }

    /// Every deletion manifest of a pending prune, each read on its own (a damaged one is its
    /// own error).
    pub fn deletions(&self) -> Result<Vec<(DeletionId, Result<Deletion>)>> {
        let listed = self.preloaded.list(&*self.storage, Dir::Deletions)?;
        self.uncache_unlisted("deletions", listed.iter().map(|o| o.path.as_str()));
        let ids: Vec<DeletionId> = listed.iter().filter_map(|o| layout::parse_deletion_path(&o.path)).collect();
        self.deletions_seen.lock().expect("deletions lock").get_or_insert_with(|| ids.clone());
        let threads = crate::engine::platform::cores().max(self.storage.default_concurrency());
        let read = map_parallel(&ids, threads, |id| {
            let path = layout::deletion_path(id);
            Ok(Deletion::from_bytes(&path, &self.read_sealed(&path, SealedKind::Deletion)?)?)
        });
        Ok(ids.into_iter().zip(read).collect())
    }

    /// The deletion manifests the index was loaded with (`None` before any were listed).
    pub fn deletions_seen(&self) -> Option<Vec<DeletionId>> {
        self.deletions_seen.lock().expect("deletions lock").clone()
    }

    /// Writes a deletion manifest; returns its ID.
    pub fn save_deletion(&self, d: &Deletion) -> Result<DeletionId> {
        self.write_sealed(SealedKind::Deletion, &d.to_bytes(), DeletionId, layout::deletion_path)
    }

    /// Reads and decodes every index file, each on its own (on as many threads as the storage
    /// keeps requests in flight, at least one per core): a damaged one is its own error.
    pub fn index_files(&self) -> Result<Vec<(String, Result<Vec<IndexedPack>>)>> {
        Ok(self.read_index_files(self.list_index_files()?))
    }

    /// Lists the index files (and drops from the cache those no longer listed).
    fn list_index_files(&self) -> Result<Vec<crate::engine::storage::ObjectInfo>> {
        let files = self.preloaded.list(&*self.storage, Dir::Index)?;
        self.uncache_unlisted("index", files.iter().map(|o| o.path.as_str()));
        Ok(files)
    }

    fn read_index_files(
        &self,
        files: Vec<crate::engine::storage::ObjectInfo>,
    ) -> Vec<(String, Result<Vec<IndexedPack>>)> {
        let read = map_parallel(&files, self.threads(), |obj| self.read_index_file(&obj.path));
        files.into_iter().map(|obj| obj.path).zip(read).collect()
    }

    /// The packs in `data/` and their sizes (stray names left out).
    pub fn list_packs(&self) -> Result<cairn_format::id::IdMap<cairn_format::id::PackId, u64>> {
        Ok(self
            .preloaded
            .list(&*self.storage, Dir::Data)?
            .into_iter()
            .filter_map(|o| layout::parse_pack_path(&o.path).map(|id| (id, o.size)))
            .collect())
    }

    /// Replaces the in-memory index with one of `packs`.
    pub fn set_index<P: std::borrow::Borrow<IndexedPack>>(&self, packs: impl IntoIterator<Item = P>) {
        self.set_index_doomed(packs, &IdSet::default());
    }

    /// Frees the in-memory index (a prune does before its finish reads the index files again).
    pub fn clear_index(&self) {
        *self.index.write().expect("index lock") = Index::default();
    }

    /// Replaces the in-memory index with one of `packs`, those in `doomed` about to be deleted.
    pub fn set_index_doomed<P: std::borrow::Borrow<IndexedPack>>(
        &self,
        packs: impl IntoIterator<Item = P>,
        doomed: &IdSet<PackId>,
    ) {
        self.replace_index(|| Index::with_doomed(packs, doomed));
    }

    /// Replaces the in-memory index with the one `build` makes, the old one dropped first: the
    /// two are not held at once.
    fn replace_index(&self, build: impl FnOnce() -> Index) {
        let mut index = self.index.write().expect("index lock");
        *index = Index::default();
        *index = build();
    }

    fn read_index_file(&self, path: &str) -> Result<Vec<IndexedPack>> {
        let body = self.read_sealed(path, SealedKind::Index)?;
        Ok(index::decode(path, &body)?)
    }

    /// Replaces the in-memory index with one of each pack's ID, salt and blobs (see
    /// [`Index::from_parts`]), those in `doomed` about to be deleted.
    pub fn set_index_parts<'a>(
        &self,
        packs: impl IntoIterator<Item = (PackId, [u8; cairn_format::crypto::SALT_LEN], &'a [BlobEntry])>,
        doomed: &IdSet<PackId>,
    ) {
        self.replace_index(|| Index::from_parts(packs, doomed));
    }

    /// Keeps index files, snapshots and trees in `cache` from now on (see [`crate::engine::cache`]).
    pub fn set_cache(&mut self, cache: Cache) {
        self.cache = Some(cache);
    }

    /// Drops from the metadata cache, if there is one, the files of `kind` that the
    /// repository's whole listing of that directory (`listed`) no longer names.
    fn uncache_unlisted<'a>(&self, kind: &str, listed: impl Iterator<Item = &'a str>) {
        if let Some(c) = &self.cache {
            c.retain_listed(kind, &listed.collect());
        }
    }

    /// Drops a tree from the metadata cache, if there is one (its last copy is being deleted).
    pub fn uncache_tree(&self, id: &BlobId) {
        if let Some(c) = &self.cache {
            c.remove(&tree_cache_name(id));
        }
    }

    /// Whether a metadata cache keeps this repository's index files, snapshots and trees.
    pub fn has_cache(&self) -> bool {
        self.cache.is_some()
    }

    /// Reads a content-addressed sealed file, checking its name and authenticity; read ahead
    /// while opening, or from the cache if it holds an intact copy.
    fn read_sealed(&self, path: &str, kind: SealedKind) -> Result<Vec<u8>> {
        let cached = self
            .preloaded
            .take_file(path)
            .or_else(|| self.cache.as_ref().and_then(|c| c.get(path, |b| check_name(path, b).is_ok())));
        let bytes = match cached {
            Some(b) => b,
            None => {
                let b = crate::engine::storage::read_checked(&*self.storage, path)?;
                if let Some(c) = &self.cache {
                    c.put(path, &b);
                }
                b
            }
        };
        Ok(sealed::open(&self.key, kind, path, &bytes)?)
    }

    /// [`Repository::read_pack_range`] into `buf`, as a future owning it
    /// ([`Storage::read_range_async`]): many of these are in flight on one fetch worker.
    pub async fn read_pack_range_async(&self, pack: &str, offset: u64, len: u64, buf: Vec<u8>) -> Result<Vec<u8>> {
        crate::engine::storage::retry_damaged_async(buf, |buf| {
            self.storage.read_range_async(pack.to_string(), offset, len, buf)
        })
        .await
    }

    /// [`Repository::read_pack_range_async`] of several ranges of one pack, back to back in
    /// `buf` ([`Storage::read_ranges_async`](crate::engine::storage::Storage::read_ranges_async)).
    pub async fn read_pack_ranges_async(&self, pack: &str, ranges: &[(u64, u64)], buf: Vec<u8>) -> Result<Vec<u8>> {
        crate::engine::storage::retry_damaged_async(buf, |buf| {
            self.storage.read_ranges_async(pack.to_string(), ranges.to_vec(), buf)
        })
        .await
    }

    /// Reads `len` bytes of `pack` at `offset` into a new buffer (again if the transfer came
    /// back short).
    pub fn read_pack_range(&self, pack: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        crate::engine::storage::retry_damaged(|| self.storage.read_range(pack, offset, len))
    }

    /// Reads one blob from `pack` and decodes it, reading it again if the transfer came back
    /// short or damaged (authentication fails); the restore's decode stage calls this when the
    /// copy it was given fails. If it still fails there, it is read from the other places index
    /// files give it ([`Repository::other_locations`]): a damaged pack or an index file that lies
    /// costs a retry, never a wrong byte (every copy is verified against its ID).
    pub fn reread_blob(&self, pack: &str, key: &ObjectKey, entry: &BlobEntry) -> Result<Vec<u8>> {
        let read = |pack: &str, key: &ObjectKey, entry: &BlobEntry| {
            crate::engine::storage::retry_damaged(|| {
                let sealed = self.storage.read_range(pack, u64::from(entry.offset), u64::from(entry.length))?;
                Ok(decode_blob(&self.key, key, entry, sealed, pack)?)
            })
        };
        read(pack, key, entry).or_else(|e| self.read_elsewhere(pack, entry, e, read))
    }

    /// `read` of the blob `entry` describes at each of its other places, until one succeeds;
    /// `failed` (why it could not be read from `pack`) if none does.
    fn read_elsewhere<T>(
        &self,
        pack: &str,
        entry: &BlobEntry,
        failed: Error,
        read: impl Fn(&str, &ObjectKey, &BlobEntry) -> Result<T>,
    ) -> Result<T> {
        for (other, salt, at) in self.other_locations(pack, entry) {
            let path = pack_path(&other);
            if let Ok(found) = read(&path, &self.key.object_key(&salt), &at) {
                // Said once per pack the index placed blobs in wrongly, not once per blob.
                crate::engine::unreadable::once(
                    self.storage.location(),
                    &format!("placed in {pack}"),
                    &format!(
                        "blob {} could not be read where the index places it ({failed}); read from {path} instead \
                         (and so for any other blob placed in {pack}): `cairn check` names the object at fault",
                        entry.id.short()
                    ),
                );
                return Ok(found);
            }
        }
        Err(failed)
    }

    /// The places other than `entry` in `pack` where index files (or the headers of packs no
    /// readable index file describes) put the blob `entry` names. Every index file is read
    /// again the first time this is asked (a blob failed where the index placed it), and only
    /// the blobs placed more than once are kept.
    pub fn other_locations(
        &self,
        pack: &str,
        entry: &BlobEntry,
    ) -> Vec<(PackId, [u8; cairn_format::crypto::SALT_LEN], BlobEntry)> {
        let elsewhere = self.elsewhere();
        let Some(places) = elsewhere.get(&entry.id) else { return Vec::new() };
        let mut out: Vec<_> =
            places.iter().filter(|(p, _, e)| !(pack_path(p) == pack && e.offset == entry.offset)).copied().collect();
        // The place the index finds is among them when the failed copy was another one.
        if let Some(loc) = self.index().get(&entry.id) {
            let failed = pack_path(&loc.pack) == pack && loc.entry.offset == entry.offset;
            let listed = out.iter().any(|(p, _, e)| *p == loc.pack && e.offset == loc.entry.offset);
            if !failed && !listed {
                out.insert(0, (loc.pack, loc.salt, loc.entry));
            }
        }
        out
    }

    /// Builds (once) the map of blobs' other places from every readable index file.
    fn elsewhere(&self) -> Arc<Elsewhere> {
        let mut held = self.elsewhere.lock().expect("elsewhere lock");
        if let Some(e) = &*held {
            return e.clone();
        }
        let mut map = Elsewhere::default();
        // Unreadable index files were said when the index was loaded; a listing that fails
        // leaves nothing to try.
        let files = self.index_files().unwrap_or_default();
        let index = self.index();
        for (_, file) in files {
            for p in file.into_iter().flatten() {
                for e in &p.blobs {
                    let same = index.get(&e.id).is_some_and(|l| l.pack == p.id && l.entry.offset == e.offset);
                    if !same {
                        map.entry(e.id).or_default().push((p.id, p.salt, *e));
                    }
                }
            }
        }
        drop(index);
        let map = Arc::new(map);
        *held = Some(map.clone());
        map
    }

    /// Reads one blob from `pack` again and verifies it (decompressing into `scratch`), reading
    /// it once more if the transfer came back short or damaged; returns its stored bytes (still
    /// compressed). The repack's twin of [`Repository::reread_blob`].
    /// With `elsewhere`, a blob that still fails is read from its other places, as
    /// [`Repository::reread_blob`] does; a check, which judges each pack, asks without.
    pub fn reread_stored(
        &self,
        pack: &str,
        key: &ObjectKey,
        entry: &BlobEntry,
        scratch: &mut Vec<u8>,
        elsewhere: bool,
    ) -> Result<Vec<u8>> {
        let scratch = std::cell::RefCell::new(scratch);
        let read = |pack: &str, key: &ObjectKey, entry: &BlobEntry| {
            crate::engine::storage::retry_damaged(|| {
                let mut sealed = self.storage.read_range(pack, u64::from(entry.offset), u64::from(entry.length))?;
                let stored = verify_stored(&self.key, key, entry, &mut sealed, pack, &mut scratch.borrow_mut())?;
                Ok(sealed[stored].to_vec())
            })
        };
        match read(pack, key, entry) {
            Err(e) if elsewhere => self.read_elsewhere(pack, entry, e, read),
            done => done,
        }
    }

    /// Writes a content-addressed sealed file at the path `path_of` gives its ID; returns the
    /// ID.
    fn write_sealed<T>(
        &self,
        kind: SealedKind,
        body: &[u8],
        id: fn([u8; 32]) -> T,
        path_of: fn(&T) -> String,
    ) -> Result<T> {
        let bytes = sealed::seal(&self.key, kind, body);
        let id = id(*blake3::hash(&bytes).as_bytes());
        let path = path_of(&id);
        match &self.cache {
            // Written through: the next command on this machine reads it from the cache, not
            // over the link (its copy is checked against its name like any cached file).
            Some(cache) => {
                self.storage.write(&path, bytes.clone())?;
                cache.put(&path, &bytes);
            }
            None => self.storage.write(&path, bytes)?,
        }
        Ok(id)
    }

    /// Writes an index file listing `packs` and adds them to the in-memory index.
    pub fn save_index(&self, packs: &[IndexedPack]) -> Result<IndexId> {
        self.write_sealed(SealedKind::Index, &index::encode(packs), IndexId, layout::index_path)
    }

    /// Writes `blobs` into one new pack and index file, without deduplication or pipelining;
    /// returns their IDs. For tools and tests; backups use the store stage.
    pub fn write_pack(&self, blobs: &[(BlobKind, Vec<u8>)], codec: Codec) -> Result<Vec<BlobId>> {
        let mut writer = PackWriter::new(&self.key, 0);
        let mut ids = Vec::with_capacity(blobs.len());
        for (kind, data) in blobs {
            let id = self.key.blob_id(data);
            let (stored_codec, stored) = codec.stored_form(data.clone());
            writer.add(id, *kind, stored_codec, data.len() as u32, &stored);
            ids.push(id);
        }
        let pack = writer.finish();
        self.storage.write(&pack_path(&pack.id), pack.bytes)?;
        let indexed = IndexedPack { id: pack.id, salt: pack.salt, blobs: pack.entries };
        self.save_index(std::slice::from_ref(&indexed))?;
        self.index_pack(&indexed);
        Ok(ids)
    }

    /// Adds a freshly uploaded pack to the in-memory index (before its index file is written).
    pub fn index_pack(&self, pack: &IndexedPack) {
        self.index.write().expect("index lock").add_pack(pack);
    }

    /// The in-memory index.
    pub fn index(&self) -> RwLockReadGuard<'_, Index> {
        self.index.read().expect("index lock")
    }

    /// `Err` ([`crate::engine::sorted_index::damaged`]) if a lookup found the sorted index file
    /// damaged: since then every lookup has answered "not found", so a command that went on
    /// would report present blobs as missing (or repair them away). Commands call this before
    /// they report or write what their lookups decided.
    pub fn index_intact(&self) -> Result<()> {
        if self.index().is_damaged() {
            return Err(crate::engine::sorted_index::damaged());
        }
        Ok(())
    }

    /// Reads, decrypts, decompresses and verifies one blob.
    pub fn read_blob(&self, id: &BlobId) -> Result<Vec<u8>> {
        let index = self.index();
        let loc = index.get(id).ok_or_else(|| crate::engine::sorted_index::not_found(&index, "blob", id))?;
        drop(index);
        self.reread_blob(&pack_path(&loc.pack), &self.key.object_key(&loc.salt), &loc.entry)
    }

    /// Loads and validates a tree blob, from the cache if it holds an intact copy.
    pub fn read_tree(&self, id: &BlobId) -> Result<Tree> {
        self.read_tree_as(id)
    }

    /// As [`Repository::read_tree`], the tree kept as its bytes (nodes decoded as a walk takes
    /// them; see [`TreeBytes`]).
    pub fn read_tree_bytes(&self, id: &BlobId) -> Result<TreeBytes> {
        self.read_tree_as(id)
    }

    pub(crate) fn read_tree_as<T: TreeForm>(&self, id: &BlobId) -> Result<T> {
        if let Some(tree) = self.cached_tree_as(id) {
            return Ok(tree);
        }
        let index = self.index();
        let loc = index.get(id).ok_or_else(|| crate::engine::sorted_index::not_found(&index, "tree", id))?;
        drop(index);
        let path = pack_path(&loc.pack);
        let key = self.key.object_key(&loc.salt);
        // Every way a walk reads a tree ends here when its copy fails: read again, then where
        // other index files place it (as `reread_blob` does for any blob).
        let read = |path: &str, key: &ObjectKey, entry: &BlobEntry| {
            crate::engine::storage::retry_damaged(|| {
                let sealed = self.storage.read_range(path, u64::from(entry.offset), u64::from(entry.length))?;
                self.decode_tree(key, entry, &sealed, path)
            })
        };
        read(&path, &key, &loc.entry).or_else(|e| self.read_elsewhere(&path, &loc.entry, e, read))
    }

    /// Decrypts, decompresses, verifies and parses a tree blob's sealed bytes (read from
    /// `path`) into either form, and keeps them in the metadata cache.
    pub(crate) fn decode_tree<T: TreeForm>(
        &self,
        key: &ObjectKey,
        entry: &BlobEntry,
        sealed: &[u8],
        path: &str,
    ) -> Result<T> {
        let plain = decode_blob(&self.key, key, entry, sealed.to_vec(), path)?;
        let tree = T::parse(&format!("tree {}", entry.id.short()), plain)?;
        self.remember_tree(&entry.id, sealed);
        Ok(tree)
    }

    /// A tree from the cache, if there is a cache and it holds an intact copy (authenticated
    /// and matching its ID; a damaged copy is dropped).
    pub(crate) fn cached_tree_as<T: TreeForm>(&self, id: &BlobId) -> Option<T> {
        let cache = self.cache.as_ref()?;
        let loc = self.index().get(id)?;
        let name = tree_cache_name(id);
        let key = self.key.object_key(&loc.salt);
        let mut plain = None;
        cache.get(&name, |sealed| {
            plain = decode_blob(&self.key, &key, &loc.entry, sealed.to_vec(), &name).ok();
            plain.is_some()
        })?;
        T::parse(&name, plain?).ok()
    }

    /// Stores a tree blob's verified sealed bytes in the cache, if there is one.
    pub fn remember_tree(&self, id: &BlobId, sealed: &[u8]) {
        if let Some(c) = &self.cache {
            c.put(&tree_cache_name(id), sealed);
        }
    }

    /// Writes a snapshot file.
    pub fn save_snapshot(&self, snap: &Snapshot) -> Result<SnapshotId> {
        self.write_sealed(SealedKind::Snapshot, &snap.to_bytes(), SnapshotId, layout::snapshot_path)
    }

    /// Reads one snapshot.
    pub fn read_snapshot(&self, id: &SnapshotId) -> Result<Snapshot> {
        let path = layout::snapshot_path(id);
        Ok(Snapshot::from_bytes(&path, &self.read_sealed(&path, SealedKind::Snapshot)?)?)
    }

    /// Every snapshot that can be read, oldest first; each one that cannot is skipped with one
    /// warning naming it ([`crate::engine::unreadable`]). A command that must know every
    /// snapshot (a prune) uses [`Repository::read_snapshots`] instead.
    pub fn snapshots(&self) -> Result<Vec<(SnapshotId, Snapshot)>> {
        let (snaps, damaged) = self.read_snapshots()?;
        for (path, e) in damaged {
            self.skipped(&path, &e, "the other snapshots are used");
        }
        Ok(snaps)
    }

    /// Says once that `path` cannot be read and was skipped ([`crate::engine::unreadable`]).
    pub fn skipped(&self, path: &str, why: &Error, then: &str) {
        crate::engine::unreadable::skipped(self.storage.location(), path, why, then);
    }

    /// Every snapshot that can be read, oldest first, and the files that cannot (with why);
    /// read several at once (a remote one waits a round trip). A snapshot listed but gone when
    /// read was removed meanwhile and is left out.
    pub fn read_snapshots(&self) -> Result<(Vec<(SnapshotId, Snapshot)>, DamagedFiles)> {
        let listed = self.preloaded.list(&*self.storage, Dir::Snapshots)?;
        self.uncache_unlisted("snapshots", listed.iter().map(|o| o.path.as_str()));
        let threads = crate::engine::platform::cores().max(self.storage.default_concurrency());
        let read = map_parallel(&listed, threads, |obj| match layout::parse_snapshot_path(&obj.path) {
            Some(id) => self.read_snapshot(&id).map(|s| (id, s)),
            None => Err(Error::corrupt(&obj.path, "file name is not a snapshot ID")),
        });
        let (mut good, mut bad) = (Vec::new(), Vec::new());
        for (obj, r) in listed.into_iter().zip(read) {
            match r {
                Ok(s) => good.push(s),
                // Removed since the listing (by `forget`, or `tag` replacing it): not damage.
                Err(Error::NotFound(_)) => {}
                Err(e) => bad.push((obj.path, e)),
            }
        }
        good.sort_by(|a, b| a.1.time.cmp(&b.1.time).then(a.0.cmp(&b.0)));
        Ok((good, bad))
    }

    /// Finds a snapshot by `latest` or a unique prefix of its hex ID.
    pub fn find_snapshot(&self, spec: &str) -> Result<(SnapshotId, Snapshot)> {
        let name = SnapshotName::parse(spec);
        // `latest` lists once, inside snapshots(): each listing is a round trip remotely.
        if name == SnapshotName::Latest {
            let snaps = self.snapshots()?;
            return snaps
                .into_iter()
                .next_back()
                .ok_or_else(|| Error::SnapshotSelect("the repository has no snapshots".into()));
        }
        let all = self.preloaded.list(&*self.storage, Dir::Snapshots)?;
        let candidates: Vec<SnapshotId> =
            all.iter().filter_map(|o| layout::parse_snapshot_path(&o.path)).filter(|id| name.may_name(id)).collect();
        let id = name.the_one(candidates)?;
        Ok((id, self.read_snapshot(&id)?))
    }

    /// Every key file, by name order; a damaged one is an error naming it.
    pub fn keys(&self) -> Result<Vec<(KeyId, KeyFile)>> {
        let mut out = Vec::new();
        for (path, kf) in self.key_files(KEY_READS)? {
            let id =
                layout::parse_key_path(&path).ok_or_else(|| Error::corrupt(&path, "file name is not a key file ID"))?;
            out.push((id, kf?));
        }
        out.sort_by_key(|k| k.0);
        Ok(out)
    }

    /// Every key file in listing order, each parsed or why it cannot be (`threads` read at
    /// once; read ahead while opening if asked, see [`crate::engine::preload`]).
    pub fn key_files(&self, threads: usize) -> Result<Vec<(String, Result<KeyFile>)>> {
        let listed = self.preloaded.list(&*self.storage, Dir::Keys)?;
        let parsed = crate::engine::parallel::map_parallel(&listed, threads, |obj| {
            let bytes = match self.preloaded.take_file(&obj.path) {
                Some(b) => b,
                None => crate::engine::storage::read_checked(&*self.storage, &obj.path)?,
            };
            Ok(KeyFile::parse(&obj.path, &bytes)?)
        });
        Ok(listed.into_iter().map(|o| o.path).zip(parsed).collect())
    }

    /// The key file whose ID starts with `prefix` (hex); an unknown or ambiguous prefix is an
    /// error saying so.
    pub fn find_key(&self, prefix: &str) -> Result<KeyId> {
        let prefix = prefix.to_ascii_lowercase();
        let listed = self.storage.list(Dir::Keys.name())?;
        let found: Vec<KeyId> = listed
            .iter()
            .filter_map(|o| layout::parse_key_path(&o.path))
            .filter(|id| id.to_hex().starts_with(&prefix))
            .collect();
        match found.as_slice() {
            [id] if !prefix.is_empty() => Ok(*id),
            [] => Err(Error::Usage(format!("no key file matches {prefix:?}; see `cairn key list`"))),
            many => Err(Error::Usage(format!("{prefix:?} matches {} key files; give more of the ID", many.len()))),
        }
    }

    /// `cairn key remove PREFIX`: removes the key file whose ID starts with `prefix`
    /// ([`Repository::find_key`], then [`Repository::remove_key`]); returns its ID.
    pub fn remove_key_by_prefix(&self, prefix: &str) -> Result<KeyId> {
        let id = self.find_key(prefix)?;
        self.remove_key(&id)?;
        Ok(id)
    }

    /// Removes key file `id`. Refuses the last key file (the repository could never be opened
    /// again) and the key this repository was opened with (its password would stop working
    /// while in use: `key passwd` replaces it).
    pub fn remove_key(&self, id: &KeyId) -> Result<()> {
        let keys = self.storage.list(Dir::Keys.name())?;
        if !keys.iter().any(|o| layout::parse_key_path(&o.path) == Some(*id)) {
            return Err(Error::NotFound(format!("key file {}", id.short())));
        }
        if keys.len() <= 1 {
            return Err(Error::Refused(format!(
                "key {} is the last key file: without it the repository could never be opened again; \
                 add another with `cairn key add` first",
                id.short()
            )));
        }
        if self.key_id() == Some(*id) {
            return Err(Error::Refused(format!(
                "key {} is the one in use (its password opened the repository): open with another key's \
                 password to remove it, or use `cairn key passwd` to replace it",
                id.short()
            )));
        }
        self.storage.delete(&layout::key_path(id))
    }

    /// Replaces the key in use with a new key file for `password`: the new one is written
    /// first, then the old one removed, so one of the two always opens the repository. Returns
    /// the new key's ID.
    pub fn change_password(&mut self, password: &[u8], kdf: KdfParams) -> Result<KeyId> {
        let (new, file) = self.write_key(password, kdf)?;
        if let Some((old, _)) = self.key_file.replace((new, file)) {
            self.storage.delete(&layout::key_path(&old))?;
        }
        Ok(new)
    }

    /// The key file this repository was opened with.
    pub fn key_id(&self) -> Option<KeyId> {
        self.key_file.as_ref().map(|(id, _)| *id)
    }

    /// The storage.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// What the requests so far say about the link to the storage (its round-trip floor).
    pub fn link(&self) -> &LinkMeter {
        &self.link
    }

    /// The master key.
    pub fn key(&self) -> &MasterKey {
        &self.key
    }

    /// The config.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What a repository made with `init --copy-chunker-params --from-repo` this one takes:
    /// the chunker parameters and the chunk-ID key.
    pub fn chunking(&self) -> cairn_format::config::Chunking {
        cairn_format::config::Chunking { chunker: self.config.chunker, chunk_id_key: *self.key.chunk_id_key() }
    }
}

/// What repository objects `storage` holds, e.g. "2 key files, 1 snapshot" ("" for none).
fn repository_objects(storage: &dyn Storage) -> Result<String> {
    let mut found = Vec::new();
    for dir in Dir::ALL {
        let (one, many) = match dir {
            Dir::Keys => ("key file", "key files"),
            Dir::Index => ("index file", "index files"),
            Dir::Snapshots => ("snapshot", "snapshots"),
            Dir::Data => ("pack", "packs"),
            Dir::Locks => ("lock", "locks"),
            Dir::Deletions => ("deletion manifest", "deletion manifests"),
        };
        match storage.list(dir.name())?.len() {
            0 => {}
            1 => found.push(format!("1 {one}")),
            n => found.push(format!("{n} {many}")),
        }
    }
    Ok(found.join(", "))
}

/// A key file's master key and bytes (its ID is their hash: every key file is read checked
/// against its name, and the hint's is used only under the name its hash gives), and the start
/// hint read beside the key files (FORMAT.md §14), if there is one.
struct Unlocked {
    key: MasterKey,
    file: Vec<u8>,
    hint: Option<Vec<u8>>,
}

/// Finds the key file `password` opens; `None` when there are no key files. The listing of
/// `keys/` and the start hint are read side by side, and the key file `cached` names (the one
/// that opened this repository last time on this machine) is read and tried beside them: when
/// it opens, the open waits one round trip for its key, not two. Otherwise a key file the hint
/// carries is tried as soon as the listing shows it is still a key of the repository, without
/// reading it (one round trip too).
fn unlock(storage: &dyn Storage, password: &[u8], cached: Option<&KeyId>) -> Result<Option<Unlocked>> {
    let try_bytes = |path: &str, bytes: &[u8]| -> Result<_> {
        Ok(KeyFile::parse(path, bytes).and_then(|kf| kf.unwrap_key(path, password))?)
    };
    let try_key = |path: &str| {
        let bytes = crate::engine::storage::read_checked(storage, path)?;
        Ok(try_bytes(path, &bytes)?.map(|k| (k, bytes)))
    };
    let mut hinted = cached.map(layout::key_path);
    let (mut tried, listed, hint) = std::thread::scope(|s| {
        let listing = s.spawn(|| storage.list(Dir::Keys.name()));
        // Missing (a repository no backup wrote to since hints exist) or unreadable: no hint.
        let hint = s.spawn(|| storage.read(cairn_format::hint::PATH).ok());
        let tried = hinted.as_deref().map(try_key);
        let hint = hint.join().expect("the hint reader panicked");
        if matches!(tried, Some(Ok(Some(_)))) {
            // The listing is not needed (the scope still waits for it: it ran beside).
            return (tried, None, hint);
        }
        (tried, Some(listing.join().expect("the key listing panicked")), hint)
    });
    if let Some(Ok(Some((key, file)))) = tried {
        return Ok(Some(Unlocked { key, file, hint }));
    }
    let keys = match listed {
        Some(listed) => listed?,
        None => storage.list(Dir::Keys.name())?,
    };
    if keys.is_empty() {
        return Ok(None);
    }
    // The hint's key file, if `keys/` lists it and the cached one (if any) did not open: tried
    // now, from the hint's copy (its name is the hash of those bytes, so they are that file's:
    // a key file damaged on storage still opens from it).
    let carried = hint.as_deref().and_then(|h| cairn_format::hint::split(h).ok()).map(|p| p.key_file.to_vec());
    if let Some(file) = carried {
        let path = layout::key_path(&KeyId::hash_of(&file));
        if keys.iter().any(|o| o.path == path) {
            let from_hint = try_bytes(&path, &file).map(|k| k.map(|k| (k, file)));
            if let Ok(Some((key, file))) = from_hint {
                if let (Some(Err(e)), Some(cached)) = (&tried, &hinted) {
                    crate::engine::unreadable::skipped(storage.location(), cached, e, "the start hint's copy opened");
                }
                return Ok(Some(Unlocked { key, file, hint }));
            }
            if tried.is_none() {
                tried = Some(from_hint);
                hinted = Some(path);
            }
        }
    }
    let mut damaged: Vec<(String, Error)> = Vec::new();
    let mut intact = 0;
    for obj in keys {
        // The key file tried already: what it said counts once.
        let found = match tried.take_if(|_| hinted.as_deref() == Some(obj.path.as_str())) {
            Some(found) => found,
            None => try_key(&obj.path),
        };
        match found {
            Ok(Some((key, file))) => {
                for (path, e) in &damaged {
                    crate::engine::unreadable::skipped(storage.location(), path, e, "another key file opened");
                }
                return Ok(Some(Unlocked { key, file, hint }));
            }
            Ok(None) => intact += 1,
            Err(e) => damaged.push((obj.path, e)),
        }
    }
    Err(no_key_opens(storage.location(), intact, damaged))
}

/// The body of a stored start hint, or what is wrong with it.
fn open_hint(key: &MasterKey, bytes: &[u8]) -> Result<cairn_format::hint::Hint> {
    let parts = cairn_format::hint::split(bytes)?;
    Ok(cairn_format::hint::Hint::from_bytes(&sealed::open(
        key,
        SealedKind::Hint,
        cairn_format::hint::PATH,
        parts.sealed,
    )?)?)
}

/// Why no key file opened: the password is wrong (`intact` key files refused it), key files
/// are `damaged`, or both — then both are said, since either may be the cause.
fn no_key_opens(repo: &str, intact: usize, damaged: Vec<(String, Error)>) -> Error {
    let mut damaged = damaged.into_iter();
    let Some((path, first)) = damaged.next() else {
        return Error::WrongPassword { repo: repo.to_string() };
    };
    if intact == 0 {
        // Every key file is damaged: the damage is the cause, whatever the password.
        return first;
    }
    let mut detail = match first {
        Error::Corrupt { file, why } => format!("key file {file} is damaged: {why}"),
        other => format!("key file {path} cannot be used: {other}"),
    };
    let more = damaged.count();
    if more > 0 {
        detail.push_str(&format!(", as are {more} more"));
    }
    Error::WrongPasswordOrDamagedKey { repo: repo.to_string(), detail }
}

/// Bytes of a pack's end read first to find its header (most headers fit; a longer one is read
/// again whole).
const PACK_TAIL_READ: u64 = 64 * 1024;

/// Key files read at once by [`Repository::keys`] (there are few).
const KEY_READS: usize = 8;

/// The metadata cache's name for tree blob `id` (kept, read and dropped under it).
fn tree_cache_name(id: &BlobId) -> String {
    format!("trees/{}", id.to_hex())
}

/// `storage` with its requests timed into a new meter, and the meter.
fn metered(storage: Arc<dyn Storage>) -> (Arc<dyn Storage>, Arc<LinkMeter>) {
    let link = Arc::new(LinkMeter::default());
    (Arc::new(MeteredStorage::new(storage, link.clone())), link)
}
