//! tollgate: a distributed rate limiter and quota engine.
//!
//! A [`Limiter`] answers "may entity E use resource R now, spending these amounts?" from
//! shared state in any [`tollgate_store::Store`]: token buckets that drip, quotas that reset on
//! a calendar or a fixed time after first use, several limits charged at once, estimates
//! reconciled afterwards through a [`Lease`], hot entities spread over shards.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tollgate::Error> {
//! use std::sync::Arc;
//! use tollgate::{Limit, Limiter, Scope};
//! use tollgate_store::MemoryStore;
//!
//! let limiter = Limiter::new(Arc::new(MemoryStore::new()))?;
//! limiter
//!     .admin()
//!     .set_limits(&Scope::Resource("gpt-4".into()), &[
//!         Limit::per_minute("rpm", 60)?,
//!         Limit::per_minute("tpm", 100_000)?,
//!     ])
//!     .await?;
//! let mut lease = limiter.acquire("user-1", "gpt-4", &[("rpm", 1), ("tpm", 500)]).await?;
//! lease.adjust("tpm", 230)?; // the response used 730 tokens
//! lease.commit().await?;
//! # Ok(()) }
//! ```
//!
//! What a request calls is on the [`Limiter`]; what an operator changes (limits, modes,
//! entities, resets, namespaces, purges) is on [`Limiter::admin`]. Amounts are whole tokens
//! per limit name: a slice of pairs as above, or an [`Amounts`].
//!
//! # Leases that any process can finish
//!
//! [`Limiter::lease_token`] turns a lease into a signed, self-contained token;
//! [`Limiter::resume_lease`] rebuilds it on any limiter over the same store that holds the
//! same [`LeaseKey`], where it adjusts, commits and rolls back exactly as where it was
//! granted. A shared lease closes once, wherever it is closed: its first commit or rollback
//! records the closure in the store (one conditional put) before it writes. The rules,
//! the failure directions and the costs are in the `lease_token` module's documentation
//! (repeated in `docs/http-api.md`, section Leases).
//!
//! # The aggregator
//!
//! An [`Aggregator`] built from a `Limiter` does the background work of the original's
//! stream processor, per (entity, resource) — the store contract has no change feed yet, so
//! the caller drives it (on a timer, after a batch, from a queue of hot entities):
//!
//! - [`Aggregator::refill_entity`] rolls fanned-out windows (`share − max(0, tc − wtc)`,
//!   `wa = ws`), applies calendar resets, refills dripping buckets that are being drained and
//!   clamps balances above their ceiling — never anchoring a window, never fanning out. Each
//!   write is pinned on `rf`, `vu`, every rolled `ws`, and (when it stamps a quota grant)
//!   shard 0's count; a write that loses a pin is left for a client. The rule is
//!   `tollgate_core::aggregate::plan_refill`.
//! - [`Aggregator::maybe_double`] doubles a hot entity (projected `wcu` below 20 %) and
//!   clones shard 0 into the new slots; [`Aggregator::clone_missing_shards`] is that clone
//!   step alone (Path 2): window state copied verbatim, `tc = wtc = 0`, quotas funded by a
//!   move from the covering sibling in the same transaction (ADR-145).

mod acquire;
mod admin;
mod aggregator;
pub mod audit;
mod availability;
mod caches;
mod cascade;
pub mod clock;
pub mod config;
pub mod doctor;
mod entities;
mod entity;
mod error;
mod lease;
mod lease_token;
mod levels;
mod limiter;
pub mod limits_file;
pub mod namespace;
mod recording;
pub mod reparent;
mod request;
mod shards;
#[cfg(feature = "testing")]
pub mod testing;
mod usage;

pub use acquire::{
    validate_op_id, AcquireOptions, Amounts, BucketOpOutcome, MultiLease, MAX_OP_ID_CHARS,
};
pub use admin::Admin;
pub use aggregator::{AggregateReport, Aggregator};
pub use audit::{Action, AuditPage, AuditQuery, AuditRecord};
pub use availability::Availability;
pub use clock::{Clock, ManualClock, PinnedRng, SeededRng, ShardRng, SystemClock};
pub use config::{OnUnavailable, Scope};
pub use doctor::{CorruptItem, DoctorReport, ItemKind, Repair};
pub use entities::{Entity, EntityDeleted, NewEntity};
pub use error::{Error, Exceeded, Result};
pub use lease::Lease;
pub use lease_token::{
    LeaseKey, LeaseKeyError, LeaseToken, CLOSURE_MARGIN_S, LATE_CLOSE_MS, MAX_TOKEN_BYTES,
    MIN_KEY_BYTES,
};
pub use limiter::{Limiter, LimiterBuilder, Options, StatsSnapshot};
pub use namespace::{Namespace, NamespaceStatus};
pub use reparent::Moved;
pub use shards::should_double;
pub use tollgate_core::bypass::Enforcement;
pub use tollgate_core::merge::{Merge, MergeSpec, PatchSpec};
pub use tollgate_core::usage::{Snapshot, Window};
pub use tollgate_core::{Limit, LimitSpec, LimitStatus};
pub use usage::{checkpoint_key, FeedAggregator, PassReport, UsageOptions, UsagePage, UsageQuery};
