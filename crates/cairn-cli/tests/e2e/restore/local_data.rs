//! Restore uses the data already on this machine (issue #18, part 1): the real `cairn` binary
//! restores real trees elsewhere while the files they were backed up from still exist (some of
//! them changed), into targets whose files were renamed, moved or swapped, and with a source
//! file changed between the scan and the copy; and copies only chunks it verified. Local
//! repositories, and one on the real MinIO server to show the bytes fetched drop. Bytes
//! fetched are the restore's own JSON `bytes_fetched`.

use crate::support;
use crate::support::servers;

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::support::library::id::BlobId;
use crate::support::library::layout::pack_path;
use crate::support::library::pack::BlobKind;
use crate::support::library::tree::Chunk;
use serde_json::Value;
use support::{assert_same, last_json, num, read_noatime, restored_path, scan, scan_source, Fixture, Rng};

const KIB: usize = 1024;

/// Chunks of 16 KiB to 256 KiB (64 KiB on average) in 1 MiB packs: a few MiB span many chunks.
const SMALL_REPO: [&str; 4] = ["--chunk-sizes", "16384,65536,262144", "--pack-size", "1"];

/// Forty files of random content (incompressible) in three directories, 40–400 KiB each, plus
/// one of 3 MiB: about 10 MiB.
fn make_tree(src: &Path, seed: u64) -> Vec<PathBuf> {
    let mut rng = Rng(seed);
    let mut files = Vec::new();
    for i in 0..40 {
        let dir = src.join(["a", "a/b", "c"][i % 3]);
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("f{i:02}"));
        let len = 40 * KIB + (rng.next_u64() % (360 * KIB as u64)) as usize;
        fs::write(&path, rng.bytes(len)).unwrap();
        files.push(path);
    }
    let big = src.join("c/big");
    fs::write(&big, rng.bytes(3 * 1024 * KIB)).unwrap();
    files.push(big);
    files
}

/// Changes a tenth of `files` (one in ten) in three ways: a range overwritten in place, bytes
/// inserted near the start (the rest of the content shifts), or the whole content replaced.
fn change_a_tenth(files: &[PathBuf], seed: u64) -> Vec<PathBuf> {
    let mut rng = Rng(seed);
    let changed: Vec<PathBuf> = files.iter().step_by(10).cloned().collect();
    for (n, path) in changed.iter().enumerate() {
        let mut data = fs::read(path).unwrap();
        match n % 3 {
            0 => {
                let at = data.len() / 2;
                data[at..at + 4 * KIB].copy_from_slice(&rng.bytes(4 * KIB));
            }
            1 => {
                let insert = rng.bytes(10 * KIB);
                data.splice(1000..1000, insert);
            }
            _ => data = rng.bytes(data.len()),
        }
        fs::write(path, data).unwrap();
    }
    changed
}

/// `files` split into those whose number (`fNN`) is a multiple of `nth` (a file named
/// otherwise is not) and the rest.
fn every_nth(files: &[PathBuf], nth: usize) -> (Vec<PathBuf>, Vec<PathBuf>) {
    files.iter().cloned().partition(|f| {
        let n = f.file_name().unwrap().to_str().unwrap().trim_start_matches('f').parse::<usize>();
        n.is_ok_and(|n| n.is_multiple_of(nth))
    })
}

