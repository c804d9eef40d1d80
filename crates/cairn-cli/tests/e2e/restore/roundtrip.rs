//! Round trips through the `cairn` binary: build a file tree, back it up, restore it into a
//! fresh directory, and compare the two byte for byte and by metadata (type, mode incl.
//! setuid/setgid/sticky, owner, size, atime and mtime to the nanosecond, symlink target, device
//! number, xattrs and POSIX ACLs, hard-link groups, holes).
//!
//! The trees are generated with proptest and hold every kind of entry Cairn stores. The tests
//! must run as root on a file system with xattrs and ACLs (ext4): they chown to arbitrary IDs,
//! make device nodes and set `system.posix_acl_*` xattrs directly.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::support::library::compress::Codec;
use crate::support::library::pack::BlobKind;
use crate::support::tree::spec::*;
use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;
use support::{
    assert_same, count_files, reset_times, restored_path, scan, scan_source, Fixture, Kind, Rng, Scan, StoredBlob,
};

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

// ---------------------------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------------------------

impl Fixture {
    /// A source made from `spec` and scanned, beside an uninitialised repository.
    fn from_spec(spec: &TreeSpec) -> Self {
        let mut fx = Fixture::new();
        materialize(spec, &fx.src);
        fx.scan_source();
        fx
    }

    /// Backs up the source (after undoing atime updates since the scan).
    fn backup_as_scanned(&self, extra: &[&str]) -> serde_json::Value {
        reset_times(&self.src, &self.before);
        self.cairn.backup(&[&self.src], extra)
    }

    /// Restores `spec` (a full snapshot) into a new directory; checks the result against the
    /// source and the restore summary against the scan.
    fn restore_and_compare(&self, spec: &str, name: &str) {
        self.restore_and_compare_with(spec, name, &[]);
    }

    /// [`Fixture::restore_and_compare`] with extra `restore` options.
    fn restore_and_compare_with(&self, spec: &str, name: &str, extra: &[&str]) {
        let target = self.path(name);
        let summary = self.cairn.restore_with(spec, &target, extra);
        let restored = scan(&restored_path(&target, &self.src));
        assert_same(&self.before, &restored, true);

        let count = |k: &[Kind]| self.before.values().filter(|m| k.contains(&m.kind)).count();
        assert_eq!(summary["files"], count(&[Kind::File]), "{summary}");
        let others = count(&[Kind::Symlink, Kind::Fifo, Kind::CharDevice, Kind::BlockDevice]);
        assert_eq!(summary["others"], others, "{summary}");
        // `/` is the target itself; `tmp` and the temporary directory are restored too.
        let ancestors = self.src.components().count() - 2;
        assert_eq!(summary["dirs"], count(&[Kind::Dir]) + ancestors, "{summary}");
        let inodes: BTreeMap<u64, u64> =
            self.before.values().filter(|m| m.kind == Kind::File).map(|m| (m.ino, m.size)).collect();
        assert_eq!(summary["bytes_total"], inodes.values().sum::<u64>(), "{summary}");
    }
}

/// `cases` cases, or `PROPTEST_CASES` when set (for longer hunts).
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(cases),
        max_shrink_iters: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(12))]

    /// Every kind of entry survives backup and restore exactly (default repository settings).
    #[test]
    fn any_tree_round_trips(
        spec in tree_strategy(prop::option::weighted(0.5, (2 * MIB..5 * MIB, any::<u64>())))
    ) {
        let fx = Fixture::from_spec(&spec);
        fx.cairn.init(&[]);
        fx.backup_as_scanned(&[]);
        fx.restore_and_compare("latest", "restore");
    }
}

