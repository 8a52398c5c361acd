//! The access log and the request metrics: one `info` line per request (target
//! `tollgate::access`) and one count in `tollgate_http_requests_total`, recorded by the
//! server's edge (`edge.rs`) when the answer is ready.
//!
//! The line carries `request_id`, `peer`, `principal` (the token's name, `anonymous` without
//! authentication, `-` when no token was accepted), `method`, `path` (without the query
//! string), `route` (the route template, `unmatched` for a path no route has), `status` and
//! `latency_ms`. Metric labels are bounded: the method is one of the standard methods or
//! `other` ([`crate::metrics::method_label`]), the route a template or `unmatched`.

use std::net::SocketAddr;
use std::time::Instant;

use axum::extract::{ConnectInfo, MatchedPath, Request};
use axum::http::{Method, Uri};

use crate::metrics::method_label;
use crate::AppState;

/// What the access line of a request needs, taken from the request before it moves on:
/// shared or copied rather than formatted into new strings (the route template is shared,
/// the URI is reference-counted, the peer address is copied), so the line is formatted
/// once, when it is written.
#[derive(Debug)]
pub(crate) struct Seen {
    started: Instant,
    route: Option<MatchedPath>,
    method: Method,
    uri: Uri,
    peer: Option<SocketAddr>,
}

impl Seen {
    /// The facts of `req`, and the time it started.
    pub(crate) fn of(req: &Request) -> Self {
        Seen {
            started: Instant::now(),
            route: req.extensions().get::<MatchedPath>().cloned(),
            method: req.method().clone(),
            uri: req.uri().clone(),
            peer: req
                .extensions()
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0),
        }
    }

    /// Count the request and log its line: answered `status`, for the token named
    /// `principal` (`None`: no token was accepted).
    pub(crate) fn record(
        self,
        app: &AppState,
        request_id: &str,
        principal: Option<&str>,
        status: u16,
    ) {
        let took = self.started.elapsed();
        let method = &self.method;
        let label = method_label(method);
        let route = self.route.as_ref().map_or("unmatched", MatchedPath::as_str);
        app.metrics.request(label, route, status, took);
        tracing::info!(
            target: "tollgate::access",
            request_id = %request_id,
            peer = %Peer(self.peer),
            principal = %Shown(principal),
            // Standard methods as they are, others truncated to 32 characters.
            method = %Truncated(method.as_str(), 32),
            // A path can be as long as the URI limit; keep the line readable.
            path = %Truncated(self.uri.path(), 256),
            route = %route,
            status,
            latency_ms = (took.as_secs_f64() * 1e6).round() / 1e3,
            "request"
        );
    }
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
        if self.0.len() <= self.1 {
            // No more characters than bytes.
            return f.write_str(self.0);
        }
        match self.0.char_indices().nth(self.1) {
            Some((at, _)) => f.write_str(&self.0[..at]),
            None => f.write_str(self.0),
        }
    }
}

/// The peer's address as `SocketAddr` displays it, `-` when absent; an IPv4 address written
/// in one piece (the standard library formats its parts one by one).
struct Peer(Option<SocketAddr>);

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            None => f.write_str("-"),
            Some(SocketAddr::V4(a)) => {
                // At most "255.255.255.255:65535", on the stack.
                let mut text = [0u8; 21];
                let mut len = 0;
                let mut put = |part: &str| {
                    text[len..len + part.len()].copy_from_slice(part.as_bytes());
                    len += part.len();
                };
                let mut digits = itoa::Buffer::new();
                for (i, octet) in a.ip().octets().into_iter().enumerate() {
                    if i > 0 {
                        put(".");
                    }
                    put(digits.format(octet));
                }
                put(":");
                put(digits.format(a.port()));
                // Digits, dots and a colon.
                f.write_str(std::str::from_utf8(&text[..len]).unwrap_or_default())
            }
            Some(a) => a.fmt(f),
        }
    }
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
        assert_eq!(Truncated("PROPFINDÄ", 32).to_string(), "PROPFINDÄ");
        assert_eq!(Truncated(&"Ä".repeat(40), 32).to_string(), "Ä".repeat(32));
    }

    #[test]
    fn peers_as_the_standard_library_writes_them() {
        for a in [
            "127.0.0.1:50312",
            "0.0.0.0:0",
            "255.255.255.255:65535",
            "10.20.3.4:8",
            "[::1]:8080",
            "[fe80::1%2]:1",
        ] {
            let a: SocketAddr = a.parse().unwrap();
            assert_eq!(Peer(Some(a)).to_string(), a.to_string());
        }
        assert_eq!(Peer(None).to_string(), "-");
    }
}
