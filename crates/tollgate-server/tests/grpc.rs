//! Envoy's rate limit service, driven with a tonic client built from the same protos
//! (envoy-types), on MemoryStore and on SQLite: descriptors admitted until OVER_LIMIT with
//! exact statuses and headers, usage reports reconciling a lease, all-or-none groups, bad
//! descriptors refused with a gRPC status, bearer tokens, and the on_unavailable policy.
//! (Through the real binary, and on DynamoDB Local: tollgate-cli's `tests/limits_file.rs`.)

use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::google::protobuf::UInt64Value;
use tollgate::{Limit, Limiter, ManualClock, OnUnavailable, Scope};
use tollgate_server::grpc::rls::rate_limit_response::{rate_limit::Unit, Code};
use tollgate_server::grpc::rls::rate_limit_service_client::RateLimitServiceClient;
use tollgate_server::grpc::rls::{RateLimitRequest, RateLimitResponse};
use tollgate_server::grpc::{Mapping, METHOD};
use tollgate_server::{Auth, Server, ServerConfig, TokenSet};
use tollgate_store::{FaultConfig, FaultyStore, MemoryStore, Store};

/// 2027-01-15T08:00:00Z: a whole minute.
const T0: i64 = 1_800_000_000_000;

const MAPPING: &str = r#"
[[envoy.descriptors]]
domain = "ai-gateway"
when = { kind = "requests" }
entity = { entry = "user_id" }
resource = { entry = "model" }
limit = "rpm"

[[envoy.descriptors]]
domain = "ai-gateway"
when = { kind = "tokens" }
entity = { entry = "user_id" }
resource = { entry = "model" }
limit = "tpm"
report_usage = true

[[envoy.descriptors]]
domain = "ai-gateway"
when = { kind = "bogus" }
entity = { entry = "user_id" }
resource = { entry = "model" }
limit = "nope"
"#;

type Client = RateLimitServiceClient<tonic::transport::Channel>;

struct Rig {
    client: Client,
    limiter: Limiter,
    clock: Arc<ManualClock>,
    server: Server,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Backend {
    Memory,
    Sqlite,
}

fn store_of(b: Backend) -> (Arc<dyn Store>, Option<tempfile::TempDir>) {
    match b {
        Backend::Memory => (Arc::new(MemoryStore::new()), None),
        Backend::Sqlite => {
            let dir = tempfile::tempdir().unwrap();
            let s = tollgate_sqlite::SqliteStore::open(dir.path().join("t.db")).unwrap();
            (Arc::new(s), Some(dir))
        }
    }
}

async fn rig_with(
    store: Arc<dyn Store>,
    dir: Option<tempfile::TempDir>,
    auth: Option<Arc<Auth>>,
    policy: Option<OnUnavailable>,
) -> Rig {
    let clock = Arc::new(ManualClock::new(T0));
    let mut b = Limiter::builder(store).clock(clock.clone());
    if let Some(p) = policy {
        b = b.on_unavailable(p);
    }
    let limiter = b.build().unwrap();
    let cfg = ServerConfig {
        lease_key: Some(
            tollgate::LeaseKey::from_bytes(b"a lease secret of at least 32 bytes!").unwrap(),
        ),
        ..Default::default()
    };
    let mut sb = Server::builder(limiter.clone()).config(cfg);
    if let Some(a) = auth {
        sb = sb.auth(a);
    }
    let server = sb.build();
    let file = tollgate::limits_file::parse("mapping.toml", MAPPING).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let s = server.clone();
    tokio::spawn(async move {
        s.serve_grpc(Mapping::new(file.envoy), listener, async move {
            let _ = rx.await;
        })
        .await
    });
    let client = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    Rig {
        client,
        limiter,
        clock,
        server,
        stop: Some(tx),
        _dir: dir,
    }
}

async fn rig(b: Backend) -> Rig {
    let (store, dir) = store_of(b);
    let r = rig_with(store, dir, None, None).await;
    r.limiter
        .admin()
        .set_limits(
            &Scope::Resource("gpt-4".into()),
            &[
                Limit::per_minute("rpm", 3).unwrap(),
                Limit::per_minute("tpm", 1000).unwrap(),
            ],
        )
        .await
        .unwrap();
    r.limiter
        .admin()
        .set_limits(
            &Scope::Resource("tiny".into()),
            &[Limit::per_minute("rpm", 1).unwrap()],
        )
        .await
        .unwrap();
    r
}

fn desc(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        hits_addend: hits.map(|value| UInt64Value { value }),
        ..Default::default()
    }
}

