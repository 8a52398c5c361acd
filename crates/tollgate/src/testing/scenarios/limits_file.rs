//! Limits as a file (docs/limits-file.md): `plan` diffs the file against the levels stored
//! now, `apply_change` writes each change through the limiter's own calls, after which the
//! plan is empty and acquires use the new limits; a stored level the file does not declare
//! is deleted (its cascade flag too); a corrupt config item is named, not skipped.
#![allow(missing_docs)]

use crate::limits_file::{parse, plan, ChangeKind, LimitChange};
use crate::testing::*;
use crate::{Error, Limit, OnUnavailable, Scope};
use tollgate_core::keys;
use tollgate_core::value::Value;

const V1: &str = r#"
[system]
on_unavailable = "allow"
[system.limits]
rpm = { capacity = 100, refill_amount = 100 }

[resources.llm]
cascade = true
[resources.llm.limits]
rpm = { capacity = 3, refill_amount = 3 }
tpd = { capacity = 1000, reset_after_s = 86400 }

[entities.u1.resources.llm.limits]
rpm = { capacity = 2, refill_amount = 2 }
"#;

const V2: &str = r#"
[system.limits]
rpm = { capacity = 100, refill_amount = 100 }

[resources.llm.limits]
rpm = { capacity = 5, refill_amount = 5 }
tpd = { capacity = 1000, reset_after_s = 86400 }
"#;

async fn apply_all(h: &H, text: &str) -> usize {
    let f = parse("t.toml", text).unwrap();
    let changes = plan(&f.levels, &h.lim.stored_levels().await.unwrap());
    for c in &changes {
        h.lim.apply_change(c).await.unwrap();
    }
    changes.len()
}

pub async fn a_file_plans_against_the_store_and_applies_exactly(b: &Backend) {
    let h = b.harness(T0).await;
    let f1 = parse("v1.toml", V1).unwrap();
    assert!(h.lim.stored_levels().await.unwrap().is_empty());
    let p = plan(&f1.levels, &h.lim.stored_levels().await.unwrap());
    let kinds: Vec<(Scope, ChangeKind)> = p.iter().map(|c| (c.scope.clone(), c.kind)).collect();
    assert_eq!(
        kinds,
        vec![
            (Scope::System, ChangeKind::Create),
            (Scope::Resource("llm".into()), ChangeKind::Create),
            (
                Scope::Entity("u1".into(), Some("llm".into())),
                ChangeKind::Create
            ),
        ]
    );
    assert_eq!(apply_all(&h, V1).await, 3);
    // Stored exactly as declared: nothing left to plan, read back by a cold client too.
    let other = H::new(h.raw.clone(), T0, opts());
    let stored = other.lim.stored_levels().await.unwrap();
    assert!(plan(&f1.levels, &stored).is_empty(), "{stored:?}");
    assert_eq!(
        other.lim.get_limits(&Scope::System).await.unwrap().1,
        Some(OnUnavailable::Allow)
    );
    // u1's own level wins: 2 a minute.
    for _ in 0..2 {
        h.lim
            .acquire("u1", "llm", &[("rpm", 1)])
            .await
            .unwrap()
            .commit()
            .await
            .unwrap();
    }
    assert!(matches!(
        h.lim.acquire("u1", "llm", &[("rpm", 1)]).await,
        Err(Error::RateLimitExceeded(_))
    ));
    // A level set by hand is in the store, not in the file: planned as a delete.
    h.lim
        .admin()
        .set_limits(
            &Scope::Resource("old".into()),
            &[Limit::per_minute("rpm", 1).unwrap()],
        )
        .await
        .unwrap();
    let f2 = parse("v2.toml", V2).unwrap();
    let p = plan(&f2.levels, &h.lim.stored_levels().await.unwrap());
    let kinds: Vec<(Scope, ChangeKind)> = p.iter().map(|c| (c.scope.clone(), c.kind)).collect();
    assert_eq!(
        kinds,
        vec![
            (Scope::System, ChangeKind::Update),
            (Scope::Resource("llm".into()), ChangeKind::Update),
            (Scope::Resource("old".into()), ChangeKind::Delete),
            (
                Scope::Entity("u1".into(), Some("llm".into())),
                ChangeKind::Delete
            ),
        ]
    );
    assert!(p[0].limits.is_empty(), "only on_unavailable changes");
    assert_eq!(
        p[1].limits,
        vec![LimitChange::Changed {
            before: Limit::per_minute("rpm", 3).unwrap(),
            after: Limit::per_minute("rpm", 5).unwrap(),
        }]
    );
    assert_eq!(apply_all(&h, V2).await, 4);
    assert!(plan(&f2.levels, &h.lim.stored_levels().await.unwrap()).is_empty());
    // The cascade flag went with the file, and u1 now has the resource's 5 a minute. Its
    // bucket keeps its balance (0: spent under the old limits; a capacity change mints
    // nothing) and refills at the new rate: a minute later, exactly 5.
    let item = h
        .raw
        .raw_get(&keys::resource_config("default", "llm"))
        .unwrap();
    assert_eq!(item.get("cascade"), None);
    assert!(h
        .raw
        .raw_get(&keys::entity_config("default", "u1", "llm"))
        .is_none());
    assert!(matches!(
        h.lim.acquire("u1", "llm", &[("rpm", 1)]).await,
        Err(Error::RateLimitExceeded(_))
    ));
    h.clock.advance(60_000);
    let mut admitted = 0;
    while h.lim.acquire("u1", "llm", &[("rpm", 1)]).await.is_ok() {
        admitted += 1;
        assert!(admitted <= 5, "more than the new capacity");
    }
    assert_eq!(admitted, 5);
    assert_eq!(h.lim.get_limits(&Scope::System).await.unwrap().1, None);
}

pub async fn a_corrupt_level_is_named_by_the_plan(b: &Backend) {
    let h = b.harness(T0).await;
    apply_all(&h, V2).await;
    let key = keys::resource_config("default", "llm");
    let mut i = h.raw.raw_get(&key).unwrap();
    i.insert("l_rpm_cp".into(), Value::S("many".into()));
    h.raw.raw_put(&key, i);
    match h.lim.stored_levels().await {
        Err(Error::Corrupt(m)) => assert!(m.contains("l_rpm_cp"), "{m}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // Applying the file repairs it (limits set replaces a corrupt item).
    let f = parse("v2.toml", V2).unwrap();
    let lvl = f
        .levels
        .values()
        .find(|l| l.scope == Scope::Resource("llm".into()))
        .unwrap();
    let change = crate::limits_file::Change {
        scope: lvl.scope.clone(),
        kind: ChangeKind::Update,
        before: None,
        after: Some(lvl.clone()),
        limits: Vec::new(),
    };
    let repairs = h.lim.apply_change(&change).await.unwrap();
    assert_eq!(repairs.len(), 1);
    assert!(plan(&f.levels, &h.lim.stored_levels().await.unwrap()).is_empty());
}
