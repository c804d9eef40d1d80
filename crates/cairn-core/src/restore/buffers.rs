//! Reused buffers for the pipeline's pack reads.
//!
//! A pack read of large blobs needs a buffer of up to 8 MiB. Fresh ones come from `mmap` and
//! cost a page fault and a page of zeroing for every 4 KiB touched, and freeing them hands the
//! pages back (restoring the 4 GiB `disk.img`, page faults and zeroing were 5% of the CPU). A
//! buffer taken here goes back to the pool when dropped, and the next read of a similar size
//! reuses it, pages already mapped. (Decompressed blobs are not pooled: restoring the Linux
//! tree, pooling them raised the peak RSS from about 255 to 300–345 MB for no gain.)
//!
//! The pool counts every buffer it hands out, large or small, in use or idle, and keeps idle
//! ones only while that total is within `limit` (the restore's memory budget) and the idle ones
//! within [`IDLE_MAX`]; past either they are freed. So the buffers never hold much more than
//! the budget lets into flight.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Buffers smaller than this go back to the allocator, which serves small sizes from memory
/// it already has. Pooled buffers are made in whole multiples of it, so a buffer fits the next
/// request of about the same size.
const POOL_UNIT: usize = 1024 * 1024;

/// Most bytes of idle buffers kept (32 MiB was too few for `disk.img`: page faults 70k → 108k).
const IDLE_MAX: usize = 64 * 1024 * 1024;

/// A free buffer is reused for a request at least this fraction of its capacity (1/2), so a
/// small blob never holds a large buffer that the budget counts as small.
const FIT_DIVISOR: usize = 2;

/// Read buffers shared by the fetch, decode and write stages of one restore.
pub struct BufferPool {
    limit: usize,
    /// Capacity of every buffer handed out and not freed: in use, or idle in `free`.
    allocated: AtomicUsize,
    free: Mutex<Idle>,
}

/// The idle buffers and their total capacity.
#[derive(Default)]
struct Idle {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

/// A buffer from a [`BufferPool`], handed back to it when dropped.
pub struct Buf<'p> {
    data: Vec<u8>,
    pool: Option<&'p BufferPool>,
}

impl BufferPool {
    /// A pool whose buffers take at most about `limit` bytes.
    pub fn new(limit: u64) -> Self {
        BufferPool {
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            allocated: AtomicUsize::new(0),
            free: Mutex::default(),
        }
    }

    /// An empty buffer with room for at least `len` bytes.
    pub fn take(&self, len: usize) -> Buf<'_> {
        if len >= POOL_UNIT {
            let mut free = self.free.lock().expect("buffer pool lock");
            let best = free
                .bufs
                .iter()
                .enumerate()
                .filter(|(_, b)| b.capacity() >= len && b.capacity() / FIT_DIVISOR <= len)
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i);
            if let Some(i) = best {
                let mut data = free.bufs.swap_remove(i);
                free.bytes -= data.capacity();
                data.clear();
                return Buf { data, pool: Some(self) };
            }
            // Nothing fits: make room by freeing idle buffers first.
            while self.allocated.load(Ordering::Relaxed) + len > self.limit {
                let Some(old) = free.bufs.pop() else { break };
                free.bytes -= old.capacity();
                self.allocated.fetch_sub(old.capacity(), Ordering::Relaxed);
            }
            let data = Vec::with_capacity(len.div_ceil(POOL_UNIT) * POOL_UNIT);
            self.allocated.fetch_add(data.capacity(), Ordering::Relaxed);
            return Buf { data, pool: Some(self) };
        }
        let data = Vec::with_capacity(len);
        self.allocated.fetch_add(data.capacity(), Ordering::Relaxed);
        Buf { data, pool: Some(self) }
    }

    /// Wraps a buffer that did not come from the pool (it is freed when dropped).
    pub fn adopt(data: Vec<u8>) -> Buf<'static> {
        Buf { data, pool: None }
    }

    fn give(&self, data: Vec<u8>) {
        let cap = data.capacity();
        if cap >= POOL_UNIT && self.allocated.load(Ordering::Relaxed) <= self.limit {
            let mut free = self.free.lock().expect("buffer pool lock");
            if free.bytes + cap <= IDLE_MAX {
                free.bytes += cap;
                free.bufs.push(data);
                return;
            }
        }
        // Small, more than the limit handed out, or enough idle: back to the allocator.
        self.allocated.fetch_sub(cap, Ordering::Relaxed);
    }

    /// Bytes of buffers handed out and not freed (in use or idle).
    #[cfg(test)]
    fn allocated(&self) -> usize {
        self.allocated.load(Ordering::Relaxed)
    }
}

impl Deref for Buf<'_> {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        &self.data
    }
}

impl DerefMut for Buf<'_> {
    fn deref_mut(&mut self) -> &mut Vec<u8> {
        &mut self.data
    }
}

impl Drop for Buf<'_> {
    fn drop(&mut self) {
        if let Some(pool) = self.pool {
            pool.give(std::mem::take(&mut self.data));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_and_the_pool_stays_within_its_limit() {
        let pool = BufferPool::new(8 << 20);
        // Pooled buffers are made in whole MiB.
        let a = pool.take(3_500_000);
        assert_eq!(a.capacity(), 4 << 20);
        let a_ptr = a.as_ptr();
        drop(a);
        assert_eq!(pool.allocated(), 4 << 20, "an idle buffer is kept");
        // A request of a similar size gets the same memory back.
        let b = pool.take(3_000_000);
        assert_eq!(b.as_ptr(), a_ptr);
        drop(b);
        // A request far smaller does not hold the big buffer.
        let c = pool.take(1_500_000);
        assert_ne!(c.as_ptr(), a_ptr);
        assert_eq!(c.capacity(), 2 << 20);
        drop(c);
        // Idle: 4 + 2 MiB. A request neither fits frees them rather than growing past the limit.
        let d = pool.take(5 << 20);
        assert_eq!(d.capacity(), 5 << 20);
        assert_eq!(pool.allocated(), 5 << 20);
        drop(d);
        // More in use at once than the limit: given back, the excess is freed.
        let many: Vec<_> = (0..6).map(|_| pool.take(2 << 20)).collect();
        assert!(pool.allocated() >= 12 << 20);
        drop(many);
        assert!(pool.allocated() <= 8 << 20, "allocated {}", pool.allocated());
        // However large the limit, at most IDLE_MAX bytes are kept idle.
        let roomy = BufferPool::new(1 << 30);
        let held: Vec<_> = (0..3 * IDLE_MAX / (8 << 20)).map(|_| roomy.take(8 << 20)).collect();
        drop(held);
        assert_eq!(roomy.allocated(), IDLE_MAX);
        // Small buffers are counted while in use, then freed.
        let before = pool.allocated();
        let s = pool.take(100 << 10);
        assert!(s.capacity() >= 100 << 10 && pool.allocated() >= before + (100 << 10));
        drop(s);
        assert_eq!(pool.allocated(), before);
    }
}
