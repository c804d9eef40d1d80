//! No single object stops a restore (issue 58, first part). Host A backs up three small trees,
//! one backup each, so each snapshot's blobs are listed in their own index file and stored in
//! their own packs. Then one object goes bad:
//!
//! - **planted** through `cairn serve` by an attacker holding A's append token and the
//!   repository password: 700 random bytes under their BLAKE3 in `index/`, `snapshots/`, `keys/`
//!   or as the start hint; an index sealed with the repository's key that places every blob
//!   where another lies, or in packs that do not exist; a snapshot sealed with the key, newer
//!   than all others, of host A, whose tree is empty;
//! - **rotten**: one bit flipped in the middle of one index file, snapshot, key file or the
//!   start hint, of a local repository or one in MinIO.
//!
//! After each, on a new machine (no cache) and with `--no-local-data`: every original snapshot
//! that does not need the bad object restores exactly, `snapshots` lists them (naming the bad
//! object once on stderr), `dump`, `ls` and `diff` work, a new backup works and restores
//! exactly, `check` names the object and fails; `forget --prune` deletes nothing a kept
//! snapshot needs. Only an admin token removes a planted object (`repair index`, `repair
//! unreadable`); an append token's attempt changes no stored object.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::support::library::id::PackId;
use crate::support::library::index::{self, IndexedPack};
use crate::support::library::sealed::{self, SealedKind};
use crate::support::library::snapshot::{Snapshot, Summary};
use crate::support::library::tree::{self, Timestamp};
use crate::support::serve::Server;
use crate::support::{self as common, servers, Cairn, Rng, Scan, Tree, PASSWORD};

/// The repository's name on the server.
const REPO: &str = "laptop";

/// One of host A's backups: the snapshot, the tree it backed up (as scanned before), and the
/// index files that backup wrote.
struct Original {
    id: String,
    dir: PathBuf,
    scan: Scan,
    index: Vec<String>,
}

/// Where the repository's objects are stored, for listing and damaging them behind Cairn's back.
enum Store {
    /// A directory: a local repository, or the repository's directory below `cairn serve`.
    Dir(PathBuf),
    /// An S3 repository in MinIO, reached through the storage helper with this runner's
    /// credentials.
    S3(Cairn),
}

impl Store {
    /// Every stored object but locks and the server's own records: its path and, in a
    /// directory, the BLAKE3 of its bytes (in S3, its size; content-addressed names say the
    /// rest).
    fn objects(&self) -> BTreeMap<String, String> {
        match self {
            Store::Dir(root) => common::files_under(root)
                .into_iter()
                .map(|p| (p.strip_prefix(root).unwrap().to_string_lossy().into_owned(), p))
                .filter(|(rel, _)| ![".serve", "locks", ".tmp"].iter().any(|skip| rel.starts_with(skip)))
                .map(|(rel, p)| (rel, blake3::hash(&std::fs::read(p).unwrap()).to_hex().to_string()))
                .collect(),
            Store::S3(c) => ["keys", "data", "index", "snapshots", "deletions"]
                .iter()
                .flat_map(|dir| servers::remote_storage(c, "list", dir))
                .chain(servers::remote_storage(c, "exists", "hint"))
                .chain(servers::remote_storage(c, "exists", "config"))
                .map(|(path, size)| (path, size.to_string()))
                .collect(),
        }
    }

    /// The objects below `dir` (`index`, `keys`, …).
    fn list(&self, dir: &str) -> Vec<String> {
        self.objects().into_keys().filter(|p| p.starts_with(&format!("{dir}/"))).collect()
    }

    /// Flips one bit in the middle of the object `path`, in place.
    fn flip(&self, path: &str) {
        match self {
            Store::Dir(root) => {
                let file = root.join(path);
                let mut bytes = std::fs::read(&file).unwrap();
                // The hint carries a copy of a key file before its sealed body: a bit of the
                // body (a copy of a key file is used only under the name its bytes hash to, so
                // a damaged copy is never used and not damage the reader sees).
                let at = if path == "hint" { bytes.len() - 20 } else { bytes.len() / 2 };
                bytes[at] ^= 0x10;
                std::fs::write(&file, bytes).unwrap();
            }
            Store::S3(c) => {
                servers::remote_storage(c, "flip", path);
            }
        }
    }
}