fn req(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "ai-gateway".into(),
        descriptors,
        hits_addend: 0,
    }
}

fn requests(model: &str) -> RateLimitDescriptor {
    desc(
        &[("kind", "requests"), ("user_id", "u1"), ("model", model)],
        None,
    )
}

fn header<'a>(r: &'a RateLimitResponse, k: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key == k)
        .map(|h| h.value.as_str())
}

fn secs(r: &RateLimitResponse, i: usize) -> (i64, i32) {
    let d = r.statuses[i].duration_until_reset.unwrap();
    (d.seconds, d.nanos)
}

async fn call(c: &mut Client, r: RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
    c.should_rate_limit(r).await.map(|r| r.into_inner())
}

async fn admitted_until_over_limit(b: Backend) {
    let mut r = rig(b).await;
    // rpm: 3 a minute. Each admitted request leaves one fewer and 20 s more to full.
    for (left, full_in) in [(2u32, 20i64), (1, 40), (0, 60)] {
        let a = call(&mut r.client, req(vec![requests("gpt-4")]))
            .await
            .unwrap();
        assert_eq!(a.overall_code, Code::Ok as i32, "{b:?}");
        let s = &a.statuses[0];
        assert_eq!(s.code, Code::Ok as i32);
        assert_eq!(s.limit_remaining, left, "{b:?}");
        let cl = s.current_limit.as_ref().unwrap();
        assert_eq!(
            (cl.name.as_str(), cl.requests_per_unit, cl.unit),
            ("rpm", 3, Unit::Minute as i32)
        );
        assert_eq!(secs(&a, 0), (full_in, 0), "{b:?}");
        assert_eq!(header(&a, "ratelimit-policy"), Some("\"rpm\";q=3;w=60"));
        assert_eq!(
            header(&a, "ratelimit"),
            Some(format!("\"rpm\";r={left};t={full_in}").as_str())
        );
        assert_eq!(header(&a, "retry-after"), None);
    }
    let over = call(&mut r.client, req(vec![requests("gpt-4")]))
        .await
        .unwrap();
    assert_eq!(over.overall_code, Code::OverLimit as i32, "{b:?}");
    assert_eq!(over.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(over.statuses[0].limit_remaining, 0);
    // One token drips back in 20 s.
    assert_eq!(secs(&over, 0), (20, 0));
    assert_eq!(header(&over, "retry-after"), Some("20"));
    assert_eq!(header(&over, "ratelimit"), Some("\"rpm\";r=0;t=20"));
    // 15.5 s later: 4.5 s to go.
    r.clock.advance(15_500);
    let over = call(&mut r.client, req(vec![requests("gpt-4")]))
        .await
        .unwrap();
    assert_eq!(over.overall_code, Code::OverLimit as i32);
    assert_eq!(secs(&over, 0), (4, 500_000_000));
    assert_eq!(header(&over, "retry-after"), Some("5"));
    r.clock.advance(4_500);
    let ok = call(&mut r.client, req(vec![requests("gpt-4")]))
        .await
        .unwrap();
    assert_eq!(ok.overall_code, Code::Ok as i32);
    assert_eq!(ok.statuses[0].limit_remaining, 0);
    // The calls are counted in the server's metrics under the gRPC method.
    let m = r.server.state().metrics.render().unwrap();
    assert!(m.contains(METHOD), "{m}");
}

async fn usage_report_reconciles_the_lease(b: Backend) {
    let mut r = rig(b).await;
    let tokens = |extra: &[(&str, &str)], hits| {
        let mut e = vec![("kind", "tokens"), ("user_id", "u1"), ("model", "gpt-4")];
        e.extend_from_slice(extra);
        desc(&e, Some(hits))
    };
    // Request phase: one request and an estimate of 100 tokens, one acquire.
    let a = call(
        &mut r.client,
        req(vec![requests("gpt-4"), tokens(&[], 100)]),
    )
    .await
    .unwrap();
    assert_eq!(a.overall_code, Code::Ok as i32);
    assert_eq!(a.statuses[0].limit_remaining, 2);
    assert_eq!(a.statuses[1].limit_remaining, 900, "{b:?}");
    assert_eq!(
        header(&a, "ratelimit"),
        Some("\"rpm\";r=2;t=20, \"tpm\";r=900;t=6")
    );
    let lease = a
        .request_headers_to_add
        .iter()
        .find(|h| h.key == "x-tollgate-lease")
        .map(|h| h.value.clone())
        .expect("the lease token for the gateway");
    assert!(lease.starts_with("v1."), "{lease}");
    // The response used 730 tokens: the report (at stream end) carries the real count.
    let rep = call(
        &mut r.client,
        req(vec![tokens(&[("tollgate_lease", &lease)], 730)]),
    )
    .await
    .unwrap();
    assert_eq!(rep.overall_code, Code::Ok as i32);
    let av = r
        .limiter
        .check_availability("u1", "gpt-4", tollgate::Amounts::new())
        .await
        .unwrap();
    let tpm = av.limits.iter().find(|l| l.limit == "tpm").unwrap();
    assert_eq!(tpm.available, 270, "{b:?}: 1000 - 730");
    // The next request phase sees it too.
    let next = call(&mut r.client, req(vec![tokens(&[], 0)]))
        .await
        .unwrap();
    assert_eq!(next.statuses[0].limit_remaining, 270);
    // A second report of the same lease is refused: it closed once.
    let again = call(
        &mut r.client,
        req(vec![tokens(&[("tollgate_lease", &lease)], 10)]),
    )
    .await
    .unwrap_err();
    assert_eq!(again.code(), tonic::Code::FailedPrecondition, "{again:?}");
    assert!(again.message().contains("lease_closed"), "{again:?}");
    // A report smaller than the estimate refunds.
    let a = call(&mut r.client, req(vec![tokens(&[], 200)]))
        .await
        .unwrap();
    assert_eq!(a.statuses[0].limit_remaining, 70);
    let lease = a.request_headers_to_add[0].value.clone();
    call(
        &mut r.client,
        req(vec![tokens(&[("tollgate_lease", &lease)], 50)]),
    )
    .await
    .unwrap();
    let av = r
        .limiter
        .check_availability("u1", "gpt-4", tollgate::Amounts::new())
        .await
        .unwrap();
    assert_eq!(
        av.limits
            .iter()
            .find(|l| l.limit == "tpm")
            .unwrap()
            .available,
        220
    );
    // An empty lease entry (the request phase held nothing) charges nothing.
    let none = call(
        &mut r.client,
        req(vec![tokens(&[("tollgate_lease", "")], 999)]),
    )
    .await
    .unwrap();
    assert_eq!(none.overall_code, Code::Ok as i32);
    let av = r
        .limiter
        .check_availability("u1", "gpt-4", tollgate::Amounts::new())
        .await
        .unwrap();
    assert_eq!(
        av.limits
            .iter()
            .find(|l| l.limit == "tpm")
            .unwrap()
            .available,
        220
    );
    // A forged token is refused.
    let bad = call(
        &mut r.client,
        req(vec![tokens(&[("tollgate_lease", "v1.abc.def")], 1)]),
    )
    .await
    .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument, "{bad:?}");
}

