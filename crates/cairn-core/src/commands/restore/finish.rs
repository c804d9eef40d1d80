//! Finish stage: after the pipeline, the metadata the write stage did not set (files with
//! nothing to write, special files) and hard links, then directories last and deepest first,
//! so a directory's times are set after its contents. Failed files written in part are removed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use super::fsops::hard_link;
use super::meta::apply_to_path;
use super::options::Progress;
use super::shared::Shared;
use super::types::{ClosedDir, FileState, Link};
use crate::engine::parallel::in_parallel;
use cairn_format::tree::NodeKind;

/// Directories last, so their times stay as recorded: the batch's closed directories (whose
/// contents are all written), deepest first (a directory whose mode locks out its owner does
/// not stop its children's), each depth on `threads` threads. Directories that could not be
/// made (`failed`) are left alone.
pub fn finish_dirs(sh: &Shared<'_>, failed: &HashSet<PathBuf>, threads: usize) {
    let mut by_depth: Vec<Vec<&ClosedDir>> = Vec::new();
    for dir in &sh.plan.closed {
        if dir.node.is_some() && !failed.contains(&dir.rel) {
            let depth = dir.rel.components().count();
            if by_depth.len() <= depth {
                by_depth.resize_with(depth + 1, Vec::new);
            }
            by_depth[depth].push(dir);
        }
    }
    for level in by_depth.iter().rev().filter(|l| !l.is_empty()) {
        in_parallel(level, threads, |_, dir| {
            let node = dir.node.as_ref().expect("only directories with a node are listed");
            if let Err(e) = apply_to_path(&sh.target.join(&dir.rel), node, sh.is_root) {
                sh.warn(dir.rel.clone(), e.to_string());
            }
        });
    }
}

/// Hard links, then metadata of every file and other entry the write stage did not finish;
/// failed files are removed so none is left with wrong content.
pub fn finish_all(
    sh: &Shared<'_>,
    failed: &BTreeMap<usize, String>,
    failed_links: &HashMap<PathBuf, String>,
    threads: usize,
    progress: &Progress,
) {
    let plan = sh.plan;
    in_parallel(&plan.entries, threads, |i, entry| {
        if entry.node.kind == NodeKind::Dir || entry.link_of.is_some() {
            return;
        }
        if failed.contains_key(&i) {
            let path = sh.target.join(&entry.rel);
            // A file written in part is removed: a file is either exact or absent. One that
            // nothing was written to still holds what it held before.
            if entry.node.kind == NodeKind::File
                && matches!(sh.states[i], FileState::Create { .. } | FileState::InPlace { .. })
                && sh.touched[i].get().is_some()
            {
                let _ = crate::engine::platform::remove_file(&path);
            }
            return;
        }
        if sh.meta_done[i].load(Ordering::Acquire) || sh.states[i] == FileState::Skip {
            return;
        }
        // The path is made only here: a no-op restore's million files all return above.
        if let Err(e) = apply_to_path(&sh.target.join(&entry.rel), &entry.node, sh.is_root) {
            sh.warn(entry.rel.clone(), e.to_string());
        }
        if entry.node.kind == NodeKind::File {
            progress.done_files.fetch_add(1, Ordering::Relaxed);
        }
    });
    for (i, entry) in plan.entries.iter().enumerate() {
        let Some(link) = &entry.link_of else { continue };
        if let Some(why) = link_failed(link, failed, failed_links) {
            sh.failures.entry(i, &format!("its hard-link target failed: {why}"));
            continue;
        }
        let first = match link {
            Link::Entry(first) => &plan.entries[*first].rel,
            Link::Earlier(rel) => rel,
        };
        if let Err(e) = hard_link(&sh.target.join(first), &sh.target.join(&entry.rel)) {
            sh.warn(entry.rel.clone(), format!("cannot create hard link: {e}"));
        }
    }
}

/// Whether hard link `link` (of an entry of this batch) points at a file that failed, and why.
fn link_failed<'f>(
    link: &Link,
    failed: &'f BTreeMap<usize, String>,
    failed_links: &'f HashMap<PathBuf, String>,
) -> Option<&'f String> {
    match link {
        Link::Entry(first) => failed.get(first),
        Link::Earlier(rel) => failed_links.get(rel),
    }
}
