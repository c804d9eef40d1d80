//! Plan stage: what becomes of every pack. Each blob the snapshots need is *claimed* in one
//! pack (the fullest that holds it, so duplicates end up unused); then a pack with no claimed
//! blob is deleted, one whose claimed blobs must change (recompress, `--repack-uncompressed`)
//! or that is small is repacked, and partly used packs, most wasteful first, are repacked while
//! the unused space left would be above `--max-unused`, within `--max-repack-size`.

use std::collections::BTreeMap;

use fixedbitset::FixedBitSet;
use serde::Serialize;

use crate::engine::blobset::BlobSet;
use crate::error::{Error, Result};
use cairn_format::compress::Codec;
use cairn_format::id::{BlobId, IdMap, IdSet, IndexId, PackId};
use cairn_format::index::{Index, IndexedPack};
use cairn_format::pack::BlobEntry;
use cairn_format::pack::{count_codec, CodecUse};

/// More small packs than this are merged even without `--repack-small`.
pub const SMALL_PACKS_MERGED_ABOVE: usize = 10;

/// How much unused space may stay in the repository.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    /// Any amount (partly used packs are never repacked for their unused space).
    Unlimited,
    /// At most this percentage of the repository's size after the prune.
    Percent(f64),
    /// At most this many bytes.
    Bytes(u64),
}

impl std::str::FromStr for Limit {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::Usage(format!("invalid limit {s:?}: give a percentage (5%), a size (10G) or `unlimited`"));
        let t = s.trim();
        if t.eq_ignore_ascii_case("unlimited") {
            return Ok(Limit::Unlimited);
        }
        if let Some(p) = t.strip_suffix('%') {
            let p: f64 = p.trim().parse().map_err(|_| bad())?;
            return if (0.0..100.0).contains(&p) {
                Ok(Limit::Percent(p))
            } else if p == 100.0 {
                Ok(Limit::Unlimited)
            } else {
                Err(bad())
            };
        }
        crate::engine::platform::parse_size(t).map(Limit::Bytes).map_err(|_| bad())
    }
}

impl Limit {
    /// Unused bytes allowed beside `used` bytes.
    fn allowed(self, used: u64) -> u64 {
        match self {
            Limit::Unlimited => u64::MAX,
            Limit::Bytes(b) => b,
            // unused <= p% of (used + unused)  <=>  unused <= used * p / (100 - p)
            Limit::Percent(p) => (used as f64 * p / (100.0 - p)) as u64,
        }
    }
}

/// Re-encoding stored blobs with another codec (`cairn recompress`).
#[derive(Clone, Debug)]
pub struct Recompress {
    /// The codec to store them with.
    pub to: Codec,
    /// Only these blobs (those of the chosen snapshots); `None`: every blob a snapshot needs.
    pub blobs: Option<IdSet<BlobId>>,
    /// Also try to compress blobs stored uncompressed (they are left alone by default: most
    /// are stored so because they did not compress, and would be tried again every time).
    pub include_uncompressed: bool,
}

impl Recompress {
    /// Whether blob `e` is to be re-encoded.
    pub fn selects(&self, e: &BlobEntry) -> bool {
        let codec_differs = match (e.codec, self.to) {
            (Codec::None, Codec::None) => false,
            (Codec::None, _) => self.include_uncompressed,
            (from, to) => from != to,
        };
        codec_differs && self.blobs.as_ref().is_none_or(|b| b.contains(&e.id))
    }
}

/// What the plan may do.
#[derive(Clone, Debug)]
pub struct PlanOptions {
    /// Unused space that may stay (in partly used packs that are not repacked).
    pub max_unused: Limit,
    /// Most bytes of packs to repack.
    pub max_repack: Option<u64>,
    /// Merge small packs even if there are few.
    pub repack_small: bool,
    /// Repack packs holding blobs stored uncompressed, compressing them.
    pub repack_uncompressed: bool,
    /// Re-encode blobs with another codec; then only the packs holding them are repacked and
    /// nothing else is deleted.
    pub recompress: Option<Recompress>,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            max_unused: Limit::Percent(5.0),
            max_repack: None,
            repack_small: false,
            repack_uncompressed: false,
            recompress: None,
        }
    }
}