/// Restore options that change how the pipeline runs but never what it produces.
/// (`--preallocate` has its own test: it fragments files, which can cost extent blocks.)
fn restore_options_strategy() -> impl Strategy<Value = Vec<String>> {
    (1u32..4, 1u32..4, 1u32..5, prop::sample::select(vec!["64K", "1M", "256M"]), any::<bool>()).prop_map(
        |(write, decode, fetch, memory, verify)| {
            let mut v: Vec<String> = [
                "--write-threads".to_string(),
                write.to_string(),
                "--decode-threads".to_string(),
                decode.to_string(),
                "--fetch-concurrency".to_string(),
                fetch.to_string(),
                "--max-memory".to_string(),
                memory.to_string(),
            ]
            .into();
            if verify {
                v.push("--verify".into());
            }
            v
        },
    )
}

proptest! {
    #![proptest_config(config(8))]

    /// With 1 MiB packs and 1/4/16 KiB chunks, a tree spans hundreds of chunks and several
    /// packs, and still restores exactly, whatever the restore's threads, memory budget and
    /// verification.
    #[test]
    fn many_chunks_and_packs_round_trip(
        spec in tree_strategy((5 * MIB / 2..4 * MIB, any::<u64>()).prop_map(Some)),
        restore_options in restore_options_strategy(),
    ) {
        let fx = Fixture::from_spec(&spec);
        fx.cairn.init(&["--pack-size", "1", "--chunk-sizes", "1024,4096,16384"]);
        fx.backup_as_scanned(&[]);
        let opts: Vec<&str> = restore_options.iter().map(String::as_str).collect();
        fx.restore_and_compare_with("latest", "restore", &opts);

        let blobs = fx.cairn.stored_blobs();
        let packs: BTreeSet<&str> = blobs.iter().map(|b| b.pack.as_str()).collect();
        prop_assert!(packs.len() >= 3, "only {} packs", packs.len());
        prop_assert_eq!(packs.len(), count_files(&fx.base.join("repo/data")));
        let data = blobs.iter().filter(|b| b.kind == BlobKind::Data).count();
        prop_assert!(data >= 300, "only {} data blobs", data);
        prop_assert!(
            blobs.iter().all(|b| b.kind == BlobKind::Tree || b.raw_length <= 16384),
            "a chunk exceeds the maximum size"
        );
    }
}

proptest! {
    #![proptest_config(config(8))]

    /// Restoring snapshot B over a restore of snapshot A (same paths, different trees):
    /// with `--delete` the target becomes exactly B; without it every entry of B is exact and
    /// the entries only A had are left as they were.
    #[test]
    fn restoring_one_snapshot_over_another(
        a in tree_strategy(Just(None)),
        b in tree_strategy(Just(None)),
    ) {
        let fx = Fixture::new();
        let base = &fx.base;
        let src = base.as_path().join("src");
        let cairn = fx.cairn.clone();
        cairn.init(&[]);
        materialize(&a, &src);
        let scan_a = scan_source(&src);
        let snap_a = cairn.backup(&[&src], &[]);
        fs::remove_dir_all(&src).expect("remove A");
        materialize(&b, &src);
        let scan_b = scan_source(&src);
        let snap_b = cairn.backup(&[&src], &[]);
        let (id_a, id_b) = (snap_a["snapshot_id"].as_str().expect("id"), snap_b["snapshot_id"].as_str().expect("id"));

        // With --delete: exactly B.
        let t1 = base.as_path().join("t1");
        cairn.restore(id_a, &t1);
        assert_same(&scan_a, &scan(&restored_path(&t1, &src)), true);
        cairn.restore_with(id_b, &t1, &["--delete"]);
        assert_same(&scan_b, &scan(&restored_path(&t1, &src)), true);

        // Without: B's entries exact, A's leftovers untouched.
        let t2 = base.as_path().join("t2");
        cairn.restore(id_a, &t2);
        cairn.restore(id_b, &t2);
        let got = scan(&restored_path(&t2, &src));
        let (in_b, leftovers): (Scan, Scan) = got.into_iter().partition(|(p, _)| scan_b.contains_key(p));
        assert_same(&scan_b, &in_b, true);
        let mut diffs = Vec::new();
        for (p, m) in &leftovers {
            let Some(was) = scan_a.get(p) else {
                diffs.push(format!("{p:?}: neither in A nor in B"));
                continue;
            };
            let same = m.kind == was.kind
                && m.mode == was.mode
                && (m.uid, m.gid) == (was.uid, was.gid)
                && m.size == was.size
                && m.mtime == was.mtime
                && m.xattrs == was.xattrs
                && m.digest == was.digest
                && m.target == was.target
                && m.rdev == was.rdev;
            if !same {
                diffs.push(format!("{p:?}: left over from A but changed: was {was:?}, now {m:?}"));
            }
        }
        prop_assert!(diffs.is_empty(), "{}", diffs.join("\n"));
    }
}

