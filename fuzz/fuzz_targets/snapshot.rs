//! Snapshot plaintexts (after the sealed envelope).
#![no_main]

use cairn_format::snapshot::Snapshot;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = Snapshot::from_bytes("snapshots/fuzz", data) else { return };
    assert_eq!(Snapshot::from_bytes("snapshots/fuzz", &s.to_bytes()).expect("re-encoded snapshot parses"), s);
});
