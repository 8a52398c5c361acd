//! Acquire latency, throughput and store requests per acquire against DynamoDB Local.
//!
//! ```text
//! scripts/dynamodb-local start 8765
//! TOLLGATE_DYNAMODB_ENDPOINT=http://127.0.0.1:8765 AWS_ACCESS_KEY_ID=test \
//!   AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1 \
//!   cargo bench -p tollgate-dynamodb --bench dynamodb
//! ```
//!
//! For 1, 8 and 64 concurrent tasks sharing one `Limiter` (one process), each task acquires 1
//! from one warm entity in a loop for `TOLLGATE_BENCH_SECS` seconds (default 5) under a rate
//! limit that never refuses (10 000 000/s). Reports p50/p99/max latency, throughput and the
//! store requests per acquire (a `Counting` wrapper around the store), this process's CPU
//! per acquire (`getrusage`: the client's own cost, DynamoDB Local being another process),
//! which path admitted each row's acquires (the limiter's fast and slow admits; every write
//! beyond one per admitted acquire failed its condition and was planned again), and
//! separately the
//! requests of a cold first acquire (empty caches, no bucket yet) and of a first acquire of
//! a new entity by a limiter whose config cache is warm. Without `TOLLGATE_DYNAMODB_ENDPOINT`
//! it prints a note and exits 0.

// The `tollgate` binary (`serve --store dynamodb`) runs on mimalloc: measure the client as
// it runs there (the system allocator costs about a sixth more instructions per acquire).
#[global_allocator]
static ALLOC: tollgate_alloc::Mimalloc = tollgate_alloc::Mimalloc;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::{Limit, Limiter, Scope};
use tollgate_dynamodb::DynamoDbStore;
use tollgate_store::{Counting, StoreStats};

#[path = "support/rusage.rs"]
mod rusage;

const RESOURCE: &str = "bench";
const LIMIT: &str = "rps";

struct Row {
    tasks: usize,
    acquires: usize,
    errors: usize,
    secs: f64,
    p50: Duration,
    p99: Duration,
    max: Duration,
    requests: StoreStats,
    shard_count: i64,
    /// This process's CPU time over the row (user + system, every thread).
    cpu: Duration,
    /// What the row's limiter did (fast and slow admits).
    paths: tollgate::StatsSnapshot,
}

