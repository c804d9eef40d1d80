//! Pack files: many encrypted blobs, then an encrypted header listing them, then a trailer
//! (FORMAT.md §7).
//!
//! ```text
//! blob 0 | blob 1 | ... | header | trailer
//! blob     nonce(12) | AES-256-GCM(compressed plaintext, AAD = blob ID) | tag(16)
//! header   nonce(12) | AES-256-GCM(entry * n, AAD = "cairn pack header v1") | tag(16)
//! trailer  salt(32) | header length u32 LE | "CRP1"                      (40 bytes)
//! entry    kind u8 | codec u8 | level i8 | 0u8 | offset u32 | length u32 | raw length u32 | id(32)
//! ```
//! All blobs and the header are encrypted under `BLAKE3-keyed(encryption key, salt)`.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::compress::Codec;
use crate::crypto::{random_salt, MasterKey, ObjectKey, SALT_LEN, SEAL_OVERHEAD};
use crate::error::{Error, Result};
use crate::id::{BlobId, PackId, ID_LEN};

const TRAILER_MAGIC: &[u8; 4] = b"CRP1";
/// Length of the pack trailer.
pub const TRAILER_LEN: usize = SALT_LEN + 4 + 4;
/// Length of one encoded blob entry (pack header and index files).
pub const ENTRY_LEN: usize = 16 + ID_LEN;
const HEADER_AAD: &[u8] = b"cairn pack header v1";

/// What a blob holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlobKind {
    /// A chunk of file content.
    Data = 0,
    /// A serialized directory tree.
    Tree = 1,
}

/// Where one blob lives inside its pack and how to decode it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlobEntry {
    /// The blob's ID.
    pub id: BlobId,
    /// Data or tree.
    pub kind: BlobKind,
    /// How the plaintext was compressed.
    pub codec: Codec,
    /// Byte offset in the pack.
    pub offset: u32,
    /// Stored length (nonce + ciphertext + tag).
    pub length: u32,
    /// Plaintext length.
    pub raw_length: u32,
}

impl BlobEntry {
    /// Appends the 48-byte encoding.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let (codec, level) = self.codec.to_bytes();
        out.extend_from_slice(&[self.kind as u8, codec, level as u8, 0]);
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.length.to_le_bytes());
        out.extend_from_slice(&self.raw_length.to_le_bytes());
        out.extend_from_slice(&self.id.0);
    }

    /// Decodes one 48-byte entry; `Err` holds what is wrong with it.
    pub fn decode(b: &[u8]) -> std::result::Result<Self, String> {
        if b.len() != ENTRY_LEN {
            return Err(format!("blob entry of {} bytes, not {ENTRY_LEN}", b.len()));
        }
        let kind = match b[0] {
            0 => BlobKind::Data,
            1 => BlobKind::Tree,
            k => return Err(format!("unknown blob kind {k}")),
        };
        let codec = Codec::from_bytes(b[1], b[2] as i8).ok_or_else(|| format!("unknown codec {}", b[1]))?;
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let entry = BlobEntry {
            kind,
            codec,
            offset: u32_at(4),
            length: u32_at(8),
            raw_length: u32_at(12),
            id: BlobId(b[16..48].try_into().expect("32 bytes")),
        };
        if (entry.length as usize) < SEAL_OVERHEAD {
            return Err(format!("blob {} has impossible length {}", entry.id.short(), entry.length));
        }
        Ok(entry)
    }
}

/// Assembles one pack in memory.
pub struct PackWriter {
    salt: [u8; SALT_LEN],
    key: ObjectKey,
    buf: Vec<u8>,
    entries: Vec<BlobEntry>,
}

/// A finished pack, ready to upload.
pub struct FinishedPack {
    /// BLAKE3 of `bytes`.
    pub id: PackId,
    /// The pack's salt (recorded in the index so blobs can be read without the trailer).
    pub salt: [u8; SALT_LEN],
    /// The whole pack file.
    pub bytes: Vec<u8>,
    /// The blobs it holds.
    pub entries: Vec<BlobEntry>,
}

impl PackWriter {
    /// Starts a pack with a fresh salt.
    pub fn new(master: &MasterKey, capacity: usize) -> Self {
        let salt = random_salt();
        PackWriter { salt, key: master.object_key(&salt), buf: Vec::with_capacity(capacity), entries: Vec::new() }
    }

