//! Cascade (ADR-143/144/146; spec §4.17, §5.4 scenario 33, §5.15 scenario 115;
//! history-and-scenarios.md §5.2 Q13, W6, C2–C4): a child whose effective policy cascades
//! also spends from its parent, each on its own bucket, shards and windows.
#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::time::Duration;

use crate::testing::*;
use crate::{Error, Limit, NewEntity, Scope};
use tollgate_core::value::Value;

const C: &str = "team";
const P: &str = "org";
const G: &str = "holding";
const R: &str = "llm";

fn session() -> Limit {
    Limit::quota_after("session", 10, Duration::from_secs(18_000)).unwrap()
}

fn rpd() -> Limit {
    Limit::quota_calendar("rpd", 1000, "0 0 * * *", "UTC").unwrap()
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

/// The child `team` under `org`, both limited by `limits` at their own entity level.
async fn family(h: &H, cascade: bool, child: &[Limit], parent: &[Limit]) {
    entity(h, P, None, false).await;
    entity(h, C, Some(P), cascade).await;
    for (e, l) in [(C, child), (P, parent)] {
        h.lim
            .admin()
            .set_limits(&Scope::Entity(e.into(), Some(R.into())), l)
            .await
            .unwrap();
    }
}

fn stamp(h: &H, e: &str) -> Option<Value> {
    h.item(e, R, 0).get("cascade").cloned()
}

fn exists(h: &H, e: &str, shard: u32) -> bool {
    h.raw.raw_get(&h.key(e, R, shard)).is_some()
}

/// Scenario 33 (W6): parent and child windows anchor independently. The parent is first
/// used at T0 − 1 h, the child at T0; both are doubled to 2; at T0 + 60,000 one cascade
/// acquire creates shard 1 of both: the parent's joins the parent's own shard 0 window
/// (ws = T0 − 1 h), the child's joins the child's (ws = T0).
pub async fn s33_w6_cascade_windows_anchor_independently(b: &Backend) {
    let h = b.harness(T0 - 3_600_000).await;
    family(&h, true, &[session()], &[session()]).await;
    h.lim.acquire(P, R, &[("session", 1)]).await.unwrap();
    h.at(T0);
    h.lim.acquire(C, R, &[("session", 1)]).await.unwrap();
    assert_eq!(h.n(P, R, 0, "b_session_ws"), Some(T0 - 3_600_000));
    assert_eq!(h.n(C, R, 0, "b_session_ws"), Some(T0));
    assert_eq!(
        h.n(P, R, 0, "b_session_tk"),
        Some(8000),
        "the child's use debited the parent"
    );
    for e in [C, P] {
        assert_eq!(h.lim.admin().bump_shard_count(e, R, 1).await.unwrap(), 2);
    }
    h.at(T0 + 60_000);
    h.rng.pin(1);
    h.lim.acquire(C, R, &[("session", 1)]).await.unwrap();
    assert_eq!(h.n(P, R, 1, "b_session_ws"), Some(T0 - 3_600_000));
    assert_eq!(h.n(C, R, 1, "b_session_ws"), Some(T0));
    assert_eq!(h.n(P, R, 1, "b_session_tc"), Some(1000));
    assert_eq!(h.n(C, R, 1, "b_session_tc"), Some(1000));
    assert_eq!(h.spendable(P, R, "session", 2), 7);
    assert_eq!(h.spendable(C, R, "session", 2), 8);
}

/// Q13: child and parent (quota rpd 1000, cron "0 0 * * *", doubled to 2) both get a new
/// quota shard in one acquire, each funded by a move from its own shard 0: both end at
/// [500, 499]. Departure: each side commits its own transaction (Put + Update), so the
/// acquire makes two transactions, not one carrying "Put, Put, Update, Update".
pub async fn q13_cascade_quota_shards(b: &Backend) {
    let h = b.harness(T0).await;
    family(&h, true, &[rpd()], &[rpd()]).await;
    h.lim.acquire(C, R, &[("rpd", 0)]).await.unwrap();
    for e in [C, P] {
        assert_eq!(h.tks(e, R, "rpd", 1), vec![1_000_000]);
        h.lim.admin().bump_shard_count(e, R, 1).await.unwrap();
    }
    h.rng.pin(1);
    let s = h.stats();
    h.lim.acquire(C, R, &[("rpd", 1)]).await.unwrap();
    assert_eq!(h.stats().since(&s).transactions, 2);
    for e in [C, P] {
        assert_eq!(h.tks(e, R, "rpd", 2), vec![500_000, 499_000], "{e}");
        assert_eq!(h.n(e, R, 1, "b_rpd_gc"), Some(2), "{e}");
    }
}

/// C2: the parent draws its own shard from its own count (#474), not the child's; an
/// exhausted parent shard is probed past, never handed to the slow path.
pub async fn c2_parent_draws_its_own_shard(b: &Backend) {
    let h = b.harness(T0).await;
    let rpm = [Limit::per_minute("rpm", 100).unwrap()];
    family(&h, true, &rpm, &rpm).await;
    h.lim.acquire(P, R, &[("rpm", 0)]).await.unwrap();
    h.lim.admin().bump_shard_count(P, R, 1).await.unwrap();
    h.rng.pin(1);
    h.lim.acquire(P, R, &[("rpm", 0)]).await.unwrap(); // creates the parent's shard 1
    h.rng.pin(0);
    h.lim.acquire(P, R, &[("rpm", 0)]).await.unwrap(); // shard 0 shrinks to its share
    assert_eq!(h.tks(P, R, "rpm", 2), vec![50_000, 50_000]);
    h.rng.pin(1);
    h.lim.acquire(C, R, &[("rpm", 1)]).await.unwrap();
    assert_eq!(
        h.tks(C, R, "rpm", 1),
        vec![99_000],
        "the child has one shard"
    );
    assert_eq!(
        h.tks(P, R, "rpm", 2),
        vec![50_000, 49_000],
        "parent shard 1 drawn"
    );
    // The drawn parent shard is empty: the parent's fast path probes its shard 0.
    h.set_n(P, R, 1, "b_rpm_tk", 0);
    let s = h.lim.stats();
    h.lim.acquire(C, R, &[("rpm", 1)]).await.unwrap();
    assert_eq!(h.tks(P, R, "rpm", 2), vec![49_000, 0]);
    assert_eq!(h.tks(C, R, "rpm", 1), vec![98_000]);
    assert_eq!(h.lim.stats().slow_admits, s.slow_admits, "no slow path");
}

/// C3 and scenario 115: the policy walk entity×resource → entity `_default_` → resource,
/// then the META flag; the effective policy is stamped on the bucket item; an entity
/// without a parent never cascades.
pub async fn c3_s115_policy_walk(b: &Backend) {
    let h = b.harness(T0).await;
    let tpd = [Limit::per_day("tpd", 100).unwrap()];
    family(&h, true, &tpd, &tpd).await;
    // 115: META cascade = true, resource config cascade = false → no parent debit.
    h.lim
        .admin()
        .set_cascade(&Scope::Resource(R.into()), Some(false))
        .await
        .unwrap();
    h.lim.acquire(C, R, &[("tpd", 1)]).await.unwrap();
    assert!(!exists(&h, P, 0), "the parent was not debited");
    assert_eq!(stamp(&h, C), Some(Value::Bool(false)));
    // Replacing the resource's limits keeps its cascade policy.
    h.lim
        .admin()
        .set_limits(&Scope::Resource(R.into()), &tpd)
        .await
        .unwrap();
    h.lim.acquire(C, R, &[("tpd", 1)]).await.unwrap();
    assert!(!exists(&h, P, 0));
    // The entity `_default_` level outranks the resource level.
    h.lim
        .admin()
        .set_cascade(&Scope::Entity(C.into(), None), Some(true))
        .await
        .unwrap();
    h.lim.acquire(C, R, &[("tpd", 1)]).await.unwrap();
    assert_eq!(h.tks(P, R, "tpd", 1), vec![99_000]);
    assert_eq!(
        stamp(&h, P),
        Some(Value::Bool(false)),
        "the parent's own policy"
    );
    h.slow().acquire(C, R, &[("tpd", 1)]).await.unwrap(); // a slow write restamps
    assert_eq!(stamp(&h, C), Some(Value::Bool(true)));
    assert_eq!(h.tks(P, R, "tpd", 1), vec![98_000]);
    // The entity × resource level outranks both.
    h.lim
        .admin()
        .set_cascade(&Scope::Entity(C.into(), Some(R.into())), Some(false))
        .await
        .unwrap();
    h.lim.acquire(C, R, &[("tpd", 1)]).await.unwrap();
    assert_eq!(h.tks(P, R, "tpd", 1), vec![98_000]);
    assert_eq!(h.tks(C, R, "tpd", 1), vec![95_000]);
    // Unset everywhere: the META flag decides.
    for s in [
        Scope::Entity(C.into(), Some(R.into())),
        Scope::Entity(C.into(), None),
        Scope::Resource(R.into()),
    ] {
        h.lim.admin().set_cascade(&s, None).await.unwrap();
    }
    h.lim.acquire(C, R, &[("tpd", 1)]).await.unwrap();
    assert_eq!(h.tks(P, R, "tpd", 1), vec![97_000]);
    // An entity without a parent never cascades, whatever its flags say.
    entity(&h, "solo", None, true).await;
    h.lim
        .admin()
        .set_cascade(&Scope::Entity("solo".into(), None), Some(true))
        .await
        .unwrap();
    h.lim.acquire("solo", R, &[("tpd", 1)]).await.unwrap();
    assert_eq!(stamp(&h, "solo"), Some(Value::Bool(false)));
    // An entity created after its META was read (and cached as absent) cascades at once.
    h.lim.acquire("late", R, &[("tpd", 1)]).await.unwrap();
    entity(&h, "late", Some(P), true).await;
    h.lim.acquire("late", R, &[("tpd", 1)]).await.unwrap();
    assert_eq!(h.tks(P, R, "tpd", 1), vec![96_000]);
    // Deleting a level's limits keeps its cascade policy.
    h.lim
        .admin()
        .set_cascade(&Scope::Resource(R.into()), Some(false))
        .await
        .unwrap();
    assert!(h
        .lim
        .admin()
        .delete_limits(&Scope::Resource(R.into()))
        .await
        .unwrap());
    h.lim.acquire(C, R, &[("tpd", 1)]).await.unwrap();
    assert_eq!(h.tks(P, R, "tpd", 1), vec![96_000]);
    assert!(matches!(
        h.lim.admin().set_cascade(&Scope::System, Some(true)).await,
        Err(Error::Invalid(_))
    ));
}

/// C4: a child lease never debits the grandparent (the parent's own policy cascades only
/// its own acquires), and a disabled parent raises ResourceDisabled naming the parent, with
/// the child's debit rolled back.
pub async fn c4_no_grandparent_and_disabled_parent(b: &Backend) {
    let h = b.harness(T0).await;
    let tpd = [Limit::per_day("tpd", 100).unwrap()];
    entity(&h, G, None, false).await;
    entity(&h, P, Some(G), true).await;
    entity(&h, C, Some(P), true).await;
    h.lim
        .admin()
        .set_limits(&Scope::Resource(R.into()), &tpd)
        .await
        .unwrap();
    h.lim.acquire(P, R, &[("tpd", 1)]).await.unwrap();
    assert_eq!(
        h.tks(G, R, "tpd", 1),
        vec![99_000],
        "the parent's own cascade"
    );
    let mut l = h.lim.acquire(C, R, &[("tpd", 2)]).await.unwrap();
    assert_eq!(l.parent().map(|p| p.entity()), Some(P));
    assert!(l.parent().and_then(|p| p.parent()).is_none());
    l.adjust("tpd", 3).unwrap();
    l.commit().await.unwrap();
    assert_eq!(h.tks(C, R, "tpd", 1), vec![95_000]);
    assert_eq!(h.tks(P, R, "tpd", 1), vec![94_000]);
    assert_eq!(h.tks(G, R, "tpd", 1), vec![99_000], "never the grandparent");
    // A disabled parent refuses the child's acquire, naming the parent.
    h.lim.admin().set_disabled(P, R, true).await.unwrap();
    let e = h.lim.acquire(C, R, &[("tpd", 1)]).await.unwrap_err();
    assert!(
        matches!(&e, Error::ResourceDisabled { entity, .. } if entity == P),
        "{e}"
    );
    assert_eq!(
        h.tks(C, R, "tpd", 1),
        vec![95_000],
        "the child's debit rolled back"
    );
    assert_eq!(h.n(C, R, 0, "b_tpd_tc"), Some(5000));
}

/// Both must admit: a parent short of tokens refuses the cascade acquire, the refusal
/// names the parent, and the child is not charged (its balance and counter are restored
/// exactly). `check_availability` says the same, side by side.
pub async fn cascade_parent_short_charges_no_child(b: &Backend) {
    let h = b.harness(T0).await;
    family(
        &h,
        true,
        &[Limit::per_day("tpd", 100).unwrap()],
        &[Limit::per_day("tpd", 3).unwrap()],
    )
    .await;
    h.lim.acquire(C, R, &[("tpd", 2)]).await.unwrap();
    assert_eq!(h.tks(C, R, "tpd", 1), vec![98_000]);
    assert_eq!(h.tks(P, R, "tpd", 1), vec![1000]);
    let a = h.lim.check_availability(C, R, &[("tpd", 2)]).await.unwrap();
    assert!(!a.allowed);
    assert!(a.limits.iter().all(|s| !s.exceeded), "the child could");
    let pa = a.parent.as_deref().unwrap();
    assert_eq!((pa.entity.as_str(), pa.allowed), (P, false));
    assert!(pa.limits.iter().any(|s| s.exceeded));
    assert_eq!(a.retry_after_ms, pa.retry_after_ms);
    for lim in [h.lim.clone(), h.slow()] {
        let e = lim.acquire(C, R, &[("tpd", 2)]).await.unwrap_err();
        let x = e.exceeded().expect("a refusal");
        assert_eq!(x.entity, P, "the refusal names the parent");
        assert_eq!(x.violations(), vec!["tpd"]);
        assert_eq!(h.tks(C, R, "tpd", 1), vec![98_000]);
        assert_eq!(h.n(C, R, 0, "b_tpd_tc"), Some(2000));
        assert_eq!(h.tks(P, R, "tpd", 1), vec![1000]);
    }
    // Usage: one admitted acquire; the refused ones took back the request they counted.
    assert_eq!(
        h.n(C, R, 0, "rq"),
        Some(1),
        "refused cascade acquires count no request"
    );
    assert_eq!(h.n(P, R, 0, "rq"), Some(1));
    // The parent's refusal is cached (ADR-147): the next cascade acquire is refused before
    // the child is written, with no store request at all.
    let s = h.stats();
    let x = h.lim.acquire(C, R, &[("tpd", 2)]).await.unwrap_err();
    assert_eq!(x.exceeded().map(|x| x.entity.as_str()), Some(P));
    assert_eq!(h.stats().since(&s).total(), 0);
    assert_eq!(h.tks(C, R, "tpd", 1), vec![98_000]);
    // A limit the parent does not have is the child's alone.
    h.lim
        .admin()
        .set_limits(
            &Scope::Entity(C.into(), Some(R.into())),
            &[
                Limit::per_day("tpd", 100).unwrap(),
                Limit::per_minute("rpm", 10).unwrap(),
            ],
        )
        .await
        .unwrap();
    h.lim
        .acquire(C, R, &[("tpd", 1), ("rpm", 1)])
        .await
        .unwrap();
    assert_eq!(h.tks(P, R, "tpd", 1), vec![0]);
    assert!(h.n(P, R, 0, "b_rpm_tk").is_none());
}

/// A cascade lease's rollback restores both buckets exactly (balance and counter), and its
/// adjustments reach both.
pub async fn cascade_lease_rollback_restores_both(b: &Backend) {
    let h = b.harness(T0).await;
    let tpd = [Limit::per_day("tpd", 10).unwrap()];
    family(&h, true, &tpd, &tpd).await;
    let mut a = h.lim.acquire(C, R, &[("tpd", 2)]).await.unwrap();
    a.commit().await.unwrap();
    for e in [C, P] {
        assert_eq!(h.tks(e, R, "tpd", 1), vec![8000]);
    }
    let mut l = h.lim.acquire(C, R, &[("tpd", 5)]).await.unwrap();
    l.adjust("tpd", 2).unwrap();
    for e in [C, P] {
        assert_eq!(h.tks(e, R, "tpd", 1), vec![3000]);
    }
    l.rollback().await.unwrap();
    for e in [C, P] {
        assert_eq!(h.tks(e, R, "tpd", 1), vec![8000], "{e}");
        assert_eq!(h.n(e, R, 0, "b_tpd_tc"), Some(2000), "{e}");
    }
    assert!(matches!(l.commit().await, Err(Error::LeaseClosed)));
    let mut l = h.lim.acquire(C, R, &[("tpd", 1)]).await.unwrap();
    l.adjust("tpd", -1).unwrap();
    l.commit().await.unwrap();
    for e in [C, P] {
        assert_eq!(h.tks(e, R, "tpd", 1), vec![8000], "{e}");
    }
}

/// ADR-146, both admit or nothing is kept: when the parent refuses and the child's
/// rollback is throttled (it certainly did not apply), the rollback is retried and the
/// child ends exactly as before (the simulator saw child debits stuck after one try).
pub async fn cascade_child_undo_survives_a_throttle(b: &Backend) {
    let h = b.harness(T0).await;
    family(
        &h,
        true,
        &[Limit::per_day("tpd", 100).unwrap()],
        &[Limit::per_day("tpd", 3).unwrap()],
    )
    .await;
    h.lim.acquire(C, R, &[("tpd", 2)]).await.unwrap();
    assert_eq!(h.tks(C, R, "tpd", 1), vec![98_000]);
    // The child's next updates: 1 = its debit, 2 = the rollback (throttled once).
    let key = h.key(C, R, 0);
    let nth = std::sync::atomic::AtomicI64::new(2);
    let on_update = move |r: &tollgate_store::UpdateRequest| {
        (r.key == key && nth.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) == 1)
            .then(|| tollgate_store::StoreError::Throttled("injected".into()))
    };
    let store = std::sync::Arc::new(crate::testing::intercept::Intercept::new(
        h.raw.clone(),
        Box::new(on_update),
        Box::new(|_| None),
    ));
    let lim = crate::Limiter::builder(store)
        .clock(h.clock.clone())
        .rng(h.rng.clone())
        .options(crate::Options {
            speculative: false,
            ..opts()
        })
        .build()
        .unwrap();
    let e = lim.acquire(C, R, &[("tpd", 2)]).await.unwrap_err();
    assert_eq!(e.exceeded().map(|x| x.entity.as_str()), Some(P));
    assert_eq!(
        h.tks(C, R, "tpd", 1),
        vec![98_000],
        "the child's debit undone"
    );
    assert_eq!(h.n(C, R, 0, "b_tpd_tc"), Some(2000));
}

