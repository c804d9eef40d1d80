//! Building source trees for the tests. [`Tree`] makes one entry at a time (files of random
//! bytes from one [`Rng`], links, modes, times, xattrs, FIFOs), in the order the calls come, so
//! the same calls make the same bytes; [`spec`] describes whole trees as data (and generates
//! them with proptest) and makes them on disk.

pub mod spec;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::{scan_source, set_times, Scan};

/// A small, fast, deterministic generator (SplitMix64).
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            out.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        out.truncate(len);
        out
    }
}

/// A tree being made below `root`: every path is relative to it, parents are made as needed,
/// and random contents come from one [`Rng`] in the order of the calls.
pub struct Tree {
    /// Where the tree is made.
    pub root: PathBuf,
    /// The generator of the random contents.
    pub rng: Rng,
}

impl Tree {
    /// A tree below `root` (made if missing) whose random bytes come from `Rng(seed)`.
    pub fn new(root: &Path, seed: u64) -> Tree {
        fs::create_dir_all(root).unwrap_or_else(|e| panic!("mkdir {}: {e}", root.display()));
        Tree { root: root.to_path_buf(), rng: Rng(seed) }
    }

    /// The absolute path of `rel`.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn parent_of(&self, rel: &str) -> PathBuf {
        let path = self.path(rel);
        let parent = path.parent().expect("a path below the root");
        fs::create_dir_all(parent).unwrap_or_else(|e| panic!("mkdir {}: {e}", parent.display()));
        path
    }

    /// The directory `rel` (and its parents).
    pub fn dir(&mut self, rel: &str) -> &mut Self {
        fs::create_dir_all(self.path(rel)).unwrap_or_else(|e| panic!("mkdir {rel}: {e}"));
        self
    }

    /// The file `rel` holding `data`.
    pub fn file(&mut self, rel: &str, data: impl AsRef<[u8]>) -> &mut Self {
        let path = self.parent_of(rel);
        fs::write(&path, data).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        self
    }

    /// The file `rel` holding `len` random bytes.
    pub fn random(&mut self, rel: &str, len: usize) -> &mut Self {
        let data = self.rng.bytes(len);
        self.file(rel, data)
    }

    /// `rel` as a hard link to the existing `existing`.
    pub fn hard_link(&mut self, existing: &str, rel: &str) -> &mut Self {
        let path = self.parent_of(rel);
        fs::hard_link(self.path(existing), &path).unwrap_or_else(|e| panic!("link {}: {e}", path.display()));
        self
    }

    /// `rel` as a symlink to `target` (as written, relative or not).
    pub fn symlink(&mut self, target: &str, rel: &str) -> &mut Self {
        let path = self.parent_of(rel);
        std::os::unix::fs::symlink(target, &path).unwrap_or_else(|e| panic!("symlink {}: {e}", path.display()));
        self
    }

    /// A FIFO at `rel` with permission bits `mode`.
    pub fn fifo(&mut self, rel: &str, mode: u32) -> &mut Self {
        let path = self.parent_of(rel);
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("no NUL");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), mode as libc::mode_t) }, 0, "mkfifo {}", path.display());
        self
    }

    /// The extended attribute `name` = `value` on `rel`.
    pub fn xattr(&mut self, rel: &str, name: &str, value: &[u8]) -> &mut Self {
        xattr::set(self.path(rel), name, value).unwrap_or_else(|e| panic!("setxattr {rel} {name}: {e}"));
        self
    }

    /// The permission bits of `rel`.
    pub fn mode(&mut self, rel: &str, mode: u32) -> &mut Self {
        fs::set_permissions(self.path(rel), fs::Permissions::from_mode(mode))
            .unwrap_or_else(|e| panic!("chmod {rel}: {e}"));
        self
    }

    /// The access and modification times of `rel` (seconds, nanoseconds).
    pub fn times(&mut self, rel: &str, atime: (i64, i64), mtime: (i64, i64)) -> &mut Self {
        set_times(&self.path(rel), atime, mtime);
        self
    }

    /// The tree as it is now ([`scan_source`]: the scan's own access-time updates undone).
    pub fn scan(&self) -> Scan {
        scan_source(&self.root)
    }
}
