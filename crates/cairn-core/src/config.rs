//! The repository config (FORMAT.md §6): format version and the choices a repository makes
//! once — chunker parameters, pack size, default compression.

use serde::{Deserialize, Serialize};

use crate::compress::{Codec, DEFAULT_CODEC};
use crate::error::{Error, Result};

/// The repository format version this build writes.
pub const FORMAT_VERSION: u32 = 1;

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
            version: FORMAT_VERSION,
            id: hex::encode(id),
            chunker,
            pack_size,
            compression: compression.to_string(),
        })
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
