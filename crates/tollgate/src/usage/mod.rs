//! The running aggregator over the change feed, and the usage snapshots it keeps.
//!
//! [`FeedAggregator::pass`] reads the store's [`ChangeFeed`] from the consumer's checkpoint,
//! turns each bucket write into usage ([`tollgate_core::usage::usage_view`]: `tc` and `rq`
//! deltas dated by the write's `wt`, and each limit's overdraw, ADR-151), sums it per
//! snapshot item of every configured window over the whole pass (up to
//! [`UsageOptions::max_pass_changes`] changes), and commits the sums exactly once with the
//! checkpoint (rule "a pass's usage is applied exactly once: claim, apply per item at most
//! once, finalize", in `commit`): in one transaction with the checkpoint move when they fit,
//! else a claim on the checkpoint, per-item updates that each land at most once for the
//! claimed pass, and a finalize. A range read twice (a restarted aggregator, a second
//! aggregator on the same store) therefore lands once: the second commit's checkpoint
//! condition fails and it re-reads from the checkpoint that won. A pass that dies before its
//! commit or claim leaves the checkpoint where it was, and the next pass reads the same
//! changes again; one that dies after its claim leaves the claim, which the next pass of
//! any consumer sharing the checkpoint finishes first.
//!
//! An absorbing aggregator ([`UsageOptions::absorb`], `tollgate serve` on a memory store)
//! also reads, sums and trims the feed between passes and commits what it holds from memory
//! (rule "held usage is committed from memory, never re-read").
//!
//! After the usage, the pass runs the [`Aggregator`]'s background work (refill, roll and
//! reset; proactive doubling and Path-2 clones) for every (entity, resource) that consumed
//! in the batch, as the original's stream processor did.
//!
//! The options and a pass's report are here; the aggregator is in `feed`, the sums in
//! `pending`, their commit in `commit`, the snapshot query in `query`.
//!
//! [`ChangeFeed`]: tollgate_store::ChangeFeed
//! [`Aggregator`]: crate::Aggregator

mod commit;
mod feed;
mod pending;
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
    /// Most changes summed into one commit (default 50,000): a pass reading more commits
    /// every this many. The bigger, the more writes of one snapshot item are summed into one
    /// update; the smaller, the less a claim left by a crash re-reads.
    pub max_pass_changes: usize,
    /// Most snapshot updates in one store transaction (default and at most 99, one less
    /// than a transaction holds): a pass whose sums fit commits them with the checkpoint in
    /// one transaction; a bigger one claims the checkpoint and applies them in several.
    pub commit_items: usize,
    /// Changes counted are trimmed from the feed (where the backend keeps it: memory,
    /// SQLite) once older than this (ms; default 24 hours, DynamoDB Streams' own), so
    /// another consumer of the same feed — another namespace's aggregator on the same file
    /// — has that long to read them.
    pub feed_retention_ms: i64,
    /// The aggregator is the only consumer of a feed that lives no longer than its process
    /// (an in-process memory store; default false). Between passes
    /// [`FeedAggregator::absorb`] then reads and sums the feed and trims what it read at
    /// once (`feed_retention_ms` does not apply: no one else reads it), holding the sums in
    /// memory until the next pass commits them (rule "held usage is committed from memory,
    /// never re-read", in `feed`): the feed keeps the changes of a few milliseconds instead
    /// of a whole interval's. Wrong for a feed that outlives the process or that another
    /// consumer reads — a restart loses what was held (with a memory store it loses the
    /// store too), and another consumer moving the checkpoint fails the pass.
    pub absorb: bool,
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
            max_pass_changes: 50_000,
            commit_items: tollgate_store::MAX_TRANSACT_OPS - 1,
            feed_retention_ms: 86_400_000,
            absorb: false,
        }
    }
}

/// Each option has a setter: `UsageOptions::default().windows(vec![Window::Hourly]).consumer("agg-2")`.
impl UsageOptions {
    /// The snapshot windows.
    pub fn windows(mut self, windows: Vec<Window>) -> Self {
        self.windows = windows;
        self
    }
    /// Days a snapshot is kept after its window ends.
    pub fn retention_days(mut self, days: i64) -> Self {
        self.retention_days = days;
        self
    }
    /// Changes read per feed request.
    pub fn batch(mut self, changes: usize) -> Self {
        self.batch = changes;
        self
    }
    /// The consumer name its checkpoint is stored under.
    pub fn consumer(mut self, name: &str) -> Self {
        self.consumer = name.to_string();
        self
    }
    /// Whether to refill, roll, reset and double the buckets that consumed.
    pub fn background(mut self, on: bool) -> Self {
        self.background = on;
        self
    }
    /// Most feed reads in one pass (`None`: until the feed has nothing more).
    pub fn max_batches(mut self, reads: Option<usize>) -> Self {
        self.max_batches = reads;
        self
    }
    /// Most changes summed into one commit.
    pub fn max_pass_changes(mut self, changes: usize) -> Self {
        self.max_pass_changes = changes;
        self
    }
    /// Most snapshot updates in one store transaction (at most 99).
    pub fn commit_items(mut self, items: usize) -> Self {
        self.commit_items = items;
        self
    }
    /// How long counted changes stay in the feed (ms).
    pub fn feed_retention_ms(mut self, ms: i64) -> Self {
        self.feed_retention_ms = ms;
        self
    }
    /// Whether to sum and trim the feed between passes, holding the sums in memory (only
    /// for the sole consumer of an in-process feed).
    pub fn absorb(mut self, on: bool) -> Self {
        self.absorb = on;
        self
    }
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Changes read from the feed.
    pub changes: usize,
    /// Changes that carried usage.
    pub usage_changes: usize,
    /// Snapshot updates written (each snapshot item once per commit; an update found
    /// already applied by another consumer finishing the same claim is not counted).
    pub snapshot_writes: usize,
    /// Writes that moved the checkpoint: one-transaction commits and finalized claims.
    pub commits: usize,
    /// Commits and claims refused because another consumer had moved or claimed the
    /// checkpoint first (their changes were re-read from the winner's checkpoint, never
    /// counted twice).
    pub lost_races: usize,
    /// Claims left on the checkpoint (by a crashed pass, or one running concurrently) that
    /// this pass finished — re-read, applied where not yet, finalized.
    pub claims_finished: usize,
    /// Age (ms) of the oldest change read, at the start of the pass: the feed lag.
    pub lag_ms: i64,
    /// The background work's report.
    pub background: crate::AggregateReport,
}
