//! A long-lived reader fed from a queue: reads that become known only while the reader runs
//! (a mount's read-aheads, asked for as files are opened) go to one set of fetch and decode
//! workers instead of a reader of their own each.
//!
//! [`Reader::start`] hands the workers references to reads that must outlive them. A long-lived
//! caller keeps the reads of one *session* in [`Slots`], a fixed number of them: the feed
//! ([`Queued`]) takes each read from the caller's queue, keeps it in the next free slot and
//! ends the session when the slots are used up (or the queue says so). The workers then finish
//! what they hold and return, and the caller starts the next session over the same slots,
//! cleared, so the memory of the reads handed out stays bounded however long the reader runs;
//! the workers start anew only once per [`Slots::len`] reads.

use std::sync::OnceLock;

use super::PackRead;
#[cfg(doc)]
use super::Reader;

/// The reads of one session of a long-lived [`Reader`], kept while its workers run.
pub struct Slots {
    slots: Box<[OnceLock<PackRead>]>,
}

impl Slots {
    /// Room for `n` (at least 1) reads a session.
    pub fn new(n: usize) -> Self {
        Slots { slots: (0..n.max(1)).map(|_| OnceLock::new()).collect() }
    }

    /// Reads a session holds at most.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Always false: there is at least one slot.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

/// The feed of [`Reader::start`] for a long-lived reader: each read comes from `next`, which
/// may wait until there is one and returns `None` to end the session; it ends by itself when
/// the session's slots are used up.
pub struct Queued<'s, F> {
    slots: &'s Slots,
    used: usize,
    next: F,
}

impl<'s, F: FnMut() -> Option<PackRead>> Queued<'s, F> {
    /// A session over `slots` (emptied first: the last session's workers are gone, since
    /// `slots` is borrowed mutably here).
    pub fn new(slots: &'s mut Slots, next: F) -> Self {
        for s in slots.slots.iter_mut() {
            s.take();
        }
        Queued { slots, used: 0, next }
    }
}

impl<'s, F: FnMut() -> Option<PackRead>> Iterator for Queued<'s, F> {
    type Item = &'s PackRead;
    fn next(&mut self) -> Option<&'s PackRead> {
        let slot = self.slots.slots.get(self.used)?;
        let read = (self.next)()?;
        self.used += 1;
        // Every slot was emptied when the session began and each is filled once.
        Some(slot.get_or_init(|| read))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::id::PackId;

    fn read(offset: u64) -> PackRead {
        PackRead::range(PackId([0; 32]), [0; 32], offset, 1, Vec::new())
    }

    #[test]
    fn a_session_ends_when_its_slots_are_used_up_and_the_next_one_starts_empty() {
        let mut slots = Slots::new(3);
        let mut queue: std::collections::VecDeque<u64> = (0..5).collect();
        let first: Vec<u64> = Queued::new(&mut slots, || queue.pop_front().map(read)).map(|r| r.offset).collect();
        assert_eq!(first, [0, 1, 2]);
        // The queue still holds 3 and 4: the next session hands them out from its first slots.
        let second: Vec<u64> = Queued::new(&mut slots, || queue.pop_front().map(read)).map(|r| r.offset).collect();
        assert_eq!(second, [3, 4]);
        // An empty queue ends a session at once.
        assert_eq!(Queued::new(&mut slots, || None::<PackRead>).count(), 0);
    }
}