/// C3, cascade turned on by another process: client 1 has cached "no cascade" for the child;
/// client 2 (its own caches) turns cascade on and acquires, stamping the child's item. Client
/// 1's next acquire sees the stamp on the item its fast write returned, re-reads the config
/// once and adds the parent write: the parent is charged exactly once. From then on its
/// cache agrees and a warm cascade acquire is one write per side, no read.
pub async fn c3_stamp_adds_the_missing_parent_write(b: &Backend) {
    let h = b.harness(T0).await;
    let tpd = [Limit::per_day("tpd", 100).unwrap()];
    family(&h, false, &tpd, &tpd).await;
    let other = h.slow();
    for _ in 0..2 {
        h.lim.acquire(C, R, &[("tpd", 1)]).await.unwrap();
    }
    assert!(!exists(&h, P, 0));
    other
        .admin()
        .set_cascade(&Scope::Entity(C.into(), Some(R.into())), Some(true))
        .await
        .unwrap();
    other.acquire(C, R, &[("tpd", 1)]).await.unwrap();
    assert_eq!(stamp(&h, C), Some(Value::Bool(true)));
    assert_eq!(h.tks(P, R, "tpd", 1), vec![99_000]);
    // Client 1, cache still "no cascade": corrected once.
    let s = h.stats();
    h.lim.acquire(C, R, &[("tpd", 1)]).await.unwrap();
    let d = h.stats().since(&s);
    assert_eq!(
        h.tks(P, R, "tpd", 1),
        vec![98_000],
        "the parent charged once"
    );
    assert_eq!(h.tks(C, R, "tpd", 1), vec![96_000]);
    // The child write, then the parent's: reads for the re-read, the parent's config and
    // the parent's item (this client never saw it); the stamp agreed with the answer, so
    // no restamp.
    assert_eq!((d.writes(), d.reads()), (2, 3), "{d:?}");
    // Warm and agreeing: one write per side, no read.
    let s = h.stats();
    h.lim.acquire(C, R, &[("tpd", 1)]).await.unwrap();
    let d = h.stats().since(&s);
    assert_eq!((d.writes(), d.reads()), (2, 0), "{d:?}");
    assert_eq!(h.tks(P, R, "tpd", 1), vec![97_000]);
    assert_eq!(h.tks(C, R, "tpd", 1), vec![95_000]);
}

