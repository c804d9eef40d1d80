//! Key files (`keys/<id>`): JSON read before any authentication, by anyone who can write to the
//! storage.
#![no_main]

use cairn_format::keyfile::KeyFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(kf) = KeyFile::parse("keys/fuzz", data) else { return };
    let again = KeyFile::parse("keys/fuzz", &kf.to_bytes()).expect("a parsed key file reparses");
    assert_eq!(again.to_bytes(), kf.to_bytes());
    // Unwrapping runs Argon2id with the file's own costs; only cheap ones, so the fuzzer stays
    // fast (costs up to the limit are the key file's right: KdfParams::check bounds them).
    let p = kf.argon2;
    if p.memory_kib <= 1024 && p.iterations <= 1 && p.parallelism <= 4 {
        let _ = kf.unwrap_key("keys/fuzz", b"golden-password");
    }
});
