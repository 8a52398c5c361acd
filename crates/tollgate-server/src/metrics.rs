//! Prometheus metrics (prometheus-client, OpenMetrics text at `GET /metrics`).
//!
//! - `tollgate_http_requests_total{method, route, status}`: every request, by route template
//!   (`unmatched` for paths no route has, `unparsed` for requests hyper could not parse);
//! - `tollgate_http_request_duration_seconds{method, route}`: time inside the server;
//! - `tollgate_acquire_duration_seconds{outcome}`: acquire latency inside the server;
//! - `tollgate_acquires_total{outcome}`: `admitted`, `rejected` (429) or `error`;
//! - `tollgate_store_request_duration_seconds{op, outcome}`: every store request by operation
//!   (`get`, `batch_get`, `put`, `update`, `delete`, `transact_write`, `query`, `scan`,
//!   `purge`) and outcome (`ok`, `condition_failed`, `error`), when the store is wrapped in a
//!   [`MeteredStore`];
//! - `tollgate_store_errors_total{op, kind}`: store errors by operation and kind (the
//!   [`StoreError`] variant: `condition_failed`, `transaction_canceled`, `throttled`,
//!   `ambiguous`, `unavailable`, ...);
//! - `tollgate_limiter_*_total`: the limiter's own counters ([`tollgate::Limiter::stats`]);
//! - `tollgate_leases_held`: leases in the server's table (open or closed tombstones);
//! - `tollgate_aggregator_passes_total{outcome}` (`ok`, `error`), and
//!   `tollgate_aggregator_{changes,usage_changes,snapshot_writes,commits,lost_races,background_writes}_total`:
//!   what the in-process feed aggregator did, when the server runs one;
//! - `tollgate_feed_lag_seconds`: the age of the oldest change its last pass read (0 when
//!   it was caught up);
//! - `tollgate_sqlite_commit_requests` (a histogram: its count the group commits, its sum
//!   the store requests they carried, its buckets the commits by size in requests),
//!   `tollgate_sqlite_commit_items_total`, `tollgate_sqlite_largest_commit_requests`, and
//!   `tollgate_sqlite_{queued,expired,abandoned}_requests_total`: how the embedded store's
//!   writer gathered writes into transactions, and the writes it refused unapplied because
//!   their deadline passed while queued or their caller stopped waiting; when the store is
//!   SQLite ([`tollgate_sqlite::SqliteStore::group_commit_stats`]);
//! - `tollgate_sqlite_feed_{held,decoded,rebuilt}_changes_total`,
//!   `tollgate_sqlite_feed_rebuilds_total` and `tollgate_sqlite_feed_rebuild_rows_total`: how
//!   the change-feed reads of this process were served — from its memory, from rows that
//!   store their images, or rebuilt by walks of the feed (and the rows the walks read) —
//!   when the store is SQLite ([`tollgate_sqlite::SqliteStore::feed_read_stats`]);
//! - `tollgate_build_info{version, backend}`: always 1.
//!
//! Every label takes a bounded set of values: an HTTP method outside the standard ones is
//! counted as `other` ([`method_label`]), so made-up methods cannot grow the series count.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use foldhash::fast::FixedState;

use async_trait::async_trait;
use axum::http::Method;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use tollgate::Limiter;
use tollgate_core::value::{Item, Key};
use tollgate_store::{
    DeleteRequest, PutRequest, Query, ScanPage, Store, StoreError, TransactOp, UpdateRequest,
};

use crate::leases::LeaseTable;

/// The `method` label of an HTTP method: the standard methods by name, anything else
/// `other`.
pub fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "other",
    }
}

/// The method labels ([`method_label`]), in the order of the request series' slots.
const METHOD_LABELS: [&str; 10] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE", "other",
];

/// Labels of `tollgate_http_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// HTTP method ([`method_label`]).
    pub method: &'static str,
    /// Route template (`/v1/leases/{id}/commit`), or `unmatched`.
    pub route: String,
    /// Status code.
    pub status: u16,
}

/// Labels of `tollgate_http_request_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// HTTP method ([`method_label`]).
    pub method: &'static str,
    /// Route template, or `unmatched`.
    pub route: String,
}

/// Labels of the acquire metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `admitted`, `rejected` or `error`.
    pub outcome: &'static str,
}

