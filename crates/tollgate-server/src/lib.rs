//! tollgate's HTTP API (axum over hyper): acquire, lease adjust / commit / rollback,
//! availability, entity and limit administration, health and readiness, Prometheus
//! `/metrics`.
//!
//! **The API is documented in `docs/http-api.md`** at the repository root: every route, its
//! body and answer, the role it needs, every error code, the `LimitSpec` fields. A test
//! (`tests/api_doc.rs`) compares that document with the route table ([`routes`]) and the
//! error codes ([`error::CODES`]), so neither can change without the other.
//!
//! Run it with [`serve`] / [`serve_with`] over a bound listener, or [`Server::serve`] for a
//! server built with [`Server::builder`] (authentication, store metrics); or embed
//! [`Server::router`] in your own axum application.
//!
//! # At the edge
//!
//! - **Authentication** ([`auth`]): bearer tokens with roles `client` and `admin`; without
//!   tokens every route is open (the CLI then refuses to listen beyond loopback unless told
//!   `--insecure-no-auth`).
//! - **Per-call limits** in an acquire are refused with `403 overrides_disabled` unless
//!   [`ServerConfig::allow_limit_overrides`] or the caller has an admin token.
//! - **Connections** ([`listen`]): hyper's header read timeout (which also closes idle
//!   keep-alive connections), tower-http's request body timeout and request timeout, a
//!   maximum number of connections, a body limit, a URI limit and a request head limit.
//! - **Observability**: a request id on every request and answer ([`request_id`]), one
//!   access-log line per request ([`access`]), bounded metric labels and store latency
//!   histograms ([`metrics`]).
//! - **Errors**: every error answer is JSON `{error, message}` with a stable code, including
//!   the framework's `404`/`405`/`413`, the URI limit's `414` and hyper's own `400`/`414`/`431`
//!   ([`wire`]).
//!
//! # Leases
//!
//! **Any server sharing the store can finish a lease.** The acquire's `lease_id` is the
//! lease's signed, self-contained token (its whole state, HMAC-SHA256 under
//! [`ServerConfig::lease_key`]): adjust, commit and rollback work on every server over the
//! same store with the same key, and no lease item is written at acquire (a warm admitted
//! acquire stays one store write). Each adjust answers the token of the next version:
//! **always pass the latest token** (an older one than a server holds is `409
//! lease_stale`). A lease closes once, wherever it is closed: its first commit or
//! rollback records the closure in the store (one conditional put) before it writes; a
//! second close anywhere is `409 lease_closed`. Without a configured key each process signs
//! with a random one (logged at start): its leases then finish only on the server that
//! granted them.
//!
//! A lease is held for [`ServerConfig::lease_ttl`] (**300 s** by default). **A lease that
//! expires open is committed**: the acquire's debit stands and the adjustments the holding
//! server saw are written; see [`leases`]. Graceful shutdown applies the same rule to every
//! open lease. A server crash loses only the adjustments sent to it and not committed (the
//! debit was written by the acquire); another server finishes the lease from its token.

pub mod access;
mod acquire_json;
pub mod aggregate;
pub mod auth;
pub mod cron;
mod edge;
pub mod error;
pub mod extract;
pub mod grpc;
pub mod headers;
pub mod leases;
pub mod listen;
pub mod metrics;
pub mod request_id;
mod routes;
pub mod wire;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tollgate::Limiter;

pub use auth::{Auth, Principal, Role, TokenSet};
pub use error::{classify, ApiError, ErrorBody};
pub use leases::LeaseTable;
pub use metrics::{Metrics, StoreMetrics};
pub use routes::{routes, scope_name, snapshot_json, warnings, RouteInfo, Warning};

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
    /// Largest request body in bytes (default 64 KiB); larger is `413 payload_too_large`.
    pub body_limit: usize,
    /// Whether any caller may send per-call `limits` in an acquire (default false: only an
    /// authenticated admin may; others get `403 overrides_disabled`).
    pub allow_limit_overrides: bool,
    /// How long a connection may take to send a complete request head, counted from when the
    /// server starts waiting for it: at connect, and after each answer on a keep-alive
    /// connection — so this is also the idle keep-alive timeout (default 10 s). The
    /// connection is closed without an answer when it passes (hyper's
    /// `header_read_timeout`).
    pub header_timeout: Duration,
    /// How long the body may take between chunks once a handler reads it (default 10 s);
    /// then `408 body_timeout` and the connection is closed (tower-http's
    /// `RequestBodyTimeout`).
    pub body_timeout: Duration,
    /// Longest time a request may spend in the server (default 30 s); then
    /// `503 timeout` (tower-http's `Timeout`).
    pub request_timeout: Duration,
    /// Most connections open at once (default 1024). At the limit the server stops
    /// accepting until one closes; new connections wait in the listen backlog.
    pub max_connections: usize,
    /// Largest request head (request line and headers) in bytes (default 16 KiB); larger is
    /// `431 headers_too_large`.
    pub max_header_bytes: usize,
    /// Longest request URI (path and query) in bytes (default 8 KiB); longer is
    /// `414 uri_too_long`.
    pub max_uri_bytes: usize,
    /// How long a graceful shutdown waits for open connections to finish (default 30 s).
    pub shutdown_timeout: Duration,
    /// The key lease tokens are signed with: the same on every server that should finish
    /// the others' leases (see [`leases`]). `None` (the default): a random key for this
    /// process, so its leases finish only here.
    pub lease_key: Option<tollgate::LeaseKey>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            lease_ttl: Duration::from_secs(300),
            sweep_interval: Duration::from_secs(1),
            max_leases: 1_000_000,
            body_limit: 64 * 1024,
            allow_limit_overrides: false,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            max_connections: 1024,
            max_header_bytes: 16 * 1024,
            max_uri_bytes: 8 * 1024,
            shutdown_timeout: Duration::from_secs(30),
            lease_key: None,
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
    /// Authentication; `None`: every route is open to anyone.
    pub auth: Option<Arc<Auth>>,
    /// The key lease tokens are signed with (the configured one, or this process's own).
    pub lease_key: tollgate::LeaseKey,
    /// The in-process feed aggregator, when the server runs one.
    pub aggregator: Option<aggregate::AggregatorRun>,
}