impl PlanOptions {
    /// Whether blob `e`, copied by a repack, is re-encoded (not copied as stored).
    pub fn reencodes(&self, e: &BlobEntry) -> bool {
        match &self.recompress {
            Some(r) => r.selects(e),
            None => self.repack_uncompressed && e.codec == Codec::None,
        }
    }
}

/// What becomes of a pack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Fate {
    /// Stays as it is.
    Keep,
    /// Its needed blobs are copied into new packs, then it is deleted.
    Repack,
    /// Holds nothing needed: deleted.
    Delete,
}

/// One pack and its fate.
#[derive(Clone, Debug)]
pub struct PlannedPack {
    /// The pack as indexed (no blobs for a pack no index names).
    pub pack: IndexedPack,
    /// Its size in storage.
    pub size: u64,
    /// Its fate.
    pub fate: Fate,
    /// The blobs claimed in it (copied if it is repacked), as their numbers in `pack.blobs`:
    /// 4 bytes a blob, where copies of the entries took 56.
    pub(super) claimed: Vec<u32>,
}

impl PlannedPack {
    /// The blobs claimed in this pack: those it keeps, or copies if it is repacked.
    pub fn claimed(&self) -> impl Iterator<Item = &BlobEntry> + '_ {
        self.claimed.iter().map(|&n| &self.pack.blobs[n as usize])
    }

    /// How many blobs are claimed in this pack.
    pub fn claimed_count(&self) -> usize {
        self.claimed.len()
    }

    fn used_bytes(&self) -> u64 {
        self.claimed().map(|b| u64::from(b.length)).sum()
    }

    fn unused_bytes(&self) -> u64 {
        self.size.saturating_sub(self.used_bytes())
    }
}

/// The numbers of a plan.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PlanStats {
    /// Packs in storage.
    pub packs: u64,
    /// Bytes of packs in storage.
    pub size: u64,
    /// Blobs the snapshots need.
    pub used_blobs: u64,
    /// Stored bytes of those blobs (each counted once).
    pub used_bytes: u64,
    /// Bytes of packs not taken by needed blobs (unneeded and duplicate blobs, headers).
    pub unused_bytes: u64,
    /// Packs deleted outright, and their bytes.
    pub delete_packs: u64,
    /// See `delete_packs`.
    pub delete_bytes: u64,
    /// Packs in storage that no index names (counted in `delete_packs`).
    pub unindexed_packs: u64,
    /// Packs repacked, and their bytes.
    pub repack_packs: u64,
    /// See `repack_packs`.
    pub repack_bytes: u64,
    /// Stored bytes of the blobs copied out of repacked packs.
    pub copy_bytes: u64,
    /// Blobs re-encoded with another codec.
    pub reencode_blobs: u64,
    /// Packs kept as they are.
    pub keep_packs: u64,
    /// Unused bytes left in kept packs.
    pub unused_after: u64,
    /// Bytes of packs after the prune (estimated: re-encoded blobs may change size).
    pub size_after: u64,
    /// Needed blobs by codec.
    pub by_codec: BTreeMap<String, CodecUse>,
}

/// Every pack's fate.
#[derive(Debug)]
pub struct Plan {
    /// Indexed packs, then packs no index names.
    pub packs: Vec<PlannedPack>,
    /// The index files read (the prune replaces them).
    pub index_files: Vec<IndexId>,
    /// The numbers.
    pub stats: PlanStats,
}

impl Plan {
    /// Packs of `fate`.
    pub fn with_fate(&self, fate: Fate) -> impl Iterator<Item = &PlannedPack> {
        self.packs.iter().filter(move |p| p.fate == fate)
    }
}

