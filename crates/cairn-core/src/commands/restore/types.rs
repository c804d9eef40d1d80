//! What the stages hand each other: the plan's entries, where each needed blob goes and which
//! reads fetch it, and the state of each file against the target (what it still needs).

use std::path::PathBuf;

use crate::engine::read::PackRead;
use cairn_format::id::{BlobId, IdMap};
use cairn_format::tree::{chunk_offsets, Chunk, Node};

/// One file system entry to restore.
#[derive(Debug)]
pub struct Entry {
    /// Path relative to the target.
    pub rel: PathBuf,
    /// Its metadata and content.
    pub node: Node,
    /// For a hard link: the file it is a link of.
    pub link_of: Option<Link>,
}

/// The file a hard link links to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Link {
    /// An entry of the same plan (batch).
    Entry(usize),
    /// A file an earlier batch restored, at this path relative to the target.
    Earlier(PathBuf),
}

/// A directory whose entries are all in this batch or earlier ones: once the batch is
/// written, its metadata is set (deepest first) and `--delete` may look through it.
#[derive(Debug)]
pub struct ClosedDir {
    /// Path relative to the target (`""` for the target itself).
    pub rel: PathBuf,
    /// Its node (none for the target, whose metadata the restore sets at the end).
    pub node: Option<Node>,
    /// The names of its children in the restore, when `--delete` needs them.
    pub names: Option<std::collections::HashSet<std::ffi::OsString>>,
}

/// One place a blob's bytes go.
#[derive(Clone, Copy, Debug)]
pub struct Dest {
    /// Index into the plan's entries.
    pub entry: u32,
    /// Byte offset in that file.
    pub offset: u64,
}

/// The entries of a restore (or of one batch of it), parents before children.
#[derive(Debug, Default)]
pub struct Plan {
    /// Entries, parents before children.
    pub entries: Vec<Entry>,
    /// Directories completed with this batch, children before parents.
    pub closed: Vec<ClosedDir>,
}

/// Where the needed blobs go and how to fetch them.
#[derive(Debug, Default)]
pub struct Fetches {
    /// Destinations of every blob to fetch.
    pub dests: IdMap<BlobId, Vec<Dest>>,
    /// The reads that fetch them.
    pub reads: Vec<PackRead>,
    /// Blobs a file needs that no index lists: `(entry, blob)`.
    pub missing: Vec<(usize, BlobId)>,
    /// Chunks whose recorded length differs from their blob's: `(entry, blob)`.
    pub mismatched: Vec<(usize, BlobId)>,
    /// Stored bytes the reads will fetch.
    pub fetch_bytes: u64,
}

/// The state of one file entry of the plan against the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileState {
    /// Not a file to restore (directory, symlink, hard link, …).
    NotFile,
    /// Nothing usable at the path: create the file; `clear` if something else is in the way.
    Create {
        /// Something (of another kind, or stale) must be removed first.
        clear: bool,
    },
    /// An existing regular file is fixed in place.
    InPlace {
        /// Data chunks to write.
        needed: Vec<NeededChunk>,
        /// Ranges that must become zero (holes) but hold data.
        zero_fix: Vec<(u64, u64)>,
        /// Whether the size differs.
        resize: bool,
    },
    /// Content already correct: at most metadata differs.
    Complete,
    /// Left alone (`--overwrite never` / `if-newer`).
    Skip,
}

impl FileState {
    /// The data chunks this state still needs written, for a file node.
    pub fn needed(&self, node: &Node) -> Vec<NeededChunk> {
        match self {
            FileState::Create { .. } => chunk_offsets(&node.content)
                .filter_map(|(offset, c)| match *c {
                    Chunk::Data { id, len } => Some(NeededChunk { offset, id, len }),
                    Chunk::Zero { .. } => None,
                })
                .collect(),
            FileState::InPlace { needed, .. } => needed.clone(),
            _ => Vec::new(),
        }
    }
}

/// A data chunk that must be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NeededChunk {
    /// Where in the file.
    pub offset: u64,
    /// The blob.
    pub id: BlobId,
    /// Its length as the tree records it.
    pub len: u32,
}