/// Every codec restores exactly, and the blobs really are stored with the codec asked for.
#[test]
fn every_codec_round_trips() {
    let spec = fixed_spec();
    for (init, backup, want) in [
        ("none", None, Codec::None),
        ("lz4", None, Codec::Lz4),
        ("zstd:1", None, Codec::Zstd(1)),
        ("zstd:19", None, Codec::Zstd(19)),
        ("zstd:3", Some("lz4"), Codec::Lz4),
    ] {
        let fx = Fixture::from_spec(&spec);
        fx.cairn.init(&["--compression", init]);
        match backup {
            Some(c) => fx.backup_as_scanned(&["--compression", c]),
            None => fx.backup_as_scanned(&[]),
        };
        fx.restore_and_compare("latest", "restore");
        let blobs = fx.cairn.stored_blobs();
        assert!(!blobs.is_empty());
        for b in &blobs {
            assert!(
                b.codec == want || b.codec == Codec::None,
                "init {init}, backup {backup:?}: blob {:?} stored with {:?}, wanted {want:?}",
                b.id,
                b.codec
            );
        }
        if want != Codec::None {
            assert!(blobs.iter().any(|b| b.codec == want), "init {init}, backup {backup:?}: no blob used {want:?}");
        }
    }
}

/// One repository holding blobs of several codecs restores each snapshot exactly.
#[test]
fn mixed_codecs_in_one_repository() {
    let mut fx = Fixture::from_spec(&fixed_spec());
    fx.cairn.init(&["--compression", "zstd:3"]);
    let first = fx.backup_as_scanned(&["--compression", "lz4"]);
    // Change the compressible file so the second backup stores new (zstd) blobs.
    let changed = fx.src.join("e0");
    fs::OpenOptions::new()
        .append(true)
        .open(&changed)
        .expect("open")
        .write_all(&compressible(100 * KIB, 77))
        .expect("append");
    let before_change = fx.before.clone();
    fx.scan_source();
    let second = fx.backup_as_scanned(&[]);
    let codecs: BTreeSet<String> = fx.cairn.stored_blobs().iter().map(|b| format!("{:?}", b.codec)).collect();
    assert!(codecs.contains("Lz4") && codecs.contains("Zstd(3)"), "{codecs:?}");

    let first_id = first["snapshot_id"].as_str().expect("id");
    let target = fx.base.join("first");
    fx.cairn.restore(&first_id[..12], &target);
    assert_same(&before_change, &scan(&restored_path(&target, &fx.src)), true);
    let second_id = second["snapshot_id"].as_str().expect("id");
    fx.restore_and_compare(second_id, "second");
}

