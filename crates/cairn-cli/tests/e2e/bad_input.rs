//! End-to-end tests of the `cairn` binary against bad input: a wrong password, damaged
//! repository files, hostile (well-authenticated but malicious) repositories, unreadable
//! sources and names that do not exist.
//!
//! The invariants checked throughout: a failing command exits non-zero with a message that
//! names the damaged object, nothing panics, a restore never leaves a file with wrong content
//! behind, and nothing is ever written outside the restore target.

use crate::support;
use crate::support::library;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use crate::support::library::compress::Codec;
use crate::support::library::id::{BlobId, PackId, SnapshotId};
use crate::support::library::layout::pack_path;
use crate::support::library::pack::BlobKind;
use crate::support::library::repository::Repository;
use crate::support::library::snapshot::{Snapshot, Summary};
use crate::support::library::storage::OpendalStorage;
use crate::support::library::tree::{Chunk, Node, NodeKind, Timestamp, Tree};
use support::{Cairn, Fixture};
use tempfile::TempDir;

const PASSWORD: &str = "bad-input test password";

// ---------------------------------------------------------------------------------------------
// Running the binary
// ---------------------------------------------------------------------------------------------

/// What one run of `cairn` did.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Asserts that the command failed with exit code `code` and exactly one line on stderr;
    /// returns that line.
    fn one_line_failure(&self, code: i32) -> &str {
        self.no_panic();
        assert_eq!(self.code, code, "exit code; {self:#?}");
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "want exactly one line on stderr; {self:#?}");
        assert!(lines[0].starts_with("cairn: "), "error line lacks the `cairn: ` prefix; {self:#?}");
        lines[0]
    }

    /// Asserts that the command succeeded and said once, in a warning, that it skipped `name`
    /// (FORMAT.md §18); returns that line.
    fn skipped(&self, name: &str) -> &str {
        self.no_panic();
        assert_eq!(self.code, 0, "exit code; {self:#?}");
        let warned: Vec<&str> =
            self.stderr.lines().filter(|l| l.starts_with("warning: ") && l.contains(name)).collect();
        assert_eq!(warned.len(), 1, "want one warning naming {name}; {self:#?}");
        warned[0]
    }

    fn success(&self) {
        self.no_panic();
        assert_eq!(self.code, 0, "command failed; {self:#?}");
    }

    fn no_panic(&self) {
        assert!(
            !self.stderr.contains("panicked") && !self.stderr.contains("RUST_BACKTRACE"),
            "cairn panicked; {self:#?}"
        );
        // 101 is the exit code of a Rust panic; signals show up as -1.
        assert!(self.code != 101 && self.code >= 0, "cairn crashed; {self:#?}");
    }

    /// The `error: PATH: WHY` lines of a restore, by path.
    fn restore_errors(&self) -> BTreeMap<PathBuf, String> {
        self.stderr
            .lines()
            .filter_map(|l| l.strip_prefix("error: "))
            .map(|l| {
                let (path, why) = l.split_once(": ").expect("error: PATH: WHY");
                (PathBuf::from(path), why.to_string())
            })
            .collect()
    }
}

/// `cairn -r REPO` with the test password and a clean environment (the common harness's).
fn cairn_cmd(repo: &Path) -> Command {
    let mut cmd = Cairn::new(repo, PASSWORD).command();
    cmd.env_remove("RUST_BACKTRACE");
    cmd
}