/// The modification time of `p` as `stat` prints it (read with `stat`, which leaves the access
/// time a restore sets alone).
fn mtime(p: &Path) -> String {
    let out = std::process::Command::new("stat").args(["-c", "%y"]).arg(p).output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

impl Fixture {
    /// Replaces each of `files` with new content of its size and backs the source up again;
    /// returns the snapshot's chunks the source no longer holds.
    fn replace(&self, files: &[PathBuf]) -> BTreeSet<BlobId> {
        let before = self.chunks_of(&self.snapshot);
        let mut rng = Rng(5);
        for f in files {
            fs::write(f, rng.bytes(fs::metadata(f).unwrap().len() as usize)).unwrap();
        }
        let now = self.cairn.backup(&[&self.src], &[])["snapshot_id"].as_str().unwrap().to_string();
        before.difference(&self.chunks_of(&now)).copied().collect()
    }

    /// The chunk of each of `files` (one each, as they are now), by its path relative to the
    /// source.
    fn file_chunks(&self, files: &[PathBuf]) -> Vec<(PathBuf, BlobId)> {
        let (repo, _) = self.cairn.open();
        files
            .iter()
            .map(|f| (f.strip_prefix(&self.src).unwrap().to_path_buf(), repo.key().blob_id(&read_noatime(f))))
            .collect()
    }

    /// Cuts short the pack that holds most of the chunks `chunks` (of the files they name; at
    /// least `at_least` of them in it), at the start of the middle one of them; returns the
    /// pack and the files whose chunk lay past the cut.
    fn cut_the_fullest_pack(&self, chunks: &[(PathBuf, BlobId)], at_least: usize) -> (String, BTreeSet<PathBuf>) {
        let (repo, _) = self.cairn.open();
        repo.load_index().unwrap();
        let located: Vec<(PathBuf, String, u64)> = chunks
            .iter()
            .map(|(file, id)| {
                let loc = repo.index().get(id).expect("every chunk is in the index");
                (file.clone(), pack_path(&loc.pack), u64::from(loc.entry.offset))
            })
            .collect();
        drop(repo);
        let count = |p: &String| located.iter().filter(|l| &l.1 == p).count();
        let pack = located.iter().map(|l| l.1.clone()).max_by_key(count).unwrap();
        let mut offsets: Vec<u64> = located.iter().filter(|l| l.1 == pack).map(|l| l.2).collect();
        offsets.sort_unstable();
        assert!(offsets.len() >= at_least, "{} of the files' chunks in one pack, not {at_least}", offsets.len());
        let cut = offsets[offsets.len() / 2];
        let lost = located.iter().filter(|l| l.1 == pack && l.2 >= cut).map(|l| l.0.clone()).collect();
        fs::OpenOptions::new().write(true).open(self.repo().join(&pack)).unwrap().set_len(cut).unwrap();
        (pack, lost)
    }

    /// The restore `run` into `target` failed with exit code 1, naming `pack` once for each of
    /// the files `lost` (relative to the source), and restored every other file exactly.
    fn assert_only_lost_failed(&self, run: &std::process::Output, target: &Path, pack: &str, lost: &BTreeSet<PathBuf>) {
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(1), "{stderr}");
        let failed = stderr.lines().filter(|l| l.contains(pack)).count();
        assert_eq!(failed, lost.len(), "one failed file for each chunk past the cut:\n{stderr}");
        let restored = scan(&self.restored(target));
        let mut expected = self.before.clone();
        expected.retain(|rel, _| !lost.contains(rel));
        assert_same(&expected, &restored, false);
    }

    /// Restores the snapshot into `target` beside the source with `env` set, which must
    /// succeed; returns its JSON output.
    fn restore_beside(&self, env: &[(&str, &str)], target: &Path) -> Vec<u8> {
        let run = self.cairn.run_env(env, ["--json", "restore", &self.snapshot, "--target", target.to_str().unwrap()]);
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
        run.stdout
    }

    /// The restore into `target` (its JSON in `stdout`) is exact and copied exactly the `kept`
    /// files' bytes from the source, and fetched the `replaced` chunks (at most 1.25 times
    /// their stored size).
    fn assert_copied_kept_fetched_replaced(
        &self,
        target: &Path,
        stdout: &[u8],
        kept: &[PathBuf],
        replaced: &BTreeSet<BlobId>,
    ) {
        self.assert_exact(target);
        let out = last_json(std::str::from_utf8(stdout).unwrap());
        assert_eq!(num(&out, "bytes_reused_source"), file_bytes(kept), "{out}");
        assert_eq!(num(&out, "bytes_reused_target"), 0, "{out}");
        let fetched = num(&out, "bytes_fetched");
        let stored = self.stored_size(replaced);
        assert!(
            fetched >= stored && fetched as f64 <= 1.25 * stored as f64,
            "{fetched} fetched, {stored} stored: {out}"
        );
        assert_eq!(num(&out, "bytes_written"), num(&out, "bytes_total"), "{out}");
    }

    /// A source tree of [`make_tree`] backed up into a fresh local repository (small chunks);
    /// also returns the tree's files.
    fn for_local_data() -> (Fixture, Vec<PathBuf>) {
        let mut files = Vec::new();
        let fx = Fixture::backed_up(|src| files = make_tree(src, 18), &SMALL_REPO, &[]);
        (fx, files)
    }

    /// `--json restore SNAPSHOT --target TARGET EXTRA...`, which must succeed; the summary.
    fn restore_snapshot(&self, target: &Path, extra: &[&str]) -> Value {
        self.cairn.restore_with(&self.snapshot, target, extra)
    }

    /// The data chunks of snapshot `id`.
    fn chunks_of(&self, id: &str) -> BTreeSet<BlobId> {
        let (repo, _) = self.cairn.open();
        repo.load_index().unwrap();
        let (_, snap) = repo.find_snapshot(id).unwrap();
        let mut out = BTreeSet::new();
        let mut trees = vec![snap.tree];
        while let Some(t) = trees.pop() {
            for node in repo.read_tree(&t).unwrap().nodes {
                trees.extend(node.subtree);
                out.extend(node.content.iter().filter_map(|c| match c {
                    Chunk::Data { id, .. } => Some(*id),
                    Chunk::Zero { .. } => None,
                }));
            }
        }
        out
    }

    /// The stored size of `chunks` (nonce, ciphertext and tag of each blob).
    fn stored_size(&self, chunks: &BTreeSet<BlobId>) -> u64 {
        let stored = self.cairn.stored_blobs();
        let size: u64 = stored.iter().filter(|b| chunks.contains(&b.id)).map(|b| u64::from(b.length)).sum();
        assert!(chunks.iter().all(|c| stored.iter().any(|b| b.id == *c)), "every chunk is stored");
        size
    }
}

