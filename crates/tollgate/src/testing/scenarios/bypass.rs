//! Scenarios 108, 109 and 111 of spec-shards-windows-quotas.md §5.14: a bypassed
//! (entity, resource) (ADR-151) admits and records without debiting, opens no window, and a
//! write shaped for bypass that meets an item without the stamp is retried enforced.
#![allow(missing_docs)]

use std::time::Duration;

use crate::testing::*;
use crate::{Enforcement, Error, Limit, Scope};

async fn set(h: &H, limits: &[Limit]) {
    h.lim
        .admin()
        .set_limits(&Scope::Entity("e".into(), Some("api".into())), limits)
        .await
        .unwrap();
}

fn rpm() -> Limit {
    Limit::per_minute("rpm", 10).unwrap()
}

/// Scenario 108: bypassed, an acquire of 5 on a bucket at 0 succeeds; `tk` is unchanged,
/// `tc` +5000, `wcu` debited 1000 — on the warm path in one write and no read, and on the
/// slow path. Enforced again, the balance is what it was (nothing was debited): refused.
pub async fn s108_bypass_records_without_debiting(b: &Backend) {
    for slow in [false, true] {
        let h = b.harness(T0).await;
        set(&h, &[rpm()]).await;
        let lim = if slow { h.slow() } else { h.lim.clone() };
        lim.acquire("e", "api", &[("rpm", 10)]).await.unwrap();
        assert_eq!(h.n("e", "api", 0, "b_rpm_tk"), Some(0));
        assert_eq!(
            h.lim
                .admin()
                .set_enforcement("e", "api", Enforcement::Bypass)
                .await
                .unwrap(),
            1
        );
        let (tc, wcu) = (
            h.n("e", "api", 0, "b_rpm_tc").unwrap(),
            h.n("e", "api", 0, "b_wcu_tk").unwrap(),
        );
        // The first write after the change learns the stamp (this process forgot its
        // images); then every bypassed acquire is one write, no read.
        lim.acquire("e", "api", &[("rpm", 5)]).await.unwrap();
        assert_eq!(h.n("e", "api", 0, "b_rpm_tk"), Some(0), "slow={slow}");
        assert_eq!(h.n("e", "api", 0, "b_rpm_tc"), Some(tc + 5000));
        let s = h.stats();
        let wcu_before = h.n("e", "api", 0, "b_wcu_tk").unwrap();
        let l = lim.acquire("e", "api", &[("rpm", 5)]).await.unwrap();
        assert_eq!(h.n("e", "api", 0, "b_rpm_tk"), Some(0));
        assert_eq!(h.n("e", "api", 0, "b_rpm_tc"), Some(tc + 10_000));
        if !slow {
            let d = h.stats().since(&s);
            assert_eq!((d.writes(), d.reads()), (1, 0), "a warm bypassed acquire");
            assert_eq!(h.n("e", "api", 0, "b_wcu_tk"), Some(wcu_before - 1000));
        }
        assert!(wcu >= h.n("e", "api", 0, "b_wcu_tk").unwrap());
        assert!(!l.statuses()[0].exceeded);
        // A bypassed lease's refund credits nothing (nothing was debited) but `tc`.
        let mut l = lim.acquire("e", "api", &[("rpm", 3)]).await.unwrap();
        l.rollback().await.unwrap();
        assert_eq!(h.n("e", "api", 0, "b_rpm_tk"), Some(0));
        assert_eq!(h.n("e", "api", 0, "b_rpm_tc"), Some(tc + 10_000));
        // Enforcement resumes where it left off: 0 tokens, refused.
        h.lim
            .admin()
            .set_enforcement("e", "api", Enforcement::Enforce)
            .await
            .unwrap();
        match lim.acquire("e", "api", &[("rpm", 1)]).await {
            Err(Error::RateLimitExceeded(x)) => assert_eq!(x.violations(), vec!["rpm"]),
            r => panic!("expected a refusal once enforced, got {r:?}"),
        }
        assert_eq!(h.n("e", "api", 0, "b_rpm_tk"), Some(0));
    }
}