/// Runs `cmd` through the common harness, which fails the test if it runs longer than
/// [`support::COMMAND_TIMEOUT`].
fn run_cmd(mut cmd: Command) -> Run {
    let out = support::output_within_timeout(&mut cmd);
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `cairn -r REPO ARGS…` with the test password.
fn cairn<S: AsRef<OsStr>>(repo: &Path, args: &[S]) -> Run {
    let mut cmd = cairn_cmd(repo);
    cmd.args(args);
    run_cmd(cmd)
}

/// Creates a repository with cheap Argon2 costs, small chunks (so files span several blobs)
/// and the smallest packs (so a few MiB of data span several packs).
fn init_repo(repo: &Path) {
    cairn(
        repo,
        &[
            "init",
            "--kdf-memory",
            "1024",
            "--kdf-iterations",
            "1",
            "--chunk-sizes",
            "1024,4096,16384",
            "--pack-size",
            "1",
        ],
    )
    .success();
}

/// Backs up `path`; returns the new snapshot's full ID.
fn backup(repo: &Path, path: &Path) -> String {
    let mut cmd = cairn_cmd(repo);
    cmd.arg("--json").arg("backup").arg(path);
    let run = run_cmd(cmd);
    run.success();
    let v: serde_json::Value = serde_json::from_str(run.stdout.trim()).expect("json summary");
    v["snapshot_id"].as_str().expect("snapshot_id").to_string()
}

/// `restore SPEC --target TARGET --no-local-data`: the damage under test must not be
/// repaired from the source files, which are still there (`restore::local_data` tests that).
fn restore(repo: &Path, spec: &str, target: &Path) -> Run {
    let mut cmd = cairn_cmd(repo);
    cmd.arg("restore").arg(spec).arg("--target").arg(target).arg("--no-local-data");
    run_cmd(cmd)
}

/// `restore latest:SRC --target TARGET`: restores the contents of the backed-up directory.
fn restore_src(repo: &Path, src: &Path, target: &Path) -> Run {
    restore(repo, &format!("latest:{}", src.display()), target)
}

// ---------------------------------------------------------------------------------------------
// Source trees and comparing restores
// ---------------------------------------------------------------------------------------------

/// Deterministic incompressible bytes.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A source directory of distinct files (no two share a blob), small and multi-chunk, one
/// spanning several packs, with subdirectories, an empty file, an all-zero file and a symlink.
fn make_source(src: &Path) {
    fs::create_dir_all(src.join("sub/deep")).unwrap();
    fs::write(src.join("big.bin"), noise(1, 2_500_000)).unwrap();
    fs::write(src.join("a.txt"), b"alpha: the first file\n").unwrap();
    fs::write(src.join("b.bin"), noise(2, 40_000)).unwrap();
    fs::write(src.join("sub/c.txt"), noise(3, 9_000)).unwrap();
    fs::write(src.join("sub/deep/d.bin"), noise(4, 60_000)).unwrap();
    fs::write(src.join("sub/deep/e.bin"), noise(5, 3_000)).unwrap();
    fs::write(src.join("empty"), b"").unwrap();
    fs::write(src.join("zeros"), vec![0u8; 20_000]).unwrap();
    std::os::unix::fs::symlink("a.txt", src.join("link")).unwrap();
}

/// Every entry below `dir`, relative to it, with its metadata (not following symlinks).
fn entries(dir: &Path) -> BTreeMap<PathBuf, fs::Metadata> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, fs::Metadata>) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        for e in rd {
            let e = e.unwrap();
            let md = fs::symlink_metadata(e.path()).unwrap();
            let rel = e.path().strip_prefix(root).unwrap().to_path_buf();
            if md.is_dir() {
                walk(root, &e.path(), out);
            }
            out.insert(rel, md);
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Asserts that every entry in `target` is an exact copy of the same entry in `src` (same
/// type, same bytes, same symlink target): a restore may leave files out, never get one wrong.
/// Returns the entries of `src` that are missing from `target`.
fn check_restored(src: &Path, target: &Path) -> BTreeSet<PathBuf> {
    let want = entries(src);
    let got = entries(target);
    for (rel, md) in &got {
        let Some(src_md) = want.get(rel) else {
            panic!("{} was restored but is not in the source", rel.display());
        };
        assert_eq!(md.file_type(), src_md.file_type(), "{} has the wrong type", rel.display());
        if md.is_file() {
            let (a, b) = (fs::read(target.join(rel)).unwrap(), fs::read(src.join(rel)));
            assert!(a == b.unwrap(), "{} was restored with wrong content ({} bytes)", rel.display(), a.len());
        } else if md.file_type().is_symlink() {
            assert_eq!(
                fs::read_link(target.join(rel)).unwrap(),
                fs::read_link(src.join(rel)).unwrap(),
                "{} has the wrong symlink target",
                rel.display()
            );
        }
    }
    want.keys().filter(|k| !got.contains_key(*k)).cloned().collect()
}

/// Flips bit 0x40 of byte `pos` of `path`.
fn flip(path: &Path, pos: usize) {
    let mut b = fs::read(path).unwrap();
    b[pos] ^= 0x40;
    fs::write(path, b).unwrap();
}

fn truncate(path: &Path, len: usize) {
    let b = fs::read(path).unwrap();
    fs::write(path, &b[..len]).unwrap();
}

/// Renames a content-addressed file to the BLAKE3 of its (damaged) bytes, as if it had been
/// written that way; returns the new path.
fn rename_to_hash(path: &Path) -> PathBuf {
    let b = fs::read(path).unwrap();
    let new = path.with_file_name(PackId::hash_of(&b).to_hex());
    fs::rename(path, &new).unwrap();
    new
}

/// Path of `p` relative to `repo`, with `/` separators, as error messages print it.
fn repo_rel(repo: &Path, p: &Path) -> String {
    p.strip_prefix(repo).unwrap().to_string_lossy().into_owned()
}

/// The only file in `repo/dir` (searched recursively).
fn only_file(repo: &Path, dir: &str) -> PathBuf {
    let files: Vec<PathBuf> = entries(&repo.join(dir))
        .into_iter()
        .filter(|(_, md)| md.is_file())
        .map(|(rel, _)| repo.join(dir).join(rel))
        .collect();
    assert_eq!(files.len(), 1, "want one file in {dir}: {files:?}");
    files.into_iter().next().unwrap()
}

/// One way of damaging a file.
type Damage = Box<dyn Fn(&Path)>;

/// Damage cases applied to one file of `len` bytes: `(description, damage)`.
fn damages(len: usize) -> Vec<(String, Damage)> {
    let mut out: Vec<(String, Damage)> = Vec::new();
    for pos in [0, 1, len / 2, len - 1] {
        out.push((format!("flip byte {pos}"), Box::new(move |p| flip(p, pos))));
    }
    for keep in [0, 1, len / 2, len - 1] {
        out.push((format!("truncate to {keep} bytes"), Box::new(move |p| truncate(p, keep))));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// A repository with one backup, for the damage tests
// ---------------------------------------------------------------------------------------------

impl Fixture {
    /// A repository (this file's password, tiny chunks, 1 MiB packs) with one backup of
    /// [`make_source`]; the restore target `target` is empty.
    fn damageable() -> Self {
        let mut f = Fixture::new().with_password(PASSWORD);
        make_source(&f.src);
        init_repo(f.repo());
        f.snapshot = backup(f.repo(), &f.src);
        // The fixture itself must restore perfectly.
        let run = f.restore_src();
        run.success();
        assert!(check_restored(&f.src, &f.target()).is_empty());
        f.clear_target();
        f
    }

    /// Where the damage tests restore to.
    fn target(&self) -> PathBuf {
        self.path("target")
    }

    fn restore_src(&self) -> Run {
        restore_src(self.repo(), &self.src, &self.target())
    }

    fn clear_target(&self) {
        if self.target().exists() {
            fs::remove_dir_all(self.target()).unwrap();
        }
    }

    /// Damages `file` with `damage` (then, with `rename`, renames it to the hash of its new
    /// bytes) and runs `check`, which gets `what` and the damaged file's path; afterwards puts
    /// the original back and clears the target.
    fn with_damage(
        &self,
        file: &Path,
        what: &str,
        damage: &dyn Fn(&Path),
        rename: bool,
        check: &mut dyn FnMut(&str, &Path),
    ) {
        let original = fs::read(file).unwrap();
        damage(file);
        let damaged = if rename { rename_to_hash(file) } else { file.to_path_buf() };
        eprintln!("case: {} {what}", repo_rel(self.repo(), &damaged));
        check(what, &damaged);
        if damaged != file {
            fs::remove_file(&damaged).unwrap();
        }
        fs::write(file, original).unwrap();
        self.clear_target();
    }

    /// Asserts that a restore fails at once with one line naming `name`, and writes nothing.
    fn assert_restore_fatal(&self, name: &str, what: &str) {
        self.assert_fatal(&self.restore_src(), name, what);
    }

    /// Asserts that `run` (a restore) failed at once with one line naming `name`, and wrote
    /// nothing.
    fn assert_fatal(&self, run: &Run, name: &str, what: &str) {
        let line = run.one_line_failure(1);
        assert!(line.contains(name), "{what}: error does not name {name}: {line}");
        let missing = check_restored(&self.src, &self.target());
        assert_eq!(missing.len(), entries(&self.src).len(), "{what}: wrote files");
    }
}

/// Where each blob a restore of the fixture's source directory needs lives.
struct Layout {
    /// Tree blobs read to plan the restore (the path from `/` down, and everything below).
    trees: BTreeSet<BlobId>,
    /// Each file's data blobs, by path relative to the source directory.
    files: BTreeMap<PathBuf, Vec<BlobId>>,
    /// Pack path and `(offset, length)` of each of those blobs.
    location: BTreeMap<BlobId, (String, u64, u64)>,
}

fn open_repo(repo: &Path) -> Repository {
    let storage = OpendalStorage::local(repo.to_str().unwrap()).unwrap();
    Repository::open(Arc::new(storage), PASSWORD.as_bytes()).unwrap()
}

fn layout(repo_dir: &Path, src: &Path) -> Layout {
    let repo = open_repo(repo_dir);
    repo.load_index().unwrap();
    let (_, snap) = repo.find_snapshot("latest").unwrap();
    let mut l = Layout { trees: BTreeSet::new(), files: BTreeMap::new(), location: BTreeMap::new() };
    let mut tree_id = snap.tree;
    l.trees.insert(tree_id);
    for c in src.components() {
        if let Component::Normal(name) = c {
            let tree = repo.read_tree(&tree_id).unwrap();
            let node = tree.nodes.into_iter().find(|n| n.name == name.as_bytes()).unwrap();
            tree_id = node.subtree.unwrap();
            l.trees.insert(tree_id);
        }
    }
    let mut stack = vec![(PathBuf::new(), tree_id)];
    while let Some((dir, id)) = stack.pop() {
        for node in repo.read_tree(&id).unwrap().nodes {
            let rel = dir.join(OsStr::from_bytes(&node.name));
            if let Some(sub) = node.subtree {
                l.trees.insert(sub);
                stack.push((rel.clone(), sub));
            }
            if node.kind == NodeKind::File {
                let ids = node
                    .content
                    .iter()
                    .filter_map(|c| match c {
                        Chunk::Data { id, .. } => Some(*id),
                        Chunk::Zero { .. } => None,
                    })
                    .collect();
                l.files.insert(rel, ids);
            }
        }
    }
    for id in l.trees.iter().chain(l.files.values().flatten()) {
        let loc = repo.index().get(id).expect("blob in index");
        l.location.insert(*id, (pack_path(&loc.pack), u64::from(loc.entry.offset), u64::from(loc.entry.length)));
    }
    l
}

impl Layout {
    fn packs(&self) -> BTreeSet<String> {
        self.location.values().map(|(p, _, _)| p.clone()).collect()
    }

    /// Blobs of `pack` hit by `hit(offset, end)`.
    fn blobs_hit(&self, pack: &str, hit: impl Fn(u64, u64) -> bool) -> BTreeSet<BlobId> {
        self.location.iter().filter(|(_, (p, off, len))| p == pack && hit(*off, off + len)).map(|(id, _)| *id).collect()
    }

    /// Files needing any of `blobs`.
    fn files_needing(&self, blobs: &BTreeSet<BlobId>) -> BTreeSet<PathBuf> {
        self.files.iter().filter(|(_, ids)| ids.iter().any(|id| blobs.contains(id))).map(|(p, _)| p.clone()).collect()
    }
}

/// Checks a restore of a fixture whose pack `pack` has the blobs `hit` damaged (and, for a
/// truncation, possibly more of its blobs unreadable through a shared read): a damaged tree
/// stops the restore with one line naming the pack; a damaged data blob fails exactly the
/// files that need it (each listed, naming the pack), everything else is restored exactly;
/// damage outside every blob (header, trailer) is not seen by a restore at all.
fn check_pack_damage(f: &Fixture, l: &Layout, pack: &str, hit: &BTreeSet<BlobId>, truncated: bool, what: &str) {
    let run = f.restore_src();
    if hit.iter().any(|id| l.trees.contains(id)) {
        eprintln!("  a tree is damaged: the restore stops");
        f.assert_fatal(&run, pack, what);
        return;
    }
    let must_fail = l.files_needing(hit);
    eprintln!("  damaged blobs {}, needed by {must_fail:?}", hit.len());
    let in_pack = l.files_needing(&l.blobs_hit(pack, |_, _| true));
    let missing = check_restored(&f.src, &f.target());
    let errors = run.restore_errors();
    let failed: BTreeSet<PathBuf> = errors.keys().cloned().collect();
    run.no_panic();
    if must_fail.is_empty() && failed.is_empty() {
        // Only bytes no restore reads were damaged.
        assert_eq!(run.code, 0, "{what}: {run:#?}");
        assert!(missing.is_empty(), "{what}: missing {missing:?}");
        return;
    }
    assert_eq!(run.code, 1, "{what}: {run:#?}");
    assert!(failed.is_superset(&must_fail), "{what}: want {must_fail:?} to fail, failed {failed:?}");
    if truncated {
        // Blobs read together with a lost one may be lost with it, but only from this pack.
        assert!(failed.is_subset(&in_pack), "{what}: failed {failed:?}, only {in_pack:?} need {pack}");
    } else {
        assert_eq!(failed, must_fail, "{what}");
    }
    for (p, why) in &errors {
        assert!(why.contains(pack), "{what}: {} fails without naming {pack}: {why}", p.display());
    }
    assert_eq!(missing, failed, "{what}: exactly the failed files are missing");
    let last = run.stderr.lines().last().unwrap();
    assert_eq!(last, format!("cairn: {} entries could not be restored (listed above)", failed.len()), "{what}");
}

// ---------------------------------------------------------------------------------------------
// 1. Wrong password
// ---------------------------------------------------------------------------------------------

#[test]
fn wrong_password_is_one_line_exit_12() {
    let tmp = TempDir::new().unwrap();
    let repo = tmp.path().join("repo");
    init_repo(&repo);
    for args in [&["snapshots"][..], &["restore", "latest", "--target", "t"][..]] {
        let mut cmd = cairn_cmd(&repo);
        cmd.env("CAIRN_PASSWORD", "not the password").args(args);
        let run = run_cmd(cmd);
        let line = run.one_line_failure(12);
        assert!(line.contains("wrong password"), "{line}");
        assert!(line.contains(&repo.display().to_string()), "{line}");
        assert!(run.stdout.is_empty(), "{run:#?}");
    }
    assert!(!tmp.path().join("t").exists());
}

// ---------------------------------------------------------------------------------------------
// 2. Damaged repository files
// ---------------------------------------------------------------------------------------------

#[test]
fn damaged_pack_fails_only_what_needs_it() {
    let f = Fixture::damageable();
    let l = layout(f.repo(), &f.src);
    for pack in l.packs() {
        let file = f.repo().join(&pack);
        let len = fs::metadata(&file).unwrap().len() as usize;
        let mut cases: Vec<(String, usize)> =
            [0, 1, len / 2, len - 41, len - 1].into_iter().map(|p| (format!("flip byte {p}"), p)).collect();
        // Deterministic cases: the middle of one data blob of one file, and of one tree.
        for (name, id) in [
            ("sub/c.txt", l.files[Path::new("sub/c.txt")][0]),
            ("b.bin", *l.files[Path::new("b.bin")].last().unwrap()),
            ("tree", *l.trees.iter().next().unwrap()),
        ] {
            let (p, off, blen) = &l.location[&id];
            if *p == pack {
                cases.push((format!("flip inside a blob of {name}"), (off + blen / 2) as usize));
            }
        }
        for (what, pos) in cases {
            let hit = l.blobs_hit(&pack, |s, e| (s..e).contains(&(pos as u64)));
            f.with_damage(&file, &what, &|p| flip(p, pos), false, &mut |what, _| {
                check_pack_damage(&f, &l, &pack, &hit, false, what)
            });
        }
        for keep in [0, 1, len / 2, len - 1] {
            let hit = l.blobs_hit(&pack, |_, e| e > keep as u64);
            let what = format!("truncate to {keep} bytes");
            f.with_damage(&file, &what, &|p| truncate(p, keep), false, &mut |what, _| {
                check_pack_damage(&f, &l, &pack, &hit, true, what)
            });
        }
    }
}

#[test]
fn flipped_data_blob_fails_exactly_its_files() {
    let f = Fixture::damageable();
    let l = layout(f.repo(), &f.src);
    for victim in ["b.bin", "sub/c.txt", "sub/deep/d.bin"] {
        let ids = &l.files[Path::new(victim)];
        let (pack, off, len) = l.location[&ids[ids.len() / 2]].clone();
        let file = f.repo().join(&pack);
        let pos = (off + len / 2) as usize;
        f.with_damage(&file, victim, &|p| flip(p, pos), false, &mut |_, _| {
            let run = f.restore_src();
            run.no_panic();
            assert_eq!(run.code, 1, "{run:#?}");
            let errors = run.restore_errors();
            assert_eq!(errors.keys().collect::<Vec<_>>(), [Path::new(victim)], "{run:#?}");
            let why = &errors[Path::new(victim)];
            assert!(why.contains(&format!("{pack} is damaged")), "{why}");
            assert!(why.contains("failed authentication"), "{why}");
            let missing = check_restored(&f.src, &f.target());
            assert_eq!(missing, BTreeSet::from([PathBuf::from(victim)]));
        });
    }
}

/// Issue 16, edge case 6: a damaged pack under `dump` is reported as damage (naming the pack),
/// never as a failure to write to stdout.
#[test]
fn dump_of_a_damaged_file_reports_the_damage() {
    let f = Fixture::damageable();
    let l = layout(f.repo(), &f.src);
    let victim = "b.bin";
    let ids = &l.files[Path::new(victim)];
    let (pack, off, len) = l.location[&ids[ids.len() / 2]].clone();
    let file = f.repo().join(&pack);
    let pos = (off + len / 2) as usize;
    f.with_damage(&file, victim, &|p| flip(p, pos), false, &mut |_, _| {
        for spec in [format!("latest:{}", f.src.join(victim).display()), format!("latest:{}", f.src.display())] {
            let mut cmd = cairn_cmd(f.repo());
            cmd.arg("dump").arg(&spec);
            let run = run_cmd(cmd);
            let line = run.one_line_failure(1);
            assert!(line.contains(&format!("{pack} is damaged")), "{spec}: {line}");
            assert!(!line.contains("cannot write"), "damage reported as a write failure: {line}");
        }
    });
}

#[test]
fn deleted_pack_is_named() {
    let f = Fixture::damageable();
    let l = layout(f.repo(), &f.src);
    assert!(l.packs().len() > 1, "the fixture should span several packs");
    let mut saw = (false, false);
    for pack in l.packs() {
        let file = f.repo().join(&pack);
        let original = fs::read(&file).unwrap();
        fs::remove_file(&file).unwrap();
        let run = f.restore_src();
        let all = l.blobs_hit(&pack, |_, _| true);
        if all.iter().any(|id| l.trees.contains(id)) {
            // A tree is lost: the restore cannot even be planned.
            saw.0 = true;
            let line = run.one_line_failure(1);
            assert!(line.contains(&format!("{pack} does not exist")), "{line}");
            assert_eq!(check_restored(&f.src, &f.target()).len(), entries(&f.src).len());
        } else {
            // Only data is lost: exactly the files needing it fail, naming the pack.
            saw.1 = true;
            run.no_panic();
            assert_eq!(run.code, 1, "{run:#?}");
            let errors = run.restore_errors();
            let failed: BTreeSet<PathBuf> = errors.keys().cloned().collect();
            assert_eq!(failed, l.files_needing(&all), "{run:#?}");
            for why in errors.values() {
                assert!(why.contains(&format!("{pack} does not exist")), "{why}");
            }
            assert_eq!(check_restored(&f.src, &f.target()), failed);
        }
        fs::write(&file, original).unwrap();
        f.clear_target();
    }
    assert_eq!(saw, (true, true), "want packs with and without trees");
}

#[test]
fn damaged_index_is_named() {
    let f = Fixture::damageable();
    let file = only_file(f.repo(), "index");
    let len = fs::metadata(&file).unwrap().len() as usize;
    for (what, damage) in damages(len) {
        for rename in [false, true] {
            f.with_damage(&file, &what, &*damage, rename, &mut |what, damaged| {
                // Skipped with a warning naming it; the blobs it placed are found from the pack
                // headers, so the restore is whole (FORMAT.md §18).
                let name = repo_rel(f.repo(), damaged);
                let run = f.restore_src();
                let line = run.skipped(&name);
                // Renamed, it passes the name check and fails decryption or parsing instead.
                let why = if rename { "is damaged: " } else { "is damaged: content does not match its name" };
                assert!(line.contains(&format!("{name} {why}")), "{what}: {run:#?}");
                assert!(check_restored(&f.src, &f.target()).is_empty(), "{what}: the restore is not whole");
                cairn(f.repo(), &["ls", "latest"]).skipped(&name);
            });
        }
    }
    // A sealed file of another kind passed off as an index file.
    let snap = only_file(f.repo(), "snapshots");
    let fake = f.repo().join("index").join(PackId::hash_of(&fs::read(&snap).unwrap()).to_hex());
    fs::copy(&snap, &fake).unwrap();
    let run = f.restore_src();
    let line = run.skipped(&repo_rel(f.repo(), &fake));
    assert!(line.contains("where Index was expected"), "{line}");
    fs::remove_file(&fake).unwrap();
    f.restore_src().success();
}

#[test]
fn damaged_snapshot_is_named() {
    let f = Fixture::damageable();
    let file = only_file(f.repo(), "snapshots");
    assert_eq!(file.file_name().unwrap().to_str().unwrap(), f.snapshot);
    let len = fs::metadata(&file).unwrap().len() as usize;
    for (what, damage) in damages(len) {
        for rename in [false, true] {
            f.with_damage(&file, &what, &*damage, rename, &mut |what, damaged| {
                let name = repo_rel(f.repo(), damaged);
                // `latest` is chosen among the others (there are none here): the restore fails
                // saying so, beside a warning naming the skipped snapshot.
                let run = f.restore_src();
                assert_eq!(run.code, 1, "{what}: {run:#?}");
                assert!(
                    run.stderr.lines().any(|l| l.starts_with("warning: ") && l.contains(&name)),
                    "{what}: {run:#?}"
                );
                assert!(run.stderr.contains("cairn: the repository has no snapshots"), "{what}: {run:#?}");
                let line = cairn(f.repo(), &["snapshots"]).skipped(&name).to_string();
                assert!(line.contains(&format!("{name} is damaged")), "{what}: {line}");
                if !rename {
                    // The damaged snapshot asked for by its (old) ID prefix.
                    let run = restore(f.repo(), &f.snapshot[..8], &f.target());
                    let line = run.one_line_failure(1);
                    assert!(line.contains(&format!("{name} is damaged")), "{what}: {line}");
                }
            });
        }
    }
}

#[test]
fn damaged_snapshot_does_not_hide_other_snapshots() {
    let f = Fixture::damageable();
    let other_src = f.base.join("other");
    fs::create_dir(&other_src).unwrap();
    fs::write(other_src.join("x"), b"other snapshot\n").unwrap();
    let other = backup(f.repo(), &other_src);
    let file = f.repo().join("snapshots").join(&f.snapshot);
    flip(&file, 60);
    let target = f.base.join("other-target");
    let run = restore(f.repo(), &format!("{}:{}", &other[..12], other_src.display()), &target);
    run.success();
    assert_eq!(fs::read(target.join("x")).unwrap(), b"other snapshot\n");
}

#[test]
fn damaged_key_file_is_named() {
    let f = Fixture::damageable();
    let file = only_file(f.repo(), "keys");
    let len = fs::metadata(&file).unwrap().len() as usize;
    for (what, damage) in damages(len) {
        f.with_damage(&file, &what, &*damage, false, &mut |what, damaged| {
            // The start hint carries a copy of the key file, used under its name: the
            // repository opens from it, and the damaged file is named in a warning.
            let name = repo_rel(f.repo(), damaged);
            for args in [&["snapshots"][..], &["ls", "latest"][..]] {
                let run = cairn(f.repo(), args);
                let line = run.skipped(&name);
                assert!(
                    line.contains(&format!("{name} is damaged: content does not match its name")),
                    "{what}: {line}"
                );
            }
            f.restore_src().skipped(&name);
        });
    }
    // Damaged and renamed to match: no longer a key file at all.
    for keep in [0, 1, len / 2, len - 1] {
        let what = format!("truncate to {keep} bytes, renamed");
        f.with_damage(&file, &what, &|p| truncate(p, keep), true, &mut |what, damaged| {
            let name = repo_rel(f.repo(), damaged);
            let run = cairn(f.repo(), &["snapshots"]);
            let line = run.one_line_failure(1);
            assert!(line.contains(&format!("{name} is damaged: not a key file")), "{what}: {line}");
            f.assert_restore_fatal(&name, what);
        });
    }
}

#[test]
fn damaged_key_file_is_skipped_when_another_key_opens() {
    let f = Fixture::damageable();
    let damaged = only_file(f.repo(), "keys");
    {
        let repo = open_repo(f.repo());
        repo.add_key(
            PASSWORD.as_bytes(),
            library::keyfile::KdfParams { memory_kib: 1024, iterations: 1, parallelism: 1 },
        )
        .unwrap();
    }
    for pos in [0, 100] {
        flip(&damaged, pos);
        cairn(f.repo(), &["snapshots"]).success();
        let run = f.restore_src();
        run.success();
        assert!(check_restored(&f.src, &f.target()).is_empty());
        f.clear_target();
        flip(&damaged, pos);
    }
}

#[test]
fn damaged_config_is_named() {
    let f = Fixture::damageable();
    let file = f.repo().join("config");
    let len = fs::metadata(&file).unwrap().len() as usize;
    let mut cases = damages(len);
    for pos in [4, 5, 6, 8, 40, 41] {
        cases.push((format!("flip byte {pos}"), Box::new(move |p| flip(p, pos))));
    }
    for (what, damage) in cases {
        f.with_damage(&file, &what, &*damage, false, &mut |what, _| {
            for args in [&["snapshots"][..], &["ls", "latest"][..]] {
                let run = cairn(f.repo(), args);
                let line = run.one_line_failure(1);
                assert!(line.starts_with("cairn: config is damaged: "), "{what}: {line}");
            }
            f.assert_restore_fatal("config is damaged", what);
        });
    }
    // A snapshot (a valid sealed file of this repository) in place of the config.
    let snap = only_file(f.repo(), "snapshots");
    let what = "snapshot copied over config";
    f.with_damage(
        &file,
        what,
        &|p| {
            fs::copy(&snap, p).unwrap();
        },
        false,
        &mut |what, _| {
            let run = cairn(f.repo(), &["snapshots"]);
            let line = run.one_line_failure(1);
            assert!(line.contains("config is damaged"), "{what}: {line}");
            assert!(line.contains("where Config was expected"), "{what}: {line}");
        },
    );
    // Another repository's config: authentication fails.
    let other = f.base.join("other-repo");
    init_repo(&other);
    let what = "config of another repository";
    let foreign = other.join("config");
    f.with_damage(
        &file,
        what,
        &|p| {
            fs::copy(&foreign, p).unwrap();
        },
        false,
        &mut |what, _| {
            let line = cairn(f.repo(), &["snapshots"]).one_line_failure(1).to_string();
            assert!(line.contains("config is damaged: authentication failed"), "{what}: {line}");
        },
    );
    f.restore_src().success();
}

// ---------------------------------------------------------------------------------------------
// 3. Hostile repositories, built with the library
// ---------------------------------------------------------------------------------------------

/// A parent directory holding `repo`, an empty restore `target`, and an empty `sentinel`
/// directory next to it that a restore must never touch.
struct Hostile {
    fx: Fixture,
    repo_dir: PathBuf,
    target: PathBuf,
    sentinel: PathBuf,
    repo: Repository,
    /// Snapshot times, one second apart, so `latest` is always the one saved last.
    clock: std::cell::Cell<i64>,
}

impl Hostile {
    fn new() -> Self {
        let fx = Fixture::new().with_password(PASSWORD);
        let repo_dir = fx.repo().to_path_buf();
        let target = fx.path("target");
        let sentinel = fx.path("sentinel");
        init_repo(&repo_dir);
        fs::create_dir(&target).unwrap();
        fs::create_dir(&sentinel).unwrap();
        let repo = open_repo(&repo_dir);
        repo.load_index().unwrap();
        Hostile { repo_dir, target, sentinel, repo, fx, clock: std::cell::Cell::new(1_700_000_000) }
    }

    fn data(&self, bytes: &[u8]) -> BlobId {
        self.repo.write_pack(&[(BlobKind::Data, bytes.to_vec())], Codec::None).unwrap()[0]
    }

    fn file(&self, name: &[u8], content: &[u8]) -> Node {
        let mut n = Node::new(name.to_vec(), NodeKind::File);
        n.mode = 0o644;
        n.size = content.len() as u64;
        if !content.is_empty() {
            n.content = vec![Chunk::Data { id: self.data(content), len: content.len() as u32 }];
        }
        n
    }

    /// A tree blob holding `nodes` exactly as given (unsorted, duplicated, … if so given).
    fn tree(&self, nodes: Vec<Node>) -> BlobId {
        let bytes = Tree { nodes }.to_bytes();
        self.repo.write_pack(&[(BlobKind::Tree, bytes)], Codec::None).unwrap()[0]
    }

    fn dir(&self, name: &[u8], nodes: Vec<Node>) -> Node {
        let mut n = Node::new(name.to_vec(), NodeKind::Dir);
        n.mode = 0o755;
        n.subtree = Some(self.tree(nodes));
        n
    }

    fn symlink(&self, name: &[u8], target: &[u8]) -> Node {
        let mut n = Node::new(name.to_vec(), NodeKind::Symlink);
        n.mode = 0o777;
        n.target = target.to_vec();
        n.size = target.len() as u64;
        n
    }

    /// Saves a snapshot whose root tree holds `nodes`; returns the snapshot and root tree.
    fn snapshot(&self, nodes: Vec<Node>) -> (SnapshotId, BlobId) {
        let tree = self.tree(nodes);
        self.clock.set(self.clock.get() + 1);
        let snap = Snapshot {
            time: Timestamp { secs: self.clock.get(), nanos: 0 },
            tree,
            paths: vec!["/".into()],
            hostname: "hostile".into(),
            username: "mallory".into(),
            uid: 0,
            gid: 0,
            tags: Vec::new(),
            parent: None,
            program_version: "evil 1.0".into(),
            summary: Summary::default(),
            original: None,
        };
        (self.repo.save_snapshot(&snap).unwrap(), tree)
    }

    fn restore(&self, spec: &str) -> Run {
        restore(&self.repo_dir, spec, &self.target)
    }

    /// Asserts that nothing exists next to the target but what the test made, and that the
    /// sentinel directory is still empty.
    fn assert_nothing_outside(&self, extra: &[&str]) {
        let mut names: Vec<String> = fs::read_dir(&self.fx.base)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut want: Vec<String> = ["repo", "sentinel", "target"].iter().chain(extra).map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(names, want, "something was written next to the target");
        let inside: Vec<_> = fs::read_dir(&self.sentinel).unwrap().collect();
        assert!(inside.is_empty(), "the sentinel directory was written: {inside:?}");
    }
}

/// Restores a snapshot whose tree breaks a rule: one line naming the tree, exit 1, nothing
/// written outside the target.
fn assert_invalid_tree(h: &Hostile, bad_tree: BlobId, why: &str, what: &str) {
    let run = h.restore("latest");
    let line = run.one_line_failure(1);
    assert!(
        line.contains(&format!("tree {} is invalid", bad_tree.short())),
        "{what}: error does not name tree {}: {line}",
        bad_tree.short()
    );
    assert!(line.contains(why), "{what}: {line}");
    h.assert_nothing_outside(&[]);
    assert!(entries(&h.target).is_empty(), "{what}: wrote into the target");
}

#[test]
fn hostile_unsafe_names_are_rejected() {
    let h = Hostile::new();
    let sentinel_abs = format!("{}/pwned", h.sentinel.display());
    let names: Vec<(&[u8], &str)> = vec![
        (b"..", "unsafe entry name \"..\""),
        (b".", "unsafe entry name \".\""),
        (b"", "unsafe entry name \"\""),
        (b"a/b", "contains '/' or NUL"),
        (b"../sentinel/pwned", "contains '/' or NUL"),
        // An absolute name (the brief's "/etc/x"), aimed at the sentinel so that a broken
        // check cannot touch the system.
        (sentinel_abs.as_bytes(), "contains '/' or NUL"),
        (b"x\0y", "contains '/' or NUL"),
    ];
    for (name, why) in names {
        let what = String::from_utf8_lossy(name).into_owned();
        // As a file that would land in the sentinel, and as a directory leading into it.
        let as_file = h.file(name, b"escaped!\n");
        let inner = h.dir(b"sentinel", vec![h.file(b"pwned", b"escaped!\n")]);
        let as_dir = h.dir(name, vec![inner]);
        for (kind, node) in [("file", as_file), ("dir", as_dir)] {
            // At the root, and one level down.
            let bad = h.tree(vec![node.clone()]);
            let mut top = Node::new(b"d".to_vec(), NodeKind::Dir);
            top.mode = 0o755;
            top.subtree = Some(bad);
            let (_, root) = h.snapshot(vec![node]);
            assert_invalid_tree(&h, root, why, &format!("{what:?} as {kind} at the root"));
            h.snapshot(vec![top]);
            assert_invalid_tree(&h, bad, why, &format!("{what:?} as {kind} below d"));
        }
    }
}

#[test]
fn hostile_duplicate_and_unsorted_names_are_rejected() {
    let h = Hostile::new();
    let (_, root) = h.snapshot(vec![h.file(b"dup", b"one\n"), h.file(b"dup", b"two\n")]);
    assert_invalid_tree(&h, root, "entry \"dup\" is duplicated or out of order", "dup files");
    let (_, root) = h.snapshot(vec![h.file(b"b", b"one\n"), h.file(b"a", b"two\n")]);
    assert_invalid_tree(&h, root, "entry \"a\" is duplicated or out of order", "unsorted");
    // A file and a directory of the same name.
    let (_, root) = h.snapshot(vec![h.dir(b"x", vec![h.file(b"f", b"in dir\n")]), h.file(b"x", b"file\n")]);
    assert_invalid_tree(&h, root, "entry \"x\" is duplicated", "dir then file");
}

#[test]
fn hostile_symlink_then_directory_of_same_name_is_rejected() {
    let h = Hostile::new();
    for link_target in [h.sentinel.to_str().unwrap().as_bytes(), b"..", b"../sentinel"] {
        let (_, root) = h.snapshot(vec![
            h.symlink(b"evil", link_target),
            h.dir(b"evil", vec![h.file(b"pwned", b"through the link\n")]),
        ]);
        assert_invalid_tree(&h, root, "entry \"evil\" is duplicated", "symlink, dir");
    }
}

#[test]
fn hostile_symlink_is_never_followed_by_a_restore_path() {
    let h = Hostile::new();
    h.snapshot(vec![
        h.symlink(b"evil", h.sentinel.to_str().unwrap().as_bytes()),
        h.dir(b"ok", vec![h.file(b"f", b"fine\n")]),
    ]);
    // `latest:/evil/...` names a path through a symlink: not found, nothing written.
    let run = h.restore("latest:/evil/pwned");
    let line = run.one_line_failure(1);
    assert!(line.contains("\"/evil/pwned\" not found"), "{line}");
    h.assert_nothing_outside(&[]);
    // The whole snapshot restores the link as a link, and never writes through it.
    h.restore("latest").success();
    assert_eq!(fs::read_link(h.target.join("evil")).unwrap(), h.sentinel);
    assert_eq!(fs::read_to_string(h.target.join("ok/f")).unwrap(), "fine\n");
    h.assert_nothing_outside(&[]);
}

#[test]
fn preexisting_symlink_in_target_is_not_written_through() {
    let h = Hostile::new();
    h.snapshot(vec![h.dir(
        b"evil",
        vec![h.dir(b"deeper", vec![h.file(b"g", b"deeper\n")]), h.file(b"pwned", b"must land inside the target\n")],
    )]);
    std::os::unix::fs::symlink(&h.sentinel, h.target.join("evil")).unwrap();
    let run = h.restore("latest");
    run.success();
    h.assert_nothing_outside(&[]);
    let md = fs::symlink_metadata(h.target.join("evil")).unwrap();
    assert!(md.is_dir(), "evil is still a symlink");
    assert_eq!(fs::read_to_string(h.target.join("evil/pwned")).unwrap(), "must land inside the target\n");
    assert_eq!(fs::read_to_string(h.target.join("evil/deeper/g")).unwrap(), "deeper\n");
}

#[test]
fn preexisting_symlink_over_same_named_files_is_replaced() {
    // As above, but the directory the symlink points to already holds files of the same
    // names: one with the snapshot's content, one with other content. The restore must
    // replace the symlink with a real directory holding both files, and leave them alone.
    let h = Hostile::new();
    let outside = h.fx.base.join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("same"), b"same content\n").unwrap();
    fs::write(outside.join("other"), b"outside content\n").unwrap();
    h.snapshot(vec![h.dir(b"evil", vec![h.file(b"other", b"snapshot content\n"), h.file(b"same", b"same content\n")])]);
    std::os::unix::fs::symlink(&outside, h.target.join("evil")).unwrap();
    let run = h.restore("latest");
    run.success();
    assert!(run.stderr.is_empty(), "{run:#?}");
    assert!(fs::symlink_metadata(h.target.join("evil")).unwrap().is_dir());
    assert_eq!(fs::read_to_string(h.target.join("evil/other")).unwrap(), "snapshot content\n");
    assert_eq!(fs::read_to_string(h.target.join("evil/same")).unwrap(), "same content\n");
    assert_eq!(fs::read_to_string(outside.join("same")).unwrap(), "same content\n");
    assert_eq!(fs::read_to_string(outside.join("other")).unwrap(), "outside content\n");
    h.assert_nothing_outside(&["outside"]);
}

#[test]
fn preexisting_file_links_in_target_are_not_written_through() {
    // The target already holds `soft`, a symlink to a file outside it, and `hard`, a hard
    // link of another outside file (mode 0600). Restoring must replace both entries, and
    // change neither outside file: not its content, not its mode, not its link count.
    let h = Hostile::new();
    let outside = h.fx.base.join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("victim1"), b"original 1\n").unwrap();
    fs::write(outside.join("victim2"), b"original 2\n").unwrap();
    fs::set_permissions(outside.join("victim2"), fs::Permissions::from_mode(0o600)).unwrap();
    h.snapshot(vec![h.file(b"hard", b"new content for hard\n"), h.file(b"soft", b"new content for soft\n")]);
    std::os::unix::fs::symlink(outside.join("victim1"), h.target.join("soft")).unwrap();
    fs::hard_link(outside.join("victim2"), h.target.join("hard")).unwrap();
    h.restore("latest").success();
    assert_eq!(
        fs::read_to_string(outside.join("victim1")).unwrap(),
        "original 1\n",
        "the restore wrote through a symlink to a file outside the target"
    );
    assert_eq!(
        fs::read_to_string(outside.join("victim2")).unwrap(),
        "original 2\n",
        "the restore wrote through a hard link into a file outside the target"
    );
    let md = fs::metadata(outside.join("victim2")).unwrap();
    assert_eq!(md.mode() & 0o7777, 0o600, "outside file's mode changed");
    assert_eq!(md.nlink(), 1, "target/hard is still a link of the outside file");
    assert!(fs::symlink_metadata(h.target.join("soft")).unwrap().is_file());
    assert_eq!(fs::read_to_string(h.target.join("soft")).unwrap(), "new content for soft\n");
    assert_eq!(fs::read_to_string(h.target.join("hard")).unwrap(), "new content for hard\n");
    h.assert_nothing_outside(&["outside"]);
}

#[test]
fn hostile_missing_blob_fails_only_its_file() {
    let h = Hostile::new();
    let mut ghost = Node::new(b"ghost".to_vec(), NodeKind::File);
    ghost.mode = 0o644;
    ghost.size = 10;
    let missing = BlobId([0xab; 32]);
    ghost.content = vec![Chunk::Data { id: missing, len: 10 }];
    h.snapshot(vec![ghost, h.file(b"real", b"real content\n")]);
    let run = h.restore("latest");
    run.no_panic();
    assert_eq!(run.code, 1, "{run:#?}");
    let errors = run.restore_errors();
    assert_eq!(errors.keys().collect::<Vec<_>>(), [Path::new("ghost")], "{run:#?}");
    assert!(errors[Path::new("ghost")].contains(&missing.short()), "{run:#?}");
    assert!(!h.target.join("ghost").exists());
    assert_eq!(fs::read_to_string(h.target.join("real")).unwrap(), "real content\n");
    h.assert_nothing_outside(&[]);
}

#[test]
fn hostile_chunk_length_disagreeing_with_blob_is_not_restored() {
    // A chunk's recorded length must be its blob's length. `long` says 5 bytes but its blob
    // holds 100; `short` says 100 but its blob holds 5. Neither file can be restored as
    // recorded, so neither may be left behind with some other content.
    let h = Hostile::new();
    let mut long = Node::new(b"long".to_vec(), NodeKind::File);
    long.mode = 0o644;
    long.size = 5;
    long.content = vec![Chunk::Data { id: h.data(&[b'L'; 100]), len: 5 }];
    let mut short = Node::new(b"short".to_vec(), NodeKind::File);
    short.mode = 0o644;
    short.size = 100;
    short.content = vec![Chunk::Data { id: h.data(&[b'S'; 5]), len: 100 }];
    h.snapshot(vec![long, h.file(b"real", b"real content\n"), short]);
    let run = h.restore("latest");
    run.no_panic();
    assert_eq!(run.code, 1, "{run:#?}");
    let failed: Vec<PathBuf> = run.restore_errors().into_keys().collect();
    assert_eq!(failed, [Path::new("long"), Path::new("short")], "{run:#?}");
    for name in ["long", "short"] {
        let got = fs::read(h.target.join(name));
        assert!(
            got.is_err(),
            "{name} restored with {} bytes: {:?}",
            got.as_ref().unwrap().len(),
            String::from_utf8_lossy(&got.unwrap())
        );
    }
    assert_eq!(fs::read_to_string(h.target.join("real")).unwrap(), "real content\n");
    h.assert_nothing_outside(&[]);
}

#[test]
fn hostile_deep_nesting_fails_without_crashing() {
    // 20,000 directories, each the only entry of its parent (a few hundred KiB of trees),
    // and the deepest one's subtree is in no index: the restore must fail with one line, not
    // overflow its stack on the way down.
    let h = Hostile::new();
    let lost = BlobId([0xcd; 32]);
    let mut blobs = Vec::new();
    let mut below = lost;
    for _ in 0..20_000 {
        let mut d = Node::new(b"d".to_vec(), NodeKind::Dir);
        d.mode = 0o755;
        d.subtree = Some(below);
        let bytes = Tree { nodes: vec![d] }.to_bytes();
        below = h.repo.key().blob_id(&bytes);
        blobs.push((BlobKind::Tree, bytes));
    }
    h.repo.write_pack(&blobs, Codec::None).unwrap();
    let mut top = Node::new(b"d".to_vec(), NodeKind::Dir);
    top.mode = 0o755;
    top.subtree = Some(below);
    h.snapshot(vec![top]);
    let run = h.restore("latest");
    assert!(!run.stderr.contains("overflowed its stack"), "stack overflow: {}", run.stderr);
    run.one_line_failure(1);
    h.assert_nothing_outside(&[]);
}

// ---------------------------------------------------------------------------------------------
// 4. Unreadable sources
// ---------------------------------------------------------------------------------------------

#[test]
fn backup_of_missing_path_is_one_line_exit_1() {
    let tmp = TempDir::new().unwrap();
    let repo = tmp.path().join("repo");
    init_repo(&repo);
    let file = tmp.path().join("file");
    fs::write(&file, b"x").unwrap();
    for (path, why) in
        [(tmp.path().join("no such path"), "No such file or directory"), (file.join("below a file"), "Not a directory")]
    {
        let mut cmd = cairn_cmd(&repo);
        cmd.arg("backup").arg(tmp.path()).arg(&path);
        let run = run_cmd(cmd);
        let line = run.one_line_failure(1);
        assert!(line.contains(&path.display().to_string()), "{line}");
        assert!(line.contains(why), "{line}");
    }
    // Nothing was stored.
    let run = cairn(&repo, &["snapshots"]);
    run.success();
    assert!(run.stdout.contains("0 snapshots"), "{run:#?}");
    assert!(entries(&repo.join("data")).is_empty());
    assert!(entries(&repo.join("index")).is_empty());
}

/// A sysfs attribute without a read method: open(O_RDONLY) fails with EACCES even for root,
/// which makes it the one deterministic unreadable file available to a root test.
fn unreadable_file() -> PathBuf {
    for p in ["/sys/bus/platform/drivers_probe", "/sys/bus/platform/uevent", "/sys/bus/pci/rescan"] {
        let p = PathBuf::from(p);
        if p.exists() && fs::File::open(&p).is_err() {
            return p;
        }
    }
    panic!("no write-only sysfs attribute found: this test needs Linux with /sys mounted");
}

#[test]
fn unreadable_source_file_warns_and_exits_3() {
    let tmp = TempDir::new().unwrap();
    let repo = tmp.path().join("repo");
    let src = tmp.path().join("src");
    init_repo(&repo);
    make_source(&src);
    let bad = unreadable_file();
    let mut cmd = cairn_cmd(&repo);
    cmd.arg("backup").arg(&src).arg(&bad);
    let run = run_cmd(cmd);
    run.no_panic();
    assert_eq!(run.code, 3, "{run:#?}");
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(
        lines,
        [
            format!("warning: {}: cannot open: Permission denied (os error 13); not backed up", bad.display()),
            "warning: 1 entries could not be read completely (listed above)".to_string(),
        ],
        "{run:#?}"
    );
    // Everything readable was stored and restores exactly.
    let target = tmp.path().join("target");
    restore_src(&repo, &src, &target).success();
    assert!(check_restored(&src, &target).is_empty());
}

#[test]
fn unreadable_source_file_is_not_restored_as_empty() {
    // The backup says "the snapshot lacks them": an unreadable file must not come back from
    // a restore as an empty file, as though that were its content. (Whether the snapshot
    // leaves the entry out, as the message says, or keeps it marked so that restoring it
    // fails, no restored file may stand in for it.)
    let tmp = TempDir::new().unwrap();
    let repo = tmp.path().join("repo");
    init_repo(&repo);
    let bad = unreadable_file();
    let mut cmd = cairn_cmd(&repo);
    cmd.arg("backup").arg(&bad);
    assert_eq!(run_cmd(cmd).code, 3);
    let target = tmp.path().join("target");
    let run = restore(&repo, "latest", &target);
    run.no_panic();
    let restored = target.join(bad.strip_prefix("/").unwrap());
    assert!(
        !restored.exists(),
        "restored {} ({} bytes) from a file that could not be read; {run:#?}",
        restored.display(),
        fs::metadata(&restored).map(|m| m.len()).unwrap_or(0)
    );
}

/// A readable sysfs attribute: stat says 4096 bytes, reading yields a few. The one
/// deterministic stand-in for a file that changes size while it is backed up.
fn short_read_file() -> PathBuf {
    for p in [
        "/sys/bus/platform/drivers_autoprobe",
        "/sys/bus/pci/drivers_autoprobe",
        "/sys/kernel/mm/transparent_hugepage/enabled",
    ] {
        let p = PathBuf::from(p);
        if let (Ok(md), Ok(data)) = (fs::metadata(&p), fs::read(&p)) {
            if md.len() != data.len() as u64 && !data.is_empty() {
                return p;
            }
        }
    }
    panic!("no readable sysfs attribute found: this test needs Linux with /sys mounted");
}

#[test]
fn source_file_shorter_than_its_size_is_stored_as_read() {
    // A file whose content ends before its stat size: what the backup would see if the file
    // were truncated while it was read. It is reported (exit 3) and stored as it was read.
    let tmp = TempDir::new().unwrap();
    let repo = tmp.path().join("repo");
    init_repo(&repo);
    let file = short_read_file();
    let content = fs::read(&file).unwrap();
    let mut cmd = cairn_cmd(&repo);
    cmd.arg("backup").arg(&file);
    let run = run_cmd(cmd);
    run.no_panic();
    assert_eq!(run.code, 3, "{run:#?}");
    let first = run.stderr.lines().next().unwrap();
    let prefix = format!(
        "warning: {}: changed while it was read: its size was 4096 bytes, {} bytes were read, its size is now ",
        file.display(),
        content.len()
    );
    assert!(first.starts_with(&prefix), "{run:#?}");
    assert!(first.ends_with("; stored as read"), "{run:#?}");
    let target = tmp.path().join("target");
    restore(&repo, &format!("latest:{}", file.display()), &target).success();
    let name = file.file_name().unwrap();
    assert_eq!(fs::read(target.join(name)).unwrap(), content);
}

// A file vanishing between listing and reading cannot be produced deterministically (it needs
// a race with the walker), so it has no test here; the short read above covers the "changed
// while read" path.

// ---------------------------------------------------------------------------------------------
// 5. Names that do not exist
// ---------------------------------------------------------------------------------------------

#[test]
fn restore_of_unknown_snapshot_is_one_line_exit_1() {
    let f = Fixture::damageable();
    // A prefix no snapshot ID starts with.
    let first = f.snapshot.as_bytes()[0];
    let other = if first == b'0' { "1" } else { "0" };
    let prefix = format!("{other}{}", &f.snapshot[1..6]);
    for spec in [prefix.as_str(), "zzzz", "latestx"] {
        let run = restore(f.repo(), spec, &f.target());
        let line = run.one_line_failure(1);
        assert!(line.contains(&format!("no snapshot matches {spec:?}")), "{line}");
        assert!(!f.target().exists(), "target created for {spec}");
    }
    let run = restore(f.repo(), &format!("{prefix}:/x"), &f.target());
    assert!(run.one_line_failure(1).contains(&prefix));
    // With no snapshots at all, `latest` says so.
    let tmp = TempDir::new().unwrap();
    init_repo(tmp.path());
    let run = restore(tmp.path(), "latest", &f.target());
    assert!(run.one_line_failure(1).contains("no snapshots"), "{run:#?}");
}

#[test]
fn restore_of_missing_path_is_one_line_exit_1() {
    let f = Fixture::damageable();
    let inside = format!("{}/sub/no such file", f.src.display());
    let through_file = format!("{}/a.txt/below", f.src.display());
    for path in ["/no/such/path", inside.as_str(), through_file.as_str()] {
        let run = restore(f.repo(), &format!("latest:{path}"), &f.target());
        let line = run.one_line_failure(1);
        assert!(line.contains(&format!("path {path:?} not found")), "{line}");
        assert!(entries(&f.target()).is_empty());
    }
}

#[test]
fn restore_into_a_file_is_one_line_exit_1() {
    let f = Fixture::damageable();
    fs::write(f.target(), b"not a directory\n").unwrap();
    let run = f.restore_src();
    let line = run.one_line_failure(1);
    assert!(line.contains(&f.target().display().to_string()), "{line}");
    assert!(line.contains("cannot create restore target"), "{line}");
    assert_eq!(fs::read_to_string(f.target()).unwrap(), "not a directory\n");
}

#[test]
fn missing_path_error_names_the_snapshot() {
    let f = Fixture::damageable();
    let run = restore(f.repo(), "latest:/no/such/path", &f.target());
    let line = run.one_line_failure(1);
    assert!(
        line.contains(&format!("not found in snapshot {}", &f.snapshot[..8])),
        "error does not name snapshot {}: {line}",
        &f.snapshot[..8]
    );
}

#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let f = Fixture::damageable();
    // `cairn ls | head -0`: the reader is gone before cairn prints anything (opening the
    // repository takes far longer than closing a pipe); cairn must stop without a panic
    // message, by SIGPIPE, as `ls` or `cat` would.
    let mut cmd = cairn_cmd(f.repo());
    cmd.args(["ls", "latest"]).stdout(Stdio::piped()).stderr(Stdio::piped());
    let shown = format!("{cmd:?}");
    let mut child = cmd.spawn().expect("spawn cairn ls");
    drop(child.stdout.take());
    let out = support::wait_within_timeout(child, &shown);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{stderr}");
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "ls into a closed pipe: {:?}, {stderr}", out.status);
}

