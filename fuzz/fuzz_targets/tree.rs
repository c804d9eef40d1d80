//! Tree blobs (after decryption): parsed, validated, and walked as a restore plans a file.
#![no_main]

use cairn_core::tree::Tree;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(tree) = Tree::from_bytes("tree fuzz", data) else { return };
    for n in &tree.nodes {
        // What a restore does with a file's chunks (restore/plan.rs): their offsets and end.
        let mut end = 0u64;
        for (off, c) in cairn_core::fuzzing::chunk_offsets(&n.content) {
            end = off + c.len();
        }
        if n.kind == cairn_core::tree::NodeKind::File {
            assert_eq!(end, n.size);
        }
    }
    assert_eq!(Tree::from_bytes("tree fuzz", &tree.to_bytes()).expect("re-encoded tree parses"), tree);
});
