//! `cairn check` and `cairn repair` end to end (issue 13, /work/check-spec.md): real repositories
//! made by the real binary from real files, damaged the ways a user meets damage — an index file
//! deleted or flipped, a pack deleted, truncated or with a flipped byte inside one blob, a
//! snapshot file damaged, a stray pack that no index lists — and then checked and repaired.
//!
//! What the tests expect is computed independently of `check`: before any damage, the library
//! reads every pack header, every index file and every snapshot's trees ([`Layout`]), so each
//! test knows exactly which packs, blobs, snapshots and paths a damage touches, and which bytes a
//! repaired file must keep.

use crate::support;
use crate::support::library;
use crate::support::servers;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::library::compress::Codec;
use crate::support::library::id::BlobId;
use crate::support::library::keyfile::KdfParams;
use crate::support::library::pack::{read_header, BlobEntry, BlobKind};
use crate::support::library::sealed::{self, SealedKind};
use crate::support::library::tree::{Chunk, NodeKind};
use serde_json::Value;
use support::{assert_same, last_json, restored_path, scan, scan_source, Cairn, Fixture, Rng, Scan, PASSWORD};

/// Small chunks and 1 MiB packs: a few MiB make several packs and many blobs.
const INIT: [&str; 4] = ["--chunk-sizes", "65536,131072,524288", "--pack-size", "1"];

const MIB: u64 = 1 << 20;

// ---------------------------------------------------------------------------------------------
// Fixtures

impl Fixture {
    /// A new repository (1 MiB packs, small chunks, a cache of its own) and an empty source
    /// directory.
    fn for_check() -> Fixture {
        let fx = Fixture::new().isolated_cache().init(&INIT);
        fs::create_dir_all(&fx.src).unwrap();
        fx
    }

    /// A repository holding one backup of a few small files and one file of `big` bytes.
    fn for_check_with_backup(big: usize) -> (Fixture, Scan) {
        let fx = Fixture::for_check();
        let before = make_files(&fx.src, 1, big);
        fx.cairn.backup(&[&fx.src], &[]);
        (fx, before)
    }
}

/// A few small files (one empty), a nested directory and one file of `big` random bytes
/// (`big`) under `root`; returns the scan of `root`.
fn make_files(root: &Path, seed: u64, big: usize) -> Scan {
    let mut rng = Rng(seed);
    fs::create_dir_all(root.join("docs/deep")).unwrap();
    for (i, size) in [0usize, 1, 4000, 70_000].into_iter().enumerate() {
        fs::write(root.join(format!("docs/small-{i}")), rng.bytes(size)).unwrap();
    }
    fs::write(root.join("docs/deep/note"), format!("a note {seed}")).unwrap();
    fs::write(root.join("big"), rng.bytes(big)).unwrap();
    scan_source(root)
}

/// `scan` without the entry `rel` (a file that a repair cut).
fn without(scan: &Scan, rel: &str) -> Scan {
    let mut s = scan.clone();
    s.remove(Path::new(rel)).unwrap_or_else(|| panic!("{rel} is not in the scan"));
    s
}

/// Asserts that the restored file `restored` is exactly the first `len` bytes of `source`.
fn assert_prefix(source: &Path, restored: &Path, len: u64) {
    let want = fs::read(source).unwrap();
    let got = fs::read(restored).unwrap_or_else(|e| panic!("{}: {e}", restored.display()));
    assert!(len < want.len() as u64, "the expected cut {len} is not shorter than the file ({})", want.len());
    assert_eq!(
        got.len() as u64,
        len,
        "{}: the repaired file is not cut where its first lost chunk starts",
        restored.display()
    );
    assert!(got[..] == want[..len as usize], "{}: the repaired file is not a prefix of the source", restored.display());
}

// ---------------------------------------------------------------------------------------------
// What the repository holds, read with the library before anything is damaged

/// One pack file.
#[derive(Clone, Debug)]
struct PackInfo {
    size: u64,
    entries: Vec<BlobEntry>,
}

/// One snapshot and every file and tree it needs.
#[derive(Clone, Debug)]
struct SnapInfo {
    /// Full hex ID.
    id: String,
    /// The 8-hex short ID.
    short: String,
    /// File path (absolute in the snapshot) → its chunks in order.
    files: BTreeMap<String, Vec<Chunk>>,
    /// Tree blob → the directories it is the listing of.
    trees: BTreeMap<BlobId, BTreeSet<String>>,
}

impl SnapInfo {
    /// Every blob (data and tree) the snapshot needs.
    fn blobs(&self) -> BTreeSet<BlobId> {
        let mut out: BTreeSet<BlobId> = self.trees.keys().copied().collect();
        for chunks in self.files.values() {
            out.extend(chunks.iter().filter_map(data_id));
        }
        out
    }

    /// The paths whose data depends on any of `blobs`: files with such a chunk and directories
    /// whose tree is one.
    fn paths_needing(&self, blobs: &BTreeSet<BlobId>) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for (path, chunks) in &self.files {
            if chunks.iter().filter_map(data_id).any(|id| blobs.contains(&id)) {
                out.insert(path.clone());
            }
        }
        for (id, dirs) in &self.trees {
            if blobs.contains(id) {
                out.extend(dirs.iter().cloned());
            }
        }
        out
    }
}

fn data_id(c: &Chunk) -> Option<BlobId> {
    match *c {
        Chunk::Data { id, .. } => Some(id),
        Chunk::Zero { .. } => None,
    }
}

/// The whole repository as the library reads it.
#[derive(Clone, Debug)]
struct Layout {
    /// `data/xx/<hex>` → size and header entries.
    packs: BTreeMap<String, PackInfo>,
    /// `index/<hex>` → the packs it lists (`data/xx/<hex>`).
    indexes: BTreeMap<String, Vec<String>>,
    /// Oldest first.
    snapshots: Vec<SnapInfo>,
}

impl Layout {
    /// Reads pack headers, index files and every snapshot's trees of the (intact) repository.
    fn of(cairn: &Cairn) -> Layout {
        let (repo, storage) = cairn.open();
        let mut packs = BTreeMap::new();
        for obj in storage.list("data").unwrap() {
            let bytes = storage.read(&obj.path).unwrap();
            let (_, entries) = read_header(repo.key(), &obj.path, &bytes).unwrap();
            packs.insert(obj.path.clone(), PackInfo { size: bytes.len() as u64, entries });
        }
        let mut indexes = BTreeMap::new();
        for obj in storage.list("index").unwrap() {
            let body =
                sealed::open(repo.key(), SealedKind::Index, &obj.path, &storage.read(&obj.path).unwrap()).unwrap();
            let listed = library::index::decode(&obj.path, &body).unwrap();
            indexes.insert(obj.path.clone(), listed.iter().map(|p| pack_path(&p.id.to_hex())).collect());
        }
        repo.load_index().unwrap();
        let mut snapshots = Vec::new();
        for (id, snap) in repo.snapshots().unwrap() {
            let mut info =
                SnapInfo { id: id.to_hex(), short: id.short(), files: BTreeMap::new(), trees: BTreeMap::new() };
            let mut todo = vec![("/".to_string(), snap.tree)];
            while let Some((dir, tree_id)) = todo.pop() {
                info.trees.entry(tree_id).or_default().insert(dir.clone());
                for node in repo.read_tree(&tree_id).unwrap().nodes {
                    let name = String::from_utf8(node.name.clone()).unwrap();
                    let path = if dir == "/" { format!("/{name}") } else { format!("{dir}/{name}") };
                    match node.kind {
                        NodeKind::Dir => todo.push((path, node.subtree.unwrap())),
                        NodeKind::File => {
                            info.files.insert(path, node.content.clone());
                        }
                        _ => {}
                    }
                }
            }
            snapshots.push(info);
        }
        Layout { packs, indexes, snapshots }
    }

    /// The pack holding `blob` (each blob is stored once in these tests).
    fn pack_of(&self, blob: &BlobId) -> &str {
        let holders: Vec<&String> =
            self.packs.iter().filter(|(_, p)| p.entries.iter().any(|e| e.id == *blob)).map(|(n, _)| n).collect();
        assert_eq!(holders.len(), 1, "blob {} is stored in {holders:?}", blob.to_hex());
        holders[0]
    }

