//! The client's own CPU per store call against DynamoDB Local: what tollgate's process spends
//! (user + system time of every thread, `getrusage(RUSAGE_SELF)`) per call, at 1 and 64
//! concurrent tasks. DynamoDB Local runs in its own process, so none of its time is counted.
//!
//! ```text
//! scripts/dynamodb-local start 8765
//! TOLLGATE_DYNAMODB_ENDPOINT=http://127.0.0.1:8765 AWS_ACCESS_KEY_ID=test \
//!   AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1 \
//!   cargo bench -p tollgate-dynamodb --bench client_cpu
//! ```
//!
//! Rows:
//! * `update`: the acquire-shaped write — `tollgate_core::writes::fast_write` for one limit
//!   (four `ADD`s, a seven-part condition, `ReturnValues::AllNew`) on a bucket item the
//!   `Limiter` created, so the returned image is a real one.
//! * `get`: a strongly consistent `GetItem` of the same item.
//! * `acquire`: a whole `Limiter::acquire` (warm caches), for comparison.
//!
//! Each task works on its own entity, so no call fails its condition. `TOLLGATE_BENCH_CALLS`
//! (default 4000) calls per row after 200 warm-up calls; `TOLLGATE_BENCH_TASKS` (default
//! `1,64`) the task counts; `TOLLGATE_BENCH_DEADLINE_MS` the store's deadline (default 1 s;
//! raise it under valgrind); `TOLLGATE_BENCH_REFILL=second` a limit that is full again
//! between two acquires (every acquire a materialising write, see [`bench_limit`]). Without
//! `TOLLGATE_DYNAMODB_ENDPOINT` it prints a note and exits 0.

// The `tollgate` binary (`serve --store dynamodb`) runs on mimalloc: measure the client as
// it runs there (the system allocator costs about a sixth more instructions per acquire).
#[global_allocator]
static ALLOC: tollgate_alloc::Mimalloc = tollgate_alloc::Mimalloc;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::{Limit, Limiter, Scope};
use tollgate_core::bucket::attr;
use tollgate_core::expr::{ReturnValues, Update};
use tollgate_core::ids::WCU;
use tollgate_core::keys;
use tollgate_core::value::{Key, Value};
use tollgate_core::writes::fast_write;
use tollgate_dynamodb::DynamoDbStore;
use tollgate_store::{Store, UpdateRequest};

#[path = "support/rusage.rs"]
mod rusage;
use rusage::cpu;

const RESOURCE: &str = "cpu";
const LIMIT: &str = "rps";
const WARMUP: usize = 200;
/// Millitokens a top-up leaves in each balance.
const FULL: i64 = 1_000_000_000_000_000;

#[derive(Clone, Copy, Debug)]
enum Op {
    Update,
    Get,
    Acquire,
}

/// One task's target: its bucket key, the item's parameters hash, its entity.
#[derive(Clone)]
struct Target {
    key: Key,
    params_hash: String,
    entity: String,
}

/// The limit every row charges: 10,000,000 an hour (a constant, valid definition), so a
/// warm acquire debits a balance it trusts (the fast path). With
/// `TOLLGATE_BENCH_REFILL=second`, 10,000,000 a second, as the hot rows of `dynamodb.rs`:
/// the balance is full again before the next acquire, so every acquire materialises it
/// (the slow path's write).
fn bench_limit() -> Limit {
    if std::env::var("TOLLGATE_BENCH_REFILL").is_ok_and(|r| r == "second") {
        return Limit::per_second(LIMIT, 10_000_000).expect("a valid constant limit");
    }
    Limit::per_hour(LIMIT, 10_000_000).expect("a valid constant limit")
}

fn main() {
    let endpoint = match std::env::var("TOLLGATE_DYNAMODB_ENDPOINT") {
        Ok(e) if !e.trim().is_empty() => e.trim().to_string(),
        _ => {
            println!("client_cpu bench: TOLLGATE_DYNAMODB_ENDPOINT is not set; skipped.");
            return;
        }
    };
    if !std::env::args().any(|a| a == "--bench") {
        println!("client_cpu bench: not run without --bench (use `cargo bench`)");
        return;
    }
    let calls: usize = std::env::var("TOLLGATE_BENCH_CALLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = rt.block_on(run(&endpoint, calls)) {
        eprintln!("client_cpu bench failed: {e}");
        std::process::exit(1);
    }
}

