//! Directory trees (FORMAT.md §9): one blob per directory, holding its entries sorted by name.
//! A directory's entry names its subtree's blob ID, so an unchanged subtree is stored once.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::id::BlobId;

/// A point in time: seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Timestamp {
    /// Seconds since 1970-01-01T00:00:00Z (negative before).
    pub secs: i64,
    /// Nanoseconds, 0..1e9.
    pub nanos: u32,
}

/// What kind of file system object a node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NodeKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
    /// A named pipe.
    Fifo,
}

/// One piece of a file's content, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Chunk {
    /// `len` bytes stored as the blob `id`.
    Data {
        /// The blob.
        id: BlobId,
        /// Its plaintext length.
        len: u32,
    },
    /// `len` zero bytes (an all-zero chunk or a hole): nothing stored, nothing fetched.
    Zero {
        /// Length in bytes.
        len: u64,
    },
}

impl Chunk {
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        match *self {
            Chunk::Data { len, .. } => u64::from(len),
            Chunk::Zero { len } => len,
        }
    }

    /// Whether this chunk is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An extended attribute.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Xattr {
    /// Name, e.g. `user.comment`.
    pub name: Vec<u8>,
    /// Value bytes.
    pub value: Vec<u8>,
}

/// One entry of a directory and all its metadata.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// File name bytes: never empty, never `.` or `..`, no `/` and no NUL.
    pub name: Vec<u8>,
    /// Kind of object.
    pub kind: NodeKind,
    /// Permission bits including setuid, setgid and sticky (`st_mode & 0o7777`).
    pub mode: u32,
    /// Owner user ID.
    pub uid: u32,
    /// Owner group ID.
    pub gid: u32,
    /// Owner user name (empty if unknown).
    pub user: String,
    /// Owner group name (empty if unknown).
    pub group: String,
    /// Last access.
    pub atime: Timestamp,
    /// Last modification.
    pub mtime: Timestamp,
    /// Last status change (recorded, cannot be restored).
    pub ctime: Timestamp,
    /// Size in bytes (files), link target length (symlinks), 0 otherwise.
    pub size: u64,
    /// Inode number at backup time.
    pub inode: u64,
    /// Device (file system) ID at backup time.
    pub device_id: u64,
    /// Hard link count at backup time; nodes with `links > 1` and the same
    /// `(device_id, inode)` are restored as hard links of one file.
    pub links: u64,
    /// Device number (`st_rdev`) for device nodes.
    pub rdev: u64,
    /// Symlink target bytes.
    pub target: Vec<u8>,
    /// Extended attributes (other than POSIX ACLs), sorted by name.
    pub xattrs: Vec<Xattr>,
    /// POSIX access ACL in the kernel's `system.posix_acl_access` encoding.
    pub acl_access: Option<Vec<u8>>,
    /// POSIX default ACL (directories) in the `system.posix_acl_default` encoding.
    pub acl_default: Option<Vec<u8>>,
    /// File content.
    pub content: Vec<Chunk>,
    /// Directory content.
    pub subtree: Option<BlobId>,
}

impl Node {
    /// A node of `kind` named `name` with all other fields empty.
    pub fn new(name: Vec<u8>, kind: NodeKind) -> Self {
        Node {
            name,
            kind,
            mode: 0,
            uid: 0,
            gid: 0,
            user: String::new(),
            group: String::new(),
            atime: Timestamp::default(),
            mtime: Timestamp::default(),
            ctime: Timestamp::default(),
            size: 0,
            inode: 0,
            device_id: 0,
            links: 1,
            rdev: 0,
            target: Vec::new(),
            xattrs: Vec::new(),
            acl_access: None,
            acl_default: None,
            content: Vec::new(),
            subtree: None,
        }
    }

    /// The name for display (lossy UTF-8).
    pub fn name_lossy(&self) -> String {
        String::from_utf8_lossy(&self.name).into_owned()
    }
}

/// A directory listing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tree {
    /// Entries, sorted by name bytes, names unique.
    pub nodes: Vec<Node>,
}

impl Tree {
    /// Serializes (postcard; FORMAT.md §9).
    pub fn to_bytes(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("tree serializes")
    }

