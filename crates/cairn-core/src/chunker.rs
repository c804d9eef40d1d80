//! Cutting file content into chunks (FORMAT.md §6.1): FastCDC 2020 with the repository's
//! secret seed, or fixed-size chunks for disk images.

use std::io::Read;

use fastcdc::v2020::{Error as CdcError, FastCDC, Normalization, StreamCDC};

/// Inputs up to this size are chunked in memory.
const IN_MEMORY_LIMIT: u64 = 16 * 1024 * 1024;

use crate::config::ChunkerParams;

/// How to cut content into chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkerKind {
    /// Content-defined chunking with the repository's parameters.
    Cdc(ChunkerParams),
    /// Fixed-size chunks of this many bytes (the last one may be shorter).
    Fixed(u32),
}

impl ChunkerKind {
    /// Cuts everything `reader` yields (about `len` bytes) into chunks, calling `each` for
    /// every chunk in order.
    pub fn chunk<R: Read, E: From<std::io::Error>>(
        &self,
        mut reader: R,
        len: u64,
        mut each: impl FnMut(Vec<u8>) -> Result<(), E>,
    ) -> Result<(), E> {
        match *self {
            // Small inputs are read whole and cut in memory: the streaming chunker zeroes a
            // max-size buffer per input, which dominates for many small files.
            ChunkerKind::Cdc(p) if len <= IN_MEMORY_LIMIT => {
                let mut buf = Vec::with_capacity(len as usize);
                reader.read_to_end(&mut buf)?;
                if buf.len() <= p.min_size as usize {
                    return if buf.is_empty() { Ok(()) } else { each(buf) };
                }
                let cuts = FastCDC::with_level_and_seed(
                    &buf,
                    p.min_size,
                    p.avg_size,
                    p.max_size,
                    Normalization::Level1,
                    p.seed,
                );
                for c in cuts {
                    each(buf[c.offset..c.offset + c.length].to_vec())?;
                }
                Ok(())
            }
            ChunkerKind::Cdc(p) => {
                let cdc = StreamCDC::with_level_and_seed(
                    reader,
                    p.min_size,
                    p.avg_size,
                    p.max_size,
                    Normalization::Level1,
                    p.seed,
                );
                for chunk in cdc {
                    match chunk {
                        Ok(c) => each(c.data)?,
                        Err(CdcError::IoError(e)) => return Err(e.into()),
                        Err(CdcError::Empty) => break,
                        Err(CdcError::Other(msg)) => return Err(std::io::Error::other(msg).into()),
                    }
                }
                Ok(())
            }
            ChunkerKind::Fixed(size) => loop {
                let mut buf = Vec::with_capacity(size as usize);
                (&mut reader).take(u64::from(size)).read_to_end(&mut buf)?;
                if buf.is_empty() {
                    return Ok(());
                }
                let short = buf.len() < size as usize;
                each(buf)?;
                if short {
                    return Ok(());
                }
            },
        }
    }
}

/// Whether a chunk is all zeros (then it is stored as a reference with no data).
pub fn is_zero(data: &[u8]) -> bool {
    // OR-folding a block vectorizes well; stopping per block keeps the early exit.
    data.chunks(4096).all(|block| block.iter().fold(0u8, |acc, &b| acc | b) == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdc_is_deterministic_and_covers_input() {
        let p = ChunkerParams { min_size: 1024, avg_size: 4096, max_size: 16384, seed: 42 };
        let data: Vec<u8> = (0..200_000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        let mut a = Vec::new();
        ChunkerKind::Cdc(p)
            .chunk(&data[..], data.len() as u64, |c| -> std::io::Result<()> {
                a.push(c);
                Ok(())
            })
            .unwrap();
        let mut b = Vec::new();
        ChunkerKind::Cdc(p)
            .chunk(&data[..], data.len() as u64, |c| -> std::io::Result<()> {
                b.push(c);
                Ok(())
            })
            .unwrap();
        assert_eq!(a, b);
        assert_eq!(a.concat(), data);
        assert!(a.len() > 10);
        let mut c = Vec::new();
        ChunkerKind::Cdc(ChunkerParams { seed: 43, ..p })
            .chunk(&data[..], data.len() as u64, |x| -> std::io::Result<()> {
                c.push(x.len());
                Ok(())
            })
            .unwrap();
        assert_ne!(a.iter().map(Vec::len).collect::<Vec<_>>(), c, "seed must change boundaries");
    }

    #[test]
    fn in_memory_and_streaming_cut_alike() {
        let p = ChunkerParams { min_size: 1024, avg_size: 4096, max_size: 16384, seed: 7 };
        let data: Vec<u8> = (0..300_000u32).map(|i| (i.wrapping_mul(2246822519) >> 11) as u8).collect();
        let mut small = Vec::new();
        ChunkerKind::Cdc(p)
            .chunk(&data[..], data.len() as u64, |c| -> std::io::Result<()> {
                small.push(c);
                Ok(())
            })
            .unwrap();
        let mut streamed = Vec::new();
        ChunkerKind::Cdc(p)
            .chunk(&data[..], u64::MAX, |c| -> std::io::Result<()> {
                streamed.push(c);
                Ok(())
            })
            .unwrap();
        assert_eq!(small, streamed);
    }

    #[test]
    fn fixed_and_zero() {
        let data = vec![0u8; 10_000];
        let mut sizes = Vec::new();
        ChunkerKind::Fixed(4096)
            .chunk(&data[..], data.len() as u64, |c| -> std::io::Result<()> {
                sizes.push(c.len());
                Ok(())
            })
            .unwrap();
        assert_eq!(sizes, [4096, 4096, 1808]);
        assert!(is_zero(&data));
        let mut d = data;
        d[9_999] = 1;
        assert!(!is_zero(&d));
        d[9_999] = 0;
        d[3] = 1;
        assert!(!is_zero(&d));
    }
}