    /// The blobs of `pack`.
    fn blobs_in(&self, pack: &str) -> BTreeSet<BlobId> {
        self.packs[pack].entries.iter().map(|e| e.id).collect()
    }

    /// Total bytes of all packs.
    fn bytes(&self) -> u64 {
        self.packs.values().map(|p| p.size).sum()
    }

    /// Number of blobs in all packs.
    fn blob_count(&self) -> u64 {
        self.packs.values().map(|p| p.entries.len() as u64).sum()
    }

    /// Distinct tree blobs of all snapshots.
    fn tree_count(&self) -> u64 {
        self.snapshots.iter().flat_map(|s| s.trees.keys()).collect::<BTreeSet<_>>().len() as u64
    }

    /// Packs holding only data blobs.
    fn data_packs(&self) -> Vec<String> {
        self.packs
            .iter()
            .filter(|(_, p)| p.entries.iter().all(|e| e.kind == BlobKind::Data))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Largest pack.
    fn max_pack(&self) -> u64 {
        self.packs.values().map(|p| p.size).max().unwrap()
    }
}

/// `data/xx/<hex>` of a pack.
fn pack_path(hex: &str) -> String {
    format!("data/{}/{hex}", &hex[..2])
}

/// The hex ID at the end of a repository path.
fn hex_of(path: &str) -> &str {
    path.rsplit('/').next().unwrap()
}

/// Repository files below `dir` (`data`, `index`, …) as `dir/…` paths, sorted.
fn list(repo: &Path, dir: &str) -> Vec<String> {
    fn walk(root: &Path, rel: &str, out: &mut Vec<String>) {
        let Ok(rd) = fs::read_dir(root.join(rel)) else { return };
        for e in rd {
            let e = e.unwrap();
            let name = format!("{rel}/{}", e.file_name().to_str().unwrap());
            if e.file_type().unwrap().is_dir() {
                walk(root, &name, out);
            } else {
                out.push(name);
            }
        }
    }
    let mut out = Vec::new();
    walk(repo, dir, &mut out);
    out.sort();
    out
}

/// Flips the bits of the byte at `at`.
fn flip(path: &Path, at: usize) {
    let mut bytes = fs::read(path).unwrap();
    assert!(at < bytes.len(), "{}: offset {at} beyond its {} bytes", path.display(), bytes.len());
    bytes[at] ^= 0xff;
    fs::write(path, bytes).unwrap();
}

/// Cuts the file to `len` bytes.
fn truncate(path: &Path, len: u64) {
    fs::OpenOptions::new().write(true).open(path).unwrap().set_len(len).unwrap();
}

/// Copies a directory tree.
fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            fs::copy(e.path(), target).unwrap();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Running check and repair

const ERROR_KINDS: [&str; 11] = [
    "damaged_key",
    "damaged_index",
    "damaged_snapshot",
    "missing_pack",
    "pack_size",
    "pack_header",
    "missing_blob",
    "damaged_tree",
    "damaged_pack",
    "damaged_blob",
    "unreadable_pack",
];
const NOTICE_KINDS: [&str; 3] = ["unindexed_pack", "duplicate_blob", "damaged_deletion"];

/// One `cairn --json check` run, its output validated against the contract.
struct CheckRun {
    code: i32,
    summary: Value,
    shown: String,
    elapsed: Duration,
}

impl CheckRun {
    fn n(&self, field: &str) -> u64 {
        self.summary[field].as_u64().unwrap_or_else(|| panic!("summary field {field} is not a count: {}", self.shown))
    }

    fn findings(&self) -> &Vec<Value> {
        self.summary["findings"].as_array().unwrap()
    }

    /// The findings of `kind`.
    fn of(&self, kind: &str) -> Vec<&Value> {
        self.findings().iter().filter(|f| f["kind"] == kind).collect()
    }

    /// The kinds of the findings with `severity`.
    fn kinds(&self, severity: &str) -> BTreeSet<String> {
        self.findings()
            .iter()
            .filter(|f| f["severity"] == severity)
            .map(|f| f["kind"].as_str().unwrap().to_string())
            .collect()
    }

    /// The `file` of every finding of `kind`.
    fn files(&self, kind: &str) -> BTreeSet<String> {
        self.of(kind).iter().filter_map(|f| f["file"].as_str().map(str::to_string)).collect()
    }

    /// Asserts exit 0, no findings at all, not stopped early.
    fn assert_clean(&self) {
        assert_eq!(self.code, 0, "check is not clean: {}", self.shown);
        assert!(self.findings().is_empty(), "check found something: {}", self.shown);
        assert_eq!(self.summary["stopped_early"], false, "{}", self.shown);
    }
}

/// `(snapshot, path)` pairs of a finding's `affected`.
fn affected(f: &Value) -> BTreeSet<(String, String)> {
    f["affected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["snapshot"].as_str().unwrap().to_string(), a["path"].as_str().unwrap().to_string()))
        .collect()
}

/// Asserts that `out` is not a crash: no panic message, exit code 0 or 1 (never 101 or a
/// signal).
fn assert_no_crash(out: &std::process::Output, shown: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "cairn panicked: {shown}");
    assert!(matches!(out.status.code(), Some(0) | Some(1)), "cairn exited with {:?}: {shown}", out.status);
}

/// Runs `cairn --json check ARGS` with extra environment and validates the output: only JSON
/// lines, status lines then one summary with every field of the contract, well-formed
/// findings whose counts match `errors`/`notices`, exit code 1 exactly when there are errors.
fn check_env(cairn: &Cairn, env: &[(&str, &str)], args: &[&str]) -> CheckRun {
    let mut full = vec!["--json", "check"];
    full.extend_from_slice(args);
    let start = Instant::now();
    let out = cairn.run_env(env, &full);
    let elapsed = start.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let shown = format!(
        "cairn -r {} {:?} (env {env:?})\nstatus: {}\nstdout:\n{stdout}\nstderr:\n{}",
        cairn.repo.display(),
        full,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_no_crash(&out, &shown);
    let lines: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "check printed no summary: {shown}");
    for (i, line) in lines.iter().enumerate() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("line {i} is not JSON ({e}): {shown}"));
        let want = if i + 1 == lines.len() { "summary" } else { "status" };
        assert_eq!(v["message_type"], want, "line {i}: {shown}");
    }
    let summary = last_json(&stdout);
    for field in
        ["packs", "bytes", "blobs", "snapshots", "trees", "packs_read", "bytes_read", "blobs_read", "errors", "notices"]
    {
        assert!(summary[field].is_u64(), "summary field {field} missing or not a count: {shown}");
    }
    assert!(summary["seconds"].is_number(), "summary field seconds: {shown}");
    assert!(summary["stopped_early"].is_boolean(), "summary field stopped_early: {shown}");
    let findings = summary["findings"].as_array().unwrap_or_else(|| panic!("summary has no findings array: {shown}"));
    let (mut errors, mut notices) = (0, 0);
    for f in findings {
        let kind = f["kind"].as_str().unwrap_or_else(|| panic!("finding without kind: {f}\n{shown}"));
        let severity = f["severity"].as_str().unwrap_or_default();
        if ERROR_KINDS.contains(&kind) {
            assert_eq!(severity, "error", "{f}\n{shown}");
            errors += 1;
        } else if NOTICE_KINDS.contains(&kind) {
            assert_eq!(severity, "notice", "{f}\n{shown}");
            notices += 1;
        } else {
            panic!("unknown finding kind {kind}: {shown}");
        }
        assert!(f["file"].is_null() || f["file"].is_string(), "{f}\n{shown}");
        if let Some(file) = f["file"].as_str() {
            let ok = ["data/", "index/", "snapshots/", "keys/", "deletions/"].iter().any(|d| file.starts_with(d));
            assert!(ok, "finding names no repository file: {f}\n{shown}");
        }
        match f["blob"].as_str() {
            Some(b) => assert!(b.len() == 64 && b.bytes().all(|c| c.is_ascii_hexdigit()), "{f}\n{shown}"),
            None => assert!(f["blob"].is_null(), "{f}\n{shown}"),
        }
        assert!(f["message"].as_str().is_some_and(|m| !m.is_empty()), "finding without message: {f}\n{shown}");
        for a in f["affected"].as_array().unwrap_or_else(|| panic!("finding without affected: {f}\n{shown}")) {
            let snap = a["snapshot"].as_str().unwrap_or_default();
            assert!(snap.len() == 8 && snap.bytes().all(|c| c.is_ascii_hexdigit()), "{f}\n{shown}");
            assert!(a["path"].as_str().is_some_and(|p| p.starts_with('/')), "{f}\n{shown}");
        }
    }
    assert_eq!(summary["errors"], errors, "errors does not count the error findings: {shown}");
    assert_eq!(summary["notices"], notices, "notices does not count the notice findings: {shown}");
    let code = out.status.code().unwrap();
    assert_eq!(code, i32::from(errors > 0), "exit code must be 1 exactly when there are errors: {shown}");
    CheckRun { code, summary, shown, elapsed }
}

