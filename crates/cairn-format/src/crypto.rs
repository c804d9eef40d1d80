//! Keys and authenticated encryption (FORMAT.md §3).
//!
//! A random 32-byte master secret is the root of everything. From it, BLAKE3's key derivation
//! makes two independent keys: the *chunk ID key* (keyed BLAKE3 of plaintext names blobs) and
//! the *encryption key*. Nothing is ever encrypted under the encryption key itself: every pack
//! and every sealed file carries a random 32-byte salt, and its AES-256-GCM key is
//! `BLAKE3-keyed(encryption key, salt)`. Random 96-bit nonces are then used under keys that each
//! see at most one pack's worth of messages (FORMAT.md §3.3 gives the collision bound).

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};

use crate::id::BlobId;

/// Bytes added by [`seal`]: a 12-byte nonce in front and a 16-byte tag behind.
pub const SEAL_OVERHEAD: usize = NONCE_LEN + TAG_LEN;
/// Length of the GCM authentication tag.
pub const TAG_LEN: usize = 16;
/// Length of a per-object salt.
pub const SALT_LEN: usize = 32;

const CONTEXT_ENCRYPTION: &str = "cairn 2026-11-22 encryption key v1";
const CONTEXT_CHUNK_ID: &str = "cairn 2026-11-22 chunk id key v1";

/// Fills `buf` with bytes from the operating system's CSPRNG.
pub fn random_bytes(buf: &mut [u8]) {
    SystemRandom::new().fill(buf).expect("the operating system's random number generator failed");
}

/// A fresh random salt.
pub fn random_salt() -> [u8; SALT_LEN] {
    let mut s = [0u8; SALT_LEN];
    random_bytes(&mut s);
    s
}

/// The repository's master secret and the keys derived from it.
#[derive(Clone)]
pub struct MasterKey {
    secret: [u8; 32],
    encryption: [u8; 32],
    chunk_id: [u8; 32],
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(..)")
    }
}

impl MasterKey {
    /// A new random master key.
    pub fn generate() -> Self {
        let mut secret = [0u8; 32];
        random_bytes(&mut secret);
        Self::from_secret(secret)
    }

    /// Rebuilds the key set from the 32-byte master secret stored (wrapped) in key files.
    pub fn from_secret(secret: [u8; 32]) -> Self {
        Self {
            secret,
            encryption: blake3::derive_key(CONTEXT_ENCRYPTION, &secret),
            chunk_id: blake3::derive_key(CONTEXT_CHUNK_ID, &secret),
        }
    }

    /// The master secret, for wrapping into a key file.
    pub fn secret(&self) -> &[u8; 32] {
        &self.secret
    }

    /// This key set with `key` as its chunk-ID key instead of the one derived from the master
    /// secret: a repository made with `init --copy-chunker-params` names blobs as its source
    /// does (the config holds the key; FORMAT.md §3.1, §6).
    pub fn with_chunk_id_key(mut self, key: [u8; 32]) -> Self {
        self.chunk_id = key;
        self
    }

    /// The chunk-ID key (to give a repository made with `init --copy-chunker-params`).
    pub fn chunk_id_key(&self) -> &[u8; 32] {
        &self.chunk_id
    }

    /// The ID of a blob with this plaintext: keyed BLAKE3 under the chunk ID key.
    pub fn blob_id(&self, plaintext: &[u8]) -> BlobId {
        BlobId(*blake3::keyed_hash(&self.chunk_id, plaintext).as_bytes())
    }

    /// A hasher computing [`MasterKey::blob_id`] of plaintext fed to it piece by piece.
    pub fn blob_hasher(&self) -> blake3::Hasher {
        blake3::Hasher::new_keyed(&self.chunk_id)
    }

    /// The AES-256-GCM key for the object (pack or sealed file) with this salt.
    pub fn object_key(&self, salt: &[u8; SALT_LEN]) -> ObjectKey {
        ObjectKey::new(blake3::keyed_hash(&self.encryption, salt).as_bytes())
    }
}

