//! Deletion manifest plaintexts (after the sealed envelope): what a prune is about to delete.
#![no_main]

use cairn_format::deletion::Deletion;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(d) = Deletion::from_bytes("deletions/fuzz", data) else { return };
    assert_eq!(Deletion::from_bytes("deletions/fuzz", &d.to_bytes()).expect("re-encoded manifest parses"), d);
});
