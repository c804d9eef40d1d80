//! Walk stage: one thread lists directories depth first, stats every entry and decides what
//! each file needs. An unchanged file takes its chunk list from the parent snapshot without
//! being read; the rest go to the readers through a bounded queue. Directories are finished
//! asynchronously ([`super::pending`]).

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crossbeam_channel::Sender;

use super::links::Claim;
use super::parent::{unchanged, ParentDir, TreeLoader};
use super::pending::PendingDir;
use super::progress::Counters;
use super::read::{finish, ReadJob};
use super::select::{list_dir, Filter, Listing, Selection};
use super::{stopped, Shared};
use crate::engine::platform::{read_node, read_node_at, NameCache};
use crate::error::Result;
use cairn_format::id::BlobId;
use cairn_format::tree::{Node, NodeKind};

/// A subdirectory that has its place in its directory's tree and is still to be walked.
struct Subdir {
    path: PathBuf,
    name: Vec<u8>,
    pending: Arc<PendingDir>,
    /// On another file system than the path given (`--one-file-system`): recorded empty.
    other_fs: bool,
}

/// The walk stage of one backup.
pub(super) struct Walker<'a, 'b> {
    sh: &'a Shared<'b>,
    filter: &'a Filter,
    jobs: Sender<ReadJob>,
    trees: &'a TreeLoader,
    names: NameCache,
}

impl<'a, 'b> Walker<'a, 'b> {
    /// A walker feeding `jobs` (closed when the walk ends), loading parent trees with `trees`.
    pub fn new(sh: &'a Shared<'b>, filter: &'a Filter, jobs: Sender<ReadJob>, trees: &'a TreeLoader) -> Self {
        Walker { sh, filter, jobs, trees, names: NameCache::default() }
    }

    /// Walks `sel`, comparing with the parent snapshot's root tree `parent`.
    pub fn run(mut self, sel: &Selection, parent: Option<BlobId>) -> Result<()> {
        let root = PendingDir::new(None, parent);
        let mut parent_dir = self.checked(Path::new("/"), ParentDir::root(self.sh.repo, parent, self.trees));
        self.selection(Path::new("/"), sel, &root, &mut parent_dir)?;
        root.listed(self.sh)
    }

    /// The directories from `/` down to the given paths, then the paths themselves.
    fn selection(
        &mut self,
        dir: &Path,
        sel: &Selection,
        pending: &Arc<PendingDir>,
        parent: &mut ParentDir,
    ) -> Result<()> {
        for (name, child) in &sel.children {
            let path = dir.join(OsStr::from_bytes(name));
            let Some(mut node) = self.node(None, &path, name.clone()) else {
                continue;
            };
            if child.whole {
                let root_dev = node.device_id;
                if node.kind == NodeKind::BlockDevice {
                    // A block device given as a path is backed up by content, like an image.
                    if !self.device_as_file(&path, &mut node) {
                        continue;
                    }
                    self.file(&path, node, pending, parent, true)?;
                } else if let Some(sub) = self.entry(&path, node, pending, parent, root_dev)? {
                    self.descend(sub, parent, root_dev)?;
                }
            } else if node.kind == NodeKind::Dir {
                let sub = PendingDir::new(Some(pending.push(node)), parent.subtree(name));
                let mut parent_dir = self.checked(&path, parent.child(name, self.trees));
                self.selection(&path, child, &sub, &mut parent_dir)?;
                sub.listed(self.sh)?;
            } else {
                self.sh.warn(&path, "is not a directory, but paths below it were given".into());
            }
        }
        Ok(())
    }

    /// Says so when the parent snapshot's tree of `dir` could not be read: its files are read
    /// again, so nothing is missing from the new snapshot.
    fn checked(&self, dir: &Path, mut parent: ParentDir) -> ParentDir {
        if let Some(why) = parent.unreadable.take() {
            self.sh.note(dir, format!("the parent snapshot's tree is unreadable, files are read again: {why}"));
        }
        parent
    }

    /// The node of `path`, named `name`, looked up in the open directory `dir` when given.
    fn node(&mut self, dir: Option<&OwnedFd>, path: &Path, name: Vec<u8>) -> Option<Node> {
        let read = match dir {
            Some(dir) => {
                let at = Path::new(path.file_name().unwrap_or(OsStr::new(".")));
                read_node_at(dir, at, path, name, &mut self.names)
            }
            None => read_node(path, name, &mut self.names),
        };
        match read {
            Ok(Some(n)) => Some(n),
            Ok(None) => {
                self.sh.note(path, "is a socket: skipped".into());
                None
            }
            Err(e) => {
                self.sh.warn(path, format!("cannot read metadata: {e}"));
                None
            }
        }
    }

