//! Property tests of `tree::chunk_offsets` (public in `cairn_format`, so
//! the test does not depend on where the restore planner lives).

use cairn_format::id::BlobId;
use cairn_format::tree::chunk_offsets;
use cairn_format::tree::Chunk;
use proptest::prelude::*;

fn chunk() -> impl Strategy<Value = Chunk> {
    prop_oneof![
        (any::<[u8; 32]>(), any::<u32>()).prop_map(|(id, len)| Chunk::Data { id: BlobId(id), len }),
        (0u64..1 << 50).prop_map(|len| Chunk::Zero { len }),
    ]
}

proptest! {
    /// Each chunk starts where the previous one ended, the first at 0, every chunk is listed
    /// once and in order, and the last ends at the file's size.
    #[test]
    fn offsets_are_the_running_sum(content in proptest::collection::vec(chunk(), 0..50)) {
        let listed: Vec<(u64, &Chunk)> = chunk_offsets(&content).collect();
        prop_assert_eq!(listed.len(), content.len());
        let mut expect = 0u64;
        for ((off, c), orig) in listed.iter().zip(&content) {
            prop_assert_eq!(*off, expect);
            prop_assert_eq!(*c, orig);
            expect += orig.len();
        }
        let size: u64 = content.iter().map(Chunk::len).sum();
        prop_assert_eq!(listed.last().map_or(0, |(off, c)| off + c.len()), size);
    }
}
