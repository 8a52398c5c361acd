//! The running aggregator over the change feed, and the usage snapshots it keeps.
//!
//! [`FeedAggregator::pass`] reads the store's [`ChangeFeed`] from the consumer's checkpoint,
//! turns each bucket write into usage ([`tollgate_core::usage::usage_of`]: `tc` and `rq`
//! deltas dated by the write's `wt`, and each limit's overdraw, ADR-151), adds it to the snapshots of every configured window,
//! and — in the same transaction — moves the checkpoint, conditioned on the checkpoint it
//! started from. A batch read twice (a restarted aggregator, a second aggregator on the
//! same store) therefore lands once: the second commit's checkpoint condition fails and it
//! re-reads from the checkpoint that won. A pass that dies before its commit leaves the
//! checkpoint where it was, and the next pass reads the same changes again.
//!
//! After the usage, the pass runs the [`Aggregator`]'s background work (refill, roll and
//! reset; proactive doubling and Path-2 clones) for every (entity, resource) that consumed
//! in the batch, as the original's stream processor did.
//!
//! The options and a pass's report are here; the aggregator is in `feed`, the snapshot
//! query in `query`.
//!
//! [`ChangeFeed`]: tollgate_store::ChangeFeed
//! [`Aggregator`]: crate::Aggregator

mod feed;
mod query;

use tollgate_core::usage::Window;

pub use feed::{checkpoint_key, FeedAggregator};
pub use query::{UsagePage, UsageQuery};

/// How the aggregator keeps usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageOptions {
    /// The snapshot windows (default hourly and daily).
    pub windows: Vec<Window>,
    /// How long a snapshot is kept after its window ends (days; default 90).
    pub retention_days: i64,
    /// Changes read per feed request (default 500).
    pub batch: usize,
    /// The consumer name its checkpoint is stored under (default `aggregator`): processes
    /// with the same name share one checkpoint, so each change is counted once among them.
    pub consumer: String,
    /// Also refill, roll, reset and double the buckets that consumed (default true).
    pub background: bool,
    /// Most feed reads in one pass (`None`: until the feed has nothing more).
    pub max_batches: Option<usize>,
    /// Changes counted are trimmed from the feed (where the backend keeps it: memory,
    /// SQLite) once older than this (ms; default 24 hours, DynamoDB Streams' own), so
    /// another consumer of the same feed — another namespace's aggregator on the same file
    /// — has that long to read them.
    pub feed_retention_ms: i64,
}

impl Default for UsageOptions {
    fn default() -> Self {
        UsageOptions {
            windows: vec![Window::Hourly, Window::Daily],
            retention_days: 90,
            batch: 500,
            consumer: "aggregator".into(),
            background: true,
            max_batches: None,
            feed_retention_ms: 86_400_000,
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Changes read from the feed.
    pub changes: usize,
    /// Changes that carried usage.
    pub usage_changes: usize,
    /// Snapshot updates written (each snapshot item once per commit).
    pub snapshot_writes: usize,
    /// Transactions that moved the checkpoint.
    pub commits: usize,
    /// Commits refused because another consumer had moved the checkpoint first (their
    /// changes were re-read from the winner's checkpoint, never counted twice).
    pub lost_races: usize,
    /// Age (ms) of the oldest change read, at the start of the pass: the feed lag.
    pub lag_ms: i64,
    /// The background work's report.
    pub background: crate::AggregateReport,
}
