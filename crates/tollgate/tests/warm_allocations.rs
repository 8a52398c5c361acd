//! Issue 17: a warm acquire on `MemoryStore` allocates at most a fixed number of times.
//!
//! A counting global allocator counts the allocations made on the test's own thread while
//! a switch is on. An allocation count is deterministic for a given build of the code (the
//! same calls allocate the same blocks), so it may be asserted; timings may not.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use tollgate::{Limit, Limiter, Scope};
use tollgate_store::MemoryStore;

/// The system allocator, counting this thread's allocations while `ON` is set.
struct Counting;

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    // `try_with`: the thread-locals may be gone while a thread shuts down.
    let _ = ON.try_with(|on| {
        if on.get() {
            let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        }
    });
}

// SAFETY: every call is forwarded unchanged to `System`; counting has no effect on it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations of each of `n` warm acquires (the lease dropped included) of `names` on one
/// entity, after two warm-up acquires.
fn allocations_per_acquire(names: &[&str], n: usize) -> Vec<u64> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    let lim = Limiter::new(Arc::new(MemoryStore::new())).expect("limiter");
    let limits: Vec<Limit> = names
        .iter()
        .map(|x| Limit::per_second(x, 1_000_000_000).expect("a valid limit"))
        .collect();
    let amounts: Vec<(&str, i64)> = names.iter().map(|x| (*x, 1)).collect();
    rt.block_on(async {
        lim.set_limits(&Scope::Resource("api".into()), &limits, None)
            .await
            .expect("set limits");
        for _ in 0..2 {
            lim.acquire("user-1", "api", &amounts)
                .await
                .expect("warm-up acquire admitted");
        }
        let mut per = Vec::with_capacity(n);
        for _ in 0..n {
            COUNT.with(|c| c.set(0));
            ON.with(|on| on.set(true));
            let lease = lim
                .acquire("user-1", "api", &amounts)
                .await
                .expect("admitted");
            drop(lease);
            ON.with(|on| on.set(false));
            per.push(COUNT.with(Cell::get));
        }
        per
    })
}

#[test]
fn warm_acquire_allocation_count_is_bounded() {
    let one = allocations_per_acquire(&["rpm"], 50);
    let three = allocations_per_acquire(&["rpm", "tpm", "rpd"], 50);
    eprintln!("allocations per warm acquire: 1 limit {one:?}, 3 limits {three:?}");
    let (one, three) = (max(&one), max(&three));
    assert!(one <= 1_000, "1 limit: {one} allocations per warm acquire");
    assert!(
        three <= 1_000,
        "3 limits: {three} allocations per warm acquire"
    );
}

fn max(v: &[u64]) -> u64 {
    v.iter().copied().max().unwrap_or(u64::MAX)
}
