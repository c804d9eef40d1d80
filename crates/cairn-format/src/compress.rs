//! Per-blob compression codecs (FORMAT.md §5). The codec of every blob is recorded next to it,
//! so one repository can mix codecs and every codec ever written stays readable.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How a blob's plaintext is compressed before encryption.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Codec {
    /// Stored as is.
    None,
    /// LZ4 block format (lz4_flex), no size prefix.
    Lz4,
    /// A Zstandard frame, compressed at the given level.
    Zstd(i8),
}

/// The default codec (`auto`): zstd level 1. Measured in docs/DESIGN.md ("Choosing the default
/// codec"): on this project's 2-core machine it compresses 1.5x faster than level 3 for 4-9%
/// less reduction, and decompresses just as fast, so restores lose nothing.
pub const DEFAULT_CODEC: Codec = Codec::Zstd(1);

thread_local! {
    // Contexts are reused per thread: making one per blob costs more than small blobs take.
    static ZSTD_DCTX: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { std::cell::RefCell::new(None) };
    static ZSTD_CCTX: std::cell::RefCell<Option<(i8, zstd::bulk::Compressor<'static>)>> = const { std::cell::RefCell::new(None) };
}

impl Codec {
    /// The codec byte and level byte stored in pack headers and index files.
    pub fn to_bytes(self) -> (u8, i8) {
        match self {
            Codec::None => (0, 0),
            Codec::Lz4 => (1, 0),
            Codec::Zstd(level) => (2, level),
        }
    }

    /// Parses the codec byte and level byte; `None` for an unknown codec byte.
    pub fn from_bytes(codec: u8, level: i8) -> Option<Self> {
        match codec {
            0 => Some(Codec::None),
            1 => Some(Codec::Lz4),
            2 => Some(Codec::Zstd(level)),
            _ => None,
        }
    }

    /// Compresses `data`. Returns `None` when the result would not be smaller, in which case
    /// the caller stores the blob with [`Codec::None`].
    pub fn compress(self, data: &[u8]) -> Option<Vec<u8>> {
        let out = match self {
            Codec::None => return None,
            Codec::Lz4 => lz4_flex::block::compress(data),
            Codec::Zstd(level) => ZSTD_CCTX.with(|c| {
                let mut c = c.borrow_mut();
                if c.as_ref().is_none_or(|(l, _)| *l != level) {
                    *c = Some((level, zstd::bulk::Compressor::new(i32::from(level)).ok()?));
                }
                c.as_mut()?.1.compress(data).ok()
            })?,
        };
        (out.len() < data.len()).then_some(out)
    }

    /// The form a blob of plaintext `data` is stored in: compressed by this codec, or as it is
    /// (with [`Codec::None`]) when compressing does not make it smaller.
    pub fn stored_form(self, data: Vec<u8>) -> (Codec, Vec<u8>) {
        match self.compress(&data) {
            Some(c) => (self, c),
            None => (Codec::None, data),
        }
    }

    /// The most plaintext that `stored_len` bytes of this codec can decompress to: the bound a
    /// declared length must keep before it is allocated. None stores bytes as they are; an LZ4
    /// sequence produces at most 255 bytes per input byte (each 255 of a length extension);
    /// the densest zstd block is an RLE block, 4 bytes for at most 128 KiB.
    pub fn max_raw_len(self, stored_len: usize) -> u64 {
        let n = stored_len as u64;
        match self {
            Codec::None => n,
            Codec::Lz4 => n.saturating_mul(255).saturating_add(64),
            Codec::Zstd(_) => n.saturating_mul(32 * 1024).saturating_add(128 * 1024),
        }
    }

    /// Decompresses `data` whose plaintext is exactly `raw_len` bytes.
    pub fn decompress(self, data: &[u8], raw_len: usize) -> std::result::Result<Vec<u8>, String> {
        let mut out = Vec::new();
        self.decompress_into(data, raw_len, &mut out)?;
        Ok(out)
    }

    /// [`Codec::decompress`] into `out` (replacing its content), reusing its memory.
    pub fn decompress_into(self, data: &[u8], raw_len: usize, out: &mut Vec<u8>) -> std::result::Result<(), String> {
        out.clear();
        if raw_len as u64 > self.max_raw_len(data.len()) {
            return Err(format!("{} stored bytes cannot decompress to the {raw_len} bytes declared", data.len()));
        }
        out.reserve_exact(raw_len);
        match self {
            Codec::None => out.extend_from_slice(data),
            Codec::Lz4 => {
                out.resize(raw_len, 0);
                let n = lz4_flex::block::decompress_into(data, out).map_err(|e| e.to_string())?;
                out.truncate(n);
            }
            Codec::Zstd(_) => ZSTD_DCTX.with(|d| {
                let mut d = d.borrow_mut();
                let dctx = match d.as_mut() {
                    Some(x) => x,
                    None => d.insert(zstd::bulk::Decompressor::new().map_err(|e| e.to_string())?),
                };
                // Writes into `out` from its start, at most its capacity (`raw_len`): a larger
                // frame is an error.
                dctx.decompress_to_buffer(data, out).map(drop).map_err(|e| e.to_string())
            })?,
        }
        if out.len() != raw_len {
            return Err(format!("decompressed to {} bytes, expected {raw_len}", out.len()));
        }
        Ok(())
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Codec::None => f.write_str("none"),
            Codec::Lz4 => f.write_str("lz4"),
            Codec::Zstd(level) => write!(f, "zstd:{level}"),
        }
    }
}

