//! In-process tests of what sits at the edge: tokens and roles, the overrides gate,
//! duplicate JSON keys, request ids, bounded metric labels, store metrics, probes, and JSON
//! for errors that come from layers rather than handlers.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tollgate::Limiter;
use tollgate_core::value::{Item, Key};
use tollgate_server::{Auth, Server, ServerConfig, StoreMetrics, TokenSet};
use tollgate_store::{
    DeleteRequest, MemoryStore, PutRequest, Query, Store, StoreError, TransactOp, UpdateRequest,
};
use tower::ServiceExt;

const ADMIN: &str = "admin-token-0123456789abcdef";
const CLIENT: &str = "client-token-0123456789abcdef";

struct Resp {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Value,
    text: String,
}

impl Resp {
    fn code(&self) -> &str {
        self.body["error"].as_str().unwrap_or("")
    }
}

async fn call_with(
    app: &Router,
    method: &str,
    uri: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Resp {
    let mut b = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b
        .body(
            body.map(|s| Body::from(s.to_string()))
                .unwrap_or_else(Body::empty),
        )
        .unwrap();
    let r = app.clone().oneshot(req).await.unwrap();
    let status = r.status();
    let headers = r.headers().clone();
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes).to_string();
    Resp {
        status,
        headers,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        text,
    }
}

