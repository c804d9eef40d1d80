//! A live restore's export (`cairn restore --live`): the target file served while a restore
//! fills it, with the blocks present in it (restored, or written by the client) tracked in a
//! sidecar file next to it (docs/FORMAT.md §"Live restore state file").
//!
//! A block (4 KiB) is present once the file holds its final bytes: the snapshot's (restored by
//! the background restore or fetched for a read) or the client's (a write). Reads of present
//! blocks come from the file; a read touching a block not present reads the block from the base
//! export (the snapshot) at once, writes it to the file and marks it. A client's write first
//! fills the partial blocks at its edges the same way, then writes and marks. The background
//! restore writes only into blocks not present ([`Live::restore_write`]), under the same lock as
//! the client's writes, so it never overwrites them.
//!
//! Bits only ever go from 0 to 1. The sidecar is updated in place: dirty pages of the bitmap are
//! written after the target's data is synced, then synced themselves ([`Live::checkpoint`]: on
//! every flush and FUA write, and now and then by the caller), so a bit on disk never names a
//! block whose data could be lost, and a torn write of the sidecar leaves older bits.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::proto::Extent;
use crate::server::Export;

/// The state file's first eight bytes.
pub const MAGIC: &[u8; 8] = b"CAIRNLR1";
/// Bytes of one block: the unit the bitmap tracks.
pub const BLOCK: u64 = 4096;
/// Bytes of the header; the bitmap follows.
pub const HEADER: u64 = 4096;
/// Bytes of the bitmap written back at a time.
const PAGE: usize = 4096;

/// What a state file's header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The target's size in bytes.
    pub size: u64,
    /// What names the restored file (its snapshot and path).
    pub identity: [u8; 32],
}

/// Bytes of the bitmap of a target of `size` bytes.
pub fn map_len(size: u64) -> u64 {
    size.div_ceil(BLOCK).div_ceil(8)
}

/// The header's bytes.
pub fn header_bytes(h: &Header) -> Vec<u8> {
    let mut b = vec![0u8; HEADER as usize];
    b[0..8].copy_from_slice(MAGIC);
    b[8..16].copy_from_slice(&h.size.to_le_bytes());
    b[16..20].copy_from_slice(&(BLOCK as u32).to_le_bytes());
    b[24..56].copy_from_slice(&h.identity);
    b
}

/// Parses a whole state file: its header and bitmap, or what is wrong with it. Bits past the
/// last block must be clear.
pub fn parse(bytes: &[u8]) -> Result<(Header, &[u8]), &'static str> {
    if bytes.len() < HEADER as usize || &bytes[0..8] != MAGIC {
        return Err("not a Cairn live restore state file");
    }
    let size = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    if u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes")) != BLOCK as u32 {
        return Err("a block size other than 4096");
    }
    if bytes[20..24] != [0; 4] || bytes[56..HEADER as usize].iter().any(|&b| b != 0) {
        return Err("reserved header bytes are not zero");
    }
    let identity: [u8; 32] = bytes[24..56].try_into().expect("32 bytes");
    let map = &bytes[HEADER as usize..];
    if map.len() as u64 != map_len(size) {
        return Err("the bitmap's length does not match the size");
    }
    let blocks = size.div_ceil(BLOCK);
    if blocks % 8 != 0 {
        if let Some(last) = map.last() {
            if last >> (blocks % 8) != 0 {
                return Err("bits set past the last block");
            }
        }
    }
    Ok((Header { size, identity }, map))
}

struct State {
    /// One bit per block: present in the target.
    map: Vec<u8>,
    /// Pages of the bitmap changed since the last checkpoint.
    dirty: BTreeSet<usize>,
    /// The restore is complete: the state file is gone, every block is present.
    complete: bool,
}

impl State {
    fn has(&self, b: u64) -> bool {
        self.map[(b / 8) as usize] & (1 << (b % 8)) != 0
    }

    fn set(&mut self, first: u64, last: u64) {
        for b in first..last {
            let i = (b / 8) as usize;
            if self.map[i] & (1 << (b % 8)) == 0 {
                self.map[i] |= 1 << (b % 8);
                self.dirty.insert(i / PAGE);
            }
        }
    }