fn check(cairn: &Cairn, args: &[&str]) -> CheckRun {
    check_env(cairn, &[], args)
}

/// Runs `cairn check ARGS` (text output); returns exit code and stdout.
fn check_text(cairn: &Cairn, args: &[&str]) -> (i32, String, String) {
    let mut full = vec!["check"];
    full.extend_from_slice(args);
    let out = cairn.run(&full);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let shown = format!(
        "cairn check {args:?}\nstatus: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_no_crash(&out, &shown);
    (out.status.code().unwrap(), stdout, shown)
}

/// Runs `cairn repair ARGS`, which must succeed; returns stdout.
fn repair(cairn: &Cairn, args: &[&str]) -> String {
    let mut full = vec!["repair"];
    full.extend_from_slice(args);
    let out = cairn.run(&full);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let shown = format!(
        "cairn -r {} {full:?}\nstatus: {}\nstdout:\n{stdout}\nstderr:\n{}",
        cairn.repo.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_no_crash(&out, &shown);
    assert!(out.status.success(), "repair failed: {shown}");
    stdout
}

/// The new snapshot's short ID from `repair snapshots` output
/// `repaired <old> -> <new>: <n> files cut, <m> dirs emptied`, checking the counts.
fn repaired(out: &str, old: &str, files_cut: u32, dirs_emptied: u32) -> String {
    let prefix = format!("repaired {old} -> ");
    let line = out
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("repair snapshots did not report repairing {old}:\n{out}"));
    let rest = &line[prefix.len()..];
    let new = rest.split(':').next().unwrap().trim().to_string();
    assert!(new.len() == 8 && new.bytes().all(|c| c.is_ascii_hexdigit()), "not a short ID in {line:?}");
    assert_eq!(
        rest[new.len()..].trim(),
        format!(": {files_cut} files cut, {dirs_emptied} dirs emptied"),
        "repair snapshots line: {line:?}"
    );
    new
}

/// Short IDs of the repository's snapshots.
fn snapshot_shorts(cairn: &Cairn) -> BTreeSet<String> {
    cairn.snapshots().iter().map(|s| s["short_id"].as_str().unwrap().to_string()).collect()
}

/// The summary line of a text check (the last line).
fn summary_line(stdout: &str) -> &str {
    stdout.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default()
}

/// Whether a text summary line reports `n` errors: its verdict after the last `: ` is
/// `no errors`, `1 error`, `3 errors`, maybe followed by `, N notices`.
fn reports_errors(line: &str, n: u64) -> bool {
    let Some((_, verdict)) = line.rsplit_once(": ") else { return false };
    let errors = verdict.split(", ").next().unwrap();
    match n {
        0 => errors == "no errors",
        1 => errors == "1 error" || errors == "1 errors",
        n => errors == format!("{n} errors"),
    }
}

// ---------------------------------------------------------------------------------------------
// 1. A clean repository

#[test]
fn clean_repository_checks_clean() {
    let (fx, _) = Fixture::for_check_with_backup(3 << 20);
    let layout = Layout::of(&fx.cairn);
    let n = layout.packs.len() as u64;
    assert!(n >= 3, "the fixture should make several packs: {n}");

    let text = fx.cairn.ok(["check"]);
    let last = summary_line(&text);
    assert!(last.starts_with(&format!("checked {n} packs, ")) && reports_errors(last, 0), "text summary: {text}");
    assert!(!text.lines().any(|l| l.starts_with("error:") || l.starts_with("notice:")), "{text}");

    let text = fx.cairn.ok(["check", "--read-data"]);
    assert!(reports_errors(summary_line(&text), 0), "{text}");
    assert!(text.contains(&format!("read {n} packs")) && text.contains("in full"), "{text}");

    let s = check(&fx.cairn, &[]);
    s.assert_clean();
    assert_eq!(s.n("errors"), 0);
    assert_eq!(s.n("notices"), 0);
    assert_eq!(s.n("packs"), n, "{}", s.shown);
    assert_eq!(s.n("bytes"), layout.bytes(), "{}", s.shown);
    assert_eq!(s.n("blobs"), layout.blob_count(), "{}", s.shown);
    assert_eq!(s.n("snapshots"), 1, "{}", s.shown);
    assert_eq!(s.n("trees"), layout.tree_count(), "{}", s.shown);
    assert_eq!(s.n("packs_read"), 0, "a structure check reads no pack in full: {}", s.shown);

    let s = check(&fx.cairn, &["--read-data"]);
    s.assert_clean();
    assert_eq!(s.n("packs_read"), n, "{}", s.shown);
    assert_eq!(s.n("bytes_read"), layout.bytes(), "{}", s.shown);
    assert_eq!(s.n("blobs_read"), layout.blob_count(), "{}", s.shown);
}

// ---------------------------------------------------------------------------------------------
// 2. An index file deleted

#[test]
fn deleted_index_file_is_named_and_rebuilt() {
    // 12 MiB in 1 MiB packs: the backup writes an index file after its first 8 data packs,
    // before any tree pack, so one index file lists file data only.
    let (fx, before) = Fixture::for_check_with_backup(12 << 20);
    let layout = Layout::of(&fx.cairn);
    let data_packs: BTreeSet<String> = layout.data_packs().into_iter().collect();
    let (index, lost_packs) = layout
        .indexes
        .iter()
        .find(|(_, packs)| packs.iter().all(|p| data_packs.contains(p)))
        .unwrap_or_else(|| panic!("no index file lists only data packs: {:?}", layout.indexes));
    let lost_packs: BTreeSet<String> = lost_packs.iter().cloned().collect();
    let lost_blobs: BTreeSet<BlobId> = lost_packs.iter().flat_map(|p| layout.blobs_in(p)).collect();
    let snap = &layout.snapshots[0];
    fs::remove_file(fx.repo_file(index)).unwrap();

    let s = check(&fx.cairn, &[]);
    assert_eq!(s.code, 1, "{}", s.shown);
    assert_eq!(s.kinds("error"), BTreeSet::from(["missing_blob".to_string()]), "{}", s.shown);
    assert_eq!(s.kinds("notice"), BTreeSet::from(["unindexed_pack".to_string()]), "{}", s.shown);
    assert_eq!(s.files("unindexed_pack"), lost_packs, "the notices must name exactly the unindexed packs: {}", s.shown);
    let mut named = BTreeSet::new();
    for f in s.of("missing_blob") {
        let blob = BlobId::from_hex(f["blob"].as_str().expect("a missing_blob finding names its blob")).unwrap();
        assert!(lost_blobs.contains(&blob), "{} is not a lost blob: {}", blob.to_hex(), s.shown);
        let want: BTreeSet<(String, String)> =
            snap.paths_needing(&BTreeSet::from([blob])).into_iter().map(|p| (snap.short.clone(), p)).collect();
        assert!(!want.is_empty());
        assert_eq!(affected(f), want, "affected of missing blob {}: {}", blob.to_hex(), s.shown);
        named.insert(blob);
    }
    assert_eq!(named, lost_blobs, "every blob of the lost index file must be reported missing: {}", s.shown);
    // The file whose data went missing is named (and the small files, if they were there).
    let all_affected: BTreeSet<String> =
        s.of("missing_blob").iter().flat_map(|f| affected(f)).map(|(_, p)| p).collect();
    assert!(all_affected.contains(&fx.snap_path("big")), "{}", s.shown);

    // Text output: one line per finding, the summary counts the errors.
    let (code, text, shown) = check_text(&fx.cairn, &[]);
    assert_eq!(code, 1, "{shown}");
    assert_eq!(text.lines().filter(|l| l.starts_with("error: ")).count() as u64, s.n("errors"), "{shown}");
    assert_eq!(text.lines().filter(|l| l.starts_with("notice: ")).count() as u64, s.n("notices"), "{shown}");
    assert!(reports_errors(summary_line(&text), s.n("errors")), "{shown}");

    repair(&fx.cairn, &["index"]);
    check(&fx.cairn, &[]).assert_clean();
    check(&fx.cairn, &["--read-data"]).assert_clean();
    assert_same(&before, &fx.restore_and_scan("latest", "restored"), true);
}

// ---------------------------------------------------------------------------------------------
// 3. An index file with a flipped byte

#[test]
fn damaged_index_file_is_named_and_rebuilt() {
    let (fx, before) = Fixture::for_check_with_backup(3 << 20);
    let layout = Layout::of(&fx.cairn);
    let index = layout.indexes.keys().next().unwrap().clone();
    let len = fs::metadata(fx.repo_file(&index)).unwrap().len() as usize;
    flip(&fx.repo_file(&index), len / 2);

    let s = check(&fx.cairn, &[]);
    assert_eq!(s.code, 1, "{}", s.shown);
    assert_eq!(s.files("damaged_index"), BTreeSet::from([index.clone()]), "{}", s.shown);

    repair(&fx.cairn, &["index"]);
    check(&fx.cairn, &[]).assert_clean();
    check(&fx.cairn, &["--read-data"]).assert_clean();
    assert_same(&before, &fx.restore_and_scan("latest", "restored"), true);
}

// ---------------------------------------------------------------------------------------------
// 4. A pack deleted

#[test]
fn deleted_pack_is_named_and_snapshots_are_repaired() {
    let fx = Fixture::for_check();
    make_files(&fx.src, 4, 200_000);
    fx.cairn.backup(&[&fx.src], &[]);
    // The second backup stores one new file: every data pack it writes holds only that file.
    fs::create_dir_all(fx.src.join("b")).unwrap();
    fs::write(fx.src.join("b/later"), Rng(44).bytes(3 << 20)).unwrap();
    let before = scan_source(&fx.src);
    fx.cairn.backup(&[&fx.src], &[]);
    let layout = Layout::of(&fx.cairn);
    let (snap1, snap2) = (&layout.snapshots[0], &layout.snapshots[1]);
    let later = fx.snap_path("b/later");
    let chunks = &snap2.files[&later];
    // The pack whose first chunk of the file comes last: the file spans several packs, so the
    // file keeps a non-empty prefix.
    let mut first_in: BTreeMap<String, usize> = BTreeMap::new();
    for (i, c) in chunks.iter().enumerate() {
        first_in.entry(layout.pack_of(&data_id(c).unwrap()).to_string()).or_insert(i);
    }
    assert!(first_in.len() >= 2, "the file should span several packs: {first_in:?}");
    let (pack, &first) = first_in.iter().max_by_key(|(_, i)| **i).unwrap();
    let pack = pack.clone();
    let cut: u64 = chunks[..first].iter().map(Chunk::len).sum();
    let lost = layout.blobs_in(&pack);
    let file_blobs: BTreeSet<BlobId> = chunks.iter().filter_map(data_id).collect();
    assert!(lost.is_subset(&file_blobs), "the pack should hold data of b/later only");
    assert!(!snap1.blobs().iter().any(|b| lost.contains(b)));
    fs::remove_file(fx.repo_file(&pack)).unwrap();

    let s = check(&fx.cairn, &[]);
    assert_eq!(s.code, 1, "{}", s.shown);
    assert_eq!(s.kinds("error"), BTreeSet::from(["missing_pack".to_string()]), "{}", s.shown);
    let missing = s.of("missing_pack");
    assert_eq!(missing.len(), 1, "{}", s.shown);
    assert_eq!(missing[0]["file"], pack.as_str(), "{}", s.shown);
    assert_eq!(affected(missing[0]), BTreeSet::from([(snap2.short.clone(), later.clone())]), "{}", s.shown);

    // Rebuilding the index drops the pack; what it held is now missing from the index.
    repair(&fx.cairn, &["index"]);
    let s = check(&fx.cairn, &[]);
    assert_eq!(s.code, 1, "{}", s.shown);
    assert_eq!(s.kinds("error"), BTreeSet::from(["missing_blob".to_string()]), "{}", s.shown);
    let named: BTreeSet<String> =
        s.of("missing_blob").iter().map(|f| f["blob"].as_str().unwrap().to_string()).collect();
    assert_eq!(named, lost.iter().map(BlobId::to_hex).collect(), "{}", s.shown);
    for f in s.of("missing_blob") {
        assert_eq!(affected(f), BTreeSet::from([(snap2.short.clone(), later.clone())]), "{}", s.shown);
    }

    // --dry-run names what would change and writes nothing.
    let snapshot_files = list(fx.repo(), "snapshots");
    let out = repair(&fx.cairn, &["snapshots", "--dry-run"]);
    assert!(out.contains(&later), "the dry run does not name the damaged file:\n{out}");
    assert!(out.contains(&snap2.short), "the dry run does not name the snapshot:\n{out}");
    assert_eq!(list(fx.repo(), "snapshots"), snapshot_files, "--dry-run wrote or removed snapshots");

    // Without --forget, the original is kept next to the repaired snapshot.
    let out = repair(&fx.cairn, &["snapshots"]);
    let new = repaired(&out, &snap2.short, 1, 0);
    assert!(out.contains(&later), "repair does not name the cut file:\n{out}");
    assert!(!out.contains(&format!("repaired {}", snap1.short)), "an intact snapshot was rewritten:\n{out}");
    assert_eq!(
        snapshot_shorts(&fx.cairn),
        BTreeSet::from([snap1.short.clone(), snap2.short.clone(), new.clone()]),
        "the original snapshot must be kept"
    );
    check(&fx.cairn, &["--snapshot", &new]).assert_clean();
    check(&fx.cairn, &["--snapshot", &snap1.short]).assert_clean();
    let s = check(&fx.cairn, &[]);
    assert_eq!(s.code, 1, "the original still needs the lost blobs: {}", s.shown);
    let still: BTreeSet<String> = s.findings().iter().flat_map(affected).map(|(snap, _)| snap).collect();
    assert_eq!(still, BTreeSet::from([snap2.short.clone()]), "{}", s.shown);

    // The repaired snapshot restores every other file exactly and the damaged file up to its
    // first lost chunk.
    let restored = fx.restore_and_scan(&new, "restored");
    assert_same(&without(&before, "b/later"), &without(&restored, "b/later"), true);
    let target = restored_path(&fx.base.join("restored"), &fx.src);
    assert_prefix(&fx.src.join("b/later"), &target.join("b/later"), cut);

    // With --forget the original goes; the repository checks clean.
    let out = repair(&fx.cairn, &["snapshots", "--forget"]);
    let newer = repaired(&out, &snap2.short, 1, 0);
    assert!(!out.contains(&format!("repaired {new}")), "the repaired snapshot was repaired again:\n{out}");
    assert_eq!(snapshot_shorts(&fx.cairn), BTreeSet::from([snap1.short.clone(), new.clone(), newer.clone()]));
    check(&fx.cairn, &[]).assert_clean();
    check(&fx.cairn, &["--read-data"]).assert_clean();
}

// ---------------------------------------------------------------------------------------------
// 5. A pack truncated

#[test]
fn truncated_packs_are_named() {
    let (fx, _) = Fixture::for_check_with_backup(4 << 20);
    let layout = Layout::of(&fx.cairn);
    let data = layout.data_packs();
    assert!(data.len() >= 2, "{data:?}");
    // One pack loses its trailer's last bytes, another half of its length.
    let (tail, half) = (&data[0], &data[1]);
    truncate(&fx.repo_file(tail), layout.packs[tail].size - 10);
    truncate(&fx.repo_file(half), layout.packs[half].size / 2);

    let s = check(&fx.cairn, &[]);
    assert_eq!(s.code, 1, "{}", s.shown);
    for pack in [tail, half] {
        let named = s
            .findings()
            .iter()
            .any(|f| (f["kind"] == "pack_size" || f["kind"] == "pack_header") && f["file"] == pack.as_str());
        assert!(named, "no pack_size/pack_header finding names {pack}: {}", s.shown);
    }
    let kinds = s.kinds("error");
    assert!(
        kinds.iter().all(|k| k == "pack_size" || k == "pack_header"),
        "only the truncated packs are wrong: {}",
        s.shown
    );
}

// ---------------------------------------------------------------------------------------------
// 6. A pack with a flipped byte inside one blob

#[test]
fn flipped_byte_in_a_blob_is_found_by_read_data_and_salvaged() {
    let (fx, before) = Fixture::for_check_with_backup(3 << 20);
    let layout = Layout::of(&fx.cairn);
    let snap = &layout.snapshots[0];
    let big = fx.snap_path("big");
    let chunks = &snap.files[&big];
    assert!(chunks.len() >= 3, "{chunks:?}");
    // A chunk in the middle of the big file.
    let victim_index = chunks.len() / 2;
    let victim = data_id(&chunks[victim_index]).unwrap();
    let cut: u64 = chunks[..victim_index].iter().map(Chunk::len).sum();
    let pack = layout.pack_of(&victim).to_string();
    let entry = *layout.packs[&pack].entries.iter().find(|e| e.id == victim).unwrap();
    // Inside the ciphertext: past the 12-byte nonce, before the 16-byte tag.
    let at = entry.offset as usize + 12 + (entry.length as usize - 28) / 2;
    flip(&fx.repo_file(&pack), at);

    let s = check(&fx.cairn, &[]);
    assert_eq!(s.code, 0, "a structure check reads only pack headers and cannot see this: {}", s.shown);
    assert!(s.findings().is_empty(), "{}", s.shown);

    let s = check(&fx.cairn, &["--read-data"]);
    assert_eq!(s.code, 1, "{}", s.shown);
    assert_eq!(
        s.kinds("error"),
        BTreeSet::from(["damaged_blob".to_string(), "damaged_pack".to_string()]),
        "{}",
        s.shown
    );
    let blobs = s.of("damaged_blob");
    assert_eq!(blobs.len(), 1, "exactly one blob is damaged: {}", s.shown);
    assert_eq!(blobs[0]["blob"], victim.to_hex(), "{}", s.shown);
    assert_eq!(affected(blobs[0]), BTreeSet::from([(snap.short.clone(), big.clone())]), "{}", s.shown);
    assert_eq!(s.files("damaged_pack"), BTreeSet::from([pack.clone()]), "{}", s.shown);

    // Salvage the pack: every other blob is copied, the damaged one is named as lost.
    let out = repair(&fx.cairn, &["packs", hex_of(&pack)]);
    let pack_short = &hex_of(&pack)[..8];
    assert!(
        out.contains(&format!("lost blob {} of pack {pack_short}", victim.short())),
        "repair packs does not name the lost blob:\n{out}"
    );
    assert!(!fx.repo_file(&pack).exists(), "the damaged pack was not removed");
    let after = Layout::of_packs(&fx.cairn);
    for e in &layout.packs[&pack].entries {
        let kept = after.values().any(|p| p.entries.iter().any(|x| x.id == e.id));
        assert_eq!(kept, e.id != victim, "blob {} of the damaged pack", e.id.short());
    }

    let out = repair(&fx.cairn, &["snapshots", "--forget"]);
    let new = repaired(&out, &snap.short, 1, 0);
    assert!(out.contains(&big), "repair does not name the cut file:\n{out}");
    assert_eq!(snapshot_shorts(&fx.cairn), BTreeSet::from([new.clone()]), "--forget removes the original");
    check(&fx.cairn, &[]).assert_clean();
    check(&fx.cairn, &["--read-data"]).assert_clean();

    let restored = fx.restore_and_scan(&new, "restored");
    assert_same(&without(&before, "big"), &without(&restored, "big"), true);
    let target = restored_path(&fx.base.join("restored"), &fx.src);
    assert_prefix(&fx.src.join("big"), &target.join("big"), cut);
}

impl Layout {
    /// Only the pack headers (after a repair, when the layout of snapshots is not needed).
    fn of_packs(cairn: &Cairn) -> BTreeMap<String, PackInfo> {
        let (repo, storage) = cairn.open();
        storage
            .list("data")
            .unwrap()
            .into_iter()
            .map(|obj| {
                let bytes = storage.read(&obj.path).unwrap();
                let (_, entries) = read_header(repo.key(), &obj.path, &bytes).unwrap();
                (obj.path, PackInfo { size: bytes.len() as u64, entries })
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// 7. A snapshot file damaged

#[test]
fn damaged_snapshot_is_named() {
    let fx = Fixture::for_check();
    make_files(&fx.src, 7, 1 << 20);
    fx.cairn.backup(&[&fx.src], &[]);
    fs::write(fx.src.join("added"), b"added later").unwrap();
    fx.cairn.backup(&[&fx.src], &[]);
    let layout = Layout::of(&fx.cairn);
    let victim = format!("snapshots/{}", layout.snapshots[0].id);
    let len = fs::metadata(fx.repo_file(&victim)).unwrap().len() as usize;
    flip(&fx.repo_file(&victim), len - 5);

    for args in [&[][..], &["--read-data"][..]] {
        let s = check(&fx.cairn, args);
        assert_eq!(s.code, 1, "{}", s.shown);
        let errors: Vec<&Value> = s.findings().iter().filter(|f| f["severity"] == "error").collect();
        assert_eq!(errors.len(), 1, "only the snapshot is damaged: {}", s.shown);
        assert_eq!(errors[0]["kind"], "damaged_snapshot", "{}", s.shown);
        assert_eq!(errors[0]["file"], victim.as_str(), "{}", s.shown);
    }
}

// ---------------------------------------------------------------------------------------------
// 8. A stray pack that no index lists

#[test]
fn stray_pack_is_only_a_notice() {
    let (fx, _) = Fixture::for_check_with_backup(1 << 20);
    let packs_before = list(fx.repo(), "data");
    let indexes_before = list(fx.repo(), "index");
    {
        let (repo, _) = fx.cairn.open();
        repo.write_pack(&[(BlobKind::Data, Rng(8).bytes(5000))], Codec::None).unwrap();
    }
    let stray: Vec<String> = list(fx.repo(), "data").into_iter().filter(|p| !packs_before.contains(p)).collect();
    let new_index: Vec<String> = list(fx.repo(), "index").into_iter().filter(|p| !indexes_before.contains(p)).collect();
    assert_eq!((stray.len(), new_index.len()), (1, 1));
    fs::remove_file(fx.repo_file(&new_index[0])).unwrap();

    for args in [&[][..], &["--read-data"][..]] {
        let s = check(&fx.cairn, args);
        assert_eq!(s.code, 0, "an unindexed pack is not an error: {}", s.shown);
        assert_eq!(s.n("errors"), 0, "{}", s.shown);
        assert_eq!(s.n("notices"), 1, "{}", s.shown);
        assert_eq!(s.findings().len(), 1, "{}", s.shown);
        let f = &s.findings()[0];
        assert_eq!(f["kind"], "unindexed_pack", "{}", s.shown);
        assert_eq!(f["severity"], "notice", "{}", s.shown);
        assert_eq!(f["file"], stray[0].as_str(), "{}", s.shown);
    }
    let (code, text, shown) = check_text(&fx.cairn, &[]);
    assert_eq!(code, 0, "{shown}");
    assert_eq!(text.lines().filter(|l| l.starts_with("notice: ")).count(), 1, "{shown}");
    assert!(!text.lines().any(|l| l.starts_with("error: ")), "{shown}");
    assert!(reports_errors(summary_line(&text), 0), "{shown}");

    // `repair index` indexes it from its header.
    repair(&fx.cairn, &["index"]);
    check(&fx.cairn, &["--read-data"]).assert_clean();
}

// ---------------------------------------------------------------------------------------------
// 9–11. Reading a subset of the packs; resuming; a time budget

/// A repository of at least 10 packs, topped up with small indexed packs (which no snapshot
/// needs) to a multiple of four, every pack of a different size.
fn many_packs() -> (Fixture, Layout) {
    let (fx, _) = Fixture::for_check_with_backup(10 << 20);
    let mut n = list(fx.repo(), "data").len();
    assert!(n >= 10, "the fixture should make at least 10 packs: {n}");
    let (repo, _) = fx.cairn.open();
    let mut extra = 0;
    while !n.is_multiple_of(4) {
        repo.write_pack(&[(BlobKind::Data, Rng(90 + extra).bytes(3000 + 1111 * extra as usize))], Codec::None).unwrap();
        n += 1;
        extra += 1;
    }
    drop(repo);
    let layout = Layout::of(&fx.cairn);
    let sizes: BTreeSet<u64> = layout.packs.values().map(|p| p.size).collect();
    assert_eq!(sizes.len(), layout.packs.len(), "pack sizes should differ (they identify which packs were read)");
    (fx, layout)
}

/// First 4 bytes of the pack ID, big-endian.
fn pack_number(path: &str) -> u32 {
    u32::from_str_radix(&hex_of(path)[..8], 16).unwrap()
}

#[test]
fn read_data_subsets_read_what_they_ask() {
    let (fx, layout) = many_packs();
    let n = layout.packs.len() as u64;

    // N/M: deterministic by the pack ID; the parts together read every pack exactly once.
    for m in [2u32, 3] {
        let (mut packs, mut bytes) = (0, 0);
        for part in 1..=m {
            let spec = format!("{part}/{m}");
            let s = check(&fx.cairn, &["--read-data-subset", &spec]);
            s.assert_clean();
            let want: Vec<&PackInfo> =
                layout.packs.iter().filter(|(p, _)| pack_number(p) % m == part - 1).map(|(_, i)| i).collect();
            assert_eq!(s.n("packs_read"), want.len() as u64, "{spec}: {}", s.shown);
            assert_eq!(s.n("bytes_read"), want.iter().map(|p| p.size).sum::<u64>(), "{spec}: {}", s.shown);
            assert_eq!(s.n("packs"), n, "{spec}: {}", s.shown);
            packs += s.n("packs_read");
            bytes += s.n("bytes_read");
        }
        assert_eq!((packs, bytes), (n, layout.bytes()), "1/{m}..{m}/{m} together read every pack once");
    }

    // P%: that fraction of the packs by count.
    let s = check(&fx.cairn, &["--read-data-subset", "50%"]);
    s.assert_clean();
    let read = s.n("packs_read");
    assert!(read.abs_diff(n / 2) <= 1, "50% of {n} packs read {read}: {}", s.shown);
    let s = check(&fx.cairn, &["--read-data-subset", "25%"]);
    s.assert_clean();
    assert!(s.n("packs_read").abs_diff(n / 4) <= 1, "25% of {n} packs: {}", s.shown);

    // SIZE: packs until about that many bytes.
    let max = layout.max_pack();
    for size in [1u64, 3] {
        let spec = format!("{size}M");
        let s = check(&fx.cairn, &["--read-data-subset", &spec]);
        s.assert_clean();
        let (read, bytes) = (s.n("packs_read"), s.n("bytes_read"));
        assert!(read >= 1 && read < n, "{spec}: {read} of {n} packs: {}", s.shown);
        assert!(bytes + max >= size * MIB && bytes <= size * MIB + max, "{spec}: read {bytes} bytes: {}", s.shown);
    }
}

/// How many of the layout's packs a `check-verified` record names (as hex, or as raw IDs).
fn packs_named_in(record: &[u8], layout: &Layout) -> usize {
    let text = String::from_utf8_lossy(record);
    layout
        .packs
        .keys()
        .filter(|p| {
            let hex = hex_of(p);
            let raw: Vec<u8> = (0..32).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap()).collect();
            text.contains(hex) || record.windows(32).any(|w| w == raw.as_slice())
        })
        .count()
}

#[test]
fn resumed_subsets_read_every_pack_once_before_any_twice() {
    let (fx, layout) = many_packs();
    let n = layout.packs.len() as u64;
    let cache = fx.base.join("cache");
    let cache_arg = cache.to_str().unwrap();
    let record = cache.join(fx.repo_id()).join("check-verified");
    let args = ["--cache-dir", cache_arg, "--read-data-subset", "25%", "--resume"];

    let mut bytes = 0;
    let mut named = Vec::new();
    for run in 1..=4u64 {
        let s = check(&fx.cairn, &args);
        s.assert_clean();
        assert_eq!(s.n("packs_read"), n / 4, "run {run}: 25% of {n} packs: {}", s.shown);
        bytes += s.n("bytes_read");
        assert!(record.is_file(), "run {run}: no record at {}", record.display());
        named.push(packs_named_in(&fs::read(&record).unwrap(), &layout));
    }
    // Pack sizes all differ: only reading each pack once adds up to the repository's size.
    assert_eq!(bytes, layout.bytes(), "four runs of 25% must read every pack exactly once");
    // If the record names the packs it holds, it grows by a quarter each run.
    if named[0] > 0 {
        let want: Vec<usize> = (1..=4).map(|k| (k * n / 4) as usize).collect();
        assert_eq!(named, want, "packs recorded after each run");
    }
    // Every pack has been read: the fifth run reads again (the packs read longest ago).
    let s = check(&fx.cairn, &args);
    s.assert_clean();
    assert_eq!(s.n("packs_read"), n / 4, "the fifth run starts over: {}", s.shown);
}

#[test]
fn max_duration_stops_early_and_resume_finishes() {
    let (fx, layout) = many_packs();
    let n = layout.packs.len() as u64;
    let cache = fx.base.join("cache");
    let cache_arg = cache.to_str().unwrap();

    // Text: the output says it stopped.
    let (code, text, shown) = check_text(&fx.cairn, &["--read-data", "--max-duration", "0s"]);
    assert_eq!(code, 0, "{shown}");
    assert!(text.to_lowercase().contains("stop"), "the output does not say it stopped: {shown}");

    // A budget of nothing: stops, exit 0, and the next --resume run reads the rest.
    let first = check(&fx.cairn, &["--cache-dir", cache_arg, "--read-data", "--resume", "--max-duration", "0s"]);
    assert_eq!(first.code, 0, "{}", first.shown);
    assert!(first.findings().is_empty(), "{}", first.shown);
    assert_eq!(first.summary["stopped_early"], true, "{}", first.shown);
    assert!(first.n("packs_read") < n, "{}", first.shown);
    let rest = check(&fx.cairn, &["--cache-dir", cache_arg, "--read-data", "--resume"]);
    rest.assert_clean();
    assert_eq!(
        first.n("packs_read") + rest.n("packs_read"),
        n,
        "the resumed run reads what the first left: {}",
        rest.shown
    );
    assert_eq!(first.n("bytes_read") + rest.n("bytes_read"), layout.bytes(), "{}", rest.shown);

    // A budget that runs out mid-way (every request 200 ms, one read at a time): what was read
    // is recorded and the next run reads only the others.
    let cache = fx.base.join("cache-2");
    let cache_arg = cache.to_str().unwrap();
    let slow = [("CAIRN_INJECT_FAULTS", "latency=200ms")];
    let first = check_env(
        &fx.cairn,
        &slow,
        &["--cache-dir", cache_arg, "--read-data", "--resume", "--fetch-concurrency", "1", "--max-duration", "1s"],
    );
    assert_eq!(first.code, 0, "{}", first.shown);
    assert_eq!(first.summary["stopped_early"], true, "{}", first.shown);
    assert!(first.n("packs_read") < n, "{}", first.shown);
    assert!(first.elapsed < Duration::from_secs(30), "the budget did not stop the check: {:?}", first.elapsed);
    let rest = check(&fx.cairn, &["--cache-dir", cache_arg, "--read-data", "--resume"]);
    rest.assert_clean();
    assert_eq!(first.n("packs_read") + rest.n("packs_read"), n, "{}\n{}", first.shown, rest.shown);
    assert_eq!(first.n("bytes_read") + rest.n("bytes_read"), layout.bytes(), "{}", rest.shown);
}

// ---------------------------------------------------------------------------------------------
// 12. Filters

#[test]
fn filters_limit_the_check_to_what_the_snapshots_need() {
    let fx = Fixture::for_check();
    let (src_a, src_b) = (fx.base.join("a"), fx.base.join("b"));
    make_files(&src_a, 12, 2 << 20);
    make_files(&src_b, 13, 2 << 20);
    fx.cairn.backup(&[&src_a], &["--tag", "a", "--host", "host-a"]);
    fx.cairn.backup(&[&src_b], &["--tag", "b", "--host", "host-b"]);
    let layout = Layout::of(&fx.cairn);
    let (a, b) = (&layout.snapshots[0], &layout.snapshots[1]);
    let a_blobs = a.blobs();
    let packs_of_a: BTreeSet<&str> = a_blobs.iter().map(|id| layout.pack_of(id)).collect();

    // --read-data with a filter reads exactly the packs that snapshot needs.
    let s = check(&fx.cairn, &["--read-data", "--tag", "a"]);
    s.assert_clean();
    assert_eq!(s.n("packs_read"), packs_of_a.len() as u64, "{}", s.shown);

    // A data pack only snapshot b needs.
    let pack = layout
        .data_packs()
        .into_iter()
        .find(|p| layout.blobs_in(p).is_disjoint(&a_blobs))
        .expect("a pack only b needs");
    let lost = layout.blobs_in(&pack);
    let want_affected: BTreeSet<(String, String)> =
        b.paths_needing(&lost).into_iter().map(|p| (b.short.clone(), p)).collect();
    fs::remove_file(fx.repo_file(&pack)).unwrap();

    let (a_path, b_path) = (src_a.to_str().unwrap(), src_b.to_str().unwrap());
    for (clean, damaged) in [
        (vec!["--tag", "a"], vec!["--tag", "b"]),
        (vec!["--snapshot", &a.short], vec!["--snapshot", &b.short]),
        (vec!["--host", "host-a"], vec!["--host", "host-b"]),
        (vec!["--path", a_path], vec!["--path", b_path]),
    ] {
        for extra in [&[][..], &["--read-data"][..]] {
            let mut args = clean.clone();
            args.extend_from_slice(extra);
            check(&fx.cairn, &args).assert_clean();
            let mut args = damaged.clone();
            args.extend_from_slice(extra);
            let s = check(&fx.cairn, &args);
            assert_eq!(s.code, 1, "{}", s.shown);
            assert_eq!(s.files("missing_pack"), BTreeSet::from([pack.clone()]), "{}", s.shown);
            assert_eq!(affected(s.of("missing_pack")[0]), want_affected, "{}", s.shown);
        }
    }
    // Several filters: the union of what they select.
    let s = check(&fx.cairn, &["--tag", "a", "--tag", "b"]);
    assert_eq!(s.code, 1, "{}", s.shown);
    let s = check(&fx.cairn, &[]);
    assert_eq!(s.code, 1, "{}", s.shown);
}

// ---------------------------------------------------------------------------------------------
// 13. Remote (MinIO) and injected latency

#[test]
fn s3_check_clean_and_deleted_pack() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    let src = base.join("src");
    let before = make_files(&src, 13, 3 << 20);
    let cairn = servers::cairn(&servers::s3_repo("check"), &base.join("cache"));
    cairn.init(&INIT);
    cairn.backup(&[&src], &[]);
    let short = snapshot_shorts(&cairn).into_iter().next().unwrap();

    let s = check(&cairn, &[]);
    s.assert_clean();
    let packs = servers::remote_storage(&cairn, "list", "data");
    assert_eq!(s.n("packs"), packs.len() as u64, "{}", s.shown);
    let s = check(&cairn, &["--read-data"]);
    s.assert_clean();
    assert_eq!(s.n("packs_read"), packs.len() as u64, "{}", s.shown);
    assert_eq!(s.n("bytes_read"), packs.iter().map(|(_, size)| size).sum::<u64>(), "{}", s.shown);
    let target = base.join("restored");
    cairn.restore("latest", &target);
    assert_same(&before, &scan(&restored_path(&target, &src)), true);

    // The largest pack holds file data.
    let (pack, _) = packs.iter().max_by_key(|(_, size)| *size).unwrap().clone();
    servers::remote_storage(&cairn, "delete", &pack);
    for args in [&[][..], &["--read-data"][..], &["--no-cache"][..]] {
        let s = check(&cairn, args);
        assert_eq!(s.code, 1, "{}", s.shown);
        assert_eq!(s.files("missing_pack"), BTreeSet::from([pack.clone()]), "{}", s.shown);
        let hit = affected(s.of("missing_pack")[0]);
        assert!(!hit.is_empty(), "{}", s.shown);
        for (snap, path) in hit {
            assert_eq!(snap, short, "{}", s.shown);
            assert!(path.starts_with(src.to_str().unwrap()), "{}", s.shown);
        }
    }
}

#[test]
fn injected_latency_checks_finish_correctly() {
    let fx = Fixture::for_check();
    make_files(&fx.src, 14, 2 << 20);
    fx.cairn.backup(&[&fx.src], &[]);
    // Many objects, so that the requests a check makes one after the other whatever the
    // repository holds (key, config, lock, listings: about a dozen round trips) are a small part
    // of what reading the files one at a time would take: small backups, each a snapshot, an
    // index file and two packs.
    for i in 0..28 {
        fs::write(fx.src.join(format!("docs/more-{i}")), Rng(140 + i).bytes(3000)).unwrap();
        fx.cairn.backup(&[&fx.src], &[]);
    }
    let layout = Layout::of(&fx.cairn);
    let objects = layout.packs.len() + layout.indexes.len() + layout.snapshots.len() + 1;
    let slow = [("CAIRN_INJECT_FAULTS", "latency=50ms")];
    // One request per object after the other would take this long.
    let serial = Duration::from_millis(50) * objects as u32;

    let s = check_env(&fx.cairn, &slow, &[]);
    // How long it took is the benchmark's business (bench/run); here only that it is right.
    eprintln!(
        "structure check of {objects} objects with 50 ms latency: {:?} ({serial:?} one after another)",
        s.elapsed
    );
    s.assert_clean();
    assert_eq!(s.n("packs"), layout.packs.len() as u64, "{}", s.shown);
    assert_eq!(s.n("snapshots"), layout.snapshots.len() as u64, "{}", s.shown);

    let s = check_env(&fx.cairn, &slow, &["--read-data"]);
    eprintln!("--read-data of {objects} objects with 50 ms latency: {:?}", s.elapsed);
    s.assert_clean();
    assert_eq!(s.n("packs_read"), layout.packs.len() as u64, "{}", s.shown);
    assert_eq!(s.n("bytes_read"), layout.bytes(), "{}", s.shown);
}

// ---------------------------------------------------------------------------------------------
// 14. Random damage never makes check panic or hang

#[derive(Debug)]
enum Damage {
    Flip(String, usize),
    Truncate(String, u64),
    Delete(String),
}

#[test]
fn random_damage_never_crashes_check() {
    let (fx, _) = Fixture::for_check_with_backup(2 << 20);
    fs::write(fx.src.join("second"), b"a second snapshot").unwrap();
    fx.cairn.backup(&[&fx.src], &[]);
    // A second key file for the same password, so one of the two can be damaged.
    {
        let (repo, _) = fx.cairn.open();
        repo.add_key(PASSWORD.as_bytes(), KdfParams { memory_kib: 1024, iterations: 1, parallelism: 1 }).unwrap();
    }
    let keys = list(fx.repo(), "keys");
    assert_eq!(keys.len(), 2);

    let mut rng = Rng(0xc4ec);
    for round in 0..36 {
        let repo = fx.base.join(format!("round-{round}"));
        copy_dir(fx.repo(), &repo);
        let cairn = support::isolated(Cairn::new(&repo, PASSWORD), &fx.base);
        let protected = &keys[(rng.next_u64() % 2) as usize];
        let mut files: Vec<String> = ["data", "index", "snapshots", "keys"]
            .iter()
            .flat_map(|d| list(&repo, d))
            .filter(|f| f != protected)
            .collect();
        let mut damages = Vec::new();
        for _ in 0..1 + rng.next_u64() % 3 {
            if files.is_empty() {
                break;
            }
            let file = files.swap_remove((rng.next_u64() % files.len() as u64) as usize);
            let len = fs::metadata(repo.join(&file)).unwrap().len();
            let damage = match rng.next_u64() % 3 {
                0 if len > 0 => Damage::Flip(file, (rng.next_u64() % len) as usize),
                1 if len > 0 => Damage::Truncate(file, rng.next_u64() % len),
                _ => Damage::Delete(file),
            };
            match &damage {
                Damage::Flip(f, at) => flip(&repo.join(f), *at),
                Damage::Truncate(f, to) => truncate(&repo.join(f), *to),
                Damage::Delete(f) => fs::remove_file(repo.join(f)).unwrap(),
            }
            damages.push(damage);
        }
        // Every damage but deleting a snapshot or a key file leaves a trace that reading all
        // data must find; a structure check need not see a flipped byte in a pack.
        let visible = |d: &Damage, read_data: bool| match d {
            Damage::Delete(f) => f.starts_with("data/") || f.starts_with("index/"),
            Damage::Flip(f, _) if f.starts_with("data/") => read_data,
            _ => true,
        };
        for read_data in [false, true] {
            let args: &[&str] = if read_data { &["--read-data"] } else { &[] };
            let s = check(&cairn, args);
            if damages.iter().any(|d| visible(d, read_data)) {
                assert!(s.n("errors") + s.n("notices") > 0, "round {round}: {damages:?} went unnoticed: {}", s.shown);
            }
        }
        fs::remove_dir_all(&repo).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// Index files that lie (FORMAT.md §18): a host holding the password can seal one.

/// How an added index file lies about the pack holding a kept snapshot's blobs.
#[derive(Clone, Copy, Debug)]
enum Lie {
    /// Lists that pack with no blobs (so nothing would be claimed in it).
    EmptyListing,
    /// Places every blob of that pack in a small pack of the liar's own, which no other index
    /// file lists (the fullest pack, where a plan claims them).
    OwnPack,
}

/// Adds a validly sealed index file that lies, as `lie` says, about `first_packs` (pack IDs).
fn plant_lie(fx: &Fixture, lie: Lie, first_packs: &BTreeSet<String>) {
    let (repo, _) = fx.cairn.open();
    let files = repo.index_files().unwrap();
    let mut listings = Vec::new();
    for (_, f) in files {
        listings.extend(f.unwrap().into_iter().filter(|p| first_packs.contains(&p.id.to_hex())));
    }
    assert!(!listings.is_empty(), "the first snapshot's packs are listed");
    let lying: Vec<library::index::IndexedPack> = match lie {
        Lie::EmptyListing => {
            listings.into_iter().map(|p| library::index::IndexedPack { blobs: Vec::new(), ..p }).collect()
        }
        Lie::OwnPack => {
            // A real pack of one random blob, written with its own honest index file.
            let mut rng = Rng(99);
            repo.write_pack(&[(BlobKind::Data, rng.bytes(1000))], Codec::None).unwrap();
            let (honest, own) = repo
                .index_files()
                .unwrap()
                .into_iter()
                .flat_map(|(name, f)| f.unwrap().into_iter().map(move |p| (name.clone(), p)))
                .find(|(_, p)| p.blobs.len() == 1 && p.blobs[0].raw_length == 1000)
                .expect("the liar's pack is indexed");
            // The liar stores its pack with the lying index file only (no honest listing of it
            // for a prune to compare with).
            fs::remove_file(fx.repo_file(&honest)).unwrap();
            let mut blobs = own.blobs.clone();
            blobs.extend(listings.iter().flat_map(|p| p.blobs.iter().map(|b| BlobEntry { offset: 0, ..*b })));
            vec![library::index::IndexedPack { blobs, ..own }]
        }
    };
    repo.save_index(&lying).unwrap();
}

#[test]
fn an_index_file_that_lies_never_makes_prune_delete_what_a_snapshot_needs() {
    for lie in [Lie::EmptyListing, Lie::OwnPack] {
        let (mut fx, first_scan) = Fixture::for_check_with_backup(3 * MIB as usize);
        let first = fx.cairn.snapshots()[0]["id"].as_str().expect("an ID").to_string();
        let first_packs: BTreeSet<String> = pack_names(fx.repo());
        // A second snapshot of other files, forgotten, so the prune has packs to delete; the
        // first is kept.
        fs::remove_dir_all(&fx.src).unwrap();
        make_files(&fx.src, 7, 2 * MIB as usize);
        fx.scan_source();
        fx.backup(&[]);
        let second = fx.snapshot.clone();
        plant_lie(&fx, lie, &first_packs);
        fx.cairn.ok(["forget", &second]);

        let out = fx.cairn.run(["prune"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Every pack the first snapshot needs is still there, whatever prune did.
        let after = pack_names(fx.repo());
        assert!(first_packs.is_subset(&after), "{lie:?}: prune deleted a pack the kept snapshot needs: {stderr}");
        if let Lie::OwnPack = lie {
            // The lie is found where it matters: before the copy it would replace is dropped.
            assert!(!out.status.success(), "{lie:?}: prune trusted the lie: {stderr}");
            assert!(stderr.contains("header does not list it"), "{lie:?}: {stderr}");
        }
        // The first snapshot restores exactly: the lie costs a retry, never a wrong byte (and a
        // warning naming the pack it placed blobs in).
        fx.before = first_scan;
        let target = fx.path(&format!("restored-{lie:?}"));
        let t = target.to_str().unwrap();
        let out = fx.cairn.run(["--json", "restore", &first, "--target", t, "--no-local-data"]);
        assert!(out.status.success(), "{lie:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(last_json(&String::from_utf8_lossy(&out.stdout))["failed"], 0, "{lie:?}");
        fx.assert_exact(&target);
        // A prune that went ahead wrote the index files anew from the packs' headers where they
        // disagreed: the lie is gone. One that refused left it: check names the index file,
        // and repair index (local: it may delete) removes it.
        if let Lie::OwnPack = lie {
            let check = fx.cairn.run(["check"]);
            assert_eq!(check.status.code(), Some(1), "{lie:?}");
            let said = String::from_utf8_lossy(&check.stdout).to_string() + &String::from_utf8_lossy(&check.stderr);
            assert!(said.contains("index/"), "{lie:?}: check does not name the index file: {said}");
            fx.cairn.ok(["repair", "index"]);
        }
        let check = fx.cairn.run(["check"]);
        assert!(check.status.success(), "{lie:?}: {}", String::from_utf8_lossy(&check.stdout));
        let out = fx.cairn.run(["prune"]);
        assert!(out.status.success(), "{lie:?}: {}", String::from_utf8_lossy(&out.stderr));
        let target = fx.path(&format!("after-repair-{lie:?}"));
        fx.cairn.restore_with(&first, &target, &["--no-local-data"]);
        fx.assert_exact(&target);
    }
}

/// The pack IDs (hex) in `data/` of the repository at `repo`.
fn pack_names(repo: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for dir in fs::read_dir(repo.join("data")).unwrap() {
        for f in fs::read_dir(dir.unwrap().path()).unwrap() {
            out.insert(f.unwrap().file_name().to_string_lossy().into_owned());
        }
    }
    out
}
