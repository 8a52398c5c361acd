//! The store has trouble (docs/rules.md: "Only an outage fails open"): a hung store fails
//! within its deadline and the policy decides; a store that refuses requests as invalid
//! never fails open; the limits and the system's policy outlive the config cache's TTL
//! through a long outage — on every backend.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::testing::outage::{Mode, Outage};
use crate::testing::*;
use crate::{AcquireOptions, Error, Limit, Limiter, OnUnavailable, Scope};

const E: &str = "e";
const R: &str = "r";

/// The deadline of the hung-store scenario.
const DEADLINE: Duration = Duration::from_millis(200);
/// What "within the deadline" allows on a loaded machine: a hang would take forever.
const BOUND: Duration = Duration::from_millis(2_000);

fn allow() -> AcquireOptions {
    AcquireOptions {
        limits: None,
        on_unavailable: Some(OnUnavailable::Allow),
    }
}

fn quota() -> Limit {
    Limit::quota_after("q", 100, Duration::from_secs(3600)).unwrap()
}

/// A limiter over `out` whose store requests end at [`DEADLINE`], with `limit` stored for
/// resource `R`.
async fn deadline_limiter(out: &Arc<Outage>, limit: Limit) -> Limiter {
    let lim = Limiter::builder(out.clone())
        .store_timeout(DEADLINE)
        .build()
        .unwrap();
    lim.admin()
        .set_limits(&Scope::Resource(R.into()), &[limit])
        .await
        .unwrap();
    lim
}

fn available(l: &crate::Lease, name: &str) -> i64 {
    l.statuses()
        .iter()
        .find(|s| s.limit == name)
        .map(|s| s.available)
        .unwrap_or_else(|| panic!("no status for {name}"))
}

/// A store that never answers: an acquire returns within the deadline — `block` with an
/// outage, `allow` with a degraded lease — for a warm entity (config cached, bucket known)
/// and a cold one; nothing was charged once the store answers again.
pub async fn a_hung_store_fails_within_its_deadline(b: &Backend) {
    let out = Arc::new(Outage::new(b.store().await));
    let lim = deadline_limiter(&out, quota()).await;
    let mut l = lim.acquire(E, R, &[("q", 1)]).await.unwrap();
    assert_eq!(available(&l, "q"), 99);
    l.commit().await.unwrap();
    // A limiter whose config entries are always past their TTL: it refreshes them, the
    // store does not answer, and it serves them stale (stale-while-error).
    let stale = Limiter::builder(out.clone())
        .store_timeout(DEADLINE)
        .config_cache_ttl(Duration::ZERO)
        .build()
        .unwrap();
    let mut l = stale.acquire(E, R, &[("q", 1)]).await.unwrap();
    l.commit().await.unwrap();
    out.set(Mode::Hung);
    for (lim, entity) in [(&lim, E), (&lim, "cold"), (&stale, E)] {
        let met = out.refused();
        let t = Instant::now();
        let e = lim.acquire(entity, R, &[("q", 1)]).await.unwrap_err();
        let took = t.elapsed();
        assert!(
            e.is_outage(),
            "{entity}: block must answer unavailable, got {e}"
        );
        assert!(took < BOUND, "{entity}: block answered after {took:?}");
        // One deadline, not one per store call: the first unanswered request decides.
        assert_eq!(
            out.refused() - met,
            1,
            "{entity}: block met the hung store once"
        );
        let met = out.refused();
        let t = Instant::now();
        let mut l = lim
            .acquire_with(entity, R, &[("q", 1)], allow())
            .await
            .unwrap();
        let took = t.elapsed();
        assert!(l.is_degraded(), "{entity}: allow admits degraded");
        assert!(took < BOUND, "{entity}: allow answered after {took:?}");
        assert_eq!(
            out.refused() - met,
            1,
            "{entity}: allow met the hung store once"
        );
        l.commit().await.unwrap();
    }
    assert_eq!(lim.stats().degraded + stale.stats().degraded, 3);
    out.set(Mode::Up);
    let mut l = lim.acquire(E, R, &[("q", 1)]).await.unwrap();
    assert_eq!(
        available(&l, "q"),
        97,
        "the requests that hung charged nothing"
    );
    l.commit().await.unwrap();
}

/// Rule "a hung store is an outage", behind the write gate (docs/rules.md "One rf-locked
/// writer per shard in a process"): 16 concurrent acquires of one full bucket — each one an
/// rf-locked write, all queued on the shard's gate — meet a hung store, and each answers
/// `block` with an outage within the bound: a pass waits for the gate at most one store
/// deadline and then writes ungated, so the last of the queue does not wait out the fifteen
/// deadlines ahead of it (3.2 s).
pub async fn a_hung_store_answers_a_queue_of_writers_within_its_deadline(b: &Backend) {
    const TASKS: usize = 16;
    let out = Arc::new(Outage::new(b.store().await));
    let lim = deadline_limiter(&out, Limit::per_second("rps", 1_000_000_000).unwrap()).await;
    lim.acquire(E, R, &[("rps", 1)])
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    out.set(Mode::Hung);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let lim = lim.clone();
        tasks.spawn(async move {
            let t = Instant::now();
            let r = lim.acquire(E, R, &[("rps", 1)]).await.map(|_| ());
            (r, t.elapsed())
        });
    }
    while let Some(done) = tasks.join_next().await {
        let (r, took) = done.unwrap();
        match r {
            Err(e) => assert!(e.is_outage(), "block must answer unavailable, got {e}"),
            Ok(()) => panic!("a hung store admitted"),
        }
        assert!(took < BOUND, "a queued writer answered after {took:?}");
    }
    out.set(Mode::Up);
    let l = lim.acquire(E, R, &[("rps", 1)]).await.unwrap();
    assert_eq!(
        l.consumed()["rps"],
        1,
        "the acquire after the outage is charged as usual"
    );
}

