//! How far apart two wanted blobs of a pack may lie and still share one ranged read, from what
//! the link costs (issue #18).
//!
//! Two reads cost two round trips; one read through the gap between them costs the gap's bytes
//! instead. With `in_flight` requests going side by side, one more round trip costs a restore
//! about `latency / in_flight` of wall time, and `gap` more bytes cost `gap / rate` at the rate
//! the fetch stage moves bytes. So a gap is worth reading through while
//!
//! ```text
//!     gap <= latency × rate / in_flight
//! ```
//!
//! On a local disk (a round trip of microseconds) that is less than the storage's fixed gap
//! ([`coalesce_gap`](super::coalesce_gap): 4 KiB, or 64 KiB for a remote store), which stays
//! the floor. At 20 ms per request it is hundreds of KiB, and a restore that fetches only
//! every tenth chunk of a pack (the rest copied from the source) reads through the chunks in
//! between: no more requests than fetching them all, more bytes fetched (reported as such),
//! but only the wanted blobs decoded. A read never grows past [`MAX_READ`].

use std::time::Duration;

use super::{coalesce_gap, MAX_READ};
use crate::engine::repository::Repository;
use cairn_format::index::BlobLocation;

/// The rate assumed before the fetch stage has measured one (the first batch of a restore):
/// about what one core decodes.
pub const PRIOR_RATE: f64 = 256.0 * 1024.0 * 1024.0;

/// What the planner knows of the link when it plans a batch's reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkCost {
    /// The round-trip floor measured so far (`Repository::link`).
    pub latency: Duration,
    /// Stored bytes per second the fetch stage moved in the last batch ([`PRIOR_RATE`] if
    /// none was measured).
    pub rate: f64,
    /// Reads the fetch stage keeps in flight (the tuned limit, or `--fetch-concurrency`).
    pub in_flight: usize,
}

impl LinkCost {
    /// The largest gap worth reading through rather than paying a round trip, at least `floor`
    /// (the storage's fixed gap) and at most [`MAX_READ`].
    pub fn gap(&self, floor: u64) -> u64 {
        let worth = self.latency.as_secs_f64() * self.rate / self.in_flight.max(1) as f64;
        // `as` saturates a float too large (or NaN, as 0) for u64.
        (worth as u64).max(floor).min(MAX_READ.max(floor))
    }
}

/// The coalescing gap chosen for one batch of reads, and from what (for `--profile`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GapChoice {
    /// The gap, in bytes.
    pub gap: u64,
    /// The storage's own gap ([`coalesce_gap`]), the least.
    pub floor: u64,
    /// What the link measured when the gap was chosen (`None`: nothing measured yet).
    pub cost: Option<LinkCost>,
}

/// The coalescing gap for reads of `repo`: its storage's own ([`coalesce_gap`]), widened
/// where the round trip measured so far costs more than the bytes between wanted blobs, at
/// `rate` stored bytes per second ([`PRIOR_RATE`] if not yet measured) with `in_flight` reads
/// side by side.
pub fn link_gap(repo: &Repository, rate: Option<f64>, in_flight: usize) -> GapChoice {
    let floor = coalesce_gap(repo);
    let cost = repo.link().latency().map(|latency| LinkCost { latency, rate: rate.unwrap_or(PRIOR_RATE), in_flight });
    GapChoice { gap: cost.map_or(floor, |c| c.gap(floor)), floor, cost }
}

/// The widest gap to read through that adds at most `share` of the wanted bytes: the gaps
/// between neighbouring blobs of `located` in each pack, narrowest first (all of one width
/// or none), while the bytes they add stay within `share` of the blobs' stored bytes. Where
/// most of a pack is copied from local data, reading through the gaps would fetch the bytes
/// the copy saves; this keeps them few and still saves the round trips of the narrowest gaps.
pub fn gap_within(located: &[BlobLocation], share: f64) -> u64 {
    let mut spans: Vec<(u32, u64, u64)> =
        located.iter().map(|l| (l.pack_no, u64::from(l.entry.offset), u64::from(l.entry.length))).collect();
    spans.sort_unstable();
    let wanted: u64 = spans.iter().map(|s| s.2).sum();
    let mut gaps: Vec<u64> =
        spans.windows(2).filter(|w| w[0].0 == w[1].0).map(|w| w[1].1.saturating_sub(w[0].1 + w[0].2)).collect();
    gaps.sort_unstable();
    let allowed = (wanted as f64 * share.max(0.0)) as u64;
    let (mut spent, mut widest) = (0u64, 0u64);
    for same in gaps.chunk_by(|a, b| a == b) {
        let cost = same[0].saturating_mul(same.len() as u64);
        if spent.saturating_add(cost) > allowed {
            break;
        }
        spent += cost;
        widest = same[0];
    }
    widest
}

