//! Fetch stage: many ranged reads of packs in flight; each read is cut into its blobs.

use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use super::plan::PackRead;
use super::Failures;
use crate::crypto::ObjectKey;
use crate::pack::{pack_path, BlobEntry};
use crate::repository::Repository;

/// One blob as read from storage, still encrypted.
pub struct Fetched {
    /// Its pack entry.
    pub entry: BlobEntry,
    /// The pack's key.
    pub key: Arc<ObjectKey>,
    /// The pack's path, for errors.
    pub pack: Arc<str>,
    /// The blob's stored bytes.
    pub sealed: Vec<u8>,
}

/// Runs until `reads` is drained or `out` is closed.
pub fn fetch_worker(
    repo: &Repository,
    reads: Receiver<&PackRead>,
    out: Sender<Fetched>,
    failures: &Failures,
) {
    for read in reads {
        if failures.cancelled() {
            return;
        }
        let path: Arc<str> = pack_path(&read.pack).into();
        let bytes = match repo.storage().read_range(&path, read.offset, read.length) {
            Ok(b) => b,
            Err(e) => {
                for b in &read.blobs {
                    failures.blob(&b.id, &e.to_string());
                }
                continue;
            }
        };
        let key = Arc::new(repo.key().object_key(&read.salt));
        for b in &read.blobs {
            let start = (u64::from(b.offset) - read.offset) as usize;
            let sealed = bytes[start..start + b.length as usize].to_vec();
            let job = Fetched {
                entry: *b,
                key: key.clone(),
                pack: path.clone(),
                sealed,
            };
            if out.send(job).is_err() {
                return;
            }
        }
    }
}
