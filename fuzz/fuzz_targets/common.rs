//! Shared by the fuzz targets (included with `#[path]`, each target being its own crate).
#![allow(dead_code)]

use cairn_format::crypto::MasterKey;

/// The golden vectors' master secret (crates/cairn-cli/tests/e2e/golden.rs), so seeds taken from
/// them decrypt.
pub fn key() -> MasterKey {
    MasterKey::from_secret([0x42; 32])
}

/// A fixed salt for objects the targets seal themselves.
pub const SALT: [u8; 32] = [7; 32];
