//! Walk stage: turns the paths to back up into trees, depth first, one tree blob per
//! directory. The root tree holds the directories from `/` down to each path.

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use super::read::read_file;
use super::store::BlobStore;
use super::{Counters, Warning};
use crate::chunker::ChunkerKind;
use crate::error::{Error, Result};
use crate::id::BlobId;
use crate::pack::BlobKind;
use crate::platform::{read_node, NameCache};
use crate::tree::{Node, NodeKind, Tree};

/// The part of the file system a backup covers: path components from `/` down.
#[derive(Default, Debug)]
pub struct Selection {
    /// The whole subtree below this point is backed up.
    pub whole: bool,
    /// Components below this point that lead to backed-up paths.
    pub children: BTreeMap<Vec<u8>, Selection>,
}

/// Makes `p` absolute and removes `.` and `..` without following symlinks.
pub fn absolute(p: &Path) -> Result<PathBuf> {
    let abs = std::path::absolute(p).map_err(|e| Error::io(p, "cannot make absolute", e))?;
    let mut out = PathBuf::from("/");
    for c in abs.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    Ok(out)
}

impl Selection {
    /// Builds the selection for absolute `paths`.
    pub fn new(paths: &[PathBuf]) -> Self {
        let mut root = Selection::default();
        for p in paths {
            let mut at = &mut root;
            for c in p.components() {
                if let Component::Normal(n) = c {
                    at = at.children.entry(n.as_bytes().to_vec()).or_default();
                }
            }
            at.whole = true;
        }
        root
    }
}

/// Walks and stores; shared by every directory of one backup.
pub struct Walker<'a, 's> {
    /// Where blobs go.
    pub store: &'a BlobStore<'s>,
    /// How file content is cut.
    pub chunker: ChunkerKind,
    /// Statistics.
    pub counters: &'a mut Counters,
    /// Problems met (the backup goes on).
    pub warnings: &'a mut Vec<Warning>,
    /// User and group names.
    pub names: NameCache,
    /// Files already read in this backup, by (device, inode): hard links are read once.
    pub hardlinks: std::collections::HashMap<(u64, u64), Vec<crate::tree::Chunk>>,
}

impl Walker<'_, '_> {
    fn warn(&mut self, path: &Path, what: String) {
        self.counters.errors += 1;
        self.warnings.push(Warning { path: path.to_path_buf(), message: what });
    }

    /// Stores the tree for directory `dir` according to `sel`; returns its blob ID.
    pub fn selection_tree(&mut self, dir: &Path, sel: &Selection) -> Result<BlobId> {
        if sel.whole {
            return self.dir_tree(dir);
        }
        let mut tree = Tree::default();
        for (name, child) in &sel.children {
            let path = dir.join(std::ffi::OsStr::from_bytes(name));
            let Some(mut node) = self.node(&path, name.clone()) else {
                continue;
            };
            if child.whole {
                if !self.fill(&path, &mut node)? {
                    continue;
                }
            } else if node.kind == NodeKind::Dir {
                node.subtree = Some(self.selection_tree(&path, child)?);
                self.counters.dirs += 1;
            } else {
                self.warn(&path, "is not a directory, but paths below it were given".into());
                continue;
            }
            tree.nodes.push(node);
        }
        self.store.save(BlobKind::Tree, tree.to_bytes())
    }

    fn node(&mut self, path: &Path, name: Vec<u8>) -> Option<Node> {
        match read_node(path, name, &mut self.names) {
            Ok(Some(n)) => Some(n),
            Ok(None) => {
                self.warnings.push(Warning { path: path.to_path_buf(), message: "is a socket: skipped".into() });
                None
            }
            Err(e) => {
                self.warn(path, format!("cannot read metadata: {e}"));
                None
            }
        }
    }

    /// Fills in a node's content (files) or subtree (directories); `false` when the entry
    /// could not be read and is left out of the snapshot.
    fn fill(&mut self, path: &Path, node: &mut Node) -> Result<bool> {
        match node.kind {
            NodeKind::Dir => {
                node.subtree = Some(self.dir_tree(path)?);
                Ok(true)
            }
            NodeKind::File => self.file(path, node),
            _ => Ok(true),
        }
    }

    fn file(&mut self, path: &Path, node: &mut Node) -> Result<bool> {
        let link_key = (node.device_id, node.inode);
        if node.links > 1 {
            if let Some(content) = self.hardlinks.get(&link_key) {
                node.content = content.clone();
                self.counters.files_new += 1;
                return Ok(true);
            }
        }
        match read_file(path, node, &self.chunker, self.store) {
            Ok(r) => {
                self.counters.bytes_read += r.bytes_read;
                node.content = r.content;
                node.size = node.content.iter().map(|c| c.len()).sum();
                if let Some(why) = r.changed {
                    self.warn(path, why);
                }
                self.counters.files_new += 1;
                if node.links > 1 {
                    self.hardlinks.insert(link_key, node.content.clone());
                }
                Ok(true)
            }
            Err(Error::Io { source, what, .. }) => {
                self.warn(path, format!("{what}: {source}; not backed up"));
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Stores the tree of everything below `dir`.
    pub fn dir_tree(&mut self, dir: &Path) -> Result<BlobId> {
        self.counters.dirs += 1;
        let mut entries: Vec<(Vec<u8>, PathBuf)> = match std::fs::read_dir(dir) {
            Ok(rd) => rd
                .filter_map(|e| match e {
                    Ok(e) => Some((e.file_name().as_bytes().to_vec(), e.path())),
                    Err(err) => {
                        self.warn(dir, format!("cannot list: {err}"));
                        None
                    }
                })
                .collect(),
            Err(e) => {
                self.warn(dir, format!("cannot list directory: {e}"));
                Vec::new()
            }
        };
        entries.sort();
        let mut tree = Tree::default();
        for (name, path) in entries {
            let Some(mut node) = self.node(&path, name) else {
                continue;
            };
            if !self.fill(&path, &mut node)? {
                continue;
            }
            tree.nodes.push(node);
        }
        self.store.save(BlobKind::Tree, tree.to_bytes())
    }
}
