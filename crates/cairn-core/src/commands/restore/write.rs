//! Write stage: positioned writes of each verified blob to every place it belongs, many files at
//! once. A file is prepared by its first write — whatever stands in its way removed, a new file
//! created and sized, an existing one resized and its stale data punched out — so a file whose
//! data never arrives (a damaged or missing pack) is left as it was. Whoever writes its last
//! chunk applies its metadata through the open descriptor.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crossbeam_channel::Receiver;

use super::dirs::ParentDirs;
use super::fsops::{fix_in_place, is_fatal, remove_any, size_new_file};
use super::meta::{apply_to_file, Created};
use super::options::{Sparse, WriteGuard};
use super::shared::Shared;
use super::types::{Dest, FileState};
use crate::engine::chunker::is_zero;
use crate::engine::profile::work;
use crate::engine::read::Decoded;
use cairn_format::id::BlobId;
use cairn_format::pack::BlobEntry;

/// Runs until `input` is drained. A writer not `working` from the start (one the writers'
/// controller may put to work later) counts no idle time until its first blobs arrive.
pub fn write_worker<'s>(sh: &'s Shared<'_>, input: Receiver<Vec<Decoded<'s>>>, mut working: bool) {
    let clock = &sh.write_clock;
    let t = Instant::now();
    sh.dirs_ready.wait(); // the directories are made alongside the first fetches
    if working {
        clock.idle(t);
    }
    let mut dirs = ParentDirs::new(sh.target);
    loop {
        let t = Instant::now();
        let Ok(batch) = input.recv() else { return };
        if working {
            clock.idle(t);
        }
        working = true;
        for blob in batch {
            if sh.cancelled() {
                break;
            }
            let Some(dests) = sh.fetches.dests.get(&blob.id) else {
                continue;
            };
            work(clock, || each_dest(sh, dests, |d| write_one(sh, &mut dirs, d, &blob.data)));
            drop(blob); // written everywhere: its bytes leave memory, then the budget
        }
    }
}

/// Runs `one` for each of `dests`: a failure is the entry's, or stops the restore when fatal.
pub(super) fn each_dest(sh: &Shared<'_>, dests: &[Dest], mut one: impl FnMut(&Dest) -> io::Result<()>) {
    for d in dests {
        if let Err(e) = one(d) {
            if is_fatal(&e) {
                sh.fatal(sh.target.join(&sh.plan.entries[d.entry as usize].rel), e);
                return;
            }
            sh.failures.entry(d.entry as usize, &format!("cannot write: {e}"));
        }
    }
}

/// A live restore's (one with a guard) check before it fetches `read`: when every blob of it
/// goes only where the target is final already (a client's read or write brought it since the
/// plan), the read is not made and each of its chunks counts as written — the file finished if
/// it was its last. Returns whether the read is skipped. Without a guard, never.
pub fn skip_present(sh: &Shared<'_>, dirs: &mut ParentDirs<'_>, read: &crate::engine::read::PackRead) -> bool {
    let Some(guard) = sh.guard else { return false };
    let dests = |id: &BlobId| sh.fetches.dests.get(id).map_or(&[][..], Vec::as_slice);
    let present = |b: &BlobEntry| dests(&b.id).iter().all(|d| guard.present(d.offset, u64::from(b.raw_length)));
    if !read.blobs.iter().all(present) {
        return false;
    }
    for b in &read.blobs {
        each_dest(sh, dests(&b.id), |d| {
            let (file, fresh) = open_for(sh, dirs, d.entry as usize)?;
            written(sh, d.entry as usize, &file, fresh, u64::from(b.raw_length));
            Ok(())
        });
    }
    true
}

pub(super) fn write_one(sh: &Shared<'_>, dirs: &mut ParentDirs<'_>, d: &Dest, data: &[u8]) -> io::Result<()> {
    let (file, fresh) = open_for(sh, dirs, d.entry as usize)?;
    if !sh.write_latency.is_zero() {
        std::thread::sleep(sh.write_latency); // fault injection: a target that makes writes wait
    }
    write_data(&file, data, d.offset, fresh, sh.sparse, sh.guard)?;
    written(sh, d.entry as usize, &file, fresh, data.len() as u64);
    Ok(())
}

