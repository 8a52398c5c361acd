//! Scenarios 92–95 of spec-shards-windows-quotas.md §5.11: multi-resource acquire
//! (ADR-148), all or none.
#![allow(missing_docs)]

use crate::testing::*;
use crate::{Error, Limit, MultiLease, Scope};
use tollgate_core::RuleError;

async fn rpm(h: &H, e: &str, r: &str, n: i64) {
    h.lim
        .admin()
        .set_limits(
            &Scope::Entity(e.into(), Some(r.into())),
            &[Limit::per_minute("rpm", n).unwrap()],
        )
        .await
        .unwrap();
}

fn both(h: &H, e: &str, r: &str) -> (Option<i64>, Option<i64>) {
    (h.n(e, r, 0, "b_rpm_tk"), h.n(e, r, 0, "b_rpm_tc"))
}

fn refused(r: Result<MultiLease, Error>) -> Error {
    match r {
        Err(e) => e,
        Ok(l) => panic!("expected a refusal, got {l:?}"),
    }
}

/// Scenario 92: `b` exhausted → `RateLimitExceeded` for `b`, and `a`'s balance and `tc` are
/// what they were before the call (its landed debit refunded), on the warm path and on the
/// slow path alike.
pub async fn s92_exhausted_resource_refunds_the_others(b: &Backend) {
    let h = b.harness(T0).await;
    rpm(&h, "e", "a", 10).await;
    rpm(&h, "e", "b", 10).await;
    h.lim.acquire("e", "a", &[("rpm", 2)]).await.unwrap();
    h.lim.acquire("e", "b", &[("rpm", 10)]).await.unwrap();
    assert_eq!(both(&h, "e", "a"), (Some(8000), Some(2000)));
    assert_eq!(both(&h, "e", "b"), (Some(0), Some(10_000)));
    for lim in [h.lim.clone(), h.slow()] {
        let e = refused(
            lim.acquire_many("e", &[("a", &[("rpm", 1)]), ("b", &[("rpm", 1)])])
                .await,
        );
        let x = e.exceeded().expect("a refusal");
        assert_eq!((x.entity.as_str(), x.resource.as_str()), ("e", "b"));
        assert_eq!(x.violations(), vec!["rpm"]);
        assert_eq!(x.retry_after_ms, Some(6000));
        assert_eq!(both(&h, "e", "a"), (Some(8000), Some(2000)), "a refunded");
        assert_eq!(both(&h, "e", "b"), (Some(0), Some(10_000)));
    }
    // Admitted, both are charged; a rollback refunds both exactly.
    h.at(T0 + 6000);
    let mut l = h
        .lim
        .acquire_many("e", &[("a", &[("rpm", 1)]), ("b", &[("rpm", 1)])])
        .await
        .unwrap();
    assert_eq!(l.resources(), vec!["a", "b"]);
    assert_eq!(l.lease("b").unwrap().consumed()["rpm"], 1);
    assert_eq!(h.n("e", "a", 0, "b_rpm_tc"), Some(3000));
    assert_eq!(h.n("e", "b", 0, "b_rpm_tc"), Some(11_000));
    l.rollback().await.unwrap();
    assert_eq!(h.n("e", "a", 0, "b_rpm_tc"), Some(2000));
    assert_eq!(h.n("e", "b", 0, "b_rpm_tc"), Some(10_000));
    assert!(matches!(l.rollback().await, Err(Error::LeaseClosed)));
}

/// Scenario 93: 17 resources are refused (cap 16) before any store request; 16 pass.
pub async fn s93_seventeen_resources_are_refused(b: &Backend) {
    let h = b.harness(T0).await;
    let names: Vec<String> = (0..17).map(|i| format!("r{i}")).collect();
    for n in &names {
        rpm(&h, "e", n, 5).await;
    }
    let one: &[(&str, i64)] = &[("rpm", 1)];
    let wants: Vec<(&str, &[(&str, i64)])> = names.iter().map(|n| (n.as_str(), one)).collect();
    let s = h.stats();
    let e = refused(h.lim.acquire_many("e", &wants).await);
    assert!(
        matches!(
            e,
            Error::Invalid(RuleError::InvalidResourceSet { count: 17, .. })
        ),
        "{e}"
    );
    assert_eq!(h.stats().since(&s).total(), 0, "refused before the store");
    let e = refused(h.lim.acquire_many("e", &[wants[0], wants[0]]).await);
    assert!(matches!(
        e,
        Error::Invalid(RuleError::InvalidResourceSet { count: 2, .. })
    ));
    let mut l = h.lim.acquire_many("e", &wants[..16]).await.unwrap();
    l.adjust("r3", "rpm", 2).unwrap();
    assert!(
        l.adjust("r16", "rpm", 1).is_err(),
        "r16 is not in the lease"
    );
    l.commit().await.unwrap();
    assert_eq!(h.n("e", "r0", 0, "b_rpm_tk"), Some(4000));
    assert_eq!(h.n("e", "r3", 0, "b_rpm_tk"), Some(2000));
    assert_eq!(h.n("e", "r15", 0, "b_rpm_tc"), Some(1000));
    assert!(h.raw.raw_get(&h.key("e", "r16", 0)).is_none());
}

