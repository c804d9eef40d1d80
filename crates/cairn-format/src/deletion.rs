//! Deletion manifests (FORMAT.md §13): what a prune is about to delete, written before anything
//! is deleted.
//!
//! A manifest names the packs to delete and the index files the prune replaces. While one
//! exists, every reader of the index treats its packs as *doomed*: a backup does not
//! deduplicate against them (it stores such a blob again), and a restore reads a blob from a
//! doomed pack only when no other pack holds it. The prune deletes them once every lock that was
//! held when the manifest was written is gone, keeping any pack a snapshot written meanwhile
//! still needs (docs/DESIGN.md, "Prune beside backups").

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::id::{IndexId, PackId};

/// Format of the manifest's body.
pub const VERSION: u32 = 1;

/// The body of a deletion manifest (postcard, inside a sealed file of kind 4).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deletion {
    /// Format of this body: [`VERSION`].
    pub version: u32,
    /// When the manifest was written (Unix seconds).
    pub created: u64,
    /// Packs to delete once it is safe.
    pub packs: Vec<PackId>,
    /// Index files the prune replaces with ones that leave the deleted packs out.
    pub index_files: Vec<IndexId>,
}

impl Deletion {
    /// Serializes (postcard).
    pub fn to_bytes(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("deletion manifest serializes")
    }

    /// Parses; `name` is the file's path, for errors.
    pub fn from_bytes(name: &str, bytes: &[u8]) -> Result<Self> {
        let d: Deletion =
            postcard::from_bytes(bytes).map_err(|e| Error::invalid(name, format!("not a deletion manifest: {e}")))?;
        if d.version != VERSION {
            return Err(Error::invalid(
                name,
                format!("deletion manifest version {} (this cairn reads {VERSION}); use a newer cairn", d.version),
            ));
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn manifests_round_trip(
            created in any::<u64>(),
            packs in proptest::collection::vec(any::<[u8; 32]>(), 0..20),
            index in proptest::collection::vec(any::<[u8; 32]>(), 0..5),
            cut in 1usize..40,
        ) {
            let d = Deletion {
                version: VERSION,
                created,
                packs: packs.into_iter().map(PackId).collect(),
                index_files: index.into_iter().map(IndexId).collect(),
            };
            let b = d.to_bytes();
            prop_assert_eq!(Deletion::from_bytes("d", &b).unwrap(), d);
            prop_assert!(Deletion::from_bytes("d", &b[..b.len().saturating_sub(cut)]).is_err());
        }

        #[test]
        fn any_bytes_parse_or_fail(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(d) = Deletion::from_bytes("d", &b) {
                prop_assert_eq!(Deletion::from_bytes("d", &d.to_bytes()).unwrap(), d);
            }
        }
    }

    #[test]
    fn another_version_is_refused() {
        let d = Deletion { version: 2, ..Deletion::default() };
        let err = Deletion::from_bytes("deletions/x", &d.to_bytes()).unwrap_err().to_string();
        assert!(err.contains("version 2"), "{err}");
    }
}