/// Plans a prune of the packs `files` index (and `stored` holds, with their sizes), given the
/// blobs the snapshots need, marked by `index` (the index of `files`). Refuses if a needed
/// blob is in no pack in storage.
pub fn plan(
    files: Vec<(IndexId, Vec<IndexedPack>)>,
    stored: &IdMap<PackId, u64>,
    used: &BlobSet,
    index: &Index,
    opts: &PlanOptions,
    pack_size: u64,
) -> Result<Plan> {
    let index_files: Vec<IndexId> = files.iter().map(|(id, _)| *id).collect();
    let mut seen = IdSet::default();
    let mut packs: Vec<PlannedPack> = Vec::new();
    let mut missing = Vec::new();
    for pack in files.into_iter().flat_map(|(_, p)| p).filter(|p| seen.insert(p.id)) {
        match stored.get(&pack.id) {
            Some(&size) => packs.push(PlannedPack { pack, size, fate: Fate::Keep, claimed: Vec::new() }),
            None => missing.push(pack),
        }
    }
    let needed = |b: &BlobEntry| index.position(&b.id).filter(|&pos| used.at(pos));
    claim(&mut packs, index.len(), needed);
    let claimed: usize = packs.iter().map(|p| p.claimed.len()).sum();
    if claimed < used.len() {
        let lost = missing.iter().flat_map(|p| &p.blobs).filter(|b| needed(b).is_some()).count();
        return Err(Error::Refused(format!(
            "{} blobs the snapshots need are in no pack in storage ({lost} of them in {} packs the index names \
             but storage lacks); prune deletes nothing now: run `cairn check`, then `cairn repair index` or \
             `cairn repair snapshots`",
            used.len() - claimed,
            missing.len()
        )));
    }
    let unindexed: Vec<PlannedPack> = stored
        .iter()
        .filter(|(id, _)| !seen.contains(*id))
        .map(|(id, &size)| PlannedPack {
            pack: IndexedPack { id: *id, salt: [0; 32], blobs: Vec::new() },
            size,
            fate: Fate::Delete,
            claimed: Vec::new(),
        })
        .collect();
    decide(&mut packs, opts, pack_size);
    let stats = stats(&packs, &unindexed, used.len() as u64, opts);
    packs.extend(unindexed);
    Ok(Plan { packs, index_files, stats })
}

/// Claims each needed blob in one pack: packs with the most needed bytes first, so that a
/// blob stored twice is counted where it shares a pack with other needed blobs. `needed`
/// gives a needed blob's position in the index of `blobs` blobs (`None`: not needed).
fn claim(packs: &mut [PlannedPack], blobs: usize, needed: impl Fn(&BlobEntry) -> Option<usize>) {
    let needed_bytes = |p: &PlannedPack| -> u64 {
        p.pack.blobs.iter().filter(|b| needed(b).is_some()).map(|b| u64::from(b.length)).sum()
    };
    let mut order: Vec<(u64, usize)> = packs
        .iter()
        .enumerate()
        .map(|(i, p)| ((needed_bytes(p) as u128 * 1_000_000 / u128::from(p.size.max(1))) as u64, i))
        .collect();
    order.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(packs[a.1].pack.id.cmp(&packs[b.1].pack.id)));
    let mut taken = FixedBitSet::with_capacity(blobs);
    for (_, i) in order {
        let p = &mut packs[i];
        p.claimed = (0..p.pack.blobs.len() as u32)
            .filter(|&n| needed(&p.pack.blobs[n as usize]).is_some_and(|pos| !taken.put(pos)))
            .collect();
    }
}

/// Sets each indexed pack's fate.
fn decide(packs: &mut [PlannedPack], opts: &PlanOptions, pack_size: u64) {
    let mut budget = opts.max_repack.unwrap_or(u64::MAX);
    let repack = |p: &mut PlannedPack, budget: &mut u64| {
        if p.size <= *budget {
            *budget -= p.size;
            p.fate = Fate::Repack;
        }
    };
    for p in packs.iter_mut() {
        if p.claimed.is_empty() {
            p.fate = if opts.recompress.is_some() { Fate::Keep } else { Fate::Delete };
        } else if p.claimed().any(|b| opts.reencodes(b)) {
            repack(p, &mut budget);
        }
    }
    if opts.recompress.is_some() {
        return;
    }
    let small: Vec<usize> =
        (0..packs.len()).filter(|&i| packs[i].fate == Fate::Keep && packs[i].size < pack_size / 2).collect();
    if (opts.repack_small && small.len() >= 2) || small.len() > SMALL_PACKS_MERGED_ABOVE {
        for i in small {
            repack(&mut packs[i], &mut budget);
        }
    }
    let used: u64 = packs.iter().map(PlannedPack::used_bytes).sum();
    let allowed = opts.max_unused.allowed(used);
    let mut unused_after: u64 = packs.iter().filter(|p| p.fate == Fate::Keep).map(PlannedPack::unused_bytes).sum();
    let mut partly: Vec<usize> =
        (0..packs.len()).filter(|&i| packs[i].fate == Fate::Keep && packs[i].unused_bytes() > 0).collect();
    // Most wasteful first: the most space freed per byte copied.
    partly.sort_by(|&a, &b| {
        let share = |p: &PlannedPack| p.unused_bytes() as f64 / p.size.max(1) as f64;
        share(&packs[b]).total_cmp(&share(&packs[a])).then(packs[a].pack.id.cmp(&packs[b].pack.id))
    });
    for i in partly {
        if unused_after <= allowed {
            break;
        }
        repack(&mut packs[i], &mut budget);
        if packs[i].fate == Fate::Repack {
            unused_after -= packs[i].unused_bytes();
        }
    }
}

