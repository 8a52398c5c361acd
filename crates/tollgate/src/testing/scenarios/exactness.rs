//! Exact admission for every limit kind (docs/rules.md: "Exact admission"): the repros of
//! the idle burst, over-refunds, requests larger than one shard's share, lease debt, debt on
//! one shard, refusals that would have fit and doublings that mint — each with the honest
//! answer, on every backend.
#![allow(missing_docs)]

use std::time::Duration;

use crate::testing::*;
use crate::{Error, Limit, Scope};

const E: &str = "e";
const R: &str = "r";

async fn resource_limits(h: &H, l: &[Limit]) {
    h.lim
        .admin()
        .set_limits(&Scope::Resource(R.into()), l)
        .await
        .unwrap();
}

/// The repro's bucket: capacity 10, 10 per 6 s.
fn t10() -> Limit {
    Limit::rate("t", 10, 10, Duration::from_secs(6)).unwrap()
}

fn refused(r: Result<crate::Lease, Error>) -> Box<crate::Exceeded> {
    match r {
        Err(Error::RateLimitExceeded(x)) => x,
        Err(e) => panic!("expected a rejection, got {e}"),
        Ok(l) => panic!("expected a rejection, got {l:?}"),
    }
}

/// Spend `n` acquires of 1 `t` at 10 ms intervals from `t0`; how many were admitted.
async fn burst(h: &H, lim: &crate::Limiter, t0: i64, n: i64) -> i64 {
    let mut ok = 0;
    for i in 0..n {
        h.at(t0 + i * 10);
        if let Ok(mut l) = lim.acquire(E, R, &[("t", 1)]).await {
            l.commit().await.unwrap();
            ok += 1;
        }
    }
    ok
}

/// The idle burst: a bucket of 10 used once and left idle for 7 s (it refilled to 10) then
/// hit 30 times in 0.3 s admits 10 — capacity plus the 0.5 token dripped in meanwhile —
/// on the warm fast path and on the slow path alike. Before the trust horizon the warm
/// client admitted 19. A busy bucket is still one write and no read per acquire; a bucket
/// past its horizon costs one write planned from the last image.
pub async fn idle_burst_admits_capacity_plus_refill(b: &Backend) {
    for fast in [true, false] {
        let h = b.harness(T0).await;
        resource_limits(&h, &[t10()]).await;
        let lim = if fast { h.lim.clone() } else { h.slow() };
        let mut l = lim.acquire(E, R, &[("t", 1)]).await.unwrap();
        l.commit().await.unwrap();
        let s = h.stats();
        let ok = burst(&h, &lim, T0 + 7000, 30).await;
        assert_eq!(
            ok, 10,
            "fast path {fast}: capacity 10 + 0.5 dripped in over 0.3 s"
        );
        if fast {
            let d = h.stats().since(&s);
            // The first acquire of the burst is past the horizon: one write planned from the
            // last image; the nine that follow are inside it: one write each; the first
            // refusal is one failed write, the 19 after it are decided from the cache.
            assert_eq!((d.updates, d.gets, d.batch_gets), (11, 0, 0), "{d:?}");
        }
    }
}

/// The quick start's availability: the second acquire of 500 tokens reports 99,000 left,
/// not a refilled 100,000.
pub async fn statuses_report_the_balance_after_the_debit(b: &Backend) {
    let h = b.harness(T0).await;
    resource_limits(
        &h,
        &[
            Limit::per_minute("rpm", 2).unwrap(),
            Limit::per_minute("tpm", 100_000).unwrap(),
        ],
    )
    .await;
    let a = h
        .lim
        .acquire(E, R, &[("rpm", 1), ("tpm", 500)])
        .await
        .unwrap();
    let tpm = |l: &crate::Lease| {
        l.statuses()
            .iter()
            .find(|s| s.limit == "tpm")
            .map(|s| s.available)
            .unwrap()
    };
    assert_eq!(tpm(&a), 99_500);
    h.at(T0 + 5);
    let b2 = h
        .lim
        .acquire(E, R, &[("rpm", 1), ("tpm", 500)])
        .await
        .unwrap();
    // 5 ms at 100,000/min drips 8 tokens.
    assert_eq!(tpm(&b2), 99_008);
}

