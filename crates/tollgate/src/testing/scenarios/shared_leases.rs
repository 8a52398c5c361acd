//! Shared leases (`crate::lease_token`): a lease exported as a signed token is finished by a
//! second limiter over the same stored data — its own store client where the backend has
//! one (a second SQLite connection to the same file, a second DynamoDB client of the same
//! table) — exactly, and once.
#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tollgate_core::bucket::BucketImage;
use tollgate_core::keys;
use tollgate_core::value::{Item, Key, Value};
use tollgate_store::{
    Counting, DeleteRequest, PutRequest, Query, Store, StoreError, StoreStats, TransactOp,
    UpdateRequest,
};

use crate::testing::intercept::Intercept;
use crate::testing::*;
use crate::{
    Error, LeaseKey, Limit, Limiter, NewEntity, Options, Scope, CLOSURE_MARGIN_S, LATE_CLOSE_MS,
};

const E: &str = "e";
const R: &str = "api";
const TTL: Duration = Duration::from_secs(300);

fn key() -> LeaseKey {
    LeaseKey::from_bytes(&[7u8; 32]).unwrap()
}

fn q() -> Limit {
    Limit::quota_calendar("q", 1000, "0 0 * * *", "UTC").unwrap()
}

fn rpm() -> Limit {
    Limit::per_minute("rpm", 100).unwrap()
}

async fn limits(h: &H, e: &str, l: &[Limit]) {
    h.lim
        .admin()
        .set_limits(&Scope::Entity(e.into(), Some(R.into())), l)
        .await
        .unwrap();
}

/// The other process: its own client of the same data (where the backend has one), its
/// own caches, counted; the same clock.
pub struct Other {
    pub lim: Limiter,
    pub store: Arc<Counting<Arc<dyn TestStore>>>,
}

impl Other {
    pub fn stats(&self) -> StoreStats {
        self.store.stats()
    }
}

async fn twin_of(h: &H) -> Arc<dyn TestStore> {
    match h.raw.twin() {
        Some(f) => f.await,
        None => h.raw.clone(),
    }
}

fn build(h: &H, store: Arc<dyn Store>, o: Options) -> Limiter {
    Limiter::builder(store)
        .clock(h.clock.clone())
        .rng(h.rng.clone())
        .options(o)
        .build()
        .unwrap()
}

pub async fn other(h: &H) -> Other {
    let store = Arc::new(Counting::new(twin_of(h).await));
    Other {
        lim: build(h, store.clone(), opts()),
        store,
    }
}

fn tk(h: &H, e: &str, limit: &str) -> i64 {
    h.n(e, R, 0, &format!("b_{limit}_tk")).unwrap()
}

fn tc(h: &H, e: &str, limit: &str) -> i64 {
    h.n(e, R, 0, &format!("b_{limit}_tc")).unwrap()
}

fn record(h: &H, id: &str) -> Option<Item> {
    h.raw.raw_get(&keys::lease_closure("default", id))
}