#[cfg(test)]
mod tests {
    use super::super::coalesce;
    use super::*;
    use cairn_format::compress::Codec;
    use cairn_format::crypto::SALT_LEN;
    use cairn_format::id::{BlobId, PackId};
    use cairn_format::index::BlobLocation;
    use cairn_format::pack::{BlobEntry, BlobKind};

    /// Blobs of the given stored sizes laid end to end in packs of `per_pack` blobs.
    fn packs(sizes: &[u32], per_pack: usize) -> Vec<BlobLocation> {
        let mut offset = 0;
        sizes
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                if i % per_pack == 0 {
                    offset = 0;
                }
                let pack_no = (i / per_pack) as u32;
                let mut id = [0u8; 32];
                id[..8].copy_from_slice(&(i as u64).to_le_bytes());
                let entry = BlobEntry {
                    id: BlobId(id),
                    kind: BlobKind::Data,
                    codec: Codec::None,
                    offset,
                    length: len,
                    raw_length: len,
                };
                offset += len;
                BlobLocation { pack: PackId([pack_no as u8; 32]), pack_no, salt: [0; SALT_LEN], entry }
            })
            .collect()
    }

    #[test]
    fn a_tenth_of_the_chunks_at_20_ms_costs_no_more_reads_than_all_of_them() {
        // Chunks stored in 1-8 KiB (the Linux tree's average 3.4 KiB compressed), 4,000 in
        // packs of 500; every tenth wanted (its tenth of files changed).
        let sizes: Vec<u32> = (0..4000u32).map(|i| 1024 + (i * 7919) % (7 * 1024)).collect();
        let all = packs(&sizes, 500);
        let tenth: Vec<_> = all.iter().step_by(10).copied().collect();
        let budget = 64 << 20;
        let everything = coalesce(all.clone(), budget, 4096).len();
        // With the local gap each wanted chunk is a read of its own: ten times the round trips.
        assert_eq!(coalesce(tenth.clone(), budget, 4096).len(), tenth.len());
        assert!(tenth.len() > 10 * everything, "{} vs {everything}", tenth.len());
        // At 20 ms with 32 in flight the gap is 160 KiB: the gaps are read through.
        let gap = cost(20, PRIOR_RATE, 32).gap(4096);
        let reads = coalesce(tenth.clone(), budget, gap);
        assert!(reads.len() <= everything, "{} reads against {everything}", reads.len());
        // And the bytes read stay within what fetching everything reads.
        let read_bytes: u64 = reads.iter().map(|r| r.length).sum();
        assert!(read_bytes <= sizes.iter().map(|&s| u64::from(s)).sum::<u64>());
    }

    #[test]
    fn with_local_data_a_tenth_of_the_chunks_fetches_little_more_than_them() {
        // As above: 4,000 chunks of 1-8 KiB stored, every tenth wanted (the rest copied from
        // local data). At 20 ms the link's gap would read through nearly everything; capped to
        // a quarter more than the wanted bytes, the reads fetch at most 0.125 of all the bytes
        // and still fewer reads than one per wanted chunk (the narrowest gaps are read through).
        let sizes: Vec<u32> = (0..4000u32).map(|i| 1024 + (i * 7919) % (7 * 1024)).collect();
        let all = packs(&sizes, 500);
        let every: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
        let tenth: Vec<_> = all.iter().step_by(10).copied().collect();
        // Every tenth at fixed steps leaves no narrow gap: take a few neighbours too.
        let tenth: Vec<_> = tenth.into_iter().chain(all.iter().skip(1).step_by(70).copied()).collect();
        let wanted: u64 = tenth.iter().map(|l| u64::from(l.entry.length)).sum();
        let link = cost(20, PRIOR_RATE, 16).gap(4096);
        let within = gap_within(&tenth, 0.25);
        assert!(within < link, "{within} against {link}");
        let reads = coalesce(tenth.clone(), 64 << 20, link.min(within));
        let fetched: u64 = reads.iter().map(|r| r.length).sum();
        assert!(fetched as f64 <= 1.25 * wanted as f64, "{fetched} fetched for {wanted}");
        assert!((fetched as f64) <= 0.15 * every as f64, "{fetched} of {every}");
        assert!(reads.len() < tenth.len(), "{} reads for {} chunks", reads.len(), tenth.len());
        // The link's own gap would have fetched most of the packs.
        let wide: u64 = coalesce(tenth, 64 << 20, link).iter().map(|r| r.length).sum();
        assert!(wide as f64 > 0.5 * every as f64, "{wide} of {every}");
    }

    #[test]
    fn gaps_are_taken_narrowest_first_and_all_of_one_width_or_none() {
        // Blobs of 100 bytes with gaps of 10, 10, 50 and 200 bytes.
        let at = |offset: u32| BlobLocation {
            pack: PackId([0; 32]),
            pack_no: 0,
            salt: [0; SALT_LEN],
            entry: BlobEntry {
                id: BlobId([offset as u8; 32]),
                kind: BlobKind::Data,
                codec: Codec::None,
                offset,
                length: 100,
                raw_length: 100,
            },
        };
        let locs: Vec<_> = [0, 110, 220, 370, 670].map(at).to_vec();
        // 500 bytes wanted: 4% allows the two gaps of 10, 14% the 50 as well, 100% all.
        assert_eq!(gap_within(&locs, 0.04), 10);
        assert_eq!(gap_within(&locs, 0.03), 0, "both gaps of 10 or neither");
        assert_eq!(gap_within(&locs, 0.14), 50);
        assert_eq!(gap_within(&locs, 1.0), 200);
        assert_eq!(gap_within(&[], 0.25), 0);
        // Blobs of another pack are no gap.
        let mut other = at(5000);
        other.pack_no = 1;
        assert_eq!(gap_within(&[at(0), other], 100.0), 0);
    }

    proptest::proptest! {
        /// With the widest gap, reading any subset of the blobs takes at most the reads that
        /// reading all of them takes, whatever gap those use: each read is cut only by
        /// MAX_READ and the budget, and a part of a read that fits fits too.
        #[test]
        fn at_the_widest_gap_a_subset_never_takes_more_reads(
            sizes in proptest::collection::vec(1u32..3_000_000, 1..300),
            keep in proptest::collection::vec(proptest::bool::ANY, 300),
            budget in 1u64..40_000_000,
            gap in 0u64..100_000,
        ) {
            let all = packs(&sizes, 40);
            let subset: Vec<_> = all.iter().zip(&keep).filter(|(_, k)| **k).map(|(l, _)| *l).collect();
            let widest = cost(200, f64::INFINITY, 1).gap(4096);
            proptest::prop_assert_eq!(widest, MAX_READ);
            proptest::prop_assert!(coalesce(subset, budget, widest).len() <= coalesce(all, budget, gap).len());
        }
    }

    fn cost(latency_ms: u64, rate: f64, in_flight: usize) -> LinkCost {
        LinkCost { latency: Duration::from_millis(latency_ms), rate, in_flight }
    }

    #[test]
    fn a_fast_link_keeps_the_storages_own_gap() {
        // No measured latency: the floor.
        assert_eq!(cost(0, 1e9, 4).gap(4096), 4096);
        let local = LinkCost { latency: Duration::from_micros(50), rate: 1e9, in_flight: 4 };
        // A local disk: 50 µs at 1 GB/s with 4 in flight is worth 12.5 KB.
        assert_eq!(local.gap(4096), 12_500);
        // MinIO on loopback: 1 ms, the prior rate, 32 in flight: less than S3's 64 KiB.
        assert_eq!(cost(1, PRIOR_RATE, 32).gap(64 * 1024), 64 * 1024);
    }

    #[test]
    fn round_trips_dear_against_bytes_read_through_wider_gaps() {
        // 20 ms, 256 MiB/s, 32 in flight: 160 KiB.
        assert_eq!(cost(20, PRIOR_RATE, 32).gap(4096), 167_772);
        // Fewer in flight make each round trip dearer: four times the gap at 8.
        assert_eq!(cost(20, PRIOR_RATE, 8).gap(4096), 671_088);
        // Never more than one read's worth, however slow the link.
        assert_eq!(cost(200, PRIOR_RATE, 1).gap(4096), MAX_READ);
        assert_eq!(cost(u64::MAX / 2_000_000, f64::INFINITY, 0).gap(4096), MAX_READ);
    }
}
