//! Envoy's rate limit service (RLS v3, `envoy.service.ratelimit.v3.RateLimitService`)
//! over gRPC (tonic), beside the HTTP API: the same limiter, bearer tokens, lease table
//! and metrics. The protos are the generated ones of the `envoy-types` crate.
//!
//! `ShouldRateLimit` maps every descriptor to (entity, resource, limit, amount) through the
//! `[[envoy.descriptors]]` rules of the limits file ([`tollgate::limits_file`]), then:
//!
//! - **request phase**: descriptors of one (entity, resource) are one acquire (their limits
//!   charged at once); several pairs are acquired in order and, on a refusal, the ones
//!   already admitted are rolled back exactly (leases), so the request is charged all or
//!   none. The answer has a status per descriptor (`current_limit`, `limit_remaining`,
//!   `duration_until_reset`), `RateLimit-Policy` / `RateLimit` (and `Retry-After` when over
//!   the limit) in `response_headers_to_add`, and `OK` / `OVER_LIMIT`. A pair whose rule has
//!   `report_usage = true` keeps its lease open and asks Envoy to add its signed token to
//!   the upstream request (`request_headers_to_add`, header `x-tollgate-lease`).
//! - **usage report** (a descriptor carrying the `tollgate_lease` entry, sent by Envoy at
//!   stream end with `apply_on_stream_done`): the lease named by the token is adjusted so
//!   what it consumed of the limit equals the descriptor's `hits_addend`, and committed.
//!
//! `on_unavailable = allow` answers `OK` with the `x-tollgate-degraded` header; `block`
//! answers gRPC `UNAVAILABLE`, which Envoy's `failure_mode_deny` decides. The gateway's
//! configuration is in `docs/envoy.md`.

mod answer;
mod service;

use std::future::Future;
use std::sync::{Arc, RwLock};

use tokio::net::TcpListener;
use tollgate::limits_file::EnvoySettings;

pub use envoy_types::pb::envoy::service::ratelimit::v3 as rls;
pub use service::RateLimiter;

/// The full gRPC method name (the `route` label of its metrics).
pub const METHOD: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The descriptor mapping in force, replaced whole when the limits file is reloaded.
#[derive(Debug, Clone, Default)]
pub struct Mapping {
    current: Arc<RwLock<Arc<EnvoySettings>>>,
}

impl Mapping {
    /// A mapping holding `settings`.
    pub fn new(settings: EnvoySettings) -> Self {
        Mapping {
            current: Arc::new(RwLock::new(Arc::new(settings))),
        }
    }

    /// The settings in force.
    pub fn current(&self) -> Arc<EnvoySettings> {
        match self.current.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Replace the settings (requests in flight finish with the old ones).
    pub fn replace(&self, settings: EnvoySettings) {
        let new = Arc::new(settings);
        match self.current.write() {
            Ok(mut g) => *g = new,
            Err(p) => *p.into_inner() = new,
        }
    }
}

impl crate::Server {
    /// Serve the rate limit service on `listener` until `shutdown` completes.
    pub async fn serve_grpc(
        &self,
        mapping: Mapping,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), tonic::transport::Error> {
        let svc = RateLimiter::new(self.state().clone(), mapping);
        tonic::transport::Server::builder()
            .timeout(self.state().config.request_timeout)
            .add_service(rls::rate_limit_service_server::RateLimitServiceServer::new(
                svc,
            ))
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener),
                shutdown,
            )
            .await
    }
}
