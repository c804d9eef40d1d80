//! Write stage: positioned writes of each verified blob to every place it belongs — many files
//! at once, and many offsets of one large file at once. A new file is created and sized by its
//! first write; whoever writes its last chunk applies its metadata through the open descriptor.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crossbeam_channel::Receiver;

use super::check::FileState;
use super::create::size_new_file;
use super::decode::Decoded;
use super::dirs::ParentDirs;
use super::finish::apply_to_file;
use super::plan::Dest;
use super::profile::work;
use super::{is_fatal, Shared, Sparse};
use crate::chunker::is_zero;

/// Runs until `input` is drained.
pub fn write_worker<'s>(sh: &'s Shared<'_>, input: Receiver<Vec<Decoded<'s>>>) {
    let clock = &sh.clocks[2];
    let mut dirs = ParentDirs::new(sh.target);
    loop {
        let t = Instant::now();
        let Ok(batch) = input.recv() else { return };
        clock.idle(t);
        for blob in batch {
            if sh.cancelled() {
                break;
            }
            let Some(dests) = sh.fetches.dests.get(&blob.id) else {
                continue;
            };
            work(clock, || {
                for d in dests {
                    if let Err(e) = write_one(sh, &mut dirs, d, &blob.data) {
                        if is_fatal(&e) {
                            sh.fatal(sh.target.join(&sh.plan.entries[d.entry as usize].rel), e);
                            return;
                        }
                        sh.failures.entry(d.entry as usize, &format!("cannot write: {e}"));
                    }
                }
            });
            drop(blob.reservation); // written everywhere: its bytes leave the budget
        }
    }
}

fn write_one(sh: &Shared<'_>, dirs: &mut ParentDirs<'_>, d: &Dest, data: &[u8]) -> io::Result<()> {
    let i = d.entry as usize;
    let entry = &sh.plan.entries[i];
    let file = dirs.create(&entry.rel, entry.node.mode)?;
    let fresh = matches!(sh.states[i], FileState::Create { .. });
    if fresh && !sh.sized[i].swap(true, Ordering::AcqRel) {
        size_new_file(&file, &entry.node, sh.sparse)?;
    }
    if fresh && sh.sparse == Sparse::Always {
        write_skipping_zeros(&file, data, d.offset)?;
    } else {
        file.write_all_at(data, d.offset)?;
    }
    sh.written.fetch_add(data.len() as u64, Ordering::Relaxed);
    if sh.remaining[i].fetch_sub(1, Ordering::AcqRel) == 1 {
        finish_file(sh, i, &file, fresh);
    }
    Ok(())
}

/// The last chunk of file `i` is written: apply its metadata now, while it is open.
fn finish_file(sh: &Shared<'_>, i: usize, file: &File, fresh: bool) {
    let entry = &sh.plan.entries[i];
    // A file created in a directory with a default ACL inherited an ACL: treat it as existing.
    let inherited = !sh.acl_dirs.is_empty() && sh.acl_dirs.contains(entry.rel.parent().unwrap_or(Path::new("")));
    let created = (fresh && !inherited).then_some(sh.umask);
    if let Err(e) = apply_to_file(file, &entry.node, sh.is_root, created) {
        sh.warn(entry.rel.clone(), e.to_string());
    }
    sh.meta_done[i].store(true, Ordering::Release);
    sh.files_done.fetch_add(1, Ordering::Relaxed);
}

/// With `--sparse always`: 4 KiB blocks of zeros inside data are left as holes.
fn write_skipping_zeros(file: &File, data: &[u8], offset: u64) -> io::Result<()> {
    const BLOCK: usize = 4096;
    let mut start = 0;
    while start < data.len() {
        let end = (start + BLOCK).min(data.len());
        if is_zero(&data[start..end]) {
            start = end;
            continue;
        }
        let mut run_end = end;
        while run_end < data.len() && !is_zero(&data[run_end..(run_end + BLOCK).min(data.len())]) {
            run_end = (run_end + BLOCK).min(data.len());
        }
        file.write_all_at(&data[start..run_end], offset + start as u64)?;
        start = run_end;
    }
    Ok(())
}
