//! Where each kind of file lives in a repository, and how names in a listing are parsed
//! (FORMAT.md §1). Every path a command reads, writes, lists or deletes is made here.

use crate::id::{DeletionId, IndexId, KeyId, PackId, SnapshotId};

/// The config file.
pub const CONFIG: &str = "config";

/// A directory of the repository.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dir {
    /// `keys/`: key files.
    Keys,
    /// `data/`: pack files, in 256 subdirectories.
    Data,
    /// `index/`: index files.
    Index,
    /// `snapshots/`: snapshot files.
    Snapshots,
    /// `locks/`: locks.
    Locks,
    /// `deletions/`: deletion manifests of prunes not yet finished (FORMAT.md §13).
    Deletions,
}

impl Dir {
    /// Every directory, in the order `init`'s check reports them.
    pub const ALL: [Dir; 6] = [Dir::Keys, Dir::Index, Dir::Snapshots, Dir::Data, Dir::Locks, Dir::Deletions];

    /// The directory's name, as given to storage listings.
    pub fn name(self) -> &'static str {
        match self {
            Dir::Keys => "keys",
            Dir::Data => "data",
            Dir::Index => "index",
            Dir::Snapshots => "snapshots",
            Dir::Locks => "locks",
            Dir::Deletions => "deletions",
        }
    }
}

/// `keys/<id>`.
pub fn key_path(id: &KeyId) -> String {
    format!("keys/{}", id.to_hex())
}

/// `data/<xx>/<id>`, `<xx>` the ID's first two hex digits.
pub fn pack_path(id: &PackId) -> String {
    let hex = id.to_hex();
    format!("data/{}/{}", &hex[..2], hex)
}

/// `index/<id>`.
pub fn index_path(id: &IndexId) -> String {
    format!("index/{}", id.to_hex())
}

/// `snapshots/<id>`.
pub fn snapshot_path(id: &SnapshotId) -> String {
    format!("snapshots/{}", id.to_hex())
}

/// `deletions/<id>`.
pub fn deletion_path(id: &DeletionId) -> String {
    format!("deletions/{}", id.to_hex())
}

/// `locks/<name>` (a lock's name is random, not a hash).
pub fn lock_path(name: &str) -> String {
    format!("locks/{name}")
}

/// The last component of a listed path.
pub fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or_default()
}

/// The pack a listed `data/<xx>/<id>` path names; `None` for anything else (a stray file, a
/// pack in the wrong subdirectory).
pub fn parse_pack_path(path: &str) -> Option<PackId> {
    let rest = path.strip_prefix("data/")?;
    let (sub, name) = rest.split_once('/')?;
    let id = PackId::from_hex(name).ok()?;
    (name.len() == 64 && sub == &name[..2] && name == id.to_hex()).then_some(id)
}

/// The ID a listed `dir/<id>` path names, parsed by `parse`; `None` for anything else.
fn parse_flat<T>(path: &str, dir: Dir, parse: impl Fn(&str) -> crate::Result<T>) -> Option<T> {
    let name = path.strip_prefix(dir.name())?.strip_prefix('/')?;
    // Lower case only: the name must be exactly what the writer made (hex of the hash).
    if name.len() != 64 || name.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    parse(name).ok()
}

/// The index file a listed `index/<id>` path names.
pub fn parse_index_path(path: &str) -> Option<IndexId> {
    parse_flat(path, Dir::Index, IndexId::from_hex)
}

/// The snapshot a listed `snapshots/<id>` path names.
pub fn parse_snapshot_path(path: &str) -> Option<SnapshotId> {
    parse_flat(path, Dir::Snapshots, SnapshotId::from_hex)
}

/// The deletion manifest a listed `deletions/<id>` path names.
pub fn parse_deletion_path(path: &str) -> Option<DeletionId> {
    parse_flat(path, Dir::Deletions, DeletionId::from_hex)
}

/// The key file a listed `keys/<id>` path names.
pub fn parse_key_path(path: &str) -> Option<KeyId> {
    parse_flat(path, Dir::Keys, KeyId::from_hex)
}

/// Checks that a content-addressed file's bytes hash to its name (the last path component).
pub fn check_name(path: &str, bytes: &[u8]) -> crate::Result<()> {
    let name = path.rsplit('/').next().unwrap_or_default();
    if blake3::hash(bytes).to_hex().as_str() != name {
        return Err(crate::Error::corrupt(path, "content does not match its name (damaged or truncated)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_round_trip() {
        let p = PackId::hash_of(b"p");
        assert_eq!(parse_pack_path(&pack_path(&p)), Some(p));
        let s = SnapshotId::hash_of(b"s");
        assert_eq!(parse_snapshot_path(&snapshot_path(&s)), Some(s));
        let i = IndexId::hash_of(b"i");
        assert_eq!(parse_index_path(&index_path(&i)), Some(i));
        let k = KeyId::hash_of(b"k");
        assert_eq!(parse_key_path(&key_path(&k)), Some(k));
        let d = DeletionId::hash_of(b"d");
        assert_eq!(parse_deletion_path(&deletion_path(&d)), Some(d));
    }

    #[test]
    fn stray_names_are_not_ids() {
        let p = PackId::hash_of(b"p").to_hex();
        assert_eq!(parse_pack_path(&format!("data/zz/{p}")), None, "wrong subdirectory");
        assert_eq!(parse_pack_path(&format!("data/{p}")), None, "no subdirectory");
        assert_eq!(parse_pack_path(&format!("data/{}/{}", &p[..2], p.to_uppercase())), None);
        assert_eq!(parse_pack_path(&format!("data/{}/{p}.tmp", &p[..2])), None);
        assert_eq!(parse_snapshot_path("snapshots/abc"), None);
        assert_eq!(parse_snapshot_path(&format!("index/{p}")), None);
        assert_eq!(parse_index_path(&format!("index/{}", p.to_uppercase())), None);
    }
}