    /// Runs `[a, b)` of blocks not present within `first..last`.
    fn absent(&self, first: u64, last: u64) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for b in first..last {
            if self.has(b) {
                continue;
            }
            match out.last_mut() {
                Some(r) if r.1 == b => r.1 = b + 1,
                _ => out.push((b, b + 1)),
            }
        }
        out
    }
}

/// The target of a live restore over `base` (the snapshot's file), served as a writable export.
pub struct Live<B> {
    base: B,
    target: File,
    state_file: File,
    state_path: PathBuf,
    size: u64,
    state: Mutex<State>,
    /// One checkpoint at a time.
    syncing: Mutex<()>,
}

fn bad(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "{}: {what}; it belongs to another restore: restore to another target, or remove it (what a guest wrote to the target is then overwritten)",
            path.display()
        ),
    )
}

/// The state file of a live restore into `target`: `target.cairn-live` beside it.
pub fn state_path(target: &Path) -> PathBuf {
    let mut name = target.file_name().unwrap_or_default().to_os_string();
    name.push(".cairn-live");
    target.with_file_name(name)
}

fn sync_dir_of(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

impl<B: Export> Live<B> {
    /// Opens the live restore of `base` into `target`: resumes the one its state file
    /// (`target.cairn-live`) records, made for the same `identity` (snapshot and path), or starts
    /// one (the state file first, then the target, created or resized to the export's size).
    pub fn open(base: B, target: &Path, identity: &[u8; 32]) -> io::Result<Self> {
        let size = base.size();
        let state_path = state_path(target);
        let header = Header { size, identity: *identity };
        let target_exists = target.exists();
        let mut map = vec![0u8; map_len(size) as usize];
        let state_file = match std::fs::read(&state_path) {
            Ok(bytes) => {
                let (h, m) = parse(&bytes).map_err(|e| bad(&state_path, e))?;
                if h.size != size {
                    return Err(bad(&state_path, "made for a file of another size"));
                }
                if h.identity != *identity {
                    return Err(bad(&state_path, "made for another snapshot or file"));
                }
                let f = OpenOptions::new().read(true).write(true).open(&state_path)?;
                if target_exists {
                    map.copy_from_slice(m);
                } else {
                    // The target is gone: nothing in it is present any more.
                    f.write_all_at(&map, HEADER)?;
                    f.sync_data()?;
                }
                f
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let f = OpenOptions::new().read(true).write(true).create_new(true).open(&state_path)?;
                f.write_all_at(&header_bytes(&header), 0)?;
                f.write_all_at(&map, HEADER)?;
                f.sync_all()?;
                sync_dir_of(&state_path)?;
                f
            }
            Err(e) => return Err(e),
        };
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(target)?;
        if file.metadata()?.len() != size {
            file.set_len(size)?;
        }
        Ok(Live {
            base,
            target: file,
            state_file,
            state_path,
            size,
            state: Mutex::new(State { map, dirty: BTreeSet::new(), complete: false }),
            syncing: Mutex::new(()),
        })
    }

    /// Blocks present in the target.
    pub fn present_blocks(&self) -> u64 {
        self.state.lock().expect("state lock").map.iter().map(|b| u64::from(b.count_ones())).sum()
    }

    /// Bytes present in the target.
    pub fn present_bytes(&self) -> u64 {
        (self.present_blocks() * BLOCK).min(self.size)
    }

    /// Whether every block of `[offset, offset + len)` is present (final in the target).
    pub fn is_present(&self, offset: u64, len: u64) -> bool {
        let (first, last) = self.blocks_of(offset, len);
        let st = self.state.lock().expect("state lock");
        st.complete || (first..last).all(|b| st.has(b))
    }

    /// Whether the restore is complete.
    pub fn is_complete(&self) -> bool {
        self.state.lock().expect("state lock").complete
    }

    fn blocks_of(&self, offset: u64, len: u64) -> (u64, u64) {
        (offset / BLOCK, (offset + len).min(self.size).div_ceil(BLOCK))
    }

    /// `[from, to)` widened to the whole blocks of the base's read units (chunks) at its ends: a
    /// client's read of 4 KiB of a 1 MiB chunk decodes the chunk anyway, and keeping all of it
    /// makes the next reads of that chunk local (random readers touch each chunk many times).
    /// Blocks a unit covers only in part are left out: they would need the next unit decoded.
    fn widened(&self, from: u64, to: u64) -> (u64, u64) {
        let (first, last) = (self.base.read_unit(from), self.base.read_unit(to - 1));
        let start = if first.start < from { first.start.div_ceil(BLOCK) * BLOCK } else { from };
        let end = match last.end.min(self.size) {
            e if e == self.size && e > to => e,
            e if e > to => (e / BLOCK * BLOCK).max(to),
            _ => to,
        };
        (start.min(from), end)
    }

    /// Makes every block of `[offset, offset + len)` present: those that are not are read from
    /// the base (a run at a time) and written to the target.
    fn ensure(&self, offset: u64, len: u64) -> io::Result<()> {
        let (first, last) = self.blocks_of(offset, len);
        let runs = self.state.lock().expect("state lock").absent(first, last);
        for (a, b) in runs {
            let start = a * BLOCK;
            let end = (b * BLOCK).min(self.size);
            let mut buf = vec![0u8; (end - start) as usize];
            self.base.read_at(start, &mut buf)?;
            let mut st = self.state.lock().expect("state lock");
            // Written meanwhile (by the client or the restore): those blocks are left alone.
            for (x, y) in st.absent(a, b) {
                let from = ((x - a) * BLOCK) as usize;
                let to = (((y - a) * BLOCK) as usize).min(buf.len());
                self.target.write_all_at(&buf[from..to], x * BLOCK)?;
                st.set(x, y);
            }
        }
        Ok(())
    }

    /// The background restore's write of the snapshot's `data` at `offset`: written only into
    /// the blocks not present; the blocks it covers whole become present.
    pub fn restore_write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let end = offset + data.len() as u64;
        let (first, last) = self.blocks_of(offset, data.len() as u64);
        let mut st = self.state.lock().expect("state lock");
        if st.complete {
            return Ok(());
        }
        for (x, y) in st.absent(first, last) {
            let from = (x * BLOCK).max(offset);
            let to = (y * BLOCK).min(end);
            self.target.write_all_at(&data[(from - offset) as usize..(to - offset) as usize], from)?;
            // Whole blocks only: a block shared with the next chunk is present once both are in.
            let whole_from = from.div_ceil(BLOCK);
            let whole_to = if to == self.size { y } else { to / BLOCK };
            if whole_from < whole_to {
                st.set(whole_from, whole_to);
            }
        }
        Ok(())
    }

    /// The background restore's zeroing of `[offset, offset + len)` (a range the snapshot has as
    /// zeros but the target holds data in): only where blocks are not present.
    pub fn restore_zero(&self, offset: u64, len: u64) -> io::Result<()> {
        let end = (offset + len).min(self.size);
        let (first, last) = self.blocks_of(offset, len);
        let st = self.state.lock().expect("state lock");
        if st.complete {
            return Ok(());
        }
        let zeros = vec![0u8; (1 << 20).min(len) as usize];
        for (x, y) in st.absent(first, last) {
            let (mut at, to) = ((x * BLOCK).max(offset), (y * BLOCK).min(end));
            while at < to {
                let n = (to - at).min(zeros.len() as u64) as usize;
                self.target.write_all_at(&zeros[..n], at)?;
                at += n as u64;
            }
        }
        Ok(())
    }

    /// Writes the bitmap's changes durably: the target's data first, then the pages of the
    /// bitmap that changed.
    pub fn checkpoint(&self) -> io::Result<()> {
        let _one = self.syncing.lock().expect("sync lock");
        let pages: Vec<(usize, Vec<u8>)> = {
            let mut st = self.state.lock().expect("state lock");
            if st.complete {
                drop(st);
                return self.target.sync_data();
            }
            let dirty = std::mem::take(&mut st.dirty);
            dirty.into_iter().map(|p| (p, st.map[p * PAGE..((p + 1) * PAGE).min(st.map.len())].to_vec())).collect()
        };
        self.target.sync_data()?;
        if pages.is_empty() {
            return Ok(());
        }
        for (p, bytes) in &pages {
            self.state_file.write_all_at(bytes, HEADER + (p * PAGE) as u64)?;
        }
        self.state_file.sync_data()
    }

    /// The background restore finished: the target holds the snapshot where the client did not
    /// write. Every block is present; the target is synced and the state file removed.
    pub fn complete(&self) -> io::Result<()> {
        let _one = self.syncing.lock().expect("sync lock");
        let mut st = self.state.lock().expect("state lock");
        if st.complete {
            return Ok(());
        }
        let blocks = self.size.div_ceil(BLOCK);
        st.set(0, blocks);
        st.dirty.clear();
        st.complete = true;
        drop(st);
        self.target.sync_all()?;
        std::fs::remove_file(&self.state_path)?;
        sync_dir_of(&self.state_path)
    }

    /// The state file.
    pub fn state_path(&self) -> &Path {
        &self.state_path
    }
}

