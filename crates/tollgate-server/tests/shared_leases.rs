//! Two servers over one SQLite file, each with its own connection, the same lease secret:
//! a lease acquired on one is adjusted and committed on the other, exactly and once.
//! (The same over one DynamoDB table, with the real binary: tollgate-cli's
//! `tests/shared_leases_e2e.rs`.)

mod common;

use std::sync::Arc;

use common::Running;
use serde_json::{json, Value};
use tollgate::{LeaseKey, Limiter};
use tollgate_server::{Server, ServerConfig};
use tollgate_sqlite::SqliteStore;
use tollgate_store::{Counting, Store, StoreStats};

const SECRET: &[u8] = b"a shared lease secret of 32+ bytes";

struct Node {
    run: Running,
    store: Arc<Counting<Arc<dyn Store>>>,
}

impl Node {
    async fn start(db: &std::path::Path, key: Option<LeaseKey>) -> Node {
        let raw: Arc<dyn Store> = Arc::new(SqliteStore::open(db).unwrap());
        let store = Arc::new(Counting::new(raw));
        let limiter = Limiter::new(store.clone()).unwrap();
        let cfg = ServerConfig {
            lease_key: key,
            ..Default::default()
        };
        let run = Running::serve(Server::new(limiter, cfg)).await;
        Node { run, store }
    }
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.run.addr)
    }
    fn stats(&self) -> StoreStats {
        self.store.stats()
    }
}