impl FromStr for Codec {
    type Err = Error;

    /// Parses `none`, `lz4`, `zstd` or `zstd:LEVEL` (LEVEL from -7 to 22); `auto` is the default.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::Usage(format!("unknown compression {s:?}: use auto, none, lz4, zstd or zstd:LEVEL (1-22)"));
        match s {
            "auto" => Ok(DEFAULT_CODEC),
            "none" => Ok(Codec::None),
            "lz4" => Ok(Codec::Lz4),
            "zstd" => Ok(Codec::Zstd(3)),
            _ => {
                let level = s.strip_prefix("zstd:").ok_or_else(bad)?;
                let level: i8 = level.parse().map_err(|_| bad())?;
                if !(-7..=22).contains(&level) || level == 0 {
                    return Err(bad());
                }
                Ok(Codec::Zstd(level))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_codec_round_trips() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        for codec in [Codec::Lz4, Codec::Zstd(1), Codec::Zstd(3), Codec::Zstd(19)] {
            let c = codec.compress(&data).expect("compressible");
            assert_eq!(codec.decompress(&c, data.len()).unwrap(), data);
            assert!(codec.decompress(&c, data.len() + 1).is_err());
        }
        assert!(Codec::Zstd(3).compress(&[1, 2, 3]).is_none());
    }

    #[test]
    fn parse_and_bytes() {
        assert_eq!("zstd:7".parse::<Codec>().unwrap(), Codec::Zstd(7));
        assert!("zstd:99".parse::<Codec>().is_err());
        assert!("gzip".parse::<Codec>().is_err());
        for c in [Codec::None, Codec::Lz4, Codec::Zstd(-3)] {
            let (a, b) = c.to_bytes();
            assert_eq!(Codec::from_bytes(a, b), Some(c));
        }
        assert_eq!(Codec::from_bytes(9, 0), None);
    }

    mod proptests {
        use super::super::*;
        use proptest::prelude::*;

        fn codec() -> impl Strategy<Value = Codec> {
            prop_oneof![
                Just(Codec::None),
                Just(Codec::Lz4),
                (-7i8..=22).prop_filter("0 is not a level", |l| *l != 0).prop_map(Codec::Zstd)
            ]
        }

        fn data() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..5000),
                (proptest::collection::vec(any::<u8>(), 1..30), 1usize..500).prop_map(|(v, n)| v.repeat(n)),
            ]
        }

        proptest! {
            #[test]
            fn every_codec_round_trips(codec in codec(), data in data(), off in 1usize..1000) {
                match codec.compress(&data) {
                    Some(c) => {
                        prop_assert!(c.len() < data.len());
                        prop_assert_eq!(codec.decompress(&c, data.len()).unwrap(), data.clone());
                        // Reusing a buffer gives the same, and a wrong length is an error.
                        let mut out = vec![1u8; off];
                        codec.decompress_into(&c, data.len(), &mut out).unwrap();
                        prop_assert_eq!(&out, &data);
                        prop_assert!(codec.decompress(&c, data.len() + off).is_err());
                        prop_assert!(codec.decompress(&c, data.len().saturating_sub(off)).is_err());
                    }
                    None => prop_assert!(codec == Codec::None || data.len() < 200 || codec.compress(&data).is_none()),
                }
                prop_assert_eq!(Codec::None.decompress(&data, data.len()).unwrap(), data.clone());
            }

            /// Any bytes under any declared length: an error or exactly that many bytes.
            #[test]
            fn any_bytes_decompress_or_fail(codec in codec(), data in proptest::collection::vec(any::<u8>(), 0..300), raw_len in 0usize..100_000) {
                if let Ok(out) = codec.decompress(&data, raw_len) {
                    prop_assert_eq!(out.len(), raw_len);
                }
            }

            #[test]
            fn codec_bytes_and_names_round_trip(codec in codec()) {
                let (c, l) = codec.to_bytes();
                prop_assert_eq!(Codec::from_bytes(c, l), Some(codec));
                prop_assert_eq!(codec.to_string().parse::<Codec>().unwrap(), codec);
            }
        }
    }
}