/// The headline: acquired on A (one write, warm), adjusted +30 and committed on B: the
/// bucket shows both debits exactly; every later close, on either, is `LeaseClosed` and
/// writes nothing to the bucket.
pub async fn shared_lease_commits_on_a_second_limiter(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, E, &[q(), rpm()]).await;
    h.lim
        .acquire(E, R, &[("q", 1), ("rpm", 1)])
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    let o = other(&h).await;
    let before = h.stats();
    let mut a = h
        .lim
        .acquire(E, R, &[("q", 100), ("rpm", 1)])
        .await
        .unwrap();
    assert_eq!(
        h.stats().since(&before).writes(),
        1,
        "a warm acquire is one write"
    );
    let t0 = h.lim.lease_token(&mut a, &key(), TTL).unwrap();
    assert_eq!(
        h.stats().since(&before).total(),
        1,
        "exporting writes nothing"
    );
    assert_eq!(a.version(), 0);
    assert_eq!(a.expires_at_ms(), Some(T0 + 300_000));
    assert!(t0.starts_with("v1."));
    assert!(t0.len() < 4096, "a URL path segment: {} bytes", t0.len());

    let mut bl = o.lim.resume_lease(&t0, &key()).unwrap();
    assert_eq!(o.stats().total(), 0, "resuming reads nothing");
    assert_eq!(bl.token_id(), a.token_id());
    assert_eq!(bl.consumed()["q"], 100);
    bl.adjust("q", 30).unwrap();
    assert_eq!(bl.version(), 1);
    let t1 = o
        .lim
        .lease_token(&mut bl, &key(), Duration::from_secs(1))
        .unwrap();
    assert_ne!(t1, t0);
    let mut bl = o.lim.resume_lease(&t1, &key()).unwrap();
    assert_eq!(bl.version(), 1);
    assert_eq!(
        bl.expires_at_ms(),
        Some(T0 + 300_000),
        "the expiry is fixed at export"
    );
    assert_eq!(bl.consumed()["q"], 130);

    bl.commit().await.unwrap();
    let cost = o.stats();
    assert_eq!(
        (cost.puts, cost.updates, cost.writes()),
        (1, 1, 2),
        "the close record, then the adjustment"
    );
    assert_eq!(tk(&h, E, "q"), (1000 - 1 - 100 - 30) * 1000);
    assert_eq!(tc(&h, E, "q"), (1 + 100 + 30) * 1000);
    assert_eq!(tc(&h, E, "rpm"), 2000);
    let rec = record(&h, a.token_id().unwrap()).expect("closure record");
    assert_eq!(rec.get("closed_by"), Some(&Value::S("commit".into())));
    assert_eq!(
        rec.get("ttl"),
        Some(&Value::N((T0 + 300_000) / 1000 + 1 + CLOSURE_MARGIN_S))
    );

    // Replays: on B (its copy is closed: no request), on A's own copy, on fresh resumes.
    let s = o.stats();
    assert!(matches!(bl.commit().await, Err(Error::LeaseClosed)));
    assert_eq!(o.stats().since(&s).total(), 0);
    let s = h.stats();
    assert!(matches!(a.commit().await, Err(Error::LeaseClosed)));
    let d = h.stats().since(&s);
    assert_eq!(
        (d.puts, d.updates, d.transactions),
        (1, 0, 0),
        "refused by the record"
    );
    assert!(a.is_closed());
    assert!(matches!(a.rollback().await, Err(Error::LeaseClosed)));
    for (lim, t) in [(&h.lim, &t0), (&o.lim, &t1), (&o.lim, &t0)] {
        let mut l = lim.resume_lease(t, &key()).unwrap();
        assert!(matches!(l.rollback().await, Err(Error::LeaseClosed)));
        let mut l = lim.resume_lease(t, &key()).unwrap();
        assert!(matches!(l.commit().await, Err(Error::LeaseClosed)));
    }
    assert_eq!(tk(&h, E, "q"), (1000 - 131) * 1000);
    assert_eq!(tc(&h, E, "q"), 131_000);
    assert_eq!(tc(&h, E, "rpm"), 2000);
    // A lease never exported keeps today's cost: its commit writes nothing more.
    let mut l = h.lim.acquire(E, R, &[("q", 1)]).await.unwrap();
    let s = h.stats();
    l.commit().await.unwrap();
    assert_eq!(h.stats().since(&s).total(), 0);
}

/// A rollback through a token refunds exactly once (a dripping limit and a quota): the
/// copy that granted it and every resume then answer `LeaseClosed`.
pub async fn shared_rollback_refunds_once(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, E, &[q(), rpm()]).await;
    h.lim.acquire(E, R, &[("q", 1), ("rpm", 1)]).await.unwrap();
    let o = other(&h).await;
    let (q0, r0) = (tk(&h, E, "q"), tk(&h, E, "rpm"));
    let mut a = h
        .lim
        .acquire(E, R, &[("q", 200), ("rpm", 10)])
        .await
        .unwrap();
    assert_eq!(
        (tk(&h, E, "q"), tk(&h, E, "rpm")),
        (q0 - 200_000, r0 - 10_000)
    );
    let t = h.lim.lease_token(&mut a, &key(), TTL).unwrap();
    let mut bl = o.lim.resume_lease(&t, &key()).unwrap();
    bl.adjust("q", 50).unwrap();
    bl.rollback().await.unwrap();
    assert_eq!(
        (tk(&h, E, "q"), tk(&h, E, "rpm")),
        (q0, r0),
        "refunded exactly"
    );
    assert_eq!((tc(&h, E, "q"), tc(&h, E, "rpm")), (1000, 1000));
    assert!(matches!(a.rollback().await, Err(Error::LeaseClosed)));
    assert!(matches!(a.commit().await, Err(Error::LeaseClosed)));
    let mut again = h.lim.resume_lease(&t, &key()).unwrap();
    assert!(matches!(again.rollback().await, Err(Error::LeaseClosed)));
    assert_eq!(
        (tk(&h, E, "q"), tk(&h, E, "rpm")),
        (q0, r0),
        "refunded once"
    );
    let rec = record(&h, a.token_id().unwrap()).expect("closure record");
    assert_eq!(rec.get("closed_by"), Some(&Value::S("rollback".into())));
}

