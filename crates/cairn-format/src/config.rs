//! The repository config (FORMAT.md §6): format version and the choices a repository makes
//! once — chunker parameters, pack size, default compression.

use serde::{Deserialize, Serialize};

use crate::compress::{Codec, DEFAULT_CODEC};
use crate::error::{Error, Result};

/// The highest repository format version this build reads (and writes, for a repository made
/// with `init --copy-chunker-params`).
pub const FORMAT_VERSION: u32 = 2;

/// The version of a config without a copied chunk-ID key: every version of Cairn reads it.
pub const BASE_VERSION: u32 = 1;

/// The first version whose config may hold a `chunk_id_key` (FORMAT.md §6). A reader of
/// version 1 would ignore the field and compute every blob ID wrong, so it must refuse such a
/// config, and it does: it refuses any higher version.
pub const CHUNK_ID_KEY_VERSION: u32 = 2;

/// Content-defined chunking parameters (FastCDC 2020).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkerParams {
    /// Smallest chunk, bytes.
    pub min_size: u32,
    /// Average chunk, bytes.
    pub avg_size: u32,
    /// Largest chunk, bytes.
    pub max_size: u32,
    /// Secret seed mixed into the gear table, so chunk boundaries reveal nothing.
    pub seed: u64,
}

impl ChunkerParams {
    /// Checks the sizes against FastCDC's limits.
    pub fn validate(&self) -> Result<()> {
        use fastcdc::v2020 as f;
        let ok = (f::MINIMUM_MIN..=f::MINIMUM_MAX).contains(&self.min_size)
            && (f::AVERAGE_MIN..=f::AVERAGE_MAX).contains(&self.avg_size)
            && (f::MAXIMUM_MIN..=f::MAXIMUM_MAX).contains(&self.max_size)
            && self.min_size <= self.avg_size
            && self.avg_size <= self.max_size;
        if ok {
            Ok(())
        } else {
            Err(Error::Usage(format!(
                "invalid chunk sizes min {} avg {} max {}: need 64 B..1 MiB <= 256 B..4 MiB <= 1 KiB..16 MiB",
                self.min_size, self.avg_size, self.max_size
            )))
        }
    }
}

/// The decrypted content of the `config` file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    /// Repository format version.
    pub version: u32,
    /// Random repository ID, hex.
    pub id: String,
    /// Chunker parameters.
    pub chunker: ChunkerParams,
    /// Target pack size in bytes.
    pub pack_size: u32,
    /// Default compression, e.g. "zstd:3".
    pub compression: String,
    /// The chunk-ID key (hex of 32 bytes) of the repository this one copied its chunking from
    /// (`init --copy-chunker-params`), used instead of the one derived from the master secret.
    /// Only in configs of version 2 or later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_id_key: Option<String>,
}

/// What a repository made with `init --copy-chunker-params` takes from its source, so that the
/// same content gets the same blob IDs in both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunking {
    /// The source's chunker parameters, its seed included.
    pub chunker: ChunkerParams,
    /// The source's chunk-ID key.
    pub chunk_id_key: [u8; 32],
}

impl Config {
    /// A new config with a random ID and chunker seed.
    pub fn new(chunker_sizes: (u32, u32, u32), pack_size: u32, compression: Codec) -> Result<Self> {
        let mut seed = [0u8; 8];
        crate::crypto::random_bytes(&mut seed);
        let mut id = [0u8; 16];
        crate::crypto::random_bytes(&mut id);
        let chunker = ChunkerParams {
            min_size: chunker_sizes.0,
            avg_size: chunker_sizes.1,
            max_size: chunker_sizes.2,
            seed: u64::from_le_bytes(seed),
        };
        chunker.validate()?;
        if !(1 << 20..=1 << 30).contains(&pack_size) {
            return Err(Error::Usage("pack size must be between 1 MiB and 1 GiB".into()));
        }
        Ok(Config {
            version: BASE_VERSION,
            id: hex::encode(id),
            chunker,
            pack_size,
            compression: compression.to_string(),
            chunk_id_key: None,
        })
    }

    /// This config with another repository's chunking: its chunker parameters and chunk-ID key
    /// (which makes it a version 2 config).
    pub fn with_chunking(mut self, from: &Chunking) -> Self {
        self.chunker = from.chunker;
        self.chunk_id_key = Some(hex::encode(from.chunk_id_key));
        self.version = CHUNK_ID_KEY_VERSION;
        self
    }

    /// Checks what a reader relies on: a version this build reads, valid chunk sizes, and a
    /// chunk-ID key only where the version allows one, of 32 bytes. Returns that key.
    pub fn validate(&self) -> Result<Option<[u8; 32]>> {
        if self.version == 0 || self.version > FORMAT_VERSION {
            return Err(Error::UnsupportedVersion { found: self.version, supported: FORMAT_VERSION });
        }
        self.chunker.validate()?;
        let Some(key) = &self.chunk_id_key else { return Ok(None) };
        if self.version < CHUNK_ID_KEY_VERSION {
            return Err(Error::Usage(format!(
                "a version {} config cannot hold a chunk_id_key (version {CHUNK_ID_KEY_VERSION} or later)",
                self.version
            )));
        }
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(key, &mut bytes)
            .map_err(|e| Error::Usage(format!("chunk_id_key is not 32 bytes of hex: {e}")))?;
        Ok(Some(bytes))
    }

    /// The default codec for new blobs.
    pub fn codec(&self) -> Codec {
        self.compression.parse().unwrap_or(DEFAULT_CODEC)
    }
}

/// Default chunk sizes: 512 KiB / 1 MiB / 8 MiB.
pub const DEFAULT_CHUNK_SIZES: (u32, u32, u32) = (512 * 1024, 1024 * 1024, 8 * 1024 * 1024);
/// Default target pack size: 16 MiB.
pub const DEFAULT_PACK_SIZE: u32 = 16 * 1024 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::new(DEFAULT_CHUNK_SIZES, DEFAULT_PACK_SIZE, DEFAULT_CODEC).unwrap()
    }

    #[test]
    fn a_new_config_is_version_1_without_a_chunk_id_key() {
        let c = config();
        assert_eq!(c.version, 1);
        assert_eq!(c.validate().unwrap(), None);
        let json = serde_json::to_string(&c).unwrap();
        assert!(!json.contains("chunk_id_key"), "{json}");
    }

    #[test]
    fn copied_chunking_makes_a_version_2_config_with_the_key() {
        let source = config();
        let from = Chunking { chunker: source.chunker, chunk_id_key: [0x24; 32] };
        let c = config().with_chunking(&from);
        assert_eq!((c.version, c.chunker), (2, source.chunker));
        assert_eq!(c.validate().unwrap(), Some([0x24; 32]));
        let back: Config = serde_json::from_slice(&serde_json::to_vec(&c).unwrap()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn a_chunk_id_key_in_a_version_1_config_or_a_bad_one_is_refused() {
        let mut c = config();
        c.chunk_id_key = Some("24".repeat(32));
        assert!(c.validate().unwrap_err().to_string().contains("version 1 config cannot hold"));
        c.version = 2;
        c.chunk_id_key = Some("24".repeat(31));
        assert!(c.validate().unwrap_err().to_string().contains("not 32 bytes"));
        c.version = 3;
        assert!(matches!(c.validate(), Err(Error::UnsupportedVersion { found: 3, .. })));
    }
}
