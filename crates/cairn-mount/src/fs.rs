//! The FUSE side: kernel requests (fuser's [`Filesystem`]) answered from the inode table and
//! the content reader. Everything is read-only; a request that would change anything gets
//! `EROFS`, and an error reading the repository `EIO` (and a line on stderr naming it).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cairn_core::engine::repository::Repository;
use cairn_core::error::Error;
use cairn_format::tree::{Node, NodeKind, Timestamp};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyXattr, Request,
};

use crate::content::{Content, OpenFile};
use crate::inodes::{Inode, Inodes, What};
use crate::prefetch::Source;
use crate::walk::Walk;

/// How long the kernel may keep names and attributes: a snapshot never changes.
const TTL: Duration = Duration::from_secs(24 * 3600);

/// Largest read-ahead asked of the kernel (it grants at most what it allows).
const KERNEL_READAHEAD: u32 = 1024 * 1024;

/// The mounted file system.
pub struct CairnFs {
    repo: Arc<Repository>,
    inodes: Arc<Inodes>,
    content: Content,
    open: Mutex<HashMap<u64, Arc<OpenFile>>>,
    next_fh: AtomicU64,
    /// Owner of the layout's own directories (whoever mounted).
    owner: (u32, u32),
}

impl CairnFs {
    /// A file system over `repo` with the inodes of its layout and `content` to read files.
    pub fn new(repo: Arc<Repository>, inodes: Arc<Inodes>, content: Content) -> Self {
        // SAFETY: getuid and getgid cannot fail and touch no memory.
        let owner = unsafe { (libc::getuid(), libc::getgid()) };
        CairnFs { repo, inodes, content, open: Mutex::new(HashMap::new()), next_fh: AtomicU64::new(1), owner }
    }

    fn inode(&self, ino: INodeNo) -> Result<Arc<Inode>, Errno> {
        self.inodes.get(ino.0).ok_or(Errno::ENOENT)
    }

    fn attr(&self, inode: &Inode) -> FileAttr {
        let (uid, gid) = self.owner;
        let base = |kind, perm, size, time: Timestamp| FileAttr {
            ino: INodeNo(inode.ino),
            size,
            blocks: 0,
            atime: system_time(time),
            mtime: system_time(time),
            ctime: system_time(time),
            crtime: system_time(time),
            kind,
            perm,
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            uid,
            gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        };
        match &inode.what {
            What::Dir { time, .. } => base(FileType::Directory, 0o555, 0, *time),
            What::Link { target, time } => base(FileType::Symlink, 0o777, target.len() as u64, *time),
            What::Node { node, .. } => node_attr(inode.ino, node),
        }
    }

    /// The entries of directory `ino` as listed: `.` and `..` (offsets 1 and 2), then each
    /// entry (offset 3 + its place).
    fn listing(&self, ino: INodeNo) -> Result<Vec<Listed>, Errno> {
        let dir = self.inode(ino)?;
        let entries = self
            .inodes
            .children(&self.repo, &dir)
            .map_err(|e| self.failed(&format!("cannot list directory {}", ino.0), &e))?;
        let parent = match &dir.what {
            What::Node { parent, .. } => self.inodes.get(*parent).unwrap_or_else(|| dir.clone()),
            _ => dir.clone(),
        };
        let mut all = vec![(dir.clone(), b".".to_vec()), (parent, b"..".to_vec())];
        all.extend(entries.iter().filter_map(|(name, i)| Some((self.inodes.get(*i)?, name.clone()))));
        Ok(all)
    }

    /// Logs why a request failed (the kernel only passes the errno on) and returns `EIO`.
    fn failed(&self, what: &str, e: &Error) -> Errno {
        eprintln!("cairn mount: {what}: {e}");
        Errno::EIO
    }
}

/// A listed entry: its inode and name.
type Listed = (Arc<Inode>, Vec<u8>);

/// The attributes a snapshot node records.
fn node_attr(ino: u64, n: &Node) -> FileAttr {
    let kind = match n.kind {
        NodeKind::File => FileType::RegularFile,
        NodeKind::Dir => FileType::Directory,
        NodeKind::Symlink => FileType::Symlink,
        NodeKind::CharDevice => FileType::CharDevice,
        NodeKind::BlockDevice => FileType::BlockDevice,
        NodeKind::Fifo => FileType::NamedPipe,
    };
    // Blocks hold what is stored: zero chunks (holes) take none, as in the source.
    let stored: u64 =
        n.content.iter().filter(|c| matches!(c, cairn_format::tree::Chunk::Data { .. })).map(|c| c.len()).sum();
    FileAttr {
        ino: INodeNo(ino),
        size: if n.kind == NodeKind::Symlink { n.target.len() as u64 } else { n.size },
        blocks: stored.div_ceil(512),
        atime: system_time(n.atime),
        mtime: system_time(n.mtime),
        ctime: system_time(n.ctime),
        crtime: system_time(n.mtime),
        kind,
        perm: (n.mode & 0o7777) as u16,
        nlink: u32::try_from(n.links.max(1)).unwrap_or(u32::MAX),
        uid: n.uid,
        gid: n.gid,
        rdev: n.rdev as u32,
        blksize: 4096,
        flags: 0,
    }
}

fn system_time(t: Timestamp) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(t.nanos.min(999_999_999)));
    if t.secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(t.secs as u64) + nanos
    } else {
        UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs()) + nanos
    }
}

