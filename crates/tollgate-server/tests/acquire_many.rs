//! `POST /v1/acquire/many` (ADR-148) and soft limits (ADR-151) over HTTP, on MemoryStore:
//! all or none with a lease token per resource, the refusing resource named, a bad resource
//! set refused, `resource_disabled` before `rate_limit_exceeded`; a soft limit admits past
//! its capacity.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tollgate::Limiter;
use tollgate_server::Server;
use tollgate_store::MemoryStore;
use tower::ServiceExt;

async fn call(app: &Router, method: &str, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .unwrap();
    let r = app.clone().oneshot(req).await.unwrap();
    let status = r.status();
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn setup() -> (Router, Limiter) {
    let limiter = Limiter::new(std::sync::Arc::new(MemoryStore::new())).unwrap();
    let app = Server::builder(limiter.clone()).build().router();
    (app, limiter)
}

async fn rpm(app: &Router, resource: &str, n: i64, soft: bool) {
    let (s, v) = call(
        app,
        "PUT",
        &format!("/v1/limits/resources/{resource}"),
        Some(json!({ "limits": [{ "name": "rpm", "capacity": n, "refill_amount": n, "soft": soft }] })),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        v["limits"][0]["soft"].as_bool().unwrap_or(false),
        soft,
        "{v}"
    );
}

fn many(resources: &[(&str, i64)], commit: bool) -> Value {
    json!({
        "entity": "u1",
        "resources": resources
            .iter()
            .map(|(r, n)| json!({ "resource": r, "amounts": { "rpm": n } }))
            .collect::<Vec<_>>(),
        "commit": commit,
    })
}

async fn available(app: &Router, resource: &str) -> i64 {
    let (s, v) = call(
        app,
        "GET",
        &format!("/v1/availability?entity=u1&resource={resource}"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v["limits"][0]["available"].as_i64().unwrap()
}

#[tokio::test]
async fn all_or_none_over_http() {
    let (app, lim) = setup();
    rpm(&app, "model", 10, false).await;
    rpm(&app, "tool", 2, false).await;
    let (s, v) = call(
        &app,
        "POST",
        "/v1/acquire/many",
        Some(many(&[("model", 3), ("tool", 1)], false)),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let rs = v["resources"].as_array().unwrap();
    assert_eq!(rs.len(), 2);
    assert_eq!(rs[0]["resource"], "model");
    assert_eq!(rs[0]["statuses"][0]["available"], 7);
    assert_eq!(rs[1]["statuses"][0]["available"], 1);
    // Each lease finishes on its own: roll back the tool call.
    let tool = rs[1]["lease_id"].as_str().unwrap().to_string();
    let (s, v) = call(&app, "POST", &format!("/v1/leases/{tool}/rollback"), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(available(&app, "tool").await, 2);
    // Tool exhausted: refused, naming it; model untouched.
    let (s, _) = call(
        &app,
        "POST",
        "/v1/acquire/many",
        Some(many(&[("tool", 2)], true)),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let (s, v) = call(
        &app,
        "POST",
        "/v1/acquire/many",
        Some(many(&[("model", 3), ("tool", 1)], true)),
    )
    .await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["error"], "rate_limit_exceeded");
    assert_eq!(v["resource"], "tool");
    assert_eq!(v["limits"][0]["limit"], "rpm");
    assert_eq!(available(&app, "model").await, 7, "model refunded");
    // Disabled outranks exceeded.
    lim.admin().set_disabled("u1", "model", true).await.unwrap();
    let (s, v) = call(
        &app,
        "POST",
        "/v1/acquire/many",
        Some(many(&[("tool", 1), ("model", 1)], true)),
    )
    .await;
    assert_eq!(
        (s, v["error"].as_str()),
        (StatusCode::FORBIDDEN, Some("resource_disabled")),
        "{v}"
    );
    // Bad resource sets.
    let (s, v) = call(
        &app,
        "POST",
        "/v1/acquire/many",
        Some(many(&[("tool", 1), ("tool", 1)], true)),
    )
    .await;
    assert_eq!(
        (s, v["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_resource_set")),
        "{v}"
    );
    let names: Vec<String> = (0..17).map(|i| format!("r{i}")).collect();
    let seventeen: Vec<(&str, i64)> = names.iter().map(|n| (n.as_str(), 1)).collect();
    let (s, v) = call(
        &app,
        "POST",
        "/v1/acquire/many",
        Some(many(&seventeen, true)),
    )
    .await;
    assert_eq!(
        (s, v["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_resource_set")),
        "{v}"
    );
    let (s, v) = call(&app, "POST", "/v1/acquire/many", Some(many(&[], true))).await;
    assert_eq!(
        (s, v["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_resource_set")),
        "{v}"
    );
}

#[tokio::test]
async fn a_soft_limit_admits_past_its_capacity_over_http() {
    let (app, _) = setup();
    rpm(&app, "shadow", 2, true).await;
    for _ in 0..5 {
        let (s, v) = call(
            &app,
            "POST",
            "/v1/acquire",
            Some(json!({ "entity": "u1", "resource": "shadow", "amounts": { "rpm": 1 }, "commit": true })),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(v["statuses"][0]["exceeded"], false);
    }
    assert_eq!(available(&app, "shadow").await, -3);
    // Enforced again: the debt stands.
    rpm(&app, "shadow", 2, false).await;
    let (s, v) = call(
        &app,
        "POST",
        "/v1/acquire",
        Some(json!({ "entity": "u1", "resource": "shadow", "amounts": { "rpm": 1 } })),
    )
    .await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{v}");
}

async fn acquire(app: &Router, entity: &str, n: i64) -> (StatusCode, Value) {
    call(
        app,
        "POST",
        "/v1/acquire",
        Some(json!({ "entity": entity, "resource": "gpt-4", "amounts": { "rpm": n } })),
    )
    .await
}

/// ADR-151, a mode at any level: a resource shadow-moded over HTTP admits past capacity
/// without debiting, one entity excepted at its pair's level is refused, a disabled
/// resource answers `403 resource_disabled`, `GET /v1/limits/...` shows the mode, a
/// cleared level enforces again from the balances it left, and a bad scope is a 400.
#[tokio::test]
async fn a_mode_at_any_level_over_http() {
    let (app, _) = setup();
    rpm(&app, "gpt-4", 2, false).await;
    for e in ["u1", "u2"] {
        assert_eq!(acquire(&app, e, 2).await.0, StatusCode::OK);
        assert_eq!(acquire(&app, e, 1).await.0, StatusCode::TOO_MANY_REQUESTS);
    }
    let put = |scope: &str, mode: Value| {
        let app = app.clone();
        let body = json!({ "scope": scope, "mode": mode });
        async move { call(&app, "PUT", "/v1/enforcement", Some(body)).await }
    };
    let (s, v) = put("resource:gpt-4", json!("bypass")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        v,
        json!({ "scope": "resource:gpt-4", "mode": "bypass", "shards": 0 })
    );
    let (s, v) = put("entity:u2/resource:gpt-4", json!("enforce")).await;
    assert_eq!((s, v["shards"].clone()), (StatusCode::OK, json!(1)), "{v}");
    for _ in 0..3 {
        let (s, v) = acquire(&app, "u1", 2).await;
        assert_eq!(s, StatusCode::OK, "bypassed: {v}");
    }
    assert_eq!(
        acquire(&app, "u2", 1).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    let (_, v) = call(&app, "GET", "/v1/limits/resources/gpt-4", None).await;
    assert_eq!(v["enforcement"], "bypass", "{v}");
    let (_, v) = call(&app, "GET", "/v1/limits/system", None).await;
    assert!(v.get("enforcement").is_none(), "{v}");
    let (s, _) = put("resource:gpt-4", json!("disabled")).await;
    assert_eq!(s, StatusCode::OK);
    let (s, v) = acquire(&app, "u1", 1).await;
    assert_eq!(
        (s, v["error"].clone()),
        (StatusCode::FORBIDDEN, json!("resource_disabled")),
        "{v}"
    );
    let (s, _) = put("resource:gpt-4", Value::Null).await;
    assert_eq!(s, StatusCode::OK);
    // u1's balance was never debited while bypassed: still 0, refused.
    assert_eq!(
        acquire(&app, "u1", 1).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    for bad in ["resources:gpt-4", "", "tenant:x"] {
        let (s, v) = put(bad, json!("bypass")).await;
        assert_eq!(
            (s, v["error"].clone()),
            (StatusCode::BAD_REQUEST, json!("invalid_request")),
            "{bad}: {v}"
        );
    }
    let (s, v) = put("resource:gpt-4", json!("sometimes")).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
}
