//! Sealed files: the envelope of every encrypted file that is not a pack — the config, index
//! files and snapshots (FORMAT.md §4).
//!
//! ```text
//! header   8 bytes  "CRNS" | kind u8 | version u8 (1) | 0u8 | 0u8      (also the AEAD's AAD)
//! salt    32 bytes  random; the file's AES-256-GCM key is BLAKE3-keyed(encryption key, salt)
//! sealed   N bytes  nonce(12) | AES-256-GCM(plaintext) | tag(16)
//! plaintext:        codec u8 | level i8 | raw length u32 LE | body (compressed by codec)
//! ```

use crate::compress::Codec;
use crate::crypto::{MasterKey, SALT_LEN, SEAL_OVERHEAD};
use crate::error::{Error, Result};

const MAGIC: &[u8; 4] = b"CRNS";
const VERSION: u8 = 1;
const HEADER_LEN: usize = 8;

/// What a sealed file holds; its byte is bound into the authenticated header so one kind of
/// file can never be passed off as another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SealedKind {
    /// The repository config.
    Config = 1,
    /// An index file.
    Index = 2,
    /// A snapshot.
    Snapshot = 3,
    /// A prune's deletion manifest.
    Deletion = 4,
    /// The body of the start hint (FORMAT.md §14).
    Hint = 5,
}

/// Encrypts `body` as a sealed file of `kind`, compressing it with zstd when that helps.
pub fn seal(key: &MasterKey, kind: SealedKind, body: &[u8]) -> Vec<u8> {
    let (codec, payload) = match Codec::Zstd(3).compress(body) {
        Some(c) => (Codec::Zstd(3), c),
        None => (Codec::None, body.to_vec()),
    };
    let (codec_byte, level) = codec.to_bytes();
    let mut plain = Vec::with_capacity(payload.len() + 6);
    plain.push(codec_byte);
    plain.push(level as u8);
    plain.extend_from_slice(&(body.len() as u32).to_le_bytes());
    plain.extend_from_slice(&payload);

    let header = [MAGIC[0], MAGIC[1], MAGIC[2], MAGIC[3], kind as u8, VERSION, 0, 0];
    let salt = crate::crypto::random_salt();
    let sealed = key.object_key(&salt).seal(&header, &plain);
    let mut out = Vec::with_capacity(HEADER_LEN + SALT_LEN + sealed.len());
    out.extend_from_slice(&header);
    out.extend_from_slice(&salt);
    out.extend_from_slice(&sealed);
    out
}

/// Decrypts and decompresses a sealed file; `name` is its repository path, for errors.
pub fn open(key: &MasterKey, kind: SealedKind, name: &str, data: &[u8]) -> Result<Vec<u8>> {
    if data.len() < HEADER_LEN + SALT_LEN + SEAL_OVERHEAD + 6 {
        return Err(Error::corrupt(name, format!("truncated ({} bytes)", data.len())));
    }
    let (header, rest) = data.split_at(HEADER_LEN);
    if &header[..4] != MAGIC {
        return Err(Error::corrupt(name, "not a cairn sealed file (bad magic)"));
    }
    if header[4] != kind as u8 {
        return Err(Error::corrupt(name, format!("holds kind {} where {kind:?} was expected", header[4])));
    }
    if header[5] != VERSION {
        return Err(Error::corrupt(name, format!("unknown sealed-file version {}", header[5])));
    }
    let (salt, sealed) = rest.split_at(SALT_LEN);
    let salt: &[u8; SALT_LEN] = salt.try_into().expect("split at SALT_LEN");
    let plain = key.object_key(salt).open(header, sealed).ok_or_else(|| {
        Error::corrupt(name, "authentication failed (damaged, truncated or not from this repository)")
    })?;
    let codec = Codec::from_bytes(plain[0], plain[1] as i8)
        .ok_or_else(|| Error::corrupt(name, format!("unknown codec {}", plain[0])))?;
    let raw_len = u32::from_le_bytes(plain[2..6].try_into().expect("4 bytes")) as usize;
    // The declared length is allocated before decompressing: it may be no more than the stored
    // body can expand to (a few stored bytes claiming 4 GiB are refused, not allocated).
    let limit = codec.max_raw_len(plain.len() - 6);
    if raw_len as u64 > limit {
        return Err(Error::corrupt(
            name,
            format!(
                "claims a body of {raw_len} bytes, more than {} stored bytes of {codec} can hold ({limit})",
                plain.len() - 6
            ),
        ));
    }
    codec.decompress(&plain[6..], raw_len).map_err(|why| Error::corrupt(name, format!("cannot decompress: {why}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_kind_binding() {
        let key = MasterKey::generate();
        let body = b"snapshot body ".repeat(100);
        let file = seal(&key, SealedKind::Snapshot, &body);
        assert_eq!(open(&key, SealedKind::Snapshot, "s", &file).unwrap(), body);
        let err = open(&key, SealedKind::Index, "s", &file).unwrap_err().to_string();
        assert!(err.contains("where Index was expected"), "{err}");
        for i in [0, 5, 9, 40, 60, file.len() - 1] {
            let mut bad = file.clone();
            bad[i] ^= 0x10;
            assert!(open(&key, SealedKind::Snapshot, "s", &bad).is_err());
        }
        assert!(open(&key, SealedKind::Snapshot, "s", &file[..file.len() - 3]).is_err());
        assert!(open(&MasterKey::generate(), SealedKind::Snapshot, "s", &file).is_err());
    }

    mod proptests {
        use super::super::*;
        use proptest::prelude::*;

        fn kind() -> impl Strategy<Value = SealedKind> {
            prop_oneof![
                Just(SealedKind::Config),
                Just(SealedKind::Index),
                Just(SealedKind::Snapshot),
                Just(SealedKind::Deletion),
                Just(SealedKind::Hint)
            ]
        }

        proptest! {
            #[test]
            fn sealed_files_round_trip(
                body in prop_oneof![
                    proptest::collection::vec(any::<u8>(), 0..3000),
                    (proptest::collection::vec(any::<u8>(), 1..20), 1usize..300).prop_map(|(v, n)| v.repeat(n)),
                ],
                kind in kind(),
                flip in any::<prop::sample::Index>(),
                bit in 0u8..8,
            ) {
                let key = MasterKey::from_secret([3; 32]);
                let file = seal(&key, kind, &body);
                prop_assert_eq!(open(&key, kind, "s", &file).unwrap(), body);
                let mut bad = file.clone();
                bad[flip.index(file.len())] ^= 1 << bit;
                prop_assert!(open(&key, kind, "s", &bad).is_err());
                prop_assert!(open(&key, kind, "s", &file[..flip.index(file.len())]).is_err());
            }
        }
    }
}