/// A fresh directory for one test (canonical: snapshots record canonical paths).
fn workdir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().canonicalize().unwrap();
    (dir, path)
}

/// `c` on another machine: a cache of its own, empty at first.
fn new_machine(c: &Cairn, work: &Path, name: &str) -> Cairn {
    c.clone().with_env("CAIRN_CACHE_DIR", work.join(format!("cache-{name}")).to_str().unwrap())
}

/// The error lines of a command's stderr (a refusal is one; the objects the command skipped
/// are warned of beside it, and progress goes there too).
fn errors(out: &Output) -> usize {
    common::stderr(out).lines().filter(|l| l.starts_with("cairn: ")).count()
}

/// A command's status and both streams, for failure messages.
fn shown(out: &Output) -> String {
    format!("status {}\nstdout:\n{}\nstderr:\n{}", out.status, common::stdout(out), common::stderr(out))
}

/// Host A's three trees, `one` (with an empty directory, whose tree blob a planted snapshot
/// points at), `two` and `three`, of a few hundred KB of random bytes in all, each backed up
/// once into a new repository through `c`; each backup writes exactly one index file.
fn back_up_three(c: &Cairn, store: &Store, work: &Path) -> Vec<Original> {
    c.init(&[]);
    let mut originals = Vec::new();
    for (i, name) in ["one", "two", "three"].into_iter().enumerate() {
        let dir = work.join(name);
        let mut t = Tree::new(&dir, 580 + i as u64);
        t.random("a", 30_000 + 20_000 * i)
            .random("sub/b", 70_000)
            .random("sub/deeper/c", 3_000)
            .symlink("../a", "sub/link")
            .file("small", format!("tree {name}"));
        if i == 0 {
            t.dir("empty");
        }
        let scan = t.scan();
        let indexed = store.list("index");
        let id = common::snapshot_id(&c.backup(&[&dir], &[]));
        let index: Vec<String> = store.list("index").into_iter().filter(|p| !indexed.contains(p)).collect();
        assert_eq!(index.len(), 1, "the backup of {name} wrote one index file: {index:?}");
        originals.push(Original { id, dir, scan, index });
    }
    originals
}

/// What every test does after one object went bad: `host` is host A on a new machine, `admin`
/// an admin token's runner (the same as `host` without a server); `skip` is the original that
/// needs the bad object (a damaged snapshot's own), if any.
struct Trial<'a> {
    host: Cairn,
    admin: Cairn,
    store: &'a Store,
    originals: &'a [Original],
    bad: String,
    skip: Option<usize>,
    work: &'a Path,
}

