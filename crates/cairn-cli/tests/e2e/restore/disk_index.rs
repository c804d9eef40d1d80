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
    // A record changed: the lookup that reads it finds the damage, the file is removed and the
    // restore stops in one line that says so (every blob is looked up by a full restore from
    // the repository; with the source beside it, the blobs copied from there are not looked up,
    // and which blob's record is damaged depends on the repository's random key); the command
    // after builds the file again.
    let mut records = good.clone();
    records[20] ^= 1;
    fs::write(&sorted, records).unwrap();
    let target = fx.path("damaged-records");
    let out = fx.cairn.run(["restore", "latest", "--no-local-data", "--target", target.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("sorted index") && stderr(&out).contains("run the command again"),
        "{}",
        stderr(&out)
    );
    assert!(!sorted.exists(), "the damaged file is removed");
    fx.restore_exact("latest", "rebuilt");
    assert_eq!(fs::read(fx.sorted_index_file()).unwrap(), good);
    let bad = fx.cairn.run_env(&[("CAIRN_INDEX", "sometimes")], ["restore", "latest", "--target", "/nonexistent"]);
    assert!(!bad.status.success());
    let why = stderr(&bad);
    assert!(why.contains("CAIRN_INDEX") && why.trim().lines().count() == 1, "{why}");
}
