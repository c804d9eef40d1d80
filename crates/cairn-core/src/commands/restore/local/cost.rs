//! Whether a range is cheaper copied from a local file or read from the repository (issue 38).
//!
//! Local data saves bytes on the link, but costs reading, hashing and writing them here; a
//! repository that is itself a local directory (or a fast link) may deliver the same range
//! sooner. The copy runs beside the fetches (`copy.rs`), so each range — the chunks one file
//! needs that may be on this machine — is weighed with what the batches before measured of
//! each side on its own:
//!
//! ```text
//!     repository:  bytes / repository rate + latency / in flight   (remote)
//!     local:       bytes / local rate + failed share × repository
//! ```
//!
//! The local rate is what the copy wrote per second, from the copy's start until the last of
//! the chunks it found changed (fetched after all) was handed on: reading, hashing, writing,
//! and the wait for those chunks, which where a request is dear is most of the copy's cost
//! (MinIO on this machine spends about 0.8 ms of CPU on a small GET, on the cores the restore
//! uses). The scan, which only takes the status of files of the snapshot's size and time, is
//! not in it. The repository rate is the bytes of the planned reads' blobs per second from the
//! start of the pipeline to the last of them handed to the writers (fetching, decoding,
//! verifying). The copy's failed chunks are not in its bytes; their reads, which the feed hands
//! out before the planned ones waiting, may be in its time (where they are many, the rate is
//! low by that much).
//!
//! One more range fetched from a remote repository costs at least one more read, whose round
//! trip the reads in flight share. A local repository's round trip (under [`NEAR`]) is left to
//! its measured rate, which holds its reads' calls: counted again, it tipped the smallest files
//! of `many` (a tenth changed, 0 ms) to be copied from batches the repository won, and their
//! changed chunks were then read apart from the planned reads. A range copied costs its copy,
//! and the fetch of the share of its chunks that turn out changed (the share the last batch
//! that copied found): with a tenth of a million small files changed, a local repository about
//! as fast as the local files is the cheaper way. Both terms hold the failed chunks, on
//! purpose: the local rate holds the wait for the last of them after the copy (what their
//! requests cost), the second term their bytes at the repository's rate; where requests are
//! cheap the wait is near nothing. A side is measured once it moved
//! [`MEASURED_BYTES`] in a batch.
//!
//! A rate not yet measured favours local data: it is the one that saves the link. So that a
//! local repository (a round trip under [`NEAR`]) faster than the local files can show it, a
//! batch that has not measured the repository yet (and is at least [`PROBED_BATCH`] times
//! [`MEASURED_BYTES`] large) sends its first ranges to it until they reach [`MEASURED_BYTES`]
//! (enough to measure): fetched beside the copy, they cost the batch little time, and a local
//! repository no link's bytes. A remote one is not probed: its bytes are what local data saves,
//! and its ranges are fetched only when its measured rate says so (a batch whose changed chunks
//! it fetched as planned reads measures it). Probing a local repository in every batch, each
//! way measured over the time both ran, was tried and not kept (DESIGN.md, "Copy or fetch").
//!
//! [`RestoreOptions::local_cost`](crate::commands::restore::RestoreOptions::local_cost) (the
//! CLI's `CAIRN_LOCAL_COST=local` or `=repository`, for tests) forces the choice: every range
//! copied locally where found, or every range fetched.

use std::time::Duration;

pub use crate::commands::restore::options::LocalCost as Choice;

/// Bytes a side must have moved in a batch before its rate is taken as measured: less is
/// mostly its start-up (a few files opened, the first read's round trip).
pub const MEASURED_BYTES: u64 = 8 * 1024 * 1024;

/// A probe takes about this share of its batch (1 / PROBED_BATCH; up to twice that, as the
/// last range probed may take it past [`MEASURED_BYTES`] by up to as much): a smaller batch is
/// not probed.
pub const PROBED_BATCH: u64 = 8;

