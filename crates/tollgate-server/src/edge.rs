//! The request path around every handler, as one service applied once to the router
//! ([`EdgeLayer`]).
//!
//! Its steps, in this order on the way in (and the reverse on the way out):
//!
//! 1. **request id** ([`crate::request_id`]): assigned, put in the request's extensions,
//!    answered in `x-request-id`;
//! 2. **access log and request metrics** ([`crate::access`]): what the line needs is taken
//!    from the request; the answer is counted and logged;
//! 3. **JSON error bodies** ([`crate::error::ensure_json`]): an error answer that is not JSON
//!    gets the body of its status's code;
//! 4. **URI guard**: `414 uri_too_long` over [`crate::ServerConfig::max_uri_bytes`];
//! 5. **authorization** ([`crate::auth::authorize`]): the principal, or `401`/`403`;
//! 6. **request timeout** (`503 timeout`), **body timeout** (`408 body_timeout`) and the
//!    **body limit** (`413 payload_too_large`), tower-http's and axum's services;
//! 7. the route.
//!
//! It runs after routing (the router applies it to every route and to its fallbacks), so
//! the route template ([`axum::extract::MatchedPath`]) is known to the access log and to authorization.
//! One service rather than a layer per step: axum wraps a route in another boxed,
//! cloned-per-request service for every layer it applies, and `middleware::from_fn` adds
//! boxed futures of its own. Here a request costs the route's own clone and future, and
//! this service's future, which is not boxed.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use pin_project_lite::pin_project;
use tower::{Layer, Service};
use tower_http::timeout::{RequestBodyTimeout, Timeout};

use crate::access::Seen;
use crate::error::ApiError;
use crate::request_id::{RequestId, X_REQUEST_ID};
use crate::AppState;

/// The prefix of the routes whose path carries a lease token.
const LEASE_PATHS: &str = "/v1/leases/";

/// Applies [`Edge`] to a route.
#[derive(Debug, Clone)]
pub(crate) struct EdgeLayer {
    app: Arc<AppState>,
}

impl EdgeLayer {
    /// The edge of the server with state `app`.
    pub(crate) fn new(app: Arc<AppState>) -> Self {
        EdgeLayer { app }
    }
}

/// What runs inside the edge's own steps: the timeouts and the body limit around the route.
type Inner<S> = Timeout<RequestBodyTimeout<<DefaultBodyLimit as Layer<S>>::Service>>;

impl<S> Layer<S> for EdgeLayer {
    type Service = Edge<Inner<S>>;

    fn layer(&self, route: S) -> Self::Service {
        let cfg = &self.app.config;
        let limited = DefaultBodyLimit::max(cfg.body_limit).layer(route);
        let inner = Timeout::with_status_code(
            RequestBodyTimeout::new(limited, cfg.body_timeout),
            StatusCode::SERVICE_UNAVAILABLE,
            cfg.request_timeout,
        );
        Edge {
            app: self.app.clone(),
            inner,
        }
    }
}

/// The edge around one route (module docs).
#[derive(Debug, Clone)]
pub(crate) struct Edge<S> {
    app: Arc<AppState>,
    inner: S,
}

/// What the way out needs: the request id, the access line's facts, the principal.
#[derive(Debug)]
struct Finish {
    app: Arc<AppState>,
    id: Arc<str>,
    id_header: Option<HeaderValue>,
    seen: Seen,
    principal: Option<Arc<str>>,
}

impl Finish {
    /// Steps 3, 2 and 1 on the way out.
    fn finish(self, resp: Response) -> Response {
        let mut resp = crate::error::ensure_json(resp);
        self.seen.record(
            &self.app,
            &self.id,
            self.principal.as_deref(),
            resp.status().as_u16(),
        );
        if let Some(v) = self.id_header {
            resp.headers_mut().insert(X_REQUEST_ID.clone(), v);
        }
        resp
    }
}

impl<S> Service<Request> for Edge<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = EdgeFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        // 1. The request id.
        let (id, id_header) = crate::request_id::assign(req.headers());
        req.extensions_mut().insert(RequestId(id.clone()));
        // 2. What the access line needs.
        let seen = Seen::of(&req);
        let mut finish = Finish {
            app: self.app.clone(),
            id,
            id_header,
            seen,
            principal: None,
        };
        // 4. The URI guard (3 acts on the way out).
        if let Some(refused) = uri_guard(&self.app, &req) {
            return EdgeFuture::answered(refused.into_response(), finish);
        }
        // 5. Authorization.
        match crate::auth::authorize(&self.app, &mut req) {
            Ok(name) => finish.principal = Some(name),
            Err((refused, name)) => {
                finish.principal = name;
                return EdgeFuture::answered(refused.into_response(), finish);
            }
        }
        // 6 and 7.
        EdgeFuture {
            inner: Some(self.inner.call(req)),
            answered: None,
            finish: Some(finish),
        }
    }
}

pin_project! {
    /// The future of [`Edge`]: the inner service's answer, or one the edge gave itself,
    /// finished on the way out.
    pub(crate) struct EdgeFuture<F> {
        #[pin]
        inner: Option<F>,
        answered: Option<Response>,
        finish: Option<Finish>,
    }
}

impl<F> EdgeFuture<F> {
    fn answered(resp: Response, finish: Finish) -> Self {
        EdgeFuture {
            inner: None,
            answered: Some(resp),
            finish: Some(finish),
        }
    }
}

impl<F> Future for EdgeFuture<F>
where
    F: Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let resp = match this.answered.take() {
            Some(r) => r,
            None => match this.inner.as_pin_mut() {
                Some(f) => match ready!(f.poll(cx)) {
                    Ok(r) => r,
                    Err(never) => match never {},
                },
                None => unreachable!("an edge future polled after it completed"),
            },
        };
        let finish = this
            .finish
            .take()
            .expect("an edge future polled after it completed");
        Poll::Ready(Ok(finish.finish(resp)))
    }
}

/// `414 uri_too_long` for a URI (path and query) over [`crate::ServerConfig::max_uri_bytes`];
/// a lease route's (its path carries the lease token) may be as long as the request head
/// allows ([`crate::ServerConfig::max_header_bytes`], when that is larger).
fn uri_guard(app: &AppState, req: &Request) -> Option<ApiError> {
    let len = req
        .uri()
        .path_and_query()
        .map(|pq| pq.as_str().len())
        .unwrap_or(0);
    let max = if req.uri().path().starts_with(LEASE_PATHS) {
        app.config.max_uri_bytes.max(app.config.max_header_bytes)
    } else {
        app.config.max_uri_bytes
    };
    (len > max).then(|| {
        ApiError::new(
            StatusCode::URI_TOO_LONG,
            "uri_too_long",
            format!("the request URI is {len} bytes; this server accepts at most {max}"),
        )
    })
}