impl<B: Export> Export for Live<B> {
    fn size(&self) -> u64 {
        self.size
    }

    fn writable(&self) -> bool {
        true
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if !buf.is_empty() {
            let (from, to) = self.widened(offset, offset + buf.len() as u64);
            self.ensure(from, to - from)?;
        }
        self.target.read_exact_at(buf, offset)
    }

    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let end = offset + data.len() as u64;
        let (first, last) = self.blocks_of(offset, data.len() as u64);
        // The edge blocks the write covers in part hold the snapshot's bytes around it.
        let partial = |b: u64| !(offset <= b * BLOCK && end >= ((b + 1) * BLOCK).min(self.size));
        for b in [first, last - 1] {
            if partial(b) {
                self.ensure(b * BLOCK, BLOCK)?;
            }
        }
        {
            let mut st = self.state.lock().expect("state lock");
            self.target.write_all_at(data, offset)?;
            st.set(first, last);
        }
        if fua {
            self.checkpoint()?;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.checkpoint()
    }

    fn extents(&self, offset: u64, length: u64) -> io::Result<Vec<Extent>> {
        let range = (offset, offset.saturating_add(length).min(self.size));
        crate::overlay::layered_extents(
            &self.base,
            range,
            BLOCK,
            || self.state.lock().expect("state lock"),
            |st, b| st.has(b),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 10 blocks + 100 bytes of byte `offset % 251 + 1`: the snapshot.
    struct Base;

    const SIZE: u64 = 10 * BLOCK + 100;

    fn snap(at: u64) -> u8 {
        (at % 251) as u8 + 1
    }

    impl Export for Base {
        fn size(&self) -> u64 {
            SIZE
        }

        fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
            for (i, b) in buf.iter_mut().enumerate() {
                *b = snap(offset + i as u64);
            }
            Ok(())
        }

        fn extents(&self, offset: u64, _length: u64) -> io::Result<Vec<Extent>> {
            Ok(vec![Extent { length: SIZE - offset, state: 0 }])
        }
    }

    /// [`Base`] stored in chunks of 2.5 blocks.
    struct Chunked;

    const UNIT: u64 = 5 * BLOCK / 2;

    impl Export for Chunked {
        fn size(&self) -> u64 {
            SIZE
        }

        fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
            Base.read_at(offset, buf)
        }

        fn read_unit(&self, offset: u64) -> std::ops::Range<u64> {
            offset / UNIT * UNIT..((offset / UNIT + 1) * UNIT).min(SIZE)
        }

        fn extents(&self, offset: u64, length: u64) -> io::Result<Vec<Extent>> {
            Base.extents(offset, length)
        }
    }

