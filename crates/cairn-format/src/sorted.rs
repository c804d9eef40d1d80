//! The sorted index file: the index kept on this machine's disk instead of in memory
//! (FORMAT.md §17). It is not a repository object: a command builds it in the metadata cache
//! from the repository's index files, and any copy that fails a check is rebuilt.
//!
//! Layout, every integer little-endian:
//!
//! ```text
//! records     count × 52   entry (48, as in a pack header) | pack number u32, sorted by ID
//! pack table  packs × 80   pack ID (32) | salt (32) | end u64 | largest tree u32 | flags u8 | 0 0 0
//! starts      (2^bits + 1) × u32   first record of each bucket (IDs' top `bits` bits), then count
//! sums        2^bits × u32         first 4 bytes of BLAKE3 of each bucket's records
//! trailer     96           magic "CAIRNSIX" | version u32 | bits u32 | packs u64 | count u64 |
//!                          key (32) | BLAKE3 of pack table ‖ starts ‖ sums ‖ trailer[..64]
//! ```
//!
//! The trailer and tables are checked whole when the file is opened (they are loaded into
//! memory: 80 bytes a pack and 8 a bucket); the records, which stay on disk, are checked a
//! bucket at a time against its sum each time a lookup reads one. Nothing here does I/O: the
//! file is read through [`SortedFile`], which `cairn-core` implements over a real file.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::crypto::SALT_LEN;
use crate::id::{BlobId, PackId, ID_LEN};
use crate::pack::{BlobEntry, BlobKind, ENTRY_LEN};

/// The file's first eight trailer bytes.
pub const MAGIC: [u8; 8] = *b"CAIRNSIX";
/// The version this build reads and writes.
pub const VERSION: u32 = 1;
/// Bytes of one record: a blob entry and its pack's number.
pub const RECORD_LEN: usize = ENTRY_LEN + 4;
/// Bytes of one pack in the pack table.
pub const PACK_LEN: usize = ID_LEN + SALT_LEN + 16;
/// Bytes of the trailer.
pub const TRAILER_LEN: usize = 96;
/// Most bucket bits a file may have (2^24 buckets = 128 MiB of tables: far past 10^8 blobs).
pub const MAX_BITS: u32 = 24;
/// Records per bucket aimed at: a lookup reads about this many (~0.5 KiB) in one read.
pub const RECORDS_PER_BUCKET: u64 = 8;

/// A blob's entry and the number of its pack: one sorted slot of the index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// The blob's entry.
    pub entry: BlobEntry,
    /// Its pack's number in the index's pack table.
    pub pack: u32,
}

impl Slot {
    /// Appends the slot's 52-byte record.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.entry.encode(out);
        out.extend_from_slice(&self.pack.to_le_bytes());
    }

    /// Decodes one 52-byte record.
    pub fn decode(b: &[u8]) -> Result<Slot, String> {
        if b.len() != RECORD_LEN {
            return Err(format!("record of {} bytes, not {RECORD_LEN}", b.len()));
        }
        let entry = BlobEntry::decode(&b[..ENTRY_LEN])?;
        Ok(Slot { entry, pack: u32::from_le_bytes(b[ENTRY_LEN..].try_into().expect("4 bytes")) })
    }
}

/// One pack of the index, with what commands ask of all its blobs, counted as they are loaded
/// (so that no command walks every blob): every blob the pack lists counts, the copies of a
/// blob that lookups do not find included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackInfo {
    /// The pack.
    pub id: PackId,
    /// Its salt.
    pub salt: [u8; SALT_LEN],
    /// Where its last listed blob ends.
    pub end: u64,
    /// The plaintext length of its largest tree (0 without trees).
    pub largest_tree: u32,
    /// Whether a pending prune is about to delete it.
    pub doomed: bool,
    /// Whether it holds a tree.
    pub trees: bool,
}

impl PackInfo {
    /// A pack with no blobs counted yet.
    pub fn new(id: PackId, salt: [u8; SALT_LEN], doomed: bool) -> Self {
        PackInfo { id, salt, end: 0, largest_tree: 0, doomed, trees: false }
    }

