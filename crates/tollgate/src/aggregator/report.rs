//! What one aggregator call did.

/// What one aggregator call did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AggregateReport {
    /// Shard items read.
    pub shards_read: usize,
    /// Refill writes that landed.
    pub refilled_items: usize,
    /// Limits rolled into a fanned-out window (over the landed writes).
    pub rolled: usize,
    /// Calendar resets applied.
    pub reset: usize,
    /// Dripping limits refilled because they were being drained.
    pub refilled: usize,
    /// Balances clamped down to their ceiling.
    pub clamped: usize,
    /// Items left for a client because a pending window had already ended.
    pub skipped: usize,
    /// Writes refused by their pins (another writer got there first; nothing was applied).
    pub lost: usize,
    /// The shard count before and after a doubling this call made or adopted.
    pub doubled: Option<(i64, i64)>,
    /// Slots created by a Path-2 clone.
    pub cloned: Vec<u32>,
    /// Store write requests issued (each transaction counts once).
    pub writes: usize,
}

impl AggregateReport {
    pub(crate) fn merge(&mut self, o: AggregateReport) {
        self.shards_read += o.shards_read;
        self.refilled_items += o.refilled_items;
        self.rolled += o.rolled;
        self.reset += o.reset;
        self.refilled += o.refilled;
        self.clamped += o.clamped;
        self.skipped += o.skipped;
        self.lost += o.lost;
        self.doubled = self.doubled.or(o.doubled);
        self.cloned.extend(o.cloned);
        self.writes += o.writes;
    }
}
