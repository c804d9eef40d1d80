//! Names from storage listings: object paths parsed as IDs by `layout` (snapshots/, index/,
//! keys/, deletions/, data/xx/) and the IDs' hex parsers; every accepted name must be exactly the one the
//! writer makes for that ID.
#![no_main]

use cairn_format::id::{BlobId, IndexId, KeyId, PackId, SnapshotId};
use cairn_format::layout;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(path) = std::str::from_utf8(data) else { return };
    if let Some(id) = layout::parse_pack_path(path) {
        assert_eq!(layout::pack_path(&id), path);
    }
    if let Some(id) = layout::parse_snapshot_path(path) {
        assert_eq!(layout::snapshot_path(&id), path);
    }
    if let Some(id) = layout::parse_index_path(path) {
        assert_eq!(layout::index_path(&id), path);
    }
    if let Some(id) = layout::parse_key_path(path) {
        assert_eq!(layout::key_path(&id), path);
    }
    if let Some(id) = layout::parse_deletion_path(path) {
        assert_eq!(layout::deletion_path(&id), path);
    }
    let name = layout::file_name(path);
    let lower = name.to_ascii_lowercase();
    if let Ok(id) = SnapshotId::from_hex(name) {
        assert_eq!(id.to_hex(), lower);
        assert_eq!(id.short(), lower[..8]);
    }
    if let Ok(id) = PackId::from_hex(name) {
        assert_eq!(id.to_hex(), lower);
    }
    let _ = (BlobId::from_hex(name), IndexId::from_hex(name), KeyId::from_hex(name));
    // Content-addressed objects are checked against their names.
    let _ = cairn_format::layout::check_name(path, data);
});
