//! Warm acquires on a `MemoryStore` with its change feed, read by an absorbing feed
//! aggregator between them, as `tollgate serve --store memory` runs (its aggregator absorbs
//! the feed every few milliseconds: ~200 changes at a time at 40,000 requests a second):
//! `target/release/examples/aggregate_absorb ENTITIES ROUNDS [EACH]` — ROUNDS times: EACH
//! (default 200) warm acquires, cycling over ENTITIES entities, then one absorb; prints the
//! time per acquire and per change absorbed. Under `valgrind --tool=callgrind`, the
//! instructions at two ROUNDS, divided by the difference of changes, are the cost per
//! change (the acquire's and the absorb's functions apart in the profile).

use std::time::{Duration, Instant};

// As `tollgate serve` runs: on its allocator (the CLI's `main.rs`).
#[global_allocator]
static ALLOC: tollgate_alloc::Mimalloc = tollgate_alloc::Mimalloc;

#[path = "support/feed.rs"]
mod feed;
use feed::{LIMIT, RESOURCE};

use tollgate::UsageOptions;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let [entities, rounds, each] = feed::counts([1_000, 200, 200])?;
    let ids: Vec<String> = (0..entities).map(|i| format!("user-{i}")).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        // As `serve` sets it on a memory store (tollgate-cli's `usage.rs`).
        let opts = UsageOptions::default().feed_retention_ms(0).absorb(true);
        let (lim, agg) = feed::limiter_on_feed(opts).await?;
        // Every bucket created and its shape known before the count starts.
        for _ in 0..2 {
            for id in &ids {
                lim.acquire(id, RESOURCE, &[(LIMIT, 1)]).await?;
            }
        }
        agg.pass().await?;
        let (mut acquiring, mut absorbing) = (Duration::ZERO, Duration::ZERO);
        let (mut changes, mut at) = (0usize, 0usize);
        for _ in 0..rounds {
            let t = Instant::now();
            for _ in 0..each {
                lim.acquire(&ids[at % entities], RESOURCE, &[(LIMIT, 1)])
                    .await?;
                at += 1;
            }
            acquiring += t.elapsed();
            let t = Instant::now();
            changes += agg.absorb().await?;
            absorbing += t.elapsed();
        }
        let pass = agg.pass().await?;
        println!(
            "{} acquires: {:.0} ns each; {changes} changes absorbed: {:.0} ns each; \
             the last pass wrote {} snapshots",
            rounds * each,
            acquiring.as_nanos() as f64 / (rounds * each) as f64,
            absorbing.as_nanos() as f64 / changes.max(1) as f64,
            pass.snapshot_writes
        );
        Ok(())
    })
}
