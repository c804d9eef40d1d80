//! Lock objects (`locks/<id>`): unauthenticated JSON, listed and read by every operation.
#![no_main]

use cairn_core::lock::{FoundLock, LockInfo};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // As lock::list reads them.
    let info = serde_json::from_slice::<LockInfo>(data).map_err(|e| format!("unreadable lock: {e}"));
    let found = FoundLock { path: "locks/fuzz".into(), info };
    let _ = found.stale_reason();
    if let Ok(info) = &found.info {
        let back: LockInfo = serde_json::from_slice(&serde_json::to_vec(info).unwrap()).unwrap();
        assert_eq!(&back, info);
    }
});
