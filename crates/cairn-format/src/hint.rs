//! The start hint (FORMAT.md §14): one object at a fixed name, `hint`, that a cold restore can
//! read before it has listed anything.
//!
//! A restore on a machine without a metadata cache must list `keys/` and `index/` before it can
//! read a key file or an index file, and must decrypt the index before it knows which packs hold
//! the trees: three round trips one after another before the first data read (docs/DESIGN.md,
//! "Starting at once"). The hint carries a copy of the key file that wrote it and, sealed, the
//! packs that held the repository's trees when it was written. Read beside the listings, it
//! lets the key be derived one round trip earlier and the tree packs be read beside the index
//! files, so the first data read waits two round trips, not three.
//!
//! It is only a hint: its key is used only while `keys/` lists it (a removed key stops opening
//! the repository at once), its tree packs are read ahead but every tree is still found through
//! the index and verified, and a hint that is missing, stale or damaged costs the round trip it
//! would have saved, nothing else. `backup` and `copy` rewrite it.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::id::{KeyId, PackId};

/// The hint's path.
pub const PATH: &str = "hint";

/// The first bytes of a hint.
const MAGIC: &[u8; 8] = b"cairnhnt";

/// Format of the hint's outer layout and of its sealed body.
pub const VERSION: u8 = 1;

/// Most bytes of the key file a hint may carry (key files are a few hundred bytes).
const KEY_FILE_MAX: usize = 64 * 1024;

/// Most tree packs a hint names: as many as a restore reads at once at its start.
pub const TREE_PACKS_MAX: usize = 16;

/// The two parts of a stored hint: the key file it carries (in the clear, as in `keys/`) and
/// the sealed file (kind 5) holding its [`Hint`].
#[derive(Debug, PartialEq, Eq)]
pub struct Parts<'a> {
    /// The bytes of the key file `keys/<BLAKE3 of them>`.
    pub key_file: &'a [u8],
    /// A sealed file of kind [`crate::sealed::SealedKind::Hint`].
    pub sealed: &'a [u8],
}

impl Parts<'_> {
    /// The ID of the key file carried: what `keys/` must list for it to be used.
    pub fn key_id(&self) -> KeyId {
        KeyId::hash_of(self.key_file)
    }
}

/// Lays out a hint: magic, version, the key file's length (u32 LE) and bytes, the sealed file.
pub fn join(key_file: &[u8], sealed: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAGIC.len() + 5 + key_file.len() + sealed.len());
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&(key_file.len() as u32).to_le_bytes());
    out.extend_from_slice(key_file);
    out.extend_from_slice(sealed);
    out
}

/// Splits a stored hint into its parts, or says what is wrong with it.
pub fn split(bytes: &[u8]) -> Result<Parts<'_>> {
    let bad = |why: String| Error::corrupt(PATH, why);
    let rest = bytes.strip_prefix(MAGIC.as_slice()).ok_or_else(|| bad("not a cairn hint (bad magic)".into()))?;
    let (&version, rest) = rest.split_first().ok_or_else(|| bad("truncated after its magic".into()))?;
    if version != VERSION {
        return Err(bad(format!("hint version {version} (this cairn reads {VERSION})")));
    }
    let (len, rest) = rest.split_at_checked(4).ok_or_else(|| bad("truncated in its key file's length".into()))?;
    let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
    if len > KEY_FILE_MAX {
        return Err(bad(format!("claims a key file of {len} bytes (at most {KEY_FILE_MAX})")));
    }
    let (key_file, sealed) =
        rest.split_at_checked(len).ok_or_else(|| bad(format!("truncated in its key file ({len} bytes claimed)")))?;
    Ok(Parts { key_file, sealed })
}

/// A pack that held trees when the hint was written, and how much of it a read of all its
/// blobs takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreePack {
    /// The pack.
    pub pack: PackId,
    /// Where its last blob ends.
    pub length: u64,
}

