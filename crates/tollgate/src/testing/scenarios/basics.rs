//! Scenarios 1–10 and 19–26 of spec-shards-windows-quotas.md §5, L1–L4 of
//! history-and-scenarios.md §5.2 (unsharded), calendar resets across DST, store request
//! counts, bad input, corrupt items and limit levels.
#![allow(missing_docs)]

use std::time::Duration;

use crate::testing::hook::On;
use crate::testing::*;
use crate::{AcquireOptions, Error, Limit, Scope};
use tollgate_core::bucket::BucketImage;
use tollgate_core::expr::ReturnValues;
use tollgate_core::materialize::{evaluate, evaluate_wcu, valid_until};
use tollgate_core::writes::{normal_write, params_hash, retry_write, ItemStamp, TtlWrite};
use tollgate_store::{Store, StoreError, UpdateRequest};

fn session() -> Limit {
    Limit::quota_after("session", 10, Duration::from_secs(18_000)).unwrap()
}

async fn entity_limits(h: &H, e: &str, r: &str, limits: &[Limit]) {
    h.lim
        .admin()
        .set_limits(&Scope::Entity(e.into(), Some(r.into())), limits)
        .await
        .unwrap();
}

fn rejected(r: Result<crate::Lease, Error>) -> Box<crate::Exceeded> {
    match r {
        Err(Error::RateLimitExceeded(x)) => x,
        Err(e) => panic!("expected a rejection, got {e}"),
        Ok(_) => panic!("expected a rejection, got a lease"),
    }
}

/// Scenario 1 through the limiter: a drained rate limit refills lazily at its rate.
pub async fn s01_refill_through_the_limiter(b: &Backend) {
    let h = b.harness(T0).await;
    entity_limits(&h, "e", "api", &[Limit::per_minute("rpm", 100).unwrap()]).await;
    h.lim.acquire("e", "api", &[("rpm", 100)]).await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_rpm_tk"), Some(0));
    let x = rejected(h.lim.acquire("e", "api", &[("rpm", 1)]).await);
    assert_eq!(x.statuses[0].retry_after_ms, Some(600));
    h.at(T0 + 30_000);
    h.lim.acquire("e", "api", &[("rpm", 50)]).await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_rpm_tk"), Some(0));
    assert!(h.lim.acquire("e", "api", &[("rpm", 1)]).await.is_err());
}

/// Scenario 4: the normal write composes with a concurrent fast-path debit (ADD), and its
/// floor refuses when concurrent debits left too little.
pub async fn s04_fast_path_composes_with_slow_path(b: &Backend) {
    for (fast_debit, lands, final_tk) in [(1000, true, 1000), (3000, false, 2000)] {
        let h = b.harness(T0).await;
        entity_limits(&h, "e", "api", &[Limit::per_hour("rpm", 5).unwrap()]).await;
        h.lim.acquire("e", "api", &[("rpm", 0)]).await.unwrap();
        let limits = vec![Limit::per_hour("rpm", 5).unwrap()];
        let img = BucketImage::decode(&h.item("e", "api", 0)).unwrap();
        assert_eq!(img.limits["rpm"].balance, 5000);
        let evals: Vec<_> = limits
            .iter()
            .map(|l| evaluate(l, img.limits.get("rpm"), img.refilled_at_ms, 1, T0, None))
            .collect();
        assert_eq!(evals[0].credit(), 0);
        let wcu = evaluate_wcu(img.wcu.as_ref(), img.refilled_at_ms, T0);
        let ph = params_hash(&limits);
        let stamp = ItemStamp {
            refilled_at_ms: T0,
            valid_until_ms: valid_until(&limits, &evals, T0),
            ttl: TtlWrite::Remove,
            params_hash: &ph,
            read: None,
        };
        let amounts = vec![("rpm".to_string(), 3000)];
        let (u, c) = normal_write(
            img.refilled_at_ms,
            &stamp,
            &limits,
            &evals,
            &wcu,
            &amounts,
            Default::default(),
        );
        // Meanwhile a fast-path write debits without touching rf.
        h.set_n("e", "api", 0, "b_rpm_tk", 5000 - fast_debit);
        let r = h
            .store
            .update(UpdateRequest {
                key: h.key("e", "api", 0),
                update: u,
                condition: Some(c),
                returns: ReturnValues::None,
            })
            .await;
        assert_eq!(r.is_ok(), lands);
        assert_eq!(h.n("e", "api", 0, "b_rpm_tk"), Some(final_tk));
    }
}

/// Scenario 5: the retry write never changes rf, vu, ws, wa or gc.
pub async fn s05_retry_touches_only_balances(b: &Backend) {
    let h = b.harness(T0).await;
    entity_limits(&h, "e", "api", &[session()]).await;
    h.lim.acquire("e", "api", &[("session", 1)]).await.unwrap();
    let before = h.item("e", "api", 0);
    let (u, c) = retry_write(&[("session".to_string(), 2000)], &[session()], T0);
    h.store
        .update(UpdateRequest {
            key: h.key("e", "api", 0),
            update: u,
            condition: Some(c),
            returns: ReturnValues::None,
        })
        .await
        .unwrap();
    let after = h.item("e", "api", 0);
    for a in ["rf", "vu", "b_session_ws", "b_session_wa", "b_session_gc"] {
        assert_eq!(before.get(a), after.get(a), "{a}");
    }
    assert_eq!(h.n("e", "api", 0, "b_session_tk"), Some(7000));
    assert_eq!(h.n("e", "api", 0, "b_session_tc"), Some(3000));
    // Failing the floor: nothing changes.
    let (u, c) = retry_write(&[("session".to_string(), 8000)], &[session()], T0);
    let r = h
        .store
        .update(UpdateRequest {
            key: h.key("e", "api", 0),
            update: u,
            condition: Some(c),
            returns: ReturnValues::None,
        })
        .await;
    assert!(matches!(r, Err(StoreError::ConditionFailed { .. })));
}

