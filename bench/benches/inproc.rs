//! In-process peers, one criterion binary: tollgate's warm acquire on `MemoryStore` against
//! the `governor` crate's keyed check (`DefaultKeyedRateLimiter<String>`, a dashmap of GCRA
//! cells), over the same keys in the same order.
//!
//! - Keys: `BENCH_KEYS` (default 10,000) entities `user-0` … `user-{N-1}`, all warm before
//!   the clock starts (tollgate: two acquires each, so every bucket exists and the config
//!   cache is filled; governor: one check each, so every cell exists).
//! - Order: one fixed pseudo-random permutation of the keys, walked round and round by both.
//! - Limit: tollgate `rps` at 1,000,000,000 per second on the resource (as
//!   `crates/tollgate/benches/acquire.rs`), governor 4,294,967,295 per second: nothing is
//!   ever refused, both measure the admit path.
//! - tollgate's acquire is an `async fn`. Each call's future is polled once inside a
//!   current-thread tokio runtime's context ([`poll_ready`]), as an `.await` inside a running
//!   task polls it: on MemoryStore nothing in a warm admitted acquire waits, so that one poll
//!   answers. A call that did wait would be driven to its end by the runtime (`block_on`);
//!   the counted pass below asserts none did. A `block_on` per call instead would charge
//!   each acquire with entering and leaving the runtime (about 3,000 instructions and a
//!   copy of the future, measured with callgrind on 2026-12-07), which neither a server's
//!   task nor governor's synchronous check pays.
//!
//! After criterion, one pass over every key with a counting allocator switched on prints
//! the allocations and bytes per operation of each side (`PEERS_ALLOC` lines, read by
//! `scripts/bench-peers`). The counter costs one relaxed load per allocation while off.
//!
//! The allocator under the counter is the `tollgate` binary's own (`tollgate-alloc`,
//! mimalloc), as in the DynamoDB benches: the bench measures the acquire as it runs in the
//! server. (Until 2026-12-07 it was the system allocator; at 10,000 keys the warm acquire
//! took 5.2–5.4 µs with it and 4.7–4.9 µs with mimalloc, alternating runs of a plain loop.)
//! governor's check allocates nothing, so its side is the same either way.

use std::alloc::{GlobalAlloc, Layout};
use std::future::Future;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use criterion::{black_box, Criterion};
use governor::{Quota, RateLimiter};
use tollgate::{Limit, Limiter, Scope};
use tollgate_store::MemoryStore;

const RESOURCE: &str = "api";
const LIMIT: &str = "rps";

/// The `tollgate` binary's allocator, counting allocations while `COUNTING` is on.
struct CountingAlloc;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

fn note(size: usize) {
    if COUNTING.load(Ordering::Relaxed) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(size as u64, Ordering::Relaxed);
    }
}

/// What the counter forwards to.
static INNER: tollgate_alloc::Mimalloc = tollgate_alloc::Mimalloc;

// SAFETY: every call is forwarded unchanged to `INNER`; the counters have no effect on it.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        INNER.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        INNER.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        INNER.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        INNER.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// The keys, and the order both sides visit them in.
struct Keys {
    names: Vec<String>,
    order: Vec<usize>,
}

impl Keys {
    fn new(n: usize) -> Self {
        debug_assert!(n > 0, "at least one key");
        let names = (0..n).map(|i| format!("user-{i}")).collect();
        // Fisher-Yates with a fixed xorshift64 seed: the same order on every run.
        let mut order: Vec<usize> = (0..n).collect();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for i in (1..n).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
        Keys { names, order }
    }

    /// The key at step `i` of the walk.
    fn at(&self, i: usize) -> &str {
        &self.names[self.order[i % self.order.len()]]
    }
}

/// Calls whose first poll did not answer (driven to their end by `block_on` instead).
static WAITED: AtomicU64 = AtomicU64::new(0);

/// `fut`'s output: polled once in `rt`'s context with a waker that does nothing, as a task
/// polls what it awaits; should it wait, `rt.block_on` drives it from where it stopped.
fn poll_ready<F: Future>(rt: &tokio::runtime::Runtime, fut: F) -> F::Output {
    let _in_runtime = rt.enter();
    let mut fut = std::pin::pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => {
            WAITED.fetch_add(1, Ordering::Relaxed);
            rt.block_on(fut)
        }
    }
}

fn key_count() -> usize {
    std::env::var("BENCH_KEYS")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(10_000)
}

/// Allocations and bytes per operation over one pass of `n` operations.
fn count_allocs(n: usize, mut op: impl FnMut(usize)) -> (f64, f64) {
    ALLOCS.store(0, Ordering::Relaxed);
    BYTES.store(0, Ordering::Relaxed);
    COUNTING.store(true, Ordering::Relaxed);
    for i in 0..n {
        op(i);
    }
    COUNTING.store(false, Ordering::Relaxed);
    let per = |v: u64| v as f64 / n as f64;
    (
        per(ALLOCS.load(Ordering::Relaxed)),
        per(BYTES.load(Ordering::Relaxed)),
    )
}

fn main() {
    let keys = Keys::new(key_count());
    let n = keys.names.len();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");

    let lim = Limiter::new(Arc::new(MemoryStore::new())).expect("limiter");
    rt.block_on(async {
        let limit = Limit::per_second(LIMIT, 1_000_000_000).expect("a valid constant limit");
        lim.admin()
            .set_limits(&Scope::Resource(RESOURCE.into()), &[limit])
            .await
            .expect("set limits");
        for _ in 0..2 {
            for i in 0..n {
                lim.acquire(keys.at(i), RESOURCE, &[(LIMIT, 1)])
                    .await
                    .expect("warm-up acquire admitted");
            }
        }
    });
    let tollgate_op = |i: usize| {
        let lease =
            poll_ready(&rt, lim.acquire(keys.at(i), RESOURCE, &[(LIMIT, 1)])).expect("admitted");
        black_box(lease);
    };

    let quota = Quota::per_second(NonZeroU32::MAX);
    let gov = RateLimiter::<String, _, _>::keyed(quota);
    for name in &keys.names {
        gov.check_key(name).expect("governor admits");
    }
    let governor_op = |i: usize| {
        let r = gov.check_key(&keys.names[keys.order[i % n]]);
        debug_assert!(r.is_ok(), "governor refused under a limit of u32::MAX/s");
        let _ = black_box(r);
    };

    let mut c = Criterion::default().configure_from_args();
    {
        let mut g = c.benchmark_group("peers_inproc");
        g.bench_function("tollgate_warm_acquire_memory", |b| {
            let mut i = 0usize;
            b.iter(|| {
                tollgate_op(i);
                i = i.wrapping_add(1);
            })
        });
        g.bench_function("governor_keyed_check", |b| {
            let mut i = 0usize;
            b.iter(|| {
                governor_op(i);
                i = i.wrapping_add(1);
            })
        });
        g.finish();
    }
    c.final_summary();

    WAITED.store(0, Ordering::Relaxed);
    let (ta, tb) = count_allocs(n, tollgate_op);
    assert_eq!(
        WAITED.load(Ordering::Relaxed),
        0,
        "a warm acquire on MemoryStore waited: the bench no longer measures one poll"
    );
    let (ga, gb) = count_allocs(n, governor_op);
    println!("PEERS_KEYS {n}");
    println!("PEERS_ALLOC tollgate allocs_per_op={ta:.2} bytes_per_op={tb:.0}");
    println!("PEERS_ALLOC governor allocs_per_op={ga:.2} bytes_per_op={gb:.0}");
}
