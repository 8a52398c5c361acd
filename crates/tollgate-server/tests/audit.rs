//! The audit log over HTTP: every administrative route of the route table that changes
//! something (every admin route but `GET`) writes exactly one record, with the token's name
//! as principal and the images before and after; a refused change writes none; the log is
//! read with `GET /v1/audit` (admin only, paginated) — on MemoryStore and SQLite.
//!
//! The routes are enumerated from [`tollgate_server::routes`]: an admin route added without
//! a case here fails the test.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tollgate::Limiter;
use tollgate_server::{routes, Auth, Role, Server, TokenSet};
use tollgate_store::{MemoryStore, Store};
use tower::ServiceExt;

const ADMIN: &str = "0123456789abcdef0123456789abcdef";
const CLIENT: &str = "fedcba9876543210fedcba9876543210";

async fn call(
    app: &Router,
    method: &str,
    uri: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> (StatusCode, Value) {
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req
        .body(
            body.map(|b| Body::from(b.to_string()))
                .unwrap_or_else(Body::empty),
        )
        .unwrap();
    let r = app.clone().oneshot(req).await.unwrap();
    let status = r.status();
    let bytes = r.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn app(store: Arc<dyn Store>, auth: bool) -> Router {
    let limiter = Limiter::new(store).unwrap();
    let mut b = Server::builder(limiter);
    if auth {
        let tokens = TokenSet::parse(
            &format!("ops-team:{ADMIN}:admin\ngateway:{CLIENT}:client\n"),
            "test",
            false,
        )
        .unwrap();
        b = b.auth(Arc::new(Auth::from_tokens(tokens)));
    }
    b.build().router()
}

fn limits(rpm: i64) -> Value {
    json!({ "limits": [{ "name": "rpm", "capacity": rpm, "refill_amount": rpm, "refill_period_ms": 60000 }] })
}

/// One administrative request and what its record must say.
struct Case {
    /// The route's method and path template, as in the route table.
    route: (&'static str, &'static str),
    uri: &'static str,
    body: Option<Value>,
    action: &'static str,
    level: &'static str,
    entity: Option<&'static str>,
    resource: Option<&'static str>,
    /// The capacity of `rpm` before and after (`None`: no limits / not a config change).
    before_rpm: Option<i64>,
    after_rpm: Option<i64>,
}

fn cases() -> Vec<Case> {
    let c = |route, uri, body, action, level, entity, resource, before_rpm, after_rpm| Case {
        route,
        uri,
        body,
        action,
        level,
        entity,
        resource,
        before_rpm,
        after_rpm,
    };
    vec![
        c(
            ("PUT", "/v1/limits/system"),
            "/v1/limits/system",
            Some(limits(10)),
            "limits.set",
            "system",
            None,
            None,
            None,
            Some(10),
        ),
        c(
            ("PUT", "/v1/limits/resources/{*resource}"),
            "/v1/limits/resources/openai/gpt-4",
            Some(limits(20)),
            "limits.set",
            "resource",
            None,
            Some("openai/gpt-4"),
            None,
            Some(20),
        ),
        c(
            ("POST", "/v1/entities"),
            "/v1/entities",
            Some(json!({ "id": "u1", "name": "User one" })),
            "entity.create",
            "entity",
            Some("u1"),
            None,
            None,
            None,
        ),
        c(
            ("PUT", "/v1/limits/entities/{entity}"),
            "/v1/limits/entities/u1",
            Some(limits(30)),
            "limits.set",
            "entity",
            Some("u1"),
            None,
            None,
            Some(30),
        ),
        c(
            ("PUT", "/v1/limits/entities/{entity}/resources/{*resource}"),
            "/v1/limits/entities/u1/resources/openai/gpt-4",
            Some(limits(40)),
            "limits.set",
            "entity",
            Some("u1"),
            Some("openai/gpt-4"),
            None,
            Some(40),
        ),
        c(
            ("POST", "/v1/entities/{id}/top-up"),
            "/v1/entities/u1/top-up",
            Some(json!({ "resource": "openai/gpt-4", "amounts": { "rpm": 5 } })),
            "bucket.top_up",
            "entity",
            Some("u1"),
            Some("openai/gpt-4"),
            None,
            None,
        ),
        c(
            ("POST", "/v1/entities"),
            "/v1/entities",
            Some(json!({ "id": "u0", "name": "Team zero" })),
            "entity.create",
            "entity",
            Some("u0"),
            None,
            None,
            None,
        ),
        c(
            ("PUT", "/v1/entities/{id}/parent"),
            "/v1/entities/u1/parent",
            Some(json!({ "parent_id": "u0" })),
            "entity.move",
            "entity",
            Some("u1"),
            None,
            None,
            None,
        ),
        c(
            ("POST", "/v1/entities/{id}/reset"),
            "/v1/entities/u1/reset",
            Some(json!({ "resource": "openai/gpt-4", "op": "op-1" })),
            "bucket.reset",
            "entity",
            Some("u1"),
            Some("openai/gpt-4"),
            None,
            None,
        ),
        c(
            ("PUT", "/v1/enforcement"),
            "/v1/enforcement",
            Some(json!({ "scope": "resource:openai/gpt-4", "mode": "bypass" })),
            "resource.enforcement",
            "resource",
            None,
            Some("openai/gpt-4"),
            Some(20),
            Some(20),
        ),
        c(
            ("PUT", "/v1/entities/{id}/enforcement"),
            "/v1/entities/u1/enforcement",
            Some(json!({ "resource": "openai/gpt-4", "mode": "bypass" })),
            "resource.enforcement",
            "entity",
            Some("u1"),
            Some("openai/gpt-4"),
            None,
            None,
        ),
        c(
            (
                "DELETE",
                "/v1/limits/entities/{entity}/resources/{*resource}",
            ),
            "/v1/limits/entities/u1/resources/openai/gpt-4",
            None,
            "limits.delete",
            "entity",
            Some("u1"),
            Some("openai/gpt-4"),
            Some(40),
            None,
        ),
        c(
            ("DELETE", "/v1/limits/entities/{entity}"),
            "/v1/limits/entities/u1",
            None,
            "limits.delete",
            "entity",
            Some("u1"),
            None,
            Some(30),
            None,
        ),
        c(
            ("DELETE", "/v1/limits/resources/{*resource}"),
            "/v1/limits/resources/openai/gpt-4",
            None,
            "limits.delete",
            "resource",
            None,
            Some("openai/gpt-4"),
            Some(20),
            None,
        ),
        c(
            ("DELETE", "/v1/limits/system"),
            "/v1/limits/system",
            None,
            "limits.delete",
            "system",
            None,
            None,
            Some(10),
            None,
        ),
        c(
            ("DELETE", "/v1/entities/{id}"),
            "/v1/entities/u1",
            None,
            "entity.delete",
            "entity",
            Some("u1"),
            None,
            None,
            None,
        ),
    ]
}

/// The namespace registry's routes: their records go to the registry's log
/// (`GET /v1/audit?registry=true`), not the namespace's.
const NAMESPACE_ROUTES: [(&str, &str); 4] = [
    ("POST", "/v1/namespaces"),
    ("DELETE", "/v1/namespaces/{name}"),
    ("POST", "/v1/namespaces/ids/{id}/recover"),
    ("POST", "/v1/namespaces/ids/{id}/purge"),
];

/// Register, delete, recover, delete, purge `acme`: one registry record each, with the
/// token's name; the namespace's own log keeps its `n` records; refusals write nothing.
async fn namespace_walk(app: &Router, n: usize) {
    let (s, b) = call(
        app,
        "POST",
        "/v1/namespaces",
        Some(ADMIN),
        Some(&json!({ "name": "acme" })),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let id = b["id"].as_str().unwrap().to_string();
    assert_eq!(id.len(), 11, "{b}");
    let steps = [
        (
            "DELETE",
            "/v1/namespaces/acme".to_string(),
            "namespace.delete",
        ),
        (
            "POST",
            format!("/v1/namespaces/ids/{id}/recover"),
            "namespace.recover",
        ),
        (
            "DELETE",
            "/v1/namespaces/acme".to_string(),
            "namespace.delete",
        ),
        (
            "POST",
            format!("/v1/namespaces/ids/{id}/purge"),
            "namespace.purge",
        ),
    ];
    let mut want = vec!["namespace.register"];
    for (m, uri, action) in steps {
        let (s, b) = call(app, m, &uri, Some(ADMIN), None).await;
        assert!(s.is_success(), "{m} {uri}: {s} {b}");
        want.push(action);
        let rs = records(app, Some(ADMIN), "?registry=true&limit=1000").await;
        let got: Vec<&str> = rs
            .iter()
            .rev()
            .filter_map(|r| r["action"].as_str())
            .collect();
        assert_eq!(got, want, "{m} {uri}");
        assert_eq!(rs[0]["principal"], "ops-team", "{m} {uri}");
        assert_eq!(rs[0]["level"], "namespace", "{m} {uri}");
        assert_eq!(rs[0]["namespace"], "acme", "{m} {uri}");
    }
    // Refused: recover or purge an unknown id, delete a name that is not active.
    let (s, b) = call(
        app,
        "POST",
        "/v1/namespaces/ids/nosuchid000/recover",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(
        (s, b["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("namespace_not_found"))
    );
    let (s, b) = call(app, "DELETE", "/v1/namespaces/acme", Some(ADMIN), None).await;
    assert_eq!((s, &b["deleted"]), (StatusCode::OK, &Value::Null));
    let rs = records(app, Some(ADMIN), "?registry=true&limit=1000").await;
    assert_eq!(rs.len(), want.len(), "refusals write nothing");
    assert_eq!(records(app, Some(ADMIN), "?limit=1000").await.len(), n);
}

fn rpm(image: &Value) -> Option<i64> {
    image["limits"]
        .as_array()?
        .iter()
        .find(|l| l["name"] == "rpm")?["capacity"]
        .as_i64()
}

async fn records(app: &Router, token: Option<&str>, query: &str) -> Vec<Value> {
    let (s, b) = call(app, "GET", &format!("/v1/audit{query}"), token, None).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    b["records"].as_array().cloned().unwrap_or_default()
}

async fn walk(store: Arc<dyn Store>) {
    let app = app(store, true);
    // Every admin route that changes something has a case; every case is such a route.
    let admin_writes: BTreeSet<(&str, &str)> = routes()
        .into_iter()
        .filter(|r| r.needs == Some(Role::Admin) && r.method != "GET")
        .map(|r| (r.method, r.path))
        .collect();
    let covered: BTreeSet<(&str, &str)> = cases()
        .iter()
        .map(|c| c.route)
        .chain(NAMESPACE_ROUTES.iter().copied())
        .collect();
    assert_eq!(
        admin_writes, covered,
        "an administrative route without an audit case (or a case for no route)"
    );
    let mut n = 0;
    for c in cases() {
        let (s, b) = call(&app, c.route.0, c.uri, Some(ADMIN), c.body.as_ref()).await;
        assert!(s.is_success(), "{} {}: {s} {b}", c.route.0, c.uri);
        n += 1;
        let rs = records(&app, Some(ADMIN), "?limit=1000").await;
        assert_eq!(
            rs.len(),
            n,
            "{} {}: one record per change",
            c.route.0,
            c.uri
        );
        let r = &rs[0];
        let what = format!("{} {}: {r}", c.route.0, c.uri);
        assert_eq!(r["action"], c.action, "{what}");
        assert_eq!(r["principal"], "ops-team", "{what}");
        assert_eq!(r["level"], c.level, "{what}");
        assert_eq!(r["entity"].as_str(), c.entity, "{what}");
        assert_eq!(r["resource"].as_str(), c.resource, "{what}");
        assert_eq!(rpm(&r["before"]), c.before_rpm, "{what}");
        assert_eq!(rpm(&r["after"]), c.after_rpm, "{what}");
        assert_eq!(r["id"].as_str().map(str::len), Some(26), "{what}");
        match c.action {
            "entity.create" => {
                assert_eq!(r["before"], Value::Null, "{what}");
                let name = c.body.as_ref().map_or(Value::Null, |b| b["name"].clone());
                assert_eq!(r["after"]["name"], name, "{what}");
            }
            "entity.move" => {
                assert_eq!(r["before"]["parent_id"], Value::Null, "{what}");
                assert_eq!(r["after"]["parent_id"], "u0", "{what}");
                assert_eq!(r["after"]["pgen"], 1, "{what}");
            }
            "entity.delete" => {
                assert_eq!(r["before"]["entity"]["name"], "User one", "{what}");
                // The META, the bucket the top-up created and the pair's config level,
                // which kept its mode when its limits were deleted.
                assert_eq!(r["before"]["items"], 3, "{what}");
                assert_eq!(
                    r["before"]["limits"]["openai/gpt-4"]["enforcement"], "bypass",
                    "{what}"
                );
                assert_eq!(r["after"], Value::Null, "{what}");
            }
            "resource.enforcement" if r["level"] == "resource" => {
                // The level's config image: no mode before, bypass after.
                assert_eq!(r["before"]["enforcement"], Value::Null, "{what}");
                assert_eq!(r["after"]["enforcement"], "bypass", "{what}");
            }
            "resource.enforcement" => {
                assert_eq!(r["before"]["enforcement"], "enforce", "{what}");
                assert_eq!(r["after"]["enforcement"], "bypass", "{what}");
            }
            // A deleted level keeps only its mode, where it set one (ADR-151).
            "limits.delete" if r["after"] != Value::Null => {
                assert_eq!(r["after"]["limits"], json!([]), "{what}");
                assert_eq!(r["after"]["enforcement"], "bypass", "{what}");
            }
            "limits.delete" => assert_eq!(r["after"], Value::Null, "{what}"),
            _ => {}
        }
    }
    namespace_walk(&app, n).await;
    // Refused changes write nothing: an entity that exists, one that does not.
    let (s, _) = call(
        &app,
        "POST",
        "/v1/entities",
        Some(ADMIN),
        Some(&json!({ "id": "u2" })),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _) = call(
        &app,
        "POST",
        "/v1/entities",
        Some(ADMIN),
        Some(&json!({ "id": "u2" })),
    )
    .await;
    assert_eq!(s, StatusCode::CONFLICT);
    let (s, _) = call(&app, "DELETE", "/v1/entities/nobody", Some(ADMIN), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = call(
        &app,
        "PUT",
        "/v1/limits/system",
        Some(ADMIN),
        Some(&json!({ "limits": [{ "name": "rpm" }] })),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(records(&app, Some(ADMIN), "").await.len(), n + 1);

    // Filters and pages.
    let u1: Vec<String> = records(&app, Some(ADMIN), "?entity=u1")
        .await
        .iter()
        .map(|r| r["action"].as_str().unwrap_or("?").to_string())
        .collect();
    assert_eq!(
        u1,
        [
            "entity.delete",
            "limits.delete",
            "limits.delete",
            "resource.enforcement",
            "bucket.reset",
            "entity.move",
            "bucket.top_up",
            "limits.set",
            "limits.set",
            "entity.create"
        ]
    );
    let gpt = records(&app, Some(ADMIN), "?resource=openai/gpt-4").await;
    assert_eq!(gpt.len(), 8, "with the resource level's mode");
    let (s, p1) = call(&app, "GET", "/v1/audit?limit=6", Some(ADMIN), None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(p1["records"].as_array().map(Vec::len), Some(6));
    let cursor = p1["next_cursor"].as_str().unwrap().to_string();
    let (_, p2) = call(
        &app,
        "GET",
        &format!("/v1/audit?limit=6&cursor={cursor}"),
        Some(ADMIN),
        None,
    )
    .await;
    let (_, p3) = call(
        &app,
        "GET",
        &format!(
            "/v1/audit?limit=6&cursor={}",
            p2["next_cursor"].as_str().unwrap()
        ),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(p3["records"].as_array().map(Vec::len), Some(5));
    assert_eq!(p3["next_cursor"], Value::Null);
    let ids: BTreeSet<String> = [&p1, &p2, &p3]
        .iter()
        .flat_map(|p| p["records"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(ids.len(), 17, "pages do not overlap");

    // Bad queries, roles.
    for (q, code) in [
        ("?limit=0", "invalid_request"),
        ("?limit=1001", "invalid_request"),
        ("?limit=x", "invalid_request"),
        ("?color=red", "invalid_request"),
        ("?cursor=nope", "invalid_identifier"),
        ("?entity=a%23b", "invalid_identifier"),
    ] {
        let (s, b) = call(&app, "GET", &format!("/v1/audit{q}"), Some(ADMIN), None).await;
        assert_eq!(
            (s, b["error"].as_str()),
            (StatusCode::BAD_REQUEST, Some(code)),
            "{q}: {b}"
        );
    }
    let (s, _) = call(&app, "GET", "/v1/audit", Some(CLIENT), None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = call(&app, "GET", "/v1/audit", None, None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn every_admin_route_is_audited_on_memory() {
    walk(Arc::new(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_route_is_audited_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = tollgate_sqlite::SqliteStore::open(dir.path().join("t.db")).unwrap();
    walk(Arc::new(store)).await;
}

/// Without authentication every change is recorded as `anonymous`.
#[tokio::test]
async fn without_auth_the_principal_is_anonymous() {
    let app = app(Arc::new(MemoryStore::new()), false);
    let (s, _) = call(&app, "PUT", "/v1/limits/system", None, Some(&limits(5))).await;
    assert_eq!(s, StatusCode::OK);
    let rs = records(&app, None, "").await;
    assert_eq!(rs.len(), 1);
    assert_eq!(rs[0]["principal"], "anonymous");
    assert_eq!(rpm(&rs[0]["after"]), Some(5));
}