// ---------------------------------------------------------------------------------------------
// Locations that hold no repository, or only part of one
// ---------------------------------------------------------------------------------------------

/// A command pointed at a location with no repository says so in one line and leaves no trace
/// there: no directories made, no `.tmp/` (issue 16, 3).
#[test]
fn a_location_without_a_repository_is_left_untouched() {
    let tmp = TempDir::new().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("f"), b"f\n").unwrap();
    let typo = tmp.path().join("typo/nested/repo");
    let empty = tmp.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let target = tmp.path().join("target");
    let src_arg = src.to_str().unwrap();
    let target_arg = target.to_str().unwrap();
    for repo in [&typo, &empty] {
        for args in [
            &["snapshots"][..],
            &["backup", src_arg][..],
            &["ls", "latest"][..],
            &["restore", "latest", "--target", target_arg][..],
            &["dump", "latest:/f"][..],
            &["key", "list"][..],
        ] {
            let run = cairn(repo, args);
            let line = run.one_line_failure(10);
            assert!(line.contains("no repository at"), "{args:?}: {line}");
            assert!(!tmp.path().join("typo").exists(), "{args:?} on {} made directories", repo.display());
            let left: Vec<_> = fs::read_dir(&empty).unwrap().map(|e| e.unwrap().file_name()).collect();
            assert!(left.is_empty(), "{args:?} on an empty directory left {left:?}");
            assert!(!target.exists(), "{args:?} made the restore target");
        }
    }
}