async fn post(http: &reqwest::Client, url: &str, body: Option<Value>) -> (u16, Value) {
    let mut rb = http.post(url);
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let r = rb.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn available(http: &reqwest::Client, n: &Node) -> (i64, i64) {
    let v: Value = http
        .get(n.url("/v1/availability?entity=u1&resource=gpt-4"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let get = |name: &str| {
        v["limits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["limit"] == name)
            .and_then(|l| l["available"].as_i64())
            .unwrap()
    };
    (get("requests"), get("tokens"))
}

fn token(v: &Value) -> String {
    v["lease_id"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_acquired_on_one_server_is_finished_on_another() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    let key = || Some(LeaseKey::from_bytes(SECRET).unwrap());
    let a = Node::start(&db, key()).await;
    let b = Node::start(&db, key()).await;
    let http = reqwest::Client::new();

    // Quotas (no drip: balances are exact whatever the wall clock does).
    let r = http
        .put(a.url("/v1/limits/resources/gpt-4"))
        .json(&json!({ "limits": [
            { "name": "requests", "capacity": 100, "reset_after_s": 86400 },
            { "name": "tokens", "capacity": 100000, "reset_after_s": 86400 }
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let acquire = |n: &Node, tokens: i64| {
        let url = n.url("/v1/acquire");
        let http = http.clone();
        async move {
            post(
                &http,
                &url,
                Some(json!({ "entity": "u1", "resource": "gpt-4",
                             "amounts": { "requests": 1, "tokens": tokens } })),
            )
            .await
        }
    };
    let (s, v) = acquire(&a, 1).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(available(&http, &b).await, (99, 99_999));

    // 1. Acquired on A (one store write: warm), adjusted on B, committed on A.
    let before = a.stats();
    let (s, v) = acquire(&a, 500).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        a.stats().since(&before).writes(),
        1,
        "a warm acquire is one write"
    );
    let t0 = token(&v);
    assert!(
        t0.starts_with("v1.") && t0.len() < 4096,
        "{} bytes",
        t0.len()
    );
    let (s, v) = post(
        &http,
        &b.url(&format!("/v1/leases/{t0}/adjust")),
        Some(json!({ "limit": "tokens", "delta": 230 })),
    )
    .await;
    assert_eq!(
        (s, v["consumed"]["tokens"].as_i64()),
        (200, Some(730)),
        "{v}"
    );
    let t1 = token(&v);
    assert_ne!(t1, t0);
    assert_eq!(
        available(&http, &a).await,
        (98, 99_499),
        "nothing written yet"
    );
    let (s, v) = post(&http, &b.url(&format!("/v1/leases/{t0}/commit")), None).await;
    assert_eq!((s, v["error"].as_str()), (409, Some("lease_stale")), "{v}");
    let before = a.stats();
    let (s, v) = post(&http, &a.url(&format!("/v1/leases/{t1}/commit")), None).await;
    assert_eq!((s, v["committed"].as_bool()), (200, Some(true)), "{v}");
    assert_eq!(v["consumed"]["tokens"], 730);
    let cost = a.stats().since(&before);
    assert_eq!(
        (cost.puts, cost.updates, cost.writes()),
        (1, 1, 2),
        "the closure record, then the adjustment"
    );
    assert_eq!(
        available(&http, &b).await,
        (98, 100_000 - 1 - 730),
        "both debits, exactly"
    );
    for (n, t) in [(&a, &t1), (&b, &t1), (&a, &t0)] {
        for op in ["commit", "rollback"] {
            let (s, v) = post(&http, &n.url(&format!("/v1/leases/{t}/{op}")), None).await;
            assert_eq!(
                (s, v["error"].as_str()),
                (409, Some("lease_closed")),
                "{op}: {v}"
            );
        }
    }
    assert_eq!(available(&http, &a).await, (98, 99_269));

    // 2. Acquired on A, adjusted and committed on B; a replay on A is refused.
    let (_, v) = acquire(&a, 1000).await;
    let t = token(&v);
    let (s, v) = post(
        &http,
        &b.url(&format!("/v1/leases/{t}/adjust")),
        Some(json!({ "limit": "tokens", "delta": -400 })),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let t = token(&v);
    let (s, v) = post(&http, &b.url(&format!("/v1/leases/{t}/commit")), None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(available(&http, &a).await, (97, 99_269 - 600));
    let (s, v) = post(&http, &a.url(&format!("/v1/leases/{t}/commit")), None).await;
    assert_eq!((s, v["error"].as_str()), (409, Some("lease_closed")), "{v}");

    // 3. Rolled back on B: refunded once; the granting server's copy is closed too.
    let (_, v) = acquire(&a, 2000).await;
    let t = token(&v);
    assert_eq!(available(&http, &b).await, (96, 99_269 - 600 - 2000));
    let (s, v) = post(&http, &b.url(&format!("/v1/leases/{t}/rollback")), None).await;
    assert_eq!((s, v["rolled_back"].as_bool()), (200, Some(true)), "{v}");
    for n in [&a, &b] {
        let (s, v) = post(&http, &n.url(&format!("/v1/leases/{t}/rollback")), None).await;
        assert_eq!((s, v["error"].as_str()), (409, Some("lease_closed")), "{v}");
    }
    assert_eq!(available(&http, &a).await, (97, 99_269 - 600));

    // A server with another secret refuses the tokens (and one without a secret too).
    let c = Node::start(&db, Some(LeaseKey::from_bytes(&[9u8; 32]).unwrap())).await;
    let d = Node::start(&db, None).await;
    let (_, v) = acquire(&a, 1).await;
    let t = token(&v);
    for n in [&c, &d] {
        let (s, v) = post(&http, &n.url(&format!("/v1/leases/{t}/commit")), None).await;
        assert_eq!(
            (s, v["error"].as_str()),
            (400, Some("invalid_lease")),
            "{v}"
        );
    }
    let (s, _) = post(&http, &b.url(&format!("/v1/leases/{t}/commit")), None).await;
    assert_eq!(s, 200);
    for n in [a, b, c, d] {
        n.run.stop().await;
    }
}

/// In-process: two servers over one MemoryStore and one manual clock.
mod expiry {
    use std::sync::Arc;
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::Request;
    use axum::Router;
    use http_body_util::BodyExt;
    use serde_json::{json, Value};
    use tollgate::{LeaseKey, Limiter, ManualClock};
    use tollgate_server::{Server, ServerConfig};
    use tollgate_store::MemoryStore;
    use tower::ServiceExt;

    const T0: i64 = 1_700_000_000_000;

    async fn call(app: &Router, uri: &str, body: Option<Value>) -> (u16, Value) {
        let req = Request::builder()
            .method("POST")
            .uri(uri)
            .header("content-type", "application/json")
            .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
            .unwrap();
        let r = app.clone().oneshot(req).await.unwrap();
        let status = r.status().as_u16();
        let bytes = r.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    fn pair() -> (Server, Server, Arc<ManualClock>) {
        let store = Arc::new(MemoryStore::new());
        let clock = Arc::new(ManualClock::new(T0));
        let server = || {
            let limiter = Limiter::builder(store.clone())
                .clock(clock.clone())
                .build()
                .unwrap();
            Server::new(
                limiter,
                ServerConfig {
                    lease_ttl: Duration::from_secs(10),
                    lease_key: Some(LeaseKey::from_bytes(super::SECRET).unwrap()),
                    ..Default::default()
                },
            )
        };
        (server(), server(), clock)
    }

    async fn setup(a: &Router) -> String {
        let req = Request::builder()
            .method("PUT")
            .uri("/v1/limits/resources/r")
            .body(Body::from(
                json!({"limits": [{"name": "q", "capacity": 1000, "reset_after_s": 86400}]})
                    .to_string(),
            ))
            .unwrap();
        assert_eq!(a.clone().oneshot(req).await.unwrap().status(), 200);
        let (s, v) = call(
            a,
            "/v1/acquire",
            Some(json!({"entity": "u", "resource": "r", "amounts": {"q": 100}})),
        )
        .await;
        assert_eq!(s, 200, "{v}");
        v["lease_id"].as_str().unwrap().to_string()
    }

    async fn available(app: &Router) -> i64 {
        let req = Request::builder()
            .uri("/v1/availability?entity=u&resource=r")
            .body(Body::empty())
            .unwrap();
        let r = app.clone().oneshot(req).await.unwrap();
        let bytes = r.into_body().collect().await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        v["limits"][0]["available"].as_i64().unwrap()
    }

    /// Adjusted on B and left open: whichever server's sweeper commits first wins and the
    /// other finds it closed; the adjustment counts only if B's copy wins (documented).
    #[tokio::test]
    async fn an_expired_lease_is_committed_once_by_whichever_server_sweeps_first() {
        for b_first in [true, false] {
            let (a, b, clock) = pair();
            let (ra, rb) = (a.router(), b.router());
            let t = setup(&ra).await;
            let (s, v) = call(
                &rb,
                &format!("/v1/leases/{t}/adjust"),
                Some(json!({"limit": "q", "delta": 50})),
            )
            .await;
            assert_eq!(s, 200, "{v}");
            assert_eq!((a.state().leases.len(), b.state().leases.len()), (1, 1));
            clock.set(T0 + 10_000);
            let (first, second) = if b_first { (&b, &a) } else { (&a, &b) };
            assert_eq!(first.sweep().await, 1);
            assert_eq!(second.sweep().await, 0, "closed by the other server");
            let want = if b_first { 1000 - 150 } else { 1000 - 100 };
            assert_eq!(available(&ra).await, want, "b_first {b_first}");
            assert!(a.state().leases.is_empty() && b.state().leases.is_empty());
            let (s, v) = call(&rb, &format!("/v1/leases/{t}/commit"), None).await;
            assert_eq!(
                (s, v["error"].as_str()),
                (404, Some("lease_not_found")),
                "{v}"
            );
        }
    }

    /// An adjust of a lease already closed elsewhere is accepted (it is not checked against
    /// the store); its commit is refused and writes nothing.
    #[tokio::test]
    async fn an_adjust_after_a_close_elsewhere_is_refused_at_commit() {
        let (a, b, _clock) = pair();
        let (ra, rb) = (a.router(), b.router());
        let t = setup(&ra).await;
        let (s, _) = call(&ra, &format!("/v1/leases/{t}/commit"), None).await;
        assert_eq!(s, 200);
        let (s, v) = call(
            &rb,
            &format!("/v1/leases/{t}/adjust"),
            Some(json!({"limit": "q", "delta": 50})),
        )
        .await;
        assert_eq!(s, 200, "{v}");
        let t1 = v["lease_id"].as_str().unwrap().to_string();
        let (s, v) = call(&rb, &format!("/v1/leases/{t1}/commit"), None).await;
        assert_eq!((s, v["error"].as_str()), (409, Some("lease_closed")), "{v}");
        assert_eq!(available(&ra).await, 900);
        // Locally closed now: answered without the store.
        let (s, v) = call(
            &rb,
            &format!("/v1/leases/{t1}/adjust"),
            Some(json!({"limit": "q", "delta": 1})),
        )
        .await;
        assert_eq!((s, v["error"].as_str()), (409, Some("lease_closed")), "{v}");
    }
}
