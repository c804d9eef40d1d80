//! The config plaintext (after the sealed envelope), checked as Repository::open checks it.
#![no_main]

use cairn_format::compress::Codec;
use cairn_format::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(config) = serde_json::from_slice::<Config>(data) else { return };
    let _ = config.chunker.validate();
    // Version, chunk sizes and the copied chunk-ID key (FORMAT.md §6), as Repository::open checks.
    if let Ok(Some(_)) = config.validate() {
        assert_eq!(config.chunk_id_key.as_deref().map(str::len), Some(64));
        assert!(config.version >= 2, "a chunk-ID key in a version {} config", config.version);
    }
    let _ = config.codec();
    let _ = config.compression.parse::<Codec>();
    let back: Config = serde_json::from_slice(&serde_json::to_vec(&config).unwrap()).unwrap();
    assert_eq!(back, config);
});
