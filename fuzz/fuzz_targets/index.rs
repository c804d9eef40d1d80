//! Index file plaintexts (after the sealed envelope): pack records and their blob entries.
#![no_main]

use cairn_format::index::{decode, encode, Index};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(packs) = decode("index/fuzz", data) else { return };
    assert_eq!(decode("index/fuzz", &encode(&packs)).expect("re-encoded index decodes"), packs);
    let idx = Index::from_packs(packs.clone());
    for p in &packs {
        for b in &p.blobs {
            assert!(idx.contains(&b.id));
            assert_eq!(idx.get(&b.id).expect("indexed blob is found").entry.id, b.id);
        }
    }
});
