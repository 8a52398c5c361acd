//! Modes at every config level (ADR-151, "bypass per scope"): a mode stored at the
//! resource, entity-default or system level reaches every bucket under it on its next
//! acquire — the stamp flipped on the slow pass after a consistent re-read — and the most
//! specific level that sets one wins; a disabled scope is refused before any write; the
//! pair's level is stamped at once; balances are conserved across every switch.
#![allow(missing_docs)]

use crate::testing::*;
use crate::{Enforcement, Error, Limit, Scope};

const R: &str = "api";

fn res() -> Scope {
    Scope::Resource(R.into())
}

async fn resource_limits(h: &H) {
    h.lim
        .admin()
        .set_limits(&res(), &[Limit::per_minute("rpm", 10).unwrap()])
        .await
        .unwrap();
}

fn refused(r: crate::Result<crate::Lease>) -> bool {
    matches!(r, Err(Error::RateLimitExceeded(_)))
}

/// A resource set to bypass: an entity that spent its 10 is admitted at once (no balance
/// debited, `tc` recorded), a new entity's first bucket is created stamped, a process whose
/// cache predates the change follows the stamp once a fresh process wrote it; cleared,
/// enforcement resumes where the balances were (0 for the drained entity: refused).
pub async fn resource_bypass_reaches_every_bucket(b: &Backend) {
    let h = b.harness(T0).await;
    resource_limits(&h).await;
    h.lim.acquire("a", R, &[("rpm", 10)]).await.unwrap();
    h.slow().acquire("b", R, &[("rpm", 10)]).await.unwrap();
    assert!(refused(h.lim.acquire("a", R, &[("rpm", 1)]).await));
    assert_eq!(
        h.lim
            .admin()
            .set_scope_enforcement(&res(), Some(Enforcement::Bypass))
            .await
            .unwrap(),
        0,
        "a broader level stamps nothing at once"
    );
    assert_eq!(
        h.lim.scope_enforcement(&res()).await.unwrap(),
        Some(Enforcement::Bypass)
    );
    // The drained entity is admitted; nothing comes off its balance.
    let l = h.lim.acquire("a", R, &[("rpm", 4)]).await.unwrap();
    assert!(!l.statuses()[0].exceeded);
    assert!(
        h.item("a", R, 0).contains_key("bypass"),
        "stamped on its slow pass"
    );
    assert_eq!(h.n("a", R, 0, "b_rpm_tk"), Some(0));
    assert_eq!(h.n("a", R, 0, "b_rpm_tc"), Some(14_000));
    // Warm, a bypassed acquire is one write.
    let s = h.stats();
    h.lim.acquire("a", R, &[("rpm", 4)]).await.unwrap();
    let d = h.stats().since(&s);
    assert_eq!((d.writes(), d.reads()), (1, 0), "warm bypassed acquire");
    assert_eq!(h.n("a", R, 0, "b_rpm_tc"), Some(18_000));
    // A new entity's bucket is born bypassed: 25 over a capacity of 10 all admitted.
    for _ in 0..5 {
        h.lim.acquire("c", R, &[("rpm", 5)]).await.unwrap();
    }
    assert!(h.item("c", R, 0).contains_key("bypass"));
    assert_eq!(h.n("c", R, 0, "b_rpm_tc"), Some(25_000));
    // `b` was last written by the client whose cache predates the change: that client
    // still enforces until a process that knows the mode writes the bucket.
    assert!(refused(h.slow().acquire("b", R, &[("rpm", 1)]).await));
    h.lim.acquire("b", R, &[("rpm", 1)]).await.unwrap();
    assert!(h.item("b", R, 0).contains_key("bypass"));
    h.slow().acquire("b", R, &[("rpm", 1)]).await.unwrap();
    assert_eq!(h.n("b", R, 0, "b_rpm_tk"), Some(0), "the stamp decides");
    // Cleared: enforced again from the balances the bypass left.
    h.lim
        .admin()
        .set_scope_enforcement(&res(), None)
        .await
        .unwrap();
    assert_eq!(h.lim.scope_enforcement(&res()).await.unwrap(), None);
    assert!(refused(h.lim.acquire("a", R, &[("rpm", 1)]).await));
    assert!(!h.item("a", R, 0).contains_key("bypass"), "lifted");
    assert!(refused(h.lim.acquire("b", R, &[("rpm", 1)]).await));
    // `c` never spent a token of its balance: its 10 are there.
    h.lim.acquire("c", R, &[("rpm", 10)]).await.unwrap();
    assert!(refused(h.lim.acquire("c", R, &[("rpm", 1)]).await));
    // Two minutes later the drained entity has refilled to capacity: conserved, nothing
    // lost or gained.
    h.at(T0 + 120_000);
    h.lim.acquire("a", R, &[("rpm", 10)]).await.unwrap();
    assert!(refused(h.lim.acquire("a", R, &[("rpm", 1)]).await));
}

