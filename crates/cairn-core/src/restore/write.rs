//! Write stage: positioned writes of each verified blob to every place it belongs.

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_channel::Receiver;

use super::decode::Decoded;
use super::plan::Plan;
use super::Failures;

/// Runs until `input` is drained.
pub fn write_worker(
    target: &Path,
    plan: &Plan,
    input: Receiver<Decoded>,
    failures: &Failures,
    written: &AtomicU64,
) {
    for blob in input {
        let Some(dests) = plan.dests.get(&blob.id) else {
            continue;
        };
        for d in dests {
            let rel = &plan.entries[d.entry as usize].rel;
            let path = target.join(rel);
            let res = OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
                .and_then(|f| f.write_all_at(&blob.data, d.offset));
            match res {
                Ok(()) => {
                    written.fetch_add(blob.data.len() as u64, Ordering::Relaxed);
                }
                Err(e) => failures.entry(d.entry as usize, &format!("cannot write: {e}")),
            }
        }
    }
}