    #[test]
    fn a_read_keeps_the_whole_blocks_of_the_chunks_it_touches() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("disk.img");
        let live = Live::open(Chunked, &target, &[6u8; 32]).unwrap();
        let read = |offset: u64, len: u64| {
            let mut buf = vec![0u8; len as usize];
            live.read_at(offset, &mut buf).unwrap();
            assert!(buf.iter().enumerate().all(|(i, &b)| b == snap(offset + i as u64)));
        };
        // In the first chunk [0, 2.5 blocks): blocks 0 and 1, not block 2 (half the next chunk's).
        read(10, 100);
        assert_eq!(live.state.lock().unwrap().absent(0, 11), [(2, 11)]);
        // Across chunks 2 and 3 [5, 10 blocks): blocks 5 to 9.
        read(7 * BLOCK, 2 * BLOCK);
        assert_eq!(live.state.lock().unwrap().absent(0, 11), [(2, 5), (10, 11)]);
        // The last chunk [10 blocks, end): the last, short block.
        read(SIZE - 1, 1);
        assert_eq!(live.state.lock().unwrap().absent(0, 11), [(2, 5)]);
        // Block 2 spans chunks 0 and 1: a read in its chunk-0 half brings it alone.
        read(2 * BLOCK + 5, 1);
        assert_eq!(live.state.lock().unwrap().absent(0, 11), [(3, 5)]);
        assert_eq!(all(&live), (0..SIZE).map(snap).collect::<Vec<u8>>());
    }

    fn all(e: &dyn Export) -> Vec<u8> {
        let mut v = vec![0u8; e.size() as usize];
        e.read_at(0, &mut v).unwrap();
        v
    }

    #[test]
    fn reads_fetch_writes_stay_the_restore_fills_around_them_and_a_reopen_resumes() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("disk.img");
        let id = [5u8; 32];
        let snapshot: Vec<u8> = (0..SIZE).map(snap).collect();
        let mut want = snapshot.clone();
        {
            let live = Live::open(Base, &target, &id).unwrap();
            assert!(state_path(&target).exists());
            // A read of block 1 makes it present (only it).
            let mut b = vec![0u8; 10];
            live.read_at(BLOCK + 5, &mut b).unwrap();
            assert_eq!(b, snapshot[(BLOCK + 5) as usize..(BLOCK + 15) as usize]);
            assert_eq!(live.present_blocks(), 1);
            // A write inside block 3 (not present): the rest of the block is the snapshot's.
            live.write_at(3 * BLOCK + 10, &[0xEE; 20], false).unwrap();
            want[(3 * BLOCK + 10) as usize..(3 * BLOCK + 30) as usize].fill(0xEE);
            // A write into the short last block, flushed.
            live.write_at(SIZE - 3, &[0xDD; 3], true).unwrap();
            want[(SIZE - 3) as usize..].fill(0xDD);
            assert_eq!(live.present_blocks(), 3);
            // The restore writes chunks not aligned to blocks, including over the writes.
            live.restore_write(0, &snapshot[..(3 * BLOCK + 700) as usize]).unwrap();
            // Block 3 was written by the client: the restore left it alone.
            assert_eq!(live.present_blocks(), 5, "blocks 0, 1, 2 whole, 3 and 10 written");
            let file = std::fs::read(&target).unwrap();
            assert_eq!(file[..(4 * BLOCK) as usize], want[..(4 * BLOCK) as usize]);
            live.checkpoint().unwrap();
            // Not checkpointed: a block the restore writes after the last checkpoint.
            live.restore_write(4 * BLOCK, &snapshot[(4 * BLOCK) as usize..(5 * BLOCK) as usize]).unwrap();
        }
        // Reopened (as after kill -9): the checkpointed blocks are present, the writes kept.
        let live = Live::open(Base, &target, &id).unwrap();
        assert_eq!(live.present_blocks(), 5);
        // Zeroing leaves the client's block 3 alone, and zeros block 4.
        live.restore_zero(3 * BLOCK, 2 * BLOCK).unwrap();
        want[(4 * BLOCK) as usize..(5 * BLOCK) as usize].fill(0);
        live.restore_write(0, &snapshot[..(4 * BLOCK) as usize]).unwrap();
        live.restore_write(5 * BLOCK, &snapshot[(5 * BLOCK) as usize..]).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), want);
        live.complete().unwrap();
        assert!(!state_path(&target).exists());
        assert!(live.is_complete());
        assert_eq!(all(&live), want);
        // Another snapshot's state file is refused.
        drop(live);
        std::fs::write(state_path(&target), {
            let mut b = header_bytes(&Header { size: SIZE, identity: [1; 32] });
            b.extend(vec![0u8; map_len(SIZE) as usize]);
            b
        })
        .unwrap();
        let e = Live::open(Base, &target, &id).err().unwrap();
        assert!(e.to_string().contains("another snapshot"), "{e}");
    }

    #[test]
    fn state_files_are_parsed_strictly() {
        let h = Header { size: SIZE, identity: [3; 32] };
        let mut good = header_bytes(&h);
        good.extend(vec![0u8; map_len(SIZE) as usize]);
        assert_eq!(parse(&good).unwrap().0, h);
        assert!(parse(&good[..100]).is_err());
        assert!(parse(&good[..good.len() - 1]).is_err());
        let mut past = good.clone();
        *past.last_mut().unwrap() = 0x80; // block 15 of 11
        assert_eq!(parse(&past).err(), Some("bits set past the last block"));
        let mut block = good.clone();
        block[17] = 0;
        assert!(parse(&block).is_err());
        let mut magic = good;
        magic[0] = b'X';
        assert!(parse(&magic).is_err());
    }
}
