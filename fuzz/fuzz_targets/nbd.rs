//! The NBD server (`cairn nbd`) fed any bytes as a client's: the handshake's options, then
//! transmission requests (reads, writes, block status, flushes, unknown commands) against a
//! small writable in-memory export. It must answer or end the connection, never panic, and
//! never read or write outside the export. Requests are answered inline (one worker): the pool's
//! threads answer them with the same function, and LeakSanitizer counts each thread's exit as a
//! leak. A live restore's state file (`cairn_nbd::live::parse`) is parsed from the same bytes.
#![no_main]

use std::io;
use std::sync::Mutex;

use cairn_nbd::proto::{self, Extent};
use cairn_nbd::{Config, Export};
use libfuzzer_sys::fuzz_target;

/// 64 KiB of memory; its second half reads as a hole until written.
struct Memory(Mutex<Vec<u8>>);

impl Export for Memory {
    fn size(&self) -> u64 {
        65_536
    }

    fn writable(&self) -> bool {
        true
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let m = self.0.lock().unwrap();
        buf.copy_from_slice(&m[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8], _fua: bool) -> io::Result<()> {
        let mut m = self.0.lock().unwrap();
        m[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn extents(&self, offset: u64, length: u64) -> io::Result<Vec<Extent>> {
        let half = 32_768;
        Ok(if offset < half {
            vec![Extent { length: half - offset, state: 0 }, Extent { length, state: proto::STATE_HOLE }]
        } else {
            vec![Extent { length, state: proto::STATE_HOLE | proto::STATE_ZERO }]
        })
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, input)) = data.split_first() else { return };
    // Options parsed alone too (each code with the rest as its data).
    let _ = proto::parse_option(u32::from(first % 12), input);
    // A live restore's state file (`restore --live`, FORMAT.md §16.3): the bytes as a whole file,
    // and with a valid header of the size the bitmap that follows implies.
    if let Ok((header, map)) = cairn_nbd::live::parse(input) {
        assert_eq!(map.len() as u64, cairn_nbd::live::map_len(header.size));
    }
    let size = ((input.len() as u64) * 8 * cairn_nbd::live::BLOCK).saturating_sub(u64::from(first));
    let mut file = cairn_nbd::live::header_bytes(&cairn_nbd::live::Header { size, identity: [first; 32] });
    file.extend_from_slice(input);
    let _ = cairn_nbd::live::parse(&file);
    let export = Memory(Mutex::new(vec![7u8; 65_536]));
    let config = Config { name: "disk".into(), workers: 1 };
    let mut out = Vec::new();
    let _ = cairn_nbd::server::serve_connection(input, &mut out, &export, &config);
});