    /// Turns a block device node into a file node holding the device's content.
    fn device_as_file(&mut self, path: &Path, node: &mut Node) -> bool {
        use std::io::Seek;
        match std::fs::File::open(path).and_then(|mut f| f.seek(std::io::SeekFrom::End(0))) {
            Ok(size) => {
                node.kind = NodeKind::File;
                node.rdev = 0;
                node.size = size;
                true
            }
            Err(e) => {
                self.sh.warn(path, format!("cannot open block device: {e}; not backed up"));
                false
            }
        }
    }

    /// One entry below a given path; `root_dev` is the device of that path. A directory gets
    /// its place in `pending` and is returned, to be walked with [`Walker::descend`] once the
    /// listing it is in is closed.
    fn entry(
        &mut self,
        path: &Path,
        node: Node,
        pending: &Arc<PendingDir>,
        parent: &mut ParentDir,
        root_dev: u64,
    ) -> Result<Option<Subdir>> {
        if self.filter.excludes_path(path) {
            return Ok(None);
        }
        match node.kind {
            NodeKind::Dir => {
                if self.filter.excludes_dir(path) {
                    return Ok(None);
                }
                let name = node.name.clone();
                let other_fs = self.filter.stops_at_device(root_dev, node.device_id);
                let pending = PendingDir::new(Some(pending.push(node)), parent.subtree(&name));
                Ok(Some(Subdir { path: path.to_path_buf(), name, pending, other_fs }))
            }
            NodeKind::File => self.file(path, node, pending, parent, false).map(|()| None),
            _ => {
                pending.push_done(node);
                Ok(None)
            }
        }
    }

    /// Walks a subdirectory met by [`Walker::entry`] in the directory whose parent-snapshot
    /// tree is `parent`.
    fn descend(&mut self, sub: Subdir, parent: &mut ParentDir, root_dev: u64) -> Result<()> {
        if !sub.other_fs {
            let mut parent_dir = self.checked(&sub.path, parent.child(&sub.name, self.trees));
            self.dir(&sub.path, &sub.pending, &mut parent_dir, root_dev)?;
        }
        sub.pending.listed(self.sh)
    }

    /// Lists `dir` and finishes or queues each entry in name order while the directory is
    /// open (statted relative to it); its subdirectories are walked after it is closed, so deep
    /// trees hold no descriptor per level, and no more than one entry of a listing is held as
    /// a [`Node`] at a time (a directory of 250,000 files would otherwise hold them all).
    fn dir(&mut self, dir: &Path, pending: &Arc<PendingDir>, parent: &mut ParentDir, root_dev: u64) -> Result<()> {
        let Listing { dir: fd, names } = list_dir(dir, |why| self.sh.warn(dir, why));
        let mut subdirs = Vec::new();
        for name in names {
            let path = dir.join(OsStr::from_bytes(&name));
            let Some(node) = self.node(fd.as_ref(), &path, name) else {
                continue;
            };
            subdirs.extend(self.entry(&path, node, pending, parent, root_dev)?);
        }
        drop(fd);
        for sub in subdirs {
            self.descend(sub, parent, root_dev)?;
        }
        Ok(())
    }

    /// A file: reused from the parent snapshot if unchanged, else queued for a reader.
    fn file(
        &mut self,
        path: &Path,
        mut node: Node,
        pending: &Arc<PendingDir>,
        parent: &ParentDir,
        device: bool,
    ) -> Result<()> {
        let c = self.sh.counters;
        match parent.node(&node.name) {
            Some(old) if !device && unchanged(&old, &node, self.sh.repo) => {
                node.content = old.content;
                Counters::bump(&c.files_unmodified);
                self.sh.progress.file_done(node.size);
                pending.push_done(node);
                return Ok(());
            }
            Some(_) => Counters::bump(&c.files_changed),
            None => Counters::bump(&c.files_new),
        }
        let (size, mtime) = (node.size, node.mtime);
        let link = (node.links > 1 && !device).then_some((node.device_id, node.inode));
        let slot = match link {
            None => pending.push(node),
            Some(key) => {
                let mut node = Some(node);
                match self.sh.links.claim(key, || pending.push(node.take().expect("unclaimed node"))) {
                    Claim::Read => pending.push(node.take().expect("unclaimed node")),
                    Claim::Waiting => {
                        self.sh.progress.file_done(size);
                        return Ok(());
                    }
                    Claim::Done(content) => {
                        self.sh.progress.file_done(size);
                        let slot = pending.push(node.take().expect("unclaimed node"));
                        return finish(self.sh, &slot, content.as_deref());
                    }
                }
            }
        };
        let job = ReadJob { path: path.to_path_buf(), size, mtime, device, slot, link };
        self.jobs.send(job).map_err(|_| stopped("read"))
    }
}