impl Trial<'_> {
    /// The originals that do not need the bad object.
    fn usable(&self) -> Vec<&Original> {
        self.originals.iter().enumerate().filter(|(i, _)| Some(*i) != self.skip).map(|(_, o)| o).collect()
    }

    /// Restores `o` with `--no-local-data` into a fresh directory and asserts it came back
    /// exactly (warnings are allowed: the command may name what it skipped).
    fn restores_exactly(&self, c: &Cairn, o: &Original) {
        let target = tempfile::tempdir_in(self.work).unwrap();
        let t = target.path().to_str().unwrap();
        let out = c.run(["--json", "restore", &o.id, "--target", t, "--no-local-data"]);
        assert!(out.status.success(), "restore {} with {} bad: {}", o.id, self.bad, shown(&out));
        let summary = common::last_json(&common::stdout(&out));
        assert_eq!(summary["failed"], 0, "restore {} with {} bad: {}", o.id, self.bad, shown(&out));
        common::assert_same(&o.scan, &common::scan(&common::restored_path(target.path(), &o.dir)), true);
    }

    /// (i) Every original that does not need the bad object restores exactly.
    fn originals_restore(&self) {
        for o in self.usable() {
            self.restores_exactly(&self.host, o);
        }
    }

    /// `snapshots --json` through `c`: exit 0; the IDs listed and stderr.
    fn snapshots(&self, c: &Cairn) -> (Vec<String>, String) {
        let out = c.run(["--json", "snapshots"]);
        assert!(out.status.success(), "snapshots with {} bad: {}", self.bad, shown(&out));
        let listed = common::last_json(&common::stdout(&out));
        let ids = listed.as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_string()).collect();
        (ids, common::stderr(&out))
    }

    /// (ii) `snapshots` lists every usable original; with `warns`, one line of stderr names
    /// the bad object.
    fn snapshots_list(&self, warns: bool) {
        let (ids, err) = self.snapshots(&self.host);
        for o in self.usable() {
            assert!(ids.contains(&o.id), "snapshots with {} bad does not list {}: {ids:?}\n{err}", self.bad, o.id);
        }
        if warns {
            let naming = err.lines().filter(|l| l.contains(&self.bad)).count();
            assert_eq!(naming, 1, "snapshots names {} once on stderr:\n{err}", self.bad);
        }
    }

    /// (iv) `check` names the bad object, and fails unless it is the start hint (a damaged
    /// hint is a notice: nothing is lost, and the next backup rewrites it).
    fn check_names_it(&self) {
        let out = self.admin.run(["check"]);
        let text = format!("{}{}", common::stdout(&out), common::stderr(&out));
        let notice = self.bad == "hint";
        assert!(notice || !out.status.success(), "check with {} bad passed: {}", self.bad, shown(&out));
        assert!(text.contains(&self.bad), "check does not name {}: {}", self.bad, shown(&out));
    }

    /// (v) `dump` of a file, `ls` and `diff` of usable originals work.
    fn browse(&self) {
        let usable = self.usable();
        let (a, b) = (usable[0], usable[1]);
        let file = a.dir.join("sub/b");
        let out = self.host.run(["dump", &format!("{}:{}", a.id, file.display())]);
        assert!(out.status.success(), "dump with {} bad: {}", self.bad, shown(&out));
        assert!(out.stdout == common::read_noatime(&file), "dump with {} bad: other bytes", self.bad);
        let out = self.host.run(["ls", &b.id]);
        assert!(out.status.success(), "ls with {} bad: {}", self.bad, shown(&out));
        let listed = b.dir.join("sub/deeper/c");
        assert!(common::stdout(&out).contains(listed.to_str().unwrap()), "ls with {} bad: {}", self.bad, shown(&out));
        let out = self.host.run(["diff", &a.id, &b.id]);
        assert!(out.status.success(), "diff with {} bad: {}", self.bad, shown(&out));
    }

    /// (iii) A new backup of `one` (a file added) by host A succeeds and restores exactly.
    fn new_backup(&self) -> Original {
        let dir = self.originals[0].dir.clone();
        std::fs::write(dir.join("added"), Rng(4).bytes(20_000)).unwrap();
        let scan = common::scan_source(&dir);
        let out = self.host.run([std::ffi::OsStr::new("--json"), "backup".as_ref(), dir.as_os_str()]);
        assert!(out.status.success(), "backup with {} bad: {}", self.bad, shown(&out));
        let id = common::snapshot_id(&common::last_json(&common::stdout(&out)));
        let new = Original { id, dir, scan, index: Vec::new() };
        self.restores_exactly(&self.host, &new);
        new
    }

    /// `forget --keep-last 1 --group-by '' --prune` keeps only `newest`: it either succeeds,
    /// or refuses in one line and deletes nothing; then every snapshot still listed restores
    /// exactly, `newest` among them.
    fn forget_and_prune(&self, newest: &Original) {
        let before = self.store.objects();
        let out = self.host.run(["forget", "--keep-last", "1", "--group-by", "", "--prune"]);
        if !out.status.success() {
            assert_eq!(errors(&out), 1, "a refusal is one line: {}", shown(&out));
            assert_eq!(self.store.objects(), before, "forget --prune failed and changed stored objects");
        }
        let (ids, _) = self.snapshots(&self.host);
        assert!(ids.contains(&newest.id), "forget --prune removed the newest snapshot: {ids:?}");
        for o in self.usable().into_iter().chain([newest]).filter(|o| ids.contains(&o.id)) {
            self.restores_exactly(&self.host, o);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Planted through `cairn serve` with the host's append token

/// The object an attacker with A's append token and the password plants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Planted {
    RandomIndex,
    RandomSnapshot,
    RandomKey,
    RandomHint,
    /// Sealed with the key: every blob placed where another blob of its pack lies (a pack
    /// of one blob: one byte further on), so each place holds an authentic blob, not this one.
    IndexOfWrongOffsets,
    /// Sealed with the key: every blob placed in a pack that does not exist.
    IndexOfMissingPacks,
    /// Sealed with the key: of host A and `one`'s paths, an hour newer than all others, its
    /// tree the empty tree (stored by the backup of `one`'s empty directory).
    NewestEmptySnapshot,
}

impl Planted {
    /// The object's path and bytes; the sealed ones are made with the key of the repository in
    /// `repo_dir`.
    fn make(self, repo_dir: &Path, originals: &[Original]) -> (String, Vec<u8>) {
        let named = |dir: &str, bytes: Vec<u8>| (format!("{dir}/{}", blake3::hash(&bytes).to_hex()), bytes);
        let random = || Rng(700).bytes(700);
        let (repo, _) = Cairn::new(repo_dir, PASSWORD).open();
        match self {
            Planted::RandomIndex => named("index", random()),
            Planted::RandomSnapshot => named("snapshots", random()),
            Planted::RandomKey => named("keys", random()),
            Planted::RandomHint => ("hint".to_string(), random()),
            Planted::IndexOfWrongOffsets | Planted::IndexOfMissingPacks => {
                let files = repo.index_files().unwrap();
                let honest: Vec<String> = files.iter().map(|(name, _)| name.clone()).collect();
                let packs: Vec<IndexedPack> = files
                    .into_iter()
                    .flat_map(|(name, packs)| packs.unwrap_or_else(|e| panic!("{name}: {e}")))
                    .collect();
                let lies = if self == Planted::IndexOfWrongOffsets {
                    packs.iter().map(wrong_offsets).collect::<Vec<_>>()
                } else {
                    packs.iter().map(missing_pack).collect()
                };
                // Sealed again (a new random salt, a new name) until its name sorts before
                // every honest index file's: where index files disagree, the one read first
                // is believed today, and an attacker can choose to be read first.
                loop {
                    let (path, bytes) =
                        named("index", sealed::seal(repo.key(), SealedKind::Index, &index::encode(&lies)));
                    if honest.iter().all(|h| path < *h) {
                        break (path, bytes);
                    }
                }
            }
            Planted::NewestEmptySnapshot => {
                repo.load_index().unwrap();
                let empty = repo.key().blob_id(&tree::Tree::default().to_bytes());
                assert!(repo.index().contains(&empty), "the backup of `one` stored no empty tree");
                let snaps = repo.snapshots().unwrap();
                let newest = snaps.iter().map(|(_, s)| s.time).max().unwrap();
                let (_, of_one) = snaps.iter().find(|(id, _)| id.to_hex() == originals[0].id).unwrap();
                let planted = Snapshot {
                    time: Timestamp { secs: newest.secs + 3600, nanos: 0 },
                    tree: empty,
                    parent: None,
                    summary: Summary::default(),
                    ..of_one.clone()
                };
                named("snapshots", sealed::seal(repo.key(), SealedKind::Snapshot, &planted.to_bytes()))
            }
        }
    }

    /// Whether `snapshots` reads it and cannot (so names it once). It reads no index file, and
    /// a key file only when the one the start hint carries does not open.
    fn unreadable(self) -> bool {
        matches!(self, Planted::RandomSnapshot | Planted::RandomHint)
    }

    /// Whether `check` can tell it from what host A stored (a validly sealed snapshot of an
    /// empty tree is, to `check`, a snapshot like any other).
    fn detectable(self) -> bool {
        self != Planted::NewestEmptySnapshot
    }
}

/// `pack` with each blob placed where the next blob of the pack begins (a pack of one blob: one
/// byte further on), its length as it is. (A lie about a blob's plaintext length too makes the
/// files that need it fail, named, rather than be read elsewhere: the restore plans from the
/// length the index gives.)
fn wrong_offsets(pack: &IndexedPack) -> IndexedPack {
    let n = pack.blobs.len();
    let blobs = pack
        .blobs
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let mut lie = *b;
            lie.offset = if n == 1 { b.offset + 1 } else { pack.blobs[(i + 1) % n].offset };
            lie
        })
        .collect();
    IndexedPack { blobs, ..pack.clone() }
}