/// A round trip shorter than this is a local repository's (or a LAN's): probed while its
/// rate is not measured (see the module doc).
pub use crate::engine::storage::NEAR;

/// What the batches so far measured of both ways, and the forced choice if any.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Costs {
    /// Bytes per second the copy wrote (`None`: not measured yet).
    pub local_rate: Option<f64>,
    /// Bytes per second the fetched blobs wrote (`None`: not measured yet).
    pub repository_rate: Option<f64>,
    /// The repository's round-trip floor (`None`: not measured yet).
    pub latency: Option<Duration>,
    /// Reads the fetch stage keeps in flight.
    pub in_flight: usize,
    /// The choice made whatever the rates (`RestoreOptions::local_cost`).
    pub forced: Option<Choice>,
    /// The share of the chunks the last batch that copied set out to copy that failed (changed
    /// since the backup) and were fetched after all (`None`: not measured yet).
    pub failed: Option<f64>,
}

impl Costs {
    /// Which is cheaper for a range of `bytes`.
    pub fn choose(&self, bytes: u64) -> Choice {
        if let Some(c) = self.forced {
            return c;
        }
        let (Some(local), Some(repo)) = (self.local_rate, self.repository_rate) else {
            return Choice::Local;
        };
        let bytes = bytes as f64;
        // A local repository's round trip is in its measured rate (`near`).
        let round_trip = if self.near() {
            0.0
        } else {
            self.latency.unwrap_or_default().as_secs_f64() / self.in_flight.max(1) as f64
        };
        let fetch = bytes / repo.max(1.0) + round_trip;
        // A range set out to be copied costs its copy, and the fetch of its share that fails.
        let copy =
            bytes / local.max(1.0) + self.failed.filter(|f| f.is_finite()).unwrap_or(0.0).clamp(0.0, 1.0) * fetch;
        if copy <= fetch {
            Choice::Local
        } else {
            Choice::Repository
        }
    }

    /// Whether the repository is a local one (or a LAN's): its round trip is under [`NEAR`].
    pub fn near(&self) -> bool {
        self.latency.is_some_and(|l| l < NEAR)
    }

    /// Whether this batch probes the repository: its rate is not measured, nothing is forced,
    /// and its round trip is a local one.
    pub fn probes(&self) -> bool {
        self.forced.is_none() && self.repository_rate.is_none() && self.near()
    }

    /// For the ranges of one batch (their bytes, in order), whether each is copied (`true`)
    /// or fetched: by [`Costs::choose`], except that a probing batch ([`Costs::probes`]) of at
    /// least [`PROBED_BATCH`] times [`MEASURED_BYTES`] fetches its first ranges until they
    /// reach [`MEASURED_BYTES`], enough to measure (a range larger than that is not probed: a
    /// disk image is not fetched whole to measure the repository).
    pub fn choose_all(&self, ranges: &[u64]) -> Vec<bool> {
        let total: u64 = ranges.iter().sum();
        let mut probe = if self.probes() && total >= PROBED_BATCH * MEASURED_BYTES { MEASURED_BYTES } else { 0 };
        ranges
            .iter()
            .map(|&bytes| {
                if bytes > 0 && probe > 0 && bytes <= MEASURED_BYTES {
                    probe = probe.saturating_sub(bytes);
                    return false;
                }
                self.choose(bytes) == Choice::Local
            })
            .collect()
    }
}

