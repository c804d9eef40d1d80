//! Restore: `plan → create → fetch → decode → write → finish`, one module per stage.
//!
//! The plan lists every entry and every distinct blob with all of its destinations. Entries
//! are created first (files at their final size, so zero ranges stay holes). Then three pools
//! run at once, joined by bounded channels: fetch workers issue ranged pack reads, decode
//! workers decrypt, decompress and verify, write workers do positioned writes. Metadata comes
//! last, directories after their contents.

mod create;
mod decode;
mod fetch;
mod finish;
mod plan;
mod write;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crossbeam_channel::bounded;

pub use plan::Plan;

use crate::error::{Error, Result};
use crate::id::BlobId;
use crate::repository::Repository;
use crate::snapshot::Snapshot;
use crate::tree::NodeKind;
use plan::Top;

/// How to restore.
#[derive(Clone, Debug)]
pub struct RestoreOptions {
    /// Ranged reads in flight.
    pub fetch_concurrency: usize,
    /// Threads decrypting and decompressing.
    pub decode_threads: usize,
    /// Threads writing files.
    pub write_threads: usize,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        RestoreOptions {
            fetch_concurrency: 4,
            decode_threads: cores,
            write_threads: cores.max(2),
        }
    }
}

/// What a restore did.
#[derive(Debug, Default)]
pub struct RestoreOutcome {
    /// Regular files restored (hard links included).
    pub files: u64,
    /// Directories restored.
    pub dirs: u64,
    /// Other entries (symlinks, devices, FIFOs).
    pub others: u64,
    /// Bytes of file content.
    pub bytes_total: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Stored bytes fetched from the repository.
    pub bytes_fetched: u64,
    /// Bytes restored as holes.
    pub bytes_zero: u64,
    /// Entries that could not be restored, with the reason (the exit code is then non-zero).
    pub failed: Vec<(PathBuf, String)>,
    /// Metadata that could not be applied.
    pub warnings: Vec<(PathBuf, String)>,
    /// Wall time.
    pub duration: Duration,
}

/// Failures collected while the pipeline runs.
pub struct Failures<'p> {
    plan: &'p Plan,
    entries: Mutex<BTreeMap<usize, String>>,
    cancel: AtomicBool,
}

impl Failures<'_> {
    /// Every file that needs blob `id` fails with `why`.
    pub fn blob(&self, id: &BlobId, why: &str) {
        for d in self.plan.dests.get(id).into_iter().flatten() {
            self.entry(d.entry as usize, why);
        }
    }

    /// Entry `i` fails with `why` (the first reason is kept).
    pub fn entry(&self, i: usize, why: &str) {
        self.entries
            .lock()
            .expect("failures lock")
            .entry(i)
            .or_insert_with(|| why.to_string());
    }

    /// Whether the restore is being shut down.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }
}

