//! `--read-data` and `--read-data-subset`: packs read in full through the read path, in pieces
//! of at most an eighth of the budget (so many requests are in flight within a small budget).
//! Each pack's bytes are hashed against its name (FORMAT.md §1) as the pieces arrive, in any
//! order (`packhash.rs`), and every blob is decrypted, decompressed and its ID recomputed by the
//! read path's decode stage.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use super::packhash::{self, PackHash};
use super::record::Record;
use super::structure::IndexedPackInfo;
use super::{CheckOptions, CheckReport, Finding, FindingKind, Progress, ReadData};
use crate::engine::read::{coalesce, Decoded, PackRead, ReadRef, Reader, Sink, MAX_READ};
use crate::engine::repository::Repository;
use crate::error::{Error, Result};
use cairn_format::id::PackId;
use cairn_format::layout::pack_path;
use cairn_format::pack::BlobEntry;

/// Which packs `--read-data-subset` reads.
#[derive(Clone, Debug, PartialEq)]
pub enum Subset {
    /// `N/M`: the packs whose ID (first 4 bytes, big-endian) modulo M is N − 1.
    Part {
        /// 1-based part.
        n: u32,
        /// Number of parts.
        m: u32,
    },
    /// `P%`: this fraction of the packs (0 < f ≤ 1), at random (or least recently read).
    Fraction(f64),
    /// `SIZE`: packs until this many bytes, at random (or least recently read).
    Bytes(u64),
}

impl std::str::FromStr for Subset {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::Usage(format!("invalid data subset {s:?}: give N/M (e.g. 1/7), a percentage (10%) or a size (50G)"))
        };
        if let Some((n, m)) = s.split_once('/') {
            let (n, m): (u32, u32) = (n.trim().parse().map_err(|_| bad())?, m.trim().parse().map_err(|_| bad())?);
            if m == 0 || n == 0 || n > m {
                return Err(bad());
            }
            return Ok(Subset::Part { n, m });
        }
        if let Some(p) = s.strip_suffix('%') {
            let p: f64 = p.trim().parse().map_err(|_| bad())?;
            if !(p > 0.0 && p <= 100.0) {
                return Err(bad());
            }
            return Ok(Subset::Fraction(p / 100.0));
        }
        crate::engine::platform::parse_size(s).map(Subset::Bytes).map_err(|_| bad())
    }
}

/// How long and with how much in flight a data check reads.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// No pack is begun after this (`--max-duration`).
    pub deadline: Option<Instant>,
    /// Pack data in flight (`check/memory.rs`).
    pub bytes_in_flight: u64,
}

