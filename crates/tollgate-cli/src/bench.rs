//! `tollgate bench-http`: a bounded load generator for `POST /v1/acquire` (loopback only).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use serde_json::json;

use crate::fail::Failure;

/// Arguments of `bench-http`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Server base URL (loopback addresses only).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Concurrent connections (each runs one request at a time).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Total acquires to send (the run stops at this count or --max-seconds).
    #[arg(long, default_value_t = 10_000)]
    requests: u64,
    /// Distinct entities the requests are spread over (bench-0 … bench-K-1).
    #[arg(long, default_value_t = 100)]
    entities: u64,
    /// Resource to acquire.
    #[arg(long, default_value = "bench")]
    resource: String,
    /// Hard stop after this many seconds.
    #[arg(long, default_value_t = 60)]
    max_seconds: u64,
    /// Do not set the resource's limits first (by default: `rps:rate=1000000000/s`, so every
    /// request is admitted and the run measures the admit path).
    #[arg(long)]
    no_setup: bool,
    /// Hold a lease per acquire on the server (default: `"commit": true`, no lease kept).
    #[arg(long)]
    hold_leases: bool,
    /// Bearer token for a server with authentication (an admin token, unless --no-setup).
    #[arg(long, env = "TOLLGATE_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

fn other(e: impl std::fmt::Display) -> Failure {
    Failure::Other(anyhow::anyhow!("{e}"))
}

fn check_loopback(url: &str) -> Result<reqwest::Url, Failure> {
    let u = reqwest::Url::parse(url).map_err(|e| Failure::BadInput(format!("{url:?}: {e}")))?;
    let host = u.host_str().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ok = host == "localhost"
        || host
            .parse::<IpAddr>()
            .map(|ip| ip.is_loopback())
            .unwrap_or(false);
    if !ok || u.scheme() != "http" {
        return Err(Failure::BadInput(format!(
            "bench-http only targets http:// on loopback addresses (127.0.0.0/8, ::1, localhost), not {url}"
        )));
    }
    Ok(u)
}

/// Run the benchmark.
pub async fn run(a: BenchArgs, json_out: bool) -> Result<(), Failure> {
    let base = check_loopback(&a.url)?;
    if a.concurrency == 0 || a.concurrency > 1024 || a.requests == 0 || a.entities == 0 {
        return Err(Failure::BadInput(
            "--concurrency must be 1..=1024, --requests and --entities at least 1".into(),
        ));
    }
    let base = base.as_str().trim_end_matches('/').to_string();
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(t) = &a.token {
        let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {t}"))
            .map_err(|_| Failure::BadInput("--token holds characters a header cannot".into()))?;
        v.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, v);
    }
    let http = reqwest::Client::builder()
        .default_headers(headers)
        .pool_max_idle_per_host(a.concurrency)
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(other)?;
    if !a.no_setup {
        let r = http
            .put(format!("{base}/v1/limits/resources/{}", a.resource))
            .json(
                &json!({ "limits": [{ "name": "rps", "capacity": 1_000_000_000i64,
                "refill_amount": 1_000_000_000i64, "refill_period_ms": 1000 }] }),
            )
            .send()
            .await
            .map_err(|e| Failure::Unavailable(format!("cannot reach {base}: {e}")))?;
        if !r.status().is_success() {
            let s = r.status();
            let t = r.text().await.unwrap_or_default();
            return Err(other(format!("setting the bench limits failed: {s} {t}")));
        }
    }
    let next = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(a.max_seconds);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(a.concurrency);
    for _ in 0..a.concurrency {
        let http = http.clone();
        let next = next.clone();
        let url = format!("{base}/v1/acquire");
        let a = a.clone();
        tasks.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let mut statuses: BTreeMap<String, u64> = BTreeMap::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= a.requests || Instant::now() >= deadline {
                    break;
                }
                let body = json!({
                    "entity": format!("bench-{}", i % a.entities),
                    "resource": a.resource,
                    "amounts": { "rps": 1 },
                    "commit": !a.hold_leases,
                });
                let t0 = Instant::now();
                let r = http.post(&url).json(&body).send().await;
                let key = match r {
                    Ok(r) => {
                        let s = r.status().as_u16();
                        // Read the body so the connection is reused.
                        let _ = r.bytes().await;
                        s.to_string()
                    }
                    Err(_) => "transport_error".to_string(),
                };
                let us = t0.elapsed().as_micros().clamp(1, 60_000_000) as u64;
                h.saturating_record(us);
                *statuses.entry(key).or_default() += 1;
            }
            Ok::<_, anyhow::Error>((h, statuses))
        }));
    }
    // Progress: requests started, redrawn every 100 ms (hidden off a terminal or with --json).
    let bar = crate::progress::bar(a.requests, "requests", !json_out);
    let ticker = {
        let (bar, next, total) = (bar.clone(), next.clone(), a.requests);
        tokio::spawn(async move {
            loop {
                bar.set_position(next.load(Ordering::Relaxed).min(total));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(other)?;
    let mut statuses: BTreeMap<String, u64> = BTreeMap::new();
    for t in tasks {
        let (h, s) = t.await.map_err(other)?.map_err(Failure::Other)?;
        hist.add(&h).map_err(other)?;
        for (k, v) in s {
            *statuses.entry(k).or_default() += v;
        }
    }
    ticker.abort();
    bar.finish_and_clear();
    let elapsed = started.elapsed().as_secs_f64();
    let n = hist.len();
    let rps = if elapsed > 0.0 {
        n as f64 / elapsed
    } else {
        0.0
    };
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    if json_out {
        crate::print_json(&json!({
            "url": base, "concurrency": a.concurrency, "entities": a.entities,
            "requests": n, "seconds": elapsed, "requests_per_second": rps,
            "latency_ms": { "p50": ms(0.5), "p90": ms(0.9), "p99": ms(0.99),
                            "p999": ms(0.999), "max": hist.max() as f64 / 1000.0 },
            "statuses": statuses,
        }));
    } else {
        println!(
            "bench-http {base}/v1/acquire: {n} requests, concurrency {}, {} entities, {:.2} s",
            a.concurrency, a.entities, elapsed
        );
        println!("  throughput  {rps:.0} requests/s");
        println!(
            "  latency     p50 {:.3} ms   p90 {:.3} ms   p99 {:.3} ms   p99.9 {:.3} ms   max {:.3} ms",
            ms(0.5),
            ms(0.9),
            ms(0.99),
            ms(0.999),
            hist.max() as f64 / 1000.0
        );
        let s: Vec<String> = statuses.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        println!("  statuses    {}", s.join(", "));
    }
    Ok(())
}