/// Restores `snapshot` (or its `path`, absolute inside the snapshot) into `target`.
pub fn restore(
    repo: &Repository,
    snapshot: &Snapshot,
    path: Option<&str>,
    target: &Path,
    opts: &RestoreOptions,
) -> Result<RestoreOutcome> {
    let started = Instant::now();
    let short = snapshot.tree.short();
    let top = match path
        .map(|p| p.trim_end_matches('/'))
        .filter(|p| !p.is_empty())
    {
        None => Top::Tree(snapshot.tree),
        Some(p) => match plan::resolve(repo, &snapshot.tree, p, &short)? {
            None => Top::Tree(snapshot.tree),
            Some(node) if node.kind == NodeKind::Dir => {
                Top::Tree(node.subtree.expect("validated dir"))
            }
            Some(node) => Top::Node(Box::new(node)),
        },
    };
    let plan = plan::build(repo, top)?;
    std::fs::create_dir_all(target)
        .map_err(|e| Error::io(target, "cannot create restore target", e))?;
    let is_root = crate::platform::is_root();
    let failures = Failures {
        plan: &plan,
        entries: Mutex::new(BTreeMap::new()),
        cancel: AtomicBool::new(false),
    };
    for &(entry, id) in &plan.missing {
        failures.entry(
            entry,
            &format!("blob {} is not in the repository index", id.short()),
        );
    }

    let mut out = RestoreOutcome {
        bytes_total: plan.total_bytes,
        bytes_zero: plan.zero_bytes,
        ..Default::default()
    };
    for (i, entry) in plan.entries.iter().enumerate() {
        if let Err(e) = create::create_entry(target, &plan, entry, is_root) {
            if is_fatal(&e) {
                return Err(Error::io(target.join(&entry.rel), "cannot create", e));
            }
            failures.entry(i, &format!("cannot create: {e}"));
        }
    }

    let written = AtomicU64::new(0);
    run_pipeline(repo, &plan, target, opts, &failures, &written);
    out.bytes_written = written.load(Ordering::Relaxed);
    out.bytes_fetched = plan.fetch_bytes;

    let failed = failures.entries.into_inner().expect("failures lock");
    for (i, entry) in plan.entries.iter().enumerate().rev() {
        let path = target.join(&entry.rel);
        if let Some(why) = failed
            .get(&i)
            .or_else(|| entry.link_of.and_then(|f| failed.get(&f)))
        {
            // Never leave a file with wrong content behind.
            if entry.node.kind == NodeKind::File && create::is_regular_file(&path) {
                let _ = std::fs::remove_file(&path);
            }
            out.failed.push((entry.rel.clone(), why.clone()));
            continue;
        }
        match entry.node.kind {
            NodeKind::File => out.files += 1,
            NodeKind::Dir => out.dirs += 1,
            _ => out.others += 1,
        }
        if entry.link_of.is_some() {
            continue;
        }
        if let Err(e) = finish::apply_metadata(&path, &entry.node, is_root) {
            out.warnings.push((entry.rel.clone(), e.to_string()));
        }
    }
    out.failed.reverse();
    out.warnings.reverse();
    out.duration = started.elapsed();
    Ok(out)
}

/// Errors that no other entry will escape either: the restore stops.
fn is_fatal(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC) | Some(libc::EROFS) | Some(libc::EDQUOT)
    )
}

fn run_pipeline(
    repo: &Repository,
    plan: &Plan,
    target: &Path,
    opts: &RestoreOptions,
    failures: &Failures<'_>,
    written: &AtomicU64,
) {
    let fetchers = opts.fetch_concurrency.max(1);
    let decoders = opts.decode_threads.max(1);
    let writers = opts.write_threads.max(1);
    std::thread::scope(|s| {
        let (reads_tx, reads_rx) = bounded(fetchers);
        let (fetched_tx, fetched_rx) = bounded(decoders * 4);
        let (decoded_tx, decoded_rx) = bounded(writers * 4);
        for _ in 0..fetchers {
            let (rx, tx) = (reads_rx.clone(), fetched_tx.clone());
            s.spawn(move || fetch::fetch_worker(repo, rx, tx, failures));
        }
        for _ in 0..decoders {
            let (rx, tx) = (fetched_rx.clone(), decoded_tx.clone());
            s.spawn(move || decode::decode_worker(repo, rx, tx, failures));
        }
        for _ in 0..writers {
            let rx = decoded_rx.clone();
            s.spawn(move || write::write_worker(target, plan, rx, failures, written));
        }
        drop((reads_rx, fetched_tx, fetched_rx, decoded_tx, decoded_rx));
        for read in &plan.reads {
            if reads_tx.send(read).is_err() {
                break;
            }
        }
    });
}

/// Finds the node at absolute `path` inside `snapshot` (`None` for `/`); `short` names the
/// snapshot in errors.
pub fn resolve_path(
    repo: &Repository,
    snapshot: &Snapshot,
    path: &str,
    short: &str,
) -> Result<Option<crate::tree::Node>> {
    plan::resolve(repo, &snapshot.tree, path, short)
}