/// C3, the added parent write refuses: the child's debit is rolled back exactly, as for a
/// planned parent write.
pub async fn c3_an_added_parent_write_that_refuses_rolls_the_child_back(b: &Backend) {
    let h = b.harness(T0).await;
    family(
        &h,
        false,
        &[Limit::per_day("tpd", 100).unwrap()],
        &[Limit::per_day("tpd", 1).unwrap()],
    )
    .await;
    let other = h.slow();
    h.lim.acquire(C, R, &[("tpd", 1)]).await.unwrap();
    other
        .admin()
        .set_cascade(&Scope::Entity(C.into(), Some(R.into())), Some(true))
        .await
        .unwrap();
    other.acquire(C, R, &[("tpd", 1)]).await.unwrap(); // the parent's one token
    assert_eq!(h.tks(P, R, "tpd", 1), vec![0]);
    assert_eq!(h.tks(C, R, "tpd", 1), vec![98_000]);
    let r = h.lim.acquire(C, R, &[("tpd", 1)]).await;
    assert!(matches!(r, Err(Error::RateLimitExceeded(_))), "{r:?}");
    assert_eq!(h.tks(C, R, "tpd", 1), vec![98_000], "the child rolled back");
    assert_eq!(h.tks(P, R, "tpd", 1), vec![0]);
}

