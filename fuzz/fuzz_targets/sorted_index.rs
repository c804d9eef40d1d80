//! The sorted index file (sorted::parse_trailer, parse_tables, and lookups through
//! DiskSlots), the index a command keeps on this machine's disk.
//!
//! Input: `mode | rest`.
//! * mode 0: `rest` is a whole file, taken as it is.
//! * mode 1: `rest` is `flip u16 LE | records(52) …`: the records that decode are written into a
//!   file by `sorted::Writer` (three packs), the byte at `flip` changed if it is inside, then
//!   read back: every record must be found unless a byte was changed, and nothing panics.
#![no_main]

use cairn_format::id::PackId;
use cairn_format::index::Index;
use cairn_format::sorted::{self, DiskSlots, PackInfo, Slot, RECORD_LEN, TRAILER_LEN};
use libfuzzer_sys::fuzz_target;

const KEY: [u8; 32] = [7; 32];

fn open(file: Vec<u8>) -> Option<Index> {
    let len = file.len() as u64;
    if file.len() < TRAILER_LEN {
        return None;
    }
    let trailer = sorted::parse_trailer(&file[file.len() - TRAILER_LEN..], len).ok()?;
    let at = trailer.tables_at() as usize;
    let mut tables = sorted::parse_tables(&trailer, &file[at..at + trailer.tables_len() as usize]).ok()?;
    let packs = std::mem::take(&mut tables.packs);
    Some(Index::on_disk(packs, DiskSlots::new(Box::new(file), &trailer, tables)))
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    if mode % 2 == 0 {
        if let Some(index) = open(rest.to_vec()) {
            for pos in 0..index.len().min(64) {
                if let Some(l) = index.at(pos) {
                    let _ = index.get(&l.entry.id);
                }
            }
            let _ = (index.pack_ends(), index.tree_packs(), index.largest_tree());
        }
        return;
    }
    if rest.len() < 2 {
        return;
    }
    let flip = u16::from_le_bytes([rest[0], rest[1]]) as usize;
    let mut slots: Vec<Slot> = rest[2..]
        .chunks_exact(RECORD_LEN)
        .filter_map(|c| Slot::decode(c).ok())
        .map(|s| Slot { pack: s.pack % 3, ..s })
        .collect();
    let packs: Vec<PackInfo> = (0..3u8).map(|n| PackInfo::new(PackId([n; 32]), [n; 32], n == 1)).collect();
    sorted::sort_slots(&mut slots, |p| packs[p as usize].doomed);
    let mut writer = sorted::Writer::new(sorted::bits_for(slots.len() as u64));
    let mut file = Vec::new();
    writer.records(&slots, &mut file).expect("sorted records are taken");
    file.extend_from_slice(&writer.finish(&packs, &KEY));
    let changed = flip < file.len();
    if changed {
        file[flip] ^= 0x5a;
    }
    match open(file) {
        Some(index) => {
            for (pos, s) in slots.iter().enumerate() {
                let found = index.get(&s.entry.id);
                if !changed {
                    let found = found.expect("every record is found");
                    assert_eq!((found.entry, found.pack_no), (s.entry, s.pack));
                    assert_eq!(index.position(&s.entry.id), Some(pos));
                } else if let Some(found) = found {
                    // A changed byte is caught by a sum, or it was in a part no lookup reads.
                    assert_eq!(found.entry.id, s.entry.id);
                }
            }
        }
        None => assert!(changed, "a file just written opens"),
    }
});