/// Scenario 109: a session quota bypassed from the start (a fresh entity) writes no window
/// start however much is acquired; once bypass is lifted the first enforced acquire opens
/// the window, with the full allowance.
pub async fn s109_bypass_opens_no_window(b: &Backend) {
    let h = b.harness(T0).await;
    let session = Limit::quota_after("session", 10, Duration::from_secs(18_000)).unwrap();
    set(&h, &[session]).await;
    h.lim
        .admin()
        .set_enforcement("e", "api", Enforcement::Bypass)
        .await
        .unwrap();
    for lim in [h.lim.clone(), h.slow()] {
        lim.acquire("e", "api", &[("session", 7)]).await.unwrap();
        lim.acquire("e", "api", &[("session", 7)]).await.unwrap();
    }
    assert_eq!(h.n("e", "api", 0, "b_session_ws"), None, "no window opened");
    assert_eq!(h.n("e", "api", 0, "b_session_tc"), Some(28_000));
    assert_eq!(
        h.n("e", "api", 0, "rq"),
        Some(4),
        "four requests, the create none"
    );
    h.at(T0 + 1000);
    h.lim
        .admin()
        .set_enforcement("e", "api", Enforcement::Enforce)
        .await
        .unwrap();
    h.lim.acquire("e", "api", &[("session", 4)]).await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_session_ws"), Some(T0 + 1000));
    assert_eq!(h.n("e", "api", 0, "b_session_tk"), Some(6000));
    h.lim.acquire("e", "api", &[("session", 6)]).await.unwrap();
    assert!(matches!(
        h.lim.acquire("e", "api", &[("session", 1)]).await,
        Err(Error::RateLimitExceeded(_))
    ));
}

/// Scenario 111: a client whose last image says "bypassed" writes in the bypass shape; on
/// an item that lost the stamp (lifted by another process) the write fails its condition
/// and the acquire is retried enforced — it is charged, and refused once the balance is
/// spent. And the other way round: an enforce-shaped write meets a stamped item, fails, and
/// is written bypass-shaped (no balance debited). Either way the retry is the slow pass,
/// which confirms the mode with a consistent read before it trusts the stamp.
pub async fn s111_a_bypass_write_needs_the_stamp(b: &Backend) {
    let h = b.harness(T0).await;
    set(&h, &[rpm()]).await;
    h.lim.acquire("e", "api", &[("rpm", 1)]).await.unwrap();
    h.lim
        .admin()
        .set_enforcement("e", "api", Enforcement::Bypass)
        .await
        .unwrap();
    h.lim.acquire("e", "api", &[("rpm", 1)]).await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_rpm_tk"), Some(9000));
    // Another process lifts the bypass: this client's image still says "bypassed".
    h.slow()
        .admin()
        .set_enforcement("e", "api", Enforcement::Enforce)
        .await
        .unwrap();
    let s = h.stats();
    h.lim.acquire("e", "api", &[("rpm", 2)]).await.unwrap();
    let d = h.stats().since(&s);
    assert_eq!(
        d.writes(),
        2,
        "the bypass-shaped write failed, the enforced one landed"
    );
    assert_eq!(h.n("e", "api", 0, "b_rpm_tk"), Some(7000), "charged");
    h.lim.acquire("e", "api", &[("rpm", 7)]).await.unwrap();
    assert!(matches!(
        h.lim.acquire("e", "api", &[("rpm", 1)]).await,
        Err(Error::RateLimitExceeded(_))
    ));
    // The other way: bypassed by another process while this client saw it enforced (past
    // its rejection cache's 1 s: a refusal it just made stands that long, ADR-147).
    h.at(T0 + 1001);
    h.slow()
        .admin()
        .set_enforcement("e", "api", Enforcement::Bypass)
        .await
        .unwrap();
    let s = h.stats();
    h.lim.acquire("e", "api", &[("rpm", 4)]).await.unwrap();
    assert_eq!(h.stats().since(&s).writes(), 2);
    // The stamp disagreed with this client's config: the second write was the slow
    // pass (after a re-read confirmed the mode), which materialised the 1,001 ms of
    // refill (166 millitokens) and debited nothing.
    assert_eq!(h.n("e", "api", 0, "b_rpm_tk"), Some(166), "nothing debited");
    // Disabled outranks: refused, nothing written.
    h.slow()
        .admin()
        .set_enforcement("e", "api", Enforcement::Disabled)
        .await
        .unwrap();
    assert!(matches!(
        h.lim.acquire("e", "api", &[("rpm", 1)]).await,
        Err(Error::ResourceDisabled { .. })
    ));
}

/// A bypassed entity grows its shards bypassed (shard 0's stamp), and its audit trail
/// records each change with the mode before and after.
pub async fn bypass_reaches_new_shards_and_is_audited(b: &Backend) {
    let h = b.harness(T0).await;
    set(&h, &[rpm()]).await;
    h.lim.acquire("e", "api", &[("rpm", 10)]).await.unwrap();
    h.lim
        .admin()
        .set_enforcement("e", "api", Enforcement::Bypass)
        .await
        .unwrap();
    h.lim.admin().bump_shard_count("e", "api", 1).await.unwrap();
    h.rng.pin(1);
    h.lim.acquire("e", "api", &[("rpm", 2)]).await.unwrap();
    assert!(h.item("e", "api", 1).contains_key("bypass"));
    let page = h
        .lim
        .audit_log(&crate::AuditQuery {
            entity: Some("e".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let rec = page
        .records
        .iter()
        .find(|r| r.action == crate::Action::Enforcement)
        .expect("an enforcement record");
    assert_eq!(rec.after["enforcement"], "bypass");
    assert_eq!(rec.before["enforcement"], "enforce");
}
