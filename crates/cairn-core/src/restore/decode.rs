//! Decode stage (CPU pool): decrypt, decompress, and recompute the blob ID before any byte is
//! written.

use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use super::fetch::Fetched;
use super::Failures;
use crate::id::BlobId;
use crate::pack::decode_blob;
use crate::repository::Repository;

/// A verified blob's plaintext.
pub struct Decoded {
    /// The blob.
    pub id: BlobId,
    /// Its plaintext, shared by all of its destinations.
    pub data: Arc<Vec<u8>>,
}

/// Runs until `input` is drained or `out` is closed.
pub fn decode_worker(
    repo: &Repository,
    input: Receiver<Fetched>,
    out: Sender<Decoded>,
    failures: &Failures,
) {
    for f in input {
        match decode_blob(repo.key(), &f.key, &f.entry, f.sealed, &f.pack) {
            Ok(data) => {
                if out
                    .send(Decoded {
                        id: f.entry.id,
                        data: Arc::new(data),
                    })
                    .is_err()
                {
                    return;
                }
            }
            Err(e) => failures.blob(&f.entry.id, &e.to_string()),
        }
    }
}
