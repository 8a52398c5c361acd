//! `GET /v1/usage` and the aggregator's metrics, over a server running the feed aggregator.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tollgate::{FeedAggregator, Limit, Limiter, Scope, UsageOptions, Window};
use tollgate_server::aggregate::AggregatorRun;
use tollgate_server::Server;
use tollgate_store::MemoryStore;
use tower::ServiceExt;

async fn call(s: &Server, method: &str, uri: &str, body: Option<Value>) -> (StatusCode, String) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(match body {
            Some(b) => Body::from(b.to_string()),
            None => Body::empty(),
        })
        .unwrap();
    let res = s.router().oneshot(req).await.unwrap();
    let status = res.status();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test]
async fn usage_route_pages_snapshots_and_metrics_show_the_passes() {
    let store = Arc::new(MemoryStore::with_change_feed());
    let limiter = Limiter::new(store.clone()).unwrap();
    limiter
        .admin()
        .set_limits(
            &Scope::Resource("gpt".into()),
            &[
                Limit::per_minute("rpm", 100).unwrap(),
                Limit::per_minute("tpm", 100_000).unwrap(),
            ],
        )
        .await
        .unwrap();
    let agg = FeedAggregator::new(
        &limiter,
        store,
        UsageOptions {
            windows: vec![Window::Hourly, Window::Daily],
            ..UsageOptions::default()
        },
    )
    .unwrap();
    let run = AggregatorRun::new(agg, Duration::from_secs(3600));
    let server = Server::builder(limiter).aggregator(run.clone()).build();
    for (e, tpm) in [("u1", 500), ("u1", 250), ("u2", 40)] {
        let (st, body) = call(
            &server,
            "POST",
            "/v1/acquire",
            Some(json!({"entity": e, "resource": "gpt", "amounts": {"rpm": 1, "tpm": tpm}, "commit": true})),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{body}");
    }
    let rep = run.pass().await.unwrap();
    assert_eq!(rep.usage_changes, 3);

    let (st, body) = call(&server, "GET", "/v1/usage?entity=u1&window=hourly", None).await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let snaps = v["snapshots"].as_array().unwrap();
    assert_eq!(snaps.len(), 1, "{v}");
    assert_eq!(snaps[0]["requests"], 2);
    assert_eq!(snaps[0]["consumed"]["tpm"], 750.0);
    assert_eq!(snaps[0]["consumed_milli"]["tpm"], 750_000);
    assert_eq!(snaps[0]["consumed"]["rpm"], 2.0);
    assert!(snaps[0]["window_start"]
        .as_str()
        .unwrap()
        .ends_with(":00:00Z"));

    // Resource mode, one snapshot per page.
    let (_, body) = call(
        &server,
        "GET",
        "/v1/usage?resource=gpt&window=daily&limit=1",
        None,
    )
    .await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["snapshots"].as_array().unwrap().len(), 1);
    let next = v["next"].as_str().expect("a second page").to_string();
    let (_, body) = call(
        &server,
        "GET",
        &format!(
            "/v1/usage?resource=gpt&window=daily&limit=1&after={}",
            urlencode(&next)
        ),
        None,
    )
    .await;
    let v2: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v2["snapshots"].as_array().unwrap().len(), 1, "{v2}");
    assert!(v2["next"].is_null());
    let mut who = vec![
        v["snapshots"][0]["entity"].as_str().unwrap().to_string(),
        v2["snapshots"][0]["entity"].as_str().unwrap().to_string(),
    ];
    who.sort();
    assert_eq!(who, ["u1", "u2"]);

    // Bad queries are typed 400s.
    let (st, body) = call(&server, "GET", "/v1/usage?window=daily", None).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(body.contains("invalid_usage_query"), "{body}");
    let (st, body) = call(&server, "GET", "/v1/usage?entity=u1&window=weekly", None).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(body.contains("invalid_request"), "{body}");
    let (st, _) = call(&server, "GET", "/v1/usage?entity=u1&from=yesterday", None).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);

    let (st, m) = call(&server, "GET", "/metrics", None).await;
    assert_eq!(st, StatusCode::OK);
    assert!(
        m.contains("tollgate_aggregator_passes_total{outcome=\"ok\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("tollgate_aggregator_usage_changes_total 3"),
        "{m}"
    );
    assert!(m.contains("tollgate_feed_lag_seconds"), "{m}");
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

mod common;

/// `Server::serve` runs the aggregator on its timer: usage shows up without a manual pass.
#[tokio::test]
async fn serve_runs_the_aggregator_in_process() {
    let store = Arc::new(MemoryStore::with_change_feed());
    let limiter = Limiter::new(store.clone()).unwrap();
    limiter
        .admin()
        .set_limits(
            &Scope::Resource("gpt".into()),
            &[Limit::per_minute("tpm", 100_000).unwrap()],
        )
        .await
        .unwrap();
    let agg = FeedAggregator::new(&limiter, store, UsageOptions::default()).unwrap();
    let run = AggregatorRun::new(agg, Duration::from_millis(20));
    let stats = run.stats.clone();
    let server = Server::builder(limiter).aggregator(run).build();
    let running = common::Running::serve(server.clone()).await;
    let (st, body) = call(
        &server,
        "POST",
        "/v1/acquire",
        Some(json!({"entity": "u9", "resource": "gpt", "amounts": {"tpm": 77}, "commit": true})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let mut seen = Value::Null;
    for _ in 0..200 {
        let (_, body) = call(&server, "GET", "/v1/usage?entity=u9&window=daily", None).await;
        seen = serde_json::from_str(&body).unwrap();
        if seen["snapshots"].as_array().is_some_and(|a| !a.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        seen["snapshots"][0]["consumed_milli"]["tpm"], 77_000,
        "{seen}"
    );
    assert!(stats.passes.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    running.stop().await;
}