    /// Bytes so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether no blob has been added.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Makes room for `additional` more bytes, growing the buffer by doubling but never past
    /// `limit` (unless one blob needs more): a tree pack that starts small and fills to the
    /// target size would otherwise double to twice the limit just before it is closed.
    pub fn reserve(&mut self, additional: usize, limit: usize) {
        let needed = self.buf.len() + additional;
        if needed > self.buf.capacity() {
            let grown = (self.buf.capacity() * 2).min(limit).max(needed);
            self.buf.reserve_exact(grown - self.buf.len());
        }
    }

    /// Encrypts and appends a blob whose plaintext was already compressed to `stored`.
    pub fn add(&mut self, id: BlobId, kind: BlobKind, codec: Codec, raw_length: u32, stored: &[u8]) {
        let offset = self.buf.len() as u32;
        let length = self.key.seal_append(&id.0, stored, &mut self.buf) as u32;
        self.entries.push(BlobEntry { id, kind, codec, offset, length, raw_length });
    }

    /// Appends header and trailer.
    pub fn finish(mut self) -> FinishedPack {
        let mut header = Vec::with_capacity(self.entries.len() * ENTRY_LEN);
        for e in &self.entries {
            e.encode(&mut header);
        }
        let sealed = self.key.seal(HEADER_AAD, &header);
        self.buf.extend_from_slice(&sealed);
        self.buf.extend_from_slice(&self.salt);
        self.buf.extend_from_slice(&(sealed.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(TRAILER_MAGIC);
        FinishedPack { id: PackId::hash_of(&self.buf), salt: self.salt, bytes: self.buf, entries: self.entries }
    }
}

/// Reads the header of a whole pack file (used to rebuild the index and by `check`).
pub fn read_header(master: &MasterKey, name: &str, pack: &[u8]) -> Result<([u8; SALT_LEN], Vec<BlobEntry>)> {
    read_header_tail(master, name, pack, pack.len() as u64)
}

/// Stored length of the header and trailer of a pack of `blobs` blobs: how much of its end a
/// reader fetches to read the header alone.
pub fn header_tail_len(blobs: usize) -> u64 {
    (blobs * ENTRY_LEN + SEAL_OVERHEAD + TRAILER_LEN) as u64
}

/// Reads the header from the last `tail.len()` bytes of a pack of `pack_len` bytes (the whole
/// pack, or just its end: see [`header_tail_len`]).
pub fn read_header_tail(
    master: &MasterKey,
    name: &str,
    tail: &[u8],
    pack_len: u64,
) -> Result<([u8; SALT_LEN], Vec<BlobEntry>)> {
    let pack = tail;
    if pack.len() < TRAILER_LEN + SEAL_OVERHEAD {
        return Err(Error::corrupt(name, "truncated: shorter than a pack trailer"));
    }
    let trailer = &pack[pack.len() - TRAILER_LEN..];
    if &trailer[SALT_LEN + 4..] != TRAILER_MAGIC {
        return Err(Error::corrupt(name, "bad pack trailer magic (truncated or not a pack)"));
    }
    let salt: [u8; SALT_LEN] = trailer[..SALT_LEN].try_into().expect("salt");
    let hlen = u32::from_le_bytes(trailer[SALT_LEN..SALT_LEN + 4].try_into().expect("4")) as usize;
    let body_end = pack.len() - TRAILER_LEN;
    if hlen > body_end || hlen < SEAL_OVERHEAD {
        return Err(Error::corrupt(name, "pack header length out of range"));
    }
    let header = master
        .object_key(&salt)
        .open(HEADER_AAD, &pack[body_end - hlen..body_end])
        .ok_or_else(|| Error::corrupt(name, "pack header authentication failed"))?;
    // Where the blobs end in the whole pack (the tail may start anywhere before the header).
    let blobs_end = pack_len.saturating_sub((TRAILER_LEN + hlen) as u64);
    if header.len() % ENTRY_LEN != 0 {
        return Err(Error::corrupt(name, "pack header has a partial entry"));
    }
    let entries = header
        .chunks_exact(ENTRY_LEN)
        .map(|c| {
            let e = BlobEntry::decode(c).map_err(|why| Error::corrupt(name, why))?;
            if u64::from(e.offset) + u64::from(e.length) > blobs_end {
                return Err(Error::corrupt(name, format!("blob {} lies outside the pack", e.id.short())));
            }
            Ok(e)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((salt, entries))
}

/// Decrypts, decompresses and verifies one blob read from its pack. `sealed` is exactly the
/// blob's `length` bytes; `file` names the pack for errors. The blob's ID is recomputed from
/// the plaintext and compared, so wrong bytes are never returned.
pub fn decode_blob(
    master: &MasterKey,
    key: &ObjectKey,
    entry: &BlobEntry,
    mut sealed: Vec<u8>,
    file: &str,
) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    match decode_blob_into(master, key, entry, &mut sealed, file, &mut out)? {
        // Stored uncompressed: the plaintext stays in `sealed`'s allocation.
        Some(range) => {
            sealed.truncate(range.end);
            sealed.drain(..range.start);
            Ok(sealed)
        }
        None => Ok(out),
    }
}

/// Decodes a blob inside a larger read (decrypting it in place) without copying it: a blob
/// stored uncompressed is left where it was decrypted and its plaintext's place in `sealed`
/// returned; a compressed one is decompressed into `out` (replacing its content, reusing its
/// memory) and `None` returned. Either way the plaintext has been verified against the blob's ID.
pub fn decode_blob_into(
    master: &MasterKey,
    key: &ObjectKey,
    entry: &BlobEntry,
    sealed: &mut [u8],
    file: &str,
    out: &mut Vec<u8>,
) -> Result<Option<std::ops::Range<usize>>> {
    let stored = verify_stored(master, key, entry, sealed, file, out)?;
    // Stored uncompressed, the stored bytes are the plaintext; otherwise it is in `out`.
    Ok((entry.codec == Codec::None).then_some(stored))
}

/// Decrypts a blob in place and verifies it (decompressing into `scratch`, replacing its content
/// and reusing its memory), and returns where its *stored* bytes lie in `sealed`: still
/// compressed, ready to be written into another pack as they are (a repack).
pub fn verify_stored(
    master: &MasterKey,
    key: &ObjectKey,
    entry: &BlobEntry,
    sealed: &mut [u8],
    file: &str,
    scratch: &mut Vec<u8>,
) -> Result<std::ops::Range<usize>> {
    let range = open_blob(key, entry, sealed, file)?;
    if entry.codec == Codec::None {
        verify_blob(master, entry, &sealed[range.clone()], file)?;
    } else {
        entry
            .codec
            .decompress_into(&sealed[range.clone()], entry.raw_length as usize, scratch)
            .map_err(|why| Error::corrupt(file, format!("blob {}: {why}", entry.id.short())))?;
        verify_blob(master, entry, scratch, file)?;
    }
    Ok(range)
}

/// Decrypts a blob in place; returns where its (still compressed) plaintext lies.
fn open_blob(key: &ObjectKey, entry: &BlobEntry, sealed: &mut [u8], file: &str) -> Result<std::ops::Range<usize>> {
    key.open_in_place(&entry.id.0, sealed)
        .ok_or_else(|| Error::corrupt(file, format!("blob {} failed authentication", entry.id.short())))
}

/// Checks that the plaintext has the blob's length and ID.
fn verify_blob(master: &MasterKey, entry: &BlobEntry, plain: &[u8], file: &str) -> Result<()> {
    if plain.len() != entry.raw_length as usize {
        return Err(Error::corrupt(file, format!("blob {} has the wrong length", entry.id.short())));
    }
    if master.blob_id(plain) != entry.id {
        return Err(Error::corrupt(file, format!("blob {} does not match its ID", entry.id.short())));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn write_read_header_and_blobs() {
        let mk = MasterKey::generate();
        let mut w = PackWriter::new(&mk, 0);
        let a = b"alpha".repeat(50);
        let id_a = mk.blob_id(&a);
        let ca = Codec::Zstd(3).compress(&a).unwrap();
        w.add(id_a, BlobKind::Data, Codec::Zstd(3), a.len() as u32, &ca);
        let b = b"beta".to_vec();
        let id_b = mk.blob_id(&b);
        w.add(id_b, BlobKind::Tree, Codec::None, 4, &b);
        let p = w.finish();
        assert_eq!(PackId::hash_of(&p.bytes), p.id);
        let (salt, entries) = read_header(&mk, "p", &p.bytes).unwrap();
        assert_eq!(salt, p.salt);
        assert_eq!(entries, p.entries);
        let key = mk.object_key(&salt);
        for (e, want) in entries.iter().zip([&a, &b]) {
            let raw = p.bytes[e.offset as usize..(e.offset + e.length) as usize].to_vec();
            assert_eq!(&decode_blob(&mk, &key, e, raw.clone(), "p").unwrap(), want);
            let mut bad = raw;
            bad[14] ^= 1;
            assert!(decode_blob(&mk, &key, e, bad, "p").is_err());
        }
        assert!(read_header(&mk, "p", &p.bytes[..p.bytes.len() - 1]).is_err());
    }

    pub(crate) mod proptests {
        use super::super::*;
        use proptest::prelude::*;

        pub(crate) fn codec() -> impl Strategy<Value = Codec> {
            prop_oneof![Just(Codec::None), Just(Codec::Lz4), (-7i8..=22).prop_map(Codec::Zstd)]
        }

        pub(crate) fn entry() -> impl Strategy<Value = BlobEntry> {
            (any::<[u8; 32]>(), any::<bool>(), codec(), any::<u32>(), SEAL_OVERHEAD as u32.., any::<u32>()).prop_map(
                |(id, tree, codec, offset, length, raw_length)| BlobEntry {
                    id: BlobId(id),
                    kind: if tree { BlobKind::Tree } else { BlobKind::Data },
                    codec,
                    offset,
                    length,
                    raw_length,
                },
            )
        }

        proptest! {
            #[test]
            fn entry_round_trips(e in entry()) {
                let mut b = Vec::new();
                e.encode(&mut b);
                prop_assert_eq!(b.len(), ENTRY_LEN);
                prop_assert_eq!(BlobEntry::decode(&b), Ok(e));
            }

            /// Any bytes: an error (never a panic), or an entry that encodes back to them (but
            /// for the reserved byte and the level of a codec without levels).
            #[test]
            fn any_bytes_decode_or_fail(b in proptest::collection::vec(any::<u8>(), 0..100)) {
                if let Ok(e) = BlobEntry::decode(&b) {
                    prop_assert_eq!(b.len(), ENTRY_LEN);
                    let mut back = Vec::new();
                    e.encode(&mut back);
                    let mut want = b.clone();
                    want[3] = 0;
                    if b[1] != 2 {
                        want[2] = 0;
                    }
                    prop_assert_eq!(back, want);
                }
            }

            /// PackWriter's packs parse back to the entries written, and every blob decodes to
            /// its plaintext; the pack is damaged by any cut.
            #[test]
            fn packs_round_trip(
                blobs in proptest::collection::vec((proptest::collection::vec(any::<u8>(), 0..2000), codec(), any::<bool>()), 0..8),
                cut in 1usize..200,
            ) {
                let mk = MasterKey::from_secret([9; 32]);
                let mut w = PackWriter::new(&mk, 0);
                for (plain, codec, tree) in &blobs {
                    let (codec, stored) = match codec.compress(plain) {
                        Some(c) => (*codec, c),
                        None => (Codec::None, plain.clone()),
                    };
                    let kind = if *tree { BlobKind::Tree } else { BlobKind::Data };
                    w.add(mk.blob_id(plain), kind, codec, plain.len() as u32, &stored);
                }
                let p = w.finish();
                let (salt, entries) = read_header(&mk, "p", &p.bytes).unwrap();
                prop_assert_eq!(salt, p.salt);
                prop_assert_eq!(&entries, &p.entries);
                let key = mk.object_key(&salt);
                let mut end = 0;
                for (e, (plain, _, _)) in entries.iter().zip(&blobs) {
                    prop_assert_eq!(e.offset as usize, end);
                    end += e.length as usize;
                    let sealed = p.bytes[e.offset as usize..end].to_vec();
                    prop_assert_eq!(&decode_blob(&mk, &key, e, sealed, "p").unwrap(), plain);
                }
                let cut = cut.min(p.bytes.len());
                prop_assert!(read_header(&mk, "p", &p.bytes[..p.bytes.len() - cut]).is_err());
            }
        }
    }
}
/// Blobs and bytes of one codec.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CodecUse {
    /// Blobs.
    pub blobs: u64,
    /// Stored bytes.
    pub stored: u64,
    /// Plaintext bytes.
    pub raw: u64,
}

/// Adds blob `b` to the per-codec totals (keyed by the codec's name).
pub fn count_codec(by_codec: &mut BTreeMap<String, CodecUse>, b: &BlobEntry) {
    let c = by_codec.entry(b.codec.to_string()).or_default();
    c.blobs += 1;
    c.stored += u64::from(b.length);
    c.raw += u64::from(b.raw_length);
}
