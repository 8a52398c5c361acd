//! Many processes, one entity, one DynamoDB table: 32 tasks, each its own `Limiter` (own
//! caches, own shard draws) over one `DynamoDbStore` on DynamoDB Local, acquire 1 at a time
//! from an entity holding a quota of 200. Exactly the allowance is admitted — unsharded and
//! with the shard count forced to 8 — and, for a 5-hour window rolled over in the middle of
//! the run, exactly one allowance per window. The stored consumption counters (`b_{limit}_tc`
//! summed over the shard items) must agree with the admitted count.
//!
//! Every test uses a fresh, uniquely named table and deletes it at the end.

mod common;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate::{Error, Limit, Limiter, ManualClock, Options, Scope, SeededRng};
use tollgate_core::bucket::attr;
use tollgate_core::keys;
use tollgate_core::value::Value;
use tollgate_dynamodb::DynamoDbStore;
use tollgate_store::Store;

macro_rules! endpoint_or_skip {
    ($name:expr) => {
        match common::endpoint($name) {
            Some(e) => e,
            None => return,
        }
    };
}

/// 2025-09-04 15:33:20 UTC: the middle of a UTC day, far from the daily reset.
const T0: i64 = 1_757_000_000_000;
const ENTITY: &str = "hot";
const RESOURCE: &str = "api";
const TASKS: usize = 32;
/// Attempts per task per phase: 32 × 30 = 960 attempts for an allowance of 200, so every
/// shard is probed often enough for its whole share to be reachable.
const ATTEMPTS: usize = 30;
const ALLOWANCE: i64 = 200;
const FIVE_HOURS: Duration = Duration::from_secs(5 * 3600);

/// The outcome of one phase of the load.
#[derive(Debug, Default, Clone, Copy)]
struct Outcome {
    admitted: i64,
    refused: i64,
    other_errors: i64,
}

struct Rig {
    store: Arc<DynamoDbStore>,
    clock: Arc<ManualClock>,
    /// One limiter per task, kept across phases (their caches survive the rollover).
    limiters: Vec<Limiter>,
    limit: String,
}

impl Rig {
    /// A fresh table, the limit set on the resource, the bucket created by a zero acquire
    /// and the shard count doubled to `shards`.
    async fn new(ep: &str, tag: &str, limit: Limit, shards: i64) -> Rig {
        let store = Arc::new(common::fresh_store(ep, tag).await);
        let clock = Arc::new(ManualClock::new(T0));
        let name = limit.name().to_string();
        let setup = Limiter::builder(store.clone())
            .clock(clock.clone())
            .build()
            .expect("setup limiter");
        setup
            .admin()
            .set_limits(&Scope::Resource(RESOURCE.into()), &[limit])
            .await
            .expect("limits set");
        setup
            .acquire(ENTITY, RESOURCE, &[(name.as_str(), 0)])
            .await
            .expect("zero acquire creates the bucket");
        let mut s = 1;
        while s < shards {
            let next = setup
                .admin()
                .bump_shard_count(ENTITY, RESOURCE, s)
                .await
                .expect("bump_shard_count");
            assert!(next > s, "bump_shard_count({s}) returned {next}");
            s = next;
        }
        assert_eq!(s, shards, "shard count forced to {shards}");
        let limiters = (0..TASKS)
            .map(|t| {
                Limiter::builder(store.clone())
                    .clock(clock.clone())
                    .rng(Arc::new(SeededRng::new(t as u64)))
                    .options(Options {
                        // Every attempt goes to the store: no local refusals.
                        rejection_cache_ttl: Duration::ZERO,
                        // The shard count stays where the test put it.
                        max_shard_count: shards,
                        ..Options::default()
                    })
                    .build()
                    .expect("task limiter")
            })
            .collect();
        Rig {
            store,
            clock,
            limiters,
            limit: name,
        }
    }

