//! One 48-byte blob entry (pack headers and index files), from arbitrary bytes.
#![no_main]

use cairn_format::pack::BlobEntry;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(e) = BlobEntry::decode(data) else { return };
    let mut out = Vec::new();
    e.encode(&mut out);
    assert_eq!(out.len(), cairn_format::pack::ENTRY_LEN);
    assert_eq!(BlobEntry::decode(&out), Ok(e));
});
