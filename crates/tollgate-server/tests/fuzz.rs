//! An HTTP fuzz test over every route, on a real listener with authentication on.
//!
//! A seeded generator (8 workers × 800 requests, 3 % of them raw malformed ones, plus the
//! target's acquires) sends every route of the table with mutated methods, paths, tokens, queries and
//! bodies. Every answer must be below 500, carry a JSON body (except `GET /metrics` and
//! `HEAD`), and an error answer must carry a documented code with its documented status.
//! Interleaved, 320 acquires of one unit against a quota of 100 must admit exactly 100.
//! Afterwards the server must still answer a known scenario exactly.
//!
//! `TOLLGATE_FUZZ_SEED` replays a run; the seed is printed.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use common::{read_answer, Answer, Running};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tollgate::Limiter;
use tollgate_server::{routes, Auth, RouteInfo, Server, ServerConfig, TokenSet};
use tollgate_store::MemoryStore;

const ADMIN: &str = "fuzz-admin-token-0123456789";
const CLIENT: &str = "fuzz-client-token-0123456789";
const WORKERS: u64 = 8;
const PER_WORKER: usize = 800;
/// Acquires of the target per worker (one every [`TARGET_EVERY`] requests).
const TARGET_PER_WORKER: usize = 40;
const TARGET_EVERY: usize = 21;
const TARGET_ACQUIRES: usize = TARGET_PER_WORKER * WORKERS as usize;
const TARGET_QUOTA: i64 = 100;

/// A keep-alive connection that reconnects when the server closes it.
struct Conn {
    addr: std::net::SocketAddr,
    s: Option<TcpStream>,
    buf: Vec<u8>,
}