/// A node's extended attributes as the kernel names them, POSIX ACLs included.
fn xattrs(n: &Node) -> Vec<(&[u8], &[u8])> {
    let mut all: Vec<(&[u8], &[u8])> = n.xattrs.iter().map(|x| (x.name.as_slice(), x.value.as_slice())).collect();
    if let Some(acl) = &n.acl_access {
        all.push((b"system.posix_acl_access", acl));
    }
    if let Some(acl) = &n.acl_default {
        all.push((b"system.posix_acl_default", acl));
    }
    all
}

/// Answers a `getxattr`/`listxattr` with `value`: its size when asked for it, `ERANGE` when it
/// does not fit.
fn reply_sized(reply: ReplyXattr, size: u32, value: &[u8]) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if value.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(value);
    }
}

impl Filesystem for CairnFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(most) = config.set_max_readahead(KERNEL_READAHEAD) {
            let _ = config.set_max_readahead(most);
        }
        // Listings carry each entry's attributes (a `tar` or `ls -l` then looks nothing up
        // one name at a time), lookups in one directory run in parallel, and symlink targets
        // are cached like file pages: a snapshot never changes. A kernel without one of these
        // just goes without it.
        for flag in [InitFlags::FUSE_DO_READDIRPLUS, InitFlags::FUSE_PARALLEL_DIROPS, InitFlags::FUSE_CACHE_SYMLINKS] {
            let _ = config.add_capabilities(flag);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let dir = match self.inode(parent) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        match self.inodes.lookup(&self.repo, &dir, name.as_bytes()) {
            Ok(Some(ino)) => match self.inodes.get(ino) {
                Some(i) => reply.entry(&TTL, &self.attr(&i), Generation(0)),
                None => reply.error(Errno::ENOENT),
            },
            Ok(None) => reply.error(Errno::ENOENT),
            Err(e) => reply.error(self.failed(&format!("cannot list directory {}", parent.0), &e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.inode(ino) {
            Ok(i) => reply.attr(&TTL, &self.attr(&i)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.inode(ino).map(|i| match &i.what {
            What::Link { target, .. } => Some(target.clone()),
            What::Node { node, .. } if node.kind == NodeKind::Symlink => Some(node.target.clone()),
            _ => None,
        }) {
            Ok(Some(target)) => reply.data(&target),
            Ok(None) => reply.error(Errno::EINVAL),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            return reply.error(Errno::EROFS);
        }
        let inode = match self.inode(ino) {
            Ok(i) => i,
            Err(e) => return reply.error(e),
        };
        let What::Node { node, parent, .. } = &inode.what else { return reply.error(Errno::EISDIR) };
        if node.kind != NodeKind::File {
            return reply.error(Errno::EINVAL);
        }
        // A walk of the snapshot from this file on, for the read-ahead of small files.
        let walk = || -> Box<dyn Source> {
            let from = self
                .inodes
                .get(*parent)
                .and_then(|dir| self.inodes.children(&self.repo, &dir).ok())
                .and_then(|entries| entries.iter().position(|(_, i)| *i == inode.ino))
                .unwrap_or(0);
            Box::new(Walk::new(self.repo.clone(), self.inodes.clone(), *parent, from))
        };
        let file = Arc::new(self.content.open(node.clone(), walk));
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.open.lock().expect("open files lock").insert(fh, file);
        // A snapshot never changes: what the kernel cached from an earlier open stays valid.
        reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE);
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(file) = self.open.lock().expect("open files lock").get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
        };
        match self.content.read(&file, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(self.failed(&format!("cannot read {:?}", file.node().name_lossy()), &e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let file = self.open.lock().expect("open files lock").remove(&fh.0);
        drop(file); // its read-ahead stops here, outside the lock
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        match self.inode(ino) {
            Ok(i) if matches!(&i.what, What::Dir { .. }) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Ok(i) => match &i.what {
                What::Node { node, .. } if node.kind == NodeKind::Dir => {
                    reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE)
                }
                _ => reply.error(Errno::ENOTDIR),
            },
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let entries = match self.listing(ino) {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        for (at, (inode, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(inode.ino), at as u64 + 1, self.attr(inode).kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let entries = match self.listing(ino) {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        for (at, (inode, name)) in entries.iter().enumerate().skip(offset as usize) {
            let attr = self.attr(inode);
            if reply.add(INodeNo(inode.ino), at as u64 + 1, OsStr::from_bytes(name), &TTL, &attr, Generation(0)) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(0, 0, 0, 0, 0, 4096, 255, 4096);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let inode = match self.inode(ino) {
            Ok(i) => i,
            Err(e) => return reply.error(e),
        };
        let What::Node { node, .. } = &inode.what else { return reply.error(Errno::NO_XATTR) };
        match xattrs(node).into_iter().find(|(n, _)| *n == name.as_bytes()) {
            Some((_, value)) => reply_sized(reply, size, value),
            None => reply.error(Errno::NO_XATTR),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let inode = match self.inode(ino) {
            Ok(i) => i,
            Err(e) => return reply.error(e),
        };
        let mut names = Vec::new();
        if let What::Node { node, .. } = &inode.what {
            for (n, _) in xattrs(node) {
                names.extend_from_slice(n);
                names.push(0);
            }
        }
        reply_sized(reply, size, &names);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        if mask.contains(fuser::AccessFlags::W_OK) {
            reply.error(Errno::EROFS)
        } else {
            reply.ok()
        }
    }
}