/// What a resumed lease writes is what the granting limiter would have written: two
/// entities, the same history, one closed locally, one through a token on the other
/// limiter — the bucket items agree on every limit attribute, `rf` and `vu`.
pub async fn resumed_leases_write_what_the_granting_limiter_would(b: &Backend) {
    type Close = (&'static str, i64);
    let cases: [Close; 4] = [
        ("commit", 30),
        ("commit", -40),
        ("commit", 0),
        ("rollback", 5),
    ];
    for (how, delta) in cases {
        let h = b.harness(T0).await;
        let o = other(&h).await;
        for e in ["local", "shared"] {
            limits(&h, e, &[q(), rpm()]).await;
            h.lim.acquire(e, R, &[("q", 1), ("rpm", 1)]).await.unwrap();
        }
        h.at(T0 + 1500);
        let mut local = h
            .lim
            .acquire("local", R, &[("q", 60), ("rpm", 3)])
            .await
            .unwrap();
        let mut shared = h
            .lim
            .acquire("shared", R, &[("q", 60), ("rpm", 3)])
            .await
            .unwrap();
        let t = h.lim.lease_token(&mut shared, &key(), TTL).unwrap();
        h.at(T0 + 4200);
        let mut shared = o.lim.resume_lease(&t, &key()).unwrap();
        for l in [&mut local, &mut shared] {
            l.adjust("q", delta).unwrap();
            l.adjust("rpm", delta.signum()).unwrap();
            match how {
                "commit" => l.commit().await.unwrap(),
                _ => l.rollback().await.unwrap(),
            }
        }
        let img = |e: &str| BucketImage::decode(&h.item(e, R, 0)).unwrap();
        let (l, s) = (img("local"), img("shared"));
        assert_eq!(
            (l.refilled_at_ms, l.valid_until_ms),
            (s.refilled_at_ms, s.valid_until_ms),
            "{how} {delta}"
        );
        assert_eq!(l.limits, s.limits, "{how} {delta}");
        assert_eq!(l.wcu, s.wcu, "{how} {delta}");
    }
}

async fn entity(h: &H, id: &str, parent: Option<&str>, cascade: bool) {
    h.lim
        .admin()
        .create_entity_with(
            id,
            NewEntity {
                name: None,
                parent_id: parent,
                cascade,
                metadata: BTreeMap::new(),
            },
        )
        .await
        .unwrap();
}

/// A cascade lease (child and parent, ADR-146) travels whole: adjusted and committed on
/// the other limiter, both buckets show the debit and the adjustment; a replay touches
/// neither.
pub async fn shared_cascade_lease_closes_both_once(b: &Backend) {
    let h = b.harness(T0).await;
    entity(&h, "org", None, false).await;
    entity(&h, "team", Some("org"), true).await;
    let tpd = [Limit::quota_calendar("tpd", 100, "0 0 * * *", "UTC").unwrap()];
    for e in ["team", "org"] {
        limits(&h, e, &tpd).await;
    }
    let o = other(&h).await;
    let mut a = h.lim.acquire("team", R, &[("tpd", 5)]).await.unwrap();
    assert_eq!(a.parent().map(|p| p.entity()), Some("org"));
    let t = h.lim.lease_token(&mut a, &key(), TTL).unwrap();
    let mut bl = o.lim.resume_lease(&t, &key()).unwrap();
    assert_eq!(bl.parent().map(|p| p.consumed()["tpd"]), Some(5));
    bl.adjust("tpd", 7).unwrap();
    bl.commit().await.unwrap();
    for e in ["team", "org"] {
        assert_eq!(h.tks(e, R, "tpd", 1), vec![88_000], "{e}");
    }
    assert!(matches!(a.rollback().await, Err(Error::LeaseClosed)));
    assert!(a.parent().is_some_and(|p| p.is_closed()));
    for e in ["team", "org"] {
        assert_eq!(h.tks(e, R, "tpd", 1), vec![88_000], "{e}");
        assert_eq!(h.n(e, R, 0, "b_tpd_tc"), Some(12_000), "{e}");
    }
}

/// A lease debited across several shards (larger than one share) rolls back through its
/// token on every shard, once.
pub async fn shared_lease_over_several_shards_rolls_back(b: &Backend) {
    let h = b.harness(T0).await;
    h.lim
        .admin()
        .set_limits(&Scope::Resource(R.into()), &[q()])
        .await
        .unwrap();
    h.lim.acquire(E, R, &[("q", 0)]).await.unwrap();
    assert_eq!(h.lim.admin().bump_shard_count(E, R, 1).await.unwrap(), 2);
    assert_eq!(h.lim.admin().bump_shard_count(E, R, 2).await.unwrap(), 4);
    for s in 1..4 {
        h.rng.pin(s);
        h.lim.acquire(E, R, &[("q", 0)]).await.unwrap();
    }
    h.rng.pin(2);
    let mut a = h.lim.acquire(E, R, &[("q", 300)]).await.unwrap();
    assert!(
        a.shards().len() > 1,
        "debited across shards: {:?}",
        a.shards()
    );
    assert_eq!(h.spendable(E, R, "q", 4), 700);
    let t = h.lim.lease_token(&mut a, &key(), TTL).unwrap();
    let o = other(&h).await;
    let mut bl = o.lim.resume_lease(&t, &key()).unwrap();
    assert_eq!(bl.shards(), a.shards());
    bl.rollback().await.unwrap();
    assert_eq!(h.spendable(E, R, "q", 4), 1000);
    assert!(matches!(a.rollback().await, Err(Error::LeaseClosed)));
    assert_eq!(h.spendable(E, R, "q", 4), 1000);
    assert_eq!(
        h.tks(E, R, "q", 4),
        vec![250_000, 250_000, 250_000, 250_000]
    );
}

/// Anything but a token this key signed, for this namespace, before its expiry, is a
/// typed error — and costs no store request.
pub async fn bad_lease_tokens_are_typed_errors(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, E, &[q()]).await;
    let o = other(&h).await;
    let mut a = h.lim.acquire(E, R, &[("q", 10)]).await.unwrap();
    let t = h
        .lim
        .lease_token(&mut a, &key(), Duration::from_secs(10))
        .unwrap();
    let invalid = |r: Result<crate::Lease, Error>, what: &str| match r {
        Err(Error::InvalidLease(m)) => m,
        Err(e) => panic!("{what}: expected InvalidLease, got {e}"),
        Ok(_) => panic!("{what}: accepted"),
    };
    // One payload character changed (to another base64url character).
    let mut bytes = t.clone().into_bytes();
    let i = 10;
    bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(bytes).unwrap();
    let m = invalid(o.lim.resume_lease(&tampered, &key()), "tampered");
    assert!(m.contains("signature"), "{m}");
    let other_key = LeaseKey::from_bytes(&[8u8; 32]).unwrap();
    let m = invalid(o.lim.resume_lease(&t, &other_key), "another key");
    assert!(m.contains("signature"), "{m}");
    let long = "v1.".to_string() + &"A".repeat(crate::MAX_TOKEN_BYTES);
    for (what, bad) in [
        ("truncated", &t[..t.len() - 5]),
        ("cut in the payload", &t[..t.len() / 2]),
        ("empty", ""),
        ("an old id", "f5eed268d22164766d8495aa98b39317"),
        ("two parts", "v1.abc"),
        ("empty parts", "v1.."),
        ("another version", &t.replacen("v1.", "v2.", 1)),
        ("not base64", "v1.!!!.???"),
        ("too long", long.as_str()),
        ("unicode", "v1.é.é"),
    ] {
        invalid(o.lim.resume_lease(bad, &key()), what);
    }
    // A limiter of another namespace over the same store.
    let foreign = build(
        &h,
        o.store.clone(),
        Options {
            namespace: "other".into(),
            ..opts()
        },
    );
    let m = invalid(foreign.resume_lease(&t, &key()), "another namespace");
    assert!(m.contains("namespace"), "{m}");
    assert_eq!(o.stats().total(), 0, "no store request for any of them");
    // Expired: refused at its expiry.
    h.at(T0 + 10_000);
    assert!(matches!(
        o.lim.resume_lease(&t, &key()),
        Err(Error::LeaseExpired)
    ));
    assert!(
        LeaseKey::from_bytes(&[1u8; 31]).is_err(),
        "a key is at least 32 bytes"
    );
}

