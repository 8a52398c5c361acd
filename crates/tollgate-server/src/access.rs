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

/// Middleware: log and count every request. What the line needs is taken from the request
/// before it moves on, shared or copied rather than formatted into new strings (the route
/// template is shared, the URI is reference-counted, the peer address is copied): the line
/// is formatted once, by the subscriber.
pub async fn log_and_count(State(app): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = req.extensions().get::<MatchedPath>().cloned();
    let method = req.method().clone();
    let uri = req.uri().clone();
    let request_id = req
        .extensions()
        .get::<RequestId>()
        .map(|r| Arc::clone(&r.0));
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let resp = next.run(req).await;
    let took = started.elapsed();
    let status = resp.status().as_u16();
    let principal = resp
        .extensions()
        .get::<Principal>()
        .map(|p| Arc::clone(&p.name));
    let label = method_label(&method);
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    app.metrics.request(label, route, status, took);
    tracing::info!(
        target: "tollgate::access",
        request_id = %Shown(request_id.as_deref()),
        peer = %Shown(peer.as_ref()),
        principal = %Shown(principal.as_deref()),
        method = %method_for_log(&method),
        // A path can be as long as the URI limit; keep the line readable.
        path = %Truncated(uri.path(), 256),
        route = %route,
        status,
        latency_ms = (took.as_secs_f64() * 1e6).round() / 1e3,
        "request"
    );
    resp
}

/// A value as the line shows it: `-` when absent.
struct Shown<T>(Option<T>);

impl<T: std::fmt::Display> std::fmt::Display for Shown<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(v) => v.fmt(f),
            None => f.write_str("-"),
        }
    }
}

/// At most the first `.1` characters of a text.
struct Truncated<'a>(&'a str, usize);

impl std::fmt::Display for Truncated<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.char_indices().nth(self.1) {
            Some((at, _)) => f.write_str(&self.0[..at]),
            None => f.write_str(self.0),
        }
    }
}

/// The method as logged: standard methods as is, others truncated to 32 characters.
fn method_for_log(m: &axum::http::Method) -> String {
    m.as_str().chars().take(32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_keeps_whole_characters_and_shown_marks_absence() {
        assert_eq!(Truncated("/v1/acquire", 256).to_string(), "/v1/acquire");
        assert_eq!(Truncated("/äöü/x", 3).to_string(), "/äö");
        assert_eq!(Truncated("", 3).to_string(), "");
        assert_eq!(Truncated(&"a".repeat(300), 256).to_string().len(), 256);
        assert_eq!(Shown(None::<&str>).to_string(), "-");
        assert_eq!(Shown(Some("gw")).to_string(), "gw");
    }
}
