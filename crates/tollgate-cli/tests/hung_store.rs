//! A store that does not answer, as a user meets it: the SQLite file's write lock held by
//! another process (a stuck writer). Every command answers within `--store-timeout`
//! (plus a margin): `block` refuses (CLI exit 4, HTTP `503 store_unavailable`), `allow`
//! admits degraded (exit 0, `200` with `degraded: true`). Nothing is charged while it hangs.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{code, stderr, stdout, tollgate, ServerProc};
use serde_json::Value;

/// What "within the store timeout" allows on a loaded machine (the timeout is 300 ms; a
/// hang would last as long as the lock is held).
const BOUND: Duration = Duration::from_secs(5);

/// Hold the database's write lock (as a stuck writer would) until dropped.
fn lock(db: &Path) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(db).expect("open the database");
    c.execute_batch("BEGIN IMMEDIATE;")
        .expect("take the write lock");
    c
}

fn acquire(st: &str, extra: &[&str]) -> (std::process::Output, Duration) {
    let mut args = vec![
        "acquire",
        "u",
        "r",
        "q=1",
        "--store",
        st,
        "--store-timeout",
        "300ms",
        "--json",
    ];
    args.extend_from_slice(extra);
    let t = Instant::now();
    let o = tollgate(&args);
    (o, t.elapsed())
}

#[test]
fn a_locked_store_answers_within_the_store_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("hung.db");
    let st = format!("sqlite:{}", db.display());
    let o = tollgate(&[
        "limits",
        "set",
        "--resource",
        "r",
        "q:quota=100,after=1h",
        "--store",
        &st,
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let (o, _) = acquire(&st, &[]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));

    let held = lock(&db);
    let (o, took) = acquire(&st, &[]);
    assert_eq!(code(&o), 4, "block: {}", stderr(&o));
    assert!(took < BOUND, "block answered after {took:?}");
    drop(held);

    // The system-wide policy says allow.
    let o = tollgate(&[
        "limits",
        "set",
        "--system",
        "q:quota=100,after=1h",
        "--on-unavailable",
        "allow",
        "--store",
        &st,
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let held = lock(&db);
    let (o, took) = acquire(&st, &[]);
    assert_eq!(code(&o), 0, "allow: {}", stderr(&o));
    assert!(took < BOUND, "allow answered after {took:?}");
    let v: Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(v["degraded"], true, "{v}");
    drop(held);

    // The store answers again: only the first acquire was charged.
    let (o, _) = acquire(&st, &[]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(v["degraded"], false, "{v}");
    let q = v["statuses"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["limit"] == "q"))
        .unwrap_or_else(|| panic!("no status for q: {v}"));
    assert_eq!(q["available"], 98, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_store_gives_503_or_degraded_over_http_within_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("hung-http.db");
    let s = ServerProc::start(&db, &["--store-timeout", "300ms"]);
    let http = reqwest::Client::new();
    let put = |path: &str, body: &str| {
        http.put(s.url(path))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    let r = put(
        "/v1/limits/resources/r",
        r#"{"limits":[{"name":"q","capacity":100,"reset_after_s":3600}]}"#,
    )
    .await
    .expect("put limits");
    assert_eq!(r.status().as_u16(), 200);
    let acq = r#"{"entity":"u","resource":"r","amounts":{"q":1},"commit":true}"#;
    let post = || {
        http.post(s.url("/v1/acquire"))
            .header("content-type", "application/json")
            .body(acq)
            .send()
    };
    assert_eq!(post().await.expect("acquire").status().as_u16(), 200);

    let held = lock(&db);
    let t = Instant::now();
    let r = post().await.expect("acquire");
    let took = t.elapsed();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    assert_eq!(status, 503, "block: {body}");
    assert_eq!(body["error"], "store_unavailable", "{body}");
    assert!(took < BOUND, "block answered after {took:?}");
    drop(held);

    let r = put(
        "/v1/limits/system",
        r#"{"limits":[],"on_unavailable":"allow"}"#,
    )
    .await
    .expect("put system");
    assert_eq!(r.status().as_u16(), 200);
    let held = lock(&db);
    let t = Instant::now();
    let r = post().await.expect("acquire");
    let took = t.elapsed();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    assert_eq!(status, 200, "allow: {body}");
    assert_eq!(body["degraded"], true, "{body}");
    assert!(took < BOUND, "allow answered after {took:?}");
    drop(held);
    s.stop();
}
