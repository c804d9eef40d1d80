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
}

impl Snapshot {
    /// Serializes (postcard; FORMAT.md §10).
    pub fn to_bytes(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("snapshot serializes")
    }

    /// Parses; `name` is the file's path, for errors.
    pub fn from_bytes(name: &str, bytes: &[u8]) -> Result<Self> {
        postcard::from_bytes(bytes).map_err(|e| Error::invalid(name, format!("not a snapshot: {e}")))
    }
}
