//! The index kept on disk (a sorted index file in the cache directory, forced with
//! `CAIRN_INDEX=disk`) serving real commands, and rebuilt when its file is damaged.

use std::fs;
use std::path::PathBuf;

use crate::support::{self, num, stderr, Fixture};

/// Two 1 MiB files of random bytes and a small one.
fn make(src: &std::path::Path) {
    let mut rng = support::Rng(38);
    for name in ["a", "b"] {
        fs::write(src.join(name), rng.bytes(1 << 20)).unwrap();
    }
    fs::write(src.join("small"), b"small file\n").unwrap();
}

impl Fixture {
    /// The one sorted index file of the repository in the test's cache directory.
    fn sorted_index_file(&self) -> PathBuf {
        let dir = self.path("xdg-cache").join("cairn").join(self.repo_id()).join("index-sorted");
        let files: Vec<PathBuf> =
            fs::read_dir(&dir).expect("the sorted index directory").map(|e| e.unwrap().path()).collect();
        assert_eq!(files.len(), 1, "{files:?}");
        files[0].clone()
    }
}

/// How many records a sorted index file holds (its trailer's count, FORMAT.md §17).
fn sorted_records(file: &[u8]) -> usize {
    let trailer = &file[file.len() - 96..];
    u64::from_le_bytes(trailer[24..32].try_into().unwrap()) as usize
}

/// With the index on disk, a second backup of the same files stores no new data (every chunk
/// found in the sorted index file), a restore is exact and a check is clean; the file cut short,
/// or with a byte of its tables or of its records changed, is rebuilt by the next commands,
/// which still restore exactly. A value of `CAIRN_INDEX` that names nothing is one clear line.
#[test]
fn a_disk_index_serves_backup_restore_check_and_is_rebuilt_when_damaged() {
    let mut fx = Fixture::new().isolated_cache();
    fx.cairn = fx.cairn.clone().with_env("CAIRN_INDEX", "disk");
    fx = fx.with_backup_of(make, &[], &[]);
    let again = fx.backup(&[]);
    assert_eq!(num(&again, "bytes_added"), 0, "{again}");
    let sorted = fx.sorted_index_file();
    fx.restore_exact("latest", "first");
    support::ok(&fx.cairn.run(["check"]));
    let good = fs::read(&sorted).unwrap();
    let cut = good[..good.len() - 1].to_vec();
    let mut table = good.clone();
    let at = table.len() - 100;
    table[at] ^= 1;
    for (n, bad) in [cut, table].into_iter().enumerate() {
        fs::write(&sorted, bad).unwrap();
        let target = fx.path(&format!("damaged-{n}"));
        fx.cairn.restore("latest", &target);
        fx.assert_exact(&target);
        assert_eq!(fs::read(fx.sorted_index_file()).unwrap(), good, "rebuilt as it was");
    }
    // A record changed, in the first bucket or in the last: the lookup that reads it finds the
    // damage and removes the file, and whatever answered "not found" since is not believed: a
    // restore (every blob looked up: --no-local-data), a repair of the snapshots, the stats and
    // a recompress of one snapshot stop in one line that says so, and neither a snapshot nor a
    // pack is written or deleted (`check` and `prune` read the index files themselves). Whether
    // a tree's lookup or a data blob's meets the damage first depends on the repository's
    // random key; both must end the same way. The command after builds the file again.
    let records = sorted_records(&good);
    let snapshots = fx.cairn.snapshots();
    let id = snapshots[0]["id"].as_str().unwrap().to_string();
    let packs = support::files_under(&fx.repo().join("data"));
    for (n, record) in [0, records - 1].into_iter().enumerate() {
        for (m, args) in [
            vec!["restore", "latest", "--no-local-data", "--target"],
            vec!["repair", "snapshots", "--forget"],
            vec!["stats"],
            vec!["recompress", "--to", "lz4", "--snapshot", &id],
        ]
        .into_iter()
        .enumerate()
        {
            let mut damaged = good.clone();
            damaged[record * 52 + 20] ^= 1;
            fs::write(&sorted, damaged).unwrap();
            let target = fx.path(&format!("damaged-records-{n}-{m}"));
            let mut args: Vec<&str> = args;
            if args[0] == "restore" {
                args.push(target.to_str().unwrap());
            }
            let out = fx.cairn.run(&args);
            assert!(!out.status.success(), "{args:?}");
            assert!(
                stderr(&out).contains("sorted index") && stderr(&out).contains("run the command again"),
                "{args:?}: {}",
                stderr(&out)
            );
            assert!(!sorted.exists(), "the damaged file is removed");
            assert_eq!(fx.cairn.snapshots(), snapshots, "no snapshot is written or forgotten");
            assert_eq!(support::files_under(&fx.repo().join("data")), packs, "{args:?}: no pack is written or deleted");
            fx.restore_exact("latest", &format!("rebuilt-{n}-{m}"));
            assert_eq!(fs::read(fx.sorted_index_file()).unwrap(), good);
        }
    }
    let bad = fx.cairn.run_env(&[("CAIRN_INDEX", "sometimes")], ["restore", "latest", "--target", "/nonexistent"]);
    assert!(!bad.status.success());
    let why = stderr(&bad);
    assert!(why.contains("CAIRN_INDEX") && why.trim().lines().count() == 1, "{why}");
}