/// Identical content is stored once within a backup, a second backup of an unchanged tree adds
/// no data blobs, and a third adds nothing at all for the tree (only the directories above it,
/// whose times other processes may change, can be new). Backups list directories without
/// changing their access times; the test's own scans undo theirs.
#[test]
fn unchanged_data_is_not_stored_twice() {
    let fx = Fixture::new();
    let base = &fx.base;
    let src = base.as_path().join("src");
    fs::create_dir_all(src.join("sub")).expect("mkdir");
    let random = Rng(42).bytes(MIB);
    fs::write(src.join("a.bin"), &random).expect("write");
    fs::write(src.join("sub/copy-of-a.bin"), &random).expect("write");
    fs::write(src.join("text.txt"), compressible(256 * KIB, 1)).expect("write");
    let before = scan_source(&src);

    let cairn = fx.cairn.clone();
    cairn.init(&["--chunk-sizes", "16384,65536,262144"]);
    let first = cairn.backup(&[&src], &[]);
    let blobs1 = cairn.stored_blobs();
    let raw = |blobs: &[&StoredBlob]| blobs.iter().map(|b| u64::from(b.raw_length)).sum::<u64>();
    let all1: Vec<&StoredBlob> = blobs1.iter().collect();
    assert_eq!(first["bytes_added"], raw(&all1), "bytes_added must count every new blob once: {first}");
    let data1: Vec<&StoredBlob> = blobs1.iter().filter(|b| b.kind == BlobKind::Data).collect();
    assert_eq!(raw(&data1), (MIB + 256 * KIB) as u64, "the copy of a.bin must not be stored again");
    assert_eq!(first["bytes_read"], (2 * MIB + 256 * KIB) as u64, "{first}");

    // Blobs a backup added, checking that bytes_added counts exactly them.
    let added = |summary: &serde_json::Value, old: &[StoredBlob]| -> Vec<StoredBlob> {
        let old: BTreeSet<_> = old.iter().map(|b| b.id).collect();
        let new: Vec<StoredBlob> = cairn.stored_blobs().into_iter().filter(|b| !old.contains(&b.id)).collect();
        assert_eq!(summary["bytes_added"], raw(&new.iter().collect::<Vec<_>>()), "{summary}");
        new
    };
    // What the second and third backups see: nothing touches the tree between them (resetting
    // the scan's atime updates changes ctimes, which the second backup records).
    let after_second = scan_source(&src);
    let second = cairn.backup(&[&src], &[]);
    let new2 = added(&second, &blobs1);
    for b in &new2 {
        assert_eq!(b.kind, BlobKind::Tree, "the second backup stored data blob {:?} again", b.id);
    }
    let blobs2 = cairn.stored_blobs();

    let third = cairn.backup(&[&src], &[]);
    let new3 = added(&third, &blobs2);
    let id = |s: &serde_json::Value| s["snapshot_id"].as_str().expect("id").to_string();
    assert_eq!(cairn.subtree_id(&id(&second), &src), cairn.subtree_id(&id(&third), &src));
    let ancestors = src.components().count() - 1;
    assert!(new3.len() <= ancestors, "{} new blobs for {ancestors} ancestor directories", new3.len());

    // Each snapshot restores the tree as it was.
    for (i, (s, want)) in [(&first, &before), (&third, &after_second)].into_iter().enumerate() {
        let target = base.as_path().join(format!("restore{i}"));
        cairn.restore(&id(s), &target);
        assert_same(want, &scan(&restored_path(&target, &src)), true);
    }
}

