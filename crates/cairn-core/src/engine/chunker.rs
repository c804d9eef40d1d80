//! Cutting file content into chunks (FORMAT.md §6.1): FastCDC 2020 with the repository's
//! secret seed, or fixed-size chunks for disk images.

use std::io::Read;

use fastcdc::v2020::{FastCDC, Normalization};

/// Content-defined chunking reads windows of at least this size (and twice the largest
/// chunk); a smaller input is read whole into a buffer of its own size.
const WINDOW_MIN: u64 = 16 * 1024 * 1024;

use cairn_format::config::ChunkerParams;

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
            ChunkerKind::Cdc(p) => {
                // The input is cut window by window in memory. A cut before the window's end is
                // the cut the whole input would have (FastCDC looks only at the bytes since the
                // previous cut); the bytes after the window's last real cut are carried into the
                // next window, so each byte moves at most once. (fastcdc's StreamCDC shifts its
                // whole buffer after every chunk: 13% of a disk image backup's CPU.)
                let window = (2 * p.max_size as u64).max(WINDOW_MIN);
                let mut buf = Vec::with_capacity(len.saturating_add(1).min(window) as usize);
                loop {
                    let want = window - buf.len() as u64;
                    let eof = (&mut reader).take(want).read_to_end(&mut buf)? < want as usize;
                    if buf.len() <= p.min_size as usize {
                        // Too short to cut (only at the end of the input).
                        return if buf.is_empty() { Ok(()) } else { each(buf) };
                    }
                    let mut done = 0;
                    let cuts = FastCDC::with_level_and_seed(
                        &buf,
                        p.min_size,
                        p.avg_size,
                        p.max_size,
                        Normalization::Level1,
                        p.seed,
                    );
                    for c in cuts {
                        let end = c.offset + c.length;
                        if end == buf.len() && !eof && c.length < p.max_size as usize {
                            break; // the window ended, not the chunk
                        }
                        each(buf[c.offset..end].to_vec())?;
                        done = end;
                    }
                    if eof {
                        return Ok(());
                    }
                    buf.drain(..done);
                }
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

    /// A reader that hands out at most 7,777 bytes per call, like a pipe.
    struct Trickle<'a>(&'a [u8]);

    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            let n = out.len().min(self.0.len()).min(7_777);
            out[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn windows_cut_like_the_whole_input_and_like_fastcdc_streaming() {
        // Larger than two windows, so cuts carried across window ends are exercised, with
        // chunk sizes small enough for thousands of cuts; each repository made before the
        // windowed chunker cut large files with fastcdc's StreamCDC, and dedup needs the same cuts.
        let p = ChunkerParams { min_size: 2048, avg_size: 8192, max_size: 65536, seed: 11 };
        let mut data: Vec<u8> = (0..40_000_000u32).map(|i| (i.wrapping_mul(2654435761) >> 7) as u8).collect();
        data[20_000_000..20_300_000].fill(0); // a run that forces max-size cuts near a window end
        let mut windowed = Vec::new();
        ChunkerKind::Cdc(p)
            .chunk(Trickle(&data), u64::MAX, |c| -> std::io::Result<()> {
                windowed.push(c.len());
                Ok(())
            })
            .unwrap();
        let whole: Vec<usize> =
            FastCDC::with_level_and_seed(&data, p.min_size, p.avg_size, p.max_size, Normalization::Level1, p.seed)
                .map(|c| c.length)
                .collect();
        let streamed: Vec<usize> = fastcdc::v2020::StreamCDC::with_level_and_seed(
            &data[..],
            p.min_size,
            p.avg_size,
            p.max_size,
            Normalization::Level1,
            p.seed,
        )
        .map(|c| c.unwrap().length)
        .collect();
        assert_eq!(windowed.iter().sum::<usize>(), data.len());
        assert!(windowed.len() > 1000);
        assert_eq!(windowed, whole);
        assert_eq!(windowed, streamed);
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

    mod proptests {
        use super::super::*;
        use super::Trickle;
        use proptest::prelude::*;

        fn params() -> impl Strategy<Value = ChunkerParams> {
            (64u32..2048, 0u32..3, 0u32..3, any::<u64>()).prop_map(|(min, a, m, seed)| {
                let avg = (min.max(256) << a).min(fastcdc::v2020::AVERAGE_MAX);
                let max = (avg.max(1024) << m).min(fastcdc::v2020::MAXIMUM_MAX);
                ChunkerParams { min_size: min, avg_size: avg, max_size: max, seed }
            })
        }

        /// Random bytes with runs of one byte value (which force cuts at the largest size).
        fn data() -> impl Strategy<Value = Vec<u8>> {
            proptest::collection::vec(
                prop_oneof![
                    3 => proptest::collection::vec(any::<u8>(), 0..20_000),
                    1 => (any::<u8>(), 0usize..20_000).prop_map(|(b, n)| vec![b; n]),
                ],
                0..6,
            )
            .prop_map(|parts| parts.concat())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]

            /// The Cairn chunker cuts where the reference implementation (fastcdc's FastCDC
            /// 2020 over the whole input) cuts, whatever the reader hands out per call.
            #[test]
            fn cuts_equal_the_reference(p in params(), data in data(), trickle in any::<bool>()) {
                prop_assert!(p.validate().is_ok());
                let mut ours = Vec::new();
                let each = |c: Vec<u8>| -> std::io::Result<()> {
                    ours.push(c);
                    Ok(())
                };
                if trickle {
                    ChunkerKind::Cdc(p).chunk(Trickle(&data), u64::MAX, each).unwrap();
                } else {
                    ChunkerKind::Cdc(p).chunk(&data[..], data.len() as u64, each).unwrap();
                }
                let reference: Vec<Vec<u8>> = FastCDC::with_level_and_seed(&data, p.min_size, p.avg_size, p.max_size, Normalization::Level1, p.seed)
                    .map(|c| data[c.offset..c.offset + c.length].to_vec())
                    .collect();
                // fastcdc yields nothing for empty input; a lone short tail is one chunk in both.
                prop_assert_eq!(ours.concat(), data.clone());
                prop_assert_eq!(ours, reference);
            }

            #[test]
            fn fixed_chunks_cover_the_input(size in 1u32..5000, data in data()) {
                let mut sizes = Vec::new();
                ChunkerKind::Fixed(size).chunk(&data[..], data.len() as u64, |c| -> std::io::Result<()> {
                    sizes.push(c.len());
                    Ok(())
                }).unwrap();
                prop_assert_eq!(sizes.iter().sum::<usize>(), data.len());
                prop_assert!(sizes.iter().rev().skip(1).all(|&s| s == size as usize));
            }
        }
    }
}
