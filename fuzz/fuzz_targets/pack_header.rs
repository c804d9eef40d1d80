//! Pack files: trailer, header and the blobs it lists, under a fixed key.
//!
//! Input: `mode | rest`.
//! * mode 0: `rest` is a whole pack file (seed: the golden pack).
//! * mode 1: `rest` is `body length u16 LE | body | header plaintext`; the target builds a pack
//!   whose header is `header plaintext` sealed with the fixed key, so the entries are parsed.
//!
//! Every blob the header accepts is then decoded as a restore would.
#![no_main]

#[path = "common.rs"]
mod common;

use cairn_format::pack::{decode_blob, read_header};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let key = common::key();
    let pack = if mode % 2 == 0 {
        rest.to_vec()
    } else {
        if rest.len() < 2 {
            return;
        }
        let body_len = (u16::from_le_bytes([rest[0], rest[1]]) as usize).min(rest.len() - 2);
        let (body, header) = rest[2..].split_at(body_len);
        let mut pack = body.to_vec();
        let sealed = key.object_key(&common::SALT).seal(b"cairn pack header v1", header);
        pack.extend_from_slice(&sealed);
        pack.extend_from_slice(&common::SALT);
        pack.extend_from_slice(&(sealed.len() as u32).to_le_bytes());
        pack.extend_from_slice(b"CRP1");
        pack
    };
    let Ok((salt, entries)) = read_header(&key, "data/fuzz", &pack) else { return };
    let okey = key.object_key(&salt);
    for e in entries {
        let start = e.offset as usize;
        let end = start + e.length as usize;
        let sealed = pack[start..end].to_vec();
        if let Ok(plain) = decode_blob(&key, &okey, &e, sealed, "data/fuzz") {
            assert_eq!(plain.len(), e.raw_length as usize);
        }
    }
});