/// `init` refuses a location that holds repository objects but lost its config, says which,
/// writes nothing, and points to recovery rather than to another `init` (issue 16, 4).
#[test]
fn init_refuses_a_location_holding_repository_objects() {
    let f = Fixture::damageable();
    fs::remove_file(f.repo().join("config")).unwrap();
    let before: Vec<PathBuf> = entries(f.repo()).into_keys().collect();
    let count = |dir: &str, one: &str, many: &str| match entries(&f.repo().join(dir))
        .values()
        .filter(|m| m.is_file())
        .count()
    {
        1 => format!("1 {one}"),
        n => format!("{n} {many}"),
    };
    let (indexes, packs) = (count("index", "index file", "index files"), count("data", "pack", "packs"));
    let mut args = vec!["init", "--kdf-memory", "1024", "--kdf-iterations", "1"];
    let run = cairn(f.repo(), &args);
    let line = run.one_line_failure(1);
    let shown = f.repo().display().to_string();
    for want in [
        &format!("{shown} already holds repository objects") as &str,
        "1 key file",
        &indexes,
        "1 snapshot",
        &packs,
        "not initializing over them",
        "config",
    ] {
        assert!(line.contains(want), "the error does not say {want:?}: {line}");
    }
    assert!(!line.contains("cairn init"), "the error suggests another init: {line}");
    assert_eq!(entries(f.repo()).into_keys().collect::<Vec<_>>(), before, "init wrote something");

    // Any one kind of object is enough.
    for dir in ["keys", "index", "snapshots", "data", "locks"] {
        let other = f.base.join(format!("only-{dir}"));
        fs::create_dir_all(other.join(dir).join("ab")).unwrap();
        fs::write(other.join(dir).join("ab/abcdef"), b"an object").unwrap();
        let before: Vec<PathBuf> = entries(&other).into_keys().collect();
        let run = cairn(&other, &args);
        let line = run.one_line_failure(1);
        assert!(line.contains("already holds repository objects"), "{dir}: {line}");
        assert_eq!(entries(&other).into_keys().collect::<Vec<_>>(), before, "{dir}: init wrote something");
    }
    // An empty directory, or one with other files only, is fine.
    let other = f.base.join("unrelated");
    fs::create_dir(&other).unwrap();
    fs::write(other.join("README"), b"not a repository object").unwrap();
    args.push("--pack-size");
    args.push("1");
    cairn(&other, &args).success();
}