    /// Every task makes `ATTEMPTS` acquires of 1, whatever the answers.
    async fn run(&self) -> Outcome {
        let admitted = Arc::new(AtomicI64::new(0));
        let refused = Arc::new(AtomicI64::new(0));
        let other = Arc::new(AtomicI64::new(0));
        let mut handles = Vec::new();
        for lim in &self.limiters {
            let lim = lim.clone();
            let name = self.limit.clone();
            let (admitted, refused, other) = (admitted.clone(), refused.clone(), other.clone());
            handles.push(tokio::spawn(async move {
                for _ in 0..ATTEMPTS {
                    // `Contended` charged nothing and says "retry shortly": a caller does
                    // (64 tasks on 8 shards of one entity can keep a transaction
                    // conflicting through the limiter's own retries on a loaded machine).
                    let mut r = lim.acquire(ENTITY, RESOURCE, &[(name.as_str(), 1)]).await;
                    for backoff_ms in [20, 40, 80, 160] {
                        if !matches!(r, Err(Error::Contended { .. })) {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
                        r = lim.acquire(ENTITY, RESOURCE, &[(name.as_str(), 1)]).await;
                    }
                    match r {
                        Ok(_lease) => {
                            admitted.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(Error::RateLimitExceeded(_)) => {
                            refused.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => {
                            eprintln!("acquire failed: {e}");
                            other.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            }));
        }
        for h in handles {
            h.await.expect("task");
        }
        Outcome {
            admitted: admitted.load(Ordering::SeqCst),
            refused: refused.load(Ordering::SeqCst),
            other_errors: other.load(Ordering::SeqCst),
        }
    }

    /// (shard count recorded on shard 0, Σ `b_{limit}_tc` over every shard item present).
    async fn stored(&self) -> (i64, i64) {
        let keys: Vec<_> = (0..tollgate_core::bucket::MAX_SHARD_COUNT as u32)
            .map(|s| keys::bucket("default", ENTITY, RESOURCE, s))
            .collect();
        let items = self
            .store
            .batch_get(&keys, true)
            .await
            .expect("read the shard items");
        let tc_attr = keys::battr(&self.limit, tollgate_core::bucket::field::TC);
        let tc = items
            .iter()
            .flatten()
            .filter_map(|i| i.get(tc_attr.as_str()).and_then(Value::as_n))
            .sum();
        let count = items[0]
            .as_ref()
            .and_then(|i| i.get(attr::SHARD_COUNT))
            .and_then(Value::as_n)
            .unwrap_or(1);
        (count, tc)
    }
}

/// Deletes the test's table, then re-raises the test's panic if it failed.
async fn finish(store: &DynamoDbStore, result: Result<(), tokio::task::JoinError>) {
    let _ = tollgate_dynamodb::delete_table(store.client(), store.table()).await;
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// Asserts the phase admitted exactly the allowance and the stored counters agree.
async fn check(rig: &Rig, what: &str, o: Outcome, shards: i64, tc_expected: i64) {
    let (count, tc) = rig.stored().await;
    eprintln!(
        "{what}: admitted {} refused {} other errors {} | shard_count {count} Σtc {tc}",
        o.admitted, o.refused, o.other_errors
    );
    assert!(
        o.admitted <= ALLOWANCE,
        "{what}: OVER-ADMISSION: admitted {} > allowance {ALLOWANCE}",
        o.admitted
    );
    assert_eq!(
        o.other_errors, 0,
        "{what}: acquires failed other than by refusal"
    );
    assert_eq!(count, shards, "{what}: the shard count moved");
    assert_eq!(
        o.admitted,
        ALLOWANCE,
        "{what}: admitted {} of {ALLOWANCE} in {} attempts",
        o.admitted,
        TASKS * ATTEMPTS
    );
    assert_eq!(tc, tc_expected, "{what}: Σ b_{}_tc", rig.limit);
}

async fn calendar_quota(ep: &str, shards: i64) {
    let daily = Limit::quota_calendar("rpd", ALLOWANCE, "0 0 * * *", "UTC").expect("limit");
    let rig = Rig::new(ep, &format!("cal{shards}"), daily, shards).await;
    let store = rig.store.clone();
    let result = tokio::spawn(async move {
        let o = rig.run().await;
        let what = format!("calendar quota, {shards} shard(s)");
        check(&rig, &what, o, shards, ALLOWANCE * 1000).await;
    })
    .await;
    finish(&store, result).await;
}

async fn window_quota_with_rollover(ep: &str, shards: i64) {
    let session = Limit::quota_after("session", ALLOWANCE, FIVE_HOURS).expect("limit");
    let rig = Rig::new(ep, &format!("win{shards}"), session, shards).await;
    let store = rig.store.clone();
    let result = tokio::spawn(async move {
        let first = rig.run().await;
        check(
            &rig,
            &format!("5h window, {shards} shard(s), first window"),
            first,
            shards,
            ALLOWANCE * 1000,
        )
        .await;
        // The window opened at T0 (every use so far was at T0); one second past its end.
        rig.clock.set(T0 + FIVE_HOURS.as_millis() as i64 + 1000);
        let second = rig.run().await;
        check(
            &rig,
            &format!("5h window, {shards} shard(s), after the rollover"),
            second,
            shards,
            2 * ALLOWANCE * 1000,
        )
        .await;
    })
    .await;
    finish(&store, result).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calendar_quota_admits_exactly_the_allowance_unsharded() {
    let ep = endpoint_or_skip!("calendar_quota_admits_exactly_the_allowance_unsharded");
    calendar_quota(&ep, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calendar_quota_admits_exactly_the_allowance_at_8_shards() {
    let ep = endpoint_or_skip!("calendar_quota_admits_exactly_the_allowance_at_8_shards");
    calendar_quota(&ep, 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn window_quota_admits_one_allowance_per_window_unsharded() {
    let ep = endpoint_or_skip!("window_quota_admits_one_allowance_per_window_unsharded");
    window_quota_with_rollover(&ep, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn window_quota_admits_one_allowance_per_window_at_8_shards() {
    let ep = endpoint_or_skip!("window_quota_admits_one_allowance_per_window_at_8_shards");
    window_quota_with_rollover(&ep, 8).await;
}