/// `restore SNAP:/abs/dir` puts that directory's contents straight into the target (not the
/// directory itself, nor anything beside it); `SNAP:/abs/file` restores just that file.
#[test]
fn restore_of_a_path_inside_the_snapshot() {
    let fx = Fixture::new();
    let base = &fx.base;
    let src = base.as_path().join("src");
    fs::create_dir(&src).expect("mkdir");
    let sub = src.join("sub");
    materialize(&fixed_spec(), &sub);
    fs::write(src.join("beside.txt"), b"next to sub\n").expect("write");
    // A hard link from outside `sub` to a file inside it: restored alone, it is a plain file.
    fs::hard_link(sub.join("e5"), src.join("outside-link")).expect("link");
    support::set_times(&src.join("beside.txt"), (1_234_567_890, 5), (1_234_567_891, 6));
    let whole = scan_source(&src);
    let sub_scan: Scan =
        whole.iter().filter_map(|(p, m)| p.strip_prefix("sub").ok().map(|r| (r.to_path_buf(), m.clone()))).collect();

    let cairn = fx.cairn.clone();
    cairn.init(&[]);
    cairn.backup(&[&src], &[]);
    let sub_spec = format!("latest:{}", sub.display());

    let t1 = base.as_path().join("t1/does/not/exist/yet");
    cairn.restore(&sub_spec, &t1);
    assert_same(&sub_scan, &scan(&t1), false);
    assert!(!t1.join("sub").exists() && !t1.join("beside.txt").exists());

    let t2 = base.as_path().join("t2");
    cairn.restore(&format!("{sub_spec}/"), &t2);
    assert_same(&sub_scan, &scan(&t2), false);

    // A single file lands as TARGET/NAME.
    let t3 = base.as_path().join("t3");
    cairn.restore(&format!("latest:{}", src.join("beside.txt").display()), &t3);
    let want: Scan = [
        (PathBuf::new(), whole[Path::new("")].clone()),
        (PathBuf::from("beside.txt"), whole[Path::new("beside.txt")].clone()),
    ]
    .into();
    assert_same(&want, &scan(&t3), false);

    // `ls SNAP:/abs/dir` lists the same entries (JSON, since some names hold newlines).
    let listed: BTreeSet<String> = cairn
        .ok(["--json", "ls", sub_spec.as_str()])
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("JSON line");
            v["path"].as_str().expect("path").to_string()
        })
        .collect();
    let expected: BTreeSet<String> = sub_scan
        .keys()
        .filter(|p| !p.as_os_str().is_empty())
        .map(|p| format!("{}/{}", sub.display(), p.to_string_lossy()))
        .collect();
    assert_eq!(listed, expected);

    // The whole snapshot still restores everything, `sub` included.
    let t4 = base.as_path().join("t4");
    cairn.restore("latest", &t4);
    assert_same(&whole, &scan(&restored_path(&t4, &src)), true);
}

/// Restoring a snapshot again into the same target leaves an exact copy: entries that exist
/// are replaced, and nothing of the first restore (such as a directory's default ACL, which
/// new files would inherit) leaks into the second.
#[test]
fn restoring_over_an_earlier_restore_is_exact() {
    let fx = Fixture::from_spec(&fixed_spec());
    fx.cairn.init(&[]);
    fx.backup_as_scanned(&[]);
    fx.restore_and_compare("latest", "restore");
    fx.restore_and_compare("latest", "restore");
}

/// A default ACL on the restore target is not inherited by what the restore makes: every entry
/// gets exactly the mode and ACLs of the snapshot, as with any other target.
#[test]
fn default_acl_of_the_target_does_not_leak_into_the_restore() {
    let fx = Fixture::from_spec(&fixed_spec());
    fx.cairn.init(&[]);
    fx.backup_as_scanned(&[]);
    let target = fx.base.join("acl-target");
    fs::create_dir(&target).expect("mkdir");
    set_acl(&target, "system.posix_acl_default", &named_acl());
    fx.restore_and_compare("latest", "acl-target");
}