/// Rule "only an outage fails open": a store that refuses every request as invalid (a
/// missing table, a schema mismatch, a bug) gives `Misconfigured` whatever the policy —
/// the builder's, the request's or the stored system one — and admits nothing; a real
/// outage of the same store does admit under `allow`.
pub async fn a_misconfigured_store_never_fails_open(b: &Backend) {
    let out = Arc::new(Outage::new(b.store().await));
    let lim = Limiter::builder(out.clone())
        .on_unavailable(OnUnavailable::Allow)
        .build()
        .unwrap();
    lim.admin()
        .set_system_limits(&[quota()], Some(OnUnavailable::Allow))
        .await
        .unwrap();
    lim.acquire(E, R, &[("q", 1)])
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    out.set(Mode::Invalid);
    for entity in [E, "cold"] {
        for opts in [AcquireOptions::default(), allow()] {
            match lim.acquire_with(entity, R, &[("q", 1)], opts).await {
                Err(Error::Misconfigured(_)) => {}
                Err(e) => panic!("{entity}: expected Misconfigured, got {e}"),
                Ok(l) => panic!("{entity}: a misconfigured store admitted: {l:?}"),
            }
        }
    }
    assert_eq!(
        lim.stats().degraded,
        0,
        "nothing admitted through a misconfiguration"
    );
    out.set(Mode::Down);
    let l = lim.acquire(E, R, &[("q", 1)]).await.unwrap();
    assert!(l.is_degraded(), "a real outage fails open under allow");
    assert_eq!(lim.stats().degraded, 1);
}

/// Rule "stale-while-error": the store goes down and stays down two hours, far past the
/// config cache's 60 s TTL. The system-wide `allow` still admits — a known entity from its
/// stale config, an entity first seen during the outage from the last-read system policy
/// — and when the store returns the stored limits apply (capacity 3: three admitted, the
/// fourth refused). With stale-while-error off, the same outage refuses (the old
/// "fail-open turns into fail-closed").
pub async fn limits_and_policy_outlive_the_config_ttl(b: &Backend) {
    let out = Arc::new(Outage::new(b.store().await));
    let h = H::new(out.clone(), T0, opts());
    h.lim
        .admin()
        .set_system_limits(&[], Some(OnUnavailable::Allow))
        .await
        .unwrap();
    h.lim
        .admin()
        .set_limits(
            &Scope::Resource(R.into()),
            &[Limit::per_minute("rpm", 3).unwrap()],
        )
        .await
        .unwrap();
    let mut l = h.lim.acquire(E, R, &[("rpm", 1)]).await.unwrap();
    assert_eq!(available(&l, "rpm"), 2);
    l.commit().await.unwrap();
    out.set(Mode::Down);
    h.at(T0 + 2 * 3600 * 1000);
    for entity in [E, "newcomer"] {
        let mut l = h.lim.acquire(entity, R, &[("rpm", 1)]).await.unwrap();
        assert!(l.is_degraded(), "{entity}: allow holds through the outage");
        l.commit().await.unwrap();
    }
    out.set(Mode::Up);
    let mut admitted = 0;
    for _ in 0..4 {
        match h.lim.acquire(E, R, &[("rpm", 1)]).await {
            Ok(mut l) => {
                assert!(!l.is_degraded());
                admitted += 1;
                l.commit().await.unwrap();
            }
            Err(Error::RateLimitExceeded(x)) => assert_eq!(x.violations(), ["rpm"]),
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert_eq!(
        admitted, 3,
        "the stored limits apply when the store returns"
    );

    let out = Arc::new(Outage::new(b.store().await));
    let o = crate::Options {
        config_stale_max: Duration::ZERO,
        ..opts()
    };
    let h = H::new(out.clone(), T0, o);
    h.lim
        .admin()
        .set_system_limits(&[], Some(OnUnavailable::Allow))
        .await
        .unwrap();
    h.lim
        .admin()
        .set_limits(&Scope::Resource(R.into()), &[quota()])
        .await
        .unwrap();
    h.lim
        .acquire(E, R, &[("q", 1)])
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    out.set(Mode::Down);
    h.at(T0 + 2 * 3600 * 1000);
    let e = h.lim.acquire(E, R, &[("q", 1)]).await.unwrap_err();
    assert!(
        e.is_outage(),
        "without stale-while-error the policy is forgotten: {e}"
    );
}
