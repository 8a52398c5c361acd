//! [`Options`]: the limiter's settings and their defaults.

use std::time::Duration;

use crate::config::OnUnavailable;

/// Limiter settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// Namespace prefix of every key.
    pub namespace: String,
    /// How long resolved limits are cached (0 disables the cache).
    pub config_cache_ttl: Duration,
    /// How long past its TTL a config entry is still served while the store cannot be
    /// read (rule "stale-while-error", see `config`): the limits and the system's
    /// `on_unavailable` hold through an outage up to this long (default 24 h; 0: never
    /// served stale).
    pub config_stale_max: Duration,
    /// Policy when the store cannot be reached and the system config says nothing.
    pub on_unavailable: OnUnavailable,
    /// Use the speculative fast path (one conditional write, no read).
    pub speculative: bool,
    /// TTL multiplier for buckets whose limits come from defaults (0: no TTL).
    pub ttl_multiplier: i64,
    /// How long a seen bucket may refuse requests locally (0 disables it).
    pub rejection_cache_ttl: Duration,
    /// The most shards this client doubles an entity's resource to (1 to 32).
    pub max_shard_count: i64,
    /// How long audit records are kept (their `ttl`; see the `audit` module).
    pub audit_retention: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            namespace: "default".into(),
            config_cache_ttl: Duration::from_secs(60),
            config_stale_max: Duration::from_secs(24 * 3600),
            on_unavailable: OnUnavailable::Block,
            speculative: true,
            ttl_multiplier: 7,
            rejection_cache_ttl: Duration::from_secs(1),
            max_shard_count: tollgate_core::bucket::MAX_SHARD_COUNT,
            audit_retention: crate::recording::DEFAULT_RETENTION,
        }
    }
}