/// Restoring over entries that changed kind, size or hard-link grouping replaces them without
/// writing through them: a name that is no longer a hard link does not drag its old partner
/// along, and a symlink where a file belongs is replaced, not followed.
#[test]
fn restoring_over_changed_entries_touches_only_what_the_snapshot_holds() {
    let fx = Fixture::new();
    let base = &fx.base;
    let src = base.as_path().join("src");
    let outside = base.as_path().join("outside.txt");
    fs::write(&outside, b"precious, outside the target\n").expect("write");
    let cairn = fx.cairn.clone();
    cairn.init(&[]);

    // Snapshot A.
    fs::create_dir_all(src.join("d2f")).expect("mkdir");
    fs::write(src.join("x"), b"version A\n").expect("write");
    fs::hard_link(src.join("x"), src.join("y")).expect("link");
    fs::write(src.join("f2d"), b"a file in A\n").expect("write");
    fs::write(src.join("d2f/child"), b"child in A\n").expect("write");
    std::os::unix::fs::symlink(&outside, src.join("s2f")).expect("symlink");
    fs::write(src.join("shrinks"), Rng(1).bytes(300 * KIB)).expect("write");
    fs::write(src.join("grows"), b"short").expect("write");
    let scan_a = scan_source(&src);
    let id_a = cairn.backup(&[&src], &[])["snapshot_id"].as_str().expect("id").to_string();

    // Snapshot B: the same names, changed.
    fs::remove_dir_all(&src).expect("rm");
    fs::create_dir_all(src.join("f2d")).expect("mkdir");
    fs::write(src.join("x"), b"version B, no longer linked\n").expect("write");
    fs::write(src.join("f2d/child"), b"child in B\n").expect("write");
    fs::write(src.join("d2f"), b"a file in B\n").expect("write");
    fs::write(src.join("s2f"), b"a file where A had a symlink\n").expect("write");
    fs::write(src.join("shrinks"), Rng(2).bytes(10 * KIB)).expect("write");
    fs::write(src.join("grows"), Rng(3).bytes(200 * KIB)).expect("write");
    let scan_b = scan_source(&src);
    let id_b = cairn.backup(&[&src], &[])["snapshot_id"].as_str().expect("id").to_string();

    for delete in [false, true] {
        let t = base.as_path().join(format!("t-{delete}"));
        cairn.restore(&id_a, &t);
        let restored = restored_path(&t, &src);
        assert_same(&scan_a, &scan(&restored), true);
        let opts: &[&str] = if delete { &["--delete"] } else { &[] };
        cairn.restore_with(&id_b, &t, opts);
        let mut got = scan(&restored);
        assert_eq!(fs::read(&outside).expect("read"), b"precious, outside the target\n");
        if delete {
            assert!(!got.contains_key(Path::new("y")), "--delete left y");
        } else {
            let y = got.remove(Path::new("y")).expect("y is left alone");
            assert_eq!(fs::read(restored.join("y")).expect("read y"), b"version A\n", "y was written through x");
            assert_eq!(y.mtime, scan_a[Path::new("y")].mtime);
        }
        assert_same(&scan_b, &got, true);
    }
}

/// `--preallocate` reserves a file's data before writing it: the restore is still exact, and a
/// file that is one extent in the source is not cut into hundreds (small chunks must not mean
/// one small reservation each).
#[test]
fn preallocated_restores_are_exact_and_not_fragmented() {
    let fx = Fixture::new();
    let base = &fx.base;
    let src = base.as_path().join("src");
    fs::create_dir(&src).expect("mkdir");
    fs::write(src.join("big.bin"), Rng(7).bytes(4 * MIB)).expect("write");
    write_content(
        &src.join("sparse.img"),
        &Content::Sparse { size: 8 * MIB as u64, writes: vec![(100, 200_000, 1), (700, 300_000, 2)] },
    );
    let before = scan_source(&src);
    let cairn = fx.cairn.clone();
    cairn.init(&["--chunk-sizes", "1024,4096,16384"]);
    cairn.backup(&[&src], &[]);
    for opts in [&[][..], &["--preallocate"][..]] {
        let target = base.as_path().join(format!("restore{}", opts.len()));
        cairn.restore_with("latest", &target, opts);
        let restored = restored_path(&target, &src);
        let diffs = support::differences(&before, &scan(&restored), true);
        assert!(diffs.is_empty(), "restore {opts:?}: {diffs:#?}");
        for name in ["big.bin", "sparse.img"] {
            let (a, b) = (support::extent_count(&src.join(name)), support::extent_count(&restored.join(name)));
            assert!(b <= 2 * a + 8, "{opts:?}: {name} has {a} extents in the source, {b} restored");
        }
    }
}

