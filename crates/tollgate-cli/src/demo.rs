//! `tollgate demo`: the main job, end to end, in one process.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tollgate::Limiter;

use crate::fail::Failure;

fn other(e: impl std::fmt::Display) -> Failure {
    Failure::Other(anyhow::anyhow!("{e}"))
}

fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_string()
}

/// Run the demo: a server on a loopback port over a temporary SQLite file, limits set over
/// HTTP, acquires until a `429`, a lease adjusted and committed, availability checked.
pub async fn run(json_out: bool) -> Result<(), Failure> {
    let dir = tempfile::tempdir().map_err(other)?;
    let path = dir.path().join("demo.db");
    let store = tollgate_sqlite::SqliteStore::open(&path)
        .map_err(|e| Failure::Unavailable(format!("cannot open {}: {e}", path.display())))?;
    let limiter = Limiter::new(Arc::new(store))?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(other)?;
    let addr = listener.local_addr().map_err(other)?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(tollgate_server::serve(limiter, listener, async move {
        let _ = stop_rx.await;
    }));
    let base = format!("http://{addr}");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(other)?;
    let mut log: Vec<Value> = Vec::new();
    let say = |s: String| {
        if !json_out {
            println!("{s}");
        }
    };
    say(format!(
        "tollgate demo: server on {base}, store sqlite:{}",
        path.display()
    ));

    // 1. Limits for the resource: 5 requests/min and 2000 tokens/min.
    let limits = json!({ "limits": [
        { "name": "rpm", "capacity": 5, "refill_amount": 5, "refill_period_ms": 60000 },
        { "name": "tpm", "capacity": 2000, "refill_amount": 2000, "refill_period_ms": 60000 }
    ]});
    let r = http
        .put(format!("{base}/v1/limits/resources/gpt-4"))
        .json(&limits)
        .send()
        .await
        .map_err(other)?;
    let status = r.status();
    let body: Value = r.json().await.map_err(other)?;
    if !status.is_success() {
        return Err(other(format!("setting limits failed: {status} {body}")));
    }
    say("PUT /v1/limits/resources/gpt-4  rpm:rate=5/min  tpm:rate=2000/min".into());
    log.push(json!({ "step": "set_limits", "status": status.as_u16(), "body": body }));

    // 2. Acquire until the server says 429.
    let mut first_lease: Option<String> = None;
    let mut rejected = None;
    for i in 1..=20 {
        let r = http
            .post(format!("{base}/v1/acquire"))
            .json(&json!({ "entity": "user-1", "resource": "gpt-4",
                           "amounts": { "rpm": 1, "tpm": 100 } }))
            .send()
            .await
            .map_err(other)?;
        let status = r.status();
        let rl = header(&r, "ratelimit");
        let retry_after = header(&r, "retry-after");
        let policy = header(&r, "ratelimit-policy");
        let body: Value = r.json().await.map_err(other)?;
        if status.as_u16() == 429 {
            say(format!("POST /v1/acquire #{i}: 429 Too Many Requests"));
            say(format!("    Retry-After: {retry_after}"));
            say(format!("    RateLimit-Policy: {policy}"));
            say(format!("    RateLimit: {rl}"));
            say(format!(
                "    {}",
                body["message"].as_str().unwrap_or_default()
            ));
            log.push(json!({ "step": "acquire", "n": i, "status": 429,
                "retry_after": retry_after, "ratelimit": rl, "ratelimit_policy": policy, "body": body }));
            rejected = Some(i);
            break;
        }
        if !status.is_success() {
            return Err(other(format!("acquire failed: {status} {body}")));
        }
        let id = body["lease_id"].as_str().unwrap_or_default().to_string();
        say(format!(
            "POST /v1/acquire #{i}: {status}  RateLimit: {rl}  lease {}",
            short(&id)
        ));
        log.push(json!({ "step": "acquire", "n": i, "status": status.as_u16(), "ratelimit": rl, "body": body }));
        if first_lease.is_none() {
            first_lease = Some(id);
        }
    }
    let Some(n) = rejected else {
        return Err(other("the demo never saw a 429"));
    };

    // 3. The first request really used 250 tokens, not 100: adjust and commit its lease
    // (each adjust answers the lease's next token: the one to pass on).
    if let Some(mut id) = first_lease {
        for (what, op, body) in [
            (
                "adjust tpm +150",
                "adjust",
                Some(json!({ "limit": "tpm", "delta": 150 })),
            ),
            ("commit", "commit", None),
        ] {
            let url = format!("{base}/v1/leases/{id}/{op}");
            let mut req = http.post(&url);
            if let Some(b) = &body {
                req = req.json(b);
            }
            let r = req.send().await.map_err(other)?;
            let status = r.status();
            let b: Value = r.json().await.map_err(other)?;
            if !status.is_success() {
                return Err(other(format!("{what} failed: {status} {b}")));
            }
            say(format!(
                "lease {}: {what} -> {status} consumed {}",
                short(&id),
                b["consumed"]
            ));
            if let Some(next) = b["lease_id"].as_str() {
                id = next.to_string();
            }
            log.push(json!({ "step": what, "status": status.as_u16(), "body": b }));
        }
    }

    // 4. What is left.
    let r = http
        .get(format!(
            "{base}/v1/availability?entity=user-1&resource=gpt-4&amounts=rpm:1"
        ))
        .send()
        .await
        .map_err(other)?;
    let status = r.status();
    let a: Value = r.json().await.map_err(other)?;
    if !status.is_success() {
        return Err(other(format!("availability failed: {status} {a}")));
    }
    if !json_out {
        println!("GET /v1/availability: allowed={}", a["allowed"]);
        for l in a["limits"].as_array().into_iter().flatten() {
            println!(
                "    {:<4} available {} / {}",
                l["limit"].as_str().unwrap_or_default(),
                l["available"],
                l["capacity"]
            );
        }
    }
    log.push(json!({ "step": "availability", "status": status.as_u16(), "body": a }));

    let _ = stop_tx.send(());
    match server.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(other(e)),
        Err(e) => return Err(other(e)),
    }
    if json_out {
        crate::print_json(
            &json!({ "ok": true, "admitted": n - 1, "rejected_at": n, "steps": log }),
        );
    } else {
        println!(
            "done: {} admitted, request #{n} rejected with 429; server stopped, temp store removed",
            n - 1
        );
    }
    Ok(())
}

/// A lease token, abbreviated for the terminal (tokens are a kilobyte or two): its version
/// tag and the end of its signature.
fn short(token: &str) -> String {
    match token.get(token.len().saturating_sub(12)..) {
        Some(tail) if token.len() > 24 => format!("v1.…{tail} ({} bytes)", token.len()),
        _ => token.to_string(),
    }
}