async fn several_pairs_all_or_none(b: Backend) {
    let mut r = rig(b).await;
    let both = || req(vec![requests("gpt-4"), requests("tiny")]);
    let a = call(&mut r.client, both()).await.unwrap();
    assert_eq!(a.overall_code, Code::Ok as i32);
    assert_eq!(
        (a.statuses[0].limit_remaining, a.statuses[1].limit_remaining),
        (2, 0)
    );
    // tiny is spent: gpt-4 is admitted first, then rolled back exactly.
    let o = call(&mut r.client, both()).await.unwrap();
    assert_eq!(o.overall_code, Code::OverLimit as i32, "{b:?}");
    assert_eq!(o.statuses[0].code, Code::Ok as i32);
    assert_eq!(
        o.statuses[0].limit_remaining, 2,
        "{b:?}: gpt-4's debit given back"
    );
    assert_eq!(o.statuses[1].code, Code::OverLimit as i32);
    assert_eq!(secs(&o, 1), (60, 0));
    assert_eq!(header(&o, "retry-after"), Some("60"));
    let av = r
        .limiter
        .check_availability("u1", "gpt-4", tollgate::Amounts::new())
        .await
        .unwrap();
    assert_eq!(av.limits[0].available, 2, "{b:?}");
    // Refused first: the later pair is not charged, its status read without a write.
    let o = call(
        &mut r.client,
        req(vec![requests("tiny"), requests("gpt-4")]),
    )
    .await
    .unwrap();
    assert_eq!(o.overall_code, Code::OverLimit as i32);
    assert_eq!(o.statuses[1].code, Code::Ok as i32);
    assert_eq!(o.statuses[1].limit_remaining, 2);
    let av = r
        .limiter
        .check_availability("u1", "gpt-4", tollgate::Amounts::new())
        .await
        .unwrap();
    assert_eq!(av.limits[0].available, 2);
}