/// The most specific level that sets a mode wins: a system-wide bypass, a resource that
/// insists on enforcement, an entity default that bypasses again, a pair that is
/// disabled. Each answer is checked on a fresh bucket and after the change on a warm one.
pub async fn the_most_specific_mode_wins(b: &Backend) {
    let h = b.harness(T0).await;
    resource_limits(&h).await;
    h.lim
        .admin()
        .set_scope_enforcement(&Scope::System, Some(Enforcement::Bypass))
        .await
        .unwrap();
    h.lim
        .admin()
        .set_scope_enforcement(&res(), Some(Enforcement::Enforce))
        .await
        .unwrap();
    // The resource level outranks the system: enforced.
    h.lim.acquire("e", R, &[("rpm", 10)]).await.unwrap();
    assert!(refused(h.lim.acquire("e", R, &[("rpm", 1)]).await));
    assert_eq!(
        h.lim.effective_enforcement("e", R).await.unwrap(),
        Enforcement::Enforce
    );
    // The entity default outranks the resource: bypassed, on the warm bucket too.
    h.lim
        .admin()
        .set_scope_enforcement(&Scope::Entity("e".into(), None), Some(Enforcement::Bypass))
        .await
        .unwrap();
    h.lim.acquire("e", R, &[("rpm", 5)]).await.unwrap();
    assert_eq!(h.n("e", R, 0, "b_rpm_tk"), Some(0));
    // Another entity still follows the resource level.
    h.lim.acquire("f", R, &[("rpm", 10)]).await.unwrap();
    assert!(refused(h.lim.acquire("f", R, &[("rpm", 1)]).await));
    // The pair's level outranks them all: disabled, refused with no store request.
    let pair = Scope::Entity("e".into(), Some(R.into()));
    assert_eq!(
        h.lim
            .admin()
            .set_scope_enforcement(&pair, Some(Enforcement::Disabled))
            .await
            .unwrap(),
        1,
        "the pair's level stamps its shard at once"
    );
    h.lim.acquire("f", R, &[("rpm", 0)]).await.ok();
    let s = h.stats();
    assert!(matches!(
        h.lim.acquire("e", R, &[("rpm", 1)]).await,
        Err(Error::ResourceDisabled { .. })
    ));
    assert_eq!(h.stats().since(&s).writes(), 0, "refused before any write");
    // Cleared, the pair takes the entity default's mode again, stamped at once.
    h.lim
        .admin()
        .set_scope_enforcement(&pair, None)
        .await
        .unwrap();
    assert!(h.item("e", R, 0).contains_key("bypass"));
    assert!(!h.item("e", R, 0).contains_key("disabled"));
    h.lim.acquire("e", R, &[("rpm", 5)]).await.unwrap();
    assert_eq!(
        h.lim.effective_enforcement("e", R).await.unwrap(),
        Enforcement::Bypass
    );
}

/// A resource disabled at its level: every entity is refused, new or warm, by this
/// process from its config with no store request; re-enabled, acquires resume with the
/// balances untouched. The mode survives a replacement and a deletion of the level's
/// limits, and a corrupt mode is a typed error naming the attribute.
pub async fn a_disabled_resource_and_its_stored_mode(b: &Backend) {
    let h = b.harness(T0).await;
    resource_limits(&h).await;
    h.lim.acquire("e", R, &[("rpm", 3)]).await.unwrap();
    h.lim
        .admin()
        .set_scope_enforcement(&res(), Some(Enforcement::Disabled))
        .await
        .unwrap();
    for e in ["e", "new"] {
        let s = h.stats();
        assert!(matches!(
            h.lim.acquire(e, R, &[("rpm", 1)]).await,
            Err(Error::ResourceDisabled { .. })
        ));
        assert_eq!(h.stats().since(&s).writes(), 0);
    }
    // Replacing the level's limits keeps its mode; so does deleting them.
    h.lim
        .admin()
        .set_limits(&res(), &[Limit::per_minute("rpm", 20).unwrap()])
        .await
        .unwrap();
    assert_eq!(
        h.lim.scope_enforcement(&res()).await.unwrap(),
        Some(Enforcement::Disabled)
    );
    h.lim.admin().delete_limits(&res()).await.unwrap();
    assert_eq!(
        h.lim.scope_enforcement(&res()).await.unwrap(),
        Some(Enforcement::Disabled)
    );
    h.lim
        .admin()
        .set_limits(&res(), &[Limit::per_minute("rpm", 10).unwrap()])
        .await
        .unwrap();
    h.lim
        .admin()
        .set_scope_enforcement(&res(), None)
        .await
        .unwrap();
    // The 3 taken before are still taken: 7 left.
    h.lim.acquire("e", R, &[("rpm", 7)]).await.unwrap();
    assert!(refused(h.lim.acquire("e", R, &[("rpm", 1)]).await));
    // A corrupt mode is reported, never guessed.
    let key = res().key("default");
    let mut item = h.raw.raw_get(&key).unwrap();
    item.insert(
        "enforcement".into(),
        tollgate_core::value::Value::S("maybe".into()),
    );
    h.raw.raw_put(&key, item);
    h.lim.forget_cached();
    match h.lim.acquire("e", R, &[("rpm", 1)]).await {
        Err(Error::Corrupt(m)) => assert!(m.contains("enforcement"), "{m}"),
        r => panic!("expected a corrupt-item error, got {r:?}"),
    }
    // Replacing the level's limits repairs it and says the mode was not kept.
    let repairs = h
        .lim
        .admin()
        .set_limits_with_repairs(&res(), &[Limit::per_minute("rpm", 10).unwrap()])
        .await
        .unwrap();
    assert_eq!(repairs.len(), 1);
    assert_eq!(repairs[0].corrupt.attribute.as_deref(), Some("enforcement"));
    assert!(
        repairs[0]
            .action
            .contains("its mode could not be read and was not kept"),
        "{}",
        repairs[0].action
    );
    assert_eq!(h.lim.scope_enforcement(&res()).await.unwrap(), None);
}
