//! The decoded-blob cache: verified plaintext of data blobs, shared by every open file, kept
//! within a byte budget and evicted least recently used first. Read-ahead puts blobs here ahead
//! of the reader; a reader waiting for a blob that read-ahead is bringing waits here.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use cairn_format::id::BlobId;

/// A blob's plaintext, shared by the cache and the reads that copy out of it.
pub type Blob = Arc<Vec<u8>>;

/// Verified plaintext of recently read or read-ahead blobs, within a byte budget.
pub struct BlobCache {
    state: Mutex<State>,
    arrived: Condvar,
}

struct State {
    blobs: HashMap<BlobId, (Blob, u64)>,
    /// Blob IDs by when they were last used (the tick in `blobs`).
    by_use: BTreeMap<u64, BlobId>,
    tick: u64,
    bytes: u64,
    limit: u64,
}

impl BlobCache {
    /// A cache of at most `limit` bytes of plaintext (a blob larger than that is still kept,
    /// alone, until the next one arrives).
    pub fn new(limit: u64) -> Self {
        BlobCache {
            state: Mutex::new(State { blobs: HashMap::new(), by_use: BTreeMap::new(), tick: 0, bytes: 0, limit }),
            arrived: Condvar::new(),
        }
    }

    /// The blob, if it is here (it becomes the most recently used).
    pub fn get(&self, id: &BlobId) -> Option<Blob> {
        let mut st = self.state.lock().expect("cache lock");
        st.tick += 1;
        let tick = st.tick;
        let (blob, used) = st.blobs.get_mut(id)?;
        let (blob, old) = (blob.clone(), std::mem::replace(used, tick));
        st.by_use.remove(&old);
        st.by_use.insert(tick, *id);
        Some(blob)
    }

    /// Keeps `blob`, evicting the least recently used ones beyond the budget, and wakes the
    /// readers waiting for blobs.
    pub fn insert(&self, id: BlobId, blob: Blob) {
        let mut st = self.state.lock().expect("cache lock");
        if !st.blobs.contains_key(&id) {
            let len = blob.len() as u64;
            while st.bytes + len > st.limit {
                let Some((_, oldest)) = st.by_use.pop_first() else { break };
                if let Some((gone, _)) = st.blobs.remove(&oldest) {
                    st.bytes -= gone.len() as u64;
                }
            }
            st.tick += 1;
            let tick = st.tick;
            st.blobs.insert(id, (blob, tick));
            st.by_use.insert(tick, id);
            st.bytes += len;
        }
        drop(st);
        self.arrived.notify_all();
    }

    /// Drops `ids` (read ahead for a reader that is gone), leaving their room to others.
    pub fn remove(&self, ids: &[BlobId]) {
        let mut st = self.state.lock().expect("cache lock");
        for id in ids {
            if let Some((gone, used)) = st.blobs.remove(id) {
                st.by_use.remove(&used);
                st.bytes -= gone.len() as u64;
            }
        }
    }

    /// Waits for blob `id` to arrive until `give_up` says it will not (checked at least every
    /// 50 ms and after every arrival).
    pub fn wait(&self, id: &BlobId, give_up: impl Fn() -> bool) -> Option<Blob> {
        loop {
            if let Some(b) = self.get(id) {
                return Some(b);
            }
            if give_up() {
                // It may have arrived just before read-ahead ended.
                return self.get(id);
            }
            let st = self.state.lock().expect("cache lock");
            if st.blobs.contains_key(id) {
                continue;
            }
            drop(self.arrived.wait_timeout(st, Duration::from_millis(50)).expect("cache lock"));
        }
    }

    /// Wakes every waiting reader (read-ahead ended: they re-check whether to give up).
    pub fn wake(&self) {
        self.arrived.notify_all();
    }

    /// Bytes of plaintext held.
    #[cfg(test)]
    pub fn bytes(&self) -> u64 {
        self.state.lock().expect("cache lock").bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> BlobId {
        BlobId([n; 32])
    }

    #[test]
    fn least_recently_used_blobs_leave_first_within_the_budget() {
        let c = BlobCache::new(300);
        for n in 1..=3 {
            c.insert(id(n), Arc::new(vec![n; 100]));
        }
        assert!(c.get(&id(1)).is_some()); // 1 is now the most recently used
        c.insert(id(4), Arc::new(vec![4; 100]));
        assert!(c.get(&id(2)).is_none(), "the least recently used blob stays");
        assert_eq!(c.get(&id(1)).unwrap()[0], 1);
        assert!(c.get(&id(3)).is_some() && c.get(&id(4)).is_some());
        assert_eq!(c.bytes(), 300);
        // A blob larger than the budget evicts everything and is kept alone.
        c.insert(id(5), Arc::new(vec![5; 1000]));
        assert_eq!(c.bytes(), 1000);
        assert!(c.get(&id(1)).is_none());
    }

    #[test]
    fn a_waiter_wakes_when_its_blob_arrives_and_gives_up_when_told() {
        let c = BlobCache::new(1000);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(100));
                c.insert(id(7), Arc::new(vec![7; 10]));
            });
            assert_eq!(c.wait(&id(7), || false).unwrap().len(), 10);
        });
        assert!(c.wait(&id(8), || true).is_none());
    }
}