/// Scenario 6: adjust and rollback, exactly — and a lease never returns more than it took
/// (a 0-token lease cannot refund 2: that would hand out tokens of earlier leases).
pub async fn s06_adjust_and_rollback(b: &Backend) {
    let h = b.harness(T0).await;
    entity_limits(&h, "e", "api", &[Limit::per_day("tpd", 10).unwrap()]).await;
    let mut a = h.lim.acquire("e", "api", &[("tpd", 5)]).await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_tpd_tk"), Some(5000));
    a.adjust("tpd", 3).unwrap();
    a.commit().await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_tpd_tk"), Some(2000));
    assert_eq!(h.n("e", "api", 0, "b_tpd_tc"), Some(8000));
    let mut b = h.lim.acquire("e", "api", &[("tpd", 0)]).await.unwrap();
    match b.adjust("tpd", -2) {
        Err(Error::InvalidAdjustment {
            delta: -2,
            consumed: 0,
            ..
        }) => {}
        r => panic!("a refund beyond the lease's net must be refused, got {r:?}"),
    }
    b.commit().await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_tpd_tk"), Some(2000));
    assert_eq!(h.n("e", "api", 0, "b_tpd_tc"), Some(8000));
    // A refund of what the lease took lands exactly.
    let mut b = h.lim.acquire("e", "api", &[("tpd", 2)]).await.unwrap();
    b.adjust("tpd", -2).unwrap();
    assert!(matches!(
        b.adjust("tpd", -1),
        Err(Error::InvalidAdjustment { .. })
    ));
    b.commit().await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_tpd_tk"), Some(2000));
    assert_eq!(h.n("e", "api", 0, "b_tpd_tc"), Some(8000));
    // Rollback restores tk and tc exactly.
    let mut c = h.lim.acquire("e", "api", &[("tpd", 1)]).await.unwrap();
    c.adjust("tpd", 9).unwrap();
    c.rollback().await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_tpd_tk"), Some(2000));
    assert_eq!(h.n("e", "api", 0, "b_tpd_tc"), Some(8000));
    assert!(matches!(c.commit().await, Err(Error::LeaseClosed)));
}

/// Scenario 7 and L4: zero estimates admit on a zero balance and adjust into debt.
pub async fn s07_zero_estimate_lease(b: &Backend) {
    let h = b.harness(T0).await;
    entity_limits(&h, "e", "api", &[Limit::per_day("tpd", 5).unwrap()]).await;
    h.lim.acquire("e", "api", &[("tpd", 5)]).await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_tpd_tk"), Some(0));
    let writes = h.stats().writes();
    let mut l = h.lim.acquire("e", "api", &[("tpd", 0)]).await.unwrap();
    assert_eq!(h.stats().writes(), writes + 1, "the fast path admitted it");
    l.adjust("tpd", 4).unwrap();
    l.commit().await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_tpd_tk"), Some(-4000));
    assert_eq!(h.n("e", "api", 0, "b_tpd_tc"), Some(9000));
    // A zero estimate on a negative balance is refused.
    assert!(h.lim.acquire("e", "api", &[("tpd", 0)]).await.is_err());
}

/// L4: zero estimates reconciled, twice, on both paths.
pub async fn l4_zero_estimates_both_paths(b: &Backend) {
    for speculative in [true, false] {
        let mut o = opts();
        o.speculative = speculative;
        let h = b.harness_with(T0, o).await;
        entity_limits(
            &h,
            "e",
            "llm",
            &[
                Limit::per_day("rpm", 1000).unwrap(),
                Limit::per_day("tpm", 1000).unwrap(),
            ],
        )
        .await;
        for _ in 0..2 {
            let mut l = h.lim.acquire("e", "llm", &[("rpm", 0)]).await.unwrap();
            l.adjust("rpm", 10).unwrap();
            assert_eq!(l.consumed()["rpm"], 10);
            l.commit().await.unwrap();
        }
        assert_eq!(h.n("e", "llm", 0, "b_rpm_tk"), Some(980_000));
        for _ in 0..2 {
            // tpm was not named on entry: the adjustment still lands (the original drops it).
            let mut l = h.lim.acquire("e", "llm", &[("rpm", 1)]).await.unwrap();
            l.adjust("tpm", 10).unwrap();
            l.commit().await.unwrap();
        }
        assert_eq!(h.n("e", "llm", 0, "b_rpm_tk"), Some(978_000));
        assert_eq!(h.n("e", "llm", 0, "b_tpm_tk"), Some(980_000));
        let mut l = h.lim.acquire("e", "llm", &[("tpm", 0)]).await.unwrap();
        l.adjust("tpm", 50).unwrap();
        l.adjust("tpm", -20).unwrap();
        l.commit().await.unwrap();
        assert_eq!(h.n("e", "llm", 0, "b_tpm_tk"), Some(950_000));
    }
}

/// L1/L2: leases over the limit, release, closed leases, unknown limits.
pub async fn l1_l2_lease_operations(b: &Backend) {
    let h = b.harness(T0).await;
    entity_limits(&h, "e", "llm", &[Limit::per_minute("tpm", 1000).unwrap()]).await;
    let mut l = h.lim.acquire("e", "llm", &[("tpm", 500)]).await.unwrap();
    l.adjust("tpm", 1000).unwrap();
    assert_eq!(l.consumed()["tpm"], 1500);
    l.adjust("tpm", -1200).unwrap();
    assert_eq!(l.consumed()["tpm"], 300);
    assert!(matches!(
        l.adjust("nope", 1),
        Err(Error::UnknownLimit { .. })
    ));
    l.adjust("tpm", 0).unwrap();
    l.commit().await.unwrap();
    assert_eq!(h.n("e", "llm", 0, "b_tpm_tk"), Some(700_000));
    assert!(matches!(l.adjust("tpm", 1), Err(Error::LeaseClosed)));
    assert!(matches!(l.commit().await, Err(Error::LeaseClosed)));
    assert!(matches!(l.rollback().await, Err(Error::LeaseClosed)));
}

