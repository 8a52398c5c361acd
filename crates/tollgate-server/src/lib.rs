//! tollgate's HTTP API (axum): acquire, lease adjust / commit / rollback, availability,
//! entity and limit administration, `/healthz` and Prometheus `/metrics`.
//!
//! Run it with [`serve`] (or [`serve_with`]) over a bound listener, or embed
//! [`Server::router`] in your own axum application.
//!
//! # Routes
//!
//! | method | path | body / query | answer |
//! |---|---|---|---|
//! | POST | `/v1/acquire` | `{entity, resource, amounts: {name: tokens}, limits?: [LimitSpec], on_unavailable?, commit?}` | `200 {lease_id, lease_expires_at_ms, statuses, degraded}` or `429` |
//! | POST | `/v1/leases/{id}/adjust` | `{limit, delta}` | `200 {lease_id, consumed}` |
//! | POST | `/v1/leases/{id}/commit` | – | `200 {lease_id, committed, consumed}` |
//! | POST | `/v1/leases/{id}/rollback` | – | `200 {lease_id, rolled_back}` |
//! | GET | `/v1/availability` | `?entity=E&resource=R&amounts=rpm:1,tpm:500` | `200 Availability` |
//! | POST | `/v1/availability` | `{entity, resource, amounts?}` | `200 Availability` |
//! | POST | `/v1/entities` | `{id, name?, parent_id?, metadata?}` | `201 Entity` |
//! | GET, DELETE | `/v1/entities/{id}` | – | `200 Entity` / `200 {deleted_items}` |
//! | PUT, GET, DELETE | `/v1/limits/system` | `{limits: [LimitSpec], on_unavailable?}` | `200 {scope, limits, on_unavailable}` / `{deleted}` |
//! | PUT, GET, DELETE | `/v1/limits/resources/{resource}` | as above | as above |
//! | PUT, GET, DELETE | `/v1/limits/entities/{entity}` | as above (the entity's default) | as above |
//! | PUT, GET, DELETE | `/v1/limits/entities/{entity}/resources/{resource}` | as above | as above |
//! | GET | `/healthz` | – | `200 {status: "ok", backend}` or `503` |
//! | GET | `/metrics` | – | OpenMetrics text |
//!
//! Resources may contain `/` (`openai/gpt-4`): write it as is in the last path segment
//! (`/v1/limits/resources/openai/gpt-4`).
//!
//! A `LimitSpec` is `{name, capacity, refill_amount?, refill_period_ms?, reset_cron?,
//! reset_tz?, reset_after_s?}`: a rate limit names `refill_amount` (per `refill_period_ms`,
//! default 60000), a calendar quota `reset_cron` (+ `reset_tz`, default UTC), a session
//! quota `reset_after_s`.
//!
//! `"commit": true` on an acquire closes the lease at once (nothing to reconcile): no lease
//! is held and `lease_id` is `null`.
//!
//! # Rejections
//!
//! A refused acquire is `429` with `{error: "rate_limit_exceeded", message, retry_after_ms,
//! resets_at_ms, limits: [LimitStatus]}`, a `Retry-After` header (whole seconds, rounded up,
//! at least 1; absent when the request is larger than a limit's capacity and can never be
//! admitted) and the `RateLimit-Policy` / `RateLimit` headers ([`headers`]), which admitted
//! acquires carry too.
//!
//! # Errors
//!
//! Every error is JSON `{error: code, message}` with a stable code ([`error::classify`]);
//! bad input is always `4xx`: `invalid_json` (not JSON), `invalid_request` (wrong shape or
//! unknown field), `invalid_identifier`, `invalid_name`, `invalid_amount` (negative, not an
//! integer, beyond i64 or beyond `MAX_TOKENS`), `invalid_limit`, `unknown_limit`,
//! `no_limits`, `entity_exists`, `entity_not_found`, `lease_not_found`, `lease_closed`,
//! `payload_too_large`, `not_found`, `method_not_allowed`; `store_unavailable` is `503`,
//! `too_many_leases` is `503`, `corrupt_data` (`500`) is only for corrupt stored data.
//!
//! # Leases
//!
//! Leases live in the server's memory for [`ServerConfig::lease_ttl`] (**300 s** by
//! default). **A lease that expires open is committed**: the acquire's debit stands and
//! pending adjustments are written; see [`leases`]. Graceful shutdown applies the same rule
//! to every open lease. A server crash loses only uncommitted adjustments (the debit was
//! written by the acquire).