/// C3, cascade turned off by another process: client 1 has cached "cascade"; client 2
/// turns it off and acquires (stamp false). Client 1's next acquire re-reads once and
/// leaves the parent write out: no parent debit remains.
pub async fn c3_stamp_drops_the_parent_write(b: &Backend) {
    let h = b.harness(T0).await;
    let tpd = [Limit::per_day("tpd", 100).unwrap()];
    family(&h, true, &tpd, &tpd).await;
    let other = h.slow();
    for _ in 0..2 {
        h.lim.acquire(C, R, &[("tpd", 1)]).await.unwrap();
    }
    assert_eq!(h.tks(P, R, "tpd", 1), vec![98_000]);
    other
        .admin()
        .set_cascade(&Scope::Entity(C.into(), Some(R.into())), Some(false))
        .await
        .unwrap();
    other.acquire(C, R, &[("tpd", 1)]).await.unwrap();
    assert_eq!(stamp(&h, C), Some(Value::Bool(false)));
    let s = h.stats();
    h.lim.acquire(C, R, &[("tpd", 1)]).await.unwrap();
    let d = h.stats().since(&s);
    assert_eq!(h.tks(P, R, "tpd", 1), vec![98_000], "no parent debit");
    assert_eq!(h.tks(C, R, "tpd", 1), vec![96_000]);
    assert_eq!((d.writes(), d.reads()), (1, 1), "{d:?}");
    let s = h.stats();
    h.lim.acquire(C, R, &[("tpd", 1)]).await.unwrap();
    let d = h.stats().since(&s);
    assert_eq!((d.writes(), d.reads()), (1, 0), "{d:?}");
    assert_eq!(h.tks(P, R, "tpd", 1), vec![98_000]);
}

