//! The embedded store's group-commit counters at `/metrics` (`tollgate_sqlite_*`), on a
//! SQLite file: every queued write is counted once, in one commit, and a warm admitted
//! acquire adds one write (and, called alone, one commit).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::json;
use tollgate::{Limiter, ManualClock};
use tollgate_server::{Server, ServerConfig};
use tollgate_sqlite::SqliteStore;
use tower::ServiceExt;

const T0: i64 = 1_700_000_000_000;

async fn call(
    app: &Router,
    method: &str,
    path: &str,
    body: Option<String>,
) -> (StatusCode, String) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(body.map(Body::from).unwrap_or_else(Body::empty))
        .expect("request");
    let resp = app.clone().oneshot(req).await.expect("answer");
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// The value of the sample `name` (a whole line's first field) in the metrics text.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {name} in\n{text}"))
        .parse()
        .unwrap_or_else(|e| panic!("sample {name}: {e}"))
}

struct Counts {
    commits: f64,
    requests: f64,
    all_buckets: f64,
    single: f64,
    queued: f64,
    expired: f64,
    abandoned: f64,
    items: f64,
    largest: f64,
}

async fn counts(app: &Router) -> Counts {
    let (status, t) = call(app, "GET", "/metrics", None).await;
    assert_eq!(status, StatusCode::OK);
    Counts {
        commits: sample(&t, "tollgate_sqlite_commit_requests_count"),
        requests: sample(&t, "tollgate_sqlite_commit_requests_sum"),
        all_buckets: sample(&t, r#"tollgate_sqlite_commit_requests_bucket{le="+Inf"}"#),
        single: sample(&t, r#"tollgate_sqlite_commit_requests_bucket{le="1.0"}"#),
        queued: sample(&t, "tollgate_sqlite_queued_requests_total"),
        expired: sample(&t, "tollgate_sqlite_expired_requests_total"),
        abandoned: sample(&t, "tollgate_sqlite_abandoned_requests_total"),
        items: sample(&t, "tollgate_sqlite_commit_items_total"),
        largest: sample(&t, "tollgate_sqlite_largest_commit_requests"),
    }
}

/// A server on a fresh SQLite file (its store shared with the test), with 100 `rpm` for
/// resource `gpt-4` stored.
async fn server() -> (tempfile::TempDir, SqliteStore, Router) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path().join("t.db")).expect("open");
    let limiter = Limiter::builder(Arc::new(store.clone()))
        .clock(Arc::new(ManualClock::new(T0)))
        .build()
        .expect("limiter");
    let app = Server::builder(limiter)
        .config(ServerConfig::default())
        .group_commit(store.clone())
        .build()
        .router();
    let limits = json!({ "limits": [
        { "name": "rpm", "capacity": 100, "refill_amount": 100, "refill_period_ms": 60000 }
    ]});
    let (status, body) = call(
        &app,
        "PUT",
        "/v1/limits/resources/gpt-4",
        Some(limits.to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    (dir, store, app)
}

#[tokio::test]
async fn group_commit_counters_count_each_write_once() {
    let (_dir, store, app) = server().await;
    let acquire = || {
        let app = app.clone();
        async move {
            let body = json!({ "entity": "u1", "resource": "gpt-4", "amounts": { "rpm": 1 } });
            let (status, text) = call(&app, "POST", "/v1/acquire", Some(body.to_string())).await;
            assert_eq!(status, StatusCode::OK, "{text}");
        }
    };
    // The first acquire creates the bucket; the next five find it warm.
    acquire().await;
    let before = counts(&app).await;
    assert!(
        before.commits >= 2.0,
        "the limits and the bucket were written"
    );
    for _ in 0..5 {
        acquire().await;
    }
    let after = counts(&app).await;

    // Five warm admitted acquires, one after another: five writes, each its own commit.
    assert_eq!(after.requests - before.requests, 5.0);
    assert_eq!(after.commits - before.commits, 5.0);
    assert_eq!(after.single - before.single, 5.0);
    // Every queued write was committed once: none expired, none abandoned.
    for c in [&before, &after] {
        assert_eq!(c.all_buckets, c.commits);
        assert_eq!(c.queued, c.requests);
        assert_eq!(c.expired, 0.0);
        assert_eq!(c.abandoned, 0.0);
        assert!(c.items >= c.requests);
        assert!(c.largest >= 1.0);
    }
    // The same numbers as the store's own.
    let s = store.group_commit_stats();
    assert_eq!(s.batches as f64, after.commits);
    assert_eq!(s.requests as f64, after.requests);

    // Forty acquires at once, on entities of their own: each queued write is counted in
    // exactly one commit, however they grouped.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..40 {
        let app = app.clone();
        tasks.spawn(async move {
            let body =
                json!({ "entity": format!("e{i}"), "resource": "gpt-4", "amounts": { "rpm": 1 } });
            call(&app, "POST", "/v1/acquire", Some(body.to_string())).await
        });
    }
    while let Some(r) = tasks.join_next().await {
        let (status, text) = r.expect("task");
        assert_eq!(status, StatusCode::OK, "{text}");
    }
    let end = counts(&app).await;
    assert!(end.requests - after.requests >= 40.0, "every acquire wrote");
    assert!(end.commits - after.commits <= end.requests - after.requests);
    assert_eq!(end.all_buckets, end.commits);
    assert_eq!(end.queued, end.requests);
    assert_eq!((end.expired, end.abandoned), (0.0, 0.0));
}

/// The feed-read counters at `/metrics` are the store's own (`feed_read_stats`): the first
/// read decodes the rows written before this process read its feed; later writes are read
/// from memory.
#[tokio::test]
async fn feed_read_counters_are_the_stores() {
    use tollgate_store::{ChangeFeed, FeedCursor};
    let (_dir, store, app) = server().await;
    let acquire = |n: usize| {
        let app = app.clone();
        async move {
            for _ in 0..n {
                let body = json!({ "entity": "u1", "resource": "gpt-4", "amounts": { "rpm": 1 } });
                let (status, text) =
                    call(&app, "POST", "/v1/acquire", Some(body.to_string())).await;
                assert_eq!(status, StatusCode::OK, "{text}");
            }
        }
    };
    let feed = |app: Router| async move {
        let (status, t) = call(&app, "GET", "/metrics", None).await;
        assert_eq!(status, StatusCode::OK);
        [
            "tollgate_sqlite_feed_held_changes_total",
            "tollgate_sqlite_feed_decoded_changes_total",
            "tollgate_sqlite_feed_rebuilt_changes_total",
            "tollgate_sqlite_feed_rebuilds_total",
            "tollgate_sqlite_feed_rebuild_rows_total",
        ]
        .map(|n| sample(&t, n) as u64)
    };
    let as_array = |s: tollgate_sqlite::FeedReadStats| {
        [
            s.held_changes,
            s.decoded_changes,
            s.rebuilt_changes,
            s.rebuilds,
            s.rebuild_rows,
        ]
    };
    acquire(3).await;
    assert_eq!(feed(app.clone()).await, [0; 5], "nothing read yet");
    // Written before this process read its feed: decoded from the rows.
    let first = store
        .read_feed(&FeedCursor::start(), 1_000)
        .await
        .expect("read");
    let decoded = first.changes.len() as u64;
    assert!(decoded >= 4, "the limits and three acquires: {decoded}");
    assert_eq!(feed(app.clone()).await, [0, decoded, 0, 0, 0]);
    // Written after: taken from memory, no row decoded, no walk.
    acquire(5).await;
    let next = store.read_feed(&first.cursor, 1_000).await.expect("read");
    assert_eq!(next.changes.len(), 5);
    let seen = feed(app.clone()).await;
    assert_eq!(seen, [5, decoded, 0, 0, 0]);
    assert_eq!(seen, as_array(store.feed_read_stats()));
}