fn latency_histogram() -> Histogram {
    // 50 µs … ~1.6 s.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

/// Labels of the store latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreLabels {
    /// The store operation.
    pub op: &'static str,
    /// `ok`, `condition_failed` or `error`.
    pub outcome: &'static str,
}

/// Labels of the store error counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreErrorLabels {
    /// The store operation.
    pub op: &'static str,
    /// The error kind ([`error_kind`]).
    pub kind: &'static str,
}

/// The `kind` label of a store error.
pub fn error_kind(e: &StoreError) -> &'static str {
    match e {
        StoreError::ConditionFailed { .. } => "condition_failed",
        StoreError::TransactionCanceled { .. } => "transaction_canceled",
        StoreError::TransactionConflict => "transaction_conflict",
        StoreError::Throttled(_) => "throttled",
        StoreError::Validation(_) => "validation",
        StoreError::Ambiguous(_) => "ambiguous",
        StoreError::Unavailable(_) => "unavailable",
        StoreError::Corrupt(_) => "corrupt",
    }
}

/// The store operations a [`MeteredStore`] records, in the order of its series' slots.
const STORE_OPS: [&str; 9] = [
    "get",
    "batch_get",
    "put",
    "update",
    "delete",
    "transact_write",
    "query",
    "scan",
    "purge",
];

/// The outcomes of a store request, in the order of its series' slots.
const STORE_OUTCOMES: [&str; 3] = ["ok", "condition_failed", "error"];

/// The store error kinds ([`error_kind`]), in the order of its series' slots.
const STORE_ERROR_KINDS: [&str; 8] = [
    "condition_failed",
    "transaction_canceled",
    "transaction_conflict",
    "throttled",
    "validation",
    "ambiguous",
    "unavailable",
    "corrupt",
];

/// Store latency and error metrics, shared by a [`MeteredStore`] and the [`Metrics`] that
/// expose them. Cheap to clone.
#[derive(Debug, Clone)]
pub struct StoreMetrics {
    latency: Family<StoreLabels, Histogram, fn() -> Histogram>,
    errors: Family<StoreErrorLabels, Counter>,
    /// Handles of the series above, found by position instead of by hashing their labels;
    /// each is taken from its family the first time it is recorded (when the family
    /// creates the series, as it would without them).
    slots: Arc<StoreSlots>,
}

#[derive(Debug)]
struct StoreSlots {
    latency: [[OnceLock<Histogram>; STORE_OUTCOMES.len()]; STORE_OPS.len()],
    errors: [[OnceLock<Counter>; STORE_ERROR_KINDS.len()]; STORE_OPS.len()],
}

impl Default for StoreMetrics {
    fn default() -> Self {
        StoreMetrics {
            latency: Family::new_with_constructor(latency_histogram),
            errors: Family::default(),
            slots: Arc::new(StoreSlots {
                latency: std::array::from_fn(|_| std::array::from_fn(|_| OnceLock::new())),
                errors: std::array::from_fn(|_| std::array::from_fn(|_| OnceLock::new())),
            }),
        }
    }
}

impl StoreMetrics {
    /// Fresh metrics.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wrap `store` so every request it serves is recorded here.
    pub fn wrap(&self, store: Arc<dyn Store>) -> Arc<dyn Store> {
        Arc::new(MeteredStore {
            inner: store,
            metrics: self.clone(),
        })
    }

    fn record<T>(&self, op: &'static str, started: Instant, r: &Result<T, StoreError>) {
        let outcome = match r {
            Ok(_) => "ok",
            Err(StoreError::ConditionFailed { .. }) => "condition_failed",
            Err(_) => "error",
        };
        let took = started.elapsed().as_secs_f64();
        let at = STORE_OPS.iter().position(|o| *o == op);
        let outcome_at = STORE_OUTCOMES.iter().position(|o| *o == outcome);
        match (at, outcome_at) {
            (Some(i), Some(j)) => self.slots.latency[i][j]
                .get_or_init(|| {
                    self.latency
                        .get_or_create(&StoreLabels { op, outcome })
                        .clone()
                })
                .observe(took),
            _ => self
                .latency
                .get_or_create(&StoreLabels { op, outcome })
                .observe(took),
        }
        if let Err(e) = r {
            let kind = error_kind(e);
            let labels = || StoreErrorLabels { op, kind };
            match (at, STORE_ERROR_KINDS.iter().position(|k| *k == kind)) {
                (Some(i), Some(j)) => self.slots.errors[i][j]
                    .get_or_init(|| self.errors.get_or_create(&labels()).clone())
                    .inc(),
                _ => self.errors.get_or_create(&labels()).inc(),
            };
        }
    }
}

