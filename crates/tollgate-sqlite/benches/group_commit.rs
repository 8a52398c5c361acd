//! Library-level throughput of concurrent durable writes on one SQLite file: `tasks` tokio
//! tasks each debit their own item (`n -= 1` if `n >= 1`) as fast as the store acknowledges,
//! for a fixed time, at 1, 16 and 64 tasks. A second mode reads the item first (`get`, then
//! the conditional update), the shape of an acquire.
//!
//! `cargo bench -p tollgate-sqlite --bench group_commit` (set `BENCH_SECS` for longer points,
//! `BENCH_TASKS=1,16,64` for other concurrency levels, `BENCH_MAX_BATCH=1` to turn group
//! commit off, `BENCH_MODES=update` or `BENCH_MODES=get+update` for one mode only,
//! `BENCH_ITEM=wide` for items of 15 attributes, about 800 bytes of JSON, the size of a
//! limiter bucket, instead of one attribute). Prints throughput, p50 / p99 latency, and how
//! the batches formed (mean and largest batch in requests, and the share of batches of one
//! request).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_core::expr::{Condition, ReturnValues, Update};
use tollgate_core::value::{Item, Key, Value};
use tollgate_sqlite::{SqliteConfig, SqliteStore};
use tollgate_store::{PutRequest, Store, UpdateRequest};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Update,
    ReadThenUpdate,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Update => "update",
            Mode::ReadThenUpdate => "get+update",
        }
    }
}

struct Point {
    ops: u64,
    elapsed: Duration,
    latencies_us: Vec<u64>,
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The stocked item: `n` alone, or (`wide`) `n` and 14 more attributes, about 800 bytes of
/// JSON as stored.
fn stock_item(wide: bool) -> Item {
    let mut item = Item::new();
    item.insert("n".into(), Value::N(i64::MAX / 2));
    if wide {
        for i in 0..7 {
            item.insert(
                format!("count_{i}").into(),
                Value::N(1_000_000_007 * (i + 1)),
            );
            item.insert(
                format!("label_{i}").into(),
                Value::S(format!(
                    "tenant-{i}/resource-gpt-4o-mini-2024-07-18/window-60s/shard-00"
                )),
            );
        }
    }
    item
}

async fn run_point(
    store: Arc<SqliteStore>,
    tasks: usize,
    mode: Mode,
    secs: f64,
    wide: bool,
) -> Point {
    for t in 0..tasks {
        let item = stock_item(wide);
        store
            .put(PutRequest {
                key: Key::new(format!("bench/{t}"), "#STATE"),
                item,
                condition: None,
            })
            .await
            .expect("stock");
    }
    let start = Instant::now();
    let stop = start + Duration::from_secs_f64(secs);
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let key = Key::new(format!("bench/{t}"), "#STATE");
                let mut lat = Vec::with_capacity(4096);
                while Instant::now() < stop {
                    let t0 = Instant::now();
                    if mode == Mode::ReadThenUpdate {
                        store.get(&key, true).await.expect("get");
                    }
                    store
                        .update(UpdateRequest {
                            key: key.clone(),
                            update: Update::new().add("n", -1),
                            condition: Some(Condition::ge("n", 1)),
                            returns: ReturnValues::None,
                        })
                        .await
                        .expect("update");
                    lat.push(t0.elapsed().as_micros() as u64);
                }
                lat
            })
        })
        .collect();
    let mut latencies_us = Vec::new();
    for h in handles {
        latencies_us.extend(h.await.expect("task"));
    }
    let elapsed = start.elapsed();
    latencies_us.sort_unstable();
    Point {
        ops: latencies_us.len() as u64,
        elapsed,
        latencies_us,
    }
}

fn main() {
    let secs: f64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let levels: Vec<usize> = std::env::var("BENCH_TASKS")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 16, 64]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let max_batch: usize = std::env::var("BENCH_MAX_BATCH")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(tollgate_sqlite::DEFAULT_MAX_BATCH_OPS);
    let config = SqliteConfig::default().with_max_batch_ops(max_batch);
    let modes: Vec<Mode> = match std::env::var("BENCH_MODES") {
        Ok(s) => [Mode::Update, Mode::ReadThenUpdate]
            .into_iter()
            .filter(|m| s.split(',').any(|x| x.trim() == m.name()))
            .collect(),
        Err(_) => vec![Mode::Update, Mode::ReadThenUpdate],
    };
    let wide = std::env::var("BENCH_ITEM").is_ok_and(|s| s == "wide");
    let dir = tempfile::tempdir().expect("temp dir");
    println!(
        "durable SQLite (WAL, synchronous=FULL), {secs} s per point, 2 worker threads, \
         batches of at most {max_batch} ops, items of {} attributes ({} bytes of JSON)",
        stock_item(wide).len(),
        serde_json::to_string(&stock_item(wide)).map_or(0, |j| j.len())
    );
    println!(
        "{:<11} {:>5} {:>10} {:>9} {:>9} {:>8} {:>6} {:>7} {:>9}",
        "mode", "tasks", "ops/s", "p50 µs", "p99 µs", "batch", "max", "single", "ops"
    );
    for &mode in &modes {
        for &tasks in &levels {
            let path = dir
                .path()
                .join(format!("{}-{tasks}.db", mode.name().replace('+', "-")));
            let store = Arc::new(SqliteStore::open_with(&path, &config).expect("open"));
            let before = store.group_commit_stats();
            let p = rt.block_on(run_point(Arc::clone(&store), tasks, mode, secs, wide));
            let after = store.group_commit_stats();
            let batches = after.batches - before.batches;
            let singles = after.batches_by_size[0] - before.batches_by_size[0];
            println!(
                "{:<11} {:>5} {:>10.0} {:>9} {:>9} {:>8.1} {:>6} {:>6.0}% {:>9}",
                mode.name(),
                tasks,
                p.ops as f64 / p.elapsed.as_secs_f64(),
                percentile(&p.latencies_us, 0.50),
                percentile(&p.latencies_us, 0.99),
                (after.requests - before.requests) as f64 / batches.max(1) as f64,
                after.max_batch_requests,
                100.0 * singles as f64 / batches.max(1) as f64,
                p.ops,
            );
        }
    }
}
