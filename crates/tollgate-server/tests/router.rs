//! In-process tests of the router on MemoryStore (with a ManualClock where exact values
//! matter).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tollgate::{Limiter, ManualClock};
use tollgate_server::{Server, ServerConfig};
use tollgate_store::MemoryStore;
use tower::ServiceExt;

const T0: i64 = 1_700_000_000_000;

fn server_with(cfg: ServerConfig) -> (Server, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(T0));
    let limiter = Limiter::builder(Arc::new(MemoryStore::new()))
        .clock(clock.clone())
        .build()
        .unwrap();
    (Server::new(limiter, cfg), clock)
}

fn server() -> (Server, Arc<ManualClock>) {
    server_with(ServerConfig::default())
}

struct Resp {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Value,
    text: String,
}

impl Resp {
    fn h(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

async fn call(app: &Router, method: &str, uri: &str, body: Option<&str>) -> Resp {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(
            body.map(|b| Body::from(b.to_string()))
                .unwrap_or_else(Body::empty),
        )
        .unwrap();
    let r = app.clone().oneshot(req).await.unwrap();
    let status = r.status();
    let headers = r.headers().clone();
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes).to_string();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Resp {
        status,
        headers,
        body,
        text,
    }
}

async fn set_rpm(app: &Router, resource: &str, n: i64) {
    let b = json!({ "limits": [
        { "name": "rpm", "capacity": n, "refill_amount": n, "refill_period_ms": 60000 },
        { "name": "tpm", "capacity": 10000, "refill_amount": 10000, "refill_period_ms": 60000 }
    ]});
    let r = call(
        app,
        "PUT",
        &format!("/v1/limits/resources/{resource}"),
        Some(&b.to_string()),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

async fn acquire(app: &Router, entity: &str, rpm: i64, tpm: i64) -> Resp {
    let b = json!({ "entity": entity, "resource": "gpt-4", "amounts": { "rpm": rpm, "tpm": tpm } });
    call(app, "POST", "/v1/acquire", Some(&b.to_string())).await
}

#[tokio::test]
async fn acquire_until_429_with_exact_headers() {
    let (s, _clock) = server();
    let app = s.router();
    set_rpm(&app, "gpt-4", 3).await;

    // The first acquire creates the bucket (slow path).
    let r = acquire(&app, "u1", 1, 100).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["degraded"], false);
    assert!(
        r.body["lease_id"].as_str().unwrap().starts_with("v1."),
        "a lease token: {}",
        r.text
    );
    assert_eq!(r.body["lease_expires_at_ms"].as_i64(), Some(T0 + 300_000));
    assert_eq!(
        r.h("ratelimit-policy"),
        Some("\"rpm\";q=3;w=60, \"tpm\";q=10000;w=60")
    );
    // One of three used: full again in 20 s; 100 of 10000 tokens: full in 0.6 s → 1 s.
    assert_eq!(
        r.h("ratelimit"),
        Some("\"rpm\";r=2;t=20, \"tpm\";r=9900;t=1")
    );
    assert!(r.h("retry-after").is_none());

    // Two of three used: full again in 40 s; 200 of 10000 tokens: full in 1.2 s → 2 s.
    let r = acquire(&app, "u1", 1, 100).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.h("ratelimit"),
        Some("\"rpm\";r=1;t=40, \"tpm\";r=9800;t=2")
    );
    assert_eq!(r.body["statuses"][0]["available"], 1);

    let r = acquire(&app, "u1", 1, 100).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.h("ratelimit"),
        Some("\"rpm\";r=0;t=60, \"tpm\";r=9700;t=2")
    );

    // The clock has not moved: one rpm token drips back in 20 s.
    let r = acquire(&app, "u1", 1, 100).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
    assert_eq!(r.body["error"], "rate_limit_exceeded");
    assert_eq!(r.body["retry_after_ms"], 20_000);
    assert_eq!(r.h("retry-after"), Some("20"));
    assert_eq!(
        r.h("ratelimit-policy"),
        Some("\"rpm\";q=3;w=60, \"tpm\";q=10000;w=60")
    );
    assert_eq!(
        r.h("ratelimit"),
        Some("\"rpm\";r=0;t=20, \"tpm\";r=9700;t=2")
    );
    let limits = r.body["limits"].as_array().unwrap();
    assert_eq!(limits.len(), 2);
    assert_eq!(limits[0]["limit"], "rpm");
    assert_eq!(limits[0]["exceeded"], true);
    assert_eq!(limits[1]["exceeded"], false);
    assert!(r.body["message"].as_str().unwrap().contains("rpm"));