fn main() {
    let endpoint = match std::env::var("TOLLGATE_DYNAMODB_ENDPOINT") {
        Ok(e) if !e.trim().is_empty() => e.trim().to_string(),
        _ => {
            println!(
                "dynamodb bench: TOLLGATE_DYNAMODB_ENDPOINT is not set; skipped.\n\
                 Start DynamoDB Local with `scripts/dynamodb-local start 8765` and set\n\
                 TOLLGATE_DYNAMODB_ENDPOINT=http://127.0.0.1:8765 (plus AWS_ACCESS_KEY_ID,\n\
                 AWS_SECRET_ACCESS_KEY and AWS_REGION, any values) to run it."
            );
            return;
        }
    };
    // `cargo bench` passes `--bench`; `cargo test --benches` does not: skip the load then.
    if !std::env::args().any(|a| a == "--bench") {
        println!("dynamodb bench: not run without --bench (use `cargo bench`)");
        return;
    }
    let secs: f64 = std::env::var("TOLLGATE_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(run(&endpoint, Duration::from_secs_f64(secs)));
}

async fn run(endpoint: &str, dur: Duration) {
    let table = format!(
        "tollgate-bench-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0)
    );
    let mut b = DynamoDbStore::builder(&table).endpoint(endpoint);
    if std::env::var("AWS_ACCESS_KEY_ID").is_err() {
        b = b.static_credentials("test", "test");
    }
    let ddb = b.build().await.expect("store builds");
    ddb.create_table().await.expect("table created");
    let store = Arc::new(Counting::new(ddb));

    let result = bench(store.clone(), dur).await;
    let _ = tollgate_dynamodb::delete_table(store.inner().client(), store.inner().table()).await;
    if let Err(e) = result {
        eprintln!("dynamodb bench failed: {e}");
        std::process::exit(1);
    }
}

async fn bench(store: Arc<Counting<DynamoDbStore>>, dur: Duration) -> Result<(), tollgate::Error> {
    let admin = Limiter::new(store.clone())?;
    admin
        .admin()
        .set_limits(
            &Scope::Resource(RESOURCE.into()),
            &[Limit::per_second(LIMIT, 10_000_000)?],
        )
        .await?;

    // Cold: a new limiter (empty config cache) and an entity with no bucket yet.
    let cold = Limiter::new(store.clone())?;
    let before = store.stats();
    cold.acquire("cold-entity", RESOURCE, &[(LIMIT, 1)]).await?;
    let cold_first = store.stats().since(&before);
    // Config cache warm, new entity: the bucket is created.
    let before = store.stats();
    cold.acquire("new-entity", RESOURCE, &[(LIMIT, 1)]).await?;
    let new_entity = store.stats().since(&before);
    // Second acquire of the same entity: the speculative fast path.
    let before = store.stats();
    cold.acquire("new-entity", RESOURCE, &[(LIMIT, 1)]).await?;
    let second = store.stats().since(&before);

    let mut rows = Vec::new();
    for tasks in [1usize, 8, 64] {
        let lim = Limiter::new(store.clone())?;
        let entity = format!("hot-{tasks}");
        // Warm: the bucket exists and the limiter's caches are filled.
        for _ in 0..20 {
            lim.acquire(&entity, RESOURCE, &[(LIMIT, 1)]).await?;
        }
        rows.push(load(&lim, &store, &entity, tasks, dur).await);
    }

    println!();
    println!(
        "tollgate on DynamoDB Local ({}), {:.1} s per row, acquire 1 of a 10M/s limit, one shared Limiter",
        store.inner().table(),
        dur.as_secs_f64()
    );
    println!(
        "{:>5} {:>9} {:>10} {:>9} {:>9} {:>9} {:>10} {:>11} {:>6} {:>6} {:>11}",
        "tasks",
        "acquires",
        "acq/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "reads/acq",
        "writes/acq",
        "errors",
        "shards",
        "cpu µs/acq"
    );
    for r in &rows {
        let n = r.acquires.max(1) as f64;
        println!(
            "{:>5} {:>9} {:>10.0} {:>9.2} {:>9.2} {:>9.2} {:>10.3} {:>11.3} {:>6} {:>6} {:>11.1}",
            r.tasks,
            r.acquires,
            r.acquires as f64 / r.secs,
            ms(r.p50),
            ms(r.p99),
            ms(r.max),
            r.requests.reads() as f64 / n,
            r.requests.writes() as f64 / n,
            r.errors,
            r.shard_count,
            r.cpu.as_secs_f64() * 1e6 / n
        );
    }
    println!();
    println!("limiter paths per row (a write that did not admit failed its condition):");
    println!(
        "{:>5} {:>11} {:>11} {:>17}",
        "tasks", "fast admits", "slow admits", "failed writes/acq"
    );
    for r in &rows {
        let n = r.acquires.max(1) as f64;
        let admits = r.paths.fast_admits + r.paths.slow_admits;
        println!(
            "{:>5} {:>11} {:>11} {:>17.3}",
            r.tasks,
            r.paths.fast_admits,
            r.paths.slow_admits,
            r.requests.writes().saturating_sub(admits) as f64 / n
        );
    }
    println!();
    println!("store requests of single acquires:");
    for (what, s) in [
        ("cold (new limiter, new entity)", cold_first),
        ("new entity, config cached", new_entity),
        ("second acquire (fast path)", second),
    ] {
        println!(
            "  {what:<32} reads {} (get {}, batch_get {}, query {})  writes {} (put {}, update {}, delete {}, transact {})",
            s.reads(),
            s.gets,
            s.batch_gets,
            s.queries,
            s.writes(),
            s.puts,
            s.updates,
            s.deletes,
            s.transactions
        );
    }
    Ok(())
}

async fn load(
    lim: &Limiter,
    store: &Counting<DynamoDbStore>,
    entity: &str,
    tasks: usize,
    dur: Duration,
) -> Row {
    let before = store.stats();
    let paths_before = lim.stats();
    let cpu_before = rusage::cpu_total();
    let start = Instant::now();
    let deadline = start + dur;
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let lim = lim.clone();
        let entity = entity.to_string();
        handles.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(4096);
            let mut errors = 0usize;
            while Instant::now() < deadline {
                let t = Instant::now();
                match lim.acquire(&entity, RESOURCE, &[(LIMIT, 1)]).await {
                    Ok(_) => lat.push(t.elapsed()),
                    Err(e) => {
                        if errors == 0 {
                            eprintln!("acquire failed: {e}");
                        }
                        errors += 1;
                    }
                }
            }
            (lat, errors)
        }));
    }
    let mut lat = Vec::new();
    let mut errors = 0;
    for h in handles {
        let (l, e) = h.await.expect("task");
        lat.extend(l);
        errors += e;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = rusage::cpu_total().saturating_sub(cpu_before);
    let requests = store.stats().since(&before);
    let paths_after = lim.stats();
    let paths = tollgate::StatsSnapshot {
        fast_admits: paths_after.fast_admits - paths_before.fast_admits,
        slow_admits: paths_after.slow_admits - paths_before.slow_admits,
        ..Default::default()
    };
    lat.sort_unstable();
    let pct = |p: f64| -> Duration {
        if lat.is_empty() {
            return Duration::ZERO;
        }
        let i = ((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1;
        lat[i]
    };
    let shard_count = shard_count(store, entity).await;
    Row {
        tasks,
        acquires: lat.len(),
        errors,
        secs,
        p50: pct(0.50),
        p99: pct(0.99),
        max: lat.last().copied().unwrap_or_default(),
        requests,
        shard_count,
        cpu,
        paths,
    }
}

/// The shard count recorded on shard 0 of (entity, `RESOURCE`).
async fn shard_count(store: &Counting<DynamoDbStore>, entity: &str) -> i64 {
    use tollgate_store::Store;
    let key = tollgate_core::keys::bucket("default", entity, RESOURCE, 0);
    store
        .inner()
        .get(&key, true)
        .await
        .ok()
        .flatten()
        .and_then(|i| {
            i.get(tollgate_core::bucket::attr::SHARD_COUNT)
                .and_then(tollgate_core::value::Value::as_n)
        })
        .unwrap_or(1)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
