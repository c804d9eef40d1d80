//! Tree blobs (after decryption): parsed, validated, and walked as a restore plans a file; the
//! form a walk keeps (`TreeBytes`, nodes decoded as taken) accepts exactly what `Tree` does and
//! yields the same nodes.
#![no_main]

use cairn_format::tree::{Tree, TreeBytes};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let bytes = TreeBytes::parse("tree fuzz", data.to_vec());
    let Ok(tree) = Tree::from_bytes("tree fuzz", data) else {
        assert!(bytes.is_err(), "TreeBytes accepts what Tree rejects");
        return;
    };
    let bytes = bytes.expect("TreeBytes rejects what Tree accepts");
    let subtrees: Vec<_> = tree.nodes.iter().filter_map(|n| n.subtree).collect();
    assert_eq!(bytes.subtrees(), &subtrees[..]);
    assert_eq!(bytes.len(), tree.nodes.len());
    for n in &tree.nodes {
        assert_eq!(bytes.get(&n.name).as_ref(), Some(n), "lookup by name");
    }
    assert_eq!(bytes.into_tree(), tree);
    for n in &tree.nodes {
        // What a restore does with a file's chunks (restore/plan.rs): their offsets and end.
        let mut end = 0u64;
        for (off, c) in cairn_format::tree::chunk_offsets(&n.content) {
            end = off + c.len();
        }
        if n.kind == cairn_format::tree::NodeKind::File {
            assert_eq!(end, n.size);
        }
    }
    assert_eq!(Tree::from_bytes("tree fuzz", &tree.to_bytes()).expect("re-encoded tree parses"), tree);
});