/// `pack` under the ID of a pack that does not exist.
fn missing_pack(pack: &IndexedPack) -> IndexedPack {
    IndexedPack { id: PackId::hash_of(&[&pack.id.0[..], b"never stored"].concat()), ..pack.clone() }
}

/// Stores `bytes` as `path` of the served repository with `token`.
fn put(server: &Server, token: &str, path: &str, bytes: &[u8]) {
    let (status, body) = server.raw("PUT", &format!("/v1/repos/{REPO}/objects/{path}"), Some(token), bytes);
    assert!(status == 201 || status == 200, "PUT {path}: {status} {body}");
}

/// The attacker plants `planted` with host A's append token; every check of [`Trial`] holds,
/// an append token cannot remove it, an admin token can.
fn planted_through_the_server(planted: Planted) {
    let server = Server::start();
    let (_dir, work) = workdir();
    let append = server.token(&["--repo", REPO, "--role", "append", "--name", "host-a"]);
    let admin = server.token(&["--all", "--role", "admin", "--name", "site-admin"]);
    let store = Store::Dir(server.storage().join(REPO));
    let originals = back_up_three(&server.cairn(REPO, &append), &store, &work);
    let (bad, bytes) = planted.make(&server.storage().join(REPO), &originals);
    put(&server, &append, &bad, &bytes);

    let t = Trial {
        host: new_machine(&server.cairn(REPO, &append), &work, "host"),
        admin: new_machine(&server.cairn(REPO, &admin), &work, "admin"),
        store: &store,
        originals: &originals,
        bad: bad.clone(),
        skip: None,
        work: &work,
    };
    t.originals_restore();
    t.snapshots_list(planted.unreadable());
    if planted.detectable() {
        t.check_names_it();
    }
    t.browse();
    t.new_backup();
    if !planted.detectable() {
        return;
    }
    if planted == Planted::RandomHint {
        // The backup replaced the hint, as every backup does; plant it again.
        put(&server, &append, &bad, &bytes);
    }

    // Removal: refused with an append token, nothing changed; done with an admin token.
    let removals: [&[&str]; 2] = [&["repair", "index"], &["repair", "unreadable"]];
    let before = store.objects();
    for args in removals {
        let out = t.host.run(args);
        assert!(!out.status.success(), "{args:?} with an append token: {}", shown(&out));
        assert_eq!(errors(&out), 1, "{args:?}: a refusal is one line: {}", shown(&out));
        assert_eq!(store.objects(), before, "{args:?} with an append token changed stored objects");
    }
    for args in removals {
        let out = t.admin.run(args);
        assert!(out.status.success(), "{args:?} with an admin token: {}", shown(&out));
    }
    let planted_hash = blake3::hash(&bytes).to_hex().to_string();
    assert_ne!(store.objects().get(&bad), Some(&planted_hash), "the admin's repair left {bad}");
    let out = t.admin.run(["check"]);
    assert!(out.status.success(), "check after the admin's repair: {}", shown(&out));
    t.originals_restore();
}