/// The documented rule for a dropped lease: the debit stands, uncommitted adjustments are
/// discarded.
pub async fn dropped_lease_keeps_its_debit_only(b: &Backend) {
    let h = b.harness(T0).await;
    entity_limits(&h, "e", "llm", &[Limit::per_day("tpd", 100).unwrap()]).await;
    {
        let mut l = h.lim.acquire("e", "llm", &[("tpd", 10)]).await.unwrap();
        l.adjust("tpd", 50).unwrap();
    }
    assert_eq!(h.n("e", "llm", 0, "b_tpd_tk"), Some(90_000));
    assert_eq!(h.n("e", "llm", 0, "b_tpd_tc"), Some(10_000));
}

/// L3: a lost rf lock ends in the consumption-only retry, guarded by the balance — when the
/// writer that took the lock left the limit trusted (`b_rpm_fu` later than now). One that left it
/// past its trust horizon makes the pass re-plan from the item it returned (no read): the
/// refill since its `rf` is credited first.
pub async fn l3_lost_lock_retries_consumption_only(b: &Backend) {
    for (winner_vu, tk_after, tc_after) in [(Some(T0 + 60_000), 7000, 3000), (None, 7999, 3000)] {
        let mut o = opts();
        o.speculative = false;
        let h = b.harness_with(T0, o).await;
        entity_limits(&h, "e", "api", &[Limit::per_minute("rpm", 10).unwrap()]).await;
        h.lim.acquire("e", "api", &[("rpm", 1)]).await.unwrap();
        // Another writer moves rf between our read and write.
        let (lim, hk) = h.hooked(false);
        let k = h.key("e", "api", 0);
        hk.stage(On::Update, Some(k.clone()), move |m| {
            let mut i = m.raw_get(&k).unwrap();
            let rf = i
                .get("rf")
                .and_then(tollgate_core::value::Value::as_n)
                .unwrap();
            i.insert("rf".into(), tollgate_core::value::Value::N(rf + 1));
            if let Some(fu) = winner_vu {
                i.insert("b_rpm_fu".into(), tollgate_core::value::Value::N(fu));
            }
            m.raw_put(&k, i);
        });
        h.at(T0 + 6000);
        let lease = lim.acquire("e", "api", &[("rpm", 2)]).await.unwrap();
        assert_eq!(lease.consumed()["rpm"], 2);
        // Trusted: the refill credit (1 token for 6 s) was not applied: 9 − 2 = 7, and rf is
        // the other writer's value. Untrusted: re-planned, 5,999 ms credited (0.999 token).
        assert_eq!(h.n("e", "api", 0, "b_rpm_tk"), Some(tk_after));
        if winner_vu.is_some() {
            assert_eq!(h.n("e", "api", 0, "rf"), Some(T0 + 1));
        } else {
            assert!(h.n("e", "api", 0, "rf") > Some(T0 + 1));
        }
        assert_eq!(h.n("e", "api", 0, "b_rpm_tc"), Some(tc_after));
    }
}

/// A harness whose entity `e` has `api` at 10⁹ per second — a bucket full again within the
/// millisecond after every write, so each acquire materialises under the rf lock — and a
/// limiter of its own on the harness's store, reading `clock`.
async fn always_full(
    b: &Backend,
    clock: std::sync::Arc<dyn crate::Clock>,
    options: crate::Options,
) -> (H, crate::Limiter) {
    let h = b.harness(T0).await;
    entity_limits(
        &h,
        "e",
        "api",
        &[Limit::per_second("rps", 1_000_000_000).unwrap()],
    )
    .await;
    let lim = crate::Limiter::builder(h.store.clone())
        .clock(clock)
        .options(options)
        .build()
        .unwrap();
    (h, lim)
}

/// A clock one millisecond later at every reading: every write of the scenario below carries
/// its own `rf`, so an rf-locked write planned from an image another write replaced fails.
struct Ticking(std::sync::atomic::AtomicI64);

impl crate::Clock for Ticking {
    fn now_ms(&self) -> i64 {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }
}

/// Rule "one rf-locked writer per shard in a process" (`ShardCache::gate`): 16 concurrent
/// acquires of one bucket that is always full — each one materialises under the rf lock —
/// send one write each (and the slow client one read each), all admitted and all counted.
/// Without the gate they were planned from the same image and all but one lost the lock and
/// wrote again (up to 16 + 15 + … writes; a contended one could end `Contended`).
pub async fn concurrent_writers_of_one_shard_write_once_each(b: &Backend) {
    const N: i64 = 16;
    for speculative in [true, false] {
        let (h, lim) = always_full(
            b,
            std::sync::Arc::new(Ticking(std::sync::atomic::AtomicI64::new(T0))),
            crate::Options {
                speculative,
                ..opts()
            },
        )
        .await;
        lim.acquire("e", "api", &[("rps", 1)]).await.unwrap();
        let before = h.stats();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..N {
            let lim = lim.clone();
            tasks.spawn(async move { lim.acquire("e", "api", &[("rps", 1)]).await.map(|_| ()) });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap().unwrap();
        }
        let after = h.stats();
        // The slow client reads before it plans, the fast one plans from its last image.
        let reads = if speculative { 0 } else { N as u64 };
        assert_eq!(
            (
                after.updates - before.updates,
                after.reads() - before.reads()
            ),
            (N as u64, reads),
            "one write per acquire (speculative: {speculative})"
        );
        assert_eq!(h.n("e", "api", 0, "b_rps_tc"), Some((N + 1) * 1000));
    }
}