/// A close whose record lands but whose writes fail is finished by the copy that holds the
/// record, once; every other copy is refused (nothing is written twice).
pub async fn a_close_that_fails_after_its_record(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, E, &[q()]).await;
    h.lim.acquire(E, R, &[("q", 1)]).await.unwrap();
    let mut a = h.lim.acquire(E, R, &[("q", 100)]).await.unwrap();
    let t = h.lim.lease_token(&mut a, &key(), TTL).unwrap();
    let fail = Arc::new(AtomicBool::new(true));
    let f = fail.clone();
    let flaky = Arc::new(Intercept::new(
        twin_of(&h).await,
        Box::new(move |_| {
            f.load(Ordering::SeqCst)
                .then(|| StoreError::Unavailable("injected".into()))
        }),
        Box::new(|_| None),
    ));
    let lim_b = build(&h, flaky, opts());
    let mut bl = lim_b.resume_lease(&t, &key()).unwrap();
    bl.adjust("q", 40).unwrap();
    assert!(matches!(bl.commit().await, Err(Error::Unavailable(_))));
    assert!(bl.is_closing() && !bl.is_closed());
    assert_eq!(
        tk(&h, E, "q"),
        (1000 - 101) * 1000,
        "the adjustment is not written yet"
    );
    assert!(matches!(a.commit().await, Err(Error::LeaseClosed)));
    let mut c = h.lim.resume_lease(&t, &key()).unwrap();
    c.adjust("q", 40).unwrap();
    assert!(matches!(c.commit().await, Err(Error::LeaseClosed)));
    fail.store(false, Ordering::SeqCst);
    bl.commit().await.unwrap();
    assert_eq!(
        tk(&h, E, "q"),
        (1000 - 141) * 1000,
        "written once, by the record's holder"
    );
    assert!(matches!(bl.commit().await, Err(Error::LeaseClosed)));
}

