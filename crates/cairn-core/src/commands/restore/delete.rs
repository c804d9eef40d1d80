//! `--delete`: finds the entries in restored directories that the snapshot lacks (and the
//! filters cover) and removes them.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use super::fsops::remove_any;
use super::shared::Shared;
use super::types::ClosedDir;

/// Entries in the `closed` directories (the target itself, listed as `""`, only with
/// `include_root`) that the restore does not contain and that `selected` (given their path
/// relative to the target) says the restore's filters cover.
pub fn extra_entries(
    target: &Path,
    closed: &[ClosedDir],
    include_root: bool,
    selected: impl Fn(&Path) -> bool,
) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in closed {
        let Some(names) = &dir.names else { continue };
        if dir.node.is_none() && !include_root {
            continue;
        }
        let Ok(listed) = crate::engine::platform::list_names(&target.join(&dir.rel)) else {
            continue;
        };
        for name in listed {
            let name = OsString::from_vec(name);
            if !names.contains(&name) {
                let rel = dir.rel.join(&name);
                if selected(&rel) {
                    out.push(rel);
                }
            }
        }
    }
    out.sort();
    out
}

/// Removes the [`extra_entries`] of the batch's closed directories from the target (the root
/// too when restoring `into_dir`); returns how many were removed, and warns of each that could
/// not be.
pub fn delete_extra(sh: &Shared<'_>, include_root: bool, selected: impl Fn(&Path) -> bool) -> u64 {
    let mut deleted = 0;
    for p in extra_entries(sh.target, &sh.plan.closed, include_root, selected) {
        match remove_any(&sh.target.join(&p)) {
            Ok(()) => deleted += 1,
            Err(e) => sh.warn(p, format!("cannot delete: {e}")),
        }
    }
    deleted
}