/// A clock that reads `first` for its next `left` readings and `then` after them.
struct Scripted {
    first: std::sync::atomic::AtomicI64,
    left: std::sync::atomic::AtomicI64,
    then: std::sync::atomic::AtomicI64,
}

impl Scripted {
    fn at(&self, first: i64, readings: i64, then: i64) {
        use std::sync::atomic::Ordering::SeqCst;
        self.first.store(first, SeqCst);
        self.left.store(readings, SeqCst);
        self.then.store(then, SeqCst);
    }
}

impl crate::Clock for Scripted {
    fn now_ms(&self) -> i64 {
        use std::sync::atomic::Ordering::SeqCst;
        if self.left.fetch_sub(1, SeqCst) > 0 {
            self.first.load(SeqCst)
        } else {
            self.then.load(SeqCst)
        }
    }
}

/// Rule "plan from what the store last said": the image a warm acquire finds is judged at
/// the instant its speculative write will carry, not at the one read before the image was
/// looked up. Here a bucket always full again a millisecond after its write (10⁹ per
/// second) is trusted at the acquire's first readings and past its horizon one millisecond
/// later, when the write would be sent: the acquire sends the one materialising write. It
/// sent a speculative write first, refused (`Boundary`), and then that write (two in all)
/// when the image was judged at the earlier reading — what 16 concurrent writers on a
/// ticking clock hit now and then (`concurrent_writers_of_one_shard_write_once_each`).
pub async fn a_horizon_passed_before_the_write_costs_one_write(b: &Backend) {
    let clock = std::sync::Arc::new(Scripted {
        first: T0.into(),
        left: i64::MAX.into(),
        then: T0.into(),
    });
    let (h, lim) = always_full(b, clock.clone(), opts()).await;
    lim.acquire("e", "api", &[("rps", 1)]).await.unwrap();
    let fu = h
        .n("e", "api", 0, "b_rps_fu")
        .expect("a dripping limit has a horizon");
    assert_eq!(
        fu,
        T0 + 1,
        "full again within the millisecond after its write"
    );
    // Two readings at the write's instant (the config's and the acquire's), then one
    // millisecond later: the horizon.
    clock.at(T0, 2, fu);
    let before = h.stats();
    lim.acquire("e", "api", &[("rps", 1)]).await.unwrap();
    let after = h.stats();
    assert_eq!(
        (
            after.updates - before.updates,
            after.reads() - before.reads()
        ),
        (1, 0),
        "one write, planned from the image this process holds"
    );
    assert_eq!(
        h.n("e", "api", 0, "rf"),
        Some(fu),
        "the write materialised at the horizon"
    );
    assert_eq!(h.n("e", "api", 0, "b_rps_tc"), Some(2000));
}

/// Scenario 8: a refund that would leave a balance above its ceiling. For a quota, a refund
/// of a debit from a period that has since reset is recorded in `tc` only (the reset already
/// forgave it; crediting it would lift the new period). For a rate limit, the refund lands,
/// `vu = 0` forces the slow path, and the next acquire is clamped to the capacity.
pub async fn s08_refund_above_ceiling_is_clamped(b: &Backend) {
    let h = b.harness(T0).await;
    let daily = Limit::quota_calendar("daily", 10, "0 0 * * *", "UTC").unwrap();
    entity_limits(&h, "e", "api", &[daily]).await;
    let midnight = 1_757_030_400_000; // 2025-09-05T00:00:00Z, after T0
    let mut l = h.lim.acquire("e", "api", &[("daily", 4)]).await.unwrap();
    h.at(midnight + 1000);
    h.lim.acquire("e", "api", &[("daily", 1)]).await.unwrap(); // reset: 10 − 1
    assert_eq!(h.n("e", "api", 0, "b_daily_tk"), Some(9000));
    l.rollback().await.unwrap();
    assert_eq!(
        h.n("e", "api", 0, "b_daily_tk"),
        Some(9000),
        "the new period is not lifted"
    );
    assert_eq!(
        h.n("e", "api", 0, "b_daily_tc"),
        Some(1000),
        "tc still nets the refund"
    );

    entity_limits(&h, "e", "web", &[Limit::per_hour("rph", 10).unwrap()]).await;
    let mut l = h.lim.acquire("e", "web", &[("rph", 4)]).await.unwrap();
    h.at(midnight + 1000 + 3_600_000);
    h.slow().acquire("e", "web", &[("rph", 0)]).await.unwrap(); // refilled to 10
    l.rollback().await.unwrap(); // + 4: 14 > 10
    assert_eq!(h.n("e", "web", 0, "b_rph_tk"), Some(14_000));
    assert_eq!(h.n("e", "web", 0, "vu"), Some(0));
    h.lim.acquire("e", "web", &[("rph", 1)]).await.unwrap();
    assert_eq!(h.n("e", "web", 0, "b_rph_tk"), Some(9000));
}

