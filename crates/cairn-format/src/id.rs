//! Typed 32-byte identifiers (FORMAT.md §2).
//!
//! Blob IDs are keyed BLAKE3 hashes of a blob's plaintext; file IDs (packs, index files,
//! snapshots, key files) are plain BLAKE3 hashes of the bytes stored, so the storage can be
//! checked for damage without the key.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A hash map keyed by IDs. IDs are already uniformly distributed hashes, so a fast seeded
/// hasher (foldhash) replaces SipHash: a restore looks up every chunk's ID several times.
pub type IdMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A hash set of IDs; see [`IdMap`].
pub type IdSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// Length of every identifier in bytes.
pub const ID_LEN: usize = 32;

macro_rules! typed_id {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub struct $name(pub [u8; ID_LEN]);

        impl $name {
            /// The ID as lowercase hex (64 characters).
            pub fn to_hex(&self) -> String {
                hex::encode(self.0)
            }

            /// Parses a full 64-character hex ID.
            pub fn from_hex(s: &str) -> Result<Self> {
                let mut out = [0u8; ID_LEN];
                hex::decode_to_slice(s, &mut out)
                    .map_err(|_| Error::InvalidId(format!("{} ID {s:?}", $what)))?;
                Ok(Self(out))
            }

            /// The first 8 hex characters, for display.
            pub fn short(&self) -> String {
                hex::encode(&self.0[..4])
            }

            /// Plain (unkeyed) BLAKE3 of `bytes`: how stored files are named.
            pub fn hash_of(bytes: &[u8]) -> Self {
                Self(*blake3::hash(bytes).as_bytes())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.short())
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.to_hex())
            }
        }
    };
}

typed_id!(
    /// Identifies a blob (a chunk of file data or a tree): keyed BLAKE3 of its plaintext.
    BlobId,
    "blob"
);
typed_id!(
    /// Identifies a pack file: BLAKE3 of its stored bytes.
    PackId,
    "pack"
);
typed_id!(
    /// Identifies a snapshot file: BLAKE3 of its stored bytes.
    SnapshotId,
    "snapshot"
);
typed_id!(
    /// Identifies an index file: BLAKE3 of its stored bytes.
    IndexId,
    "index"
);
typed_id!(
    /// Identifies a key file: BLAKE3 of its stored bytes.
    KeyId,
    "key"
);
typed_id!(
    /// Identifies a deletion manifest: BLAKE3 of its stored bytes.
    DeletionId,
    "deletion"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let id = PackId::hash_of(b"abc");
        assert_eq!(PackId::from_hex(&id.to_hex()).unwrap(), id);
        assert_eq!(id.short().len(), 8);
        assert!(PackId::from_hex("zz").is_err());
    }

    mod proptests {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn hex_round_trips(b in any::<[u8; 32]>(), upper in any::<bool>()) {
                let id = SnapshotId(b);
                let hex = if upper { id.to_hex().to_uppercase() } else { id.to_hex() };
                prop_assert_eq!(SnapshotId::from_hex(&hex).unwrap(), id);
                prop_assert_eq!(id.short(), &id.to_hex()[..8]);
            }

            #[test]
            fn any_name_parses_or_fails(s in ".{0,70}") {
                if let Ok(id) = PackId::from_hex(&s) {
                    prop_assert_eq!(id.to_hex(), s.to_ascii_lowercase());
                }
            }
        }
    }
}
