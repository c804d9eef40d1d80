//! Reused buffers for the read path's pack reads.
//!
//! A pack read of large blobs needs a buffer of up to 8 MiB. Fresh ones come from `mmap` and
//! cost a page fault and a page of zeroing for every 4 KiB touched, and freeing them hands the
//! pages back (restoring the 4 GiB `disk.img`, page faults and zeroing were 5% of the CPU). A
//! buffer taken here goes back to the pool when dropped, and the next read of a similar size
//! reuses it, pages already mapped. (Decompressed blobs are not pooled: restoring the Linux
//! tree, pooling them raised the peak RSS from about 255 to 300–345 MB for no gain.)
//!
//! The pool counts every buffer it hands out, large or small, in use or idle, and keeps idle
//! ones only while that total is within `limit` (the memory budget) and the idle ones
//! within [`IDLE_MAX`] (or a quarter of the budget); past either they are freed. Buffers in use
//! are covered by the budget, except for their rounding up to whole MiB and a reused buffer
//! being up to twice the size asked for; idle ones are not: the pipeline's buffers stay within
//! about `--max-memory` plus a quarter of it (at most 64 MiB).

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Buffers smaller than this go back to the allocator, which serves small sizes from memory
/// it already has. Pooled buffers are made in whole multiples of it, so a buffer fits the next
/// request of about the same size.
const POOL_UNIT: usize = 1024 * 1024;

/// Most bytes of idle buffers kept, or a quarter of the budget if that is less (32 MiB was too
/// few for `disk.img`: page faults 70k → 108k).
const IDLE_MAX: usize = 64 * 1024 * 1024;

/// A free buffer is reused for a request at least this fraction of its capacity (1/2), so a
/// small blob never holds a large buffer that the budget counts as small.
const FIT_DIVISOR: usize = 2;

/// Read buffers shared by the fetch and decode stages of one read and whoever takes its blobs.
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
    /// The capacity the pool counted when it handed the buffer out (whoever fills it may grow
    /// or replace the vector: `Storage::read_range_into` only promises to fill it).
    counted: usize,
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
                return self.hand_out(data);
            }
            // Nothing fits: make room by freeing idle buffers first.
            while self.allocated.load(Ordering::Relaxed) + len > self.limit {
                let Some(old) = free.bufs.pop() else { break };
                free.bytes -= old.capacity();
                self.allocated.fetch_sub(old.capacity(), Ordering::Relaxed);
            }
            let data = Vec::with_capacity(len.div_ceil(POOL_UNIT) * POOL_UNIT);
            self.allocated.fetch_add(data.capacity(), Ordering::Relaxed);
            return self.hand_out(data);
        }
        let data = Vec::with_capacity(len);
        self.allocated.fetch_add(data.capacity(), Ordering::Relaxed);
        self.hand_out(data)
    }

    /// Wraps a buffer that did not come from the pool (it is freed when dropped).
    pub fn adopt(data: Vec<u8>) -> Buf<'static> {
        Buf { data, pool: None, counted: 0 }
    }

    /// A counted buffer, handed out.
    fn hand_out(&self, data: Vec<u8>) -> Buf<'_> {
        let counted = data.capacity();
        Buf { data, pool: Some(self), counted }
    }

    /// Takes back a buffer counted as `counted` bytes when handed out.
    fn give(&self, data: Vec<u8>, counted: usize) {
        let cap = data.capacity();
        if cap < POOL_UNIT {
            self.allocated.fetch_sub(counted, Ordering::Relaxed);
            return; // small: freed
        }
        let mut free = self.free.lock().expect("buffer pool lock");
        let others = self.allocated.fetch_sub(counted, Ordering::Relaxed) - counted;
        if others + cap <= self.limit && free.bytes + cap <= self.idle_max() {
            self.allocated.fetch_add(cap, Ordering::Relaxed);
            free.bytes += cap;
            free.bufs.push(data);
        }
        // Otherwise (more than the limit handed out, or enough idle) it is freed.
    }

    /// Most idle bytes kept: [`IDLE_MAX`], or a quarter of a smaller budget.
    fn idle_max(&self) -> usize {
        IDLE_MAX.min(self.limit / 4)
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
            pool.give(std::mem::take(&mut self.data), self.counted);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_of_about_the_same_size_are_reused() {
        let pool = BufferPool::new(32 << 20);
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
    }

    #[test]
    fn the_pool_stays_within_its_limits() {
        // Limit 8 MiB: at most 2 MiB idle.
        let pool = BufferPool::new(8 << 20);
        drop(pool.take(2 << 20));
        assert_eq!(pool.allocated(), 2 << 20);
        // A request that would pass the limit frees idle buffers first.
        let d = pool.take(7 << 20);
        assert_eq!(pool.allocated(), 7 << 20);
        drop(d);
        assert_eq!(pool.allocated(), 0, "7 MiB is more than may be idle");
        // More in use at once than the limit: given back, only what may stay idle is kept.
        let many: Vec<_> = (0..6).map(|_| pool.take(2 << 20)).collect();
        assert_eq!(pool.allocated(), 12 << 20);
        drop(many);
        assert_eq!(pool.allocated(), 2 << 20);
        // However large the limit, at most IDLE_MAX bytes are kept idle.
        let roomy = BufferPool::new(1 << 30);
        let held: Vec<_> = (0..3 * IDLE_MAX / (8 << 20)).map(|_| roomy.take(8 << 20)).collect();
        drop(held);
        assert_eq!(roomy.allocated(), IDLE_MAX);
        // Small buffers are counted while in use, then freed.
        let s = pool.take(100 << 10);
        assert!(s.capacity() >= 100 << 10 && pool.allocated() >= (2 << 20) + (100 << 10));
        drop(s);
        assert_eq!(pool.allocated(), 2 << 20);
    }

    #[test]
    fn a_buffer_replaced_while_handed_out_is_counted_as_it_comes_back() {
        // A backend may fill the buffer by replacing the vector.
        let pool = BufferPool::new(16 << 20);
        let mut r = pool.take(2 << 20);
        *r = Vec::with_capacity(3 << 20);
        drop(r);
        assert_eq!(pool.allocated(), 3 << 20);
        let mut r = pool.take(3 << 20);
        *r = Vec::new();
        drop(r);
        assert_eq!(pool.allocated(), 0);
    }
}