/// A [`Store`] that records the latency and errors of every request of the store it wraps
/// ([`StoreMetrics::wrap`]). Semantics are the wrapped store's, unchanged.
#[derive(Clone)]
pub struct MeteredStore {
    inner: Arc<dyn Store>,
    metrics: StoreMetrics,
}

impl std::fmt::Debug for MeteredStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeteredStore")
            .field("backend", &self.inner.backend())
            .finish()
    }
}

#[async_trait]
impl Store for MeteredStore {
    async fn get(&self, key: &Key, consistent: bool) -> Result<Option<Item>, StoreError> {
        let t = Instant::now();
        let r = self.inner.get(key, consistent).await;
        self.metrics.record("get", t, &r);
        r
    }
    async fn batch_get(
        &self,
        keys: &[Key],
        consistent: bool,
    ) -> Result<Vec<Option<Item>>, StoreError> {
        let t = Instant::now();
        let r = self.inner.batch_get(keys, consistent).await;
        self.metrics.record("batch_get", t, &r);
        r
    }
    async fn batch_get_shared(
        &self,
        keys: &[Key],
        consistent: bool,
    ) -> Result<Vec<Option<std::sync::Arc<Item>>>, StoreError> {
        let t = Instant::now();
        let r = self.inner.batch_get_shared(keys, consistent).await;
        self.metrics.record("batch_get", t, &r);
        r
    }
    async fn put(&self, req: PutRequest) -> Result<(), StoreError> {
        let t = Instant::now();
        let r = self.inner.put(req).await;
        self.metrics.record("put", t, &r);
        r
    }
    async fn update(&self, req: UpdateRequest) -> Result<Option<Item>, StoreError> {
        let t = Instant::now();
        let r = self.inner.update(req).await;
        self.metrics.record("update", t, &r);
        r
    }
    async fn update_shared(
        &self,
        req: UpdateRequest,
    ) -> Result<Option<std::sync::Arc<Item>>, StoreError> {
        let t = Instant::now();
        let r = self.inner.update_shared(req).await;
        self.metrics.record("update", t, &r);
        r
    }
    async fn delete(&self, req: DeleteRequest) -> Result<Option<Item>, StoreError> {
        let t = Instant::now();
        let r = self.inner.delete(req).await;
        self.metrics.record("delete", t, &r);
        r
    }
    async fn transact_write(
        &self,
        ops: Vec<TransactOp>,
        token: Option<String>,
    ) -> Result<(), StoreError> {
        let t = Instant::now();
        let r = self.inner.transact_write(ops, token).await;
        self.metrics.record("transact_write", t, &r);
        r
    }
    async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError> {
        let t = Instant::now();
        let r = self.inner.query(q).await;
        self.metrics.record("query", t, &r);
        r
    }
    async fn scan(
        &self,
        pk_prefix: &str,
        after: Option<Key>,
        limit: usize,
    ) -> Result<ScanPage, StoreError> {
        let t = Instant::now();
        let r = self.inner.scan(pk_prefix, after, limit).await;
        self.metrics.record("scan", t, &r);
        r
    }
    async fn purge(&self, key: &Key) -> Result<(), StoreError> {
        let t = Instant::now();
        let r = self.inner.purge(key).await;
        self.metrics.record("purge", t, &r);
        r
    }
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
}

/// The server's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    request_latency: Family<RouteLabels, Histogram, fn() -> Histogram>,
    acquires: Family<OutcomeLabels, Counter>,
    acquire_latency: Family<OutcomeLabels, Histogram, fn() -> Histogram>,
    /// Handles of the request series, by route template, then by method label: found
    /// without hashing label sets or copying the route. Each is taken from its family the
    /// first time it is recorded (when the family creates the series, as it would without
    /// them); a route outside the table is recorded through the families.
    routes: HashMap<&'static str, [OnceLock<RouteSeries>; METHOD_LABELS.len()], FixedState>,
    /// Handles of the acquire series, by outcome ([`ACQUIRE_OUTCOMES`]).
    outcomes: [OnceLock<(Counter, Histogram)>; ACQUIRE_OUTCOMES.len()],
}

