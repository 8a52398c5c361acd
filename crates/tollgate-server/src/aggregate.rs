//! Running the feed aggregator ([`tollgate::FeedAggregator`]) on a timer, and the counters
//! its passes leave for `/metrics` (`tollgate_aggregator_*`, `tollgate_feed_lag_seconds`).
//!
//! `tollgate serve` runs one in-process by default on an embedded store; `tollgate aggregate`
//! runs one on its own. A failed pass is logged and counted; the next pass starts again from
//! the stored checkpoint, so nothing is lost or counted twice.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate::{FeedAggregator, PassReport};

/// What the passes did, for metrics and logs.
#[derive(Debug, Default)]
pub struct AggregatorStats {
    /// Passes that completed.
    pub passes: AtomicU64,
    /// Passes that failed.
    pub failed_passes: AtomicU64,
    /// Changes read.
    pub changes: AtomicU64,
    /// Changes that carried usage.
    pub usage_changes: AtomicU64,
    /// Snapshot item updates written.
    pub snapshot_writes: AtomicU64,
    /// Checkpoint commits.
    pub commits: AtomicU64,
    /// Commits lost to another consumer.
    pub lost_races: AtomicU64,
    /// Background writes (refills, rolls, resets, doublings, clones) that landed.
    pub background_writes: AtomicU64,
    /// The feed lag seen by the last pass (ms; 0 when it read nothing).
    pub lag_ms: AtomicI64,
}

impl AggregatorStats {
    /// Record one pass's outcome.
    pub fn record(&self, r: &tollgate::Result<PassReport>) {
        match r {
            Ok(p) => {
                self.passes.fetch_add(1, Ordering::Relaxed);
                let add = |c: &AtomicU64, v: usize| {
                    c.fetch_add(v as u64, Ordering::Relaxed);
                };
                add(&self.changes, p.changes);
                add(&self.usage_changes, p.usage_changes);
                add(&self.snapshot_writes, p.snapshot_writes);
                add(&self.commits, p.commits);
                add(&self.lost_races, p.lost_races);
                add(
                    &self.background_writes,
                    p.background.refilled_items + p.background.cloned.len(),
                );
                self.lag_ms.store(p.lag_ms, Ordering::Relaxed);
            }
            Err(_) => {
                self.failed_passes.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// An aggregator and how often it runs.
#[derive(Debug, Clone)]
pub struct AggregatorRun {
    /// The aggregator.
    pub aggregator: Arc<FeedAggregator>,
    /// Time between the end of one pass and the start of the next.
    pub interval: Duration,
    /// Its counters.
    pub stats: Arc<AggregatorStats>,
}

impl AggregatorRun {
    /// Run `aggregator` every `interval`.
    pub fn new(aggregator: FeedAggregator, interval: Duration) -> Self {
        AggregatorRun {
            aggregator: Arc::new(aggregator),
            interval: interval.max(Duration::from_millis(10)),
            stats: Arc::default(),
        }
    }

    /// One pass, recorded and logged.
    pub async fn pass(&self) -> tollgate::Result<PassReport> {
        let r = self.aggregator.pass().await;
        self.stats.record(&r);
        match &r {
            Ok(p) if p.changes > 0 => tracing::info!(
                changes = p.changes,
                usage_changes = p.usage_changes,
                snapshot_writes = p.snapshot_writes,
                commits = p.commits,
                lost_races = p.lost_races,
                claims_finished = p.claims_finished,
                lag_ms = p.lag_ms,
                refilled = p.background.refilled_items,
                "aggregator pass"
            ),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "aggregator pass failed; the next pass resumes from the checkpoint")
            }
        }
        r
    }

    /// Pass after pass until the task is aborted; an absorbing aggregator
    /// (`UsageOptions::absorb`) also reads the feed between them, every [`ABSORB_EVERY`]
    /// while it has changes and less often (up to [`ABSORB_IDLE`]) while it has none.
    pub async fn run_forever(self) {
        let absorb = self.aggregator.options().absorb;
        loop {
            let _ = self.pass().await;
            if !absorb {
                tokio::time::sleep(self.interval).await;
                continue;
            }
            let next = tokio::time::Instant::now() + self.interval;
            let mut wait = ABSORB_EVERY;
            loop {
                let now = tokio::time::Instant::now();
                if now >= next {
                    break;
                }
                tokio::time::sleep(wait.min(next - now)).await;
                // Every ABSORB_EVERY while writes come; backing off to ABSORB_IDLE when
                // none do.
                wait = match self.aggregator.absorb().await {
                    Ok(0) => (wait * 2).min(ABSORB_IDLE),
                    Ok(_) => ABSORB_EVERY,
                    Err(e) => {
                        tracing::warn!(error = %e, "aggregator: reading the feed between passes failed; the pass retries");
                        ABSORB_IDLE
                    }
                };
            }
        }
    }
}

/// How often an absorbing aggregator reads its in-process feed between passes while writes
/// come: the feed then holds about this long's writes (150 at 30,000 writes a second)
/// instead of a whole interval's, and the memory their copies cycle through stays
/// in the cache (`serve --store memory` at c = 64: 5 ms read 39.3 k acquires a second where
/// 100 ms read 36.7 k, in alternating runs).
pub const ABSORB_EVERY: Duration = Duration::from_millis(5);

/// The longest wait between reads of an idle feed.
pub const ABSORB_IDLE: Duration = Duration::from_millis(160);
