//! The inode table: every name the mount shows gets an inode number when its directory is
//! first listed or looked up, and keeps it for the life of the mount. Snapshot directories are
//! loaded lazily, one tree when first visited; hard links of one snapshot (nodes with more than
//! one link and the same device and inode at backup time) share one inode number.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use cairn_core::engine::repository::Repository;
use cairn_core::error::Result;
use cairn_format::tree::{Node, NodeKind, Timestamp};

/// An inode number (1 is the root).
pub type Ino = u64;

/// The root directory's inode number.
pub const ROOT: Ino = 1;

/// A directory entry: its name and inode.
pub type Child = (Vec<u8>, Ino);

/// What an inode is.
pub enum What {
    /// A directory of the mount's own layout (the root, `snapshots/`, `hosts/HOST/`, …).
    Dir { children: OnceLock<Vec<Child>>, time: Timestamp },
    /// A symlink of the layout (`latest`).
    Link { target: Vec<u8>, time: Timestamp },
    /// A node of a snapshot; `snapshot` is the inode of the snapshot's root in this place of
    /// the layout (hard links are matched within it), `parent` the directory it was first
    /// found in. A directory's entries are read on first use.
    Node { node: Arc<Node>, snapshot: Ino, parent: Ino, children: Mutex<Option<Arc<[Child]>>> },
}

/// One inode.
pub struct Inode {
    /// Its number.
    pub ino: Ino,
    /// What it is.
    pub what: What,
}

impl Inode {
    /// The entries of a layout directory or a loaded snapshot directory (`None`: not a
    /// directory, or not loaded yet).
    fn listed(&self) -> Option<Arc<[Child]>> {
        match &self.what {
            What::Dir { children, .. } => children.get().map(|c| Arc::from(c.as_slice())),
            What::Node { children, .. } => children.lock().expect("children lock").clone(),
            What::Link { .. } => None,
        }
    }
}

/// Every inode handed out, by number.
pub struct Inodes {
    table: RwLock<Vec<Arc<Inode>>>,
    /// Hard-link groups seen so far: (snapshot root, device, inode) → the group's inode.
    links: Mutex<HashMap<(Ino, u64, u64), Ino>>,
}

impl Inodes {
    /// An empty table whose first inode will be [`ROOT`].
    pub fn new() -> Self {
        Inodes { table: RwLock::new(Vec::new()), links: Mutex::new(HashMap::new()) }
    }

    /// Adds an inode; returns its number.
    pub fn add(&self, what: impl FnOnce(Ino) -> What) -> Ino {
        let mut t = self.table.write().expect("inode table lock");
        let ino = t.len() as Ino + 1;
        t.push(Arc::new(Inode { ino, what: what(ino) }));
        ino
    }

    /// Inode `ino`, if it exists.
    pub fn get(&self, ino: Ino) -> Option<Arc<Inode>> {
        let i = usize::try_from(ino.checked_sub(1)?).ok()?;
        self.table.read().expect("inode table lock").get(i).cloned()
    }

    /// Sets the entries of a layout directory (once, while the layout is built), sorted by
    /// name.
    pub fn set_children(&self, dir: Ino, entries: Vec<Child>) {
        if let Some(What::Dir { children, .. }) = self.get(dir).as_ref().map(|i| &i.what) {
            let _ = children.set(entries);
        }
    }

    /// The entries of directory `dir`, in name order, reading its tree on first use.
    pub fn children(&self, repo: &Repository, dir: &Inode) -> Result<Arc<[Child]>> {
        let What::Node { node, snapshot, children, .. } = &dir.what else {
            return Ok(dir.listed().unwrap_or_else(|| Arc::from(Vec::new())));
        };
        let mut loaded = children.lock().expect("children lock");
        if let Some(c) = loaded.as_ref() {
            return Ok(c.clone());
        }
        let Some(subtree) = node.subtree else { return Ok(Arc::from(Vec::new())) };
        let tree = repo.read_tree(&subtree)?;
        let entries: Arc<[Child]> = tree
            .nodes
            .into_iter()
            .map(|n| {
                let name = n.name.clone();
                (name, self.add_node(n, *snapshot, dir.ino))
            })
            .collect();
        *loaded = Some(entries.clone());
        Ok(entries)
    }

    /// The inode of a snapshot node: its hard-link group's, or a new one.
    fn add_node(&self, node: Node, snapshot: Ino, parent: Ino) -> Ino {
        let make =
            |node: Node| move |_| What::Node { node: Arc::new(node), snapshot, parent, children: Mutex::new(None) };
        if node.kind == NodeKind::Dir || node.links < 2 {
            return self.add(make(node));
        }
        let mut links = self.links.lock().expect("links lock");
        let key = (snapshot, node.device_id, node.inode);
        if let Some(&ino) = links.get(&key) {
            return ino;
        }
        let ino = self.add(make(node));
        links.insert(key, ino);
        ino
    }

    /// Looks `name` up in directory `dir`.
    pub fn lookup(&self, repo: &Repository, dir: &Inode, name: &[u8]) -> Result<Option<Ino>> {
        let children = self.children(repo, dir)?;
        Ok(children.binary_search_by(|(n, _)| n.as_slice().cmp(name)).ok().map(|i| children[i].1))
    }
}

impl Default for Inodes {
    fn default() -> Self {
        Self::new()
    }
}
