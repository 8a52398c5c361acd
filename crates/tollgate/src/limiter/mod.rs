//! The `Limiter` handle and the state it shares ([`Inner`]): the store, the clock, the
//! caches and the counters. What it does is in the modules above it — acquire, leases,
//! availability, administration — each an `impl Limiter` or `impl Inner` block that uses
//! this module and never the other way round (`tests/module_graph.rs`).
//!
//! Split by what each part holds: [`Options`] (`options`), the builder (`builder`) and the
//! counters (`stats`).

mod builder;
mod options;
mod stats;

use std::sync::Arc;

use tollgate_store::Store;

use crate::caches::{RejectionCache, ShardCache};
use crate::clock::{Clock, ShardRng};
use crate::config::ConfigCache;

pub use builder::LimiterBuilder;
pub use options::Options;
pub use stats::{Stats, StatsSnapshot};

/// Shared state behind a [`Limiter`] handle.
pub struct Inner {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    rng: Arc<dyn ShardRng>,
    opts: Options,
    config: ConfigCache,
    /// Shard counts, images and write gates, one entry per shard.
    shards: ShardCache,
    rejections: RejectionCache,
    stats: Stats,
    /// Closure records of shared leases to delete later (stores without native TTL).
    closures: crate::caches::Closures,
    /// Ids of audit records.
    audit_ids: crate::recording::AuditIds,
    /// The longest a slow pass waits for its shard's write gate: the store deadline
    /// (`LimiterBuilder::store_timeout`), else [`DEFAULT_GATE_WAIT`].
    gate_wait: std::time::Duration,
}

/// How long a slow pass waits for its shard's write gate when the store has no deadline of
/// the builder's: about one slow store request.
pub(crate) const DEFAULT_GATE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("backend", &self.store.backend())
            .field("opts", &self.opts)
            .finish()
    }
}

impl Inner {
    /// The store every read and write goes to.
    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }
    /// The longest a slow pass waits for its shard's write gate.
    pub(crate) fn gate_wait(&self) -> std::time::Duration {
        self.gate_wait
    }
    /// The injected clock.
    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }
    /// The source of shard choices.
    pub(crate) fn rng(&self) -> &Arc<dyn ShardRng> {
        &self.rng
    }
    /// The options the limiter was built with.
    pub(crate) fn opts(&self) -> &Options {
        &self.opts
    }
    /// The config cache.
    pub(crate) fn config(&self) -> &ConfigCache {
        &self.config
    }
    /// The shard counts this process has seen, per (entity, resource): the shard cache,
    /// named for what these callers take from it ([`ShardCache::count`],
    /// [`ShardCache::raise`]).
    pub(crate) fn shards(&self) -> &ShardCache {
        &self.shards
    }
    /// The rejection cache.
    pub(crate) fn rejections(&self) -> &RejectionCache {
        &self.rejections
    }
    /// The bucket images this process last saw and the shards' write gates: the same
    /// shard cache as [`Inner::shards`], named for what these callers take from it.
    pub(crate) fn images(&self) -> &ShardCache {
        &self.shards
    }
    /// The counters.
    pub(crate) fn stats(&self) -> &Stats {
        &self.stats
    }
    /// The closure records to delete later (stores without native TTL).
    pub(crate) fn closures(&self) -> &crate::caches::Closures {
        &self.closures
    }
    /// The ids of audit records.
    pub(crate) fn audit_ids(&self) -> &crate::recording::AuditIds {
        &self.audit_ids
    }

    pub(crate) fn ns(&self) -> &str {
        &self.opts.namespace
    }
}

/// The rate limiter. Cheap to clone; every clone shares caches and the store.
#[derive(Debug, Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
    /// Whom administrative changes are recorded for (see [`Limiter::acting_as`]).
    principal: Arc<str>,
}

impl Limiter {
    /// A limiter over shared state, recording changes for `principal`.
    pub(crate) fn from_parts(inner: Arc<Inner>, principal: Arc<str>) -> Self {
        Limiter { inner, principal }
    }

    /// The shared state.
    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// Whom administrative changes are recorded for.
    pub(crate) fn principal_name(&self) -> &Arc<str> {
        &self.principal
    }

    /// The store's backend name.
    pub fn backend(&self) -> &'static str {
        self.inner.store.backend()
    }

    /// Now, by the injected clock.
    pub(crate) fn now_ms(&self) -> i64 {
        self.inner.clock.now_ms()
    }

    /// The clock this limiter was built with: what its statuses' `retry_after` and
    /// `resets_at_ms` are measured against.
    pub fn clock(&self) -> &dyn Clock {
        self.inner.clock.as_ref()
    }

    /// Whether the store answers: one read of a key that never exists (no item is
    /// written). A store error is returned as it is; no timeout beyond the store's own.
    pub async fn ping(&self) -> crate::Result<()> {
        let probe = tollgate_core::value::Key::new("HEALTH#", "#");
        self.inner.store.get(&probe, false).await?;
        Ok(())
    }

    /// Forget every cached config item, refusal and bucket image.
    pub(crate) fn forget_cached(&self) {
        self.inner.config.clear();
        self.inner.rejections.clear();
        self.inner.images().clear();
    }
}