async fn call(
    app: &Router,
    method: &str,
    uri: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> Resp {
    call_with(app, method, uri, token, &[], body).await
}

fn tokens() -> TokenSet {
    TokenSet::parse(
        &format!("ops:{ADMIN}:admin\ngateway:{CLIENT}:client\n"),
        "test",
        false,
    )
    .unwrap()
}

fn authed(cfg: ServerConfig) -> Router {
    let limiter = Limiter::new(Arc::new(MemoryStore::new())).unwrap();
    Server::builder(limiter)
        .config(cfg)
        .auth(Arc::new(Auth::from_tokens(tokens())))
        .build()
        .router()
}

const LIMITS: &str = r#"{"limits":[{"name":"rpm","capacity":5,"refill_amount":5}]}"#;
const ACQ: &str = r#"{"entity":"u","resource":"gpt-4","amounts":{"rpm":1},"commit":true}"#;

#[tokio::test]
async fn admin_routes_need_an_admin_token() {
    let app = authed(ServerConfig::default());
    let admin_routes = [
        ("PUT", "/v1/limits/resources/gpt-4", Some(LIMITS)),
        ("GET", "/v1/limits/system", None),
        ("DELETE", "/v1/limits/entities/u", None),
        ("POST", "/v1/entities", Some(r#"{"id":"acme"}"#)),
        ("DELETE", "/v1/entities/acme", None),
    ];
    for (m, p, b) in admin_routes {
        let r = call(&app, m, p, None, b).await;
        assert_eq!(
            (r.status.as_u16(), r.code()),
            (401, "unauthorized"),
            "{m} {p}"
        );
        assert_eq!(
            r.headers
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok()),
            Some("Bearer")
        );
        let r = call(&app, m, p, Some("not-a-known-token-at-all"), b).await;
        assert_eq!(
            (r.status.as_u16(), r.code()),
            (401, "unauthorized"),
            "{m} {p}"
        );
        let r = call(&app, m, p, Some(CLIENT), b).await;
        assert_eq!((r.status.as_u16(), r.code()), (403, "forbidden"), "{m} {p}");
        assert!(
            r.body["message"].as_str().unwrap().contains("gateway"),
            "{}",
            r.text
        );
    }
    // Nothing was written by the refused calls: the resource has no limits yet.
    let r = call(&app, "GET", "/v1/limits/resources/gpt-4", Some(ADMIN), None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["limits"], json!([]));
    let r = call(
        &app,
        "PUT",
        "/v1/limits/resources/gpt-4",
        Some(ADMIN),
        Some(LIMITS),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // A malformed Authorization header is 401 too.
    let r = call_with(
        &app,
        "GET",
        "/v1/limits/system",
        None,
        &[("authorization", "Basic abc")],
        None,
    )
    .await;
    assert_eq!((r.status.as_u16(), r.code()), (401, "unauthorized"));

    // Client routes: client and admin tokens.
    let r = call(&app, "POST", "/v1/acquire", None, Some(ACQ)).await;
    assert_eq!((r.status.as_u16(), r.code()), (401, "unauthorized"));
    for t in [CLIENT, ADMIN] {
        let r = call(&app, "POST", "/v1/acquire", Some(t), Some(ACQ)).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
    let r = call(
        &app,
        "GET",
        "/v1/availability?entity=u&resource=gpt-4",
        Some(CLIENT),
        None,
    )
    .await;
    assert_eq!(r.body["limits"][0]["available"], 3);
    // Metrics need a token; probes do not.
    assert_eq!(
        call(&app, "GET", "/metrics", None, None)
            .await
            .status
            .as_u16(),
        401
    );
    assert_eq!(
        call(&app, "GET", "/metrics", Some(CLIENT), None)
            .await
            .status
            .as_u16(),
        200
    );
    for p in ["/livez", "/readyz", "/healthz"] {
        let r = call(&app, "GET", p, None, None).await;
        assert_eq!(
            (r.status.as_u16(), r.body["status"].as_str()),
            (200, Some("ok")),
            "{p}"
        );
    }
    // An unknown path is 404 for everyone (no token needed to learn nothing).
    let r = call(&app, "GET", "/v1/nope", None, None).await;
    assert_eq!((r.status.as_u16(), r.code()), (404, "not_found"));
}

#[tokio::test]
async fn per_call_limits_are_refused_unless_allowed() {
    let with_limits = r#"{"entity":"u","resource":"gpt-4","amounts":{"rpm":1},"commit":true,
        "limits":[{"name":"rpm","capacity":1000000,"refill_amount":1000000}]}"#;
    let app = authed(ServerConfig::default());
    call(
        &app,
        "PUT",
        "/v1/limits/resources/gpt-4",
        Some(ADMIN),
        Some(LIMITS),
    )
    .await;
    // The issue's case: 5 stored per minute, a client sends its own limit of 1,000,000.
    let mut admitted = 0;
    for _ in 0..20 {
        let r = call(&app, "POST", "/v1/acquire", Some(CLIENT), Some(with_limits)).await;
        assert_eq!(
            (r.status.as_u16(), r.code()),
            (403, "overrides_disabled"),
            "{}",
            r.text
        );
        let r = call(&app, "POST", "/v1/acquire", Some(CLIENT), Some(ACQ)).await;
        if r.status == StatusCode::OK {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 5, "the stored 5/min applies");
    // An admin may override.
    let r = call(&app, "POST", "/v1/acquire", Some(ADMIN), Some(with_limits)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    // With --allow-limit-overrides a client may too.
    let app = authed(ServerConfig {
        allow_limit_overrides: true,
        ..Default::default()
    });
    let r = call(&app, "POST", "/v1/acquire", Some(CLIENT), Some(with_limits)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    // Without authentication (anonymous) overrides are off by default.
    let limiter = Limiter::new(Arc::new(MemoryStore::new())).unwrap();
    let open = Server::new(limiter, ServerConfig::default()).router();
    let r = call(&open, "POST", "/v1/acquire", None, Some(with_limits)).await;
    assert_eq!((r.status.as_u16(), r.code()), (403, "overrides_disabled"));
}

#[tokio::test]
async fn duplicate_json_keys_are_refused_and_nothing_is_spent() {
    let limiter = Limiter::new(Arc::new(MemoryStore::new())).unwrap();
    let app = Server::new(limiter, ServerConfig::default()).router();
    call(
        &app,
        "PUT",
        "/v1/limits/resources/gpt-4",
        None,
        Some(LIMITS),
    )
    .await;
    for body in [
        r#"{"entity":"u","resource":"gpt-4","amounts":{"rpm":1,"rpm":2},"commit":true}"#,
        r#"{"entity":"u","entity":"v","resource":"gpt-4","amounts":{"rpm":1}}"#,
        r#"{"entity":"u","resource":"gpt-4","amounts":{"rpm":1,"\u0072pm":2}}"#,
        r#"{"entity":"u","resource":"gpt-4","amounts":{"rpm":1},"limits":[{"name":"a","name":"b"}]}"#,
    ] {
        let r = call(&app, "POST", "/v1/acquire", None, Some(body)).await;
        assert_eq!(
            (r.status.as_u16(), r.code()),
            (400, "invalid_json"),
            "{body}: {}",
            r.text
        );
        assert!(
            r.body["message"]
                .as_str()
                .unwrap()
                .contains("duplicate key"),
            "{}",
            r.text
        );
    }
    let r = call(
        &app,
        "PUT",
        "/v1/limits/system",
        None,
        Some(r#"{"limits":[{"name":"x","capacity":1,"capacity":2,"refill_amount":1}]}"#),
    )
    .await;
    assert_eq!(r.code(), "invalid_json");
    let r = call(
        &app,
        "GET",
        "/v1/availability?entity=u&resource=gpt-4",
        None,
        None,
    )
    .await;
    assert_eq!(r.body["limits"][0]["available"], 5, "nothing spent");
    let r = call(&app, "GET", "/v1/limits/system", None, None).await;
    assert_eq!(r.body["limits"], json!([]));
}

#[tokio::test]
async fn request_ids_are_kept_or_made() {
    let limiter = Limiter::new(Arc::new(MemoryStore::new())).unwrap();
    let app = Server::new(limiter, ServerConfig::default()).router();
    let id = |r: &Resp| {
        r.headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let r = call_with(
        &app,
        "GET",
        "/livez",
        None,
        &[("x-request-id", "trace-42:a/b")],
        None,
    )
    .await;
    assert_eq!(id(&r), "trace-42:a/b");
    let r = call_with(
        &app,
        "GET",
        "/nope",
        None,
        &[("x-request-id", "has space")],
        None,
    )
    .await;
    assert_eq!(r.status.as_u16(), 404);
    let made = id(&r);
    assert_eq!(made.len(), 32, "{made}");
    assert!(made.chars().all(|c| c.is_ascii_hexdigit()));
    let r2 = call(&app, "GET", "/livez", None, None).await;
    assert_eq!(id(&r2).len(), 32);
    assert_ne!(id(&r2), made);
}

fn series(metrics: &str) -> usize {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .count()
}

fn value_of(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn made_up_methods_do_not_grow_the_series_count() {
    let limiter = Limiter::new(Arc::new(MemoryStore::new())).unwrap();
    let app = Server::new(limiter, ServerConfig::default()).router();
    // One of each kind first, so the `other` series (and /metrics' own) exist.
    call(&app, "FROB0", "/v1/acquire", None, None).await;
    call(&app, "FROB0", "/nope", None, None).await;
    call(&app, "GET", "/metrics", None, None).await;
    let before = call(&app, "GET", "/metrics", None, None).await.text;
    for i in 0..500 {
        let path = if i % 2 == 0 { "/v1/acquire" } else { "/nope" };
        let r = call(&app, &format!("M{i}X"), path, None, None).await;
        assert!(r.status == 405 || r.status == 404, "{}", r.status);
        assert!(r.body["error"].is_string());
    }
    let after = call(&app, "GET", "/metrics", None, None).await.text;
    assert!(series(&before) > 50, "{before}");
    assert_eq!(series(&before), series(&after));
    let other_405 =
        r#"tollgate_http_requests_total{method="other",route="/v1/acquire",status="405"}"#;
    let other_404 =
        r#"tollgate_http_requests_total{method="other",route="unmatched",status="404"}"#;
    assert_eq!(
        value_of(&after, other_405) - value_of(&before, other_405),
        250.0
    );
    assert_eq!(
        value_of(&after, other_404) - value_of(&before, other_404),
        250.0
    );
    assert!(!after.contains("M1X"));
}

#[tokio::test]
async fn build_info_store_metrics_and_probes() {
    let sm = StoreMetrics::new();
    let limiter = Limiter::new(sm.wrap(Arc::new(MemoryStore::new()))).unwrap();
    let app = Server::builder(limiter).store_metrics(sm).build().router();
    call(
        &app,
        "PUT",
        "/v1/limits/resources/gpt-4",
        None,
        Some(LIMITS),
    )
    .await;
    for _ in 0..3 {
        call(&app, "POST", "/v1/acquire", None, Some(ACQ)).await;
    }
    let t = call(&app, "GET", "/metrics", None, None).await.text;
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        t.contains(&format!(
            "tollgate_build_info{{version=\"{version}\",backend=\"memory\"}} 1"
        )),
        "{t}"
    );
    let ops: f64 = ["get", "batch_get", "put", "update", "transact_write", "query"]
        .iter()
        .map(|op| {
            ["ok", "condition_failed", "error"]
                .iter()
                .map(|o| {
                    value_of(
                        &t,
                        &format!(
                            "tollgate_store_request_duration_seconds_count{{op=\"{op}\",outcome=\"{o}\"}}"
                        ),
                    )
                })
                .sum::<f64>()
        })
        .sum();
    assert!(
        ops >= 4.0,
        "a put of the limits and at least one write per acquire: {ops}\n{t}"
    );
    assert!(
        value_of(
            &t,
            "tollgate_store_request_duration_seconds_count{op=\"put\",outcome=\"ok\"}"
        ) >= 1.0,
        "{t}"
    );
    assert!(
        t.contains("tollgate_http_request_duration_seconds_bucket{"),
        "{t}"
    );
    let r = call(&app, "GET", "/readyz", None, None).await;
    assert_eq!(r.body, json!({"status": "ok", "backend": "memory"}));
    let r = call(&app, "GET", "/livez", None, None).await;
    assert_eq!(r.body, json!({"status": "ok"}));
}

/// A store whose every call waits first (for the request timeout).
struct Slow(MemoryStore, Duration);

#[async_trait]
impl Store for Slow {
    async fn get(&self, key: &Key, c: bool) -> Result<Option<Item>, StoreError> {
        tokio::time::sleep(self.1).await;
        self.0.get(key, c).await
    }
    async fn batch_get(&self, keys: &[Key], c: bool) -> Result<Vec<Option<Item>>, StoreError> {
        tokio::time::sleep(self.1).await;
        self.0.batch_get(keys, c).await
    }
    async fn put(&self, req: PutRequest) -> Result<(), StoreError> {
        self.0.put(req).await
    }
    async fn update(&self, req: UpdateRequest) -> Result<Option<Item>, StoreError> {
        self.0.update(req).await
    }
    async fn delete(&self, req: DeleteRequest) -> Result<Option<Item>, StoreError> {
        self.0.delete(req).await
    }
    async fn transact_write(
        &self,
        ops: Vec<TransactOp>,
        t: Option<String>,
    ) -> Result<(), StoreError> {
        self.0.transact_write(ops, t).await
    }
    async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError> {
        self.0.query(q).await
    }
    fn backend(&self) -> &'static str {
        "slow"
    }
}

#[tokio::test]
async fn layer_errors_are_json_too() {
    let store = Slow(MemoryStore::new(), Duration::from_millis(500));
    let limiter = Limiter::new(Arc::new(store)).unwrap();
    let app = Server::new(
        limiter,
        ServerConfig {
            request_timeout: Duration::from_millis(50),
            max_uri_bytes: 100,
            ..Default::default()
        },
    )
    .router();
    let r = call(&app, "GET", "/readyz", None, None).await;
    assert_eq!(
        (r.status.as_u16(), r.code()),
        (503, "timeout"),
        "{}",
        r.text
    );
    assert!(r.headers.get("x-request-id").is_some());
    let long = format!("/v1/entities/{}", "a".repeat(120));
    let r = call(&app, "GET", &long, None, None).await;
    assert_eq!(
        (r.status.as_u16(), r.code()),
        (414, "uri_too_long"),
        "{}",
        r.text
    );
    let r = call(&app, "PATCH", "/livez", None, None).await;
    assert_eq!((r.status.as_u16(), r.code()), (405, "method_not_allowed"));
}

#[tokio::test]
async fn readyz_fails_when_the_store_does_not_answer_and_errors_are_counted() {
    use tollgate_store::{FaultConfig, FaultyStore};
    let faulty = Arc::new(FaultyStore::new(
        MemoryStore::new(),
        7,
        FaultConfig {
            throttle: 1.0,
            ..FaultConfig::none()
        },
    ));
    let sm = StoreMetrics::new();
    let limiter = Limiter::new(sm.wrap(faulty.clone())).unwrap();
    let app = Server::builder(limiter).store_metrics(sm).build().router();
    let r = call(&app, "GET", "/readyz", None, None).await;
    assert_eq!(
        (r.status.as_u16(), r.code()),
        (503, "store_unavailable"),
        "{}",
        r.text
    );
    assert_eq!(
        r.headers.get("retry-after").and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let r = call(&app, "GET", "/livez", None, None).await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "liveness does not touch the store"
    );
    let t = call(&app, "GET", "/metrics", None, None).await.text;
    assert_eq!(
        value_of(
            &t,
            r#"tollgate_store_errors_total{op="get",kind="throttled"}"#
        ),
        1.0,
        "{t}"
    );
    assert_eq!(
        value_of(
            &t,
            r#"tollgate_store_request_duration_seconds_count{op="get",outcome="error"}"#
        ),
        1.0
    );
    faulty.set_enabled(false);
    let r = call(&app, "GET", "/readyz", None, None).await;
    assert_eq!(r.status, StatusCode::OK);
}