/// A reset is a SET: a refund (or any ADD) that lands between a reset pass's read and its
/// write is not carried into the new period (found by the simulator, seed 628).
pub async fn reset_is_a_set_despite_a_concurrent_refund(b: &Backend) {
    let h = b.harness(T0).await;
    let daily = Limit::quota_calendar("daily", 10, "0 0 * * *", "UTC").unwrap();
    entity_limits(&h, "e", "api", &[daily]).await;
    h.lim.acquire("e", "api", &[("daily", 9)]).await.unwrap();
    let midnight = 1_757_030_400_000;
    h.at(midnight + 1000);
    let (lim, hk) = h.hooked(false);
    let k = h.key("e", "api", 0);
    hk.stage(On::Update, Some(k.clone()), move |m| {
        let mut i = m.raw_get(&k).unwrap();
        let tk = i
            .get("b_daily_tk")
            .and_then(tollgate_core::value::Value::as_n)
            .unwrap();
        i.insert(
            "b_daily_tk".into(),
            tollgate_core::value::Value::N(tk + 3000),
        );
        m.raw_put(&k, i);
    });
    lim.acquire("e", "api", &[("daily", 1)]).await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_daily_tk"), Some(9000));
}

/// A refund stays in its period: a debit of the old period's balance can land after the
/// edge — a fast write from a client whose clock is still before it (its `vu` check passes
/// by that clock). A reset then replaces that balance; rolling the lease back afterwards
/// must not credit the new period (it would re-grant 3).
pub async fn refund_after_a_reset_stays_in_its_period(b: &Backend) {
    let midnight = 1_757_030_400_000;
    let h = b.harness(midnight - 60_000).await;
    let daily = Limit::quota_calendar("daily", 10, "0 0 * * *", "UTC").unwrap();
    entity_limits(&h, "e", "api", &[daily]).await;
    h.lim.acquire("e", "api", &[("daily", 1)]).await.unwrap();
    // The lagging client's clock: a second before midnight.
    h.at(midnight - 1000);
    let mut lease = h.lim.acquire("e", "api", &[("daily", 3)]).await.unwrap();
    assert_eq!(
        h.n("e", "api", 0, "b_daily_tk"),
        Some(6000),
        "the lagging fast write debited the old period's balance"
    );
    h.at(midnight + 2000);
    h.slow().acquire("e", "api", &[("daily", 4)]).await.unwrap();
    assert_eq!(
        h.n("e", "api", 0, "b_daily_tk"),
        Some(6000),
        "reset to 10, less 4"
    );
    assert_eq!(h.n("e", "api", 0, "b_daily_pe"), Some(midnight));
    lease.rollback().await.unwrap();
    assert_eq!(
        h.n("e", "api", 0, "b_daily_tk"),
        Some(6000),
        "the refund of an old-period debit does not lift the new period's balance"
    );
    assert_eq!(h.n("e", "api", 0, "b_daily_tc"), Some(1000 + 4000));
}

/// Scenario 9: the fast path's condition set — expired TTL, vu reached, vu = 0, and (rule
/// "the fast path trusts a dripping balance only until it would be full") the limit's trust
/// horizon `fu` reached or absent. Inside it the fast path writes alone. A failed fast write
/// returns the item, and the slow path plans from it: no read.
pub async fn s09_fast_condition_set(b: &Backend) {
    let h = b.harness(T0).await;
    entity_limits(&h, "e", "api", &[Limit::per_minute("rpm", 100).unwrap()]).await;
    h.lim.acquire("e", "api", &[("rpm", 1)]).await.unwrap();
    assert_eq!(
        h.n("e", "api", 0, "vu"),
        None,
        "a drip-only item has no boundary"
    );
    assert_eq!(
        h.n("e", "api", 0, "b_rpm_fu"),
        Some(T0 + 600),
        "one token short of full, at 100/min: full again in 600 ms"
    );
    let s = h.stats();
    h.lim.acquire("e", "api", &[("rpm", 1)]).await.unwrap();
    let d = h.stats().since(&s);
    assert_eq!((d.updates, d.reads()), (1, 0), "inside fu → fast path");
    for (attr, v) in [
        ("vu", Some(0)),
        ("vu", Some(T0)),
        ("ttl", Some(T0 / 1000)),
        ("b_rpm_fu", Some(T0)),
        ("b_rpm_fu", None),
    ] {
        match v {
            Some(v) => h.set_n("e", "api", 0, attr, v),
            None => h.remove("e", "api", 0, attr),
        }
        let s = h.stats();
        h.lim.acquire("e", "api", &[("rpm", 1)]).await.unwrap();
        let d = h.stats().since(&s);
        assert_eq!(
            (d.updates, d.gets),
            (2, 0),
            "{attr}={v:?}: failed fast write, normal write planned from the item it returned"
        );
        assert!(h.n("e", "api", 0, "b_rpm_fu") > Some(T0), "re-stamped");
        h.remove("e", "api", 0, "vu");
    }
}

/// Scenario 9, first clause: a fast write on a disabled item fails as DISABLED — refused
/// with ResourceDisabled, no slow path — on every shard, until re-enabled. The client
/// under test did not make the change (its config cache has not seen the stored mode):
/// the stamp alone refuses it. The client that made it refuses from its config.
pub async fn s09_disabled_refuses_without_slow_path(b: &Backend) {
    let h = b.harness(T0).await;
    entity_limits(&h, "e", "api", &[Limit::per_minute("rpm", 100).unwrap()]).await;
    h.lim.acquire("e", "api", &[("rpm", 1)]).await.unwrap();
    h.lim.admin().bump_shard_count("e", "api", 1).await.unwrap();
    assert_eq!(
        h.slow()
            .admin()
            .set_disabled("e", "api", true)
            .await
            .unwrap(),
        1
    );
    let s = h.stats();
    let e = h.lim.acquire("e", "api", &[("rpm", 1)]).await.unwrap_err();
    assert!(matches!(e, Error::ResourceDisabled { .. }), "{e}");
    let d = h.stats().since(&s);
    assert_eq!((d.updates, d.gets), (1, 0), "the failed fast write decides");
    // A shard created while disabled is refused too, and the slow path refuses.
    h.rng.pin(1);
    let e = h.lim.acquire("e", "api", &[("rpm", 1)]).await.unwrap_err();
    assert!(matches!(e, Error::ResourceDisabled { .. }), "{e}");
    h.rng.pin(0);
    let s = h.stats();
    let e = h
        .slow()
        .acquire("e", "api", &[("rpm", 1)])
        .await
        .unwrap_err();
    assert!(matches!(e, Error::ResourceDisabled { .. }), "{e}");
    let d = h.stats().since(&s);
    assert_eq!(d.writes(), 0, "the config's mode refuses before any write");
    h.slow()
        .admin()
        .set_disabled("e", "api", false)
        .await
        .unwrap();
    h.lim.acquire("e", "api", &[("rpm", 1)]).await.unwrap();
    h.slow().acquire("e", "api", &[("rpm", 1)]).await.unwrap();
}