impl Conn {
    fn new(addr: std::net::SocketAddr) -> Self {
        Conn {
            addr,
            s: None,
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, req: &[u8], head: bool) -> Answer {
        for attempt in 0..2 {
            if self.s.is_none() {
                self.s = Some(TcpStream::connect(self.addr).await.unwrap());
                self.buf.clear();
            }
            let s = self.s.as_mut().unwrap();
            if s.write_all(req).await.is_ok() {
                if let Some(a) = read_answer(s, &mut self.buf, head).await {
                    if a.head
                        .to_ascii_lowercase()
                        .contains("\r\nconnection: close")
                    {
                        self.s = None;
                    }
                    return a;
                }
            }
            // The server closed a kept-alive connection between requests: resend once.
            self.s = None;
            assert_eq!(
                attempt,
                0,
                "no answer to {:?}",
                String::from_utf8_lossy(&req[..req.len().min(200)])
            );
        }
        unreachable!()
    }
}

fn request(method: &str, target: &str, token: Option<&str>, body: Option<&[u8]>) -> Vec<u8> {
    let mut r = format!("{method} {target} HTTP/1.1\r\nhost: fuzz\r\n");
    if let Some(t) = token {
        r.push_str(&format!("authorization: {t}\r\n"));
    }
    let body = body.unwrap_or(b"");
    if !body.is_empty() || method == "POST" || method == "PUT" {
        r.push_str(&format!(
            "content-length: {}\r\ncontent-type: application/json\r\n",
            body.len()
        ));
    }
    r.push_str("\r\n");
    let mut out = r.into_bytes();
    out.extend_from_slice(body);
    out
}

/// Percent-encode what is not an unreserved URI character (keeps `/`).
fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

struct Gen {
    rng: SmallRng,
    leases: Arc<Mutex<Vec<String>>>,
}

const NAMES: [&str; 6] = ["rpm", "tpm", "q", "rpd", "wcu", "x"];

impl Gen {
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.rng.gen_range(0..xs.len())]
    }

    fn chance(&mut self, p: f64) -> bool {
        self.rng.gen_bool(p)
    }

    /// An id or name: mostly valid, sometimes hostile; never the target's.
    fn ident(&mut self) -> String {
        let s = match self.rng.gen_range(0..16) {
            0 => String::new(),
            1 => "a b".into(),
            2 => "a#b".into(),
            3 => "x".repeat(self.rng.gen_range(200..400)),
            4 => "é\u{202e}ü".into(),
            5 => "../..".into(),
            6 => "drop;table".into(),
            7 => "%zz".into(),
            _ => format!("f{}", self.rng.gen_range(0..50)),
        };
        if s.contains("target") {
            "f0".into()
        } else {
            s
        }
    }

    fn resource(&mut self) -> String {
        match self.rng.gen_range(0..8) {
            0 => "openai/gpt-4".into(),
            1 => "gpt 4!".into(),
            2 => self.ident(),
            _ => "gpt-4".into(),
        }
    }

    fn amount(&mut self) -> Value {
        match self.rng.gen_range(0..14) {
            0 => json!(-1),
            1 => json!(1.5),
            2 => json!("1"),
            3 => json!(i64::MAX),
            4 => json!(u64::MAX),
            5 => json!(1e300),
            6 => json!(null),
            7 => json!(1_000_000_000_001_i64),
            _ => json!(self.rng.gen_range(0..20)),
        }
    }

    fn amounts(&mut self) -> Value {
        let mut m = serde_json::Map::new();
        for _ in 0..self.rng.gen_range(0..4) {
            let n = self.pick(&NAMES).to_string();
            let a = self.amount();
            m.insert(n, a);
        }
        Value::Object(m)
    }

    fn spec(&mut self) -> Value {
        let name = self.pick(&NAMES);
        let cap = match self.rng.gen_range(0..8) {
            0 => json!(-5),
            1 => json!(0),
            2 => json!(1e40),
            3 => json!(i64::MAX),
            _ => json!(self.rng.gen_range(1..1000)),
        };
        match self.rng.gen_range(0..9) {
            0 => json!({"name": name, "capacity": cap}),
            1 => {
                json!({"name": name, "capacity": cap, "reset_cron": self.pick(&["0 0 * * *", "0 25 * * *", "nonsense", "* * * * * * *", "0 0 31 2 *"]), "reset_tz": self.pick(&["UTC", "Europe/Berlin", "Mars/Base"])})
            }
            2 => {
                json!({"name": name, "capacity": cap, "reset_after_s": self.pick(&["x", "3600"]).parse::<i64>().unwrap_or(-1)})
            }
            3 => {
                json!({"name": name, "capacity": cap, "refill_amount": 5, "schedule": [self.pick(&["mon-fri 09:00-17:00 120/120", "sat 25:00-26:00 1", "garbage", "* 00:00-24:00 10"])], "schedule_tz": "UTC"})
            }
            4 => json!({"name": name, "capacity": cap, "refill_amount": 1, "reset_after_s": 5}),
            5 => {
                json!({"name": name, "capacity": cap, "refill_amount": 1, "refill_period_ms": self.pick(&["0", "-1", "1", "86400000"]).parse::<i64>().unwrap_or(0)})
            }
            6 => json!({"name": name, "capacity": cap, "refill_amount": 1, "bogus": true}),
            _ => {
                json!({"name": name, "capacity": cap, "refill_amount": self.rng.gen_range(1..1000)})
            }
        }
    }

    fn body_for(&mut self, r: &RouteInfo) -> Option<Value> {
        let v = match (r.method, r.path) {
            ("POST", "/v1/acquire") => {
                let mut b = json!({"entity": self.ident(), "resource": self.resource(), "amounts": self.amounts()});
                if self.chance(0.1) {
                    b["limits"] = json!([self.spec()]);
                }
                if self.chance(0.1) {
                    b["on_unavailable"] = json!(self.pick(&["allow", "block", "maybe"]));
                }
                if self.chance(0.5) {
                    b["commit"] = json!(self.chance(0.8));
                }
                b
            }
            ("POST", p) if p.ends_with("/adjust") => {
                json!({"limit": self.pick(&NAMES), "delta": self.amount()})
            }
            ("POST", "/v1/availability") => {
                json!({"entity": self.ident(), "resource": self.resource(), "amounts": self.amounts()})
            }
            ("POST", "/v1/entities") => {
                let mut b = json!({"id": self.ident()});
                if self.chance(0.3) {
                    b["parent_id"] = json!(self.ident());
                }
                if self.chance(0.3) {
                    b["name"] = json!(self.ident());
                }
                if self.chance(0.2) {
                    b["metadata"] = json!({"tier": "gold", "n": self.ident()});
                }
                b
            }
            ("PUT", _) => {
                let n = self.rng.gen_range(0..4);
                let limits: Vec<Value> = (0..n).map(|_| self.spec()).collect();
                let mut b = json!({ "limits": limits });
                if self.chance(0.1) {
                    b["on_unavailable"] = json!(self.pick(&["allow", "block", "maybe"]));
                }
                b
            }
            _ => return None,
        };
        Some(v)
    }

    /// A body, sometimes broken.
    fn mutate(&mut self, body: Option<Value>) -> Option<Vec<u8>> {
        let text = body.map(|v| v.to_string());
        match self.rng.gen_range(0..20) {
            0 => Some(b"{\"entity\": ".to_vec()),
            1 => Some(
                (0..self.rng.gen_range(1..64))
                    .map(|_| self.rng.gen::<u8>())
                    .collect(),
            ),
            2 => Some(b"{\"t\":1,\"t\":2}".to_vec()),
            3 => Some(format!("{}1{}", "[".repeat(300), "]".repeat(300)).into_bytes()),
            4 => Some(b"null".to_vec()),
            5 => Some(b"[1,2]".to_vec()),
            6 => text.map(|t| t.replacen('{', "{\"zz\":1,", 1).into_bytes()),
            7 => Some(format!("{{\"entity\":\"{}\"}}", "x".repeat(70_000)).into_bytes()),
            8 => text.map(|t| {
                // A duplicated key inside the document.
                t.replacen("\"entity\":", "\"entity\":\"dup\",\"entity\":", 1)
                    .into_bytes()
            }),
            _ => text.map(String::into_bytes),
        }
    }

    fn target(&mut self, r: &RouteInfo) -> String {
        let mut path = String::new();
        for seg in r.path.split('/').skip(1) {
            path.push('/');
            match seg {
                "{id}" => {
                    let known = self.leases.lock().unwrap().last().cloned();
                    match (r.path.starts_with("/v1/leases"), known) {
                        (true, Some(id)) if self.chance(0.6) => path.push_str(&id),
                        _ => path.push_str(&enc(&self.ident())),
                    }
                }
                "{entity}" => path.push_str(&enc(&self.ident())),
                "{*resource}" => {
                    let r = self.resource();
                    path.push_str(&enc(&r));
                }
                s => path.push_str(s),
            }
        }
        if self.chance(0.03) {
            path.push_str("%FF%FE");
        }
        if r.path == "/v1/availability" && r.method == "GET" {
            let mut q = Vec::new();
            if self.chance(0.9) {
                q.push(format!("entity={}", enc(&self.ident())));
            }
            if self.chance(0.9) {
                q.push(format!("resource={}", enc(&self.resource())));
            }
            if self.chance(0.5) {
                q.push(
                    self.pick(&[
                        "amounts=rpm:1,tpm:5",
                        "amounts=rpm:-1",
                        "amounts=rpm",
                        "amount=tpm:99999999999999999999",
                        "bogus=1",
                        "amounts=%ZZ",
                    ])
                    .to_string(),
                );
            }
            path.push('?');
            path.push_str(&q.join("&"));
        } else if self.chance(0.02) {
            path.push_str("?x=1");
        }
        path
    }

    fn token(&mut self) -> Option<String> {
        match self.rng.gen_range(0..20) {
            0 => None,
            1 => Some("Bearer not-a-token-we-know".into()),
            2 => Some("Basic YWxhZGRpbjpvcGVuc2VzYW1l".into()),
            3 => Some("Bearer".into()),
            4..=11 => Some(format!("Bearer {ADMIN}")),
            _ => Some(format!("Bearer {CLIENT}")),
        }
    }

    fn method(&mut self, r: &RouteInfo) -> String {
        match self.rng.gen_range(0..40) {
            0 => "FROB".into(),
            1 => format!("M{}", self.rng.gen_range(0..1000)),
            2 => self
                .pick(&["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
                .into(),
            3 if r.method == "GET" => "HEAD".into(),
            _ => r.method.into(),
        }
    }

    /// A request the HTTP parser must refuse.
    fn malformed(&mut self) -> Vec<u8> {
        match self.rng.gen_range(0..8) {
            0 => b"G@T / HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(),
            7 => format!(
                "GET /v1/entities/{} HTTP/1.1\r\nhost: x\r\n\r\n",
                "a".repeat(10_000)
            )
            .into_bytes(),
            1 => b"GET / HTTP/1.1\r\nbad header\r\n\r\n".to_vec(),
            2 => b"POST /v1/acquire HTTP/1.1\r\ncontent-length: -3\r\n\r\n".to_vec(),
            3 => format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(70_000)).into_bytes(),
            4 => format!("GET /livez HTTP/1.1\r\nx: {}\r\n\r\n", "v".repeat(20_000)).into_bytes(),
            5 => (0..self.rng.gen_range(8..200))
                .map(|_| self.rng.gen_range(1u8..=255))
                .chain(*b"\r\n\r\n")
                .collect(),
            _ => b"POST /v1/acquire HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n".to_vec(),
        }
    }
}