/// Counts `len` bytes of file `i` written; whoever writes its last chunk finishes it.
fn written(sh: &Shared<'_>, i: usize, file: &File, fresh: bool, len: u64) {
    sh.written.fetch_add(len, Ordering::Relaxed);
    if sh.remaining[i].fetch_sub(1, Ordering::AcqRel) == 1 {
        finish_file(sh, i, file, fresh);
    }
}

/// File `i` opened for a write (prepared by the first one), and whether it is a new file.
fn open_for(sh: &Shared<'_>, dirs: &mut ParentDirs<'_>, i: usize) -> io::Result<(File, bool)> {
    let entry = &sh.plan.entries[i];
    // The first write prepares the file; a concurrent write to it waits for that.
    let mut opened = None;
    let prepared = sh.touched[i].get_or_init(|| match first_touch(sh, dirs, i) {
        Ok(f) => {
            opened = Some(f);
            Ok(())
        }
        Err(e) => Err((e.raw_os_error(), e.to_string())),
    });
    if let Err((code, why)) = prepared {
        return Err(code.map_or_else(|| io::Error::other(why.clone()), io::Error::from_raw_os_error));
    }
    let file = match opened {
        Some(f) => f,
        None => dirs.create(&entry.rel, entry.node.mode)?,
    };
    Ok((file, matches!(sh.states[i], FileState::Create { .. })))
}

/// Readies file `i` for its first write and opens it: clears what is in the way and sizes a new
/// file, or resizes an existing one and punches holes where the snapshot has zeros.
fn first_touch(sh: &Shared<'_>, dirs: &mut ParentDirs<'_>, i: usize) -> io::Result<File> {
    let (entry, state, guard) = (&sh.plan.entries[i], &sh.states[i], sh.guard);
    if guard.is_some() && matches!(state, FileState::Create { .. }) {
        // The live target is served from its open descriptor: it is never replaced.
        return Err(io::Error::other("the live restore's target is not a plain file of its size"));
    }
    if *state == (FileState::Create { clear: true }) {
        remove_any(&sh.target.join(&entry.rel))?;
    }
    let file = dirs.create(&entry.rel, entry.node.mode)?;
    match state {
        FileState::Create { .. } => size_new_file(&file, &entry.node, sh.sparse)?,
        FileState::InPlace { zero_fix, resize, .. } => fix_in_place(&file, &entry.node, zero_fix, *resize, guard)?,
        _ => {}
    }
    Ok(file)
}

/// Writes a chunk's `data` at `offset`; into a `fresh` file with `--sparse always`, 4 KiB
/// blocks of zeros are left as holes. A live restore's `guard` writes instead.
fn write_data(
    file: &File,
    data: &[u8],
    offset: u64,
    fresh: bool,
    sparse: Sparse,
    guard: Option<&dyn WriteGuard>,
) -> io::Result<()> {
    if let Some(g) = guard {
        g.write(file, offset, data)
    } else if fresh && sparse == Sparse::Always {
        write_skipping_zeros(file, data, offset)
    } else {
        file.write_all_at(data, offset)
    }
}

/// The last chunk of file `i` is written: apply its metadata now, while it is open.
fn finish_file(sh: &Shared<'_>, i: usize, file: &File, fresh: bool) {
    let entry = &sh.plan.entries[i];
    // A file created in a directory with a default ACL inherited an ACL: treat it as existing.
    let parent = entry.rel.parent().unwrap_or(Path::new(""));
    let inherited = sh.acl_dirs.get().is_some_and(|acl| !acl.is_empty() && acl.contains(parent));
    let created = (fresh && !inherited).then(|| {
        let owner = || file.metadata().ok().map(|md| (md.uid(), md.gid()));
        Created { umask: sh.umask, owner: if sh.is_root { sh.new_owners.of(parent, owner) } else { None } }
    });
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