/// Picks the packs to read, reads them within `limits` and records what was read.
pub fn read(
    repo: &Repository,
    chosen: &[&IndexedPackInfo],
    opts: &CheckOptions,
    mut record: Option<&mut Record>,
    limits: Limits,
    report: &mut CheckReport,
    progress: &Progress,
) -> Result<()> {
    let Limits { deadline, bytes_in_flight: budget } = limits;
    let picked = match (&opts.read_data, opts.resume, record.as_deref_mut()) {
        // A full check resumes its cycle: the packs not read since it began.
        (ReadData::All, true, Some(rec)) => rec.pending(chosen, |p| p.id),
        (what, resume, rec) => pick(chosen, what, rec.filter(|_| resume).map(|r| &*r)),
    };
    let (reads, hashes) = plan(&picked, budget);
    progress.phase("data", picked.len() as u64);
    progress.bytes_to_read.store(picked.iter().map(|p| p.size).sum(), Ordering::Relaxed);
    let state = State {
        findings: Mutex::new(Vec::new()),
        read: Mutex::new(Vec::new()),
        unreadable: Mutex::new(Vec::new()),
        blobs: AtomicU64::new(0),
        handed_out: AtomicUsize::new(0),
        packs: hashes.into_iter().map(|(id, size, h)| (id, (size, Mutex::new(h)))).collect(),
        progress,
    };
    let reader = Reader::new(repo, budget, opts.cancel.clone());
    std::thread::scope(|s| {
        // The time budget is looked at only when a pack begins: a pack begun is read to its end,
        // so what a stopped run read is recorded whole and the next run reads only the others.
        let mut current = None;
        let state = &state;
        let feed = reads.iter().take_while(move |r| {
            let begins = current != Some(r.pack);
            current = Some(r.pack);
            let go = !begins || deadline.is_none_or(|d| Instant::now() < d);
            if go {
                state.handed_out.fetch_add(1, Ordering::Relaxed);
            }
            go
        });
        let workers = reader.start(s, feed, opts.fetches(repo), opts.decode_threads, ToCheck { state });
        for w in workers {
            w.join().expect("a check worker panicked");
        }
    });
    let handed_out = state.handed_out.load(Ordering::Relaxed);
    let read_packs = state.read.into_inner().expect("lock");
    report.stopped_early = handed_out < reads.len();
    report.packs_left = picked.len().saturating_sub(read_packs.len()) as u64;
    report.packs_read = read_packs.len() as u64;
    report.bytes_read = reader.fetched_bytes();
    report.blobs_read = state.blobs.load(Ordering::Relaxed);
    if let Some(rec) = record {
        let now = crate::engine::platform::now_secs();
        for id in &read_packs {
            rec.mark(id, now);
        }
    }
    let mut findings = state.findings.into_inner().expect("lock");
    for (id, why) in state.unreadable.into_inner().expect("lock") {
        let p = chosen.iter().find(|p| p.id == id).expect("a chosen pack");
        let mut f = Finding::new(FindingKind::UnreadablePack, Some(pack_path(&id)), why);
        f.blobs = p.blobs.iter().map(|b| b.id).collect();
        findings.push(f);
    }
    findings.sort_by(|a, b| (a.file.as_deref(), a.kind as u8).cmp(&(b.file.as_deref(), b.kind as u8)));
    report.findings.extend(findings);
    Ok(())
}

/// The packs a data check reads, in the order it reads them.
fn pick<'p>(chosen: &[&'p IndexedPackInfo], what: &ReadData, record: Option<&Record>) -> Vec<&'p IndexedPackInfo> {
    let subset = match what {
        ReadData::None => return Vec::new(),
        ReadData::All => return chosen.to_vec(),
        ReadData::Subset(s) => s,
    };
    if let Subset::Part { n, m } = subset {
        let part = |id: &PackId| u32::from_be_bytes(id.0[..4].try_into().expect("4 bytes")) % m == n - 1;
        return chosen.iter().copied().filter(|p| part(&p.id)).collect();
    }
    // A random order (keyed by a fresh key), or least recently read first.
    let mut key = [0u8; 32];
    cairn_format::crypto::random_bytes(&mut key);
    let mut order: Vec<(u64, [u8; 32], &IndexedPackInfo)> = chosen
        .iter()
        .map(|p| (record.and_then(|r| r.last(&p.id)).unwrap_or(0), *blake3::keyed_hash(&key, &p.id.0).as_bytes(), *p))
        .collect();
    order.sort_unstable_by_key(|a| (a.0, a.1));
    match subset {
        Subset::Fraction(f) => {
            let count = ((chosen.len() as f64) * f).ceil() as usize;
            order.into_iter().take(count).map(|(_, _, p)| p).collect()
        }
        Subset::Bytes(limit) => {
            let mut sum = 0;
            order
                .into_iter()
                .take_while(|(_, _, p)| {
                    let take = sum < *limit;
                    sum += p.size;
                    take
                })
                .map(|(_, _, p)| p)
                .collect()
        }
        Subset::Part { .. } => unreachable!("handled above"),
    }
}

