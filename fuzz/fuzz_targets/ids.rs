//! Names from storage listings: object names parsed as IDs (snapshots/, index/, keys/, data/).
#![no_main]

use cairn_core::id::{BlobId, IndexId, KeyId, PackId, SnapshotId};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(path) = std::str::from_utf8(data) else { return };
    // As Repository::snapshots takes a listed object's name.
    let name = path.rsplit('/').next().unwrap_or_default();
    let lower = name.to_ascii_lowercase();
    if let Ok(id) = SnapshotId::from_hex(name) {
        assert_eq!(id.to_hex(), lower);
        assert_eq!(id.short(), lower[..8]);
    }
    if let Ok(id) = PackId::from_hex(name) {
        assert_eq!(id.to_hex(), lower);
        let p = cairn_core::pack::pack_path(&id);
        assert_eq!(PackId::from_hex(p.rsplit('/').next().unwrap()).unwrap(), id);
    }
    let _ = (BlobId::from_hex(name), IndexId::from_hex(name), KeyId::from_hex(name));
    // Content-addressed objects are checked against their names.
    let _ = cairn_core::repository::check_name(path, data);
});