#[test]
fn planted_random_index_file() {
    planted_through_the_server(Planted::RandomIndex);
}

#[test]
fn planted_random_snapshot() {
    planted_through_the_server(Planted::RandomSnapshot);
}

#[test]
fn planted_random_key_file() {
    planted_through_the_server(Planted::RandomKey);
}

#[test]
fn planted_random_start_hint() {
    planted_through_the_server(Planted::RandomHint);
}

#[test]
fn planted_sealed_index_of_wrong_offsets() {
    planted_through_the_server(Planted::IndexOfWrongOffsets);
}

#[test]
fn planted_sealed_index_of_missing_packs() {
    planted_through_the_server(Planted::IndexOfMissingPacks);
}

#[test]
fn planted_sealed_newest_snapshot_of_an_empty_tree() {
    planted_through_the_server(Planted::NewestEmptySnapshot);
}

// ---------------------------------------------------------------------------------------------
// 2. and 3. One bit rotten in one metadata object, of a local repository or one in MinIO

/// The object that rots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rot {
    /// The index file the backup of original N wrote (the only one listing its blobs).
    Index(usize),
    /// Original N's snapshot.
    Snapshot(usize),
    /// The key file (the start hint carries a copy of it).
    Key,
    /// The start hint.
    Hint,
}