/// The outcomes of an acquire, in the order of its series' slots.
const ACQUIRE_OUTCOMES: [&str; 3] = ["admitted", "rejected", "error"];

/// The series of one method on one route: its latency, and its counts by status.
#[derive(Debug)]
struct RouteSeries {
    latency: Histogram,
    statuses: RwLock<Vec<(u16, Counter)>>,
}

#[derive(Debug)]
struct LimiterCollector {
    limiter: Limiter,
    leases: Arc<LeaseTable>,
}

impl Collector for LimiterCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.limiter.stats();
        let counters: [(&str, &str, u64); 8] = [
            (
                "tollgate_limiter_fast_admits",
                "Admitted by the speculative write",
                s.fast_admits,
            ),
            (
                "tollgate_limiter_slow_admits",
                "Admitted by the slow path",
                s.slow_admits,
            ),
            (
                "tollgate_limiter_rejections",
                "Refused requests",
                s.rejections,
            ),
            (
                "tollgate_limiter_local_rejections",
                "Refused with no store request (rejection cache)",
                s.local_rejections,
            ),
            (
                "tollgate_limiter_doublings",
                "Shard-count doublings won",
                s.doublings,
            ),
            (
                "tollgate_limiter_fanout_writes",
                "Rollover fan-out writes that landed",
                s.fanout_writes,
            ),
            (
                "tollgate_limiter_fanout_failures",
                "Rollover fan-out writes refused or failed",
                s.fanout_failures,
            ),
            (
                "tollgate_limiter_degraded",
                "Degraded (fail-open) leases",
                s.degraded,
            ),
        ];
        encode_counters(&mut encoder, &counters)?;
        encode_one(
            &mut encoder,
            "tollgate_leases_held",
            "Leases held by the server (open or closed, until expiry)",
            &ConstGauge::new(i64::try_from(self.leases.len()).unwrap_or(i64::MAX)),
        )
    }
}

#[derive(Debug)]
struct AggregatorCollector(Arc<crate::aggregate::AggregatorStats>);

impl Collector for AggregatorCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use std::sync::atomic::Ordering::Relaxed;
        let s = &self.0;
        let mut m = encoder.encode_descriptor(
            "tollgate_aggregator_passes",
            "Feed aggregator passes by outcome",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (outcome, v) in [
            ("ok", s.passes.load(Relaxed)),
            ("error", s.failed_passes.load(Relaxed)),
        ] {
            ConstCounter::new(v).encode(m.encode_family(&[("outcome", outcome)])?)?;
        }
        let counters: [(&str, &str, u64); 6] = [
            (
                "tollgate_aggregator_changes",
                "Changes read from the change feed",
                s.changes.load(Relaxed),
            ),
            (
                "tollgate_aggregator_usage_changes",
                "Changes that carried usage",
                s.usage_changes.load(Relaxed),
            ),
            (
                "tollgate_aggregator_snapshot_writes",
                "Usage snapshot updates written",
                s.snapshot_writes.load(Relaxed),
            ),
            (
                "tollgate_aggregator_commits",
                "Transactions that moved the feed checkpoint",
                s.commits.load(Relaxed),
            ),
            (
                "tollgate_aggregator_lost_races",
                "Commits refused because another consumer moved the checkpoint first",
                s.lost_races.load(Relaxed),
            ),
            (
                "tollgate_aggregator_background_writes",
                "Refill and clone writes of the background pass that landed",
                s.background_writes.load(Relaxed),
            ),
        ];
        encode_counters(&mut encoder, &counters)?;
        encode_one(
            &mut encoder,
            "tollgate_feed_lag_seconds",
            "Age of the oldest change the aggregator's last pass read (0: caught up)",
            &ConstGauge::new(s.lag_ms.load(Relaxed) as f64 / 1000.0),
        )
    }
}