/// A server: state plus its router. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Server {
    state: Arc<AppState>,
}

/// Builds a [`Server`] with authentication or store metrics.
#[derive(Debug)]
pub struct ServerBuilder {
    limiter: Limiter,
    config: ServerConfig,
    auth: Option<Arc<Auth>>,
    store_metrics: Option<StoreMetrics>,
    aggregator: Option<aggregate::AggregatorRun>,
    group_commit: Option<tollgate_sqlite::SqliteStore>,
}

impl ServerBuilder {
    /// Expose the group-commit counters of the limiter's embedded store at `/metrics`
    /// (`tollgate_sqlite_*`): pass the same [`tollgate_sqlite::SqliteStore`] (a handle: its
    /// clones share one writer).
    pub fn group_commit(mut self, store: tollgate_sqlite::SqliteStore) -> Self {
        self.group_commit = Some(store);
        self
    }

    /// Run this feed aggregator in-process while serving (its counters go to `/metrics`).
    pub fn aggregator(mut self, run: aggregate::AggregatorRun) -> Self {
        self.aggregator = Some(run);
        self
    }

    /// Settings.
    pub fn config(mut self, config: ServerConfig) -> Self {
        self.config = config;
        self
    }

    /// Require bearer tokens (see [`auth`]).
    pub fn auth(mut self, auth: Arc<Auth>) -> Self {
        self.auth = Some(auth);
        self
    }

    /// Expose the metrics of the limiter's store, which must have been wrapped with
    /// [`StoreMetrics::wrap`] before the limiter was built.
    pub fn store_metrics(mut self, m: StoreMetrics) -> Self {
        self.store_metrics = Some(m);
        self
    }

    /// The server.
    pub fn build(self) -> Server {
        let lease_key = match &self.config.lease_key {
            Some(k) => k.clone(),
            None => {
                tracing::warn!("no lease key configured: this process signs leases with a random key, so they can be finished only on this server (give every server the same --lease-secret-file or TOLLGATE_LEASE_SECRET)");
                tollgate::LeaseKey::random()
            }
        };
        let leases = Arc::new(LeaseTable::default());
        let mut metrics = Metrics::new(self.limiter.clone(), leases.clone(), self.store_metrics);
        if let Some(a) = &self.aggregator {
            metrics.aggregator(a.stats.clone());
        }
        if let Some(store) = self.group_commit {
            metrics.group_commit(store);
        }
        Server {
            state: Arc::new(AppState {
                limiter: self.limiter,
                leases,
                metrics,
                config: self.config,
                auth: self.auth,
                lease_key,
                aggregator: self.aggregator,
            }),
        }
    }
}

impl Server {
    /// A server over `limiter` without authentication.
    pub fn new(limiter: Limiter, config: ServerConfig) -> Self {
        Self::builder(limiter).config(config).build()
    }

    /// A builder over `limiter` (default settings, no authentication).
    pub fn builder(limiter: Limiter) -> ServerBuilder {
        ServerBuilder {
            limiter,
            config: ServerConfig::default(),
            auth: None,
            store_metrics: None,
            aggregator: None,
            group_commit: None,
        }
    }

    /// The shared state.
    pub fn state(&self) -> &Arc<AppState> {
        &self.state
    }

    /// The axum router of every route, with the request id, access log, JSON error,
    /// authentication, timeout and body limit layers.
    pub fn router(&self) -> Router {
        routes::router(self.state.clone())
    }

    /// Apply the expiry rule to leases expired by now (the limiter's clock); returns how
    /// many open leases were committed. Then delete the closure records this server wrote
    /// that are past their `ttl`, on a store without native TTL (see [`leases`]).
    pub async fn sweep(&self) -> usize {
        let lim = &self.state.limiter;
        let taken = self.state.leases.take_expired(Some(lim.clock().now_ms()));
        let n = leases::expire(taken).await;
        if let Err(e) = lim.admin().purge_lease_closures().await {
            tracing::warn!(error = %e, "lease closure records not purged; retried next sweep");
        }
        n
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

    /// Serve on `listener` until `shutdown` completes. Then: stop accepting, let open
    /// connections finish (at most [`ServerConfig::shutdown_timeout`]), stop the sweeper,
    /// and expire (commit) every open lease before returning.
    pub async fn serve(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let sweeper = self.spawn_sweeper();
        let aggregator = self
            .state
            .aggregator
            .clone()
            .map(|a| tokio::spawn(a.run_forever()));
        let r = listen::run(self.state.clone(), self.router(), listener, shutdown).await;
        sweeper.abort();
        if let Some(a) = aggregator {
            a.abort();
        }
        let n = self.expire_all().await;
        tracing::info!(committed_leases = n, "server stopped");
        r
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

/// Serve with explicit settings (no authentication); see [`Server::serve`].
pub async fn serve_with(
    limiter: Limiter,
    listener: TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    Server::new(limiter, config).serve(listener, shutdown).await
}