/// The sealed body of a hint (postcard).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hint {
    /// Format of this body: [`VERSION`].
    pub version: u8,
    /// When it was written (Unix seconds).
    pub written: u64,
    /// The packs holding the repository's trees, when they are few enough to be read whole
    /// at the start of a restore; empty otherwise.
    pub tree_packs: Vec<TreePack>,
}

impl Hint {
    /// Serializes (postcard).
    pub fn to_bytes(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("hint serializes")
    }

    /// Parses the sealed body.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let h: Hint = postcard::from_bytes(bytes).map_err(|e| Error::invalid(PATH, format!("not a hint: {e}")))?;
        if h.version != VERSION {
            return Err(Error::invalid(PATH, format!("hint body version {} (this cairn reads {VERSION})", h.version)));
        }
        if h.tree_packs.len() > TREE_PACKS_MAX {
            return Err(Error::invalid(
                PATH,
                format!("names {} tree packs (at most {TREE_PACKS_MAX})", h.tree_packs.len()),
            ));
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_layout_is_magic_version_length_key_sealed() {
        let b = join(b"{\"k\":1}", b"SEALED");
        assert_eq!(&b[..9], b"cairnhnt\x01");
        assert_eq!(&b[9..13], &7u32.to_le_bytes());
        let p = split(&b).unwrap();
        assert_eq!((p.key_file, p.sealed), (&b"{\"k\":1}"[..], &b"SEALED"[..]));
        assert_eq!(p.key_id(), KeyId::hash_of(b"{\"k\":1}"));
    }

    #[test]
    fn a_bad_hint_is_refused_saying_why() {
        let b = join(b"key", b"s");
        let why = |bytes: &[u8]| split(bytes).unwrap_err().to_string();
        assert!(why(b"cairnhn").contains("bad magic"), "{}", why(b"cairnhn"));
        assert!(why(&b[..8]).contains("truncated after its magic"));
        assert!(why(&b[..11]).contains("key file's length"));
        assert!(why(&b[..14]).contains("truncated in its key file"));
        let mut v2 = b.clone();
        v2[8] = 2;
        assert!(why(&v2).contains("hint version 2"));
        let mut huge = b.clone();
        huge[9..13].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(why(&huge).contains("at most 65536"));
        let many =
            Hint { version: VERSION, written: 1, tree_packs: vec![TreePack { pack: PackId([1; 32]), length: 9 }; 17] };
        assert!(Hint::from_bytes(&many.to_bytes()).unwrap_err().to_string().contains("17 tree packs"));
        let v0 = Hint { version: 0, ..Hint::default() };
        assert!(Hint::from_bytes(&v0.to_bytes()).unwrap_err().to_string().contains("hint body version 0"));
    }

    proptest! {
        #[test]
        fn hints_round_trip(
            key in proptest::collection::vec(any::<u8>(), 0..300),
            sealed in proptest::collection::vec(any::<u8>(), 0..300),
            written in any::<u64>(),
            packs in proptest::collection::vec((any::<[u8; 32]>(), any::<u64>()), 0..=16),
            cut in 1usize..40,
        ) {
            let b = join(&key, &sealed);
            let p = split(&b).unwrap();
            prop_assert_eq!((p.key_file, p.sealed), (&key[..], &sealed[..]));
            let h = Hint {
                version: VERSION,
                written,
                tree_packs: packs.into_iter().map(|(p, length)| TreePack { pack: PackId(p), length }).collect(),
            };
            let body = h.to_bytes();
            prop_assert_eq!(Hint::from_bytes(&body).unwrap(), h);
            prop_assert!(Hint::from_bytes(&body[..body.len().saturating_sub(cut)]).is_err());
        }

        #[test]
        fn any_bytes_split_and_parse_or_fail(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(p) = split(&b) {
                prop_assert_eq!(join(p.key_file, p.sealed), b.clone());
            }
            if let Ok(h) = Hint::from_bytes(&b) {
                prop_assert_eq!(Hint::from_bytes(&h.to_bytes()).unwrap(), h);
            }
        }
    }
}
