//! The memory budget: bytes in flight between fetch and the caller never exceed the budget
//! (a restore's or check's `--max-memory`).
//!
//! Only the fetch stage reserves (the fetched range plus the plaintext its blobs will decode
//! to); every later stage only releases, by dropping its [`Reservation`]. So the pipeline
//! cannot deadlock on the budget, and a single read larger than the whole budget still goes
//! through on its own.

use std::sync::{Condvar, Mutex};

/// A byte budget shared by the stages of one read (and, in a restore, its write stage).
pub struct Budget {
    limit: u64,
    state: Mutex<State>,
    freed: Condvar,
}

struct State {
    used: u64,
    /// Reservations waiting, and the smallest of them: a release wakes them only when that one
    /// fits (a wake-up per released blob cost 13% of a restore's CPU in futex calls).
    waiters: u32,
    smallest_wait: u64,
}

impl State {
    /// Whether `bytes` more would pass `limit` with others in flight (one reservation alone
    /// always fits, however large).
    fn full_for(&self, bytes: u64, limit: u64) -> bool {
        self.used > 0 && self.used + bytes > limit
    }
}

/// Bytes held against the budget until dropped.
pub struct Reservation<'b> {
    budget: &'b Budget,
    bytes: u64,
}

impl Budget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Self {
        Budget {
            limit,
            state: Mutex::new(State { used: 0, waiters: 0, smallest_wait: u64::MAX }),
            freed: Condvar::new(),
        }
    }

    /// Waits until `bytes` fit (or nothing else is in flight), then reserves them. Returns
    /// `None` if `stop()` says to give up while waiting.
    pub fn reserve(&self, bytes: u64, stop: impl Fn() -> bool) -> Option<Reservation<'_>> {
        let mut st = self.state.lock().expect("budget lock");
        while st.full_for(bytes, self.limit) {
            if stop() {
                return None;
            }
            st.waiters += 1;
            st.smallest_wait = st.smallest_wait.min(bytes);
            st = self.freed.wait_timeout(st, std::time::Duration::from_millis(100)).expect("budget lock").0;
            st.waiters -= 1;
            if st.waiters == 0 {
                st.smallest_wait = u64::MAX;
            }
        }
        st.used += bytes;
        Some(Reservation { budget: self, bytes })
    }

    /// Reserves `bytes` if they fit now (or nothing else is in flight), without waiting.
    pub fn try_reserve(&self, bytes: u64) -> Option<Reservation<'_>> {
        let mut st = self.state.lock().expect("budget lock");
        if st.full_for(bytes, self.limit) {
            return None;
        }
        st.used += bytes;
        Some(Reservation { budget: self, bytes })
    }

    /// Reserves `bytes` at once, even past the limit: for memory a later stage already holds
    /// and must not wait for (a decode worker's reused buffer: waiting there while the fetched
    /// reads it would free hold the budget could never end). Reservations made by waiting then
    /// wait until the total is back under the limit.
    pub fn force(&self, bytes: u64) -> Reservation<'_> {
        self.state.lock().expect("budget lock").used += bytes;
        Reservation { budget: self, bytes }
    }

    /// The budget's size.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes reserved right now.
    #[cfg(test)]
    pub fn used(&self) -> u64 {
        self.state.lock().expect("budget lock").used
    }
}

impl Reservation<'_> {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Splits `bytes` off into a reservation of their own.
    pub fn split(&mut self, bytes: u64) -> Self {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        Reservation { budget: self.budget, bytes }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            let mut st = self.budget.state.lock().expect("budget lock");
            st.used -= self.bytes;
            if st.waiters > 0 && (st.used == 0 || st.used.saturating_add(st.smallest_wait) <= self.budget.limit) {
                self.budget.freed.notify_all();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_release_and_oversize() {
        let b = Budget::new(100);
        let mut r = b.reserve(60, || false).unwrap();
        let part = r.split(20);
        assert_eq!(b.used(), 60);
        drop(r);
        assert_eq!(b.used(), 20);
        drop(part);
        let big = b.reserve(500, || false).unwrap();
        assert_eq!(b.used(), 500);
        assert!(b.reserve(1, || true).is_none());
        drop(big);
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn forced_reservations_pass_the_limit_and_hold_back_waiting_ones() {
        let b = Budget::new(100);
        let r = b.reserve(80, || false).unwrap();
        let forced = b.force(50);
        assert_eq!((b.used(), forced.bytes()), (130, 50));
        // Nothing more fits until the total is back under the limit.
        assert!(b.reserve(10, || true).is_none());
        drop(r);
        assert!(b.reserve(10, || true).is_some());
        drop(forced);
        assert_eq!(b.used(), 0);
    }
}