/// A store whose next put is applied but answered "outcome unknown".
struct LosesPutAnswer {
    inner: Arc<dyn TestStore>,
    armed: AtomicBool,
}

#[async_trait]
impl Store for LosesPutAnswer {
    async fn get(&self, k: &Key, c: bool) -> Result<Option<Item>, StoreError> {
        self.inner.get(k, c).await
    }
    async fn batch_get(&self, k: &[Key], c: bool) -> Result<Vec<Option<Item>>, StoreError> {
        self.inner.batch_get(k, c).await
    }
    async fn put(&self, r: PutRequest) -> Result<(), StoreError> {
        let lost = self.armed.swap(false, Ordering::SeqCst);
        self.inner.put(r).await?;
        if lost {
            return Err(StoreError::Ambiguous("answer lost".into()));
        }
        Ok(())
    }
    async fn update(&self, r: UpdateRequest) -> Result<Option<Item>, StoreError> {
        self.inner.update(r).await
    }
    async fn delete(&self, r: DeleteRequest) -> Result<Option<Item>, StoreError> {
        self.inner.delete(r).await
    }
    async fn transact_write(
        &self,
        o: Vec<TransactOp>,
        t: Option<String>,
    ) -> Result<(), StoreError> {
        self.inner.transact_write(o, t).await
    }
    async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError> {
        self.inner.query(q).await
    }
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
}