fn file_bytes(files: &[PathBuf]) -> u64 {
    files.iter().map(|f| fs::metadata(f).unwrap().len()).sum()
}

/// Restoring elsewhere while the source exists with a tenth of its files changed fetches only
/// the chunks that changed (at most 1.2 times their stored size), copies the rest from the
/// source and restores the snapshot exactly; `--dry-run` reports the same without writing;
/// `--no-local-data` fetches everything.
#[test]
fn source_with_a_tenth_changed_fetches_only_the_changed_chunks() {
    let (env, files) = Fixture::for_local_data();
    let changed = change_a_tenth(&files, 7);
    // The chunks the source no longer holds: the snapshot's, less those of a backup of the
    // source as it is now.
    let now = env.cairn.backup(&[&env.src], &[])["snapshot_id"].as_str().unwrap().to_string();
    let gone: BTreeSet<BlobId> = env.chunks_of(&env.snapshot).difference(&env.chunks_of(&now)).copied().collect();
    assert!(!gone.is_empty());
    let gone_stored = env.stored_size(&gone);
    let total = file_bytes(&files);

    let dry_target = env.path("dry");
    let dry = last_json(&env.cairn.ok([
        "--json",
        "restore",
        &env.snapshot,
        "--target",
        dry_target.to_str().unwrap(),
        "--dry-run",
    ]));
    assert_eq!(dry["message_type"], "dry_run", "{dry}");
    assert!(!dry_target.exists(), "a dry run writes nothing");

    let target = env.path("elsewhere");
    let out = env.restore_snapshot(&target, &[]);
    env.assert_exact(&target);
    let fetched = num(&out, "bytes_fetched");
    assert!(fetched > 0, "the changed chunks are fetched: {out}");
    assert!(
        fetched as f64 <= 1.2 * gone_stored as f64,
        "fetched {fetched} bytes, the changed chunks are {gone_stored} stored: {out}"
    );
    let reused = num(&out, "bytes_reused_source");
    assert!(reused >= total - file_bytes(&changed), "{out}");
    assert_eq!(num(&out, "bytes_reused_target"), 0, "{out}");
    assert_eq!(num(&out, "bytes_written"), num(&out, "bytes_total"), "{out}");
    // The dry run found the same, and plans reads of the changed chunks. (It hashes the
    // changed files where the restore lets its copy find them; the copy's threads hand those
    // on in groups as timing makes them, read through other gaps, so the bytes the two read
    // are not compared: the dry run's were now and then the fewer.)
    assert_eq!(num(&dry, "bytes_reused_source"), reused, "{dry}");
    assert!(num(&dry, "bytes_to_fetch") > 0, "{dry}");

    // Without local data, everything is fetched.
    let all = env.restore_snapshot(&env.path("fetched"), &["--no-local-data"]);
    env.assert_exact(&env.path("fetched"));
    assert_eq!(num(&all, "bytes_reused_source") + num(&all, "bytes_reused_target"), 0, "{all}");
    assert!(num(&all, "bytes_fetched") >= env.stored_size(&env.chunks_of(&env.snapshot)), "{all}");
}

