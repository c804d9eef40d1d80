//! Lock objects (`locks/<id>`): unauthenticated JSON, listed and read by every operation.
#![no_main]

use cairn_format::lock::LockInfo;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // As engine::lock::list reads them; what a listing then asks of each.
    let Ok(info) = LockInfo::parse("locks/fuzz", data) else { return };
    let _ = (info.kind(), info.holder(), info.describe(), info.idle());
    let back = LockInfo::parse("locks/fuzz", &info.to_bytes()).unwrap();
    assert_eq!(back, info);
});