/// An AES-256-GCM key for one pack or one sealed file.
pub struct ObjectKey(LessSafeKey);

impl ObjectKey {
    /// Wraps 32 raw key bytes.
    pub fn new(key: &[u8; 32]) -> Self {
        let unbound = UnboundKey::new(&AES_256_GCM, key).expect("32-byte AES-256 key");
        ObjectKey(LessSafeKey::new(unbound))
    }

    /// Encrypts `plaintext`, returning `nonce || ciphertext || tag`.
    pub fn seal(&self, aad: &[u8], plaintext: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(plaintext.len() + SEAL_OVERHEAD);
        self.seal_append(aad, plaintext, &mut out);
        out
    }

    /// Appends `nonce || ciphertext || tag` of `plaintext` to `out` (encrypting where it lands,
    /// so a pack is built without a copy of each sealed blob); returns the sealed length.
    pub fn seal_append(&self, aad: &[u8], plaintext: &[u8], out: &mut Vec<u8>) -> usize {
        let start = out.len();
        let mut nonce = [0u8; NONCE_LEN];
        random_bytes(&mut nonce);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plaintext);
        let tag = self
            .0
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut out[start + NONCE_LEN..],
            )
            .expect("AES-GCM seal of a message under 64 GiB");
        out.extend_from_slice(tag.as_ref());
        out.len() - start
    }

    /// Decrypts `nonce || ciphertext || tag` in place; returns the plaintext's range in `buf`,
    /// or `None` if authentication fails (wrong key, damaged or truncated data).
    pub fn open_in_place(&self, aad: &[u8], buf: &mut [u8]) -> Option<std::ops::Range<usize>> {
        if buf.len() < SEAL_OVERHEAD {
            return None;
        }
        let (nonce, rest) = buf.split_at_mut(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let plain = self.0.open_in_place(nonce, Aad::from(aad), rest).ok()?;
        let len = plain.len();
        Some(NONCE_LEN..NONCE_LEN + len)
    }

    /// Decrypts into a new vector.
    pub fn open(&self, aad: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
        let mut buf = sealed.to_vec();
        let range = self.open_in_place(aad, &mut buf)?;
        buf.truncate(range.end);
        buf.drain(..range.start);
        Some(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_open_round_trip_and_tamper() {
        let mk = MasterKey::generate();
        let key = mk.object_key(&random_salt());
        let sealed = key.seal(b"aad", b"hello world");
        assert_eq!(sealed.len(), 11 + SEAL_OVERHEAD);
        assert_eq!(key.open(b"aad", &sealed).unwrap(), b"hello world");
        assert!(key.open(b"other", &sealed).is_none());
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 1;
            assert!(key.open(b"aad", &bad).is_none(), "flip at {i} undetected");
        }
        assert!(key.open(b"aad", &sealed[..sealed.len() - 1]).is_none());
    }

    #[test]
    fn derived_keys_differ_and_are_stable() {
        let mk = MasterKey::from_secret([7u8; 32]);
        let again = MasterKey::from_secret([7u8; 32]);
        assert_eq!(mk.blob_id(b"x"), again.blob_id(b"x"));
        assert_ne!(mk.blob_id(b"x"), MasterKey::from_secret([8u8; 32]).blob_id(b"x"));
        assert_ne!(mk.encryption, mk.chunk_id);
    }

    #[test]
    fn a_copied_chunk_id_key_names_blobs_as_the_source_does() {
        let source = MasterKey::from_secret([7u8; 32]);
        let copy = MasterKey::from_secret([9u8; 32]).with_chunk_id_key(*source.chunk_id_key());
        assert_eq!(copy.blob_id(b"x"), source.blob_id(b"x"));
        // Encryption stays the repository's own.
        assert_ne!(copy.encryption, source.encryption);
    }
}
