//! `cairn copy` end to end, on real repositories: local → MinIO (S3) → local restores exactly,
//! a second copy transfers nothing, a copy killed with SIGKILL and run again completes,
//! copies between repositories with the same and with different blob-ID keys, filters, SFTP, and
//! one-line errors for bad input.

use crate::support;
use crate::support::servers;

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;
use support::{last_json, num, Cairn, Fixture, Rng, Tree};

/// Small chunks and packs, so a few MiB make many blobs and packs.
const INIT: [&str; 4] = ["--chunk-sizes", "65536,131072,524288", "--pack-size", "1"];

/// The source's password (the destinations use [`support::PASSWORD`]).
const SOURCE_PASSWORD: &str = "source password";

/// A tree of small files, files of many chunks, a symlink, a hard link and an empty directory.
fn make_tree(root: &Path, seed: u64) {
    let mut t = Tree::new(root, seed);
    t.dir("a/b").dir("empty");
    for (i, size) in [0usize, 1, 4095, 70_000].into_iter().enumerate() {
        t.random(&format!("a/small-{i}"), size);
    }
    t.random("a/b/big", 3 << 20)
        // Compressible: its blobs are stored compressed, and copied so.
        .file("a/text", "the same line again\n".repeat(100_000))
        .hard_link("a/small-3", "a/b/link")
        .symlink("b/big", "a/to-big");
}

impl Fixture {
    /// A source repository (local, `base/source`, [`SOURCE_PASSWORD`]) with two snapshots of a
    /// changing tree; `before` is the tree as the last backup saw it.
    fn copy_source() -> Fixture {
        let mut fx = Fixture::new();
        fx.cairn = Cairn::new(&fx.path("source"), SOURCE_PASSWORD);
        make_tree(&fx.src, 1);
        fx.cairn.init(&INIT);
        fx.cairn.backup(&[&fx.src], &["--tag", "first"]);
        fs::write(fx.src.join("a/b/new"), Rng(2).bytes(1 << 20)).unwrap();
        fs::remove_file(fx.src.join("a/small-1")).unwrap();
        fx.scan_source();
        fx.cairn.backup(&[&fx.src], &["--tag", "second"]);
        fx
    }

    fn source_location(&self) -> String {
        self.cairn.repo.to_string_lossy().into_owned()
    }

    /// Restores `latest` of `cairn` and compares it with the tree of the last backup.
    fn restores_exactly(&self, cairn: &Cairn, name: &str) {
        let target = self.path(name);
        cairn.restore("latest", &target);
        self.assert_exact(&target);
    }
}

/// `cairn -r DST --json copy --from-repo FROM ARGS` with the source password `from_password`;
/// must succeed; returns the summary.
fn copy(dst: &Cairn, from: &str, from_password: &str, args: &[&str]) -> Value {
    let mut all = vec!["--json", "copy", "--from-repo", from];
    all.extend(args);
    let out = dst.clone().with_env("CAIRN_FROM_PASSWORD", from_password).ok(all);
    let summary = last_json(&out);
    assert_eq!(summary["message_type"], "summary", "{summary}");
    summary
}

/// `init --copy-chunker-params --from-repo FROM`.
fn init_like(dst: &Cairn, from: &str, from_password: &str) {
    let mut args = vec!["init"];
    args.extend(support::KDF_ARGS);
    args.extend(["--copy-chunker-params", "--from-repo", from]);
    dst.clone().with_env("CAIRN_FROM_PASSWORD", from_password).ok(args);
}

/// Every file below `dir` except locks, relative to it: what a repository holds.
fn listing(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = support::files_under(dir)
        .iter()
        .map(|p| p.strip_prefix(dir).unwrap().to_string_lossy().into_owned())
        .filter(|rel| !rel.starts_with("locks"))
        .collect();
    out.sort();
    out
}

/// Where MinIO keeps the objects of the S3 repository `location`.
fn minio_dir(location: &str) -> PathBuf {
    let prefix = location.rsplit('/').next().unwrap();
    servers::servers().dir.join("minio").join(servers::BUCKET).join(prefix)
}

