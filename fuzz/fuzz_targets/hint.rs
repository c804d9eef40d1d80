//! The start hint (`hint`, FORMAT.md §14), read before anything is listed.
//!
//! Input: `mode | rest`.
//! * mode 0: `rest` is a whole stored hint: split into the key file it carries and its sealed
//!   part, which is opened under the fixed key and parsed (seed: the golden vector's layout).
//! * mode 1: `rest` is a hint body plaintext: parsed, and a parsed body re-encodes to itself.
#![no_main]

#[path = "common.rs"]
mod common;

use cairn_format::hint::{join, split, Hint, TREE_PACKS_MAX};
use cairn_format::sealed::{open, SealedKind};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    if mode % 2 == 0 {
        let Ok(parts) = split(rest) else { return };
        assert_eq!(join(parts.key_file, parts.sealed), rest, "a split hint joins back to its bytes");
        let _ = parts.key_id();
        if let Ok(body) = open(&common::key(), SealedKind::Hint, "hint", parts.sealed) {
            let _ = Hint::from_bytes(&body);
        }
    } else if let Ok(h) = Hint::from_bytes(rest) {
        assert!(h.tree_packs.len() <= TREE_PACKS_MAX);
        assert_eq!(Hint::from_bytes(&h.to_bytes()).expect("a re-encoded hint parses"), h);
    }
});
