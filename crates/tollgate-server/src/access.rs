//! The access log and the request metrics: one `info` line per request (target
//! `tollgate::access`) and one count in `tollgate_http_requests_total`.
//!
//! The line carries `request_id`, `peer`, `principal` (the token's name, `anonymous` without
//! authentication, `-` when no token was accepted), `method`, `path` (without the query
//! string), `route` (the route template, `unmatched` for a path no route has), `status` and
//! `latency_ms`. Metric labels are bounded: the method is one of the standard methods or
//! `other` ([`crate::metrics::method_label`]), the route a template or `unmatched`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;

use crate::auth::Principal;
use crate::metrics::method_label;
use crate::request_id::RequestId;
use crate::AppState;

/// Middleware: log and count every request.
pub async fn log_and_count(State(app): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let request_id = req
        .extensions()
        .get::<RequestId>()
        .map(|r| r.0.clone())
        .unwrap_or_else(|| Arc::from("-"));
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.to_string())
        .unwrap_or_else(|| "-".into());
    let resp = next.run(req).await;
    let took = started.elapsed();
    let status = resp.status().as_u16();
    let principal = resp
        .extensions()
        .get::<Principal>()
        .map(|p| p.name.clone())
        .unwrap_or_else(|| Arc::from("-"));
    let label = method_label(&method);
    app.metrics.request(label, &route, status, took);
    // A path can be as long as the URI limit; keep the line readable.
    let path: String = path.chars().take(256).collect();
    tracing::info!(
        target: "tollgate::access",
        request_id = %request_id,
        peer = %peer,
        principal = %principal,
        method = %method_for_log(&method),
        path = %path,
        route = %route,
        status,
        latency_ms = (took.as_secs_f64() * 1e6).round() / 1e3,
        "request"
    );
    resp
}

/// The method as logged: standard methods as is, others truncated to 32 characters.
fn method_for_log(m: &axum::http::Method) -> String {
    m.as_str().chars().take(32).collect()
}