/// A negative adjustment beyond what the lease took is refused (it would hand out tokens of
/// earlier leases): q=60 committed, then a lease of 1 asking −61 is refused, and a daily
/// quota of 100 then admits exactly the 39 left.
pub async fn over_refund_is_refused(b: &Backend) {
    let h = b.harness(T0).await;
    resource_limits(
        &h,
        &[Limit::quota_calendar("q", 100, "0 0 * * *", "UTC").unwrap()],
    )
    .await;
    let mut a = h.lim.acquire(E, R, &[("q", 60)]).await.unwrap();
    a.commit().await.unwrap();
    let mut l = h.lim.acquire(E, R, &[("q", 1)]).await.unwrap();
    match l.adjust("q", -61) {
        Err(Error::InvalidAdjustment {
            delta: -61,
            consumed: 1,
            ..
        }) => {}
        r => panic!("expected InvalidAdjustment, got {r:?}"),
    }
    l.commit().await.unwrap();
    assert_eq!(l.consumed()["q"], 1);
    let mut more = 0;
    for _ in 0..100 {
        if h.lim.acquire(E, R, &[("q", 1)]).await.is_ok() {
            more += 1;
        }
    }
    assert_eq!(more, 39);
    // The same for a rate limit: a drained bucket of 10 with a 0-token lease adjusted −10.
    let h = b.harness(T0).await;
    resource_limits(&h, &[t10()]).await;
    h.lim.acquire(E, R, &[("t", 10)]).await.unwrap();
    let mut z = h.lim.acquire(E, R, &[("t", 0)]).await.unwrap();
    assert!(matches!(
        z.adjust("t", -1),
        Err(Error::InvalidAdjustment { .. })
    ));
    assert!(matches!(
        z.adjust("t", -10),
        Err(Error::InvalidAdjustment { .. })
    ));
    z.commit().await.unwrap();
    refused(h.lim.acquire(E, R, &[("t", 1)]).await);
}

/// Four shards of a 1,000 quota with 250 on each: a request for 300 is admitted across two
/// shards in one transaction (on the fast and the slow path), and one for 1,001 is refused
/// with no retry-after (it can never fit); statuses speak of the entity.
pub async fn a_request_larger_than_one_share_is_admitted(b: &Backend) {
    for fast in [true, false] {
        let h = b.harness(T0).await;
        resource_limits(
            &h,
            &[Limit::quota_calendar("q", 1000, "0 0 * * *", "UTC").unwrap()],
        )
        .await;
        h.lim.acquire(E, R, &[("q", 0)]).await.unwrap();
        assert_eq!(h.lim.admin().bump_shard_count(E, R, 1).await.unwrap(), 2);
        assert_eq!(h.lim.admin().bump_shard_count(E, R, 2).await.unwrap(), 4);
        for s in 1..4 {
            h.rng.pin(s);
            h.lim.acquire(E, R, &[("q", 0)]).await.unwrap();
        }
        assert_eq!(
            h.tks(E, R, "q", 4),
            vec![250_000, 250_000, 250_000, 250_000]
        );
        let lim = if fast { h.lim.clone() } else { h.slow() };
        h.rng.pin(2);
        let l = lim.acquire(E, R, &[("q", 300)]).await.unwrap();
        assert_eq!(l.consumed()["q"], 300);
        assert_eq!(h.spendable(E, R, "q", 4), 700);
        let x = refused(lim.acquire(E, R, &[("q", 1001)]).await);
        let st = &x.statuses[0];
        assert_eq!((st.capacity, st.available, st.exceeded), (1000, 700, true));
        assert_eq!(x.retry_after_ms, None, "1,001 can never fit");
        let x = refused(lim.acquire(E, R, &[("q", 701)]).await);
        assert!(x.retry_after_ms.is_some(), "701 fits after the reset");
        let a = lim.check_availability(E, R, &[("q", 700)]).await.unwrap();
        assert!(a.allowed);
        lim.acquire(E, R, &[("q", 700)]).await.unwrap();
        assert_eq!(h.spendable(E, R, "q", 4), 0);
    }
}

/// Lease debt is charged when it is reported, after the refill up to then: capacity 10,
/// 1 taken at T0, 7 s idle (full again), a 0-token lease adjusted +5 and committed leaves
/// 5, so an acquire of 10 is refused by a warm client as by a slow one.
pub async fn lease_debt_is_not_absorbed_by_refill(b: &Backend) {
    for fast in [true, false] {
        let h = b.harness(T0).await;
        resource_limits(&h, &[t10()]).await;
        let lim = if fast { h.lim.clone() } else { h.slow() };
        lim.acquire(E, R, &[("t", 1)]).await.unwrap();
        h.at(T0 + 7000);
        let mut l = lim.acquire(E, R, &[("t", 0)]).await.unwrap();
        l.adjust("t", 5).unwrap();
        l.commit().await.unwrap();
        let x = refused(lim.acquire(E, R, &[("t", 10)]).await);
        assert_eq!(x.statuses[0].available, 5, "fast path {fast}");
        lim.acquire(E, R, &[("t", 5)]).await.unwrap();
    }
}

