//! A directory's tree while the backup builds it: finished entries are kept as their
//! encodings (FORMAT.md §9), not as [`Node`]s.
//!
//! A tree's plaintext is the count of its nodes followed by each node's postcard encoding in
//! name order, so a node can be encoded as soon as it is finished and the tree put together
//! from the pieces at the end. An encoded file node takes about 100 bytes where a [`Node`] with
//! its names and chunk list takes about 500: for a directory of 250,000 files that is the
//! difference between 25 and 125 MB held while its files are read.

use std::collections::HashMap;

use cairn_format::tree::Node;

/// Where one entry's encoding is in [`TreeBuf::encoded`]; `len == 0` while the entry is open
/// or after it was left out (no node encodes to zero bytes).
#[derive(Clone, Copy, Default)]
struct Span {
    start: u64,
    len: u32,
}

/// The entries of one directory, in name order, each open (being worked on), finished
/// (encoded) or left out.
#[derive(Default)]
pub(super) struct TreeBuf {
    /// The finished entries' encodings, in the order they finished.
    encoded: Vec<u8>,
    /// Per entry, in name order.
    spans: Vec<Span>,
    /// The entries being worked on, by position: few at a time (the files queued for or being
    /// read, the subdirectories being walked).
    open: HashMap<usize, Node>,
}

impl TreeBuf {
    /// Adds a finished entry.
    pub fn push_done(&mut self, node: &Node) {
        let span = self.encode(node);
        self.spans.push(span);
    }

    /// Adds an entry that [`TreeBuf::finish`] or [`TreeBuf::leave_out`] completes; returns its
    /// position.
    pub fn push_open(&mut self, node: Node) -> usize {
        self.spans.push(Span::default());
        let at = self.spans.len() - 1;
        self.open.insert(at, node);
        at
    }

    /// Completes the open entry at `at` with `finish`.
    pub fn finish(&mut self, at: usize, finish: impl FnOnce(&mut Node)) {
        if let Some(mut node) = self.open.remove(&at) {
            finish(&mut node);
            self.spans[at] = self.encode(&node);
        }
    }

    /// Leaves the open entry at `at` out of the tree (it could not be read).
    pub fn leave_out(&mut self, at: usize) {
        self.open.remove(&at);
    }

    /// The tree's plaintext (FORMAT.md §9). Entries still open are left out; the caller
    /// builds a tree only when none is.
    pub fn into_bytes(self) -> Vec<u8> {
        let kept = self.spans.iter().filter(|s| s.len > 0);
        let count = kept.clone().count() as u64;
        let mut out = postcard::to_stdvec(&count).expect("a count serializes");
        out.reserve(self.encoded.len());
        for s in kept {
            out.extend_from_slice(&self.encoded[s.start as usize..s.start as usize + s.len as usize]);
        }
        out
    }

    fn encode(&mut self, node: &Node) -> Span {
        let start = self.encoded.len();
        let encoded = postcard::to_extend(node, std::mem::take(&mut self.encoded)).expect("a node serializes");
        self.encoded = encoded;
        Span { start: start as u64, len: (self.encoded.len() - start) as u32 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::id::BlobId;
    use cairn_format::tree::{Chunk, NodeKind, Tree};

    fn file(name: &str, size: u32) -> Node {
        let mut n = Node::new(name.as_bytes().to_vec(), NodeKind::File);
        n.user = "someone".into();
        n.size = size.into();
        n.content = vec![Chunk::Data { id: BlobId([size as u8; 32]), len: size }];
        n
    }

    /// Entries finished out of order and one left out give exactly the bytes of the tree of the
    /// kept nodes in name order, which `Tree::from_bytes` reads back.
    #[test]
    fn pieces_make_the_tree_encoding() {
        let (a, b, c, d) = (file("a", 1), file("b", 2), file("c", 3), file("d", 4));
        let mut dir = Node::new(b"e".to_vec(), NodeKind::Dir);
        let mut buf = TreeBuf::default();
        buf.push_done(&a);
        let ob = buf.push_open(Node { content: Vec::new(), ..b.clone() });
        let oc = buf.push_open(c.clone());
        buf.push_done(&d);
        let od = buf.push_open(dir.clone());
        buf.finish(od, |n| n.subtree = Some(BlobId([9; 32])));
        buf.leave_out(oc);
        buf.finish(ob, |n| n.content = b.content.clone());
        dir.subtree = Some(BlobId([9; 32]));
        let want = Tree { nodes: vec![a, b, d, dir] };
        let bytes = buf.into_bytes();
        assert_eq!(bytes, want.to_bytes());
        assert_eq!(Tree::from_bytes("test", &bytes).unwrap().nodes.len(), 4);
    }

    #[test]
    fn an_empty_directory_is_an_empty_tree() {
        assert_eq!(TreeBuf::default().into_bytes(), Tree { nodes: Vec::new() }.to_bytes());
    }
}
