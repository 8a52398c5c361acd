//! Many tasks on one entity: the total admitted never exceeds what the limits allow over
//! the run, at 1, 4 and 32 shards (MemoryStore, multi-threaded runtime, frozen clock).

mod common;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate::{Limit, Limiter, ManualClock, Options, Scope, SeededRng};
use tollgate_store::MemoryStore;

const T0: i64 = 1_757_000_000_000;

async fn run(
    limit: Limit,
    capacity: i64,
    shards: i64,
    tasks: usize,
    per_task: usize,
) -> (i64, i64) {
    let store = Arc::new(MemoryStore::new());
    let clock = Arc::new(ManualClock::new(T0));
    let setup = Limiter::builder(store.clone())
        .clock(clock.clone())
        .build()
        .unwrap();
    setup
        .admin()
        .set_limits(&Scope::Resource("api".into()), &[limit])
        .await
        .unwrap();
    setup
        .acquire("hot", "api", &[(limit_name(&setup).await.as_str(), 0)])
        .await
        .unwrap();
    let mut s = 1;
    while s < shards {
        s = setup
            .admin()
            .bump_shard_count("hot", "api", s)
            .await
            .unwrap();
    }
    let admitted = Arc::new(AtomicI64::new(0));
    let mut handles = Vec::new();
    for t in 0..tasks {
        // Each task is its own client: its own caches and draws, as separate processes.
        let lim = Limiter::builder(store.clone())
            .clock(clock.clone())
            .rng(Arc::new(SeededRng::new(t as u64)))
            .options(Options {
                rejection_cache_ttl: Duration::ZERO,
                ..Options::default()
            })
            .build()
            .unwrap();
        let admitted = admitted.clone();
        let name = limit_name(&lim).await;
        handles.push(tokio::spawn(async move {
            for _ in 0..per_task {
                if lim
                    .acquire("hot", "api", &[(name.as_str(), 1)])
                    .await
                    .is_ok()
                {
                    admitted.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let a = admitted.load(Ordering::SeqCst);
    assert!(
        a <= capacity,
        "admitted {a} > allowance {capacity} at {shards} shards"
    );
    (a, capacity)
}

async fn limit_name(l: &Limiter) -> String {
    l.resolve_limits("hot", "api").await.unwrap()[0]
        .name()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rate_limit_never_over_admits_at_1_4_32_shards() {
    for shards in [1, 4, 32] {
        let (a, c) = run(Limit::per_hour("rph", 320).unwrap(), 320, shards, 32, 20).await;
        eprintln!("rate limit, {shards} shards: admitted {a} of {c}");
        assert!(
            a >= c / 2,
            "admitted only {a} of {c}: the shards are not being used"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quotas_never_over_admit_at_1_4_32_shards() {
    for shards in [1, 4, 32] {
        let daily = Limit::quota_calendar("rpd", 320, "0 0 * * *", "UTC").unwrap();
        let (a, c) = run(daily, 320, shards, 32, 20).await;
        eprintln!("calendar quota, {shards} shards: admitted {a} of {c}");
        let session = Limit::quota_after("session", 320, Duration::from_secs(18_000)).unwrap();
        let (a, c) = run(session, 320, shards, 32, 20).await;
        eprintln!("window quota, {shards} shards: admitted {a} of {c}");
    }
}
