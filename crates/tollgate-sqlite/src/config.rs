//! [`SqliteConfig`]: how a [`crate::SqliteStore`] opens its file and bounds its calls.

use std::time::Duration;

use tollgate_store::StoreError;

/// The default per-call deadline: suited to an acquire path (far above a commit's fsync, short
/// enough that a locked file turns into "unavailable" before a client gives up).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(1);

/// The default cap on the lock wait (see [`SqliteConfig::busy_timeout`]).
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The default bound on one group commit: 256 operations.
pub const DEFAULT_MAX_BATCH_OPS: usize = 256;

/// How a [`crate::SqliteStore`] opens its file and bounds its calls.
///
/// Build it from the default and the setters, so new fields do not break callers:
/// `SqliteConfig::default().with_deadline(Duration::from_millis(250))`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteConfig {
    /// The longest a store call waits in all (for the writer, for a read connection, and for
    /// another connection's or process's write lock) before it fails with
    /// [`StoreError::Unavailable`]. A write already executing when its deadline passes is
    /// finished and answered (its result is real); one still queued is refused unapplied.
    pub deadline: Duration,
    /// The longest SQLite waits for another connection's lock: at open (the schema check) in
    /// full, and on a call capped by what is left of the call's [`Self::deadline`].
    pub busy_timeout: Duration,
    /// The most operations one group commit (one `BEGIN IMMEDIATE` … `COMMIT`, one fsync)
    /// carries; a transaction counts its items. A request larger than this goes alone.
    pub max_batch_ops: usize,
    /// The most changes a feed read that must rebuild changes from their rows keeps beyond
    /// the batch it returns, for the reads after it (`feed::REBUILD_WINDOW` by default;
    /// see `feed::read_in`): memory against the walks a lagging reader makes.
    pub feed_rebuild_window: usize,
}

impl Default for SqliteConfig {
    /// Deadline 1 s ([`DEFAULT_DEADLINE`]), busy timeout 5 s, batches of at most 256
    /// operations, feed rebuilds kept for 16,384 changes.
    fn default() -> Self {
        SqliteConfig {
            deadline: DEFAULT_DEADLINE,
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            max_batch_ops: DEFAULT_MAX_BATCH_OPS,
            feed_rebuild_window: crate::feed::REBUILD_WINDOW,
        }
    }
}

impl SqliteConfig {
    /// Set the per-call deadline.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Set the lock wait cap.
    pub fn with_busy_timeout(mut self, busy_timeout: Duration) -> Self {
        self.busy_timeout = busy_timeout;
        self
    }

    /// Set the group commit bound (1 = one transaction per operation, as before group commit).
    pub fn with_max_batch_ops(mut self, max_batch_ops: usize) -> Self {
        self.max_batch_ops = max_batch_ops;
        self
    }

    /// Set how many rebuilt changes a feed read keeps for the next reads (0: none).
    pub fn with_feed_rebuild_window(mut self, changes: usize) -> Self {
        self.feed_rebuild_window = changes;
        self
    }

    /// Refuse settings that cannot work: a zero deadline would refuse every call, a zero
    /// batch bound would never commit.
    pub(crate) fn validate(&self) -> Result<(), StoreError> {
        if self.deadline.is_zero() {
            return Err(StoreError::Validation(
                "sqlite config: the deadline must be above zero".into(),
            ));
        }
        if self.max_batch_ops == 0 {
            return Err(StoreError::Validation(
                "sqlite config: max_batch_ops must be at least 1".into(),
            ));
        }
        Ok(())
    }
}