fn stats(packs: &[PlannedPack], unindexed: &[PlannedPack], used_blobs: u64, opts: &PlanOptions) -> PlanStats {
    let mut s = PlanStats { used_blobs, ..PlanStats::default() };
    for p in packs.iter().chain(unindexed) {
        s.packs += 1;
        s.size += p.size;
        s.used_bytes += p.used_bytes();
        s.unused_bytes += p.unused_bytes();
        for b in p.claimed() {
            count_codec(&mut s.by_codec, b);
        }
        match p.fate {
            Fate::Keep => {
                s.keep_packs += 1;
                s.unused_after += p.unused_bytes();
                s.size_after += p.size;
            }
            Fate::Delete => {
                s.delete_packs += 1;
                s.delete_bytes += p.size;
            }
            Fate::Repack => {
                s.repack_packs += 1;
                s.repack_bytes += p.size;
                s.copy_bytes += p.used_bytes();
                s.size_after += p.used_bytes();
                s.reencode_blobs += p.claimed().filter(|b| opts.reencodes(b)).count() as u64;
            }
        }
    }
    s.unindexed_packs = unindexed.len() as u64;
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::pack::BlobKind;

    fn blob(n: u8, len: u32, codec: Codec) -> BlobEntry {
        BlobEntry { id: BlobId([n; 32]), kind: BlobKind::Data, codec, offset: 0, length: len, raw_length: len }
    }

    fn pack(n: u8, blobs: Vec<BlobEntry>) -> IndexedPack {
        IndexedPack { id: PackId([n; 32]), salt: [0; 32], blobs }
    }

    /// Packs 1..: their blobs; each pack's size is its blobs' plus 100 bytes of header.
    fn run(packs: Vec<IndexedPack>, extra: &[(u8, u64)], used: &[u8], opts: &PlanOptions) -> Result<Plan> {
        let mut stored: IdMap<PackId, u64> =
            packs.iter().map(|p| (p.id, p.blobs.iter().map(|b| u64::from(b.length)).sum::<u64>() + 100)).collect();
        stored.extend(extra.iter().map(|&(n, size)| (PackId([n; 32]), size)));
        let index = Index::from_packs(&packs);
        let mut needed = BlobSet::new(&index);
        for &n in used {
            needed.insert(&index, BlobId([n; 32]));
        }
        plan(vec![(IndexId([0; 32]), packs)], &stored, &needed, &index, opts, 10_000)
    }

    fn fate(plan: &Plan, n: u8) -> Fate {
        plan.packs.iter().find(|p| p.pack.id == PackId([n; 32])).unwrap().fate
    }

    #[test]
    fn packs_are_kept_deleted_or_repacked_by_what_they_hold() {
        let z = Codec::Zstd(3);
        let packs = vec![
            pack(1, vec![blob(1, 9000, z), blob(2, 9000, z)]), // all needed
            pack(2, vec![blob(3, 9000, z)]),                   // nothing needed
            pack(3, vec![blob(4, 9000, z), blob(5, 9000, z)]), // half needed
        ];
        let p = run(packs.clone(), &[(9, 500)], &[1, 2, 4], &PlanOptions::default()).unwrap();
        assert_eq!(
            (fate(&p, 1), fate(&p, 2), fate(&p, 3), fate(&p, 9)),
            (Fate::Keep, Fate::Delete, Fate::Repack, Fate::Delete)
        );
        assert_eq!(p.stats.unindexed_packs, 1);
        assert_eq!(p.stats.copy_bytes, 9000);
        assert_eq!(p.stats.delete_bytes, 9100 + 500);
        // With unused space allowed, the half-used pack stays.
        let lax = PlanOptions { max_unused: Limit::Unlimited, ..PlanOptions::default() };
        assert_eq!(fate(&run(packs.clone(), &[], &[1, 2, 4], &lax).unwrap(), 3), Fate::Keep);
        // Within a repack budget smaller than the pack, it stays too.
        let capped = PlanOptions { max_repack: Some(1000), ..PlanOptions::default() };
        assert_eq!(fate(&run(packs, &[], &[1, 2, 4], &capped).unwrap(), 3), Fate::Keep);
    }

    #[test]
    fn a_duplicate_is_claimed_once_in_the_fuller_pack() {
        let z = Codec::Zstd(3);
        let packs = vec![pack(1, vec![blob(1, 9000, z), blob(7, 9000, z)]), pack(2, vec![blob(1, 9000, z)])];
        let p = run(packs, &[], &[1, 7], &PlanOptions::default()).unwrap();
        assert_eq!((fate(&p, 1), fate(&p, 2)), (Fate::Keep, Fate::Delete));
        assert_eq!(p.stats.used_bytes, 18_000);
    }

    #[test]
    fn a_needed_blob_in_no_stored_pack_refuses_the_prune() {
        let z = Codec::Zstd(3);
        let err = run(vec![pack(1, vec![blob(1, 10, z)])], &[], &[1, 2], &PlanOptions::default()).unwrap_err();
        assert!(matches!(err, Error::Refused(_)), "{err}");
        assert!(err.to_string().contains("1 blobs the snapshots need"), "{err}");
    }

    #[test]
    fn recompress_repacks_only_packs_with_blobs_of_another_codec() {
        let packs = vec![
            pack(1, vec![blob(1, 9000, Codec::Zstd(3))]),
            pack(2, vec![blob(2, 9000, Codec::Lz4)]),
            pack(3, vec![blob(3, 9000, Codec::None)]),
            pack(4, vec![blob(4, 9000, Codec::Lz4)]),
        ];
        let to_lz4 = |include_uncompressed| PlanOptions {
            recompress: Some(Recompress { to: Codec::Lz4, blobs: None, include_uncompressed }),
            ..PlanOptions::default()
        };
        let p = run(packs.clone(), &[], &[1, 2, 3], &to_lz4(false)).unwrap();
        let fates: Vec<Fate> = (1..=4).map(|n| fate(&p, n)).collect();
        // Pack 4 holds nothing needed, but recompress deletes nothing on its own.
        assert_eq!(fates, [Fate::Repack, Fate::Keep, Fate::Keep, Fate::Keep]);
        assert_eq!(fate(&run(packs, &[], &[1, 2, 3], &to_lz4(true)).unwrap(), 3), Fate::Repack);
    }

    #[test]
    fn many_small_packs_are_merged() {
        let z = Codec::Zstd(3);
        let few: Vec<_> = (1..=3).map(|n| pack(n, vec![blob(n, 100, z)])).collect();
        let ids: Vec<u8> = (1..=20).collect();
        let p =
            run(few.clone(), &[], &ids[..3], &PlanOptions { max_unused: Limit::Unlimited, ..PlanOptions::default() })
                .unwrap();
        assert_eq!(p.stats.repack_packs, 0, "three small packs are left alone");
        let asked = PlanOptions { max_unused: Limit::Unlimited, repack_small: true, ..PlanOptions::default() };
        assert_eq!(run(few, &[], &ids[..3], &asked).unwrap().stats.repack_packs, 3);
        let many: Vec<_> = (1..=20).map(|n| pack(n, vec![blob(n, 100, z)])).collect();
        let p = run(many, &[], &ids, &PlanOptions { max_unused: Limit::Unlimited, ..PlanOptions::default() }).unwrap();
        assert_eq!(p.stats.repack_packs, 20);
    }

    #[test]
    fn limits_parse() {
        assert_eq!("5%".parse::<Limit>().unwrap(), Limit::Percent(5.0));
        assert_eq!("unlimited".parse::<Limit>().unwrap(), Limit::Unlimited);
        assert_eq!("100%".parse::<Limit>().unwrap(), Limit::Unlimited);
        assert_eq!("1K".parse::<Limit>().unwrap(), Limit::Bytes(1024));
        assert!("150%".parse::<Limit>().is_err());
        assert!("lots".parse::<Limit>().is_err());
        assert_eq!(Limit::Percent(50.0).allowed(100), 100);
    }
}