async fn bad_descriptors_are_refused(b: Backend) {
    let mut r = rig(b).await;
    let expect = |res: Result<RateLimitResponse, tonic::Status>, code: tonic::Code, says: &str| {
        let e = res.unwrap_err();
        assert_eq!(e.code(), code, "{e:?}");
        assert!(
            e.message().contains(says),
            "{:?} should say {says:?}",
            e.message()
        );
    };
    let unmapped = req(vec![desc(&[("team", "x")], None)]);
    expect(
        call(&mut r.client, unmapped).await,
        tonic::Code::InvalidArgument,
        "matches no [[envoy.descriptors]] rule",
    );
    let mut empty_domain = req(vec![requests("gpt-4")]);
    empty_domain.domain.clear();
    expect(
        call(&mut r.client, empty_domain).await,
        tonic::Code::InvalidArgument,
        "domain is empty",
    );
    expect(
        call(&mut r.client, req(vec![])).await,
        tonic::Code::InvalidArgument,
        "no descriptors",
    );
    let mut negative = requests("gpt-4");
    negative.is_negative_hits = true;
    negative.hits_addend = Some(UInt64Value { value: 5 });
    expect(
        call(&mut r.client, req(vec![negative])).await,
        tonic::Code::InvalidArgument,
        "negative hits",
    );
    let huge = desc(
        &[("kind", "requests"), ("user_id", "u1"), ("model", "gpt-4")],
        Some(2_000_000_000_000),
    );
    expect(
        call(&mut r.client, req(vec![huge])).await,
        tonic::Code::InvalidArgument,
        "larger than 1000000000000",
    );
    let empty_value = desc(
        &[("kind", "requests"), ("user_id", ""), ("model", "gpt-4")],
        None,
    );
    expect(
        call(&mut r.client, req(vec![empty_value])).await,
        tonic::Code::InvalidArgument,
        "empty key or value",
    );
    let unknown_limit = desc(
        &[("kind", "bogus"), ("user_id", "u1"), ("model", "gpt-4")],
        None,
    );
    expect(
        call(&mut r.client, req(vec![unknown_limit])).await,
        tonic::Code::InvalidArgument,
        "unknown_limit",
    );
    let bad_entity = desc(
        &[("kind", "requests"), ("user_id", "a#b"), ("model", "gpt-4")],
        None,
    );
    expect(
        call(&mut r.client, req(vec![bad_entity])).await,
        tonic::Code::InvalidArgument,
        "invalid",
    );
    let no_limits = req(vec![requests("unknown-model")]);
    expect(
        call(&mut r.client, no_limits).await,
        tonic::Code::FailedPrecondition,
        "no_limits",
    );
    // Larger than the capacity: over the limit for good (no reset to wait for).
    let big = desc(
        &[("kind", "requests"), ("user_id", "u1"), ("model", "gpt-4")],
        Some(4),
    );
    let o = call(&mut r.client, req(vec![big])).await.unwrap();
    assert_eq!(o.overall_code, Code::OverLimit as i32);
    assert_eq!(o.statuses[0].duration_until_reset, None);
    // Nothing was charged by any of them, and the service still answers.
    let a = call(&mut r.client, req(vec![requests("gpt-4")]))
        .await
        .unwrap();
    assert_eq!(a.statuses[0].limit_remaining, 2, "{b:?}");
}