/// Scenario 10: each fast write debits wcu by exactly 1000; at 999 it fails and, with a
/// fresh wcu refill due, the slow path admits.
pub async fn s10_wcu_accounting(b: &Backend) {
    let h = b.harness(T0).await;
    entity_limits(&h, "e", "api", &[Limit::per_minute("rpm", 100).unwrap()]).await;
    h.lim.acquire("e", "api", &[("rpm", 1)]).await.unwrap();
    let (tk, tc) = (
        h.n("e", "api", 0, "b_wcu_tk").unwrap(),
        h.n("e", "api", 0, "b_wcu_tc").unwrap(),
    );
    h.lim.acquire("e", "api", &[("rpm", 1)]).await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_wcu_tk"), Some(tk - 1000));
    assert_eq!(h.n("e", "api", 0, "b_wcu_tc"), Some(tc + 1000));
    h.set_n("e", "api", 0, "b_wcu_tk", 999);
    h.at(T0 + 500); // 500 tokens of wcu refill due: no doubling, the slow path admits
    h.lim.acquire("e", "api", &[("rpm", 1)]).await.unwrap();
    assert_eq!(h.n("e", "api", 0, "shard_count"), Some(1));
    assert_eq!(h.n("e", "api", 0, "b_wcu_tk"), Some(999 + 500_000));
}

/// Scenario 19: create marks the window.
pub async fn s19_create_marks(b: &Backend) {
    let h = b.harness(T0).await;
    entity_limits(&h, "e", "llm", &[session()]).await;
    let l = h.lim.acquire("e", "llm", &[("session", 1)]).await.unwrap();
    // The lease reports the balance after its own debit, on the slow path too.
    assert_eq!(
        (l.statuses()[0].available, l.statuses()[0].resets_at_ms),
        (9, Some(T0 + W))
    );
    let l = h.lim.acquire("e", "llm", &[("session", 1)]).await.unwrap();
    assert_eq!(l.statuses()[0].available, 8);
    let mut l = l;
    l.rollback().await.unwrap();
    let g = |a: &str| h.n("e", "llm", 0, a);
    assert_eq!(g("b_session_ws"), Some(T0));
    assert_eq!(g("b_session_wa"), Some(T0));
    assert_eq!(g("b_session_rsa"), Some(18_000));
    assert_eq!(g("b_session_tk"), Some(9000));
    assert_eq!(g("b_session_tc"), Some(1000));
    assert_eq!(g("rf"), Some(T0));
    assert_eq!(g("vu"), Some(T0 + W));
    assert_eq!(g("b_session_gc"), Some(1));
}

/// Scenario 20: a zero-token acquire anchors the window.
pub async fn s20_zero_token_anchor(b: &Backend) {
    let h = b.harness(T0).await;
    entity_limits(&h, "e", "llm", &[session()]).await;
    h.lim.acquire("e", "llm", &[("session", 0)]).await.unwrap();
    assert_eq!(h.n("e", "llm", 0, "b_session_ws"), Some(T0));
    assert_eq!(h.n("e", "llm", 0, "b_session_tk"), Some(10_000));
}

/// Scenarios 21 and 24: the window is half-open and the fast path cannot cross its end.
pub async fn s21_s24_half_open_end(b: &Backend) {
    let h = b.harness(T0).await;
    entity_limits(&h, "e", "llm", &[session()]).await;
    h.lim.acquire("e", "llm", &[("session", 1)]).await.unwrap();
    h.at(T0 + W - 1);
    let s = h.stats();
    h.lim.acquire("e", "llm", &[("session", 1)]).await.unwrap();
    assert_eq!(
        h.stats().since(&s).gets,
        0,
        "inside the window: fast path (no bucket read)"
    );
    assert_eq!(h.n("e", "llm", 0, "b_session_tk"), Some(8000));
    h.at(T0 + W);
    let s = h.stats();
    h.lim.acquire("e", "llm", &[("session", 1)]).await.unwrap();
    let d = h.stats().since(&s);
    assert_eq!(
        (d.updates, d.gets),
        (1, 0),
        "boundary: this client's last image is past its vu, so the slow path opens from it in one write"
    );
    assert_eq!(h.n("e", "llm", 0, "b_session_ws"), Some(T0 + W));
    assert_eq!(h.n("e", "llm", 0, "b_session_tk"), Some(9000));
    assert_eq!(h.n("e", "llm", 0, "vu"), Some(T0 + 2 * W));
}

/// Scenario 22: idle restart — the next window starts at the next use, not at the end.
pub async fn s22_idle_restart(b: &Backend) {
    let h = b.harness(T0).await;
    entity_limits(&h, "e", "llm", &[session()]).await;
    h.lim.acquire("e", "llm", &[("session", 1)]).await.unwrap();
    h.at(T0 + 8 * 3_600_000);
    h.lim.acquire("e", "llm", &[("session", 1)]).await.unwrap();
    assert_eq!(h.n("e", "llm", 0, "b_session_ws"), Some(T0 + 8 * 3_600_000));
    assert_eq!(h.n("e", "llm", 0, "b_session_tk"), Some(9000));
    assert_eq!(h.n("e", "llm", 0, "vu"), Some(T0 + 13 * 3_600_000));
}