    /// Counts one blob the pack lists.
    pub fn count(&mut self, e: &BlobEntry) {
        self.end = self.end.max(u64::from(e.offset) + u64::from(e.length));
        if e.kind == BlobKind::Tree {
            self.trees = true;
            self.largest_tree = self.largest_tree.max(e.raw_length);
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.id.0);
        out.extend_from_slice(&self.salt);
        out.extend_from_slice(&self.end.to_le_bytes());
        out.extend_from_slice(&self.largest_tree.to_le_bytes());
        out.extend_from_slice(&[u8::from(self.doomed) | u8::from(self.trees) << 1, 0, 0, 0]);
    }

    fn decode(b: &[u8]) -> Result<Self, String> {
        let flags = b[76];
        if flags > 3 || b[77..80] != [0, 0, 0] {
            return Err(format!("pack flags {flags:#x} {:?} are not known", &b[77..80]));
        }
        Ok(PackInfo {
            id: PackId(b[..32].try_into().expect("32")),
            salt: b[32..64].try_into().expect("32"),
            end: u64::from_le_bytes(b[64..72].try_into().expect("8")),
            largest_tree: u32::from_le_bytes(b[72..76].try_into().expect("4")),
            doomed: flags & 1 != 0,
            trees: flags & 2 != 0,
        })
    }
}

/// The first eight bytes of an ID, in the order IDs sort.
pub fn id_prefix(id: &BlobId) -> u64 {
    u64::from_be_bytes(id.0[..8].try_into().expect("8 of 32 bytes"))
}

/// Sorts slots by ID and keeps one copy of each blob: one in a pack that stays if any, of
/// those the one in the pack numbered first (the same one however the slots were ordered).
pub fn sort_slots(slots: &mut Vec<Slot>, doomed: impl Fn(u32) -> bool) {
    // IDs are hashes, so their first eight bytes nearly always decide: compared as one
    // integer first, the sort of a million blobs took a third of the time it did comparing
    // whole IDs byte by byte.
    slots.sort_unstable_by(|a, b| {
        id_prefix(&a.entry.id)
            .cmp(&id_prefix(&b.entry.id))
            .then_with(|| (a.entry.id, doomed(a.pack), a.pack).cmp(&(b.entry.id, doomed(b.pack), b.pack)))
    });
    slots.dedup_by(|a, b| a.entry.id == b.entry.id);
}

/// Bucket bits for a file of about `count` records: about [`RECORDS_PER_BUCKET`] a bucket.
pub fn bits_for(count: u64) -> u32 {
    let buckets = (count / RECORDS_PER_BUCKET).max(1);
    (63 - buckets.leading_zeros()).clamp(1, MAX_BITS)
}

/// The sum of one bucket's records.
fn bucket_sum(records: &[u8]) -> u32 {
    u32::from_le_bytes(blake3::hash(records).as_bytes()[..4].try_into().expect("4"))
}

/// Writes a sorted index file front to back: records in ascending ID order, a sorted run at a
/// time ([`Writer::records`]), then the tables and trailer ([`Writer::finish`]).
pub struct Writer {
    bits: u32,
    starts: Vec<u32>,
    sums: Vec<u32>,
    count: u64,
    /// The current bucket's number and its records so far.
    bucket: usize,
    pending: Vec<u8>,
    last: Option<BlobId>,
}

impl Writer {
    /// A writer whose buckets are the IDs' top `bits` bits (at most [`MAX_BITS`]).
    pub fn new(bits: u32) -> Self {
        let bits = bits.clamp(1, MAX_BITS);
        Writer { bits, starts: vec![0], sums: Vec::new(), count: 0, bucket: 0, pending: Vec::new(), last: None }
    }

    /// Appends the records of `slots` (sorted, each ID greater than every one before) to `out`.
    pub fn records(&mut self, slots: &[Slot], out: &mut Vec<u8>) -> Result<(), String> {
        for s in slots {
            if self.last.is_some_and(|l| l >= s.entry.id) {
                return Err("records are not in ascending ID order".into());
            }
            if self.count >= u64::from(u32::MAX) {
                return Err("more than 2^32 - 1 blobs".into());
            }
            self.last = Some(s.entry.id);
            let b = (id_prefix(&s.entry.id) >> (64 - self.bits)) as usize;
            while self.bucket < b {
                self.close_bucket();
            }
            let at = self.pending.len();
            s.encode(&mut self.pending);
            out.extend_from_slice(&self.pending[at..]);
            self.count += 1;
        }
        Ok(())
    }