macro_rules! on_backends {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { super::$name(super::Backend::Memory).await }) *
        }
        mod sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { super::$name(super::Backend::Sqlite).await }) *
        }
    };
}

on_backends!(
    admitted_until_over_limit,
    usage_report_reconciles_the_lease,
    several_pairs_all_or_none,
    bad_descriptors_are_refused,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_tokens_in_metadata() {
    let tokens = TokenSet::parse(
        "gw:client-token-0123456789:client\nops:admin-token-0123456789:admin",
        "test",
        false,
    )
    .unwrap();
    let auth = Arc::new(Auth::from_tokens(tokens));
    let r = rig_with(Arc::new(MemoryStore::new()), None, Some(auth), None).await;
    r.limiter
        .admin()
        .set_limits(
            &Scope::Resource("gpt-4".into()),
            &[Limit::per_minute("rpm", 3).unwrap()],
        )
        .await
        .unwrap();
    let mut c = r.client.clone();
    let e = call(&mut c, req(vec![requests("gpt-4")]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    let with = |t: &str| {
        let mut rq = tonic::Request::new(req(vec![requests("gpt-4")]));
        rq.metadata_mut()
            .insert("authorization", t.parse().unwrap());
        rq
    };
    let e = c
        .should_rate_limit(with("Bearer not-a-known-token-xyz"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    assert!(e.message().contains("not known"), "{e:?}");
    let e = c.should_rate_limit(with("Basic abc")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    for t in [
        "Bearer client-token-0123456789",
        "Bearer admin-token-0123456789",
    ] {
        let ok = c.should_rate_limit(with(t)).await.unwrap().into_inner();
        assert_eq!(ok.overall_code, Code::Ok as i32);
    }
    assert_eq!(
        r.limiter
            .check_availability("u1", "gpt-4", tollgate::Amounts::new())
            .await
            .unwrap()
            .limits[0]
            .available,
        1
    );
}

/// A store that throttles every request: an outage once the retries are spent.
fn down() -> Arc<dyn Store> {
    let cfg = FaultConfig {
        throttle: 1.0,
        ..FaultConfig::none()
    };
    Arc::new(FaultyStore::new(MemoryStore::new(), 7, cfg))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_unavailable_allow_is_ok_and_degraded() {
    let r = rig_with(down(), None, None, Some(OnUnavailable::Allow)).await;
    let mut c = r.client.clone();
    let a = call(&mut c, req(vec![requests("gpt-4")])).await.unwrap();
    assert_eq!(a.overall_code, Code::Ok as i32);
    assert_eq!(
        header(&a, "x-tollgate-degraded"),
        Some("store unavailable; admitted by on_unavailable = allow")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_unavailable_block_is_grpc_unavailable() {
    let r = rig_with(down(), None, None, Some(OnUnavailable::Block)).await;
    let mut c = r.client.clone();
    let e = call(&mut c, req(vec![requests("gpt-4")]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().contains("store_unavailable"), "{e:?}");
}
