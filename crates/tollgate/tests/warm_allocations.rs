//! Issue 17: a warm acquire on `MemoryStore` allocates at most a fixed number of times.
//!
//! A counting global allocator counts the allocations made on the test's own thread while
//! a switch is on. An allocation count is deterministic for a given build of the code (the
//! same calls allocate the same blocks), so it may be asserted; timings may not.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use tollgate::{Limit, Limiter, ManualClock, Scope};
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

/// Acquires before counting: the first creates the bucket, the next ones leave the item,
/// its previous version and the caches in their steady shape.
const WARM_UP: usize = 4;

/// Allocations of each of `n` warm acquires (the lease dropped included) of `names` on one
/// entity, after [`WARM_UP`] acquires, the clock moving `step_ms` before each.
fn allocations_per_acquire(names: &[&str], n: usize, step_ms: i64) -> Vec<u64> {
    allocations_on(MemoryStore::new(), names, n, step_ms)
}

/// [`allocations_per_acquire`] on `store`.
fn allocations_on(store: MemoryStore, names: &[&str], n: usize, step_ms: i64) -> Vec<u64> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    let clock = Arc::new(ManualClock::new(1_767_225_600_000));
    let lim = Limiter::builder(Arc::new(store))
        .clock(clock.clone())
        .build()
        .expect("limiter");
    let limits: Vec<Limit> = names
        .iter()
        .map(|x| Limit::per_second(x, 1_000_000_000).expect("a valid limit"))
        .collect();
    let amounts: Vec<(&str, i64)> = names.iter().map(|x| (*x, 1)).collect();
    rt.block_on(async {
        lim.admin()
            .set_limits(&Scope::Resource("api".into()), &limits)
            .await
            .expect("set limits");
        for _ in 0..WARM_UP {
            clock.advance(step_ms);
            lim.acquire("user-1", "api", &amounts)
                .await
                .expect("warm-up acquire admitted");
        }
        let mut per = Vec::with_capacity(n);
        for _ in 0..n {
            clock.advance(step_ms);
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

/// The largest count, and that every acquire allocated the same number of times.
fn steady(what: &str, v: &[u64]) -> u64 {
    let max = v.iter().copied().max().unwrap_or(u64::MAX);
    assert!(
        v.iter().all(|x| *x == max),
        "{what}: every warm acquire allocates alike: {v:?}"
    );
    max
}

/// The count most acquires made: with the change feed on, the log's buffer grows now and
/// then (one more allocation on that acquire).
fn typical(v: &[u64]) -> u64 {
    let mut counts = std::collections::BTreeMap::new();
    for x in v {
        *counts.entry(*x).or_insert(0usize) += 1;
    }
    counts
        .into_iter()
        .max_by_key(|(x, n)| (*n, std::cmp::Reverse(*x)))
        .map_or(u64::MAX, |(x, _)| x)
}

#[test]
fn warm_acquire_allocation_count_is_bounded() {
    let one = ["rpm"];
    let three = ["rpm", "tpm", "rpd"];
    // 1 ms between acquires: each one materialises the refill (the rf-locked write planned
    // from the image the last write returned). The same instant: the speculative write.
    let slow_1 = steady("1 limit, 1 ms apart", &allocations_per_acquire(&one, 50, 1));
    let slow_3 = steady(
        "3 limits, 1 ms apart",
        &allocations_per_acquire(&three, 50, 1),
    );
    let fast_1 = steady(
        "1 limit, same instant",
        &allocations_per_acquire(&one, 50, 0),
    );
    let fast_3 = steady(
        "3 limits, same instant",
        &allocations_per_acquire(&three, 50, 0),
    );
    // `serve` on the memory store keeps a change feed (for its aggregator): every write
    // also logs the item's old and new versions, so the update copies the item instead of
    // reusing the previous version's memory.
    let feed_1 = typical(&allocations_on(
        MemoryStore::with_change_feed(),
        &one,
        50,
        1,
    ));
    eprintln!(
        "allocations per warm acquire: 1 ms apart {slow_1} (1 limit) {slow_3} (3 limits); \
         same instant {fast_1} (1 limit) {fast_3} (3 limits); change feed on {feed_1} (1 limit)"
    );
    // What issue 17's work achieved (from 235 / 337 before it, 1 limit / 3 limits); the
    // rest is two copies of the item (the version kept, the `ALL_NEW` image returned), its
    // decoding, and the write's attribute names (see the note). Lower these bounds
    // when a change allocates less; never raise them without saying why.
    // Raised by 5 when the change feed landed: every bucket write also carries the usage
    // counters `rq` (ADD 1) and `wt` (the write's time), two more attribute names in the
    // write and two more attributes in each copy of the item (107/167/100/149 before).
    // Raised by up to 2 with ADR-151's bypass: every balance write carries the stamp term
    // `attribute_not_exists(bypass)` (its attribute name and condition node;
    // 112/172/105/154 before).
    // Lowered when a write's returned item came to be shared with MemoryStore instead of
    // copied (`Store::update_shared`; 114/174/107/155 before), when attribute names came to
    // be built once per limit and shared (`expr::Name`, `Limit::attr`; 64/106/56/85
    // before), and again when nothing on the path copied text any more (44/68/39/60 and 64
    // with the feed before): keys are shared (`Key`'s parts are `Arc<str>`, the image
    // shares the written key), the entity and resource come shared from the config cache,
    // limit names in evaluations and statuses are shared or inline, writes and conditions
    // are built in one allocation each, the image decodes its limits' fields on the stack,
    // the parameter hash SET again unchanged is not copied by the store, and the answers of
    // the fast and slow paths are no longer boxed. What remains (1 limit, 1 ms apart): the
    // amounts (2, then 1 when they become the request's shared slice: the lease shares it
    // instead of copying it, 2 more before), the bucket key (1), the plan's
    // evaluations (1), the write and its condition (2), the
    // store's boxed future (1), the decoded image (its limits map and `Arc`, 2), and the
    // lease (its statuses, held map and key, part: 4). Lowered by one when the bucket key
    // came from the image the path plans from instead of being formatted again
    // (16/22/18/24 before), and by one more on the slow path when the write stopped
    // restating the parameter hash the item holds (rule `writes::restates`: its value was
    // the hash's allocation; 15/21 before). Lowered again when the lease shared the
    // request's amounts instead of copying them (14/20/17/23 before).
    assert!(slow_1 <= 13, "1 limit, 1 ms apart: {slow_1} allocations");
    assert!(slow_3 <= 17, "3 limits, 1 ms apart: {slow_3} allocations");
    assert!(fast_1 <= 16, "1 limit, same instant: {fast_1} allocations");
    assert!(fast_3 <= 20, "3 limits, same instant: {fast_3} allocations");
    // With the change feed on, the update copies the item (the feed holds its versions):
    // 96 while attribute names were `String`s, one allocation each per copy; 64 since they
    // are `AttrName`s, inline up to 24 bytes; 34 since the path itself copies no text; 29
    // since an item is one flat vector (one allocation per copy, not one per B-tree node)
    // and the bucket key is not formatted again; 28 since the hash is not restated; 27
    // since the lease shares the request's amounts.
    assert!(
        feed_1 <= 27,
        "1 limit, change feed on: {feed_1} allocations"
    );
}

/// Entities under one resource's limits share that one copy of the limits (and of their
/// parameter hash): an acquire reads them, and a copy per entity was cold memory per
/// acquire at thousands of entities.
#[test]
fn entities_under_one_policy_share_its_limits() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let lim = Limiter::new(Arc::new(MemoryStore::new())).expect("limiter");
        lim.admin()
            .set_limits(
                &Scope::Resource("api".into()),
                &[Limit::per_second("rps", 1_000).expect("limit")],
            )
            .await
            .expect("set limits");
        let a = lim.acquire("a", "api", &[("rps", 1)]).await.expect("a");
        let b = lim.acquire("b", "api", &[("rps", 1)]).await.expect("b");
        let (la, lb) = (a.judged_by().expect("a's"), b.judged_by().expect("b's"));
        assert!(
            Arc::ptr_eq(&la, &lb),
            "two entities, one copy of the limits"
        );
        // An entity with limits of its own has its own copy.
        lim.admin()
            .set_limits(
                &Scope::Entity("c".into(), Some("api".into())),
                &[Limit::per_second("rps", 5).expect("limit")],
            )
            .await
            .expect("set entity limits");
        let c = lim.acquire("c", "api", &[("rps", 1)]).await.expect("c");
        let lc = c.judged_by().expect("c's");
        assert!(!Arc::ptr_eq(&la, &lc));
        assert_eq!(lc[..], [Limit::per_second("rps", 5).expect("limit")]);
    });
}
