//! Prometheus metrics (prometheus-client, OpenMetrics text at `GET /metrics`).
//!
//! - `tollgate_http_requests_total{method, route, status}`: every request, by route template;
//! - `tollgate_acquire_duration_seconds{outcome}`: acquire latency inside the server;
//! - `tollgate_acquires_total{outcome}`: `admitted`, `rejected` (429) or `error`;
//! - `tollgate_limiter_*_total`: the limiter's own counters ([`tollgate::Limiter::stats`]);
//! - `tollgate_leases_held`: leases in the server's table (open or closed tombstones).

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tollgate::Limiter;

use crate::leases::LeaseTable;

/// Labels of `tollgate_http_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// HTTP method.
    pub method: String,
    /// Route template (`/v1/leases/{id}/commit`), or `unmatched`.
    pub route: String,
    /// Status code.
    pub status: u16,
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

/// The server's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    acquires: Family<OutcomeLabels, Counter>,
    acquire_latency: Family<OutcomeLabels, Histogram, fn() -> Histogram>,
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
        for (name, help, v) in counters {
            let c = ConstCounter::new(v);
            let m = encoder.encode_descriptor(name, help, None, c.metric_type())?;
            c.encode(m)?;
        }
        let g = ConstGauge::new(i64::try_from(self.leases.len()).unwrap_or(i64::MAX));
        let m = encoder.encode_descriptor(
            "tollgate_leases_held",
            "Leases held by the server (open or closed, until expiry)",
            None,
            g.metric_type(),
        )?;
        g.encode(m)
    }
}

impl Metrics {
    /// Metrics of a server over `limiter` holding `leases`.
    pub fn new(limiter: Limiter, leases: Arc<LeaseTable>) -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "tollgate_http_requests",
            "HTTP requests by method, route and status",
            requests.clone(),
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
        Metrics {
            registry,
            requests,
            acquires,
            acquire_latency,
        }
    }

    /// Count one HTTP request.
    pub fn request(&self, method: &str, route: &str, status: u16) {
        self.requests
            .get_or_create(&RequestLabels {
                method: method.into(),
                route: route.into(),
                status,
            })
            .inc();
    }

    /// Record one acquire.
    pub fn acquire(&self, outcome: &'static str, took: Duration) {
        let l = OutcomeLabels { outcome };
        self.acquires.get_or_create(&l).inc();
        self.acquire_latency
            .get_or_create(&l)
            .observe(took.as_secs_f64());
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}