/// Scenario 23: a rejected request never anchors a window.
pub async fn s23_rejection_does_not_anchor(b: &Backend) {
    let h = b.harness(T0).await;
    entity_limits(&h, "e", "llm", &[session()]).await;
    h.lim.acquire("e", "llm", &[("session", 1)]).await.unwrap();
    h.at(T0 + 6 * 3_600_000);
    let x = rejected(h.lim.acquire("e", "llm", &[("session", 11)]).await);
    assert_eq!(x.retry_after_ms, None, "11 > 10 can never fit");
    assert_eq!(h.n("e", "llm", 0, "b_session_ws"), Some(T0));
    h.at(T0 + 9 * 3_600_000);
    h.lim.acquire("e", "llm", &[("session", 1)]).await.unwrap();
    assert_eq!(h.n("e", "llm", 0, "b_session_ws"), Some(T0 + 9 * 3_600_000));
}

/// Scenario 25: retry_after and resets_at of a window quota.
pub async fn s25_retry_after_and_resets_at(b: &Backend) {
    let h = b.harness(T0).await;
    entity_limits(&h, "e", "llm", &[session()]).await;
    h.lim.acquire("e", "llm", &[("session", 10)]).await.unwrap();
    h.at(T0 + 3_600_000);
    let x = rejected(h.lim.acquire("e", "llm", &[("session", 1)]).await);
    assert_eq!(x.resets_at_ms, Some(T0 + W));
    assert_eq!(x.retry_after_ms, Some(4 * 3_600_000));
    assert_eq!(x.statuses[0].retry_after_ms, Some(4 * 3_600_000));
    let a = h
        .lim
        .check_availability("e", "llm", crate::Amounts::new())
        .await
        .unwrap();
    assert_eq!(a.resets_at_ms, Some(T0 + W));
    assert_eq!(a.limits[0].available, 0);
}

/// Scenario 26: TTL horizon — default-level windows get now + 5 h × 7; entity-level none.
pub async fn s26_ttl_horizon(b: &Backend) {
    let h = b.harness(T0).await;
    h.lim
        .admin()
        .set_limits(&Scope::Resource("llm".into()), &[session()])
        .await
        .unwrap();
    h.lim.acquire("e", "llm", &[("session", 1)]).await.unwrap();
    assert_eq!(h.n("e", "llm", 0, "ttl"), Some(T0 / 1000 + 126_000));
    entity_limits(&h, "f", "llm", &[session()]).await;
    h.lim.acquire("f", "llm", &[("session", 1)]).await.unwrap();
    assert_eq!(h.n("f", "llm", 0, "ttl"), None);
}

/// Calendar quota across the spring-forward change in Europe/Berlin: the day after has 23
/// hours, and the reset instant reported is the real next midnight.
pub async fn calendar_reset_across_dst(b: &Backend) {
    let t = |s: &str| s.parse::<jiff::Timestamp>().unwrap().as_millisecond();
    let h = b.harness(t("2026-03-28T22:30:00Z")).await;
    let daily = Limit::quota_calendar("daily", 3, "0 0 * * *", "Europe/Berlin").unwrap();
    entity_limits(&h, "e", "api", &[daily]).await;
    h.lim.acquire("e", "api", &[("daily", 3)]).await.unwrap();
    let x = rejected(h.lim.acquire("e", "api", &[("daily", 1)]).await);
    assert_eq!(x.resets_at_ms, Some(t("2026-03-28T23:00:00Z")));
    h.at(t("2026-03-28T23:00:00Z"));
    h.lim.acquire("e", "api", &[("daily", 3)]).await.unwrap();
    let x = rejected(h.lim.acquire("e", "api", &[("daily", 1)]).await);
    assert_eq!(
        x.resets_at_ms,
        Some(t("2026-03-29T22:00:00Z")),
        "23 hours later"
    );
    h.at(t("2026-03-29T21:59:59Z"));
    assert!(h.lim.acquire("e", "api", &[("daily", 1)]).await.is_err());
    h.at(t("2026-03-29T22:00:00Z"));
    h.lim.acquire("e", "api", &[("daily", 1)]).await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_daily_tk"), Some(2000));
}

/// Store requests per operation: a warm admitted acquire costs 1 write and 0 reads; a
/// rejection decided locally costs 0.
pub async fn request_counts(b: &Backend) {
    let h = b.harness(T0).await;
    entity_limits(
        &h,
        "e",
        "api",
        &[
            Limit::per_minute("rpm", 3).unwrap(),
            Limit::per_minute("tpm", 1000).unwrap(),
        ],
    )
    .await;
    h.lim.acquire("e", "api", &[("rpm", 1)]).await.unwrap(); // cold: config + read + create
    let s = h.stats();
    h.lim
        .acquire("e", "api", &[("rpm", 1), ("tpm", 10)])
        .await
        .unwrap();
    let d = h.stats().since(&s);
    assert_eq!((d.writes(), d.reads()), (1, 0));
    h.lim.acquire("e", "api", &[("rpm", 1)]).await.unwrap();
    let s = h.stats();
    assert!(h.lim.acquire("e", "api", &[("rpm", 1)]).await.is_err());
    let d = h.stats().since(&s);
    assert_eq!(
        (d.writes(), d.reads()),
        (1, 0),
        "the failed conditional write decides"
    );
    let s = h.stats();
    let x = rejected(h.lim.acquire("e", "api", &[("rpm", 1)]).await);
    assert_eq!(
        h.stats().since(&s).total(),
        0,
        "decided locally from the rejection cache"
    );
    assert!(x.retry_after_ms.unwrap() > 0);
    assert_eq!(h.lim.stats().local_rejections, 1);
    // The cache never admits: after the refill, the request goes to the store.
    h.at(T0 + 30_000);
    let s = h.stats();
    h.lim.acquire("e", "api", &[("rpm", 1)]).await.unwrap();
    assert!(h.stats().since(&s).total() > 0);
}