    fn close_bucket(&mut self) {
        self.sums.push(bucket_sum(&self.pending));
        self.pending.clear();
        self.starts.push(self.count as u32);
        self.bucket += 1;
    }

    /// The tables and trailer that end the file, for `packs` and the `key` of what it was
    /// built from.
    pub fn finish(mut self, packs: &[PackInfo], key: &[u8; 32]) -> Vec<u8> {
        while self.bucket < 1 << self.bits {
            self.close_bucket();
        }
        let mut out = Vec::with_capacity(packs.len() * PACK_LEN + self.starts.len() * 8 + TRAILER_LEN);
        for p in packs {
            p.encode(&mut out);
        }
        self.starts.iter().chain(&self.sums).for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.bits.to_le_bytes());
        out.extend_from_slice(&(packs.len() as u64).to_le_bytes());
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(key);
        // The sum covers the tables and the trailer's first 64 bytes.
        let tail = out.len() - 64;
        let mut h = blake3::Hasher::new();
        h.update(&out[..tail]);
        h.update(&out[tail..]);
        let sum = h.finalize();
        out.extend_from_slice(sum.as_bytes());
        out
    }
}

/// What the trailer says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trailer {
    /// Bucket bits.
    pub bits: u32,
    /// Packs in the pack table.
    pub packs: u64,
    /// Records.
    pub count: u64,
    /// What the file was built from (the caller's hash of its sources).
    pub key: [u8; 32],
    sum: [u8; 32],
    raw: [u8; 64],
}

impl Trailer {
    /// Where the tables start.
    pub fn tables_at(&self) -> u64 {
        self.count * RECORD_LEN as u64
    }

    /// Bytes of the pack table, starts and sums.
    pub fn tables_len(&self) -> u64 {
        self.packs * PACK_LEN as u64 + ((1u64 << self.bits) * 2 + 1) * 4
    }
}

/// Parses the trailer (the file's last [`TRAILER_LEN`] bytes) of a file of `file_len` bytes,
/// checking that the counts it gives make exactly that length.
pub fn parse_trailer(b: &[u8], file_len: u64) -> Result<Trailer, String> {
    if b.len() != TRAILER_LEN {
        return Err(format!("trailer of {} bytes, not {TRAILER_LEN}", b.len()));
    }
    if b[..8] != MAGIC {
        return Err("not a sorted index file (wrong magic)".into());
    }
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4"));
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8"));
    let version = u32_at(8);
    if version != VERSION {
        return Err(format!("version {version}, not {VERSION}"));
    }
    let bits = u32_at(12);
    if !(1..=MAX_BITS).contains(&bits) {
        return Err(format!("{bits} bucket bits, not 1 to {MAX_BITS}"));
    }
    let (packs, count) = (u64_at(16), u64_at(24));
    if count > u64::from(u32::MAX) || packs > u64::from(u32::MAX) {
        return Err(format!("{count} records of {packs} packs: too many"));
    }
    let t = Trailer {
        bits,
        packs,
        count,
        key: b[32..64].try_into().expect("32"),
        sum: b[64..96].try_into().expect("32"),
        raw: b[..64].try_into().expect("64"),
    };
    let want = t.tables_at() + t.tables_len() + TRAILER_LEN as u64;
    if want != file_len {
        return Err(format!("{file_len} bytes where its counts make {want}"));
    }
    Ok(t)
}

/// The tables of a sorted index file, checked.
#[derive(Debug)]
pub struct Tables {
    /// The pack table.
    pub packs: Vec<PackInfo>,
    /// First record of each bucket, then the count.
    pub starts: Vec<u32>,
    /// Each bucket's sum.
    pub sums: Vec<u32>,
}