async fn run(endpoint: &str, calls: usize) -> Result<(), Box<dyn std::error::Error>> {
    let table = format!(
        "tollgate-cpu-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0)
    );
    let mut b = DynamoDbStore::builder(&table).endpoint(endpoint);
    // A longer deadline for runs under an instruction counter (64 tasks served one at a
    // time would miss the default second).
    if let Some(ms) = std::env::var("TOLLGATE_BENCH_DEADLINE_MS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        b = b.deadline(Duration::from_millis(ms));
    }
    if std::env::var("AWS_ACCESS_KEY_ID").is_err() {
        b = b.static_credentials("test", "test");
    }
    let store = Arc::new(b.build().await?);
    store.create_table().await?;
    let result = bench(store.clone(), calls).await;
    let _ = tollgate_dynamodb::delete_table(store.client(), store.table()).await;
    result
}

async fn bench(store: Arc<DynamoDbStore>, calls: usize) -> Result<(), Box<dyn std::error::Error>> {
    let lim = Limiter::new(store.clone())?;
    lim.admin()
        .set_limits(&Scope::Resource(RESOURCE.into()), &[bench_limit()])
        .await?;
    // One entity per task, its bucket created by the limiter (a real item).
    let mut targets = Vec::new();
    for i in 0..64 {
        let entity = format!("cpu-{i}");
        // Half the hour's allowance: the bucket stays inside its trust horizon (the instant
        // it would be full again) for the whole run, so every shaped update lands.
        lim.acquire(&entity, RESOURCE, &[(LIMIT, 5_000_000)])
            .await?;
        let key = keys::bucket("default", &entity, RESOURCE, 0);
        let item = store.get(&key, true).await?.ok_or("bucket not created")?;
        let ph = item
            .get(attr::PH)
            .and_then(Value::as_s)
            .ok_or("bucket has no ph")?
            .to_string();
        targets.push(Target {
            key,
            params_hash: ph,
            entity,
        });
    }
    // TOLLGATE_BENCH_OPS=render,acquire,update,get picks rows (for profiling one kind of
    // call); default: all.
    let only = std::env::var("TOLLGATE_BENCH_OPS").unwrap_or_default();
    let wanted = |name: &str| only.is_empty() || only.split(',').any(|o| o.trim() == name);
    if wanted("render") {
        render_rows(&store, &targets[0]).await?;
    }
    println!();
    println!(
        "client CPU per call on DynamoDB Local ({}), {calls} calls per row",
        store.table()
    );
    println!(
        "{:>8} {:>5} {:>8} {:>9} {:>10} {:>10} {:>10}",
        "op", "tasks", "calls", "calls/s", "cpu µs", "user µs", "sys µs"
    );
    // TOLLGATE_BENCH_TASKS=1 picks task counts (for profiling under an instruction counter,
    // which runs threads one at a time); default: 1 and 64.
    let task_counts: Vec<usize> = std::env::var("TOLLGATE_BENCH_TASKS")
        .ok()
        .map(|s| {
            s.split(',')
                .filter_map(|t| t.trim().parse().ok())
                .filter(|&t| t > 0 && t <= targets.len())
                .collect()
        })
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| vec![1, 64]);
    for op in [Op::Acquire, Op::Update, Op::Get] {
        let name = format!("{op:?}").to_lowercase();
        if !wanted(&name) {
            continue;
        }
        for &tasks in &task_counts {
            if !matches!(op, Op::Acquire) {
                top_up(&store, &targets).await?;
            }
            // Warm-up: connections open, caches filled.
            drive(&store, &lim, &targets, op, tasks, WARMUP).await?;
            let (u0, s0) = cpu();
            let start = Instant::now();
            drive(&store, &lim, &targets, op, tasks, calls).await?;
            let wall = start.elapsed();
            let (u1, s1) = cpu();
            let n = calls as f64;
            let us = |d: Duration| d.as_secs_f64() * 1e6 / n;
            println!(
                "{:>8} {:>5} {:>8} {:>9.0} {:>10.1} {:>10.1} {:>10.1}",
                name,
                tasks,
                calls,
                n / wall.as_secs_f64(),
                us((u1 - u0) + (s1 - s0)),
                us(u1 - u0),
                us(s1 - s0),
            );
        }
    }
    Ok(())
}