/// Reads of every byte of each pack, in pieces of at most an eighth of the budget (at least
/// 1 MiB, at most [`MAX_READ`]) cut at blob boundaries (a blob larger than a piece is read on
/// its own), with blob-less reads of whatever lies between and after the blobs (the header), and
/// for each pack the state its hash is gathered in. A pack whose blobs overlap (an index that
/// disagrees with itself; the structure check names it) is read blob by blob and not hashed.
fn plan(packs: &[&IndexedPackInfo], budget: u64) -> (Vec<PackRead>, Vec<(PackId, u64, PackState)>) {
    let piece = (budget / 8).clamp(1024 * 1024, MAX_READ);
    let mut reads = Vec::with_capacity(packs.len());
    let mut states = Vec::with_capacity(packs.len());
    for p in packs {
        let first = reads.len();
        let mut end = 0; // how far the reads so far cover the pack
        let mut overlap = false;
        let mut blobs = p.blobs.clone();
        blobs.sort_unstable_by_key(|b| b.offset);
        for b in blobs {
            let (start, stop) = (u64::from(b.offset), u64::from(b.offset) + u64::from(b.length));
            overlap |= start < end;
            let joins = reads.len() > first && start == end && !overlap;
            match reads.last_mut().filter(|r: &&mut PackRead| joins && stop - r.offset <= piece) {
                Some(r) => {
                    r.length = stop - r.offset;
                    r.blobs.push(b);
                }
                None => {
                    if start > end && !overlap {
                        gap_reads(p, end, start, piece, &mut reads);
                    }
                    reads.push(PackRead::range(p.id, p.salt, start, stop - start, vec![b]));
                }
            }
            end = end.max(stop);
        }
        if overlap {
            reads.truncate(first);
            let located = p
                .blobs
                .iter()
                .map(|&entry| cairn_format::index::BlobLocation { pack: p.id, pack_no: 0, salt: p.salt, entry })
                .collect();
            reads.extend(coalesce(located, piece, 0));
        } else {
            gap_reads(p, end, p.size, piece, &mut reads);
        }
        let planned = reads[first..].iter().map(|r| r.length).sum();
        let hash = (!overlap).then(|| PackHash::new(p.size));
        states.push((p.id, p.size, PackState { planned, seen: 0, hash }));
    }
    (reads, states)
}

/// Blob-less reads of `from..to` of a pack, in pieces.
fn gap_reads(p: &IndexedPackInfo, from: u64, to: u64, piece: u64, reads: &mut Vec<PackRead>) {
    let mut at = from;
    while at < to {
        let length = (to - at).min(piece);
        reads.push(PackRead::range(p.id, p.salt, at, length, Vec::new()));
        at += length;
    }
}

/// What the data check knows of one pack while its pieces arrive.
struct PackState {
    /// Bytes of the pack the plan reads.
    planned: u64,
    /// Bytes of them fetched so far.
    seen: u64,
    /// Its hash, gathered piece by piece (None: not hashed, see [`plan`]).
    hash: Option<PackHash>,
}

/// What the data check's workers collect.
struct State<'p> {
    findings: Mutex<Vec<Finding>>,
    /// Packs whose every read arrived.
    read: Mutex<Vec<PackId>>,
    /// Packs that could not be read at all, with why.
    unreadable: Mutex<Vec<(PackId, String)>>,
    blobs: AtomicU64,
    handed_out: AtomicUsize,
    /// Each pack's size and what is known of it.
    packs: HashMap<PackId, (u64, Mutex<PackState>)>,
    progress: &'p Progress,
}

/// The check's end of the read path.
#[derive(Clone)]
struct ToCheck<'s> {
    state: &'s State<'s>,
}