/// Encode one metric of its own, `name` described by `help`.
fn encode_one(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: &impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// Encode each of `counters` (name, help, value) as a counter of its own.
fn encode_counters(
    encoder: &mut DescriptorEncoder,
    counters: &[(&str, &str, u64)],
) -> Result<(), std::fmt::Error> {
    for &(name, help, v) in counters {
        encode_one(encoder, name, help, &ConstCounter::new(v))?;
    }
    Ok(())
}

/// The group-commit counters of an embedded store (`tollgate_sqlite_*`).
#[derive(Debug)]
struct GroupCommitCollector(tollgate_sqlite::SqliteStore);

/// The upper bounds (in requests) of `tollgate_sqlite_commit_requests`'s buckets: those of
/// [`tollgate_sqlite::GroupCommitStats::batches_by_size`] (1, 2–3, 4–7, …, 256 and more).
fn commit_size_bounds() -> [f64; tollgate_sqlite::SIZE_BUCKETS] {
    std::array::from_fn(|i| {
        if i + 1 == tollgate_sqlite::SIZE_BUCKETS {
            f64::MAX
        } else {
            f64::from((2u32 << i) - 1)
        }
    })
}

impl Collector for GroupCommitCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.0.group_commit_stats();
        // The count is the buckets' total, so the `+Inf` bucket equals it even when a
        // commit lands while the counters are read (each is its own atomic).
        let commits: u64 = s.batches_by_size.iter().sum();
        let buckets: Vec<(f64, u64)> = commit_size_bounds()
            .into_iter()
            .zip(s.batches_by_size)
            .collect();
        let mut m = encoder.encode_descriptor(
            "tollgate_sqlite_commit_requests",
            "Store requests per group commit (one transaction and one fsync each)",
            None,
            prometheus_client::metrics::MetricType::Histogram,
        )?;
        m.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            s.requests as f64,
            commits,
            &buckets,
            None,
        )?;
        let counters: [(&str, &str, u64); 4] = [
            (
                "tollgate_sqlite_commit_items",
                "Items the group commits wrote (a transaction counts its items)",
                s.items,
            ),
            (
                "tollgate_sqlite_queued_requests",
                "Write requests queued for the writer",
                s.submitted,
            ),
            (
                "tollgate_sqlite_expired_requests",
                "Write requests refused unapplied: their deadline passed while queued",
                s.expired,
            ),
            (
                "tollgate_sqlite_abandoned_requests",
                "Write requests dropped unapplied: their caller stopped waiting first",
                s.abandoned,
            ),
        ];
        encode_counters(&mut encoder, &counters)?;
        let f = self.0.feed_read_stats();
        let feed: [(&str, &str, u64); 5] = [
            (
                "tollgate_sqlite_feed_held_changes",
                "Changes the feed reads took from this process's memory (no row decoded)",
                f.held_changes,
            ),
            (
                "tollgate_sqlite_feed_decoded_changes",
                "Changes the feed reads decoded from rows that store their images",
                f.decoded_changes,
            ),
            (
                "tollgate_sqlite_feed_rebuilt_changes",
                "Changes the feed reads rebuilt by a walk of the feed",
                f.rebuilt_changes,
            ),
            (
                "tollgate_sqlite_feed_rebuilds",
                "Feed reads that walked the feed back from its end to rebuild their changes",
                f.rebuilds,
            ),
            (
                "tollgate_sqlite_feed_rebuild_rows",
                "Rows those walks read",
                f.rebuild_rows,
            ),
        ];
        encode_counters(&mut encoder, &feed)?;
        encode_one(
            &mut encoder,
            "tollgate_sqlite_largest_commit_requests",
            "The largest group commit so far, in store requests",
            &ConstGauge::new(i64::try_from(s.max_batch_requests).unwrap_or(i64::MAX)),
        )
    }
}

impl Metrics {
    /// Also expose the group-commit counters of `store`, the limiter's embedded store.
    pub fn group_commit(&mut self, store: tollgate_sqlite::SqliteStore) {
        self.registry
            .register_collector(Box::new(GroupCommitCollector(store)));
    }

    /// Also expose the counters of an in-process feed aggregator.
    pub fn aggregator(&mut self, stats: Arc<crate::aggregate::AggregatorStats>) {
        self.registry
            .register_collector(Box::new(AggregatorCollector(stats)));
    }