/// The crate's own work per acquire-shaped update, without I/O: rendering the expressions
/// (one alias table, maps handed over by move) and decoding a returned bucket image; and,
/// for comparison, the map-based `render::Placeholders` path.
async fn render_rows(store: &DynamoDbStore, t: &Target) -> Result<(), Box<dyn std::error::Error>> {
    use tollgate_dynamodb::codec::{item_from_av_owned, item_to_av};
    use tollgate_dynamodb::render::{self, Aliases};
    const N: u32 = 200_000;
    let item = store.get(&t.key, true).await?.ok_or("item vanished")?;
    let av = item_to_av(&item)?;
    let amounts = [(LIMIT.to_string(), 1000i64)];
    let (update, condition) = fast_write(
        &amounts,
        &[bench_limit()],
        &t.params_hash,
        1_700_000_000_000,
    );
    let time = |f: &mut dyn FnMut() -> usize| {
        let (u0, s0) = cpu();
        let mut sink = 0usize;
        for _ in 0..N {
            sink = sink.wrapping_add(f());
        }
        let (u1, s1) = cpu();
        std::hint::black_box(sink);
        ((u1 - u0) + (s1 - s0)).as_secs_f64() * 1e9 / f64::from(N)
    };
    let aliases = time(&mut || {
        let mut a = Aliases::new();
        let (mut c, mut u) = (String::with_capacity(256), String::with_capacity(128));
        let _ = render::write_condition(&mut a, &mut c, &condition);
        let _ = render::write_update(&mut a, &mut u, &update);
        let (names, values) = a.into_maps();
        c.len() + u.len() + names.map_or(0, |n| n.len()) + values.map_or(0, |v| v.len())
    });
    let maps = time(&mut || {
        let mut p = render::Placeholders::new();
        let c = render::condition(&mut p, &condition).map_or(0, |c| c.len());
        let u = render::update(&mut p, &update)
            .ok()
            .flatten()
            .map_or(0, |u| u.len());
        c + u + p.names_opt().map_or(0, |n| n.len()) + p.values_opt().map_or(0, |v| v.len())
    });
    let clone_only = time(&mut || av.clone().len());
    let decode = time(&mut || item_from_av_owned(av.clone()).map_or(0, |i| i.len()));
    let build = time(&mut || {
        let amounts = [(LIMIT.to_string(), 1000i64)];
        let (u, c) = fast_write(
            &amounts,
            &[bench_limit()],
            &t.params_hash,
            1_700_000_000_000,
        );
        u.actions.len() + matches!(c, tollgate_core::expr::Condition::And(_)) as usize
    });
    println!();
    println!("this crate's own CPU per acquire-shaped update (no I/O), ns per call:");
    println!("  render, one alias table (the store's path)  {aliases:>8.0}");
    println!("  render, map-based Placeholders               {maps:>8.0}");
    println!(
        "  decode the returned image ({} attributes)    {:>8.0}",
        av.len(),
        (decode - clone_only).max(0.0)
    );
    println!("  (the limiter building the typed write       {build:>8.0})");
    Ok(())
}

/// Fill every target's balances far beyond what a row spends: the speculative write does not
/// refill, and `wcu` alone would run dry after 1000 writes. The default-level `ttl` (a few
/// seconds ahead for a per-second limit) is removed so the item never counts as expired.
async fn top_up(
    store: &DynamoDbStore,
    targets: &[Target],
) -> Result<(), Box<dyn std::error::Error>> {
    for t in targets {
        store
            .update(UpdateRequest {
                key: t.key.clone(),
                update: Update::new()
                    .set(keys::battr(LIMIT, tollgate_core::bucket::field::TK), FULL)
                    .set(keys::battr(WCU, tollgate_core::bucket::field::TK), FULL)
                    .remove(attr::TTL),
                condition: None,
                returns: ReturnValues::None,
            })
            .await?;
    }
    Ok(())
}

/// `calls` calls of `op`, spread over `tasks` tasks (task `i` on target `i`).
async fn drive(
    store: &Arc<DynamoDbStore>,
    lim: &Limiter,
    targets: &[Target],
    op: Op,
    tasks: usize,
    calls: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut handles = Vec::new();
    for (i, t) in targets.iter().take(tasks).enumerate() {
        let n = calls / tasks + usize::from(i < calls % tasks);
        let (store, lim, t) = (store.clone(), lim.clone(), t.clone());
        handles.push(tokio::spawn(async move {
            for _ in 0..n {
                match op {
                    Op::Update => {
                        let now = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map(|d| d.as_millis() as i64)
                            .unwrap_or(0);
                        let amounts = [(LIMIT.to_string(), 1000i64)];
                        let (update, condition) =
                            fast_write(&amounts, &[bench_limit()], &t.params_hash, now);
                        store
                            .update(UpdateRequest {
                                key: t.key.clone(),
                                update,
                                condition: Some(condition),
                                returns: ReturnValues::AllNew,
                            })
                            .await
                            .map_err(|e| match e {
                                tollgate_store::StoreError::ConditionFailed { old } => {
                                    format!("condition failed on {}: {old:?}", t.key)
                                }
                                e => e.to_string(),
                            })?;
                    }
                    Op::Get => {
                        store
                            .get(&t.key, true)
                            .await
                            .map_err(|e| e.to_string())?
                            .ok_or("item vanished")?;
                    }
                    Op::Acquire => {
                        lim.acquire(&t.entity, RESOURCE, &[(LIMIT, 1)])
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                }
            }
            Ok::<(), String>(())
        }));
    }
    for h in handles {
        h.await??;
    }
    Ok(())
}
