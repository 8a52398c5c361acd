//! Warm acquires on a `MemoryStore` with its change feed, counted by feed-aggregator
//! passes, for instruction-count profiles of what the feed and the aggregator cost:
//! `valgrind --tool=callgrind target/release/examples/aggregate_pass ENTITIES ROUNDS [EACH]`
//! — ROUNDS times: EACH (default 1) warm acquires of every one of ENTITIES entities, then
//! one pass, as `tollgate serve` interleaves requests and its passes. The cost at two
//! ROUNDS, divided by the difference of changes, is the cost per counted acquire; with
//! EACH = 1 most of a pass's cost is per snapshot item (one change of each pair per pass).

// As `tollgate serve` runs: on its allocator (the CLI's `main.rs`).
#[global_allocator]
static ALLOC: tollgate_alloc::Mimalloc = tollgate_alloc::Mimalloc;

#[path = "support/feed.rs"]
mod feed;
use feed::{LIMIT, RESOURCE};

use tollgate::UsageOptions;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let [entities, rounds, each] = feed::counts([1_000, 10, 1])?;
    let ids: Vec<String> = (0..entities).map(|i| format!("user-{i}")).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (lim, agg) =
            feed::limiter_on_feed(UsageOptions::default().feed_retention_ms(0)).await?;
        // Every bucket created and counted once, so the measured pass sees only warm writes.
        for id in &ids {
            lim.acquire(id, RESOURCE, &[(LIMIT, 1)]).await?;
        }
        agg.pass().await?;
        let mut total = tollgate::PassReport::default();
        for _ in 0..rounds {
            for _ in 0..each {
                for id in &ids {
                    let l = lim.acquire(id, RESOURCE, &[(LIMIT, 1)]).await?;
                    std::hint::black_box(l);
                }
            }
            let rep = std::hint::black_box(agg.pass().await?);
            total.changes += rep.changes;
            total.usage_changes += rep.usage_changes;
            total.snapshot_writes += rep.snapshot_writes;
        }
        println!(
            "changes={} usage_changes={} snapshot_writes={}",
            total.changes, total.usage_changes, total.snapshot_writes
        );
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    Ok(())
}
