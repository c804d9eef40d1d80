//! Bandwidth limits (`--limit-upload`, `--limit-download`, issue 35): a backup and a restore
//! over a limited link each move their bytes within 10% of the limit (measured: the bytes the
//! repository gained or holds, over the command's wall time), on a local repository and on
//! MinIO; and a limited restore still writes files while it fetches. The restores fetch
//! everything (`--no-local-data`: the source files are still on this machine).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::{self, servers, Fixture, Tree};

/// The limit the tests run at, and the data that takes about three seconds at it.
const LIMIT: u64 = 4 << 20;
const FILES: usize = 24;
const FILE_SIZE: usize = 512 << 10;

/// Random (incompressible) files: 12 MiB.
fn make(root: &Path) {
    let mut t = Tree::new(root, 35);
    for i in 0..FILES {
        t.random(&format!("f{i:02}"), FILE_SIZE);
    }
}

/// Small packs, so the data is many uploads and many ranged reads.
const INIT: [&str; 4] = ["--chunk-sizes", "65536,131072,524288", "--pack-size", "1"];

/// Bytes stored under `dir` (a local repository).
fn stored(dir: &Path) -> u64 {
    support::files_under(dir).iter().map(|p| std::fs::metadata(p).map_or(0, |m| m.len())).sum()
}

/// Asserts `bytes` over `took` is within 10% of [`LIMIT`]; returns the ratio.
fn within_ten_percent(what: &str, bytes: u64, took: Duration) -> f64 {
    let rate = bytes as f64 / took.as_secs_f64();
    let ratio = rate / LIMIT as f64;
    eprintln!(
        "{what}: {bytes} bytes in {:.2} s = {:.2} MiB/s, {ratio:.3} of the limit",
        took.as_secs_f64(),
        rate / 1048576.0
    );
    assert!((0.9..=1.1).contains(&ratio), "{what}: {ratio:.3} of the limit ({bytes} bytes in {took:?})");
    ratio
}

#[test]
fn a_backup_and_a_restore_run_at_the_limit() {
    let mut fx = Fixture::new();
    std::fs::create_dir_all(&fx.src).unwrap();
    make(&fx.src);
    fx.scan_source();
    fx.cairn.init(&INIT);
    let before = stored(fx.repo());
    let limit = LIMIT.to_string();
    let start = Instant::now();
    let summary = fx.cairn.backup(&[&fx.src], &["--limit-upload", &limit]);
    let took = start.elapsed();
    assert!(summary["bytes_added"].as_u64().unwrap() >= (FILES * FILE_SIZE) as u64, "{summary}");
    within_ten_percent("backup", stored(fx.repo()) - before, took);

    let target = fx.path("restore");
    let start = Instant::now();
    fx.cairn.restore_with("latest", &target, &["--no-local-data", "--limit-download", &limit]);
    within_ten_percent("restore", stored(fx.repo()), start.elapsed());
    fx.assert_exact(&target);

    // Unlimited, the same restore is far faster: the limit is what held it.
    let start = Instant::now();
    fx.cairn.restore_with("latest", &fx.path("fast"), &["--no-local-data"]);
    assert!(start.elapsed() < took / 2, "unlimited restore took {:?}", start.elapsed());
}

/// On MinIO, the S3 requests themselves are held: the same within 10%, from a profile's limits.
#[test]
fn s3_backup_and_restore_run_at_the_limit() {
    let mut fx = Fixture::remote(&servers::s3_repo("limits")).init(&INIT);
    std::fs::create_dir_all(&fx.src).unwrap();
    make(&fx.src);
    fx.scan_source();
    let stored_remote = |cairn: &support::Cairn| -> u64 {
        ["keys", "index", "snapshots", "data", "config"]
            .iter()
            .flat_map(|d| servers::remote_storage(cairn, "list", d))
            .map(|(_, size)| size)
            .sum()
    };
    let before = stored_remote(&fx.cairn);
    let limited = fx.cairn.clone().with_env("CAIRN_LIMIT_UPLOAD", "4M").with_env("CAIRN_LIMIT_DOWNLOAD", "4M");
    let start = Instant::now();
    limited.backup(&[&fx.src], &[]);
    within_ten_percent("S3 backup", stored_remote(&fx.cairn) - before, start.elapsed());
    let target = fx.path("restore");
    let start = Instant::now();
    limited.restore_with("latest", &target, &["--no-cache", "--no-local-data"]);
    within_ten_percent("S3 restore", stored_remote(&fx.cairn), start.elapsed());
    fx.assert_exact(&target);
}

/// A restore at a limit still writes while it fetches: half way through its time, some of the
/// files are complete in the target and some not yet (the fetch is what the limit holds, so it
/// spans the whole restore).
#[test]
fn a_limited_restore_overlaps_fetch_and_write() {
    let fx = Fixture::backed_up(make, &INIT, &[]);
    let target = fx.path("restore");
    let src_files: Vec<Vec<u8>> = (0..FILES).map(|i| std::fs::read(fx.src.join(format!("f{i:02}"))).unwrap()).collect();
    let restored = fx.restored(&target);
    let start = Instant::now();
    let child = fx.cairn.spawn(
        &[],
        &[
            "--json",
            "restore",
            "latest",
            "--target",
            target.to_str().unwrap(),
            "--limit-download",
            "4M",
            "--no-local-data",
        ],
    );
    // Files complete (their content the source's) as time goes on.
    let mut seen: Vec<(Duration, usize)> = Vec::new();
    let mut child = child;
    loop {
        let done = (0..FILES)
            .filter(|i| std::fs::read(restored.join(format!("f{i:02}"))).is_ok_and(|b| b == src_files[*i]))
            .count();
        seen.push((start.elapsed(), done));
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = support::wait_within_timeout(child, "restore");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let total = start.elapsed();
    assert!(total > Duration::from_secs(2), "the limit held the restore: {total:?}");
    let at =
        |t: f64| seen.iter().filter(|(s, _)| s.as_secs_f64() <= t * total.as_secs_f64()).map(|(_, d)| *d).next_back();
    let (quarter, half, three_quarters) = (at(0.25).unwrap_or(0), at(0.5).unwrap_or(0), at(0.75).unwrap_or(0));
    eprintln!("files complete at 25%, 50%, 75% of {total:?}: {quarter}, {half}, {three_quarters} of {FILES}");
    assert!(half > 0 && half < FILES, "half way, {half} of {FILES} files complete: {seen:?}");
    assert!(quarter < three_quarters, "files complete as the fetch goes on: {seen:?}");
}
