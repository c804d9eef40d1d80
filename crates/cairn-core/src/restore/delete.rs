//! `--delete`: finds the entries in restored directories that the snapshot lacks (and the
//! filters cover) and removes them.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use super::fsops::remove_any;
use super::shared::Shared;
use super::types::Plan;
use crate::tree::NodeKind;

/// Entries in restored directories that the restore does not contain and that `selected`
/// (given their path relative to the target) says the restore's filters cover.
pub fn extra_entries(target: &Path, plan: &Plan, include_root: bool, selected: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
    let mut children: HashMap<PathBuf, HashSet<OsString>> = HashMap::new();
    if include_root {
        children.entry(PathBuf::new()).or_default();
    }
    for e in &plan.entries {
        if e.node.kind == NodeKind::Dir {
            children.entry(e.rel.clone()).or_default();
        }
        let parent = e.rel.parent().map(Path::to_path_buf).unwrap_or_default();
        if let Some(name) = e.rel.file_name() {
            children.entry(parent).or_default().insert(name.to_os_string());
        }
    }
    let mut out = Vec::new();
    for (dir, names) in &children {
        let Ok(listed) = crate::platform::list_names(&target.join(dir)) else {
            continue;
        };
        for name in listed {
            let name = OsString::from_vec(name);
            let rel = dir.join(&name);
            if !names.contains(&name) && selected(&rel) {
                out.push(rel);
            }
        }
    }
    out.sort();
    out
}

/// Removes the [`extra_entries`] from the target (the root too when restoring `into_dir`);
/// returns how many were removed, and warns of each that could not be.
pub fn delete_extra(sh: &Shared<'_>, include_root: bool, selected: impl Fn(&Path) -> bool) -> u64 {
    let mut deleted = 0;
    for p in extra_entries(sh.target, sh.plan, include_root, selected) {
        match remove_any(&sh.target.join(&p)) {
            Ok(()) => deleted += 1,
            Err(e) => sh.warn(p, format!("cannot delete: {e}")),
        }
    }
    deleted
}