    /// Parses and validates a tree blob: every name must be safe and unique, and the content
    /// must match the kind. `what` names the blob for errors.
    pub fn from_bytes(what: &str, bytes: &[u8]) -> Result<Self> {
        let (count, _) = count_of(what, bytes)?;
        // Sized once: serde's vector grows by doubling, which for a directory of 250,000
        // entries held up to twice its nodes at the peak. The length a hostile blob claims is
        // trusted only as far as its bytes could hold that many nodes.
        let mut nodes = Vec::with_capacity((count as usize).min(bytes.len() / MIN_NODE_BYTES));
        for_each_valid(what, bytes, |_, n| nodes.push(n))?;
        Ok(Tree { nodes })
    }
}

/// A validated tree kept as its encoding (FORMAT.md §9) and where each node begins, its nodes
/// decoded one at a time as a walk reaches them or a lookup by name finds them: a directory of
/// 250,000 entries takes about 100 bytes an entry this way, against about 400 as a [`Tree`]'s
/// nodes. Its subdirectories' tree IDs are listed up front, so a loader can fetch them ahead of
/// the walk.
#[derive(Clone, Debug, Default)]
pub struct TreeBytes {
    plain: Vec<u8>,
    /// Where each node's encoding begins in `plain`, in tree order (a tree blob's plaintext
    /// length is a `u32`, FORMAT.md §7).
    starts: Vec<u32>,
    subtrees: Vec<BlobId>,
}

impl TreeBytes {
    /// Validates a tree blob's plaintext as [`Tree::from_bytes`] does (decoding each node and
    /// dropping it) and keeps the bytes. `what` names the blob for errors.
    pub fn parse(what: &str, plain: Vec<u8>) -> Result<Self> {
        let (mut starts, mut subtrees) = (Vec::new(), Vec::new());
        for_each_valid(what, &plain, |at, n| {
            starts.push(at as u32);
            subtrees.extend(n.subtree);
        })?;
        Ok(TreeBytes { plain, starts, subtrees })
    }

    /// How many nodes the tree holds.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// Whether the tree has no nodes.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// The encoding of this tree with each node changed by `change` (FORMAT.md §9: the node
    /// count, then each node), made a node at a time: a directory of 100,000 entries rewritten
    /// as a [`Tree`] held its nodes parsed, about four times its encoding, at once. `change`
    /// may fail with the caller's own error type.
    pub fn map_nodes<E: From<Error>>(&self, mut change: impl FnMut(&mut Node) -> Result<(), E>) -> Result<Vec<u8>, E> {
        let mut out = postcard::to_extend(&(self.len() as u64), Vec::with_capacity(self.plain.len()))
            .expect("a count serializes");
        for i in 0..self.len() {
            let mut node =
                self.node(i).ok_or_else(|| Error::Internal("a validated tree node no longer decodes".into()))?;
            change(&mut node)?;
            out = postcard::to_extend(&node, out).expect("a node serializes");
        }
        Ok(out)
    }

    /// Bytes the tree takes in memory (its plaintext and what locates its nodes and subtrees).
    pub fn memory_bytes(&self) -> u64 {
        (self.plain.capacity() + self.starts.capacity() * 4 + self.subtrees.capacity() * std::mem::size_of::<BlobId>())
            as u64
    }

    /// The subdirectories' tree IDs, in tree order.
    pub fn subtrees(&self) -> &[BlobId] {
        &self.subtrees
    }

    /// The node named `name`, decoded (a binary search over the names, read in place).
    pub fn get(&self, name: &[u8]) -> Option<Node> {
        let i = self.starts.binary_search_by(|&at| self.name_at(at).cmp(name)).ok()?;
        self.node(i)
    }

    /// Every node, decoded one at a time, in tree order.
    pub fn nodes(&self) -> impl Iterator<Item = Node> + '_ {
        (0..self.len()).filter_map(|i| self.node(i))
    }

    /// The nodes, decoded one at a time, in tree order.
    pub fn into_nodes(self) -> Nodes {
        Nodes { tree: self, next: 0 }
    }

    /// All the nodes at once.
    pub fn into_tree(self) -> Tree {
        let mut nodes = Vec::with_capacity(self.len());
        nodes.extend(self.into_nodes());
        Tree { nodes }
    }

    /// Node `i`, decoded. The bytes were decoded once already ([`TreeBytes::parse`]), so this
    /// cannot fail; were it to, the node would be missing, never wrong.
    pub fn node(&self, i: usize) -> Option<Node> {
        let at = *self.starts.get(i)? as usize;
        postcard::take_from_bytes::<Node>(&self.plain[at..]).ok().map(|(n, _)| n)
    }

    /// The name of the node at `at`: its first field, a length and the bytes (FORMAT.md §9).
    fn name_at(&self, at: u32) -> &[u8] {
        let Ok((len, rest)) = postcard::take_from_bytes::<u64>(&self.plain[at as usize..]) else { return &[] };
        rest.get(..len as usize).unwrap_or(&[])
    }
}