/// C3, a stamp older than the cache (config changes restamp no bucket, the fast path
/// writes no stamp): it asks for one re-read, whose answer confirms the cache and is
/// stamped on the shard; nothing else changes and nothing loops.
pub async fn c3_a_stale_stamp_is_questioned_once(b: &Backend) {
    let h = b.harness(T0).await;
    let tpd = [Limit::per_day("tpd", 100).unwrap()];
    family(&h, false, &tpd, &tpd).await;
    h.lim.acquire(C, R, &[("tpd", 1)]).await.unwrap();
    h.lim
        .admin()
        .set_cascade(&Scope::Entity(C.into(), Some(R.into())), Some(true))
        .await
        .unwrap();
    h.lim.acquire(C, R, &[("tpd", 1)]).await.unwrap();
    assert_eq!(h.tks(P, R, "tpd", 1), vec![99_000], "charged once");
    assert_eq!(stamp(&h, C), Some(Value::Bool(true)), "restamped");
    for i in 0..3 {
        let s = h.stats();
        h.lim.acquire(C, R, &[("tpd", 1)]).await.unwrap();
        let d = h.stats().since(&s);
        assert_eq!((d.writes(), d.reads()), (2, 0), "{d:?}");
        assert_eq!(h.tks(P, R, "tpd", 1), vec![98_000 - i * 1000]);
    }
}