/// Whichever way the cost model chooses (forced with `CAIRN_LOCAL_COST`, as when the
/// repository is cheaper than the local files, or the local files cheaper than the
/// repository), the restore is exact and every byte verified: forced to the repository it reads
/// no local file and fetches everything; forced to local data it copies every chunk the source
/// still holds (the changed files' chunks fail verification at their old offsets and are
/// fetched) and fetches only what changed. Any other value of the variable is refused.
#[test]
fn the_cost_model_choice_either_way_restores_the_same_tree() {
    let (env, files) = Fixture::for_local_data();
    let changed = change_a_tenth(&files, 11);
    let total = file_bytes(&files);
    let all_stored = env.stored_size(&env.chunks_of(&env.snapshot));

    let repo_target = env.path("repository-cheaper");
    let fetch = env.cairn.clone().with_env("CAIRN_LOCAL_COST", "repository");
    let out = fetch.restore_with(&env.snapshot, &repo_target, &[]);
    env.assert_exact(&repo_target);
    assert_eq!(num(&out, "bytes_reused_source") + num(&out, "bytes_reused_target"), 0, "{out}");
    assert!(num(&out, "bytes_fetched") >= all_stored, "{out}");

    // Both exact against the snapshot (assert_exact): the same tree either way.
    let local_target = env.path("local-cheaper");
    let copy = env.cairn.clone().with_env("CAIRN_LOCAL_COST", "local");
    let out = copy.restore_with(&env.snapshot, &local_target, &[]);
    env.assert_exact(&local_target);
    assert!(num(&out, "bytes_reused_source") >= total - file_bytes(&changed), "{out}");
    assert!(num(&out, "bytes_fetched") > 0, "the changed chunks are fetched: {out}");
    assert!(num(&out, "bytes_fetched") < all_stored / 2, "{out}");
    assert_eq!(num(&out, "bytes_written"), num(&out, "bytes_total"), "{out}");

    // Any other value is refused in one line that names the variable.
    let bad = env.path("bad");
    let run = env.cairn.run_env(
        &[("CAIRN_LOCAL_COST", "cheap")],
        ["restore", env.snapshot.as_str(), "--target", bad.to_str().unwrap()],
    );
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success() && run.status.code() != Some(101), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("cairn: CAIRN_LOCAL_COST") && stderr.contains("`repository`"), "{stderr}");
}

/// Renaming and moving files in a restored target (within a directory, into a new directory,
/// a whole directory, two files swapped) and restoring again fetches nothing: every chunk is
/// copied from the target's own files, verified. With `--delete` the target is then exact.
#[test]
fn renamed_and_moved_files_in_the_target_cost_no_fetch() {
    let (env, _) = Fixture::for_local_data();
    let target = env.path("t");
    let first = env.restore_snapshot(&target, &["--no-local-data"]);
    assert!(num(&first, "bytes_fetched") > 0);
    // The source is gone: only the target holds the data.
    fs::remove_dir_all(&env.src).unwrap();
    let root = restored_path(&target, &env.src);
    fs::rename(root.join("a/f00"), root.join("a/renamed")).unwrap();
    fs::create_dir(root.join("new")).unwrap();
    fs::rename(root.join("c/big"), root.join("new/big-moved")).unwrap();
    fs::rename(root.join("a/b"), root.join("b-renamed")).unwrap();
    fs::rename(root.join("c/f02"), root.join("tmp")).unwrap();
    fs::rename(root.join("c/f05"), root.join("c/f02")).unwrap();
    fs::rename(root.join("tmp"), root.join("c/f05")).unwrap();

    let again = env.restore_snapshot(&target, &["--delete"]);
    env.assert_exact(&target);
    assert_eq!(num(&again, "bytes_fetched"), 0, "{again}");
    assert_eq!(num(&again, "bytes_reused_source"), 0, "{again}");
    assert!(num(&again, "bytes_reused_target") >= 3 * 1024 * KIB as u64, "{again}");
}

/// A source file changed after the scan found its chunks (through the test hook between the
/// scan and the copy) is not trusted: the changed chunk fails verification and is fetched, and
/// the restore is exact.
#[test]
fn a_source_file_changed_during_the_restore_is_not_trusted() {
    let (env, files) = Fixture::for_local_data();
    let victim = &files[40]; // c/big, 3 MiB: many chunks
    let cmd = format!(
        "printf 'changed after the scan' | dd of='{}' bs=1 seek=1000000 conv=notrunc 2>/dev/null",
        victim.display()
    );
    let target = env.path("t");
    let stdout = env.restore_beside(&[("CAIRN_TEST_LOCAL_SCANNED_HOOK", &cmd)], &target);
    let out = last_json(&String::from_utf8(stdout).unwrap());
    assert_eq!(out["failed"], 0, "{out}");
    assert_ne!(read_noatime(victim), read_noatime(&restored_path(&target, victim)), "the hook ran");
    env.assert_exact(&target);
    let total = file_bytes(&files);
    let reused = num(&out, "bytes_reused_source");
    let fetched = num(&out, "bytes_fetched");
    // Exactly the chunk the hook changed was fetched: one chunk of at most 256 KiB.
    assert!(fetched > 0 && fetched <= 300 * KIB as u64, "{out}");
    assert!(reused < total && reused >= total - 256 * KIB as u64, "{out}");
}