/// The nodes of a [`TreeBytes`], decoded as they are taken.
pub struct Nodes {
    tree: TreeBytes,
    next: usize,
}

impl Iterator for Nodes {
    type Item = Node;

    fn next(&mut self) -> Option<Node> {
        let node = self.tree.node(self.next)?;
        self.next += 1;
        Some(node)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.tree.len() - self.next;
        (left, Some(left))
    }
}

/// The forms a tree blob's plaintext is parsed into (validated either way).
pub trait TreeForm: Sized {
    /// Parses and validates `plain`; `what` names the blob for errors.
    fn parse(what: &str, plain: Vec<u8>) -> Result<Self>;
}

impl TreeForm for Tree {
    fn parse(what: &str, plain: Vec<u8>) -> Result<Self> {
        Tree::from_bytes(what, &plain)
    }
}

impl TreeForm for TreeBytes {
    fn parse(what: &str, plain: Vec<u8>) -> Result<Self> {
        TreeBytes::parse(what, plain)
    }
}

/// A tree encoding's node count, and the bytes after it.
fn count_of<'b>(what: &str, bytes: &'b [u8]) -> Result<(u64, &'b [u8])> {
    postcard::take_from_bytes::<u64>(bytes).map_err(|e| Error::invalid(what, format!("not a tree: {e}")))
}

/// Decodes a tree encoding node by node, checks each against the rules of FORMAT.md §9 (a
/// safe, unique name in order; content that matches the kind and adds up to the size) and
/// hands it to `each` with where its encoding begins in `bytes`. `what` names the blob for
/// errors.
/// Validates a tree blob's plaintext as [`Tree::from_bytes`] does, handing `each` its nodes one
/// at a time instead of keeping them: what reads a tree only to note a little of it (a check's
/// walk) holds one node, not a directory of them. `what` names the blob for errors.
pub fn for_each_node(what: &str, bytes: &[u8], mut each: impl FnMut(Node)) -> Result<()> {
    for_each_valid(what, bytes, |_, n| each(n))
}

fn for_each_valid(what: &str, bytes: &[u8], mut each: impl FnMut(usize, Node)) -> Result<()> {
    let (count, mut rest) = count_of(what, bytes)?;
    let mut prev: Option<Vec<u8>> = None;
    for _ in 0..count {
        let at = bytes.len() - rest.len();
        let (n, after) =
            postcard::take_from_bytes::<Node>(rest).map_err(|e| Error::invalid(what, format!("not a tree: {e}")))?;
        rest = after;
        check_name(&n.name).map_err(|why| Error::invalid(what, why))?;
        if prev.as_ref().is_some_and(|p| *p >= n.name) {
            return Err(Error::invalid(what, format!("entry {:?} is duplicated or out of order", n.name_lossy())));
        }
        if (n.kind == NodeKind::Dir) != n.subtree.is_some() {
            return Err(Error::invalid(what, format!("entry {:?}: subtree does not match kind", n.name_lossy())));
        }
        if n.kind != NodeKind::File && !n.content.is_empty() {
            return Err(Error::invalid(what, format!("entry {:?}: content on a non-file", n.name_lossy())));
        }
        // Checked, not saturating: chunks of a hostile tree that add up to more than 2^64
        // bytes would otherwise pass as a file of 2^64 - 1 bytes and overflow the restore's
        // chunk offsets.
        let Some(total) = n.content.iter().try_fold(0u64, |sum, c| sum.checked_add(c.len())) else {
            return Err(Error::invalid(
                what,
                format!("entry {:?}: chunks add up to more than 2^64 bytes", n.name_lossy()),
            ));
        };
        if n.kind == NodeKind::File && total != n.size {
            return Err(Error::invalid(
                what,
                format!("entry {:?}: chunks add up to {total} bytes, size says {}", n.name_lossy(), n.size),
            ));
        }
        match &mut prev {
            Some(p) => {
                p.clear();
                p.extend_from_slice(&n.name);
            }
            None => prev = Some(n.name.clone()),
        }
        each(at, n);
    }
    Ok(())
}

/// Fewest bytes a node takes encoded (a one-byte name and every other field at its smallest).
const MIN_NODE_BYTES: usize = 16;

