//! Snapshots (FORMAT.md §10): a small sealed file naming a root tree and describing the backup.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::id::{BlobId, SnapshotId};
use crate::tree::Timestamp;

/// What a backup recorded about itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// Files that were new.
    pub files_new: u64,
    /// Files that changed since the parent.
    pub files_changed: u64,
    /// Files unchanged since the parent.
    pub files_unmodified: u64,
    /// Directories seen.
    pub dirs: u64,
    /// Bytes of file content read.
    pub bytes_read: u64,
    /// Plaintext bytes of new blobs.
    pub bytes_added: u64,
    /// Stored bytes of new blobs (after compression and encryption).
    pub bytes_stored: u64,
    /// Entries that could not be read.
    pub errors: u64,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
}

/// A snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// When the backup started.
    pub time: Timestamp,
    /// The root tree: the file system from `/` down to each backed-up path.
    pub tree: BlobId,
    /// The absolute paths backed up.
    pub paths: Vec<String>,
    /// Host name.
    pub hostname: String,
    /// User name.
    pub username: String,
    /// User ID.
    pub uid: u32,
    /// Group ID.
    pub gid: u32,
    /// Tags given with `--tag`.
    pub tags: Vec<String>,
    /// The snapshot this one was based on.
    pub parent: Option<SnapshotId>,
    /// Version of the program that made it.
    pub program_version: String,
    /// Statistics.
    pub summary: Summary,
    /// For a copy made by `cairn copy`: the snapshot it is a copy of (the first of a chain of
    /// copies), in the repository that snapshot was made in. Encoded after the fields above,
    /// only when present (FORMAT.md §10), so snapshots without it are unchanged.
    #[serde(skip)]
    pub original: Option<SnapshotId>,
}

impl Snapshot {
    /// Serializes (postcard; FORMAT.md §10): the version 1 fields, then `original` if there
    /// is one.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = postcard::to_stdvec(self).expect("snapshot serializes");
        if let Some(original) = &self.original {
            bytes.extend(postcard::to_stdvec(&Some(*original)).expect("an ID serializes"));
        }
        bytes
    }

    /// Parses; `name` is the file's path, for errors. Bytes after the fields this version knows
    /// are left for later versions (FORMAT.md §10).
    pub fn from_bytes(name: &str, bytes: &[u8]) -> Result<Self> {
        let bad = |e: postcard::Error| Error::invalid(name, format!("not a snapshot: {e}"));
        let (mut snap, rest): (Snapshot, _) = postcard::take_from_bytes(bytes).map_err(bad)?;
        if !rest.is_empty() {
            (snap.original, _) = postcard::take_from_bytes(rest).map_err(bad)?;
        }
        Ok(snap)
    }

    /// The snapshot this one is a copy of, or its own ID: copies of one snapshot share it, so a
    /// copy is never made twice.
    pub fn origin(&self, id: SnapshotId) -> SnapshotId {
        self.original.unwrap_or(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn snapshot() -> impl Strategy<Value = Snapshot> {
        (
            (any::<i64>(), 0u32..1_000_000_000, any::<[u8; 32]>()),
            proptest::collection::vec(".{0,20}", 0..4),
            (".{0,10}", ".{0,10}", any::<u32>(), any::<u32>()),
            proptest::collection::vec(".{0,6}", 0..3),
            proptest::option::of(any::<[u8; 32]>()),
            ".{0,8}",
            proptest::array::uniform9(any::<u64>()),
            proptest::option::of(any::<[u8; 32]>()),
        )
            .prop_map(
                |(
                    (secs, nanos, tree),
                    paths,
                    (hostname, username, uid, gid),
                    tags,
                    parent,
                    program_version,
                    s,
                    original,
                )| {
                    Snapshot {
                        time: Timestamp { secs, nanos },
                        tree: BlobId(tree),
                        paths,
                        hostname,
                        username,
                        uid,
                        gid,
                        tags,
                        parent: parent.map(SnapshotId),
                        program_version,
                        summary: Summary {
                            files_new: s[0],
                            files_changed: s[1],
                            files_unmodified: s[2],
                            dirs: s[3],
                            bytes_read: s[4],
                            bytes_added: s[5],
                            bytes_stored: s[6],
                            errors: s[7],
                            duration_ms: s[8],
                        },
                        original: original.map(SnapshotId),
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn snapshots_round_trip(s in snapshot(), cut in 1usize..50) {
            let b = s.to_bytes();
            prop_assert_eq!(&Snapshot::from_bytes("s", &b).unwrap(), &s);
            let cut_short = Snapshot::from_bytes("s", &b[..b.len().saturating_sub(cut)]);
            // Cutting exactly the `original` extension leaves a valid version 1 snapshot.
            if s.original.is_some() && cut == 33 {
                prop_assert_eq!(cut_short.unwrap(), Snapshot { original: None, ..s });
            } else {
                prop_assert!(cut_short.is_err());
            }
        }

        #[test]
        fn a_snapshot_without_original_is_encoded_as_version_1(s in snapshot()) {
            let plain = Snapshot { original: None, ..s.clone() };
            prop_assert_eq!(plain.to_bytes(), postcard::to_stdvec(&plain).unwrap());
            if let Some(o) = s.original {
                let mut ext = plain.to_bytes();
                ext.push(1);
                ext.extend_from_slice(&o.0);
                prop_assert_eq!(s.to_bytes(), ext);
            }
        }

        #[test]
        fn any_bytes_parse_or_fail(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(s) = Snapshot::from_bytes("s", &b) {
                prop_assert_eq!(Snapshot::from_bytes("s", &s.to_bytes()).unwrap(), s);
            }
        }
    }
}
