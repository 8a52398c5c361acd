//! [`Stats`]: counters of what the limiter did, and their [`StatsSnapshot`].

use std::sync::atomic::{AtomicU64, Ordering};

use super::Limiter;

/// Counters of what the limiter did (not store requests: see `tollgate_store::Counting`).
#[derive(Debug, Default)]
pub struct Stats {
    pub(crate) fast_admits: AtomicU64,
    pub(crate) slow_admits: AtomicU64,
    pub(crate) rejections: AtomicU64,
    pub(crate) local_rejections: AtomicU64,
    pub(crate) doublings: AtomicU64,
    pub(crate) fanout_writes: AtomicU64,
    pub(crate) fanout_failures: AtomicU64,
    pub(crate) degraded: AtomicU64,
}

/// A snapshot of [`Stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StatsSnapshot {
    /// Admitted by the speculative write.
    pub fast_admits: u64,
    /// Admitted by the slow path (read + rf-locked write, create or retry).
    pub slow_admits: u64,
    /// Refused.
    pub rejections: u64,
    /// Refused with no store request (rejection cache).
    pub local_rejections: u64,
    /// Shard-count doublings this process won.
    pub doublings: u64,
    /// Rollover fan-out writes that landed.
    pub fanout_writes: u64,
    /// Rollover fan-out writes refused by their condition or failed.
    pub fanout_failures: u64,
    /// Degraded (fail-open) leases.
    pub degraded: u64,
}

impl Stats {
    pub(crate) fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
    fn snapshot(&self) -> StatsSnapshot {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            fast_admits: l(&self.fast_admits),
            slow_admits: l(&self.slow_admits),
            rejections: l(&self.rejections),
            local_rejections: l(&self.local_rejections),
            doublings: l(&self.doublings),
            fanout_writes: l(&self.fanout_writes),
            fanout_failures: l(&self.fanout_failures),
            degraded: l(&self.degraded),
        }
    }
}

impl Limiter {
    /// What the limiter did so far.
    pub fn stats(&self) -> StatsSnapshot {
        self.inner.stats.snapshot()
    }
}