/// Checks that a name is one safe path component.
pub fn check_name(name: &[u8]) -> std::result::Result<(), String> {
    let shown = String::from_utf8_lossy(name);
    if name.is_empty() || name == b"." || name == b".." {
        return Err(format!("unsafe entry name {shown:?}"));
    }
    if name.contains(&b'/') || name.contains(&0) {
        return Err(format!("entry name {shown:?} contains '/' or NUL"));
    }
    Ok(())
}

/// The chunks of a file with their offsets.
pub fn chunk_offsets(content: &[Chunk]) -> impl Iterator<Item = (u64, &Chunk)> {
    content.iter().scan(0u64, |off, c| {
        let at = *off;
        *off += c.len();
        Some((at, c))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_validation() {
        let mut f = Node::new(b"a".to_vec(), NodeKind::File);
        f.size = 10;
        f.content = vec![Chunk::Data { id: BlobId([1; 32]), len: 4 }, Chunk::Zero { len: 6 }];
        let mut d = Node::new(b"b".to_vec(), NodeKind::Dir);
        d.subtree = Some(BlobId([2; 32]));
        let t = Tree { nodes: vec![f.clone(), d] };
        assert_eq!(Tree::from_bytes("t", &t.to_bytes()).unwrap(), t);

        for bad in [&b".."[..], b"", b"a/b", b".", b"x\0"] {
            let mut n = f.clone();
            n.name = bad.to_vec();
            let t = Tree { nodes: vec![n] };
            assert!(Tree::from_bytes("t", &t.to_bytes()).is_err(), "{bad:?} accepted");
        }
        let dup = Tree { nodes: vec![f.clone(), f.clone()] };
        assert!(Tree::from_bytes("t", &dup.to_bytes()).unwrap_err().to_string().contains("duplicated"));
        let mut short = f;
        short.size = 11;
        assert!(Tree::from_bytes("t", &Tree { nodes: vec![short] }.to_bytes()).is_err());
        assert!(Tree::from_bytes("t", b"\xff\xff\xff").is_err());
    }

    pub(crate) mod proptests {
        use super::super::*;
        use proptest::prelude::*;

        fn ts() -> impl Strategy<Value = Timestamp> {
            (any::<i64>(), 0u32..1_000_000_000).prop_map(|(secs, nanos)| Timestamp { secs, nanos })
        }

        fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
            proptest::collection::vec(any::<u8>(), 0..max)
        }

        fn chunk() -> impl Strategy<Value = Chunk> {
            prop_oneof![
                (any::<[u8; 32]>(), any::<u32>()).prop_map(|(id, len)| Chunk::Data { id: BlobId(id), len }),
                (0u64..1 << 40).prop_map(|len| Chunk::Zero { len }),
            ]
        }

        fn node(name: Vec<u8>) -> impl Strategy<Value = Node> {
            let kind = prop_oneof![
                Just(NodeKind::File),
                Just(NodeKind::Dir),
                Just(NodeKind::Symlink),
                Just(NodeKind::CharDevice),
                Just(NodeKind::BlockDevice),
                Just(NodeKind::Fifo),
            ];
            (
                kind,
                (any::<u32>(), any::<u32>(), any::<u32>(), ".{0,8}", ".{0,8}"),
                (ts(), ts(), ts()),
                (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()),
                bytes(40),
                proptest::collection::vec((bytes(20), bytes(20)).prop_map(|(name, value)| Xattr { name, value }), 0..3),
                (proptest::option::of(bytes(30)), proptest::option::of(bytes(30))),
                proptest::collection::vec(chunk(), 0..6),
                any::<[u8; 32]>(),
            )
                .prop_map(
                    move |(
                        kind,
                        (mode, uid, gid, user, group),
                        (atime, mtime, ctime),
                        (inode, device_id, links, rdev),
                        target,
                        xattrs,
                        (acl_access, acl_default),
                        content,
                        sub,
                    )| {
                        let content = if kind == NodeKind::File { content } else { Vec::new() };
                        Node {
                            name: name.clone(),
                            kind,
                            mode,
                            uid,
                            gid,
                            user,
                            group,
                            atime,
                            mtime,
                            ctime,
                            size: if kind == NodeKind::File {
                                content.iter().map(Chunk::len).sum()
                            } else {
                                target.len() as u64
                            },
                            inode,
                            device_id,
                            links,
                            rdev,
                            target,
                            xattrs,
                            acl_access,
                            acl_default,
                            content,
                            subtree: (kind == NodeKind::Dir).then_some(BlobId(sub)),
                        }
                    },
                )
        }

        /// Valid trees: unique safe names in order, content matching the kind.
        pub(crate) fn tree() -> impl Strategy<Value = Tree> {
            let name =
                proptest::collection::vec(any::<u8>().prop_filter("no / or NUL", |b| *b != b'/' && *b != 0), 1..12)
                    .prop_filter("not . or ..", |n| n != b"." && n != b"..");
            proptest::collection::btree_set(name, 0..6)
                .prop_flat_map(|names| names.into_iter().map(node).collect::<Vec<_>>().prop_map(|nodes| Tree { nodes }))
        }

        proptest! {
            #[test]
            fn trees_round_trip(t in tree()) {
                prop_assert_eq!(Tree::from_bytes("t", &t.to_bytes()).unwrap(), t);
            }

            /// Out of order or duplicated names, and sizes that do not match, are refused.
            #[test]
            fn invalid_trees_are_refused(t in tree(), extra in 1u64..1000) {
                if t.nodes.len() >= 2 {
                    let mut swapped = t.clone();
                    swapped.nodes.swap(0, 1);
                    prop_assert!(Tree::from_bytes("t", &swapped.to_bytes()).is_err());
                    let mut dup = t.clone();
                    dup.nodes[1].name = dup.nodes[0].name.clone();
                    prop_assert!(Tree::from_bytes("t", &dup.to_bytes()).is_err());
                }
                if let Some(f) = t.nodes.iter().position(|n| n.kind == NodeKind::File) {
                    let mut wrong = t.clone();
                    wrong.nodes[f].size = wrong.nodes[f].size.wrapping_add(extra);
                    prop_assert!(Tree::from_bytes("t", &wrong.to_bytes()).is_err());
                }
            }

            #[test]
            fn any_bytes_parse_or_fail(b in proptest::collection::vec(any::<u8>(), 0..300)) {
                if let Ok(t) = Tree::from_bytes("t", &b) {
                    prop_assert_eq!(Tree::from_bytes("t", &t.to_bytes()).unwrap(), t);
                }
            }

            /// A tree rewritten node by node is the tree changed as a whole: unchanged, the same
            /// bytes; every chunk ID changed, the encoding of the changed [`Tree`].
            #[test]
            fn map_nodes_encodes_as_the_changed_tree(t in tree(), x in any::<u8>()) {
                let kept = TreeBytes::parse("t", t.to_bytes()).unwrap();
                prop_assert_eq!(kept.map_nodes(|_| Ok::<_, Error>(())).unwrap(), t.to_bytes());
                let flip = |n: &mut Node| {
                    for c in &mut n.content {
                        if let Chunk::Data { id, .. } = c {
                            id.0[0] ^= x;
                        }
                    }
                };
                let mut changed = t.clone();
                changed.nodes.iter_mut().for_each(flip);
                prop_assert_eq!(kept.map_nodes(|n| { flip(n); Ok::<_, Error>(()) }).unwrap(), changed.to_bytes());
            }

            /// The form a walk keeps yields the same nodes, lists the same subtrees and refuses
            /// exactly what [`Tree::from_bytes`] refuses.
            #[test]
            fn tree_bytes_agree_with_tree(t in tree(), cut in any::<proptest::sample::Index>()) {
                let enc = t.to_bytes();
                let kept = TreeBytes::parse("t", enc.clone()).unwrap();
                let subtrees: Vec<BlobId> = t.nodes.iter().filter_map(|n| n.subtree).collect();
                prop_assert_eq!(kept.subtrees(), &subtrees[..]);
                prop_assert_eq!(kept.len(), t.nodes.len());
                prop_assert_eq!(kept.clone().into_nodes().collect::<Vec<_>>(), t.nodes.clone());
                prop_assert_eq!(kept.clone().into_tree(), t.clone());
                // Looked up by name: every node, and no other name.
                for n in &t.nodes {
                    prop_assert_eq!(kept.get(&n.name), Some(n.clone()));
                }
                prop_assert_eq!(kept.nodes().collect::<Vec<_>>(), t.nodes.clone());
                prop_assert!(kept.get(b"\xff\xff not a name").is_none());
                // Cut short anywhere: both refuse, or both accept the same tree.
                let short = &enc[..cut.index(enc.len() + 1)];
                match (Tree::from_bytes("t", short), TreeBytes::parse("t", short.to_vec())) {
                    (Ok(a), Ok(b)) => prop_assert_eq!(a, b.into_tree()),
                    (Err(_), Err(_)) => {}
                    (a, b) => prop_assert!(false, "disagree: {:?} / {:?}", a.is_ok(), b.is_ok()),
                }
            }
        }
    }
}
