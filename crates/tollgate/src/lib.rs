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
//!     .set_limits(&Scope::Resource("gpt-4".into()), &[
//!         Limit::per_minute("rpm", 60)?,
//!         Limit::per_minute("tpm", 100_000)?,
//!     ], None)
//!     .await?;
//! let mut lease = limiter.acquire("user-1", "gpt-4", &[("rpm", 1), ("tpm", 500)]).await?;
//! lease.adjust("tpm", 230)?; // the response used 730 tokens
//! lease.commit().await?;
//! # Ok(()) }
//! ```

mod acquire;
mod availability;
mod caches;
mod cascade;
pub mod clock;
pub mod config;
mod error;
mod lease;
mod limiter;
mod shards;
#[cfg(feature = "testing")]
pub mod testing;

pub use acquire::AcquireOptions;
pub use availability::Availability;
pub use clock::{Clock, ManualClock, PinnedRng, SeededRng, ShardRng, SystemClock};
pub use config::{OnUnavailable, Scope};
pub use error::{Error, Exceeded, Result};
pub use lease::Lease;
pub use limiter::{Entity, Limiter, LimiterBuilder, NewEntity, Options, StatsSnapshot};
pub use shards::should_double;
pub use tollgate_core::{Limit, LimitSpec, LimitStatus};
