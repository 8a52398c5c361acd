//! [`LimiterBuilder`]: builds a [`Limiter`] from a store, a clock, an RNG and [`Options`].

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::ids::validate_entity_id;
use tollgate_store::Store;

use super::{Inner, Limiter, Options, Stats};
use crate::caches::{RejectionCache, ShardCache};
use crate::clock::{Clock, SeededRng, ShardRng, SystemClock};
use crate::config::{ConfigCache, OnUnavailable};
use crate::error::Result;

/// Builds a [`Limiter`].
pub struct LimiterBuilder {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    rng: Arc<dyn ShardRng>,
    opts: Options,
    principal: String,
    audit_seed: u64,
    /// How long a slow pass waits for its shard's write gate (the store deadline).
    gate_wait: Duration,
    /// Opened from the namespace registry (see `open_namespace`).
    pub(crate) registered: bool,
}

impl LimiterBuilder {
    /// Whom administrative changes are recorded for (default
    /// [`crate::recording::DEFAULT_PRINCIPAL`]; per call, [`Limiter::acting_as`]).
    pub fn principal(mut self, p: &str) -> Self {
        self.principal = p.into();
        self
    }
    /// Seed the random part of audit record ids (default: a random seed). A simulation
    /// that replays a seed exactly sets it.
    pub fn audit_seed(mut self, seed: u64) -> Self {
        self.audit_seed = seed;
        self
    }
    /// How long audit records are kept (default 90 days).
    pub fn audit_retention(mut self, d: Duration) -> Self {
        self.opts.audit_retention = d;
        self
    }
    /// Inject a clock.
    pub fn clock(mut self, c: Arc<dyn Clock>) -> Self {
        self.clock = c;
        self
    }
    /// Inject the shard-draw RNG.
    pub fn rng(mut self, r: Arc<dyn ShardRng>) -> Self {
        self.rng = r;
        self
    }
    /// Set every option.
    pub fn options(mut self, o: Options) -> Self {
        self.opts = o;
        self
    }
    /// Namespace.
    pub fn namespace(mut self, ns: &str) -> Self {
        self.opts.namespace = ns.into();
        self
    }
    /// Config cache TTL.
    pub fn config_cache_ttl(mut self, ttl: Duration) -> Self {
        self.opts.config_cache_ttl = ttl;
        self
    }
    /// Bound every store request by `d` (`tollgate_store::Deadline`): a hung store becomes
    /// an outage within `d` and the `on_unavailable` policy decides (a read that ran out is
    /// `Unavailable`, a write `Ambiguous`). For an acquire path, about 1 s.
    pub fn store_timeout(mut self, d: Duration) -> Self {
        self.store = Arc::new(tollgate_store::Deadline::new(self.store, d));
        self.gate_wait = d;
        self
    }
    /// How long past its TTL a config entry is served while the store cannot be read.
    pub fn config_stale_max(mut self, d: Duration) -> Self {
        self.opts.config_stale_max = d;
        self
    }
    /// Default fail-open / fail-closed policy.
    pub fn on_unavailable(mut self, o: OnUnavailable) -> Self {
        self.opts.on_unavailable = o;
        self
    }
    /// Enable or disable the speculative fast path.
    pub fn speculative(mut self, on: bool) -> Self {
        self.opts.speculative = on;
        self
    }
    /// Rejection cache TTL (0 disables it).
    pub fn rejection_cache_ttl(mut self, ttl: Duration) -> Self {
        self.opts.rejection_cache_ttl = ttl;
        self
    }
    /// TTL multiplier for buckets whose limits come from defaults (0: no TTL; a negative
    /// value counts as 0).
    pub fn ttl_multiplier(mut self, m: i64) -> Self {
        self.opts.ttl_multiplier = m.max(0);
        self
    }
    /// The most shards this client doubles an entity's resource to (1 to 32; a value out
    /// of range is clamped into it).
    pub fn max_shard_count(mut self, n: i64) -> Self {
        self.opts.max_shard_count = n.clamp(1, tollgate_core::bucket::MAX_SHARD_COUNT);
        self
    }
    /// The store the limiter will use.
    pub(crate) fn store_handle(&self) -> Arc<dyn Store> {
        self.store.clone()
    }
    /// Build.
    pub fn build(self) -> Result<Limiter> {
        validate_entity_id(&self.opts.namespace)?;
        crate::recording::validate_principal(&self.principal)?;
        let ttl_ms = i64::try_from(self.opts.config_cache_ttl.as_millis()).unwrap_or(i64::MAX);
        let rej_ms = i64::try_from(self.opts.rejection_cache_ttl.as_millis()).unwrap_or(i64::MAX);
        let stale_ms = i64::try_from(self.opts.config_stale_max.as_millis()).unwrap_or(i64::MAX);
        Ok(Limiter {
            inner: Arc::new(Inner {
                store: self.store,
                clock: self.clock,
                rng: self.rng,
                config: ConfigCache::new(ttl_ms)
                    .with_stale_max(stale_ms)
                    .registered(self.registered),
                shards: ShardCache::default(),
                rejections: RejectionCache::new(rej_ms),
                stats: Stats::default(),
                closures: Default::default(),
                audit_ids: crate::recording::AuditIds::new(self.audit_seed),
                gate_wait: self.gate_wait,
                opts: self.opts,
            }),
            principal: Arc::from(self.principal.as_str()),
        })
    }
}

impl Limiter {
    /// Start building a limiter over `store`.
    pub fn builder(store: Arc<dyn Store>) -> LimiterBuilder {
        LimiterBuilder {
            store,
            clock: Arc::new(SystemClock),
            rng: Arc::new(SeededRng::new(rand::random())),
            opts: Options::default(),
            principal: crate::recording::DEFAULT_PRINCIPAL.into(),
            audit_seed: rand::random(),
            gate_wait: super::DEFAULT_GATE_WAIT,
            registered: false,
        }
    }

    /// A limiter over `store` with default options.
    pub fn new(store: Arc<dyn Store>) -> Result<Self> {
        Self::builder(store).build()
    }
}