/// With a repository a round trip away (`CAIRN_INJECT_FAULTS=latency=5ms`), the scan finds the
/// changed files of more than one chunk first and their reads are planned; and the copy runs
/// beside those fetches, not before them: with every other source file replaced (same size,
/// new content: its chunks are all fetched) and the rest unchanged (all copied), the test hook
/// the copy runs as it starts waits for the largest replaced file (over 256 KiB, the largest
/// chunk: more than one chunk, whatever the repository's chunker key) to be restored whole
/// from the repository (its modification time is set by its last write), which a copy run
/// before the fetches would wait for in vain (the hook gives up after 20 s and says so). The
/// summary then says what each side moved: exactly the unchanged files' bytes copied, the
/// replaced files' chunks fetched; and the tree is exact.
#[test]
fn with_a_remote_repository_the_copy_runs_beside_the_planned_fetches() {
    let (env, files) = Fixture::for_local_data();
    let (replaced, kept) = every_nth(&files, 2);
    let witness = replaced.iter().max_by_key(|f| fs::metadata(f).unwrap().len()).unwrap();
    assert!(fs::metadata(witness).unwrap().len() > 256 * KIB as u64);
    // Its time as backed up: the restore sets it once the file is whole.
    let backed_up = mtime(witness);
    let replaced_chunks = env.replace(&replaced);

    let target = env.path("t");
    let marker = env.path("marker");
    let hook = format!(
        "for i in $(seq 200); do if [ \"$(stat -c %y '{}' 2>/dev/null)\" = '{backed_up}' ]; then \
         echo seen > '{m}'; exit 0; fi; sleep 0.1; done; echo timeout > '{m}'",
        restored_path(&target, witness).display(),
        m = marker.display()
    );
    let stdout = env
        .restore_beside(&[("CAIRN_TEST_LOCAL_SCANNED_HOOK", &hook), ("CAIRN_INJECT_FAULTS", "latency=5ms")], &target);
    assert_eq!(fs::read_to_string(&marker).unwrap().trim(), "seen", "a fetched file was done before the copy began");
    env.assert_copied_kept_fetched_replaced(&target, &stdout, &kept, &replaced_chunks);
}

/// 1,200 files of 4 to 7 KiB (random bytes from `seed`) backed up into a fresh local
/// repository (small chunks); also returns the files.
fn small_files(seed: u64) -> (Fixture, Vec<PathBuf>) {
    let mut files = Vec::new();
    let make = |src: &Path| {
        let mut rng = Rng(seed);
        for i in 0..1200 {
            let path = src.join(format!("f{i:03}"));
            fs::write(&path, rng.bytes(4 * KIB + (i % 7) * 512)).unwrap();
            files.push(path);
        }
    };
    let env = Fixture::backed_up(make, &SMALL_REPO, &[]);
    (env, files)
}

/// Many small reads are in flight on few fetch threads (read/fetch.rs): 1,200 files of a few
/// KiB, every other one replaced, restored beside the source at 100 ms per request. The
/// replaced files' 600 chunks lie between kept ones (which are copied); reads pass through
/// some of those gaps (within a share of the bytes fetched), which leaves a few hundred reads,
/// well over the most fetch threads a restore starts (64), that the round trip wants all in
/// flight at once (with 300 files they were about 70, too close to 64 to say anything). The
/// restore's summary says it had more reads in flight than it started fetch
/// threads (a thread a read, as before, never does) and no more threads than cores (the reads
/// wait on the I/O runtime, not on a thread), and what each side moved; the tree is exact.
#[test]
fn many_small_reads_are_in_flight_on_few_fetch_threads() {
    let (env, files) = small_files(21);
    let (replaced, kept) = every_nth(&files, 2);
    let replaced_chunks = env.replace(&replaced);
    let target = env.path("t");
    let stdout = env.restore_beside(&[("CAIRN_INJECT_FAULTS", "latency=100ms")], &target);
    env.assert_copied_kept_fetched_replaced(&target, &stdout, &kept, &replaced_chunks);
    let out = last_json(std::str::from_utf8(&stdout).unwrap());
    let (threads, peak) = (num(&out, "fetch_threads"), num(&out, "fetch_in_flight_peak"));
    // Across a far link (100 ms) a thread per core carries every read in flight.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    assert!((1..=cores.min(64)).contains(&threads), "at most a fetch thread per core ({cores}): {out}");
    assert!(peak > threads, "more reads in flight than fetch threads: {peak} on {threads}: {out}");
}

/// From a local repository the chunks whose copy failed are read without the copied chunks
/// between them: 1,200 files of a few KiB (a chunk each), every tenth replaced, restored beside
/// the source with every range copied (`CAIRN_LOCAL_COST=local`), so that the copy finds the
/// 120 changed chunks, each between nine copied ones in its pack. They are fetched without the
/// copied chunks between them, at most 1.25 times their stored size; read through the gaps
/// between them, as they were, every pack was read whole (about ten times that).
#[test]
fn from_a_local_repository_the_changed_chunks_are_read_without_the_copied_ones() {
    let (env, files) = small_files(38);
    let (replaced, kept) = every_nth(&files, 10);
    let replaced_chunks = env.replace(&replaced);
    assert_eq!(replaced_chunks.len(), replaced.len());
    let target = env.path("t");
    let stdout = env.restore_beside(&[("CAIRN_LOCAL_COST", "local")], &target);
    env.assert_copied_kept_fetched_replaced(&target, &stdout, &kept, &replaced_chunks);
}