/// A record put whose answer is lost is resent with the same nonce: the copy recognises its
/// own record and finishes; another copy is refused.
pub async fn an_ambiguous_record_is_recognised_as_its_own(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, E, &[q()]).await;
    h.lim.acquire(E, R, &[("q", 1)]).await.unwrap();
    let mut a = h.lim.acquire(E, R, &[("q", 100)]).await.unwrap();
    let t = h.lim.lease_token(&mut a, &key(), TTL).unwrap();
    let lossy = Arc::new(LosesPutAnswer {
        inner: twin_of(&h).await,
        armed: AtomicBool::new(true),
    });
    let lim_b = build(&h, lossy, opts());
    let mut bl = lim_b.resume_lease(&t, &key()).unwrap();
    bl.adjust("q", -30).unwrap();
    assert!(matches!(
        bl.rollback().await,
        Err(Error::Unavailable(StoreError::Ambiguous(_)))
    ));
    assert!(bl.is_closing());
    assert_eq!(tk(&h, E, "q"), (1000 - 101) * 1000);
    bl.rollback().await.unwrap();
    assert_eq!(tk(&h, E, "q"), (1000 - 1) * 1000, "refunded once");
    assert!(matches!(a.rollback().await, Err(Error::LeaseClosed)));
    assert_eq!(tk(&h, E, "q"), (1000 - 1) * 1000);
}

/// A shared lease may be closed until `LATE_CLOSE_MS` after its expiry (the expiry rule's
/// commit); later nothing is written and the copy is closed.
pub async fn late_closes_of_shared_leases(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, E, &[q()]).await;
    h.lim.acquire(E, R, &[("q", 1)]).await.unwrap();
    let ttl = Duration::from_secs(10);
    let mut on_time = h.lim.acquire(E, R, &[("q", 10)]).await.unwrap();
    h.lim.lease_token(&mut on_time, &key(), ttl).unwrap();
    let mut late = h.lim.acquire(E, R, &[("q", 20)]).await.unwrap();
    h.lim.lease_token(&mut late, &key(), ttl).unwrap();
    on_time.adjust("q", 5).unwrap();
    late.adjust("q", 5).unwrap();
    h.at(T0 + 10_000 + LATE_CLOSE_MS);
    on_time.commit().await.unwrap();
    assert_eq!(tk(&h, E, "q"), (1000 - 1 - 15 - 20) * 1000);
    h.at(T0 + 10_000 + LATE_CLOSE_MS + 1);
    let s = h.stats();
    assert!(matches!(late.commit().await, Err(Error::LeaseExpired)));
    assert_eq!(h.stats().since(&s).total(), 0, "nothing written");
    assert!(late.is_closed());
    assert_eq!(tk(&h, E, "q"), (1000 - 36) * 1000, "the debit stands");
}

/// Closure records: DynamoDB's TTL deletes them; elsewhere the limiter that wrote one
/// deletes it once its `ttl` has passed (one delete each).
pub async fn closure_records_are_purged_after_their_ttl(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, E, &[q()]).await;
    let o = other(&h).await;
    let mut a = h.lim.acquire(E, R, &[("q", 10)]).await.unwrap();
    let t = h.lim.lease_token(&mut a, &key(), TTL).unwrap();
    let id = a.token_id().unwrap().to_string();
    o.lim
        .resume_lease(&t, &key())
        .unwrap()
        .commit()
        .await
        .unwrap();
    let ttl_s = (T0 + 300_000) / 1000 + 1 + CLOSURE_MARGIN_S;
    assert_eq!(
        record(&h, &id).and_then(|r| r.get("ttl").cloned()),
        Some(Value::N(ttl_s))
    );
    let native = h.raw.backend() == "dynamodb";
    assert_eq!(o.lim.lease_closures_pending(), usize::from(!native));
    assert_eq!(
        h.lim.lease_closures_pending(),
        0,
        "only the writer remembers it"
    );
    h.at(ttl_s * 1000 - 1);
    assert_eq!(
        o.lim.admin().purge_lease_closures().await.unwrap(),
        0,
        "not due yet"
    );
    assert!(record(&h, &id).is_some());
    h.at(ttl_s * 1000);
    let s = o.stats();
    let n = o.lim.admin().purge_lease_closures().await.unwrap();
    assert_eq!(n, usize::from(!native));
    assert_eq!(o.stats().since(&s).deletes, u64::from(!native));
    assert_eq!(record(&h, &id).is_none(), !native);
    assert_eq!(o.lim.lease_closures_pending(), 0);
}

