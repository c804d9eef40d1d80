//! A local cache of repository metadata — index files, snapshots and tree blobs — so listing
//! snapshots, `ls` and restore planning do not download them again from a remote repository.
//!
//! Entries are stored exactly as the repository holds them (still encrypted) and are verified
//! on every read the way a download is: index and snapshot files by the hash in their name,
//! tree blobs by authenticated decryption and their blob ID. A damaged entry is removed and the
//! object fetched again, never trusted. Entries are written to a unique temporary name and
//! renamed into place, so processes sharing the cache only ever see whole entries.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// One repository's directory in the cache.
#[derive(Clone, Debug)]
pub struct Cache {
    dir: PathBuf,
}

impl Cache {
    /// The cache for repository `repo_id` under `base`, created if missing.
    pub fn open(base: &Path, repo_id: &str) -> Result<Self> {
        if repo_id.is_empty() || !repo_id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(Error::invalid("config", format!("repository ID {repo_id:?} is not a plain name")));
        }
        let dir = base.join(repo_id);
        fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, "cannot create the cache directory", e))?;
        Ok(Cache { dir })
    }

    /// `$XDG_CACHE_HOME/cairn`, or `~/.cache/cairn`.
    pub fn default_base() -> Option<PathBuf> {
        let var = |n: &str| std::env::var_os(n).filter(|v| !v.is_empty()).map(PathBuf::from);
        var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|h| h.join(".cache"))).map(|d| d.join("cairn"))
    }

    /// This repository's cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cached bytes of `name` (a repository path such as `index/<id>` or `trees/<id>`) if
    /// present and accepted by `valid`; an entry `valid` rejects is removed.
    pub fn get(&self, name: &str, valid: impl FnOnce(&[u8]) -> bool) -> Option<Vec<u8>> {
        let path = self.path_of(name)?;
        let bytes = fs::read(&path).ok()?;
        if valid(&bytes) {
            return Some(bytes);
        }
        tracing::warn!("cache entry {} is damaged; fetching it again", path.display());
        let _ = fs::remove_file(&path);
        None
    }

    /// Stores `bytes` as `name`. The cache is an optimisation: a failure to store is logged,
    /// never fatal.
    pub fn put(&self, name: &str, bytes: &[u8]) {
        let Some(path) = self.path_of(name) else { return };
        if let Err(e) = write_atomically(&path, bytes) {
            tracing::warn!("cannot store {} in the cache: {e}", path.display());
        }
    }

    /// Removes the entry `name`, if there is one.
    pub fn remove(&self, name: &str) {
        if let Some(path) = self.path_of(name) {
            let _ = fs::remove_file(path);
        }
    }

    /// Removes the entries of `kind` (e.g. `index`) whose repository path `kind/<name>` is not
    /// in `listed`, the repository's whole listing of that directory: a file a prune or forget
    /// removed is not kept on this machine forever. Another process's entry still being
    /// written (a hidden temporary name) is left alone; a file written after the listing loses
    /// its entry and is read over the link once more, nothing worse.
    pub fn retain_listed(&self, kind: &str, listed: &std::collections::HashSet<&str>) {
        let Ok(entries) = fs::read_dir(self.dir.join(kind)) else { return };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            if !name.starts_with('.') && !listed.contains(format!("{kind}/{name}").as_str()) {
                let _ = fs::remove_file(e.path());
            }
        }
    }

    /// Only `kind/hexname` names are cached, so a name can never reach outside the cache.
    fn path_of(&self, name: &str) -> Option<PathBuf> {
        let (kind, file) = name.split_once('/')?;
        let plain = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric());
        (plain(kind) && plain(file)).then(|| self.dir.join(kind).join(file))
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().expect("cache entries live in a directory of their kind");
    fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// The key file that opened the repository at `location` last time on this machine, if `base`
/// (a cache base directory) remembers one: opening reads it at once instead of listing `keys/`
/// first (a round trip saved). Only a hint: a key file that is gone or refuses the password
/// sends the open back to the listing.
pub fn key_hint(base: &Path, location: &str) -> Option<cairn_format::id::KeyId> {
    let text = fs::read_to_string(key_hint_path(base, location)).ok()?;
    cairn_format::id::KeyId::from_hex(text.trim()).ok()
}

/// Remembers `key` as the key file that opened `location` (best effort: a cache that cannot be
/// written costs the next open a round trip, nothing more).
pub fn remember_key(base: &Path, location: &str, key: &cairn_format::id::KeyId) {
    let path = key_hint_path(base, location);
    if let Err(e) = write_atomically(&path, key.to_hex().as_bytes()) {
        tracing::warn!("cannot store {} in the cache: {e}", path.display());
    }
}

/// `<base>/key-hints/<BLAKE3 of the location>`: the location names the repository before its
/// config (and so its ID) is read.
fn key_hint_path(base: &Path, location: &str) -> PathBuf {
    base.join("key-hints").join(blake3::hash(location.as_bytes()).to_hex().as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_verifies_and_drops_damaged_entries() {
        let base = tempfile::tempdir().unwrap();
        let c = Cache::open(base.path(), "abc123").unwrap();
        assert_eq!(c.get("index/aa", |_| true), None);
        c.put("index/aa", b"hello");
        assert_eq!(c.get("index/aa", |b| b == b"hello").as_deref(), Some(&b"hello"[..]));
        // Damage the entry on disk: the check rejects it and the entry is gone.
        fs::write(c.dir().join("index/aa"), b"hellO").unwrap();
        assert_eq!(c.get("index/aa", |b| b == b"hello"), None);
        assert!(!c.dir().join("index/aa").exists());
        // Names that could escape the cache directory are never used.
        c.put("../evil", b"x");
        c.put("index/../../x", b"x");
        assert!(!base.path().join("evil").exists() && !base.path().join("x").exists());
        assert!(Cache::open(base.path(), "../x").is_err());
    }

    #[test]
    fn entries_the_repository_no_longer_lists_are_removed() {
        let base = tempfile::tempdir().unwrap();
        let c = Cache::open(base.path(), "r").unwrap();
        for name in ["index/aa", "index/bb", "snapshots/aa", "trees/aa"] {
            c.put(name, b"x");
        }
        fs::write(c.dir().join("index/.tmpXYZ"), b"being written").unwrap();
        c.retain_listed("index", &["index/bb", "index/cc"].into_iter().collect());
        assert!(!c.dir().join("index/aa").exists());
        for kept in ["index/bb", "index/.tmpXYZ", "snapshots/aa", "trees/aa"] {
            assert!(c.dir().join(kept).exists(), "{kept}");
        }
        c.remove("trees/aa");
        c.remove("../trees/aa");
        assert!(!c.dir().join("trees/aa").exists());
        // A kind never cached is nothing to clean.
        c.retain_listed("keys", &Default::default());
    }

    #[test]
    fn concurrent_writers_leave_whole_entries() {
        let base = tempfile::tempdir().unwrap();
        let c = Cache::open(base.path(), "r").unwrap();
        let big = vec![7u8; 1 << 20];
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..20 {
                        c.put("trees/t", &big);
                        if let Some(b) = c.get("trees/t", |_| true) {
                            assert_eq!(b.len(), big.len(), "a reader saw a partial entry");
                        }
                    }
                });
            }
        });
    }
}
