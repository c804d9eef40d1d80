//! Fills a repository with many tiny blobs, through the library's pack writer, for the
//! benchmark of a repository whose index is larger than memory (`bench/big-index`).
//!
//! usage: `CAIRN_PASSWORD=… tiny_blobs REPOSITORY COUNT [PER_PACK]`
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
                        let blobs: Vec<(BlobKind, Vec<u8>)> =
                            (p * per_pack..((p + 1) * per_pack).min(count)).map(|i| (BlobKind::Data, content(i))).collect();
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
