//! Commit stage: index files, then the snapshot (FORMAT.md §8, §10).
//!
//! The order is what makes a killed backup harmless: a pack is indexed only after it is
//! stored, and the snapshot is written only after the index files covering all its blobs.
//! Index files are written every few packs during the backup, not only at the end, so the
//! next backup reuses what a killed one had stored.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};

use crate::error::Result;
use crate::index::IndexedPack;
use crate::repository::Repository;

/// Longest a stored pack waits for its index file.
const INDEX_INTERVAL: Duration = Duration::from_secs(30);

/// Writes an index file for every `every` stored packs (or every [`INDEX_INTERVAL`]) and one
/// for the rest when the uploaders are done.
pub(super) fn index_packs(repo: &Repository, packs: Receiver<IndexedPack>, every: usize) -> Result<()> {
    let mut batch = Vec::new();
    let mut last = Instant::now();
    loop {
        match packs.recv_timeout(INDEX_INTERVAL) {
            Ok(p) => batch.push(p),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        if batch.len() >= every.max(1) || (!batch.is_empty() && last.elapsed() >= INDEX_INTERVAL) {
            repo.save_index(&batch)?;
            batch.clear();
            last = Instant::now();
        }
    }
    if !batch.is_empty() {
        repo.save_index(&batch)?;
    }
    Ok(())
}