    /// Metrics of a server over `limiter` holding `leases`; `store` when the limiter's store
    /// is wrapped by [`StoreMetrics::wrap`].
    pub fn new(limiter: Limiter, leases: Arc<LeaseTable>, store: Option<StoreMetrics>) -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "tollgate_http_requests",
            "HTTP requests by method, route and status",
            requests.clone(),
        );
        let request_latency =
            Family::<RouteLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram,
            );
        registry.register(
            "tollgate_http_request_duration_seconds",
            "Time inside the server per request, by method and route",
            request_latency.clone(),
        );
        if let Some(sm) = store {
            registry.register(
                "tollgate_store_request_duration_seconds",
                "Store request latency by operation and outcome",
                sm.latency.clone(),
            );
            registry.register(
                "tollgate_store_errors",
                "Store errors by operation and kind",
                sm.errors.clone(),
            );
        }
        registry.register(
            "tollgate_build",
            "Build of this server",
            Info::new(vec![
                ("version", env!("CARGO_PKG_VERSION")),
                ("backend", limiter.backend()),
            ]),
        );
        let acquires = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "tollgate_acquires",
            "Acquires by outcome (admitted, rejected, error)",
            acquires.clone(),
        );
        let acquire_latency =
            Family::<OutcomeLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram,
            );
        registry.register(
            "tollgate_acquire_duration_seconds",
            "Acquire latency inside the server, by outcome",
            acquire_latency.clone(),
        );
        registry.register_collector(Box::new(LimiterCollector { limiter, leases }));
        let routes = crate::routes::routes()
            .into_iter()
            .map(|r| r.path)
            .chain(["unmatched", "unparsed"])
            .map(|route| (route, std::array::from_fn(|_| OnceLock::new())))
            .collect();
        Metrics {
            registry,
            requests,
            request_latency,
            acquires,
            acquire_latency,
            routes,
            outcomes: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// Count one HTTP request (`method` from [`method_label`]) and, with `took`, its time.
    pub fn request(&self, method: &'static str, route: &str, status: u16, took: Duration) {
        debug_assert!(
            method == "other" || method.bytes().all(|b| b.is_ascii_uppercase()),
            "{method}"
        );
        let counter = |route: &str| {
            self.requests
                .get_or_create(&RequestLabels {
                    method,
                    route: route.into(),
                    status,
                })
                .clone()
        };
        let latency = |route: &str| {
            self.request_latency
                .get_or_create(&RouteLabels {
                    method,
                    route: route.into(),
                })
                .clone()
        };
        let slot = self.routes.get(route).and_then(|methods| {
            let i = METHOD_LABELS.iter().position(|m| *m == method)?;
            Some(&methods[i])
        });
        let Some(slot) = slot else {
            counter(route).inc();
            latency(route).observe(took.as_secs_f64());
            return;
        };
        // The counter first, then the latency, as the families were always written.
        let series = slot.get_or_init(|| RouteSeries {
            statuses: RwLock::new(vec![(status, counter(route))]),
            latency: latency(route),
        });
        let known = series
            .statuses
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(s, _)| *s == status)
            .map(|(_, c)| c.inc())
            .is_some();
        if !known {
            let mut statuses = series.statuses.write().unwrap_or_else(|e| e.into_inner());
            match statuses.iter().find(|(s, _)| *s == status) {
                Some((_, c)) => {
                    c.inc();
                }
                None => {
                    let c = counter(route);
                    c.inc();
                    statuses.push((status, c));
                }
            }
        }
        series.latency.observe(took.as_secs_f64());
    }

    /// Record one acquire.
    pub fn acquire(&self, outcome: &'static str, took: Duration) {
        let l = OutcomeLabels { outcome };
        let handles = || {
            (
                self.acquires.get_or_create(&l).clone(),
                self.acquire_latency.get_or_create(&l).clone(),
            )
        };
        let record = |(count, latency): &(Counter, Histogram)| {
            count.inc();
            latency.observe(took.as_secs_f64());
        };
        match ACQUIRE_OUTCOMES.iter().position(|o| *o == outcome) {
            Some(i) => record(self.outcomes[i].get_or_init(handles)),
            None => record(&handles()),
        }
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the series `line` (its name and labels) in `text`.
    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// Series recorded through the kept handles count as through their families: the same
    /// series, created when first recorded, each count once.
    #[test]
    fn kept_handles_count_as_the_families_do() {
        let limiter = Limiter::new(Arc::new(tollgate_store::memory::MemoryStore::new())).unwrap();
        let sm = StoreMetrics::new();
        let m = Metrics::new(limiter, Arc::new(LeaseTable::default()), Some(sm.clone()));
        let before = m.render().unwrap();
        assert!(
            !before.contains("tollgate_http_requests_total{"),
            "{before}"
        );
        assert!(!before.contains("tollgate_acquires_total{"), "{before}");
        let ms = Duration::from_millis(1);
        for _ in 0..3 {
            m.request("GET", "/healthz", 200, ms);
        }
        m.request("GET", "/healthz", 503, ms);
        m.request("other", "/healthz", 405, ms);
        m.request("POST", "/not/a/route", 200, ms);
        m.request("POST", "/not/a/route", 200, ms);
        m.acquire("admitted", ms);
        m.acquire("admitted", ms);
        m.acquire("rejected", ms);
        m.acquire("unheard-of", ms);
        let t = Instant::now();
        sm.record("get", t, &Ok::<(), StoreError>(()));
        sm.record("get", t, &Ok::<(), StoreError>(()));
        sm.record(
            "put",
            t,
            &Err::<(), _>(StoreError::Throttled("slow down".into())),
        );
        sm.record(
            "made_up",
            t,
            &Err::<(), _>(StoreError::Throttled("x".into())),
        );
        let text = m.render().unwrap();
        for (series, want) in [
            (
                r#"tollgate_http_requests_total{method="GET",route="/healthz",status="200"}"#,
                3.0,
            ),
            (
                r#"tollgate_http_requests_total{method="GET",route="/healthz",status="503"}"#,
                1.0,
            ),
            (
                r#"tollgate_http_requests_total{method="other",route="/healthz",status="405"}"#,
                1.0,
            ),
            (
                r#"tollgate_http_requests_total{method="POST",route="/not/a/route",status="200"}"#,
                2.0,
            ),
            (
                r#"tollgate_http_request_duration_seconds_count{method="GET",route="/healthz"}"#,
                4.0,
            ),
            (
                r#"tollgate_http_request_duration_seconds_count{method="other",route="/healthz"}"#,
                1.0,
            ),
            (
                r#"tollgate_http_request_duration_seconds_count{method="POST",route="/not/a/route"}"#,
                2.0,
            ),
            (r#"tollgate_acquires_total{outcome="admitted"}"#, 2.0),
            (r#"tollgate_acquires_total{outcome="rejected"}"#, 1.0),
            (r#"tollgate_acquires_total{outcome="unheard-of"}"#, 1.0),
            (
                r#"tollgate_acquire_duration_seconds_count{outcome="admitted"}"#,
                2.0,
            ),
            (
                r#"tollgate_store_request_duration_seconds_count{op="get",outcome="ok"}"#,
                2.0,
            ),
            (
                r#"tollgate_store_request_duration_seconds_count{op="put",outcome="error"}"#,
                1.0,
            ),
            (
                r#"tollgate_store_request_duration_seconds_count{op="made_up",outcome="error"}"#,
                1.0,
            ),
            (
                r#"tollgate_store_errors_total{op="put",kind="throttled"}"#,
                1.0,
            ),
            (
                r#"tollgate_store_errors_total{op="made_up",kind="throttled"}"#,
                1.0,
            ),
        ] {
            assert_eq!(value(&text, series), Some(want), "{series}\n{text}");
        }
        assert_eq!(
            value(&text, r#"tollgate_acquires_total{outcome="error"}"#),
            None
        );
    }

    #[test]
    fn slot_tables_name_every_label() {
        for m in [
            Method::GET,
            Method::HEAD,
            Method::POST,
            Method::PUT,
            Method::DELETE,
            Method::PATCH,
            Method::OPTIONS,
            Method::CONNECT,
            Method::TRACE,
            Method::from_bytes(b"FROB").unwrap(),
        ] {
            assert!(METHOD_LABELS.contains(&method_label(&m)), "{m}");
        }
        for e in [
            StoreError::TransactionConflict,
            StoreError::Throttled(String::new()),
            StoreError::Validation(String::new()),
            StoreError::Ambiguous(String::new()),
            StoreError::Unavailable(String::new()),
            StoreError::Corrupt(String::new()),
        ] {
            assert!(STORE_ERROR_KINDS.contains(&error_kind(&e)), "{e}");
        }
    }
}
