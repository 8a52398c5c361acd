//! End to end: two `tollgate serve` processes over one store — the same SQLite file, and
//! the same DynamoDB table (with DynamoDB Local, `TOLLGATE_DYNAMODB_ENDPOINT`) — with the
//! same lease secret. A lease acquired on one is adjusted and committed on the other; the
//! balance shows both debits exactly; a second commit anywhere is `409 lease_closed`.

mod common;

use common::{Opts, ServerProc};
use serde_json::{json, Value};

const SECRET: &str = "0123456789abcdef0123456789abcdef-e2e";

async fn send(
    http: &reqwest::Client,
    method: &str,
    url: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut rb = http.request(m, url);
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let r = rb.send().await.expect("request");
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn tokens_left(http: &reqwest::Client, s: &ServerProc) -> i64 {
    let (status, v) = send(
        http,
        "GET",
        &s.url("/v1/availability?entity=user-1&resource=gpt-4"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    v["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["limit"] == "tokens")
        .and_then(|l| l["available"].as_i64())
        .unwrap()
}

/// The user's story on two servers `a` and `b` over one store.
async fn acquire_here_commit_there(a: &ServerProc, b: &ServerProc) {
    let http = reqwest::Client::new();
    let (s, v) = send(
        &http,
        "PUT",
        &a.url("/v1/limits/resources/gpt-4"),
        Some(json!({ "limits": [
            { "name": "tokens", "capacity": 100000, "reset_after_s": 86400 }
        ]})),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = send(
        &http,
        "POST",
        &a.url("/v1/acquire"),
        Some(json!({ "entity": "user-1", "resource": "gpt-4", "amounts": { "tokens": 500 } })),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let t0 = v["lease_id"].as_str().unwrap().to_string();
    assert_eq!(tokens_left(&http, b).await, 99_500);
    let (s, v) = send(
        &http,
        "POST",
        &b.url(&format!("/v1/leases/{t0}/adjust")),
        Some(json!({ "limit": "tokens", "delta": 230 })),
    )
    .await;
    assert_eq!(
        (s, v["consumed"]["tokens"].as_i64()),
        (200, Some(730)),
        "{v}"
    );
    let t1 = v["lease_id"].as_str().unwrap().to_string();
    let (s, v) = send(
        &http,
        "POST",
        &b.url(&format!("/v1/leases/{t1}/commit")),
        None,
    )
    .await;
    assert_eq!((s, v["committed"].as_bool()), (200, Some(true)), "{v}");
    assert_eq!(
        tokens_left(&http, a).await,
        100_000 - 500 - 230,
        "both debits"
    );
    assert_eq!(tokens_left(&http, b).await, 100_000 - 730);
    for (srv, t) in [(a, &t1), (b, &t1), (a, &t0)] {
        let (s, v) = send(
            &http,
            "POST",
            &srv.url(&format!("/v1/leases/{t}/commit")),
            None,
        )
        .await;
        assert_eq!((s, v["error"].as_str()), (409, Some("lease_closed")), "{v}");
    }
    // Rolled back on the other server: refunded once.
    let (_, v) = send(
        &http,
        "POST",
        &b.url("/v1/acquire"),
        Some(json!({ "entity": "user-1", "resource": "gpt-4", "amounts": { "tokens": 1000 } })),
    )
    .await;
    let t = v["lease_id"].as_str().unwrap().to_string();
    assert_eq!(tokens_left(&http, a).await, 100_000 - 730 - 1000);
    let (s, v) = send(
        &http,
        "POST",
        &a.url(&format!("/v1/leases/{t}/rollback")),
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = send(
        &http,
        "POST",
        &b.url(&format!("/v1/leases/{t}/rollback")),
        None,
    )
    .await;
    assert_eq!((s, v["error"].as_str()), (409, Some("lease_closed")), "{v}");
    assert_eq!(tokens_left(&http, b).await, 100_000 - 730);
}

fn with_secret<'a>() -> Opts<'a> {
    Opts {
        env: vec![("TOLLGATE_LEASE_SECRET", SECRET.to_string())],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_two_servers_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tollgate.db");
    let a = ServerProc::start_with(&db, &[], with_secret());
    // The second reads the secret from a file (a trailing newline is ignored).
    let secret_file = dir.path().join("lease-secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&secret_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let path = secret_file.display().to_string();
    let b = ServerProc::start(&db, &["--lease-secret-file", &path]);
    acquire_here_commit_there(&a, &b).await;
    a.stop();
    b.stop();
}

#[test]
fn a_short_lease_secret_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tollgate.db");
    let o = std::process::Command::new(common::BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--store"])
        .arg(format!("sqlite:{}", db.display()))
        .env("TOLLGATE_LEASE_SECRET", "too short")
        .output()
        .unwrap();
    assert_eq!(common::code(&o), 2, "{}", common::stderr(&o));
    assert!(
        common::stderr(&o).contains("TOLLGATE_LEASE_SECRET: a lease key needs at least 32 bytes"),
        "{}",
        common::stderr(&o)
    );
}

#[cfg(feature = "dynamodb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_two_servers_one_table() {
    let Ok(ep) = std::env::var("TOLLGATE_DYNAMODB_ENDPOINT") else {
        eprintln!("dynamodb_two_servers_one_table: TOLLGATE_DYNAMODB_ENDPOINT is not set; skipped");
        return;
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() % 1_000_000_000)
        .unwrap_or(0);
    let table = format!("leases-{}-{nanos}", std::process::id());
    let o = common::tollgate(&["table", "create", "--table", &table, "--endpoint", &ep]);
    assert_eq!(common::code(&o), 0, "{}", common::stderr(&o));
    let store = format!("dynamodb:{table}");
    let args = ["--store", store.as_str(), "--endpoint", ep.as_str()];
    let a = ServerProc::start_args(&args, with_secret());
    let b = ServerProc::start_args(&args, with_secret());
    acquire_here_commit_there(&a, &b).await;
    a.stop();
    b.stop();
}