/// Parses and checks the tables (`b`: the [`Trailer::tables_len`] bytes at
/// [`Trailer::tables_at`]).
pub fn parse_tables(t: &Trailer, b: &[u8]) -> Result<Tables, String> {
    if b.len() as u64 != t.tables_len() {
        return Err(format!("tables of {} bytes, not {}", b.len(), t.tables_len()));
    }
    let mut h = blake3::Hasher::new();
    h.update(b);
    h.update(&t.raw);
    if h.finalize().as_bytes() != &t.sum {
        return Err("its tables do not match their checksum".into());
    }
    let (pack_bytes, rest) = b.split_at(t.packs as usize * PACK_LEN);
    let packs = pack_bytes.chunks_exact(PACK_LEN).map(PackInfo::decode).collect::<Result<Vec<_>, _>>()?;
    let buckets = 1usize << t.bits;
    let words = |b: &[u8]| b.chunks_exact(4).map(|w| u32::from_le_bytes(w.try_into().expect("4"))).collect::<Vec<_>>();
    let (starts, sums) = rest.split_at((buckets + 1) * 4);
    let (starts, sums) = (words(starts), words(sums));
    if starts[0] != 0 || u64::from(starts[buckets]) != t.count || starts.windows(2).any(|w| w[0] > w[1]) {
        return Err("its bucket starts are not in order".into());
    }
    Ok(Tables { packs, starts, sums })
}

/// Reads a sorted index file (`cairn-core` implements it over a real file).
pub trait SortedFile: Send + Sync {
    /// Fills `buf` from `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
    /// Told, once, that the records turned out damaged (`why`): the file is not to be used
    /// again (a lookup that read damaged records answers "not found").
    fn damaged(&self, why: &str);
}

impl SortedFile for Vec<u8> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let at = usize::try_from(offset).ok().filter(|&a| a.checked_add(buf.len()).is_some_and(|e| e <= self.len()));
        let at = at.ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(&self[at..at + buf.len()]);
        Ok(())
    }
    fn damaged(&self, _why: &str) {}
}

/// The sorted slots of an index, in a file: a lookup reads one bucket (about
/// [`RECORDS_PER_BUCKET`] records) and checks it against its sum.
pub struct DiskSlots {
    file: Box<dyn SortedFile>,
    bits: u32,
    starts: Vec<u32>,
    sums: Vec<u32>,
    damaged: AtomicBool,
}