    // Another entity is not affected.
    assert_eq!(acquire(&app, "u2", 1, 1).await.status, StatusCode::OK);
}

/// A bucket-creating (slow path) acquire reports balances after its debit, like the fast
/// path.
#[tokio::test]
async fn first_acquire_reports_balances_after_the_debit() {
    let (s, _clock) = server();
    let app = s.router();
    set_rpm(&app, "gpt-4", 2).await;
    let r = acquire(&app, "u1", 1, 100).await;
    assert_eq!(
        r.h("ratelimit"),
        Some("\"rpm\";r=1;t=30, \"tpm\";r=9900;t=1")
    );
}

#[tokio::test]
async fn retry_after_rounds_up_and_reaches_admission() {
    let (s, clock) = server();
    let app = s.router();
    // 1 per 1500 ms: after one use a retry is 1500 ms away → Retry-After 2.
    let b = json!({ "limits": [{ "name": "rps", "capacity": 1, "refill_amount": 1, "refill_period_ms": 1500 }] });
    call(&app, "PUT", "/v1/limits/system", Some(&b.to_string())).await;
    let acq = json!({ "entity": "u", "resource": "r", "amounts": { "rps": 1 } }).to_string();
    assert_eq!(
        call(&app, "POST", "/v1/acquire", Some(&acq)).await.status,
        StatusCode::OK
    );
    let r = call(&app, "POST", "/v1/acquire", Some(&acq)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.body["retry_after_ms"], 1500);
    assert_eq!(r.h("retry-after"), Some("2"));
    clock.advance(1500);
    assert_eq!(
        call(&app, "POST", "/v1/acquire", Some(&acq)).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn larger_than_capacity_is_429_without_retry_after() {
    let (s, _) = server();
    let app = s.router();
    set_rpm(&app, "gpt-4", 2).await;
    let r = acquire(&app, "u", 1, 20_000).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.body["retry_after_ms"], Value::Null);
    assert!(r.h("retry-after").is_none());
}

#[tokio::test]
async fn malformed_requests_are_4xx_with_codes() {
    // Two cases below send per-call limits: allow them, to check how they are validated.
    let (s, _) = server_with(ServerConfig {
        allow_limit_overrides: true,
        ..Default::default()
    });
    let app = s.router();
    set_rpm(&app, "gpt-4", 5).await;
    let huge = "99999999999999999999999";
    let cases: Vec<(&str, String, Option<String>, u16, &str)> = vec![
        ("POST", "/v1/acquire".into(), Some("{not json".into()), 400, "invalid_json"),
        ("POST", "/v1/acquire".into(), Some("".into()), 400, "invalid_json"),
        ("POST", "/v1/acquire".into(), Some("[1,2]".into()), 400, "invalid_request"),
        ("POST", "/v1/acquire".into(), Some(r#"{"entity":"u"}"#.into()), 400, "invalid_request"),
        ("POST", "/v1/acquire".into(),
            Some(r#"{"entity":"u","resource":"gpt-4","amount":{"rpm":1}}"#.into()), 400, "invalid_request"),
        ("POST", "/v1/acquire".into(),
            Some(r#"{"entity":"u","resource":"gpt-4","amounts":{"nope":1}}"#.into()), 400, "unknown_limit"),
        ("POST", "/v1/acquire".into(),
            Some(r#"{"entity":"u","resource":"gpt-4","amounts":{"rpm":-1}}"#.into()), 400, "invalid_amount"),
        ("POST", "/v1/acquire".into(),
            Some(format!(r#"{{"entity":"u","resource":"gpt-4","amounts":{{"rpm":{huge}}}}}"#)), 400, "invalid_amount"),
        ("POST", "/v1/acquire".into(),
            Some(r#"{"entity":"u","resource":"gpt-4","amounts":{"rpm":1e300}}"#.into()), 400, "invalid_amount"),
        ("POST", "/v1/acquire".into(),
            Some(r#"{"entity":"u","resource":"gpt-4","amounts":{"rpm":9223372036854775807}}"#.into()), 400, "invalid_amount"),
        ("POST", "/v1/acquire".into(),
            Some(r#"{"entity":"u","resource":"gpt-4","amounts":{"rpm":1000000000001}}"#.into()), 400, "invalid_amount"),
        ("POST", "/v1/acquire".into(),
            Some(r#"{"entity":"u","resource":"gpt-4","amounts":{"rpm":1.5}}"#.into()), 400, "invalid_amount"),
        ("POST", "/v1/acquire".into(),
            Some(r#"{"entity":"u","resource":"gpt-4","amounts":{"rpm":"1"}}"#.into()), 400, "invalid_amount"),
        ("POST", "/v1/acquire".into(),
            Some(r#"{"entity":"a b","resource":"gpt-4","amounts":{"rpm":1}}"#.into()), 400, "invalid_identifier"),
        ("POST", "/v1/acquire".into(),
            Some(r#"{"entity":"a#b","resource":"gpt-4","amounts":{"rpm":1}}"#.into()), 400, "invalid_identifier"),
        ("POST", "/v1/acquire".into(),
            Some(r#"{"entity":"","resource":"gpt-4","amounts":{"rpm":1}}"#.into()), 400, "invalid_identifier"),
        ("POST", "/v1/acquire".into(),
            Some(format!(r#"{{"entity":"{}","resource":"gpt-4","amounts":{{"rpm":1}}}}"#, "a".repeat(300))), 400, "invalid_identifier"),
        ("POST", "/v1/acquire".into(),
            Some(r#"{"entity":"u","resource":"gpt 4!","amounts":{"rpm":1}}"#.into()), 400, "invalid_name"),
        ("POST", "/v1/acquire".into(),
            Some(r#"{"entity":"u","resource":"gpt-4","amounts":{"r#m":1}}"#.into()), 400, "invalid_name"),
        ("POST", "/v1/acquire".into(),
            Some(r#"{"entity":"u","resource":"nolimits","amounts":{"rpm":1}}"#.into()), 404, "no_limits"),
        ("POST", "/v1/acquire".into(),
            Some(r#"{"entity":"u","resource":"gpt-4","amounts":{"x":1},"limits":[{"name":"x","capacity":1e40}]}"#.into()), 400, "invalid_limit"),
        ("POST", "/v1/acquire".into(),
            Some(r#"{"entity":"u","resource":"gpt-4","amounts":{"x":1},"limits":[{"name":"x","capacity":5}]}"#.into()), 400, "invalid_limit"),
        ("PUT", "/v1/limits/system".into(),
            Some(r#"{"limits":[{"name":"x","capacity":-5,"refill_amount":1}]}"#.into()), 400, "invalid_limit"),
        ("PUT", "/v1/limits/system".into(),
            Some(format!(r#"{{"limits":[{{"name":"x","capacity":{huge},"refill_amount":1}}]}}"#)), 400, "invalid_limit"),
        ("PUT", "/v1/limits/system".into(),
            Some(r#"{"limits":[{"name":"wcu","capacity":5,"refill_amount":1}]}"#.into()), 400, "invalid_name"),
        ("PUT", "/v1/limits/system".into(),
            Some(r#"{"limits":[{"name":"d","capacity":5,"reset_cron":"not a cron"}]}"#.into()), 400, "invalid_limit"),
        ("PUT", "/v1/limits/system".into(),
            Some(r#"{"limits":[],"on_unavailable":"maybe"}"#.into()), 400, "invalid_request"),
        ("PUT", "/v1/limits/resources/_bad_".into(),
            Some(r#"{"limits":[]}"#.into()), 400, "invalid_name"),
        ("PUT", "/v1/limits/entities/a%23b".into(),
            Some(r#"{"limits":[]}"#.into()), 400, "invalid_identifier"),
        ("GET", "/v1/limits/entities/%FF%FE".into(), None, 400, "invalid_identifier"),
        ("GET", "/v1/entities/a%20b".into(), None, 400, "invalid_identifier"),
        ("POST", "/v1/entities".into(), Some(r#"{"id":"x y"}"#.into()), 400, "invalid_identifier"),
        ("GET", "/v1/availability?entity=u".into(), None, 400, "invalid_request"),
        ("GET", "/v1/availability?entity=u&resource=gpt-4&amounts=rpm:-1".into(), None, 400, "invalid_amount"),
        ("GET", format!("/v1/availability?entity=u&resource=gpt-4&amounts=rpm:{huge}"), None, 400, "invalid_amount"),
        ("GET", "/v1/availability?entity=u&resource=gpt-4&amounts=rpm".into(), None, 400, "invalid_amount"),
        ("GET", "/v1/availability?entity=u%20v&resource=gpt-4".into(), None, 400, "invalid_identifier"),
        ("POST", "/v1/availability".into(),
            Some(r#"{"entity":"u","resource":"gpt-4","amounts":{"rpm":-3}}"#.into()), 400, "invalid_amount"),
        ("POST", "/v1/leases/nope/commit".into(), None, 400, "invalid_lease"),
        ("POST", "/v1/leases/nope/rollback".into(), None, 400, "invalid_lease"),
        ("POST", "/v1/leases/v1.e30.AAAA/commit".into(), None, 400, "invalid_lease"),
        ("POST", "/v1/leases/f5eed268d22164766d8495aa98b39317/commit".into(), None, 400, "invalid_lease"),
        ("POST", "/v1/leases/nope/adjust".into(), Some(r#"{"limit":"rpm","delta":1}"#.into()), 400, "invalid_lease"),
        ("POST", "/v1/leases/nope/adjust".into(),
            Some(r#"{"limit":"rpm","delta":-9223372036854775808}"#.into()), 400, "invalid_amount"),
        ("GET", "/v1/nothing".into(), None, 404, "not_found"),
        ("DELETE", "/v1/acquire".into(), None, 405, "method_not_allowed"),
        ("POST", "/v1/acquire".into(), Some(format!("{{\"entity\":\"{}\"}}", "x".repeat(100_000))), 413, "payload_too_large"),
    ];
    for (method, uri, body, status, code) in cases {
        let r = call(&app, method, &uri, body.as_deref()).await;
        assert_eq!(
            r.status.as_u16(),
            status,
            "{method} {uri} {:?}: {}",
            body.as_deref().map(|b| &b[..b.len().min(120)]),
            r.text
        );
        assert_eq!(r.body["error"], code, "{method} {uri}: {}", r.text);
        assert!(r.body["message"].is_string(), "{}", r.text);
    }
}

#[tokio::test]
async fn lease_adjust_commit_rollback() {
    let (s, _) = server();
    let app = s.router();
    set_rpm(&app, "gpt-4", 10).await;
    let avail = |app: Router| async move {
        let r = call(
            &app,
            "GET",
            "/v1/availability?entity=u&resource=gpt-4",
            None,
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        let l = r.body["limits"].as_array().unwrap().clone();
        (
            l[0]["available"].as_i64().unwrap(),
            l[1]["available"].as_i64().unwrap(),
        )
    };
    let r = acquire(&app, "u", 1, 500).await;
    let v0 = r.body["lease_id"].as_str().unwrap().to_string();
    assert_eq!(avail(app.clone()).await, (9, 9500));

    let r = call(
        &app,
        "POST",
        &format!("/v1/leases/{v0}/adjust"),
        Some(r#"{"limit":"tpm","delta":230}"#),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["consumed"]["tpm"], 730);
    // Every adjust answers the next version's token; the older one is now stale.
    let id = r.body["lease_id"].as_str().unwrap().to_string();
    assert_ne!(id, v0);
    for path in ["adjust", "commit", "rollback"] {
        let r = call(
            &app,
            "POST",
            &format!("/v1/leases/{v0}/{path}"),
            Some(r#"{"limit":"tpm","delta":1}"#).filter(|_| path == "adjust"),
        )
        .await;
        assert_eq!(
            (r.status.as_u16(), r.body["error"].as_str()),
            (409, Some("lease_stale")),
            "{path}: {}",
            r.text
        );
    }
    let r = call(
        &app,
        "POST",
        &format!("/v1/leases/{id}/adjust"),
        Some(r#"{"limit":"nope","delta":1}"#),
    )
    .await;
    assert_eq!(
        (r.status.as_u16(), r.body["error"].as_str()),
        (400, Some("unknown_limit"))
    );
    // Not written until commit.
    assert_eq!(avail(app.clone()).await, (9, 9500));
    let r = call(&app, "POST", &format!("/v1/leases/{id}/commit"), None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["committed"], true);
    assert_eq!(r.body["lease_id"], id.as_str());
    assert_eq!(r.body["consumed"]["tpm"], 730);
    assert_eq!(avail(app.clone()).await, (9, 9270));
    let r = call(&app, "POST", &format!("/v1/leases/{id}/commit"), None).await;
    assert_eq!(
        (r.status.as_u16(), r.body["error"].as_str()),
        (409, Some("lease_closed"))
    );
    let r = call(
        &app,
        "POST",
        &format!("/v1/leases/{id}/adjust"),
        Some(r#"{"limit":"tpm","delta":1}"#),
    )
    .await;
    assert_eq!(
        (r.status.as_u16(), r.body["error"].as_str()),
        (409, Some("lease_closed"))
    );

    // Rollback refunds the acquire exactly.
    let r = acquire(&app, "u", 2, 1000).await;
    let id = r.body["lease_id"].as_str().unwrap().to_string();
    assert_eq!(avail(app.clone()).await, (7, 8270));
    let r = call(&app, "POST", &format!("/v1/leases/{id}/rollback"), None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(avail(app.clone()).await, (9, 9270));

    // commit: true holds no lease.
    let b = json!({ "entity": "u", "resource": "gpt-4", "amounts": { "rpm": 1 }, "commit": true });
    let r = call(&app, "POST", "/v1/acquire", Some(&b.to_string())).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["lease_id"], Value::Null);
    assert_eq!(avail(app.clone()).await, (8, 9270));

    // Availability with amounts, GET and POST agree.
    let g = call(
        &app,
        "GET",
        "/v1/availability?entity=u&resource=gpt-4&amounts=rpm:9",
        None,
    )
    .await;
    let p = call(
        &app,
        "POST",
        "/v1/availability",
        Some(r#"{"entity":"u","resource":"gpt-4","amounts":{"rpm":9}}"#),
    )
    .await;
    assert_eq!(g.body["allowed"], false);
    assert_eq!(g.body, p.body);
}

#[tokio::test]
async fn expired_leases_are_committed_with_their_adjustments() {
    let (s, clock) = server_with(ServerConfig {
        lease_ttl: Duration::from_millis(50),
        ..Default::default()
    });
    let app = s.router();
    set_rpm(&app, "gpt-4", 10).await;
    let r = acquire(&app, "u", 1, 100).await;
    let id = r.body["lease_id"].as_str().unwrap().to_string();
    let r = call(
        &app,
        "POST",
        &format!("/v1/leases/{id}/adjust"),
        Some(r#"{"limit":"tpm","delta":400}"#),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let id = r.body["lease_id"].as_str().unwrap().to_string();
    clock.set(T0 + 49);
    assert_eq!(s.sweep().await, 0, "not expired yet");
    clock.set(T0 + 50);
    assert_eq!(s.sweep().await, 1);
    let r = call(
        &app,
        "GET",
        "/v1/availability?entity=u&resource=gpt-4",
        None,
    )
    .await;
    // 100 debited, 400 reported, 8 dripped back in 50 ms (10,000 per minute).
    assert_eq!(r.body["limits"][1]["available"], 10_000 - 500 + 8);
    let r = call(&app, "POST", &format!("/v1/leases/{id}/commit"), None).await;
    assert_eq!(
        (r.status.as_u16(), r.body["error"].as_str()),
        (404, Some("lease_not_found"))
    );
    assert!(s.state().leases.is_empty());
}

#[tokio::test]
async fn shutdown_commits_open_leases() {
    let (s, _) = server();
    let app = s.router();
    set_rpm(&app, "gpt-4", 10).await;
    let r = acquire(&app, "u", 1, 100).await;
    let id = r.body["lease_id"].as_str().unwrap().to_string();
    call(
        &app,
        "POST",
        &format!("/v1/leases/{id}/adjust"),
        Some(r#"{"limit":"tpm","delta":-50}"#),
    )
    .await;
    assert_eq!(s.expire_all().await, 1);
    let r = call(
        &app,
        "GET",
        "/v1/availability?entity=u&resource=gpt-4",
        None,
    )
    .await;
    assert_eq!(r.body["limits"][1]["available"], 10_000 - 50);
}

#[tokio::test]
async fn entities_crud() {
    let (s, _) = server();
    let app = s.router();
    let r = call(
        &app,
        "POST",
        "/v1/entities",
        Some(r#"{"id":"acme","name":"Acme","metadata":{"tier":"gold"}}"#),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.body["created_at_ms"], T0);
    let r = call(&app, "POST", "/v1/entities", Some(r#"{"id":"acme"}"#)).await;
    assert_eq!(
        (r.status.as_u16(), r.body["error"].as_str()),
        (409, Some("entity_exists"))
    );
    let r = call(
        &app,
        "POST",
        "/v1/entities",
        Some(r#"{"id":"key-1","parent_id":"acme"}"#),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let r = call(&app, "GET", "/v1/entities/acme", None).await;
    assert_eq!(r.body["name"], "Acme");
    assert_eq!(r.body["metadata"]["tier"], "gold");
    let r = call(&app, "DELETE", "/v1/entities/acme", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = call(&app, "GET", "/v1/entities/acme", None).await;
    assert_eq!(
        (r.status.as_u16(), r.body["error"].as_str()),
        (404, Some("entity_not_found"))
    );
    let r = call(&app, "DELETE", "/v1/entities/acme", None).await;
    assert_eq!(r.status.as_u16(), 404);
}

#[tokio::test]
async fn limits_at_every_level_and_resources_with_slashes() {
    let (s, _) = server();
    let app = s.router();
    let l = |n: i64| {
        json!({ "limits": [{ "name": "rpm", "capacity": n, "refill_amount": n }] }).to_string()
    };
    for (uri, n) in [
        ("/v1/limits/system", 1),
        ("/v1/limits/resources/openai/gpt-4", 2),
        ("/v1/limits/entities/u", 3),
        ("/v1/limits/entities/v/resources/openai/gpt-4", 4),
    ] {
        let r = call(&app, "PUT", uri, Some(&l(n))).await;
        assert_eq!(r.status, StatusCode::OK, "{uri}: {}", r.text);
        let r = call(&app, "GET", uri, None).await;
        assert_eq!(r.body["limits"][0]["capacity"], n, "{uri}");
        assert_eq!(r.body["limits"][0]["refill_period_ms"], 60_000, "{uri}");
    }
    let r = call(&app, "GET", "/v1/limits/resources/openai%2Fgpt-4", None).await;
    assert_eq!(r.body["scope"], "resource:openai/gpt-4");
    // Resolution: entity+resource, entity default, resource, system.
    let cap = |e: &str, r: &str| {
        let app = app.clone();
        let uri = format!("/v1/availability?entity={e}&resource={r}");
        async move { call(&app, "GET", &uri, None).await.body["limits"][0]["capacity"].clone() }
    };
    assert_eq!(cap("v", "openai/gpt-4").await, 4);
    assert_eq!(cap("u", "openai/gpt-4").await, 3);
    assert_eq!(cap("w", "openai/gpt-4").await, 2);
    assert_eq!(cap("w", "other").await, 1);
    let r = call(
        &app,
        "PUT",
        "/v1/limits/system",
        Some(r#"{"limits":[],"on_unavailable":"allow"}"#),
    )
    .await;
    assert_eq!(r.body["on_unavailable"], "allow");
    let r = call(
        &app,
        "DELETE",
        "/v1/limits/entities/v/resources/openai/gpt-4",
        None,
    )
    .await;
    assert_eq!(r.body["deleted"], true);
    assert_eq!(cap("v", "openai/gpt-4").await, 2);
    let r = call(
        &app,
        "DELETE",
        "/v1/limits/entities/v/resources/openai/gpt-4",
        None,
    )
    .await;
    assert_eq!(r.body["deleted"], false);
}

#[tokio::test]
async fn health_and_metrics() {
    let (s, _) = server();
    let app = s.router();
    let r = call(&app, "GET", "/healthz", None).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["status"], "ok");
    assert_eq!(r.body["backend"], "memory");
    set_rpm(&app, "gpt-4", 1).await;
    acquire(&app, "u", 1, 1).await;
    acquire(&app, "u", 1, 1).await;
    call(&app, "POST", "/v1/acquire", Some("{")).await;
    let r = call(&app, "GET", "/metrics", None).await;
    assert_eq!(r.status, StatusCode::OK);
    let t = &r.text;
    for want in [
        r#"tollgate_http_requests_total{method="POST",route="/v1/acquire",status="200"} 1"#,
        r#"tollgate_http_requests_total{method="POST",route="/v1/acquire",status="429"} 1"#,
        r#"tollgate_http_requests_total{method="POST",route="/v1/acquire",status="400"} 1"#,
        r#"tollgate_http_requests_total{method="PUT",route="/v1/limits/resources/{*resource}",status="200"} 1"#,
        r#"tollgate_acquires_total{outcome="admitted"} 1"#,
        r#"tollgate_acquires_total{outcome="rejected"} 1"#,
        r#"tollgate_acquire_duration_seconds_count{outcome="admitted"} 1"#,
        "tollgate_limiter_rejections_total 1",
        "tollgate_leases_held 1",
        "# EOF",
    ] {
        assert!(t.contains(want), "missing {want:?} in\n{t}");
    }
}

/// Corrupt items (docs/repair.md): the acquire is `500 corrupt_data` naming the attribute;
/// `PUT` limits replaces the corrupt config item and `DELETE` the entity deletes its corrupt
/// bucket, each answer carrying `warnings` that name the item, the attribute and what was
/// done (and none when nothing was corrupt).
#[tokio::test]
async fn admin_writes_repair_corrupt_items_with_warnings() {
    use tollgate_core::keys;
    use tollgate_core::value::Value as V;
    let store = Arc::new(MemoryStore::new());
    let limiter = Limiter::builder(store.clone())
        .clock(Arc::new(ManualClock::new(T0)))
        .config_cache_ttl(Duration::ZERO)
        .build()
        .unwrap();
    let app = Server::new(limiter, ServerConfig::default()).router();
    let limits = |n: i64| {
        json!({ "limits": [
            { "name": "rpm", "capacity": n, "refill_amount": n, "refill_period_ms": 60000 }
        ]})
        .to_string()
    };
    let path = "/v1/limits/entities/u1/resources/llm";
    let r = call(&app, "POST", "/v1/entities", Some(r#"{"id":"u1"}"#)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let r = call(&app, "PUT", path, Some(&limits(5))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.body.get("warnings").is_none(), "{}", r.text);
    let acquire = r#"{"entity":"u1","resource":"llm","amounts":{"rpm":1},"commit":true}"#;
    let r = call(&app, "POST", "/v1/acquire", Some(acquire)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    let stage = |key: tollgate_core::value::Key, attr: &str| {
        let mut i = store.raw_get(&key).unwrap();
        i.insert(attr.into(), V::S("x".into()));
        store.raw_put(&key, i);
    };
    stage(keys::entity_config("default", "u1", "llm"), "cascade");
    stage(keys::bucket("default", "u1", "llm", 0), "b_rpm_tk");
    let r = call(&app, "POST", "/v1/acquire", Some(acquire)).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.text);
    assert_eq!(r.body["error"], "corrupt_data");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("default/ENTITY#u1|#CONFIG#llm: attribute cascade"),
        "{}",
        r.text
    );

    let r = call(&app, "PUT", path, Some(&limits(7))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["limits"][0]["capacity"], 7);
    let w = &r.body["warnings"];
    assert_eq!(w.as_array().map(Vec::len), Some(1), "{}", r.text);
    assert_eq!(w[0]["pk"], "default/ENTITY#u1");
    assert_eq!(w[0]["sk"], "#CONFIG#llm");
    assert_eq!(w[0]["item"]["kind"], "entity_limits");
    assert_eq!(w[0]["attribute"], "cascade");
    assert_eq!(w[0]["reason"], "expected a boolean");
    assert_eq!(
        w[0]["message"],
        "default/ENTITY#u1 / #CONFIG#llm: attribute \"cascade\": expected a boolean: replaced \
         by the new limits (its cascade policy could not be read and was not kept)"
    );
    let r = call(&app, "GET", path, None).await;
    assert_eq!(r.body["limits"][0]["capacity"], 7, "{}", r.text);

    let r = call(&app, "DELETE", "/v1/entities/u1", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        r.body["deleted_items"], 3,
        "META, config, bucket: {}",
        r.text
    );
    let w = &r.body["warnings"];
    assert_eq!(w.as_array().map(Vec::len), Some(1), "{}", r.text);
    assert_eq!(w[0]["item"]["kind"], "bucket");
    assert_eq!(w[0]["item"]["shard"], 0);
    assert_eq!(w[0]["attribute"], "b_rpm_tk");
    assert_eq!(w[0]["action"], "deleted with entity u1");
    let r = call(&app, "GET", "/v1/entities/u1", None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    // Only the audit log remains: the entity's history outlives it.
    let left: Vec<String> = store
        .raw_items()
        .iter()
        .filter_map(|i| tollgate_core::value::Key::of(i).map(|k| k.pk.to_string()))
        .filter(|pk| !pk.starts_with("default/AUDIT#"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