/// A read of several ranges (the changed chunks of one pack, joined: `read::join_parts`) that
/// fails loses only the blobs of its ranges that fail when read on their own: 1,200 small
/// files, every other one replaced, restored beside the source at 5 ms a request, with the
/// pack holding most of the replaced files' chunks cut short at the start of the middle one of
/// them. Exactly the replaced files whose chunk lay past the cut fail, each named; every other
/// file (the replaced ones whose chunks lie before the cut in the same pack, read in the same
/// joined reads, included) is restored exactly.
#[test]
fn a_joined_read_that_fails_loses_only_the_blobs_past_the_damage() {
    let (env, files) = small_files(23);
    let (replaced, _) = every_nth(&files, 2);
    // The chunks the snapshot restored holds and the source no longer does, a file each.
    let old = env.file_chunks(&replaced);
    assert_eq!(env.replace(&replaced), old.iter().map(|c| c.1).collect(), "a chunk a replaced file");
    let (pack, lost) = env.cut_the_fullest_pack(&old, 8);
    let target = env.path("t");
    let run = env.cairn.run_env(
        &[("CAIRN_INJECT_FAULTS", "latency=5ms")],
        ["restore", &env.snapshot, "--target", target.to_str().unwrap()],
    );
    env.assert_only_lost_failed(&run, &target, &pack, &lost);
}

/// A single read through the gaps between blobs that a pack cut short ends in the middle of
/// loses only the blobs past the cut: 1,200 small files (a chunk each, about 180 to a 1 MiB
/// pack), restored from the repository (`--no-local-data`: every blob of a pack wanted, read
/// in one range), with the pack holding most of them cut at the start of its middle file's
/// chunk. Exactly the files whose chunk lay past the cut fail, each named; the ones before it,
/// in the same read, are restored exactly.
#[test]
fn a_read_cut_short_loses_only_the_blobs_past_the_cut() {
    let (env, files) = small_files(29);
    let (pack, lost) = env.cut_the_fullest_pack(&env.file_chunks(&files), 100);
    let target = env.path("t");
    let run = env.cairn.run(["restore", &env.snapshot, "--no-local-data", "--target", target.to_str().unwrap()]);
    env.assert_only_lost_failed(&run, &target, &pack, &lost);
}

/// With a local repository the scan looks at no source file, and the copy's failed chunks
/// are fetched while it goes on, not after it: with every other
/// source file replaced (same size, new content: the copy finds each chunk changed) and the
/// rest unchanged (all copied), and every write into the target made to wait 100 ms
/// (`CAIRN_INJECT_WRITE_LATENCY`, so the copy of the unchanged 3 MiB file's chunks, one
/// thread's piece, takes seconds), a watcher started by the test hook the copy runs as it
/// starts sees a replaced file restored whole from the repository (its modification time is
/// set by its last write) while the large file is not yet; a copy that handed its failures on
/// only at its end would finish the large file first. The summary then says what each side
/// moved: exactly the unchanged files' bytes copied, the replaced files' chunks fetched; and
/// the tree is exact.
#[test]
fn the_changed_chunks_are_fetched_while_the_copy_goes_on() {
    let (env, files) = Fixture::for_local_data();
    let (replaced, kept) = every_nth(&files, 2);
    let witness = &replaced[0];
    let big = kept.iter().find(|f| f.ends_with("c/big")).expect("the large file is kept");
    // Their times as backed up: the restore sets each once its file is whole.
    let (witness_time, big_time) = (mtime(witness), mtime(big));
    let replaced_chunks = env.replace(&replaced);

    let target = env.path("t");
    let marker = env.path("marker");
    // In the background, so the copy goes on: once the witness is whole, whether the large
    // file is too.
    let hook = format!(
        "( for i in $(seq 600); do if [ \"$(stat -c %y '{w}' 2>/dev/null)\" = '{witness_time}' ]; then \
         if [ \"$(stat -c %y '{b}' 2>/dev/null)\" = '{big_time}' ]; then echo after > '{m}'; \
         else echo during > '{m}'; fi; exit 0; fi; sleep 0.05; done; echo timeout > '{m}' ) \
         >/dev/null 2>&1 &",
        w = restored_path(&target, witness).display(),
        b = restored_path(&target, big).display(),
        m = marker.display()
    );
    let stdout = env
        .restore_beside(&[("CAIRN_TEST_LOCAL_SCANNED_HOOK", &hook), ("CAIRN_INJECT_WRITE_LATENCY", "100ms")], &target);
    let seen = (0..100)
        .find_map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(50));
            fs::read_to_string(&marker).ok().filter(|m| m.ends_with('\n'))
        })
        .unwrap_or_default();
    assert_eq!(seen.trim(), "during", "a replaced file was fetched only after the copy was over");
    env.assert_copied_kept_fetched_replaced(&target, &stdout, &kept, &replaced_chunks);
}