impl DiskSlots {
    /// Slots read from `file`, whose checked tables are `tables` (the packs taken out).
    pub fn new(file: Box<dyn SortedFile>, trailer: &Trailer, tables: Tables) -> Self {
        DiskSlots {
            file,
            bits: trailer.bits,
            starts: tables.starts,
            sums: tables.sums,
            damaged: AtomicBool::new(false),
        }
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        *self.starts.last().expect("starts end with the count") as usize
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held in memory.
    pub fn memory_bytes(&self) -> u64 {
        ((self.starts.capacity() + self.sums.capacity()) * 4) as u64
    }

    /// Whether a lookup found damage (every later one answers "not found").
    pub fn is_damaged(&self) -> bool {
        self.damaged.load(Ordering::Relaxed)
    }

    /// The slots of bucket `b`, read and checked, with its first record's number.
    fn bucket(&self, b: usize, packs: usize) -> Option<(usize, Vec<Slot>)> {
        if self.is_damaged() {
            return None;
        }
        let (start, end) = (self.starts[b] as usize, self.starts[b + 1] as usize);
        let mut buf = vec![0u8; (end - start) * RECORD_LEN];
        let read = self.file.read_at(&mut buf, (start * RECORD_LEN) as u64).map_err(|e| format!("cannot read it: {e}"));
        let checked = read.and_then(|()| {
            if bucket_sum(&buf) != self.sums[b] {
                return Err(format!("bucket {b} does not match its checksum"));
            }
            let slots = buf.chunks_exact(RECORD_LEN).map(Slot::decode).collect::<Result<Vec<_>, _>>()?;
            match slots.iter().find(|s| s.pack as usize >= packs) {
                Some(s) => Err(format!("a record names pack {} of {packs}", s.pack)),
                None => Ok(slots),
            }
        });
        match checked {
            Ok(slots) => Some((start, slots)),
            Err(why) => {
                if !self.damaged.swap(true, Ordering::Relaxed) {
                    self.file.damaged(&why);
                }
                None
            }
        }
    }

    /// Where `id` is, and its slot.
    pub fn find(&self, id: &BlobId, packs: usize) -> Option<(usize, Slot)> {
        let b = (id_prefix(id) >> (64 - self.bits)) as usize;
        let (start, slots) = self.bucket(b, packs)?;
        slots.iter().position(|s| s.entry.id == *id).map(|at| (start + at, slots[at]))
    }

    /// The slot at position `pos`.
    pub fn at(&self, pos: usize, packs: usize) -> Option<Slot> {
        if pos >= self.len() {
            return None;
        }
        // The last bucket starting at or before `pos` that is not empty.
        let b = self.starts.partition_point(|&s| s as usize <= pos) - 1;
        let (start, slots) = self.bucket(b, packs)?;
        slots.get(pos - start).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::Codec;

    fn slot(n: u32, pack: u32) -> Slot {
        let id = BlobId(*blake3::hash(&n.to_le_bytes()).as_bytes());
        let entry = BlobEntry { id, kind: BlobKind::Data, codec: Codec::None, offset: n, length: 100, raw_length: 60 };
        Slot { entry, pack }
    }

    fn file(n: u32) -> (Vec<u8>, Vec<Slot>, Vec<PackInfo>) {
        let packs: Vec<PackInfo> = (0..2u8).map(|p| PackInfo::new(PackId([p; 32]), [p; 32], p == 1)).collect();
        let mut slots: Vec<Slot> = (0..n).map(|i| slot(i, i % 2)).collect();
        sort_slots(&mut slots, |p| packs[p as usize].doomed);
        let mut w = Writer::new(bits_for(u64::from(n)));
        let mut out = Vec::new();
        w.records(&slots, &mut out).unwrap();
        out.extend_from_slice(&w.finish(&packs, &[9; 32]));
        (out, slots, packs)
    }

    fn open(b: &[u8]) -> Result<(Vec<PackInfo>, DiskSlots), String> {
        if b.len() < TRAILER_LEN {
            return Err("short".into());
        }
        let t = parse_trailer(&b[b.len() - TRAILER_LEN..], b.len() as u64)?;
        let at = t.tables_at() as usize;
        let mut tables = parse_tables(&t, &b[at..at + t.tables_len() as usize])?;
        let packs = std::mem::take(&mut tables.packs);
        Ok((packs, DiskSlots::new(Box::new(b.to_vec()), &t, tables)))
    }

    #[test]
    fn written_files_read_back_and_every_table_byte_is_checked() {
        for n in [0, 1, 9, 1000] {
            let (b, slots, packs) = file(n);
            let (read_packs, disk) = open(&b).unwrap();
            assert_eq!(read_packs, packs);
            assert_eq!(disk.len(), n as usize);
            for (pos, s) in slots.iter().enumerate() {
                assert_eq!(disk.find(&s.entry.id, 2), Some((pos, *s)));
                assert_eq!(disk.at(pos, 2), Some(*s));
            }
            assert_eq!(disk.find(&slot(n + 1, 0).entry.id, 2), None);
            assert_eq!(disk.at(n as usize, 2), None);
            // Cut anywhere, or any byte of the tables and trailer changed: refused at open.
            for cut in 1..b.len().min(200) {
                assert!(open(&b[..b.len() - cut]).is_err(), "cut {cut}");
            }
            for at in slots.len() * RECORD_LEN..b.len() {
                let mut bad = b.clone();
                bad[at] ^= 0x10;
                assert!(open(&bad).is_err(), "byte {at} of {}", b.len());
            }
        }
    }

    #[test]
    fn a_changed_record_is_never_used() {
        let (b, slots, _) = file(1000);
        for at in [0, 47, 51, 52 * 500 + 20, 52 * 999 + 51] {
            let mut bad = b.clone();
            bad[at] ^= 0x01;
            let (_, disk) = open(&bad).unwrap();
            let s = slots[at / RECORD_LEN];
            assert_eq!(disk.find(&s.entry.id, 2), None, "byte {at}");
            assert!(disk.is_damaged());
            // Once damaged, nothing more is answered from the file.
            assert_eq!(disk.at(0, 2), None);
        }
        // A record naming a pack the table does not have is damage too.
        let (_, disk) = open(&b).unwrap();
        let in_second = slots.iter().find(|s| s.pack == 1).unwrap();
        assert_eq!(disk.find(&in_second.entry.id, 1), None);
        assert!(disk.is_damaged());
    }

    #[test]
    fn records_out_of_order_are_refused() {
        let mut w = Writer::new(4);
        let mut out = Vec::new();
        let (a, b) = (slot(1, 0), slot(2, 0));
        let (lo, hi) = if a.entry.id < b.entry.id { (a, b) } else { (b, a) };
        w.records(&[hi], &mut out).unwrap();
        assert!(w.records(&[lo], &mut out).is_err());
        assert!(w.records(&[hi], &mut out).is_err(), "the same ID twice");
    }
}
