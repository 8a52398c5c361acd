//! [`Request`]: a validated acquire as the write paths share it — the acquire, a lease's
//! adjustments and refunds, the entity-wide debit, the cascade to a parent and shard
//! probing — and the backoff of their bounded retries.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::bypass::Enforcement;
use tollgate_core::plan::Ask;
use tollgate_core::writes::TtlWrite;
use tollgate_core::Limit;

/// A validated request.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    /// Shared with the lease granted for it.
    pub entity: Arc<str>,
    pub resource: Arc<str>,
    /// Named amounts in millitokens, shared with the lease granted for it (cloning a
    /// request allocates nothing).
    pub amounts: Arc<[(String, i64)]>,
    /// Shared with the config cache (and with the lease): cloning a request copies no limit.
    pub limits: Arc<[Limit]>,
    pub params_hash: Arc<str>,
    pub ttl: TtlWrite,
    /// The effective cascade policy, stamped on the items the slow path writes (ADR-146);
    /// `request` leaves it off, the caller sets it from the resolved config.
    pub cascade: bool,
    /// ADR-151: the shape the next write is made in — bypassed (`tc` and `wcu` only) or
    /// enforced. A guess from the image this process last saw until a write or read shows
    /// the item's `bypass` stamp, which then decides (see `tollgate_core::bypass`).
    pub bypass: bool,
    /// The mode the config sets for the pair (`None`: no level sets one, enforced). A
    /// slow pass brings the item's stamp in line with it
    /// (`tollgate_core::bypass::flip`), after confirming it when it came from the cache.
    pub mode: Option<Enforcement>,
    /// `mode` was read consistently during this acquire (`confirm_mode`): a stamp that
    /// disagrees is the stale one, flipped without another read.
    pub mode_confirmed: bool,
}

pub(crate) use tollgate_core::plan::CountPin;

/// How the slot's own conditional write (with what committed with it) ended.
#[derive(Debug)]
pub(crate) enum Landed {
    /// It applied; the item it returned (`ALL_NEW`, shared with the store where it keeps
    /// items shared), when one write carried it alone.
    Wrote(Option<Arc<tollgate_core::value::Item>>),
    /// Its condition failed (rf lock lost, create race lost, or a pinned balance moved);
    /// the item as it was when it failed, if known.
    LostLock(Option<Box<tollgate_core::value::Item>>),
}

/// The pause before retry `attempt` of a contended write: 25 ms doubling, at most 200 ms.
pub(crate) fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(25u64 << attempt.min(3))
}

impl Request {
    /// The request as the core's planner sees it.
    pub(crate) fn ask(&self) -> Ask<'_> {
        Ask {
            limits: &self.limits,
            amounts: &self.amounts,
            params_hash: &self.params_hash,
            ttl: self.ttl,
            cascade: self.cascade,
            bypass: self.bypass,
            mode: self.mode,
        }
    }
}
