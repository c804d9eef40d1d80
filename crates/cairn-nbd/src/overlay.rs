//! A copy-on-write overlay over a read-only export: writes go to a local sparse file, reads
//! prefer it block by block (docs/FORMAT.md §"NBD overlay file").
//!
//! The file is a 4 KiB header, a bitmap of the blocks written (one bit per 4 KiB block), and a
//! data area with block `i` at `data_start + i × 4096`; blocks never written are holes, so a
//! fresh overlay of a 100 GiB disk takes a few KiB on disk. A block's data is written before its
//! bit; `flush` (or a write with FUA) syncs both.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};

use crate::proto::Extent;
use crate::server::Export;

/// The overlay file's first eight bytes.
pub const MAGIC: &[u8; 8] = b"CAIRNOV1";
/// Bytes of one block: the unit the bitmap tracks.
pub const BLOCK: u64 = 4096;
/// Bytes of the header.
const HEADER: u64 = 4096;

/// A read-only export with writes kept in an overlay file.
pub struct Overlay<B> {
    base: B,
    file: File,
    path: PathBuf,
    size: u64,
    data_start: u64,
    /// One bit per block: written to the overlay.
    map: RwLock<Vec<u8>>,
    /// Writes one at a time (a partial block is read, merged and written whole).
    writing: Mutex<()>,
}

/// Bytes of the bitmap of an export of `size` bytes, rounded up to whole blocks.
fn map_len(size: u64) -> u64 {
    size.div_ceil(BLOCK).div_ceil(8).div_ceil(BLOCK) * BLOCK
}

fn bad(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}: {what}; give a new overlay file (or the one made for this export)", path.display()),
    )
}

impl<B: Export> Overlay<B> {
    /// The overlay at `path` over `base`: created if missing, else checked to have been made for
    /// an export of the same size and `identity` (what names the base: a snapshot and path).
    pub fn open(base: B, path: &Path, identity: &[u8; 32]) -> io::Result<Self> {
        let size = base.size();
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        let data_start = HEADER + map_len(size);
        let mut header = vec![0u8; 56];
        if file.metadata()?.len() == 0 {
            header[0..8].copy_from_slice(MAGIC);
            header[8..16].copy_from_slice(&size.to_le_bytes());
            header[16..20].copy_from_slice(&(BLOCK as u32).to_le_bytes());
            header[24..56].copy_from_slice(identity);
            file.write_all_at(&header, 0)?;
            file.set_len(data_start + size)?;
            file.sync_all()?;
        } else {
            file.read_exact_at(&mut header, 0).map_err(|_| bad(path, "not a Cairn overlay file (too short)"))?;
            if &header[0..8] != MAGIC {
                return Err(bad(path, "not a Cairn overlay file"));
            }
            if header[8..16] != size.to_le_bytes() || header[16..20] != (BLOCK as u32).to_le_bytes() {
                return Err(bad(path, "made for an export of another size"));
            }
            if &header[24..56] != identity {
                return Err(bad(path, "made for another snapshot or file"));
            }
            if file.metadata()?.len() < data_start + size {
                file.set_len(data_start + size)?;
            }
        }
        let mut map = vec![0u8; size.div_ceil(BLOCK).div_ceil(8) as usize];
        file.read_exact_at(&mut map, HEADER)?;
        Ok(Overlay {
            base,
            file,
            path: path.to_path_buf(),
            size,
            data_start,
            map: RwLock::new(map),
            writing: Mutex::new(()),
        })
    }

    /// Blocks written so far.
    pub fn written_blocks(&self) -> u64 {
        self.map.read().expect("map lock").iter().map(|b| u64::from(b.count_ones())).sum()
    }

