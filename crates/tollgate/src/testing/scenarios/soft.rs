//! Scenarios 107 and 110 of spec-shards-windows-quotas.md §5.14: soft (non-enforcing)
//! limits (ADR-151), and conservation when a soft limit is enforced again.
#![allow(missing_docs)]

use crate::testing::*;
use crate::{Error, Limit, Scope};

async fn set(h: &H, limits: &[Limit]) {
    h.lim
        .set_limits(&Scope::Entity("e".into(), Some("api".into())), limits, None)
        .await
        .unwrap();
}

fn soft_rpm() -> Limit {
    Limit::per_minute("rpm", 10).unwrap().with_soft(true)
}

/// Scenario 107: a soft `rpm` at `tk = 0` admits an acquire of 3 and goes to −3000, on the
/// warm path and on the slow path; the status reports the debt and no violation.
pub async fn s107_soft_limit_records_and_never_refuses(b: &Backend) {
    for slow in [false, true] {
        let h = b.harness(T0).await;
        set(&h, &[soft_rpm()]).await;
        let lim = if slow { h.slow() } else { h.lim.clone() };
        lim.acquire("e", "api", &[("rpm", 10)]).await.unwrap();
        assert_eq!(h.n("e", "api", 0, "b_rpm_tk"), Some(0));
        let l = lim.acquire("e", "api", &[("rpm", 3)]).await.unwrap();
        assert_eq!(h.n("e", "api", 0, "b_rpm_tk"), Some(-3000), "slow={slow}");
        assert_eq!(h.n("e", "api", 0, "b_rpm_tc"), Some(13_000));
        let st = &l.statuses()[0];
        assert_eq!((st.available, st.exceeded), (-3, false));
        // Deeper still: the soft limit never refuses.
        lim.acquire("e", "api", &[("rpm", 5)]).await.unwrap();
        assert_eq!(h.n("e", "api", 0, "b_rpm_tk"), Some(-8000));
    }
}

/// The exemption is the soft limit's alone: an enforced limit of the same request still
/// refuses, and the refusal names only it.
pub async fn soft_limit_leaves_its_siblings_enforced(b: &Backend) {
    let h = b.harness(T0).await;
    set(&h, &[soft_rpm(), Limit::per_minute("tpm", 100).unwrap()]).await;
    h.lim
        .acquire("e", "api", &[("rpm", 12), ("tpm", 10)])
        .await
        .unwrap();
    assert_eq!(h.n("e", "api", 0, "b_rpm_tk"), Some(-2000));
    for lim in [h.lim.clone(), h.slow()] {
        match lim.acquire("e", "api", &[("rpm", 1), ("tpm", 95)]).await {
            Err(Error::RateLimitExceeded(x)) => assert_eq!(x.violations(), vec!["tpm"]),
            r => panic!("expected tpm to refuse, got {r:?}"),
        }
    }
    assert_eq!(
        h.n("e", "api", 0, "b_rpm_tk"),
        Some(-2000),
        "nothing charged"
    );
    assert_eq!(h.n("e", "api", 0, "b_tpm_tk"), Some(90_000));
}

/// Conservation: the debt a soft limit ran up is what the enforced limit starts from. At
/// −3 tokens and 10/min (one token per 6 s) an acquire of 1 waits 24 s.
pub async fn enforcing_a_soft_limit_keeps_its_debt(b: &Backend) {
    let h = b.harness(T0).await;
    set(&h, &[soft_rpm()]).await;
    h.lim.acquire("e", "api", &[("rpm", 13)]).await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_rpm_tk"), Some(-3000));
    set(&h, &[Limit::per_minute("rpm", 10).unwrap()]).await;
    match h.lim.acquire("e", "api", &[("rpm", 1)]).await {
        Err(Error::RateLimitExceeded(x)) => {
            assert_eq!(x.violations(), vec!["rpm"]);
            assert_eq!(x.retry_after_ms, Some(24_000));
            assert_eq!(x.statuses[0].available, -3);
        }
        r => panic!("expected a refusal, got {r:?}"),
    }
    h.at(T0 + 24_000);
    h.lim.acquire("e", "api", &[("rpm", 1)]).await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_rpm_tk"), Some(0));
    assert_eq!(h.n("e", "api", 0, "b_rpm_tc"), Some(14_000));
    assert!(h.lim.acquire("e", "api", &[("rpm", 1)]).await.is_err());
}

/// Scenario 110: a soft calendar quota in debt (−3000) is reset to its share at the edge
/// (the reset forgives the debt).
pub async fn s110_soft_quota_reset_forgives_debt(b: &Backend) {
    // T0 = 2025-09-04T15:33:20Z; the next UTC midnight is 30,400 s later.
    let midnight = T0 + 30_400_000;
    let h = b.harness(T0).await;
    let q = Limit::quota_calendar("rpd", 10, "0 0 * * *", "UTC")
        .unwrap()
        .with_soft(true);
    set(&h, &[q]).await;
    h.lim.acquire("e", "api", &[("rpd", 13)]).await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_rpd_tk"), Some(-3000));
    h.at(midnight - 1);
    h.lim.acquire("e", "api", &[("rpd", 0)]).await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_rpd_tk"), Some(-3000));
    h.at(midnight);
    h.lim.acquire("e", "api", &[("rpd", 0)]).await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_rpd_tk"), Some(10_000));
}