/// The same on an entity spread over two shards: the resuming limiter plans with the shard
/// count the token carries (refunds of a dripping limit keep or pull in the trust horizon
/// of the shard's share, usage beyond the shard is taken from its sibling).
pub async fn resumed_sharded_leases_write_what_the_granting_limiter_would(b: &Backend) {
    type Close = (&'static str, i64, i64);
    let cases: [Close; 5] = [
        ("commit", 40, -40),
        ("commit", 10, -5),
        ("commit", 30, 45),
        ("rollback", 40, 0),
        ("rollback", 5, 3),
    ];
    for (how, debit, delta) in cases {
        let h = b.harness(T0).await;
        let o = other(&h).await;
        for e in ["local", "shared"] {
            limits(&h, e, &[rpm()]).await;
            h.rng.pin(0);
            h.lim.acquire(e, R, &[("rpm", 0)]).await.unwrap();
            assert_eq!(h.lim.admin().bump_shard_count(e, R, 1).await.unwrap(), 2);
            h.rng.pin(1);
            h.lim.acquire(e, R, &[("rpm", 0)]).await.unwrap();
        }
        h.rng.pin(0);
        h.at(T0 + 700);
        let mut local = h.lim.acquire("local", R, &[("rpm", debit)]).await.unwrap();
        let mut shared = h.lim.acquire("shared", R, &[("rpm", debit)]).await.unwrap();
        assert_eq!(local.shards(), shared.shards());
        let t = h.lim.lease_token(&mut shared, &key(), TTL).unwrap();
        h.at(T0 + 1900);
        let mut shared = o.lim.resume_lease(&t, &key()).unwrap();
        for l in [&mut local, &mut shared] {
            l.adjust("rpm", delta).unwrap();
            match how {
                "commit" => l.commit().await.unwrap(),
                _ => l.rollback().await.unwrap(),
            }
        }
        for s in 0..2 {
            let img = |e: &str| BucketImage::decode(&h.item(e, R, s)).unwrap();
            let (l, sh) = (img("local"), img("shared"));
            assert_eq!(
                (l.refilled_at_ms, l.valid_until_ms),
                (sh.refilled_at_ms, sh.valid_until_ms),
                "{how} {debit} {delta} shard {s}"
            );
            assert_eq!(l.limits, sh.limits, "{how} {debit} {delta} shard {s}");
        }
    }
}

/// A resumed lease's refund to a shard in debt repays the entity from the bottom up, as
/// the granting limiter's would (the resuming limiter knows the entity is sharded from the
/// token alone).
pub async fn resumed_refund_to_a_shard_in_debt_repays_the_entity(b: &Backend) {
    let h = b.harness(T0).await;
    let o = other(&h).await;
    let mut tokens = Vec::new();
    for e in ["local", "shared"] {
        limits(&h, e, &[rpm()]).await;
        h.rng.pin(0);
        h.lim.acquire(e, R, &[("rpm", 0)]).await.unwrap();
        assert_eq!(h.lim.admin().bump_shard_count(e, R, 1).await.unwrap(), 2);
        h.rng.pin(1);
        h.lim.acquire(e, R, &[("rpm", 0)]).await.unwrap();
        h.rng.pin(0);
        let mut x = h.lim.acquire(e, R, &[("rpm", 30)]).await.unwrap();
        // Another lease reports 90 more than the entity has left: debt on both shards.
        let mut y = h.lim.acquire(e, R, &[("rpm", 0)]).await.unwrap();
        y.adjust("rpm", 90).unwrap();
        y.commit().await.unwrap();
        assert!(
            h.tks(e, R, "rpm", 2).iter().all(|tk| *tk < 0),
            "{:?}",
            h.tks(e, R, "rpm", 2)
        );
        tokens.push(h.lim.lease_token(&mut x, &key(), TTL).unwrap());
        if e == "local" {
            x.rollback().await.unwrap();
        } else {
            o.lim
                .resume_lease(&tokens[1], &key())
                .unwrap()
                .rollback()
                .await
                .unwrap();
        }
    }
    // −10 on each shard, 30 refunded: both repaid first, the rest levelled.
    assert_eq!(h.tks("local", R, "rpm", 2), vec![5000, 5000]);
    assert_eq!(h.tks("shared", R, "rpm", 2), vec![5000, 5000]);
}