/// Symlinks below the source path are never followed: a directory and a file of the source
/// replaced by symlinks to identical copies elsewhere are not read, their chunks are fetched.
#[test]
fn symlinks_in_the_source_are_not_followed() {
    let (env, _) = Fixture::for_local_data();
    let outside = env.path("outside");
    fs::create_dir(&outside).unwrap();
    fs::rename(env.src.join("a/b"), outside.join("b")).unwrap();
    std::os::unix::fs::symlink(outside.join("b"), env.src.join("a/b")).unwrap();
    fs::rename(env.src.join("c/big"), outside.join("big")).unwrap();
    std::os::unix::fs::symlink(outside.join("big"), env.src.join("c/big")).unwrap();
    let hidden_len: u64 = env
        .before
        .iter()
        .filter(|(p, _)| p.starts_with("a/b") || p.as_path() == Path::new("c/big"))
        .map(|(_, m)| if m.kind == support::Kind::File { m.size } else { 0 })
        .sum();
    assert!(hidden_len > 3 * 1024 * KIB as u64);

    let target = env.path("t");
    let out = env.restore_snapshot(&target, &[]);
    env.assert_exact(&target);
    assert_eq!(num(&out, "bytes_reused_source"), file_bytes_before(&env) - hidden_len, "{out}");
    assert!(num(&out, "bytes_fetched") >= hidden_len, "{out}");
}

fn file_bytes_before(env: &Fixture) -> u64 {
    env.before.values().filter(|m| m.kind == support::Kind::File).map(|m| m.size).sum()
}

