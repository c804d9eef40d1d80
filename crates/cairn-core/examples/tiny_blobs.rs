//! Fills a repository with many tiny blobs, through the library's pack writer, for the
//! benchmark of a repository whose index is larger than memory (`bench/big-index`).
//!
//! usage: `CAIRN_PASSWORD=… tiny_blobs REPOSITORY COUNT [PER_PACK]`
//!        `CAIRN_PASSWORD=… tiny_blobs --lookups REPOSITORY COUNT N DIR`
//!
//! The second form times what a backup's deduplication asks of the index (`contains`) for `N`
//! blobs, half of them among the `COUNT` generated and half not, with the index on disk (its
//! sorted index file in `DIR`, built first if it is not there) and then in memory: the load and
//! the nanoseconds a lookup.
//!
//! Blob `i` holds the bytes `tiny blob <i as 10 digits>\n` (21 bytes): a file holding exactly
//! those bytes, backed up, is one chunk that deduplicates against it, so a small snapshot can
//! reference a few of the generated blobs. Each pack of `PER_PACK` blobs (default 20,000) gets
//! an index file of its own. The repository must exist (`cairn init`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use cairn_core::engine::open::storage_at;
use cairn_core::engine::repository::Repository;
use cairn_core::engine::storage::RemoteOptions;
use cairn_format::compress::Codec;
use cairn_format::pack::BlobKind;

/// The content of blob `i`.
fn content(i: u64) -> Vec<u8> {
    format!("tiny blob {i:010}\n").into_bytes()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--lookups") {
        return lookups(&args[2..]);
    }
    if args.len() < 3 {
        return Err("usage: tiny_blobs REPOSITORY COUNT [PER_PACK]".into());
    }
    let count: u64 = args[2].parse()?;
    let per_pack: u64 = args.get(3).map_or(Ok(20_000), |a| a.parse())?;
    let password = std::env::var("CAIRN_PASSWORD").map_err(|_| "set CAIRN_PASSWORD")?;
    let repo = Repository::open(storage_at(&args[1], &RemoteOptions::default())?, password.as_bytes())?;
    let packs = count.div_ceil(per_pack);
    let next = AtomicU64::new(0);
    let started = Instant::now();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| -> Result<(), String> {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<(), String> {
                    loop {
                        let p = next.fetch_add(1, Ordering::Relaxed);
                        if p >= packs {
                            return Ok(());
                        }
                        let blobs: Vec<(BlobKind, Vec<u8>)> = (p * per_pack..((p + 1) * per_pack).min(count))
                            .map(|i| (BlobKind::Data, content(i)))
                            .collect();
                        repo.write_pack(&blobs, Codec::None).map_err(|e| e.to_string())?;
                        if p % 50 == 49 {
                            eprintln!("{} packs of {packs} in {:.1} s", p + 1, started.elapsed().as_secs_f64());
                        }
                    }
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| w.join().expect("a writer panicked"))
    })?;
    println!("{count} blobs in {packs} packs in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn lookups(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let [repo, count, n, dir] = args else { return Err("usage: tiny_blobs --lookups REPOSITORY COUNT N DIR".into()) };
    let (count, n): (u64, u64) = (count.parse()?, n.parse()?);
    let password = std::env::var("CAIRN_PASSWORD").map_err(|_| "set CAIRN_PASSWORD")?;
    let mut repo = Repository::open(storage_at(repo, &RemoteOptions::default())?, password.as_bytes())?;
    repo.set_index_dir(dir.into());
    // Half present (every other one a generated blob, spread over all of them), half absent.
    let ids: Vec<_> = (0..n)
        .map(|i| {
            let j = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) % count;
            repo.key().blob_id(&if i % 2 == 0 { content(j) } else { format!("absent {j}").into_bytes() })
        })
        .collect();
    for place in ["disk", "memory"] {
        std::env::set_var("CAIRN_INDEX", place);
        let started = Instant::now();
        repo.load_index()?;
        let loaded = started.elapsed();
        let index = repo.index();
        let started = Instant::now();
        let found = ids.iter().filter(|id| index.contains(id)).count();
        let per = started.elapsed().as_nanos() as f64 / n as f64;
        println!(
            "{place}: loaded in {:.2} s, {} MiB in memory; {n} lookups, {found} found: {per:.0} ns each",
            loaded.as_secs_f64(),
            index.memory_bytes() >> 20
        );
        assert_eq!(found as u64, n.div_ceil(2), "every generated blob is found, no other");
        drop(index);
        repo.clear_index();
    }
    Ok(())
}
