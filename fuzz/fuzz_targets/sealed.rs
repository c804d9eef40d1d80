//! The sealed-file envelope (config, index files, snapshots) under a fixed key.
//!
//! Input: `mode | kind | rest`.
//! * mode 0: `rest` is a whole stored file (seeds: the golden sealed files).
//! * mode 1: `rest` is the plaintext envelope `codec | level | raw length u32 | body`; the target
//!   seals it with the fixed key, so every input gets past the AEAD into the decompression.
//! * mode 2: `rest` is a body: seal() then open() must give it back.
#![no_main]

#[path = "common.rs"]
mod common;

use cairn_format::sealed::{open, seal, SealedKind};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let kind = match data[1] % 3 {
        0 => SealedKind::Config,
        1 => SealedKind::Index,
        _ => SealedKind::Snapshot,
    };
    let key = common::key();
    let rest = &data[2..];
    match data[0] % 3 {
        0 => {
            let _ = open(&key, kind, "fuzz", rest);
        }
        1 => {
            let header = [b'C', b'R', b'N', b'S', kind as u8, 1, 0, 0];
            let mut file = header.to_vec();
            file.extend_from_slice(&common::SALT);
            file.extend_from_slice(&key.object_key(&common::SALT).seal(&header, rest));
            if let Ok(body) = open(&key, kind, "fuzz", &file) {
                let declared = rest.get(2..6).map(|b| u32::from_le_bytes(b.try_into().unwrap()));
                assert_eq!(Some(body.len() as u32), declared);
            }
        }
        _ => {
            let file = seal(&key, kind, rest);
            assert_eq!(open(&key, kind, "fuzz", &file).expect("a sealed body opens"), rest);
        }
    }
});