fn codes() -> BTreeMap<&'static str, u16> {
    tollgate_server::error::CODES
        .iter()
        .map(|(c, s, _)| (*c, *s))
        .collect()
}

/// The checks every answer must pass; returns the error code, if any.
fn check(what: &str, method: &str, route: &RouteInfo, a: &Answer) -> Option<String> {
    assert!(a.status < 500, "{what}: {} {}", a.status, a.text);
    assert!(
        a.head.to_ascii_lowercase().contains("\r\nx-request-id: "),
        "{what}: {}",
        a.head
    );
    let text_ok = method == "HEAD" || (route.path == "/metrics" && a.status == 200);
    if !text_ok {
        assert!(
            a.body.is_object(),
            "{what}: {} body is not a JSON object: {:?}",
            a.status,
            &a.text[..a.text.len().min(200)]
        );
    }
    if a.status >= 400 && method != "HEAD" {
        let code = a.body["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: no code in {}", a.text));
        let documented = codes();
        assert_eq!(
            documented.get(code),
            Some(&a.status),
            "{what}: code {code} with status {} is not the documented pair",
            a.status
        );
        assert!(a.body["message"].is_string(), "{what}: {}", a.text);
        return Some(code.to_string());
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzz_every_route() {
    let seed: u64 = std::env::var("TOLLGATE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("fuzz seed {seed} (replay with TOLLGATE_FUZZ_SEED={seed})");
    let started = Instant::now();
    let tokens = TokenSet::parse(
        &format!("ops:{ADMIN}:admin\ngw:{CLIENT}:client"),
        "fuzz",
        false,
    )
    .unwrap();
    let limiter = Limiter::new(Arc::new(MemoryStore::new())).unwrap();
    let server = Server::builder(limiter)
        .auth(Arc::new(Auth::from_tokens(tokens)))
        .config(ServerConfig::default())
        .build();
    let srv = Running::serve(server).await;
    let addr = srv.addr;

    // Setup: limits for the fuzzed resource, and the target's quota of 100.
    let mut c = Conn::new(addr);
    let admin = format!("Bearer {ADMIN}");
    let client = format!("Bearer {CLIENT}");
    let put = |path: &str, body: Value| {
        request("PUT", path, Some(&admin), Some(body.to_string().as_bytes()))
    };
    let a = c
        .send(
            &put(
                "/v1/limits/resources/gpt-4",
                json!({"limits": [
                    {"name": "rpm", "capacity": 1000, "refill_amount": 1000},
                    {"name": "tpm", "capacity": 100000, "refill_amount": 100000},
                    {"name": "q", "capacity": 50, "reset_after_s": 3600}
                ]}),
            ),
            false,
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.text);
    let a = c
        .send(
            &put(
                "/v1/limits/entities/target-1/resources/target-res",
                json!({"limits": [
                    {"name": "q", "capacity": TARGET_QUOTA, "reset_after_s": 3600}
                ]}),
            ),
            false,
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.text);

    let table = routes();
    let leases = Arc::new(Mutex::new(Vec::<String>::new()));
    let per_route: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let seen_codes: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let target_admitted = Arc::new(Mutex::new((0usize, 0usize)));
    let malformed = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let table = table.clone();
        let leases = leases.clone();
        let per_route = per_route.clone();
        let seen_codes = seen_codes.clone();
        let target_admitted = target_admitted.clone();
        let client = client.clone();
        let malformed = malformed.clone();
        workers.push(tokio::spawn(async move {
            let mut g = Gen {
                rng: SmallRng::seed_from_u64(seed.wrapping_add(w)),
                leases,
            };
            let mut conn = Conn::new(addr);
            let mut sent = 0usize;
            let mut fuzzed = 0usize;
            for i in 0..PER_WORKER + TARGET_PER_WORKER {
                // The target's acquires, interleaved.
                if i % TARGET_EVERY == 0 && sent < TARGET_PER_WORKER {
                    sent += 1;
                    let body = json!({"entity": "target-1", "resource": "target-res", "amounts": {"q": 1}, "commit": true});
                    let a = conn.send(&request("POST", "/v1/acquire", Some(&client), Some(body.to_string().as_bytes())), false).await;
                    let mut t = target_admitted.lock().unwrap();
                    match a.status {
                        200 => t.0 += 1,
                        429 => t.1 += 1,
                        s => panic!("target acquire: {s} {}", a.text),
                    }
                    continue;
                }
                fuzzed += 1;
                if g.chance(0.03) {
                    let bytes = g.malformed();
                    let mut raw = Conn::new(addr);
                    let a = raw.send(&bytes, false).await;
                    let code = check("malformed", "-", &table[0], &a);
                    assert!(a.status >= 400, "malformed got {}", a.status);
                    *seen_codes.lock().unwrap().entry(code.unwrap_or_default()).or_default() += 1;
                    malformed.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                // Every route in turn at first, then at random.
                let r = if fuzzed <= table.len() { table[fuzzed - 1] } else { table[g.rng.gen_range(0..table.len())] };
                let method = g.method(&r);
                let target = g.target(&r);
                let body = g.body_for(&r);
                let body = g.mutate(body);
                let token = g.token();
                let req = request(&method, &target, token.as_deref(), body.as_deref());
                let a = conn.send(&req, method == "HEAD").await;
                let what = format!("{method} {} [{}]", &target[..target.len().min(120)], token.as_deref().unwrap_or("no token"));
                let code = check(&what, &method, &r, &a);
                if r.path == "/v1/acquire" && a.status == 200 {
                    if let Some(id) = a.body["lease_id"].as_str() {
                        g.leases.lock().unwrap().push(id.to_string());
                    }
                }
                *per_route.lock().unwrap().entry(format!("{} {}", r.method, r.path)).or_default() += 1;
                *seen_codes.lock().unwrap().entry(code.unwrap_or_else(|| a.status.to_string())).or_default() += 1;
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    let (admitted, refused) = *target_admitted.lock().unwrap();
    let per_route = per_route.lock().unwrap().clone();
    let seen = seen_codes.lock().unwrap().clone();
    let malformed = malformed.load(Ordering::Relaxed);
    let total: usize = per_route.values().sum::<usize>() + admitted + refused + malformed;
    eprintln!(
        "{total} requests ({malformed} malformed, {} target acquires) in {:?}; answers by code: {seen:?}",
        admitted + refused,
        started.elapsed()
    );
    eprintln!("per route: {per_route:?}");
    assert!(total >= 5000, "{total}");
    assert_eq!(per_route.len(), table.len(), "every route was fuzzed");
    assert!(per_route.values().all(|&n| n >= 50), "{per_route:?}");
    assert_eq!(
        (admitted, refused),
        (100, TARGET_ACQUIRES - 100),
        "the quota of 100 admitted exactly 100"
    );

    // The server still answers correctly.
    let a = c
        .send(
            &request(
                "GET",
                "/v1/availability?entity=target-1&resource=target-res",
                Some(&client),
                None,
            ),
            false,
        )
        .await;
    assert_eq!(a.body["limits"][0]["available"], 0, "{}", a.text);
    assert_eq!(a.body["limits"][0]["capacity"], TARGET_QUOTA);
    let a = c
        .send(
            &put(
                "/v1/limits/resources/after",
                json!({"limits": [{"name": "rpm", "capacity": 3, "refill_amount": 3}]}),
            ),
            false,
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.text);
    let acq =
        json!({"entity": "after-1", "resource": "after", "amounts": {"rpm": 1}, "commit": true})
            .to_string();
    for i in 0..3 {
        let a = c
            .send(
                &request("POST", "/v1/acquire", Some(&client), Some(acq.as_bytes())),
                false,
            )
            .await;
        assert_eq!(a.status, 200, "acquire {i}: {}", a.text);
        assert_eq!(a.body["statuses"][0]["available"], 2 - i);
    }
    let a = c
        .send(
            &request("POST", "/v1/acquire", Some(&client), Some(acq.as_bytes())),
            false,
        )
        .await;
    assert_eq!(
        (a.status, a.body["error"].as_str()),
        (429, Some("rate_limit_exceeded")),
        "{}",
        a.text
    );
    assert!(
        a.head.to_ascii_lowercase().contains("\r\nretry-after: "),
        "{}",
        a.head
    );
    let a = c.send(&request("GET", "/healthz", None, None), false).await;
    assert_eq!(a.status, 200);
    srv.stop().await;
    eprintln!("fuzz done in {:?}", started.elapsed());
}
