//! Reading ahead of a consumer by a bounded window: a list of reads whose blobs a consumer
//! takes in order (a dump's stream, a mounted file read sequentially) is handed to the fetch
//! workers at most `window` reads ahead of the last one the consumer has reached, so the
//! blobs waiting for it stay within a fixed number of reads however long the list is.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::error::Result;
use cairn_format::id::BlobId;
use cairn_format::index::Index;

#[cfg(doc)]
use super::Reader;
use super::{PackRead, MAX_READ};

/// How far a consumer has got through a list of reads.
#[derive(Default)]
pub struct Pace {
    reached: Mutex<usize>,
    moved: Condvar,
}

impl Pace {
    /// The consumer has reached read `n` (it takes the blobs of read `n` next, or is taking
    /// them): reads up to `n + window - 1` may be in flight. Never moves back.
    pub fn reach(&self, n: usize) {
        let mut reached = self.reached.lock().expect("pace lock");
        if n > *reached {
            *reached = n;
            self.moved.notify_all();
        }
    }
}

impl Pace {
    /// Wakes a feed waiting for the consumer, so it sees at once that it was told to stop
    /// (the caller sets its stop condition first); else it notices within 100 ms.
    pub fn wake(&self) {
        let _reached = self.reached.lock().expect("pace lock");
        self.moved.notify_all();
    }
}

/// Hands `reads` out in order, at most `window` ahead of `pace`, until `stop` says to (a
/// cancelled [`Reader`]): the feed of [`Reader::start`] for a consumer that takes blobs in
/// order.
pub struct Paced<'s, F> {
    reads: std::slice::Iter<'s, PackRead>,
    sent: usize,
    window: usize,
    pace: &'s Pace,
    stop: F,
}

impl<'s, F: Fn() -> bool> Paced<'s, F> {
    /// A feed of `reads`, `window` (at least 1) reads ahead of `pace`.
    pub fn new(reads: &'s [PackRead], window: usize, pace: &'s Pace, stop: F) -> Self {
        Paced { reads: reads.iter(), sent: 0, window: window.max(1), pace, stop }
    }
}

impl<'s, F: Fn() -> bool> Iterator for Paced<'s, F> {
    type Item = &'s PackRead;
    fn next(&mut self) -> Option<&'s PackRead> {
        let mut reached = self.pace.reached.lock().expect("pace lock");
        while self.sent >= *reached + self.window {
            if (self.stop)() {
                return None;
            }
            reached = self.pace.moved.wait_timeout(reached, Duration::from_millis(100)).expect("pace lock").0;
        }
        self.sent += 1;
        self.reads.next()
    }
}

/// The reads that deliver `wanted` in order: consecutive blobs that lie in ascending order in
/// one pack, at most `gap` apart, share a read (within [`MAX_READ`]); a blob repeated right
/// after itself is read once. Fails naming the first blob no index lists.
pub fn ordered_reads(index: &Index, wanted: &[BlobId], gap: u64) -> Result<Vec<PackRead>> {
    let mut reads: Vec<PackRead> = Vec::new();
    let mut last = None;
    for id in wanted {
        if last == Some(*id) {
            continue;
        }
        last = Some(*id);
        let loc = index.get(id).ok_or_else(|| crate::engine::sorted_index::not_found(index, "blob", id))?;
        let b = loc.entry;
        let (start, end) = (u64::from(b.offset), u64::from(b.offset) + u64::from(b.length));
        if let Some(r) = reads.last_mut().filter(|r| r.pack == loc.pack) {
            let r_end = r.offset + r.length;
            // Only a blob after the read can join it (one before it starts a read of its own).
            let after = start >= r_end && start - r_end <= gap;
            if after && end - r.offset <= MAX_READ && r.raw_bytes() + u64::from(b.raw_length) <= MAX_READ {
                r.length = end - r.offset;
                r.blobs.push(b);
                continue;
            }
        }
        reads.push(PackRead::range(loc.pack, loc.salt, start, end - start, vec![b]));
    }
    Ok(reads)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::compress::Codec;
    use cairn_format::id::PackId;
    use cairn_format::index::IndexedPack;
    use cairn_format::pack::{BlobEntry, BlobKind};

    #[test]
    fn a_blob_before_the_current_read_in_its_pack_starts_a_read_of_its_own() {
        let blob = |n: u8, offset: u32| BlobEntry {
            id: BlobId([n; 32]),
            kind: BlobKind::Data,
            codec: Codec::None,
            offset,
            length: 100,
            raw_length: 84,
        };
        let pack = IndexedPack { id: PackId([1; 32]), salt: [0; 32], blobs: vec![blob(1, 0), blob(2, 1000)] };
        let index = Index::from_packs(vec![pack]);
        // The stream wants the later blob first (this used to underflow computing the length).
        let reads = ordered_reads(&index, &[BlobId([2; 32]), BlobId([1; 32]), BlobId([2; 32])], 4096).unwrap();
        let shape: Vec<(u64, u64)> = reads.iter().map(|r| (r.offset, r.length)).collect();
        assert_eq!(shape, [(1000, 100), (0, 1100)]);
    }

    #[test]
    fn the_feed_stays_a_window_ahead_of_the_consumer() {
        let reads: Vec<PackRead> =
            (0..5).map(|i| PackRead::range(PackId([0; 32]), [0; 32], i * 10, 10, Vec::new())).collect();
        let pace = Pace::default();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let mut feed = Paced::new(&reads, 2, &pace, || stop.load(std::sync::atomic::Ordering::Relaxed));
        assert_eq!(feed.next().map(|r| r.offset), Some(0));
        assert_eq!(feed.next().map(|r| r.offset), Some(10));
        std::thread::scope(|s| {
            // A third read would be two ahead of a consumer at read 0: it waits for the consumer.
            let t = std::time::Instant::now();
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(300));
                pace.reach(1);
            });
            assert_eq!(feed.next().map(|r| r.offset), Some(20));
            assert!(t.elapsed() >= Duration::from_millis(250));
        });
        pace.reach(0); // never moves back: read 3 is still one too far
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(feed.next().is_none());
    }
}
