//! What `tollgate serve` asks of its SQLite store, per acquire, in deterministic counts: warm
//! acquires of 1 from `TASKS` concurrent tasks over `ENTITIES` entities, `EACH` acquires of
//! every entity between two feed-aggregator passes (as `serve` interleaves its requests and
//! its 1 s passes), `ROUNDS` times, on a file store with the defaults `serve` uses.
//!
//! `cargo bench -p tollgate-sqlite --bench serve_cost -- [ENTITIES] [ROUNDS] [EACH] [TASKS]`
//! (defaults 1000 4 6 16). Prints per acquire: the process's CPU time (user + system,
//! `/proc/self/stat`), the bytes it wrote (`/proc/self/io` `wchar`: WAL frames and checkpoints),
//! the batches (commits) and changes. For instruction counts run the built binary under
//! `valgrind --tool=callgrind` at two ROUNDS and divide the difference by the difference of
//! acquires.

use std::sync::Arc;
use std::time::Instant;

use tollgate::{FeedAggregator, Limit, Limiter, Scope, UsageOptions};
use tollgate_sqlite::SqliteStore;

/// This process's CPU time so far (user + system, all threads), in microseconds, from
/// `/proc/self/stat` (clock ticks of 10 ms: runs of a few seconds are exact to a fraction of
/// a percent); 0 where there is none.
fn cpu_us() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // The fields after the command name, which is in parentheses: utime and stime
            // are the 12th and 13th.
            let rest = &s[s.rfind(')')? + 1..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
            Some(ticks * 10_000.0)
        })
        .unwrap_or(0.0)
}

/// Bytes this process has written (`wchar` of `/proc/self/io`; 0 where there is none).
fn written() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("wchar: ").map(|v| v.trim().parse().ok()))
                .flatten()
        })
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).filter(|a| !a.starts_with("--"));
    let mut count = |default: usize| -> Result<usize, std::num::ParseIntError> {
        Ok(args
            .next()
            .map(|s| s.parse())
            .transpose()?
            .unwrap_or(default)
            .max(1))
    };
    let (entities, rounds, each, tasks) = (count(1_000)?, count(4)?, count(6)?, count(16)?);
    let dir = tempfile::tempdir()?;
    let store = Arc::new(SqliteStore::open(dir.path().join("serve.db"))?);
    // One runtime thread: the tasks' polls come in one order, so the counts vary only with
    // how batches form against the writer thread (a multi-threaded runtime's work
    // stealing moved a few thousand instructions per acquire from run to run).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let lim = Limiter::new(store.clone())?;
    let agg = FeedAggregator::new(&lim, store.clone(), UsageOptions::default())?;
    let ids: Arc<Vec<String>> = Arc::new((0..entities).map(|i| format!("user-{i}")).collect());
    rt.block_on(async {
        lim.admin()
            .set_limits(
                &Scope::Resource("bench".into()),
                &[Limit::per_second("rps", 1_000_000_000)?],
            )
            .await?;
        // Every bucket created and counted once: what is measured is warm.
        for id in ids.iter() {
            lim.acquire(id, "bench", &[("rps", 1)]).await?;
        }
        agg.pass().await?;
        let (cpu0, w0, at0) = (cpu_us(), written(), Instant::now());
        let stats0 = store.group_commit_stats();
        let mut changes = 0usize;
        let mut snapshots = 0usize;
        for _ in 0..rounds {
            let handles: Vec<_> = (0..tasks)
                .map(|t| {
                    let (lim, ids) = (lim.clone(), Arc::clone(&ids));
                    tokio::spawn(async move {
                        for _ in 0..each {
                            for id in ids.iter().skip(t).step_by(tasks) {
                                let l = lim.acquire(id, "bench", &[("rps", 1)]).await?;
                                std::hint::black_box(l);
                            }
                        }
                        Ok::<_, tollgate::Error>(())
                    })
                })
                .collect();
            for h in handles {
                h.await??;
            }
            let rep = agg.pass().await?;
            changes += rep.changes;
            snapshots += rep.snapshot_writes;
        }
        let (cpu, w, wall) = (cpu_us() - cpu0, written() - w0, at0.elapsed());
        let stats = store.group_commit_stats();
        let acquires = (rounds * each * entities) as f64;
        let batches = stats.batches - stats0.batches;
        println!(
            "acquires={acquires} cpu_us_per_acquire={:.1} bytes_written_per_acquire={:.0} \
             commits_per_acquire={:.3} changes_per_acquire={:.3} snapshot_writes_per_acquire={:.3} \
             acquires_per_s={:.0}",
            cpu / acquires,
            w as f64 / acquires,
            batches as f64 / acquires,
            changes as f64 / acquires,
            snapshots as f64 / acquires,
            acquires / wall.as_secs_f64(),
        );
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    Ok(())
}