/// When no key file opens and one is damaged, the message says both: the password may be
/// what is wrong, and a key file is damaged (issue 16, 7).
#[test]
fn wrong_password_and_a_damaged_key_file_are_both_reported() {
    let f = Fixture::damageable();
    let first = only_file(f.repo(), "keys");
    open_repo(f.repo())
        .add_key(b"another password", library::keyfile::KdfParams { memory_kib: 1024, iterations: 1, parallelism: 1 })
        .unwrap();
    flip(&first, 100);
    // Without the start hint, which carries a copy of the damaged key file.
    fs::remove_file(f.repo().join("hint")).unwrap();
    let name = repo_rel(f.repo(), &first);
    for password in [PASSWORD, "not the password"] {
        let mut cmd = cairn_cmd(f.repo());
        cmd.env("CAIRN_PASSWORD", password).arg("snapshots");
        let run = run_cmd(cmd);
        let line = run.one_line_failure(12);
        assert!(line.contains(&format!("wrong password for {}", f.repo().display())), "{password}: {line}");
        assert!(line.contains(&format!("key file {name} is damaged")), "{password}: {line}");
        assert!(line.contains("content does not match its name"), "{password}: {line}");
    }
    // The intact key still opens the repository with its own password.
    let mut cmd = cairn_cmd(f.repo());
    cmd.env("CAIRN_PASSWORD", "another password").arg("snapshots");
    run_cmd(cmd).success();
}