impl<'s> Sink<'s> for ToCheck<'s> {
    fn fetched(&self, read: ReadRef<'s>, bytes: &[u8]) {
        let st = self.state;
        st.progress.bytes_read.fetch_add(read.length, Ordering::Relaxed);
        let Some((size, pack)) = st.packs.get(&read.pack) else { return };
        let piece = packhash::hash_piece(*size, read.offset, bytes);
        let mut pack = pack.lock().expect("lock");
        pack.seen += read.length;
        // A piece that does not fit the file leaves the pack unhashed (see `plan`).
        if !pack.hash.as_mut().is_none_or(|h| h.add(piece)) {
            pack.hash = None;
        }
        if pack.seen < pack.planned {
            return;
        }
        st.read.lock().expect("lock").push(read.pack);
        st.progress.step();
        if let Some(hash) = pack.hash.take().map(|h| h.finish()) {
            if hash != Some(read.pack.0) {
                let file = pack_path(&read.pack);
                let msg = format!("{file} does not hash to its name: its bytes changed since it was written");
                st.findings.lock().expect("lock").push(Finding::new(FindingKind::DamagedPack, Some(file), msg));
            }
        }
    }

    fn blobs(&self, read: ReadRef<'s>, blobs: Vec<Decoded<'s>>) -> bool {
        self.verified(read, blobs.len())
    }

    fn verify_only(&self) -> bool {
        true
    }

    fn verified(&self, _read: ReadRef<'s>, count: usize) -> bool {
        self.state.blobs.fetch_add(count as u64, Ordering::Relaxed);
        true
    }

    fn failed(&self, read: ReadRef<'s>, blob: &BlobEntry, why: &Error) {
        let file = pack_path(&read.pack);
        let f = Finding::new(FindingKind::DamagedBlob, Some(file), why.to_string()).with_blob(blob.id);
        self.state.findings.lock().expect("lock").push(f);
    }

    fn read_failed(&self, read: ReadRef<'s>, why: &Error) {
        let mut u = self.state.unreadable.lock().expect("lock");
        if !u.iter().any(|(id, _)| *id == read.pack) {
            u.push((read.pack, format!("{}: cannot be read: {why}", pack_path(&read.pack))));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::compress::Codec;
    use cairn_format::id::BlobId;
    use cairn_format::pack::BlobKind;

    fn pack(lengths: &[u32], tail: u64) -> IndexedPackInfo {
        let mut offset = 0;
        let blobs = lengths
            .iter()
            .enumerate()
            .map(|(i, &length)| {
                let b = BlobEntry {
                    id: BlobId([i as u8; 32]),
                    kind: BlobKind::Data,
                    codec: Codec::None,
                    offset,
                    length,
                    raw_length: length,
                };
                offset += length;
                b
            })
            .collect();
        IndexedPackInfo {
            id: PackId([9; 32]),
            salt: [0; 32],
            blobs,
            size: u64::from(offset) + tail,
            index_file: String::new(),
        }
    }

    const MIB: u32 = 1024 * 1024;

    #[test]
    fn pieces_cover_every_byte_once_and_every_blob() {
        let p = pack(&[300_000, MIB, 3 * MIB, 5 * MIB, 20_000, 700_000, MIB / 2], 5_000);
        for budget in [8 * u64::from(MIB), 16 * u64::from(MIB), 64 * u64::from(MIB)] {
            let (reads, states) = plan(&[&p], budget);
            let piece = (budget / 8).clamp(u64::from(MIB), MAX_READ);
            let mut at = 0;
            for r in &reads {
                assert_eq!(r.offset, at, "contiguous, in order");
                assert!(r.length <= piece || r.blobs.len() == 1, "{} > {piece}", r.length);
                let covered: u64 = r.blobs.iter().map(|b| u64::from(b.length)).sum();
                assert!(r.blobs.is_empty() || covered == r.length, "a read of blobs is exactly its blobs");
                at += r.length;
            }
            assert_eq!(at, p.size, "the header and trailer are read too");
            let blobs: usize = reads.iter().map(|r| r.blobs.len()).sum();
            assert_eq!(blobs, p.blobs.len());
            assert_eq!(states.len(), 1);
            assert_eq!(states[0].2.planned, p.size);
            assert!(states[0].2.hash.is_some());
        }
    }

    #[test]
    fn overlapping_blobs_are_read_but_not_hashed() {
        let mut p = pack(&[MIB, MIB, MIB], 100);
        p.blobs[2].offset -= 10;
        let (reads, states) = plan(&[&p], 16 * u64::from(MIB));
        assert_eq!(reads.iter().map(|r| r.blobs.len()).sum::<usize>(), 3);
        assert!(states[0].2.hash.is_none());
        assert_eq!(states[0].2.planned, reads.iter().map(|r| r.length).sum::<u64>());
    }
}