/// `bytes` moved in `took`, as a rate once there were enough to measure.
pub fn rate(bytes: u64, took: Duration) -> Option<f64> {
    (bytes >= MEASURED_BYTES).then(|| bytes as f64 / took.as_secs_f64().max(1e-3))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1024.0 * 1024.0;

    fn costs(local: f64, repo: f64, latency_ms: u64, in_flight: usize) -> Costs {
        Costs {
            local_rate: Some(local * MIB),
            repository_rate: Some(repo * MIB),
            latency: Some(Duration::from_millis(latency_ms)),
            in_flight,
            forced: None,
            failed: None,
        }
    }

    #[test]
    fn the_share_that_fails_counts_against_copying() {
        // Local files a little faster than a local repository: copied while few chunks fail ...
        let c = costs(110.0, 100.0, 0, 4);
        assert_eq!(c.choose(1 << 20), Choice::Local);
        assert_eq!(Costs { failed: Some(0.05), ..c }.choose(1 << 20), Choice::Local);
        // ... fetched once the share that fails (and is fetched anyway) outweighs the gain.
        assert_eq!(Costs { failed: Some(0.1), ..c }.choose(1 << 20), Choice::Repository);
        // A remote repository at 50 ms, local files 20 times faster: copied even if half fail.
        let far = Costs { failed: Some(0.5), ..costs(300.0, 15.0, 50, 64) };
        assert_eq!(far.choose(16 << 10), Choice::Local);
        // Not measured yet: no share; a share out of range is clamped.
        assert_eq!(Costs { failed: Some(f64::NAN), ..c }.choose(1 << 20), Choice::Local);
    }

    #[test]
    fn a_fast_local_repository_wins_over_slow_local_files() {
        // A local repository on a fast disk, the source on a slow one: fetched.
        let c = costs(40.0, 300.0, 0, 4);
        assert_eq!(c.choose(1 << 20), Choice::Repository);
        assert_eq!(c.choose(100 << 20), Choice::Repository);
        // Local files faster than the repository delivers: copied.
        assert_eq!(costs(400.0, 250.0, 0, 4).choose(1 << 20), Choice::Local);
    }

    #[test]
    fn a_local_repositorys_round_trip_is_in_its_rate_not_added() {
        // A repository 0.5 ms away, a read at a time, slightly faster per byte than the local
        // files: a 4 KiB range is fetched (its round trip is in the measured rate); were the
        // round trip added on top, the copy would win by far.
        let near = Costs { latency: Some(Duration::from_micros(500)), ..costs(100.0, 110.0, 0, 1) };
        assert!(near.near());
        assert_eq!(near.choose(4 << 10), Choice::Repository);
        // At 20 ms the round trip counts: the same range is copied.
        let far = Costs { latency: Some(Duration::from_millis(20)), ..near };
        assert_eq!(far.choose(4 << 10), Choice::Local);
    }

    #[test]
    fn round_trips_tip_small_ranges_to_local_data() {
        // A link slightly faster per byte than the local disk, but 20 ms per request shared by
        // 32 reads: a small range is dominated by its round trip and copied; a large one is
        // dominated by its bytes and fetched.
        let c = costs(100.0, 110.0, 20, 32);
        assert_eq!(c.choose(64 << 10), Choice::Local);
        assert_eq!(c.choose(1 << 30), Choice::Repository);
        // With no latency the faster per byte wins at every size.
        let c = costs(100.0, 110.0, 0, 32);
        assert_eq!(c.choose(64 << 10), Choice::Repository);
    }

    #[test]
    fn unmeasured_rates_favour_local_data_and_forcing_overrides_everything() {
        let mut c = costs(10.0, 1000.0, 0, 4);
        c.repository_rate = None;
        assert_eq!(c.choose(1 << 20), Choice::Local, "the repository's rate not measured yet");
        let mut c = costs(10.0, 1000.0, 0, 4);
        c.local_rate = None;
        assert_eq!(c.choose(1 << 20), Choice::Local, "the local rate not measured yet");
        let c = Costs { forced: Some(Choice::Local), ..costs(10.0, 1000.0, 0, 4) };
        assert_eq!(c.choose(1 << 30), Choice::Local);
        let c = Costs { forced: Some(Choice::Repository), ..costs(1000.0, 10.0, 50, 1) };
        assert_eq!(c.choose(1), Choice::Repository);
        assert_eq!(Choice::parse("local"), Some(Choice::Local));
        assert_eq!(Choice::parse("repository"), Some(Choice::Repository));
        assert_eq!(Choice::parse(""), None);
        assert_eq!(Choice::parse("repo"), None);
    }

    #[test]
    fn a_local_repository_is_probed_in_a_large_batch_until_measured() {
        let mib = 1u64 << 20;
        let near = Costs { latency: Some(Duration::from_micros(50)), in_flight: 4, ..Costs::default() };
        assert!(near.probes());
        // 100 ranges of 1 MiB: the first 8 fetched to measure the repository, the rest copied.
        let chosen = near.choose_all(&[mib; 100]);
        assert_eq!(chosen.iter().filter(|&&c| !c).count(), 8);
        assert!(chosen[..8].iter().all(|&c| !c) && chosen[8..].iter().all(|&c| c));
        // Empty ranges take nothing from the probe, nor do ranges larger than it (a disk image
        // is not fetched whole to measure the repository); the last range probed may take it
        // past MEASURED_BYTES, so that what it fetched is enough to measure.
        let chosen = near.choose_all(&[0, 64 * mib, mib, 8 * mib, mib]);
        assert_eq!(chosen, [true, true, false, false, true]);
        let probed: u64 = [3 * mib / 2; 80]
            .iter()
            .zip(near.choose_all(&[3 * mib / 2; 80]))
            .map(|(b, c)| if c { 0 } else { *b })
            .sum();
        assert!((MEASURED_BYTES..MEASURED_BYTES + 3 * mib / 2).contains(&probed), "{probed}");
        // A batch smaller than eight probes is not probed.
        assert!(near.choose_all(&[mib; 60]).iter().all(|&c| c));
        // Measured, a slow repository is not fetched from again; a fast one is.
        let measured = Costs { local_rate: Some(400.0 * MIB), repository_rate: Some(100.0 * MIB), ..near };
        assert!(!measured.probes());
        assert!(measured.choose_all(&[mib; 100]).iter().all(|&c| c));
        let fast = Costs { local_rate: Some(100.0 * MIB), repository_rate: Some(400.0 * MIB), ..near };
        assert!(fast.choose_all(&[mib; 100]).iter().all(|&c| !c), "a fast local repository wins");
        // A remote repository (20 ms) or a forced choice is never probed.
        let far = Costs { latency: Some(Duration::from_millis(20)), ..near };
        assert!(!far.probes());
        assert!(far.choose_all(&[mib; 100]).iter().all(|&c| c));
        assert!(!Costs { forced: Some(Choice::Local), ..near }.probes());
        // Nor one whose round trip is not known.
        assert!(!Costs { latency: None, ..near }.probes());
    }

    #[test]
    fn a_tenth_changed_at_20_and_50_ms_copies_every_range() {
        // What a batch with a tenth of the Linux tree changed measures: the copy writes about
        // 300 MiB/s; the changed chunks' small reads write 15 MiB/s across 64 in flight. The
        // tree's files (4-60 KiB) are all copied at 20 and 50 ms: the only bytes fetched are
        // the changed chunks.
        for ms in [20, 50] {
            let c = costs(300.0, 15.0, ms, 64);
            for kib in [4u64, 16, 60, 1024, 100 * 1024] {
                assert_eq!(c.choose(kib << 10), Choice::Local, "{kib} KiB at {ms} ms");
            }
            assert!(!c.probes());
        }
    }

    #[test]
    fn a_rate_needs_enough_bytes() {
        assert_eq!(rate(MEASURED_BYTES - 1, Duration::from_secs(1)), None);
        assert_eq!(rate(MEASURED_BYTES, Duration::from_secs(2)), Some(MEASURED_BYTES as f64 / 2.0));
        // A zero duration is not a division by zero.
        assert!(rate(MEASURED_BYTES, Duration::ZERO).is_some_and(f64::is_finite));
    }
}
