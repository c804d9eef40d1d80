//! Inputs the fuzz targets (`fuzz/`, docs/FUZZING.md) found crashing, each fed to the parser it
//! crashed, which must now return the crate's error naming the object instead of panicking,
//! overflowing or allocating what the input claims. The inputs are in `tests/fuzz-regressions/
//! <target>/`, in the target's own input format (see `fuzz/fuzz_targets/<target>.rs`).

use std::path::Path;

use cairn_format::compress::Codec;
use cairn_format::crypto::MasterKey;
use cairn_format::id::BlobId;
use cairn_format::pack::BlobEntry;
use cairn_format::sealed::{self, SealedKind};
use cairn_format::tree::{Chunk, Node, NodeKind, Tree};

fn input(target: &str, name: &str) -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-regressions").join(target).join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{p:?}: {e}"))
}

/// The fuzz targets' fixed key: the golden vectors' master secret.
fn key() -> MasterKey {
    MasterKey::from_secret([0x42; 32])
}

/// `sealed` mode 1: the plaintext envelope after `mode | kind`, sealed with the fixed key.
fn seal_envelope(kind: SealedKind, plain: &[u8]) -> Vec<u8> {
    let header = [b'C', b'R', b'N', b'S', kind as u8, 1, 0, 0];
    let salt = [7u8; 32];
    let mut file = header.to_vec();
    file.extend_from_slice(&salt);
    file.extend_from_slice(&key().object_key(&salt).seal(&header, plain));
    file
}

/// blob_entry found it at once: an entry shorter than 48 bytes indexed out of bounds.
#[test]
fn blob_entry_shorter_than_48_bytes_is_an_error() {
    let empty = input("blob_entry", "empty-input");
    assert!(empty.is_empty());
    let err = BlobEntry::decode(&empty).unwrap_err();
    assert_eq!(err, "blob entry of 0 bytes, not 48");
    for len in [1, 17, 47, 49] {
        assert!(BlobEntry::decode(&vec![0; len]).is_err(), "{len} bytes");
    }
}

/// sealed: an envelope of 6 bytes plus a zstd magic declaring a 4 GiB body made `open`
/// allocate 4 GiB (libFuzzer: out-of-memory (malloc(4294967295))); the old guard compared a
/// u32 with 2^32 and could never fire.
#[test]
fn sealed_body_claiming_4_gib_is_refused_without_allocating() {
    let data = input("sealed", "claims-4gib-body");
    assert_eq!(&data[..2], &[1, 0], "mode 1 (plaintext envelope), kind Config");
    let file = seal_envelope(SealedKind::Config, &data[2..]);
    let err = sealed::open(&key(), SealedKind::Config, "config", &file).unwrap_err().to_string();
    assert!(err.starts_with("config is damaged: claims a body of 4294967295 bytes"), "{err}");
    assert!(!err.contains('\n'));
}

/// decompress: the same through the codec directly (blob raw lengths come from index files).
#[test]
fn decompression_claiming_more_than_the_codec_can_produce_is_refused() {
    let data = input("decompress", "zstd-claims-4gib");
    let raw_len = u32::from_le_bytes(data[2..6].try_into().unwrap()) as usize;
    assert_eq!(raw_len, u32::MAX as usize);
    let err = Codec::Zstd(0).decompress(&data[6..], raw_len).unwrap_err();
    assert!(err.contains("cannot decompress to the 4294967295 bytes declared"), "{err}");
    for codec in [Codec::None, Codec::Lz4, Codec::Zstd(3)] {
        assert!(codec.decompress(b"abc", raw_len).is_err());
        let mut out = Vec::new();
        assert!(codec.decompress_into(b"abc", raw_len, &mut out).is_err());
        assert!(out.capacity() < 1 << 20, "{codec}: reserved {}", out.capacity());
    }
    // Real data at its bounds still decompresses.
    let zeros = vec![0u8; 1 << 20];
    for codec in [Codec::Lz4, Codec::Zstd(19)] {
        let c = codec.compress(&zeros).unwrap();
        assert!(codec.max_raw_len(c.len()) >= zeros.len() as u64);
        assert_eq!(codec.decompress(&c, zeros.len()).unwrap(), zeros);
    }
}

/// tree: chunks adding up to more than 2^64 bytes saturated to u64::MAX, matched a size of
/// u64::MAX and overflowed the restore's chunk offsets. Now refused by tree validation.
#[test]
fn tree_whose_chunks_overflow_a_file_size_is_refused() {
    let data = input("tree", "chunks-overflow-u64");
    let err = Tree::from_bytes("tree 1234abcd", &data).unwrap_err().to_string();
    assert_eq!(err, "tree 1234abcd is invalid: entry \"f\": chunks add up to more than 2^64 bytes");
}

/// How `tree/chunks-overflow-u64` was made (kept to show what it holds).
#[test]
fn tree_overflow_input_is_what_it_says() {
    let mut f = Node::new(b"f".to_vec(), NodeKind::File);
    f.size = u64::MAX;
    f.content = vec![Chunk::Zero { len: u64::MAX }, Chunk::Data { id: BlobId([1; 32]), len: 1 }];
    assert_eq!(Tree { nodes: vec![f] }.to_bytes(), input("tree", "chunks-overflow-u64"));
}