/// The generator's own sanity: a fixed tree really holds every kind of entry, holes, ACLs,
/// xattrs and a three-name hard-link group (so the other tests cover what they claim).
#[test]
fn fixed_tree_covers_every_entry_kind() {
    let fx = Fixture::new();
    let base = &fx.base;
    let root = base.as_path().join("src");
    materialize(&fixed_spec(), &root);
    let s = scan(&root);
    let kinds: BTreeSet<Kind> = s.values().map(|m| m.kind).collect();
    for k in [Kind::File, Kind::Dir, Kind::Symlink, Kind::Fifo, Kind::CharDevice, Kind::BlockDevice] {
        assert!(kinds.contains(&k), "no {k:?}");
    }
    assert!(s.values().any(|m| m.nlink == 3 && m.kind == Kind::File));
    assert!(s.values().any(|m| m.kind == Kind::File && m.size >= MIB as u64 && m.blocks * 512 * 8 < m.size));
    for x in ["system.posix_acl_access", "system.posix_acl_default", "user.cairn.test0"] {
        assert!(s.values().any(|m| m.xattrs.contains_key(x.as_bytes())), "no {x}");
    }
    assert!(s.values().any(|m| m.mode & 0o4000 != 0));
    assert!(s.values().any(|m| m.mode & 0o2000 != 0));
    assert!(s.values().any(|m| m.mode & 0o1000 != 0));
    assert!(s.values().any(|m| m.mtime.0 < 0));
    assert!(s.keys().any(|p| std::str::from_utf8(p.as_os_str().as_bytes()).is_err()));
}

/// Issue 16, edge case 1: a tree deeper than PATH_MAX (4096 bytes) — 20 nested directories of
/// 250-byte names, a file at every level and every kind of entry in the deepest — backs up,
/// restores, compares and verifies exactly. No path reaches its deep entries (`open` by full
/// path fails with ENAMETOOLONG), so it is built, scanned and changed through open directories.
#[test]
fn paths_longer_than_path_max_round_trip() {
    use support::{deep, in_dir, mkdir_in, scan_deep, scan_source_deep};
    let fx = Fixture::new();
    let base = &fx.base;
    let src = base.as_path().join("src");
    fs::create_dir(&src).expect("mkdir");
    let mut rng = Rng(16);
    let mut dir = fs::File::open(&src).expect("open src");
    let mut deepest = src.clone();
    for level in 0..20usize {
        fs::write(in_dir(&dir, "f"), rng.bytes(1000 + level * 997)).expect("write");
        let name = format!("{level:02}{}", "d".repeat(248));
        let sub = mkdir_in(&dir, &name, 0o755);
        xattr::set(in_dir(&dir, &name), "user.level", level.to_string().as_bytes()).expect("xattr");
        deepest.push(&name);
        dir = sub;
    }
    assert!(deepest.as_os_str().len() > 5000, "{} bytes", deepest.as_os_str().len());
    // The deepest directory: a file with data and a hole, a hard link to it, a symlink, a FIFO.
    let file = in_dir(&dir, "file");
    let f = fs::File::create(&file).expect("create");
    f.write_all_at(&rng.bytes(300 * KIB), 0).expect("write");
    f.set_len(2 * MIB as u64).expect("set_len");
    drop(f);
    fs::set_permissions(&file, fs::Permissions::from_mode(0o640)).expect("chmod");
    xattr::set(&file, "user.deep", b"at the bottom").expect("xattr");
    fs::hard_link(&file, in_dir(&dir, "link")).expect("link");
    std::os::unix::fs::symlink("../../somewhere/else", in_dir(&dir, "sym")).expect("symlink");
    let fifo = std::ffi::CString::new(in_dir(&dir, "fifo").into_os_string().into_vec()).expect("no NUL");
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0, "mkfifo");
    fs::write(in_dir(&dir, "empty"), b"").expect("write");
    fs::set_permissions(in_dir(&dir, "."), fs::Permissions::from_mode(0o750)).expect("chmod");
    drop(dir);
    let before = scan_source_deep(&src);
    assert_eq!(before.len(), 1 + 20 * 2 + 5, "{:?}", before.keys().collect::<Vec<_>>());

    let cairn = fx.cairn.clone();
    cairn.init(&[]);
    cairn.backup(&[&src], &[]);
    let target = base.as_path().join("restore");
    let summary = cairn.restore("latest", &target);
    let restored = restored_path(&target, &src);
    assert_same(&before, &scan_deep(&restored), true);
    assert_eq!(summary["files"], 20 + 3, "{summary}");

    // Into the same, complete target: the comparison finds every file in place — except the
    // hard-linked one, which a restore replaces rather than write through, so only its 300 KiB
    // of data are written — and --verify reads each back.
    let summary = cairn.restore_with("latest", &target, &["--verify"]);
    assert_eq!(summary["bytes_written"], 300 * KIB, "{summary}");
    assert_eq!(summary["verified"], summary["files"], "{summary}");
    assert_same(&before, &scan_deep(&restored), true);

    // Damage at the bottom: changed bytes and mode, a file replaced by a directory, an entry
    // the snapshot lacks. The restore puts back exactly the snapshot (--delete removes the extra).
    let (dir, f19) = deep(&restored.join(deepest.strip_prefix(&src).unwrap()).parent().unwrap().join("f"));
    fs::OpenOptions::new().write(true).open(&f19).expect("open").write_all_at(b"damage", 10).expect("write");
    fs::set_permissions(&f19, fs::Permissions::from_mode(0o600)).expect("chmod");
    drop(dir);
    let (dir, bottom) = deep(&restored.join(deepest.strip_prefix(&src).unwrap()));
    fs::remove_file(bottom.join("empty")).expect("rm");
    fs::create_dir(bottom.join("empty")).expect("mkdir");
    fs::write(bottom.join("extra"), b"not in the snapshot").expect("write");
    drop(dir);
    let summary = cairn.restore_with("latest", &target, &["--delete", "--verify"]);
    assert!(summary["bytes_written"].as_u64().unwrap() > 0, "{summary}");
    assert_eq!(summary["deleted"], 1, "{summary}");
    assert_same(&before, &scan_deep(&restored), true);
}