/// Bad input gets a typed error and writes nothing.
pub async fn bad_input_is_refused(b: &Backend) {
    let h = b.harness(T0).await;
    entity_limits(&h, "e", "api", &[Limit::per_minute("rpm", 3).unwrap()]).await;
    let s = h.stats();
    assert!(matches!(
        h.lim.acquire("e", "api", &[("rpm", -1)]).await,
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        h.lim.acquire("e", "api", &[("rpm", i64::MAX)]).await,
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        h.lim.acquire("e#1", "api", &[("rpm", 1)]).await,
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        h.lim.acquire("e", "a pi", &[("rpm", 1)]).await,
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        h.lim.acquire("e", "api", &[("wcu", 1)]).await,
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        h.lim.acquire("e", "api", &[("rpm", 1), ("rpm", 1)]).await,
        Err(Error::Invalid(_))
    ));
    assert_eq!(h.stats().since(&s).writes(), 0);
    assert!(matches!(
        h.lim.acquire("e", "api", &[("tpm", 1)]).await,
        Err(Error::UnknownLimit { .. })
    ));
    assert!(matches!(
        h.lim.acquire("e", "other", &[("rpm", 1)]).await,
        Err(Error::NoLimits { .. })
    ));
    assert_eq!(h.stats().since(&s).writes(), 0);
}

/// A corrupt stored item yields an error naming the attribute, never a panic.
pub async fn corrupt_item_names_the_attribute(b: &Backend) {
    let h = b.harness(T0).await;
    entity_limits(&h, "e", "llm", &[session()]).await;
    h.lim.acquire("e", "llm", &[("session", 1)]).await.unwrap();
    let k = h.key("e", "llm", 0);
    let mut i = h.raw.raw_get(&k).unwrap();
    i.insert(
        "b_session_ws".into(),
        tollgate_core::value::Value::S("1.5".into()),
    );
    i.insert("vu".into(), tollgate_core::value::Value::N(0));
    h.raw.raw_put(&k, i);
    let e = h
        .lim
        .acquire("e", "llm", &[("session", 1)])
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Corrupt(_)));
    assert!(e.to_string().contains("b_session_ws"), "{e}");
}

/// Limits stored at several levels resolve most specific first; changing them reaches an
/// existing bucket (param sync); the per-call override wins.
pub async fn limit_levels_and_param_sync(b: &Backend) {
    let h = b.harness(T0).await;
    h.lim
        .admin()
        .set_limits(&Scope::System, &[Limit::per_minute("rpm", 1).unwrap()])
        .await
        .unwrap();
    h.lim
        .admin()
        .set_limits(
            &Scope::Resource("api".into()),
            &[Limit::per_minute("rpm", 2).unwrap()],
        )
        .await
        .unwrap();
    h.lim
        .admin()
        .set_limits(
            &Scope::Entity("e".into(), None),
            &[Limit::per_minute("rpm", 3).unwrap()],
        )
        .await
        .unwrap();
    let cap = |l: Vec<Limit>| l[0].capacity_milli() / 1000;
    assert_eq!(cap(h.lim.resolve_limits("e", "api").await.unwrap()), 3);
    assert_eq!(cap(h.lim.resolve_limits("f", "api").await.unwrap()), 2);
    assert_eq!(cap(h.lim.resolve_limits("f", "other").await.unwrap()), 1);
    entity_limits(&h, "e", "api", &[Limit::per_minute("rpm", 4).unwrap()]).await;
    assert_eq!(cap(h.lim.resolve_limits("e", "api").await.unwrap()), 4);
    for _ in 0..4 {
        h.lim.acquire("e", "api", &[("rpm", 1)]).await.unwrap();
    }
    assert!(h.lim.acquire("e", "api", &[("rpm", 1)]).await.is_err());
    // Raise the limit: the existing bucket follows the new parameters at once — its
    // balance is not topped up, it refills at the new rate toward the new ceiling.
    entity_limits(&h, "e", "api", &[Limit::per_minute("rpm", 10).unwrap()]).await;
    let x = rejected(h.lim.acquire("e", "api", &[("rpm", 1)]).await);
    assert_eq!((x.statuses[0].capacity, x.retry_after_ms), (10, Some(6000)));
    h.at(T0 + 6000);
    h.lim.acquire("e", "api", &[("rpm", 1)]).await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_rpm_cp"), Some(10_000));
    // A limit added later is seeded full (the original rejected forever: §11 #1).
    entity_limits(
        &h,
        "e",
        "api",
        &[
            Limit::per_minute("rpm", 10).unwrap(),
            Limit::per_minute("tpm", 1000).unwrap(),
        ],
    )
    .await;
    h.at(T0 + 12_000);
    h.lim
        .acquire("e", "api", &[("rpm", 1), ("tpm", 1)])
        .await
        .unwrap();
    assert_eq!(h.n("e", "api", 0, "b_tpm_tk"), Some(999_000));
    let o = AcquireOptions {
        limits: Some(vec![Limit::per_minute("rpm", 1000).unwrap()]),
        on_unavailable: None,
    };
    h.lim
        .acquire_with("g", "api", &[("rpm", 100)], o)
        .await
        .unwrap();
    assert_eq!(h.n("g", "api", 0, "b_rpm_cp"), Some(1_000_000));
}
