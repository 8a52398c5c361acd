//! Admitted acquires per second for one hot entity on a MemoryStore that throttles each item
//! at 1,000 writes per second (DynamoDB's per-partition ceiling), at 1 shard and at 32.
//!
//! A benchmark, not a test: `cargo bench -p tollgate --bench sharding`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::{Limit, Limiter, Options, Scope, SeededRng};
use tollgate_store::{Counting, MemoryStore, Store};

fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

async fn phase(max_shards: i64, tasks: usize, secs: u64) -> (f64, i64, u64) {
    let store = Arc::new(Counting::new(MemoryStore::with_write_ceiling(
        1000,
        Arc::new(now_ms),
    )));
    let dyn_store: Arc<dyn Store> = store.clone();
    let opts = Options {
        max_shard_count: max_shards,
        ..Options::default()
    };
    let setup = Limiter::builder(dyn_store.clone())
        .options(opts.clone())
        .build()
        .expect("limiter");
    setup
        .admin()
        .set_limits(
            &Scope::Resource("api".into()),
            &[Limit::per_second("rps", 1_000_000).expect("limit")],
        )
        .await
        .expect("limits");
    setup
        .acquire("tenant", "api", &[("rps", 1)])
        .await
        .expect("first");
    let admitted = Arc::new(AtomicU64::new(0));
    let rejected = Arc::new(AtomicU64::new(0));
    // Warm-up: let the clients double up to their cap.
    let deadline = Instant::now() + Duration::from_secs(secs + 1);
    let measure_from = Instant::now() + Duration::from_secs(1);
    let mut hs = Vec::new();
    for t in 0..tasks {
        let lim = Limiter::builder(dyn_store.clone())
            .options(opts.clone())
            .rng(Arc::new(SeededRng::new(t as u64)))
            .build()
            .expect("limiter");
        let (a, r) = (admitted.clone(), rejected.clone());
        hs.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let ok = lim.acquire("tenant", "api", &[("rps", 1)]).await.is_ok();
                if Instant::now() >= measure_from {
                    if ok {
                        a.fetch_add(1, Ordering::Relaxed);
                    } else {
                        r.fetch_add(1, Ordering::Relaxed);
                    }
                }
                if !ok {
                    tokio::task::yield_now().await;
                }
            }
        }));
    }
    for h in hs {
        h.await.expect("task");
    }
    let shards = store
        .inner()
        .raw_get(&tollgate_core::keys::bucket("default", "tenant", "api", 0))
        .and_then(|i| i.get("shard_count").and_then(|v| v.as_n()))
        .unwrap_or(1);
    (
        admitted.load(Ordering::Relaxed) as f64 / secs as f64,
        shards,
        rejected.load(Ordering::Relaxed),
    )
}

fn main() {
    // `cargo test --all-targets` runs bench binaries too; measure only under `cargo bench`.
    if !std::env::args().any(|a| a == "--bench") {
        println!("sharding benchmark: run it with `cargo bench -p tollgate --bench sharding`");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        for max in [1, 32] {
            let (rate, shards, rej) = phase(max, 64, 3).await;
            println!("write ceiling 1000/s per item, 64 tasks, max {max:>2} shards: {rate:>8.0} admitted/s (shard_count {shards}, {rej} refused or throttled)");
        }
    });
}
