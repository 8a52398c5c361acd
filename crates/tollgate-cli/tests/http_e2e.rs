//! End to end: the real binary serving HTTP over a temporary SQLite file.

mod common;

use common::ServerProc;
use serde_json::{json, Value};

struct R {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl R {
    fn h(&self, n: &str) -> Option<String> {
        self.headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }
    fn code(&self) -> &str {
        self.body["error"].as_str().unwrap_or("")
    }
}

async fn send(http: &reqwest::Client, method: &str, url: &str, body: Option<&str>) -> R {
    let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut rb = http.request(m, url);
    if let Some(b) = body {
        rb = rb
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let r = rb.send().await.expect("request");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap_or_default();
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    R {
        status,
        headers,
        body,
    }
}

async fn availability(http: &reqwest::Client, s: &ServerProc) -> (i64, i64) {
    let r = send(
        http,
        "GET",
        &s.url("/v1/availability?entity=user-1&resource=gpt-4"),
        None,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let l = r.body["limits"].as_array().unwrap();
    let get = |n: &str| {
        l.iter()
            .find(|x| x["limit"] == n)
            .and_then(|x| x["available"].as_i64())
            .unwrap()
    };
    (get("rpm"), get("tokens"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_limit_reject_lease_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tollgate.db");
    let http = reqwest::Client::new();
    let s = ServerProc::start(&db, &[]);

    let r = send(&http, "GET", &s.url("/healthz"), None).await;
    assert_eq!(
        (r.status, r.body["backend"].as_str()),
        (200, Some("sqlite"))
    );

    // rpm: 3 per minute (drips), tokens: a 1000-token quota for a 1-hour window (no drip,
    // so balances are exact across the restart).
    let limits = json!({ "limits": [
        { "name": "rpm", "capacity": 3, "refill_amount": 3, "refill_period_ms": 60000 },
        { "name": "tokens", "capacity": 1000, "reset_after_s": 3600 }
    ]});
    let r = send(
        &http,
        "PUT",
        &s.url("/v1/limits/resources/gpt-4"),
        Some(&limits.to_string()),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);

    let acq =
        json!({ "entity": "user-1", "resource": "gpt-4", "amounts": { "rpm": 1, "tokens": 100 } })
            .to_string();
    let mut leases = Vec::new();
    for i in 0..3 {
        let r = send(&http, "POST", &s.url("/v1/acquire"), Some(&acq)).await;
        assert_eq!(r.status, 200, "acquire {i}: {}", r.body);
        assert_eq!(
            r.h("ratelimit-policy").as_deref(),
            Some("\"rpm\";q=3;w=60, \"tokens\";q=1000;w=3600")
        );
        let rl = r.h("ratelimit").unwrap();
        assert!(rl.starts_with(&format!("\"rpm\";r={};t=", 2 - i)), "{rl}");
        assert!(
            rl.contains(&format!("\"tokens\";r={};t=", 900 - 100 * i)),
            "{rl}"
        );
        leases.push(r.body["lease_id"].as_str().unwrap().to_string());
    }
    let r = send(&http, "POST", &s.url("/v1/acquire"), Some(&acq)).await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.code(), "rate_limit_exceeded");
    let retry_ms = r.body["retry_after_ms"].as_i64().unwrap();
    assert!((1..=20_000).contains(&retry_ms), "{retry_ms}");
    let ra: i64 = r.h("retry-after").unwrap().parse().unwrap();
    assert_eq!(ra, ((retry_ms + 999) / 1000).max(1));
    let rl = r.h("ratelimit").unwrap();
    assert!(rl.starts_with("\"rpm\";r=0;t="), "{rl}");
    let t: i64 = rl["\"rpm\";r=0;t=".len()..]
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(t, ra);
    assert!(r.h("ratelimit-policy").is_some());
    assert_eq!(r.body["limits"][0]["exceeded"], true);

    // Lease 0 used 350 tokens, not 100: adjust +250 and commit. Lease 1 is rolled back.
    let r = send(
        &http,
        "POST",
        &s.url(&format!("/v1/leases/{}/adjust", leases[0])),
        Some(r#"{"limit":"tokens","delta":250}"#),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["consumed"]["tokens"], 350);
    // An adjust answers the lease's next token: the one to pass from now on.
    leases[0] = r.body["lease_id"].as_str().unwrap().to_string();
    let r = send(
        &http,
        "POST",
        &s.url(&format!("/v1/leases/{}/commit", leases[0])),
        None,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = send(
        &http,
        "POST",
        &s.url(&format!("/v1/leases/{}/commit", leases[0])),
        None,
    )
    .await;
    assert_eq!((r.status, r.code()), (409, "lease_closed"));
    let r = send(
        &http,
        "POST",
        &s.url(&format!("/v1/leases/{}/rollback", leases[1])),
        None,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    // Lease 2 stays open with an adjustment: graceful shutdown commits it.
    let r = send(
        &http,
        "POST",
        &s.url(&format!("/v1/leases/{}/adjust", leases[2])),
        Some(r#"{"limit":"tokens","delta":50}"#),
    )
    .await;
    assert_eq!(r.status, 200);

    let (_, tokens) = availability(&http, &s).await;
    assert_eq!(tokens, 1000 - 350 - 100);
    s.stop();

    // Restart on the same file: every committed debit survived, and the open lease's
    // adjustment was committed at shutdown.
    let s = ServerProc::start(&db, &[]);
    let (rpm, tokens) = availability(&http, &s).await;
    assert_eq!(tokens, 1000 - 350 - 100 - 50);
    assert!(rpm <= 3, "{rpm}");
    let r = send(&http, "GET", &s.url("/v1/limits/resources/gpt-4"), None).await;
    assert_eq!(r.body["limits"].as_array().map(Vec::len), Some(2));
    // Without a lease secret each process signs with its own random key: the restarted
    // server does not accept the previous one's tokens.
    let r = send(
        &http,
        "POST",
        &s.url(&format!("/v1/leases/{}/commit", leases[2])),
        None,
    )
    .await;
    assert_eq!((r.status, r.code()), (400, "invalid_lease"));
    let m = http
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(m.contains("tollgate_http_requests_total"), "{m}");
    // `serve` on a SQLite file exposes its store's group-commit counters; none of its
    // writes waited past its deadline in the writer's queue.
    assert!(m.contains("tollgate_sqlite_commit_requests_count"), "{m}");
    assert!(
        m.contains("tollgate_sqlite_expired_requests_total 0"),
        "{m}"
    );
    s.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_4xx_codes_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let s = ServerProc::start(&dir.path().join("t.db"), &[]);
    let http = reqwest::Client::new();
    let r = send(
        &http,
        "PUT",
        &s.url("/v1/limits/resources/gpt-4"),
        Some(r#"{"limits":[{"name":"rpm","capacity":5,"refill_amount":5}]}"#),
    )
    .await;
    assert_eq!(r.status, 200);
    let acq = |amounts: &str, entity: &str| {
        format!(r#"{{"entity":"{entity}","resource":"gpt-4","amounts":{amounts}}}"#)
    };
    let cases: Vec<(&str, String, Option<String>, u16, &str)> = vec![
        (
            "POST",
            "/v1/acquire".into(),
            Some("{\"entity\": ".into()),
            400,
            "invalid_json",
        ),
        (
            "POST",
            "/v1/acquire".into(),
            Some("nonsense".into()),
            400,
            "invalid_json",
        ),
        (
            "POST",
            "/v1/acquire".into(),
            Some(acq(r#"{"bogus":1}"#, "u")),
            400,
            "unknown_limit",
        ),
        (
            "POST",
            "/v1/acquire".into(),
            Some(acq(r#"{"rpm":-5}"#, "u")),
            400,
            "invalid_amount",
        ),
        (
            "POST",
            "/v1/acquire".into(),
            Some(acq(r#"{"rpm":123456789012345678901234567890}"#, "u")),
            400,
            "invalid_amount",
        ),
        (
            "POST",
            "/v1/acquire".into(),
            Some(acq(r#"{"rpm":9223372036854775807}"#, "u")),
            400,
            "invalid_amount",
        ),
        (
            "POST",
            "/v1/acquire".into(),
            Some(acq(r#"{"rpm":1}"#, "bad id!")),
            400,
            "invalid_identifier",
        ),
        (
            "POST",
            "/v1/acquire".into(),
            Some(acq(r#"{"rpm":1}"#, "drop;table")),
            400,
            "invalid_identifier",
        ),
        (
            "PUT",
            "/v1/limits/entities/bad%20id".into(),
            Some(r#"{"limits":[]}"#.into()),
            400,
            "invalid_identifier",
        ),
        (
            "PUT",
            "/v1/limits/system".into(),
            Some(
                r#"{"limits":[{"name":"x","capacity":99999999999999999999,"refill_amount":1}]}"#
                    .into(),
            ),
            400,
            "invalid_limit",
        ),
        (
            "GET",
            "/v1/entities/%E2%80%AE".into(),
            None,
            400,
            "invalid_identifier",
        ),
        (
            "POST",
            "/v1/leases/does-not-exist/commit".into(),
            None,
            400,
            "invalid_lease",
        ),
    ];
    for (m, p, b, st, code) in cases {
        let r = send(&http, m, &s.url(&p), b.as_deref()).await;
        assert_eq!(
            (r.status, r.code()),
            (st, code),
            "{m} {p} {b:?}: {}",
            r.body
        );
    }
    // Still healthy afterwards.
    assert_eq!(
        send(&http, "GET", &s.url("/healthz"), None).await.status,
        200
    );
    s.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_http_reports_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let s = ServerProc::start(&dir.path().join("b.db"), &[]);
    let o = common::tollgate(&[
        "bench-http",
        "--url",
        &s.base,
        "--requests",
        "200",
        "--concurrency",
        "4",
        "--entities",
        "10",
        "--json",
    ]);
    assert_eq!(common::code(&o), 0, "{}", common::stderr(&o));
    let v: Value = serde_json::from_str(&common::stdout(&o)).unwrap();
    assert_eq!(v["requests"], 200);
    assert_eq!(v["statuses"]["200"], 200);
    assert!(v["requests_per_second"].as_f64().unwrap() > 0.0);
    assert!(v["latency_ms"]["p99"].as_f64().unwrap() >= v["latency_ms"]["p50"].as_f64().unwrap());
    s.stop();
}
