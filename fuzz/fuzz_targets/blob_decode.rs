//! Blob decoding with the ID check (pack::decode_blob and decode_blob_into), under a fixed key.
//!
//! Input: `mode | rest`.
//! * mode 0: `rest` is `entry(48) | stored bytes`; the target seals the stored bytes with the
//!   entry's ID as AAD, so they reach the decompression and the ID check.
//! * mode 1: `rest` is `entry(48) | sealed bytes` taken as they are.
//! * mode 2: `rest` is `codec | level | plaintext`: compressed, sealed and decoded, it must come
//!   back as it was.
#![no_main]

#[path = "common.rs"]
mod common;

use cairn_format::compress::Codec;
use cairn_format::pack::{decode_blob, decode_blob_into, BlobEntry, BlobKind};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let key = common::key();
    let okey = key.object_key(&common::SALT);
    match mode % 3 {
        0 | 1 => {
            if rest.len() < 48 {
                return;
            }
            let Ok(mut entry) = BlobEntry::decode(&rest[..48]) else { return };
            let sealed = if mode % 3 == 0 { okey.seal(&entry.id.0, &rest[48..]) } else { rest[48..].to_vec() };
            entry.length = sealed.len() as u32;
            let a = decode_blob(&key, &okey, &entry, sealed.clone(), "data/fuzz");
            let mut buf = sealed;
            let mut out = Vec::new();
            let b = decode_blob_into(&key, &okey, &entry, &mut buf, "data/fuzz", &mut out);
            match (a, b) {
                (Ok(a), Ok(Some(r))) => assert_eq!(a, &buf[r]),
                (Ok(a), Ok(None)) => assert_eq!(a, out),
                (Err(_), Err(_)) => {}
                (a, b) => panic!("decode_blob and decode_blob_into disagree: {a:?} / {b:?}"),
            }
        }
        _ => {
            if rest.len() < 2 {
                return;
            }
            let level = (rest[1] as i8).clamp(-7, 22);
            let codec = match rest[0] % 3 {
                0 => Codec::None,
                1 => Codec::Lz4,
                _ => Codec::Zstd(if level == 0 { 1 } else { level }),
            };
            let plain = &rest[2..];
            let (codec, stored) = match codec.compress(plain) {
                Some(c) => (codec, c),
                None => (Codec::None, plain.to_vec()),
            };
            let id = key.blob_id(plain);
            let sealed = okey.seal(&id.0, &stored);
            let entry = BlobEntry {
                id,
                kind: BlobKind::Data,
                codec,
                offset: 0,
                length: sealed.len() as u32,
                raw_length: plain.len() as u32,
            };
            assert_eq!(decode_blob(&key, &okey, &entry, sealed, "data/fuzz").expect("own blob decodes"), plain);
        }
    }
});
