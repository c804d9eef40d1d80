//! The config plaintext (after the sealed envelope), checked as Repository::open checks it.
#![no_main]

use cairn_core::compress::Codec;
use cairn_core::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(config) = serde_json::from_slice::<Config>(data) else { return };
    let _ = config.chunker.validate();
    let _ = config.codec();
    let _ = config.compression.parse::<Codec>();
    let back: Config = serde_json::from_slice(&serde_json::to_vec(&config).unwrap()).unwrap();
    assert_eq!(back, config);
});
