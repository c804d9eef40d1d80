//! Every codec's decompression with a declared plaintext length.
//!
//! Input: `codec | level | raw length u32 LE | data`. Codec byte bit 7 set: round trip instead
//! (compress `data` with the codec, then decompress it).
#![no_main]

use cairn_format::compress::Codec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    if input.len() < 6 {
        return;
    }
    let level = (input[1] as i8).clamp(-7, 22);
    let codec = match input[0] & 3 {
        0 => Codec::None,
        1 => Codec::Lz4,
        _ => Codec::Zstd(if level == 0 { 1 } else { level }),
    };
    let raw_len = u32::from_le_bytes(input[2..6].try_into().unwrap()) as usize;
    let data = &input[6..];
    if input[0] & 0x80 != 0 {
        if let Some(c) = codec.compress(data) {
            assert!(c.len() < data.len());
            assert_eq!(codec.decompress(&c, data.len()).expect("compressed data decompresses"), data);
        }
        return;
    }
    let one = codec.decompress(data, raw_len);
    let mut reused = vec![0xAA; 100];
    let two = codec.decompress_into(data, raw_len, &mut reused);
    match (&one, &two) {
        (Ok(a), Ok(())) => {
            assert_eq!(a.len(), raw_len);
            assert_eq!(a, &reused);
        }
        (Err(_), Err(_)) => {}
        _ => panic!("decompress and decompress_into disagree: {one:?} / {two:?}"),
    }
});