/// Where the repository is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Location {
    Local,
    S3,
}

/// One bit of `rot`'s object flips; every check of [`Trial`] holds, and `forget --prune`
/// deletes nothing a kept snapshot needs. Once, the restore of the snapshot whose index file
/// rotted runs with the index on disk too (`CAIRN_INDEX=disk`).
fn rotten(location: Location, rot: Rot) {
    let (_dir, work) = workdir();
    let (c, store) = match location {
        Location::Local => {
            let repo = work.join("repo");
            (common::isolated(Cairn::new(&repo, PASSWORD), &work), Store::Dir(repo))
        }
        Location::S3 => {
            let c = servers::cairn(&servers::s3_repo("trust"), &work.join("cache"));
            (c.clone(), Store::S3(c))
        }
    };
    let originals = back_up_three(&c, &store, &work);
    let (bad, skip) = match rot {
        Rot::Index(n) => (originals[n].index[0].clone(), None),
        Rot::Snapshot(n) => (format!("snapshots/{}", originals[n].id), Some(n)),
        Rot::Key => {
            let keys = store.list("keys");
            assert_eq!(keys.len(), 1, "{keys:?}");
            (keys[0].clone(), None)
        }
        Rot::Hint => {
            assert!(store.objects().contains_key("hint"), "the backups wrote no start hint");
            ("hint".to_string(), None)
        }
    };
    store.flip(&bad);

    let host = new_machine(&c, &work, "host");
    let t = Trial { host: host.clone(), admin: host, store: &store, originals: &originals, bad, skip, work: &work };
    t.originals_restore();
    if let Rot::Index(n) = rot {
        if location == Location::Local && n == 0 {
            t.restores_exactly(&new_machine(&c, &work, "disk-index").with_env("CAIRN_INDEX", "disk"), &originals[n]);
        }
    }
    // `snapshots` reads no index file, and no key file when the hint's copy opens.
    t.snapshots_list(matches!(rot, Rot::Snapshot(_) | Rot::Hint));
    t.check_names_it();
    t.browse();
    let newest = t.new_backup();
    t.forget_and_prune(&newest);
}

#[test]
fn rotten_index_file_of_the_first_snapshot() {
    rotten(Location::Local, Rot::Index(0));
}

#[test]
fn rotten_index_file_of_the_second_snapshot() {
    rotten(Location::Local, Rot::Index(1));
}

#[test]
fn rotten_index_file_of_the_third_snapshot() {
    rotten(Location::Local, Rot::Index(2));
}

#[test]
fn rotten_first_snapshot() {
    rotten(Location::Local, Rot::Snapshot(0));
}

#[test]
fn rotten_second_snapshot() {
    rotten(Location::Local, Rot::Snapshot(1));
}

#[test]
fn rotten_third_snapshot() {
    rotten(Location::Local, Rot::Snapshot(2));
}

#[test]
fn rotten_key_file_with_the_hint_intact() {
    rotten(Location::Local, Rot::Key);
}

#[test]
fn rotten_start_hint() {
    rotten(Location::Local, Rot::Hint);
}

#[test]
fn rotten_index_file_of_the_first_snapshot_in_s3() {
    rotten(Location::S3, Rot::Index(0));
}

#[test]
fn rotten_third_snapshot_in_s3() {
    rotten(Location::S3, Rot::Snapshot(2));
}