/// Two shards of a 10-token bucket (5 and 5, split on the doubling). A lease on shard 0
/// reports 10 more tokens: its shard pays 5, shard 1 the other 5 (debt belongs to the
/// entity), so shard 1 then admits nothing while the entity is at 0.
pub async fn debt_on_one_shard_holds_back_its_siblings(b: &Backend) {
    let h = b.harness(T0).await;
    resource_limits(&h, &[Limit::per_hour("t", 10).unwrap()]).await;
    h.lim.acquire(E, R, &[("t", 0)]).await.unwrap();
    assert_eq!(h.lim.admin().bump_shard_count(E, R, 1).await.unwrap(), 2);
    h.rng.pin(1);
    h.lim.acquire(E, R, &[("t", 0)]).await.unwrap();
    assert_eq!(h.tks(E, R, "t", 2), vec![5000, 5000]);
    h.rng.pin(0);
    let mut l = h.lim.acquire(E, R, &[("t", 0)]).await.unwrap();
    l.adjust("t", 10).unwrap();
    l.commit().await.unwrap();
    assert_eq!(h.tks(E, R, "t", 2), vec![0, 0]);
    assert_eq!(l.consumed()["t"], 10);
    h.rng.pin(1);
    let x = refused(h.lim.acquire(E, R, &[("t", 1)]).await);
    assert_eq!(x.statuses[0].available, 0);
    // 11 reported on a drained entity: the debt is levelled over both shards.
    let mut l = h.lim.acquire(E, R, &[("t", 0)]).await.unwrap();
    l.adjust("t", 4).unwrap();
    l.commit().await.unwrap();
    assert_eq!(h.tks(E, R, "t", 2), vec![-2000, -2000]);
    let a = h.lim.check_availability(E, R, &[("t", 1)]).await.unwrap();
    assert_eq!((a.limits[0].available, a.allowed), (-4, false));
}

/// A refusal that would have fit: 10 tokens on 4 shards (2.5 each), 8 taken (2 per shard),
/// then a legitimate refund of 1 on shard 0. A request for 1 aimed at shard 1 (0.5 left) is
/// admitted — the entity has 3 — and the statuses of a refusal agree with availability.
pub async fn a_refusal_never_says_it_would_fit(b: &Backend) {
    let h = b.harness(T0).await;
    resource_limits(&h, &[Limit::per_hour("t", 10).unwrap()]).await;
    h.lim.acquire(E, R, &[("t", 0)]).await.unwrap();
    assert_eq!(h.lim.admin().bump_shard_count(E, R, 1).await.unwrap(), 2);
    assert_eq!(h.lim.admin().bump_shard_count(E, R, 2).await.unwrap(), 4);
    for s in 1..4 {
        h.rng.pin(s);
        h.lim.acquire(E, R, &[("t", 0)]).await.unwrap();
    }
    let mut refund = None;
    for s in 0..4 {
        h.rng.pin(s);
        let l = h.lim.acquire(E, R, &[("t", 2)]).await.unwrap();
        if s == 0 {
            refund = Some(l);
        }
    }
    assert_eq!(h.tks(E, R, "t", 4), vec![500, 500, 500, 500]);
    let mut r = refund.unwrap();
    r.adjust("t", -1).unwrap();
    r.commit().await.unwrap();
    assert_eq!(h.tks(E, R, "t", 4), vec![1500, 500, 500, 500]);
    h.rng.pin(1);
    let l = h.lim.acquire(E, R, &[("t", 1)]).await.unwrap();
    assert_eq!(l.consumed()["t"], 1);
    let x = refused(h.lim.acquire(E, R, &[("t", 3)]).await);
    let st = &x.statuses[0];
    assert!(st.exceeded && st.available < st.requested, "{st:?}");
    assert!(x.retry_after_ms.is_some());
    let a = h.lim.check_availability(E, R, &[("t", 3)]).await.unwrap();
    assert_eq!((a.allowed, a.limits[0].available), (false, st.available));
}

/// A doubling mints nothing: 10 drained on one shard at T0, doubled to 2 — the new shard is
/// split off the drained one and admits nothing the entity did not have.
pub async fn a_doubling_mints_nothing(b: &Backend) {
    let h = b.harness(T0).await;
    resource_limits(&h, &[t10()]).await;
    h.lim.acquire(E, R, &[("t", 10)]).await.unwrap();
    assert_eq!(h.lim.admin().bump_shard_count(E, R, 1).await.unwrap(), 2);
    h.rng.pin(1);
    let x = refused(h.lim.acquire(E, R, &[("t", 1)]).await);
    assert_eq!(x.statuses[0].available, 0);
    assert_eq!(h.tks(E, R, "t", 2), vec![0, 0]);
    // A full bucket splits in half: 5 + 5, still 10 in all.
    let h = b.harness(T0).await;
    resource_limits(&h, &[t10()]).await;
    h.lim.acquire(E, R, &[("t", 0)]).await.unwrap();
    assert_eq!(h.lim.admin().bump_shard_count(E, R, 1).await.unwrap(), 2);
    let mut admitted = 0;
    for i in 0..20u32 {
        h.rng.pin(i % 2);
        if h.lim.acquire(E, R, &[("t", 1)]).await.is_ok() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 10);
}
