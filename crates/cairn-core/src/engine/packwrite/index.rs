//! Index stage: index files for stored packs (FORMAT.md §8).
//!
//! A pack is indexed only after it is stored, and a backup writes its snapshot only after the
//! index files covering all its blobs, so a killed writer is harmless. Index files are written
//! every few packs, not only at the end, so the next backup reuses what a killed one stored.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};

use super::{WriteOptions, Written};
use crate::engine::repository::Repository;
use crate::error::Result;
use cairn_format::index::IndexedPack;
use cairn_format::pack::count_codec;

/// Longest a stored pack waits for its index file.
const INDEX_INTERVAL: Duration = Duration::from_secs(30);

/// Writes an index file for every `every` stored packs (or every [`INDEX_INTERVAL`]) and one
/// for the rest when the uploaders are done.
pub(super) fn index_packs(
    repo: &Repository,
    packs: Receiver<IndexedPack>,
    opts: &WriteOptions,
    written: &Written,
) -> Result<()> {
    let every = opts.index_every;
    let mut batch = Vec::new();
    let mut last = Instant::now();
    let save = |batch: &mut Vec<IndexedPack>| -> Result<()> {
        let id = repo.save_index(batch)?;
        let mut by_codec = written.by_codec.lock().expect("written lock");
        for b in batch.drain(..).flat_map(|p| p.blobs) {
            count_codec(&mut by_codec, &b);
        }
        written.index_files.lock().expect("written lock").push(id);
        Ok(())
    };
    loop {
        match packs.recv_timeout(INDEX_INTERVAL) {
            Ok(p) => batch.push(p),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        if batch.len() >= every.max(1) || (!batch.is_empty() && last.elapsed() >= INDEX_INTERVAL) {
            save(&mut batch)?;
            last = Instant::now();
        }
    }
    if !batch.is_empty() {
        save(&mut batch)?;
    }
    Ok(())
}