pub mod error;
pub mod extract;
pub mod headers;
pub mod leases;
pub mod metrics;
mod routes;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tollgate::Limiter;

pub use error::{classify, ApiError, ErrorBody};
pub use leases::LeaseTable;
pub use metrics::Metrics;

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// How long an open lease is held before the expiry rule commits it (default 300 s).
    pub lease_ttl: Duration,
    /// How often expired leases are swept (default 1 s).
    pub sweep_interval: Duration,
    /// Most leases held at once; an acquire beyond it is `503 too_many_leases` before
    /// anything is debited (default 1,000,000).
    pub max_leases: usize,
    /// Largest request body in bytes (default 64 KiB).
    pub body_limit: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            lease_ttl: Duration::from_secs(300),
            sweep_interval: Duration::from_secs(1),
            max_leases: 1_000_000,
            body_limit: 64 * 1024,
        }
    }
}

/// Shared state of the handlers.
#[derive(Debug)]
pub struct AppState {
    /// The limiter.
    pub limiter: Limiter,
    /// Held leases.
    pub leases: Arc<LeaseTable>,
    /// Metrics.
    pub metrics: Metrics,
    /// Settings.
    pub config: ServerConfig,
}

/// A server: state plus its router. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Server {
    state: Arc<AppState>,
}

impl Server {
    /// A server over `limiter`.
    pub fn new(limiter: Limiter, config: ServerConfig) -> Self {
        let leases = Arc::new(LeaseTable::default());
        let metrics = Metrics::new(limiter.clone(), leases.clone());
        Server {
            state: Arc::new(AppState {
                limiter,
                leases,
                metrics,
                config,
            }),
        }
    }

    /// The shared state.
    pub fn state(&self) -> &Arc<AppState> {
        &self.state
    }

    /// The axum router of every route.
    pub fn router(&self) -> Router {
        routes::router(self.state.clone())
    }

    /// Apply the expiry rule to leases expired by now; returns how many open leases were
    /// committed.
    pub async fn sweep(&self) -> usize {
        let taken = self
            .state
            .leases
            .take_expired(Some(std::time::Instant::now()));
        leases::expire(taken).await
    }

    /// Apply the expiry rule to every held lease (graceful shutdown).
    pub async fn expire_all(&self) -> usize {
        let taken = self.state.leases.take_expired(None);
        leases::expire(taken).await
    }

    /// Spawn the periodic sweeper (abort the handle to stop it).
    pub fn spawn_sweeper(&self) -> JoinHandle<()> {
        let me = self.clone();
        let every = self
            .state
            .config
            .sweep_interval
            .max(Duration::from_millis(10));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let n = me.sweep().await;
                if n > 0 {
                    tracing::debug!(committed = n, "expired leases committed");
                }
            }
        })
    }
}

/// Serve `limiter` on `listener` with default settings until `shutdown` completes.
pub async fn serve(
    limiter: Limiter,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(limiter, listener, ServerConfig::default(), shutdown).await
}

/// Serve with explicit settings. On `shutdown`, in-flight requests finish, the sweeper
/// stops, and every open lease is expired (committed) before this returns.
pub async fn serve_with(
    limiter: Limiter,
    listener: TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let server = Server::new(limiter, config);
    let sweeper = server.spawn_sweeper();
    let r = axum::serve(listener, server.router())
        .with_graceful_shutdown(shutdown)
        .await;
    sweeper.abort();
    let n = server.expire_all().await;
    tracing::info!(committed_leases = n, "server stopped");
    r
}