    /// The overlay file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn is_written(map: &[u8], block: u64) -> bool {
        map[(block / 8) as usize] & (1 << (block % 8)) != 0
    }

    /// Writes whole blocks `first..` from `data` (a multiple of the block size, or the export's
    /// short last block) and marks them.
    fn put_blocks(&self, first: u64, data: &[u8]) -> io::Result<()> {
        self.file.write_all_at(data, self.data_start + first * BLOCK)?;
        let last = first + (data.len() as u64).div_ceil(BLOCK);
        let mut map = self.map.write().expect("map lock");
        for b in first..last {
            map[(b / 8) as usize] |= 1 << (b % 8);
        }
        let (lo, hi) = ((first / 8) as usize, ((last - 1) / 8) as usize);
        self.file.write_all_at(&map[lo..=hi], HEADER + lo as u64)
    }

    /// Block `b` as it reads now (the overlay's or the base's), `BLOCK` bytes or fewer at the end.
    fn block(&self, b: u64) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; (self.size - b * BLOCK).min(BLOCK) as usize];
        self.read_at(b * BLOCK, &mut buf)?;
        Ok(buf)
    }
}

impl<B: Export> Export for Overlay<B> {
    fn size(&self) -> u64 {
        self.size
    }

    fn writable(&self) -> bool {
        true
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let end = offset + buf.len() as u64;
        let mut at = offset;
        while at < end {
            // A run of blocks all in the overlay or all not.
            let (first, in_overlay) = {
                let map = self.map.read().expect("map lock");
                (at / BLOCK, Self::is_written(&map, at / BLOCK))
            };
            let mut run_end = ((first + 1) * BLOCK).min(end);
            {
                let map = self.map.read().expect("map lock");
                while run_end < end && Self::is_written(&map, run_end / BLOCK) == in_overlay {
                    run_end = ((run_end / BLOCK + 1) * BLOCK).min(end);
                }
            }
            let part = &mut buf[(at - offset) as usize..(run_end - offset) as usize];
            if in_overlay {
                self.file.read_exact_at(part, self.data_start + at)?;
            } else {
                self.base.read_at(at, part)?;
            }
            at = run_end;
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let _one = self.writing.lock().expect("write lock");
        let end = offset + data.len() as u64;
        let (first, last) = (offset / BLOCK, end.div_ceil(BLOCK));
        // Whole blocks covering the write: the edges read as they are, the middle from `data`.
        // An edge block the write covers whole is not read (from the repository, maybe).
        let whole = |b: u64| offset <= b * BLOCK && end >= ((b + 1) * BLOCK).min(self.size);
        let edge = |b: u64| -> io::Result<Vec<u8>> {
            if whole(b) {
                Ok(vec![0u8; (self.size - b * BLOCK).min(BLOCK) as usize])
            } else {
                self.block(b)
            }
        };
        let mut blocks = Vec::with_capacity(((last - first) * BLOCK) as usize);
        blocks.extend(edge(first)?);
        if last - first > 1 {
            blocks.resize(((last - first - 1) * BLOCK) as usize, 0);
            blocks.extend(edge(last - 1)?);
        }
        let skip = (offset - first * BLOCK) as usize;
        blocks[skip..skip + data.len()].copy_from_slice(data);
        self.put_blocks(first, &blocks)?;
        if fua {
            self.file.sync_data()?;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn extents(&self, offset: u64, length: u64) -> io::Result<Vec<Extent>> {
        let range = (offset, offset.saturating_add(length).min(self.size));
        layered_extents(
            &self.base,
            range,
            BLOCK,
            || self.map.read().expect("map lock"),
            |map, b| Self::is_written(map, b),
        )
    }
}

/// The extents of `base` over `range` (start, end) with every `block`-sized block a layer above
/// it holds reported as data (state 0, neither a hole nor zeros): [`Overlay`]'s written blocks,
/// a live restore's final ones. `lock` gives the layer's map, held for one extent of `base` at a
/// time, and `holds` asks it about a block.
pub(crate) fn layered_extents<G>(
    base: &dyn Export,
    (mut at, end): (u64, u64),
    block: u64,
    lock: impl Fn() -> G,
    holds: impl Fn(&G, u64) -> bool,
) -> io::Result<Vec<Extent>> {
    let mut out: Vec<Extent> = Vec::new();
    let mut push = |length: u64, state: u32| match out.last_mut() {
        Some(e) if e.state == state => e.length += length,
        _ => out.push(Extent { length, state }),
    };
    while at < end {
        let extents = base.extents(at, end - at)?;
        let Some(e) = extents.first().filter(|e| e.length > 0) else { break };
        let e_end = (at + e.length).min(end);
        let map = lock();
        while at < e_end {
            let next = ((at / block + 1) * block).min(e_end);
            push(next - at, if holds(&map, at / block) { 0 } else { e.state });
            at = next;
        }
    }
    Ok(out)
}

/// Writes `export` whole into a new plain file at `path`: ranges that read as zeros stay holes.
/// Reads go in order, `piece` bytes at a time (so a reader behind it sees a sequential read).
pub fn copy_to_file(export: &dyn Export, path: &Path, piece: usize) -> io::Result<u64> {
    let out = OpenOptions::new().write(true).create_new(true).open(path)?;
    let size = export.size();
    out.set_len(size)?;
    let mut buf = vec![0u8; piece.max(BLOCK as usize)];
    let mut at = 0;
    let mut written = 0;
    while at < size {
        let extents = export.extents(at, (size - at).min(1 << 30))?;
        let Some(e) = extents.first().filter(|e| e.length > 0).copied() else { break };
        let e_end = (at + e.length).min(size);
        if e.state & crate::proto::STATE_ZERO != 0 {
            at = e_end;
            continue;
        }
        while at < e_end {
            let n = (e_end - at).min(buf.len() as u64) as usize;
            export.read_at(at, &mut buf[..n])?;
            if buf[..n].iter().any(|&b| b != 0) {
                out.write_all_at(&buf[..n], at)?;
                written += n as u64;
            }
            at += n as u64;
        }
    }
    out.sync_all()?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 40 KiB + 100 bytes: the first half bytes 1, the rest a hole.
    struct Base;

    const SIZE: u64 = 10 * BLOCK + 100;

    impl Export for Base {
        fn size(&self) -> u64 {
            SIZE
        }

        fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
            for (i, b) in buf.iter_mut().enumerate() {
                *b = u8::from(offset + (i as u64) < 5 * BLOCK);
            }
            Ok(())
        }

        fn extents(&self, offset: u64, _length: u64) -> io::Result<Vec<Extent>> {
            Ok(if offset < 5 * BLOCK {
                vec![Extent { length: 5 * BLOCK - offset, state: 0 }]
            } else {
                vec![Extent { length: SIZE - offset, state: 3 }]
            })
        }
    }

    fn all(e: &dyn Export) -> Vec<u8> {
        let mut v = vec![0u8; e.size() as usize];
        e.read_at(0, &mut v).unwrap();
        v
    }

    #[test]
    fn writes_land_in_the_overlay_survive_a_reopen_and_partial_blocks_keep_the_base() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ovl");
        let id = [7u8; 32];
        let mut want = all(&Base);
        {
            let o = Overlay::open(Base, &path, &id).unwrap();
            assert_eq!(all(&o), want);
            // Across the data/hole boundary, not block-aligned, and into the short last block.
            o.write_at(5 * BLOCK - 10, &[9u8; 20], false).unwrap();
            o.write_at(SIZE - 3, &[8u8; 3], true).unwrap();
            want[(5 * BLOCK - 10) as usize..(5 * BLOCK + 10) as usize].fill(9);
            want[(SIZE - 3) as usize..].fill(8);
            assert_eq!(all(&o), want);
            assert_eq!(o.written_blocks(), 3);
            o.flush().unwrap();
            let ext = o.extents(0, SIZE).unwrap();
            assert_eq!(
                ext,
                [
                    Extent { length: 6 * BLOCK, state: 0 },
                    Extent { length: 4 * BLOCK, state: 3 },
                    Extent { length: 100, state: 0 }
                ]
            );
        }
        let o = Overlay::open(Base, &path, &id).unwrap();
        assert_eq!(all(&o), want, "the writes survived");
        assert!(Overlay::open(Base, &path, &[0u8; 32]).is_err(), "another export's overlay is refused");
        // The plain image: the same bytes, the untouched hole still a hole.
        let img = dir.path().join("img");
        copy_to_file(&o, &img, 8192).unwrap();
        assert_eq!(std::fs::read(&img).unwrap(), want);
        use std::os::unix::fs::MetadataExt;
        assert!(std::fs::metadata(&img).unwrap().blocks() * 512 < SIZE);
    }
}