/// Restoring into the source itself reads no "source" copies (the compare stage fixes what
/// differs); `--use-source=PATH` reads the originals from another place (a single file too);
/// and `--use-source` with `--no-local-data` is refused.
#[test]
fn in_place_restores_and_other_source_paths() {
    let (env, files) = Fixture::for_local_data();
    // Elsewhere: a copy of the source stands for the original paths.
    let copy = env.path("copy");
    fs::rename(&env.src, &copy).unwrap();
    let target = env.path("t");
    let spec = format!("--use-source={}", copy.display());
    let dir_spec = format!("{}:{}", env.snapshot, env.src.display());
    let out = env.cairn.restore_with(&dir_spec, &target, &[&spec]);
    assert_same(&env.before, &scan(&target), false);
    assert_eq!(num(&out, "bytes_fetched"), 0, "{out}");
    assert_eq!(num(&out, "bytes_reused_source"), file_bytes_before(&env), "{out}");
    // A single file, its original standing elsewhere under another name.
    fs::rename(copy.join("c/f02"), env.path("f02-elsewhere")).unwrap();
    let single = env.path("single");
    let file_spec = format!("{}:{}", env.snapshot, env.src.join("c/f02").display());
    let spec = format!("--use-source={}", env.path("f02-elsewhere").display());
    let out = env.cairn.restore_with(&file_spec, &single, &[&spec]);
    assert_eq!(num(&out, "bytes_fetched"), 0, "{out}");
    assert_eq!(fs::read(single.join("f02")).unwrap(), fs::read(env.path("f02-elsewhere")).unwrap());

    // In place: the source is the target.
    fs::rename(&copy, &env.src).unwrap();
    fs::rename(env.path("f02-elsewhere"), env.src.join("c/f02")).unwrap();
    let f = fs::OpenOptions::new().write(true).open(&files[3]).unwrap();
    f.write_all_at(b"damage", 100).unwrap();
    let out = env.cairn.restore_with(&dir_spec, &env.src, &[]);
    assert_same(&env.before, &scan(&env.src), false);
    assert_eq!(num(&out, "bytes_reused_source"), 0, "{out}");
    assert!(num(&out, "bytes_fetched") > 0, "{out}");

    let refused = env.cairn.run(["restore", "latest", "--target", "x", "--use-source", "--no-local-data"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("cannot be used with"));
}

/// On S3 (MinIO): with the source present and a tenth of it changed, a restore elsewhere
/// fetches about what changed, not the whole tree.
#[test]
fn s3_restore_with_the_source_present_fetches_only_what_changed() {
    let fx = Fixture::new();
    let base = &fx.base;
    let src = base.as_path().join("src");
    let files = make_tree(&src, 81);
    let before = scan_source(&src);
    let cairn = servers::cairn(&servers::s3_repo("localdata"), &base.as_path().join("cache"));
    cairn.init(&SMALL_REPO);
    cairn.backup(&[&src], &[]);
    let changed = change_a_tenth(&files, 3);
    let target = base.as_path().join("t");
    let out = cairn.restore("latest", &target);
    assert_same(&before, &scan(&restored_path(&target, &src)), true);
    let everything = cairn.restore_with("latest", &base.as_path().join("all"), &["--no-local-data"]);
    let fetched = num(&out, "bytes_fetched");
    // Random content: a changed file's chunks are stored at their size plus 28 bytes each.
    assert!(fetched > 0 && fetched as f64 <= 1.2 * file_bytes(&changed) as f64, "{out}");
    assert!(num(&everything, "bytes_fetched") >= num(&everything, "bytes_total"), "{everything}");
    assert!(fetched * 5 < num(&everything, "bytes_fetched"), "{out} {everything}");
}

/// A pack lost from the repository costs nothing while the source still holds its chunks: the
/// restore copies them, verified, and is exact; without local data the files needing the pack
/// fail, named.
#[test]
fn a_lost_pack_is_replaced_by_the_source() {
    let (env, _) = Fixture::for_local_data();
    let packs: Vec<String> =
        env.cairn.stored_blobs().iter().filter(|b| b.kind == BlobKind::Data).map(|b| b.pack.clone()).collect();
    let lost = &packs[packs.len() / 2];
    fs::remove_file(env.path("repo").join(lost)).unwrap();
    let out = env.restore_snapshot(&env.path("t"), &[]);
    env.assert_exact(&env.path("t"));
    assert_eq!(num(&out, "bytes_reused_source"), file_bytes_before(&env), "{out}");
    let run =
        env.cairn.run(["restore", &env.snapshot, "--target", env.path("t2").to_str().unwrap(), "--no-local-data"]);
    assert_eq!(run.status.code(), Some(1), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(
        String::from_utf8_lossy(&run.stderr).contains("does not exist"),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// A source file that is one chunk, all of it, is copied without its status being taken, from
/// a local repository and from a remote one alike (`local::scan::is_one_chunk`): its chunk is
/// read at offset 0 and verified, whatever is at its path now. Of 40 files of 3 KiB (one chunk
/// each: the smallest chunk is 16 KiB), one is now a FIFO (which must neither block the open
/// nor be read), one a directory, one holds other bytes under its old size and time (which a
/// status would have passed), and one has grown (its chunk is still its first 3 KiB, copied):
/// the first three are fetched, the other 37 copied, and the tree is exact.
#[test]
fn one_chunk_files_are_copied_unlooked_and_whatever_replaced_them_is_fetched() {
    let mut files = Vec::new();
    let env = Fixture::backed_up(
        |src| {
            let mut rng = Rng(40);
            fs::create_dir(src.join("s")).unwrap();
            for i in 0..40 {
                let path = src.join(format!("s/f{i:02}"));
                fs::write(&path, rng.bytes(3 * KIB)).unwrap();
                files.push(path);
            }
        },
        &SMALL_REPO,
        &[],
    );
    let [fifo, dir, same_size, grown] = [0, 1, 2, 3].map(|i| files[i].clone());
    fs::remove_file(&fifo).unwrap();
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    fs::remove_file(&dir).unwrap();
    fs::create_dir(&dir).unwrap();
    let was = mtime(&same_size);
    fs::write(&same_size, Rng(41).bytes(3 * KIB)).unwrap();
    let touched = std::process::Command::new("touch").arg("-d").arg(&was).arg(&same_size).status().unwrap();
    assert!(touched.success() && mtime(&same_size) == was);
    let mut longer = fs::read(&grown).unwrap();
    longer.extend_from_slice(b"appended since the backup");
    fs::write(&grown, longer).unwrap();

    for (name, faults) in [("local", ""), ("remote", "latency=5ms")] {
        let target = env.path(name);
        let run = env.cairn.run_env(
            &[("CAIRN_INJECT_FAULTS", faults)],
            ["--json", "restore", &env.snapshot, "--target", target.to_str().unwrap()],
        );
        assert!(run.status.success(), "{name}: {}", String::from_utf8_lossy(&run.stderr));
        env.assert_exact(&target);
        let out = last_json(&String::from_utf8(run.stdout).unwrap());
        assert_eq!(out["failed"], 0, "{name}: {out}");
        assert_eq!(num(&out, "bytes_reused_source"), 37 * 3 * KIB as u64, "{name}: {out}");
        assert!(num(&out, "bytes_fetched") >= 3 * 3 * KIB as u64, "{name}: {out}");
        assert_eq!(num(&out, "bytes_written"), num(&out, "bytes_total"), "{name}: {out}");
    }
}