/// Issue 16, edge case 2: `SNAP:PATH` with a path that is not UTF-8 works for `ls`, `dump` and
/// `restore` (the argument used to be refused by the parser with exit code 2).
#[test]
fn snapshot_paths_need_not_be_utf8() {
    let fx = Fixture::new();
    let base = &fx.base;
    let src = base.as_path().join("src");
    let dir_name = OsString::from_vec(b"r\xe9pertoire".to_vec());
    let file_name = OsString::from_vec(b"caf\xe9.txt".to_vec());
    fs::create_dir_all(src.join(&dir_name)).unwrap();
    let content = compressible(300_000, 7);
    fs::write(src.join(&dir_name).join(&file_name), &content).unwrap();
    let c = fx.cairn.clone();
    c.init(&[]);
    c.backup(&[&src], &[]);
    let spec = |p: &Path| {
        let mut s = OsString::from("latest:");
        s.push(p.as_os_str());
        s
    };
    let file = src.join(&dir_name).join(&file_name);
    let listed = c.run(["ls".into(), spec(&src.join(&dir_name))]);
    assert!(listed.status.success(), "{listed:?}");
    // Names are shown for people (not UTF-8: replacement characters).
    assert!(String::from_utf8_lossy(&listed.stdout).contains("caf\u{FFFD}.txt"), "{listed:?}");
    let dumped = c.run(["dump".into(), spec(&file)]);
    assert!(dumped.status.success(), "{dumped:?}");
    assert_eq!(dumped.stdout, content);
    let target = base.as_path().join("t");
    let restored =
        c.run([OsString::from("restore"), spec(&src.join(&dir_name)), "--target".into(), target.clone().into()]);
    assert!(restored.status.success(), "{restored:?}");
    assert_eq!(fs::read(target.join(&file_name)).unwrap(), content);
    let missing = c.run(["dump".into(), spec(&src.join(OsString::from_vec(b"n\xffpe".to_vec())))]);
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
}
