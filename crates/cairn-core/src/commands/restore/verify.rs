//! `--verify`: re-reads every restored file after the restore and checks each chunk against
//! the snapshot (data chunks by their keyed ID, zero chunks as zeros).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::compare::compare_path;
use super::types::{FileState, Plan};
use crate::engine::parallel::in_parallel;
use cairn_format::crypto::MasterKey;
use cairn_format::tree::NodeKind;

/// Checks the restored files; returns how many were checked and the ones that differ.
pub fn verify(
    target: &Path,
    plan: &Plan,
    states: &[FileState],
    failed: &BTreeMap<usize, String>,
    key: &MasterKey,
    threads: usize,
) -> (u64, Vec<(PathBuf, String)>) {
    let checked = AtomicUsize::new(0);
    let bad = Mutex::new(Vec::new());
    in_parallel(&plan.entries, threads, |i, e| {
        if e.node.kind != NodeKind::File || failed.contains_key(&i) || states[i] == FileState::Skip {
            return;
        }
        checked.fetch_add(1, Ordering::Relaxed);
        let path = target.join(&e.rel);
        match compare_path(&path, &e.node, key) {
            Ok(FileState::Complete) => {}
            Ok(_) => bad
                .lock()
                .expect("bad")
                .push((e.rel.clone(), "verification failed: content differs from the snapshot".into())),
            Err(err) => bad.lock().expect("bad").push((e.rel.clone(), format!("verification failed: {err}"))),
        }
    });
    (checked.load(Ordering::Relaxed) as u64, bad.into_inner().expect("bad"))
}