#[test]
fn local_to_minio_to_local_restores_exactly_and_a_second_copy_transfers_nothing() {
    let fx = Fixture::copy_source();
    let cache = fx.base.join("cache");
    // Local → MinIO, into a repository that shares the source's blob IDs.
    let s3 = servers::cairn(&servers::s3_repo("copy"), &cache);
    init_like(&s3, &fx.source_location(), SOURCE_PASSWORD);
    let first = copy(&s3, &fx.source_location(), SOURCE_PASSWORD, &[]);
    assert_eq!((num(&first, "snapshots_copied"), num(&first, "snapshots_skipped")), (2, 0), "{first}");
    assert_eq!(first["same_ids"], true, "{first}");
    assert!(num(&first, "bytes_written") > 4 << 20, "{first}");
    assert_eq!(num(&first, "blobs_written"), num(&first, "blobs_needed"), "{first}");
    fx.restores_exactly(&s3, "from-s3");

    // Again: nothing is transferred and no snapshot is added.
    let s3_dir = minio_dir(&s3.repo.to_string_lossy());
    let before = listing(&s3_dir);
    assert!(before.iter().any(|p| p.starts_with("data/")), "MinIO holds no packs: {before:?}");
    let again = copy(&s3, &fx.source_location(), SOURCE_PASSWORD, &[]);
    assert_eq!((num(&again, "snapshots_copied"), num(&again, "snapshots_skipped")), (0, 2), "{again}");
    assert_eq!((num(&again, "bytes_read"), num(&again, "bytes_written")), (0, 0), "{again}");
    assert_eq!(listing(&s3_dir), before, "the second copy changed the repository");
    assert_eq!(s3.snapshots().len(), 2);

    // MinIO → local, into an unrelated repository (other blob IDs): trees are rewritten.
    let local = fx.other_repo("back");
    local.init(&INIT);
    let s3_location = s3.repo.to_string_lossy().into_owned();
    let back = copy(&local.clone().with_envs(&s3), &s3_location, support::PASSWORD, &[]);
    assert_eq!(num(&back, "snapshots_copied"), 2, "{back}");
    assert_eq!(back["same_ids"], false, "{back}");
    fx.restores_exactly(&local, "from-local");
    // The copy of a copy records the first snapshot as its original: copying from the source
    // directly now adds nothing either.
    let direct = copy(&local, &fx.source_location(), SOURCE_PASSWORD, &[]);
    assert_eq!((num(&direct, "snapshots_copied"), num(&direct, "bytes_written")), (0, 0), "{direct}");
    let sources = |v: &Value, list: &str| -> Vec<String> {
        v[list].as_array().unwrap().iter().map(|c| c["source"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(sources(&direct, "skipped"), sources(&first, "copied"), "{direct}");
    assert_eq!(local.snapshots().len(), 2);
    check_clean(&local);
    check_clean(&s3);
}

/// `check --read-data` finds no errors.
fn check_clean(cairn: &Cairn) {
    let out = cairn.run(["--json", "check", "--read-data"]);
    let s = last_json(&String::from_utf8_lossy(&out.stdout));
    assert!(out.status.success(), "check failed: {s} {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(s["errors"], 0, "{s}");
}

#[test]
fn different_ids_restore_exactly_and_same_ids_deduplicate_against_the_destinations_backups() {
    let fx = Fixture::copy_source();
    // A destination made with --copy-chunker-params: a backup of the same tree there, reading
    // every file (--force), stores (almost) nothing new.
    let like = fx.other_repo("like");
    init_like(&like, &fx.source_location(), SOURCE_PASSWORD);
    let c = copy(&like, &fx.source_location(), SOURCE_PASSWORD, &[]);
    assert_eq!(c["same_ids"], true, "{c}");
    let b = like.backup(&[&fx.src], &["--force"]);
    assert!(num(&b, "bytes_added") < 64 * 1024, "a backup after the copy added {b}");

    // An unrelated destination: the copy restores exactly, but its data does not deduplicate
    // against the destination's own backups (other chunk boundaries, other IDs).
    let other = fx.other_repo("other");
    other.init(&INIT);
    let c = copy(&other, &fx.source_location(), SOURCE_PASSWORD, &[]);
    assert_eq!((c["same_ids"].clone(), num(&c, "snapshots_copied")), (Value::Bool(false), 2), "{c}");
    fx.restores_exactly(&other, "other");
    // Blob IDs are renamed, not copied: the copied trees name blobs the destination holds.
    check_clean(&other);
    let b = other.backup(&[&fx.src], &["--force"]);
    assert!(num(&b, "bytes_added") > 2 << 20, "unrelated chunking deduplicated anyway: {b}");
    // An incremental copy into an unrelated repository reads only what the earlier copy of its
    // parent does not name: the new file, not the whole snapshot again.
    let step = fx.other_repo("step");
    step.init(&INIT);
    let ids: Vec<String> = fx.cairn.snapshots().iter().map(|s| s["id"].as_str().unwrap().to_string()).collect();
    let one = copy(&step, &fx.source_location(), SOURCE_PASSWORD, &[&ids[0]]);
    let two = copy(&step, &fx.source_location(), SOURCE_PASSWORD, &[&ids[1]]);
    assert_eq!((num(&one, "snapshots_copied"), num(&two, "snapshots_copied")), (1, 1), "{one} {two}");
    assert!(num(&two, "blobs_known") > 0, "{two}");
    assert!(num(&two, "bytes_read") < num(&one, "bytes_read") / 2, "read everything again: {one} {two}");
    assert!(num(&two, "bytes_read") >= 1 << 20, "the new file was not read: {two}");
    fx.restores_exactly(&step, "step");
    check_clean(&step);
    // Copying again into either transfers nothing.
    for d in [&like, &other] {
        let again = copy(d, &fx.source_location(), SOURCE_PASSWORD, &[]);
        assert_eq!((num(&again, "snapshots_copied"), num(&again, "bytes_written")), (0, 0), "{again}");
    }
}

/// The moments a copy is killed at: a fault stall holds it at one request, then SIGKILL.
const KILL_POINTS: [(&str, &str); 3] = [
    ("while storing packs", "stall-write=data/"),
    ("while writing an index file", "stall-write=index/"),
    ("before writing the snapshots", "stall-write=snapshots/"),
];

#[test]
fn a_copy_killed_at_any_step_completes_when_run_again() {
    let fx = Fixture::copy_source();
    for (i, (moment, fault)) in KILL_POINTS.iter().enumerate() {
        for like_source in [false, true] {
            let dst = fx.other_repo(&format!("killed-{i}-{like_source}"));
            if like_source {
                init_like(&dst, &fx.source_location(), SOURCE_PASSWORD);
            } else {
                dst.init(&INIT);
            }
            let stalled = fx.base.join(format!("stalled-{i}-{like_source}"));
            let spec = format!("{fault},stall-for=120s,stalled={}", stalled.display());
            let mut child = dst.spawn(
                &[("CAIRN_INJECT_FAULTS", &spec), ("CAIRN_FROM_PASSWORD", SOURCE_PASSWORD)],
                &["--json", "copy", "--from-repo", &fx.source_location(), "--max-memory", "128M"],
            );
            // Let it reach the stall (it stalls for two minutes there, and says when it begins).
            if !support::wait_for_stall(&mut child, &stalled) {
                let out = child.wait_with_output().unwrap();
                panic!("{moment}: the copy ended before it was killed: {}", String::from_utf8_lossy(&out.stderr));
            }
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
            assert!(dst.snapshots().is_empty(), "{moment}: a snapshot was written before the kill");
            // The killed copy's locks are stale (its process is gone); `cairn unlock` removes
            // them, as a user would (else the next copy warns that it ignores them).
            dst.ok(["unlock"]);
            fx.cairn.ok(["unlock"]);
            let again = copy(&dst, &fx.source_location(), SOURCE_PASSWORD, &[]);
            assert_eq!(num(&again, "snapshots_copied"), 2, "{moment}: {again}");
            if *fault == "stall-write=snapshots/" && like_source {
                // Every pack was stored and indexed before the kill: nothing is transferred again.
                assert_eq!(num(&again, "bytes_written"), 0, "{moment}: {again}");
            }
            fx.restores_exactly(&dst, &format!("killed-{i}-{like_source}-restore"));
            check_clean(&dst);
        }
    }
}

#[test]
fn filters_and_ids_choose_the_snapshots_copied() {
    let fx = Fixture::copy_source();
    let other_tree = fx.base.join("other");
    make_tree(&other_tree, 9);
    fx.cairn.backup(&[&other_tree], &["--host", "elsewhere", "--tag", "x", "--tag", "y"]);
    let all = fx.cairn.snapshots();
    assert_eq!(all.len(), 3);
    let id_of = |i: usize| all[i]["id"].as_str().unwrap().to_string();
    let copied = |v: &Value| -> Vec<String> {
        v["copied"].as_array().unwrap().iter().map(|c| c["source"].as_str().unwrap().to_string()).collect()
    };
    let cases: Vec<(Vec<String>, Vec<String>)> = vec![
        (vec!["--host".into(), "elsewhere".into()], vec![id_of(2)]),
        (vec!["--tag".into(), "first".into()], vec![id_of(0)]),
        (vec!["--tag".into(), "x,y".into()], vec![id_of(2)]),
        (vec!["--path".into(), fx.src.to_string_lossy().into_owned()], vec![id_of(0), id_of(1)]),
        (vec![id_of(1)[..8].to_string()], vec![id_of(1)]),
        (vec!["latest".into()], vec![id_of(2)]),
        (vec![id_of(0)[..10].to_string(), "--tag".into(), "second".into()], vec![]),
    ];
    for (i, (args, want)) in cases.iter().enumerate() {
        let dst = fx.other_repo(&format!("filter-{i}"));
        dst.init(&INIT);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = copy(&dst, &fx.source_location(), SOURCE_PASSWORD, &args);
        assert_eq!(&copied(&out), want, "{args:?}: {out}");
        assert_eq!(dst.snapshots().len(), want.len(), "{args:?}");
    }
    // The table for people names each copy.
    let dst = fx.other_repo("table");
    dst.init(&INIT);
    let text = dst.clone().with_env("CAIRN_FROM_PASSWORD", SOURCE_PASSWORD).ok([
        "copy",
        "--from-repo",
        &fx.source_location(),
        "--host",
        "elsewhere",
    ]);
    assert!(text.contains(&id_of(2)[..8]) && text.contains("copied 1 snapshot (0 already there)"), "{text}");
}

#[test]
fn local_to_sftp_and_back_restores_exactly() {
    let fx = Fixture::copy_source();
    let cache = fx.base.join("cache");
    let sftp = servers::cairn(&servers::sftp_repo("copy"), &cache);
    init_like(&sftp, &fx.source_location(), SOURCE_PASSWORD);
    let there = copy(&sftp, &fx.source_location(), SOURCE_PASSWORD, &[]);
    assert_eq!(num(&there, "snapshots_copied"), 2, "{there}");
    fx.restores_exactly(&sftp, "sftp");
    let local = fx.other_repo("from-sftp");
    local.init(&INIT);
    let back = copy(&local.clone().with_envs(&sftp), &sftp.repo.to_string_lossy(), support::PASSWORD, &["latest"]);
    assert_eq!(num(&back, "snapshots_copied"), 1, "{back}");
    fx.restores_exactly(&local, "back");
}

#[test]
fn bad_input_is_a_one_line_error() {
    let fx = Fixture::copy_source();
    let dst = fx.other_repo("dst");
    dst.init(&INIT);
    let from = fx.source_location();
    let missing = fx.base.join("nothing-here").to_string_lossy().into_owned();
    let cases: Vec<(Vec<&str>, &str, &str)> = vec![
        (vec!["copy", "--from-repo", &from], "wrong", "wrong password"),
        (vec!["copy", "--from-repo", dst.repo.to_str().unwrap()], support::PASSWORD, "same repository"),
        (vec!["copy", "--from-repo", &from, "0123abcd"], SOURCE_PASSWORD, "no snapshot matches \"0123abcd\""),
        (vec!["copy"], SOURCE_PASSWORD, "give --from-repo"),
        (vec!["copy", "--from-repo", &missing], SOURCE_PASSWORD, "source repository"),
        (vec!["copy", "--from-repo", &from, "--max-memory", "lots"], SOURCE_PASSWORD, "lots"),
        // The whole copy within the budget: one that cannot hold two packs and some reads.
        (vec!["copy", "--from-repo", &from, "--max-memory", "2M"], SOURCE_PASSWORD, "too small for this copy"),
    ];
    for (args, password, want) in cases {
        let out = dst.run_env(&[("CAIRN_FROM_PASSWORD", password)], &args);
        let err = String::from_utf8_lossy(&out.stderr);
        // restic's exit codes: 12 for a wrong password, 10 for no repository at the location.
        let code = match want {
            "wrong password" => 12,
            "source repository" => 10,
            _ => 1,
        };
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: not one line: {err}");
        assert!(err.contains(want), "{args:?}: {err:?} does not say {want:?}");
    }
    assert!(dst.snapshots().is_empty());
    // --from-repo without --copy-chunker-params, and --copy-chunker-params without a source.
    let fresh = fx.other_repo("fresh");
    let out = fresh.run(["init", "--from-repo", &from]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--copy-chunker-params"));
    let out = fresh.run(["init", "--copy-chunker-params"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!fresh.repo.join("config").exists());
    // Chunk sizes of its own with the source's chunker: refused, not silently ignored.
    let out = fresh.run(["init", "--copy-chunker-params", "--from-repo", &from, "--chunk-sizes", "1024,4096,16384"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--chunk-sizes") && err.contains("--copy-chunker-params"), "{err}");
    assert!(!fresh.repo.join("config").exists());
}
