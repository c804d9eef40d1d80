//! Work spread over a few scoped threads.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Calls `work(index, item)` for every item, on up to `threads` scoped threads taking the next
/// item as they become free.
pub fn in_parallel<T: Sync>(items: &[T], threads: usize, work: impl Fn(usize, &T) + Sync) {
    in_parallel_with(items, threads, || (), |_, i, item| work(i, item));
}

/// [`in_parallel`] where each thread keeps state of its own (buffers, open files): made by
/// `init` when the thread starts, handed to every `work(state, index, item)` on that thread.
pub fn in_parallel_with<T: Sync, S>(
    items: &[T],
    threads: usize,
    init: impl Fn() -> S + Sync,
    work: impl Fn(&mut S, usize, &T) + Sync,
) {
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, items.len().max(1)) {
            s.spawn(|| {
                let mut state = init();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(i) else { break };
                    work(&mut state, i, item);
                }
            });
        }
    });
}

/// `work` on every item of `items` on `threads` threads; the results in the items' order.
pub fn map_parallel<T: Sync, R: Send>(items: &[T], threads: usize, work: impl Fn(&T) -> R + Sync) -> Vec<R> {
    map_parallel_with(items, threads, || (), |_, item| work(item))
}

/// [`map_parallel`] where each thread keeps state of its own, as in [`in_parallel_with`].
pub fn map_parallel_with<T: Sync, S, R: Send>(
    items: &[T],
    threads: usize,
    init: impl Fn() -> S + Sync,
    work: impl Fn(&mut S, &T) -> R + Sync,
) -> Vec<R> {
    let slots: Vec<std::sync::Mutex<Option<R>>> = items.iter().map(|_| std::sync::Mutex::new(None)).collect();
    in_parallel_with(items, threads, init, |state, i, item| {
        *slots[i].lock().expect("result slot") = Some(work(state, item))
    });
    slots.into_iter().map(|s| s.into_inner().expect("result slot").expect("every item was worked on")).collect()
}
