//! Scenarios 107 and 110 of spec-shards-windows-quotas.md §5.14: soft (non-enforcing)
//! limits (ADR-151), and conservation when a soft limit is enforced again.
#![allow(missing_docs)]

use crate::testing::*;
use crate::{Error, Limit, Scope};

async fn set(h: &H, limits: &[Limit]) {
    h.lim
        .admin()
        .set_limits(&Scope::Entity("e".into(), Some("api".into())), limits)
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

/// The overdraw (milli) and consumption (milli) of `rpm` in the hourly snapshot of
/// `e`/`api`, as the aggregator has stored it.
async fn rpm_usage(h: &H) -> (i64, i64) {
    let page = h
        .lim
        .usage(&crate::UsageQuery {
            entity: Some("e".into()),
            resource: Some("api".into()),
            window: Some(crate::Window::Hourly),
            ..crate::UsageQuery::default()
        })
        .await
        .expect("usage query");
    let s = page.snapshots.first().expect("one hourly snapshot");
    let get = |m: &std::collections::BTreeMap<String, i64>| m.get("rpm").copied().unwrap_or(0);
    (get(&s.overdraw), get(&s.milli))
}

/// Scenario 107 in usage (ADR-151 `{limit}#od`): a soft `rpm` spent to `tk = 0` admits an
/// acquire of 3 (tk −3000) and the snapshot's overdraw grows by 3 tokens; what stayed above
/// zero is no overdraw. A lease refund of 2 out of a later debt lowers consumption, not
/// overdraw. Counted once: a restarted aggregator (a new one on the same checkpoint) adds
/// nothing.
pub async fn s107_overdraw_in_usage(b: &Backend) {
    let h = b.harness(T0).await;
    let Some(feed) = h.raw.clone().change_feed() else {
        return;
    };
    let opts = crate::UsageOptions {
        windows: vec![crate::Window::Hourly],
        ..crate::UsageOptions::default()
    };
    let agg = crate::FeedAggregator::new(&h.lim, feed.clone(), opts.clone()).unwrap();
    set(&h, &[soft_rpm()]).await;
    h.lim.acquire("e", "api", &[("rpm", 10)]).await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_rpm_tk"), Some(0));
    agg.pass().await.unwrap();
    assert_eq!(
        rpm_usage(&h).await,
        (0, 10_000),
        "the capacity is not overdraw"
    );
    h.lim.acquire("e", "api", &[("rpm", 3)]).await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_rpm_tk"), Some(-3000));
    agg.pass().await.unwrap();
    assert_eq!(rpm_usage(&h).await, (3000, 13_000), "scenario 107: += 3");
    // Deeper on the slow path, then part of that debt refunded by an adjustment.
    let mut l = h.slow().acquire("e", "api", &[("rpm", 4)]).await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_rpm_tk"), Some(-7000));
    l.adjust("rpm", -2).unwrap();
    l.commit().await.unwrap();
    assert_eq!(h.n("e", "api", 0, "b_rpm_tk"), Some(-5000));
    agg.pass().await.unwrap();
    assert_eq!(
        rpm_usage(&h).await,
        (7000, 15_000),
        "the refund lowers consumption; the overdraw it repaid stays counted"
    );
    // A restarted aggregator resumes from the stored checkpoint: nothing twice.
    let again = crate::FeedAggregator::new(&h.lim, feed, opts).unwrap();
    assert_eq!(again.pass().await.unwrap().usage_changes, 0);
    assert_eq!(rpm_usage(&h).await, (7000, 15_000));
}