/// Scenario 94: `a` disabled and `b` exhausted → `ResourceDisabled` (for `a`), whatever
/// the order; a third resource that was admitted is refunded.
pub async fn s94_disabled_outranks_exceeded(b: &Backend) {
    let h = b.harness(T0).await;
    for r in ["a", "b", "c"] {
        rpm(&h, "e", r, 10).await;
    }
    h.lim.acquire("e", "a", &[("rpm", 1)]).await.unwrap();
    h.lim.acquire("e", "b", &[("rpm", 10)]).await.unwrap();
    h.lim.acquire("e", "c", &[("rpm", 4)]).await.unwrap();
    assert_eq!(h.lim.admin().set_disabled("e", "a", true).await.unwrap(), 1);
    let one: &[(&str, i64)] = &[("rpm", 1)];
    for order in [["a", "b", "c"], ["b", "c", "a"], ["c", "b", "a"]] {
        let wants: Vec<(&str, &[(&str, i64)])> = order.iter().map(|r| (*r, one)).collect();
        for lim in [h.lim.clone(), h.slow()] {
            match refused(lim.acquire_many("e", &wants).await) {
                Error::ResourceDisabled { entity, resource } => {
                    assert_eq!((entity.as_str(), resource.as_str()), ("e", "a"))
                }
                e => panic!("expected ResourceDisabled, got {e}"),
            }
            assert_eq!(both(&h, "e", "c"), (Some(6000), Some(4000)), "c refunded");
            assert_eq!(both(&h, "e", "b"), (Some(0), Some(10_000)));
            assert_eq!(both(&h, "e", "a"), (Some(9000), Some(1000)));
        }
    }
    // Re-enabled, `b` still exhausted: the refusal is b's rate limit.
    h.lim.admin().set_disabled("e", "a", false).await.unwrap();
    let e = refused(h.lim.acquire_many("e", &[("a", one), ("b", one)]).await);
    assert_eq!(e.exceeded().map(|x| x.resource.as_str()), Some("b"));
    assert_eq!(both(&h, "e", "a"), (Some(9000), Some(1000)));
}

/// Scenario 95, as built: a warm multi-resource acquire costs one write per resource and no
/// read, like that many single acquires; a cold one creates every resource's bucket.
/// (The spec's single transaction over every slow part is not built: each resource's
/// slow path commits on its own, and a refusal is undone by exact refunds.)
pub async fn s95_warm_multi_acquire_is_one_write_per_resource(b: &Backend) {
    let h = b.harness(T0).await;
    for r in ["model", "tool"] {
        rpm(&h, "e", r, 100).await;
    }
    let wants: &[(&str, &[(&str, i64)])] = &[("model", &[("rpm", 1)]), ("tool", &[("rpm", 3)])];
    let mut l = h.lim.acquire_many("e", wants).await.unwrap();
    l.commit().await.unwrap();
    assert_eq!(h.n("e", "model", 0, "b_rpm_tk"), Some(99_000));
    assert_eq!(h.n("e", "tool", 0, "b_rpm_tk"), Some(97_000));
    let s = h.stats();
    let mut l = h.lim.acquire_many("e", wants).await.unwrap();
    l.commit().await.unwrap();
    let d = h.stats().since(&s);
    assert_eq!((d.writes(), d.reads()), (2, 0));
    assert_eq!(h.n("e", "model", 0, "b_rpm_tc"), Some(2000));
    assert_eq!(h.n("e", "tool", 0, "b_rpm_tc"), Some(6000));
}
