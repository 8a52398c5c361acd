//! Corrupt items and their repair (docs/repair.md): the doctor lists every item the engine
//! cannot read, naming the attribute; `limits set` replaces a corrupt config item, `limits
//! delete` and `entity delete` delete corrupt items, `doctor --repair` deletes a corrupt
//! bucket's items; each repair is reported. On items the backend cannot even decode too
//! (SQLite, DynamoDB: a number with a fraction).
#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::time::Duration;

use crate::doctor::{CorruptItem, ItemKind};
use crate::testing::*;
use crate::{Error, Lease, Limit, NewEntity, OnUnavailable, Scope};
use tollgate_core::keys;
use tollgate_core::schedule::Schedule;
use tollgate_core::value::{Key, Value};

const NS: &str = "default";
const E: &str = "u1";
const R: &str = "llm";

fn scope() -> Scope {
    Scope::Entity(E.into(), Some(R.into()))
}

fn rate(name: &str, per_minute: i64) -> Limit {
    Limit::per_minute(name, per_minute).unwrap()
}

/// A client with cold caches over the same store, at the same instant.
fn fresh(h: &H) -> H {
    H::new(h.raw.clone(), h.lim.now_ms(), opts())
}

fn set_attr(h: &H, key: &Key, attr: &str, v: Value) {
    let mut i = h.raw.raw_get(key).expect("item exists");
    i.insert(attr.into(), v);
    h.raw.raw_put(key, i);
}

fn lines<T: std::fmt::Display>(items: &[T]) -> Vec<String> {
    let mut v: Vec<String> = items.iter().map(ToString::to_string).collect();
    v.sort();
    v
}

/// (capacity, available) of one limit on a lease.
fn status(l: &Lease, limit: &str) -> (i64, i64) {
    let s = l
        .statuses()
        .iter()
        .find(|s| s.limit == limit)
        .expect("status of the limit");
    (s.capacity, s.available)
}

async fn entity(h: &H, id: &str) {
    h.lim
        .admin()
        .create_entity(id, None, None, BTreeMap::new())
        .await
        .unwrap();
}

/// A config item and a bucket item, corrupt in the engine's decoding (a string where a
/// boolean and a number belong): acquire and availability give a typed `Corrupt` naming
/// the item and the attribute (`limits get` reads no cascade policy and still answers); the
/// doctor lists both; `limits set` replaces the config item
/// (reporting it) and `doctor --repair` deletes the bucket; the acquire then runs on the new
/// limits from a full bucket.
pub async fn doctor_lists_and_limits_set_replaces(b: &Backend) {
    let h = b.harness(T0).await;
    entity(&h, E).await;
    h.lim
        .admin()
        .set_limits(&scope(), &[rate("rpm", 5), rate("tk", 1000)])
        .await
        .unwrap();
    h.lim
        .acquire(E, R, &[("rpm", 1), ("tk", 10)])
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    let r = h.lim.admin().doctor(false).await.unwrap();
    assert_eq!(r.corrupt, vec![]);
    assert_eq!(r.scanned - r.unrecognised, 3, "META, config, bucket");
    let cfg = keys::entity_config(NS, E, R);
    let bucket = h.key(E, R, 0);
    set_attr(&h, &cfg, "cascade", Value::S("yes".into()));
    set_attr(&h, &bucket, "b_tk_tk", Value::S("x".into()));

    let f = fresh(&h);
    let errors = [
        f.lim.acquire(E, R, &[("rpm", 1)]).await.map(drop),
        f.lim
            .check_availability(E, R, crate::Amounts::new())
            .await
            .map(drop),
    ];
    for e in errors {
        let e = e.unwrap_err();
        assert!(matches!(e, Error::Corrupt(_)), "{e:?}");
        let m = e.to_string();
        assert!(
            m.contains("default/ENTITY#u1|#CONFIG#llm") && m.contains("attribute cascade"),
            "{m}"
        );
    }
    let r = f.lim.admin().doctor(false).await.unwrap();
    assert_eq!(
        lines(&r.corrupt),
        [
            "default/BUCKET#u1#llm#0 / #STATE: attribute \"b_tk_tk\": expected a number, found S",
            "default/ENTITY#u1 / #CONFIG#llm: attribute \"cascade\": expected a boolean",
        ]
    );
    let kinds: Vec<&ItemKind> = r.corrupt.iter().map(|c| &c.item).collect();
    assert!(kinds.contains(&&ItemKind::Bucket {
        entity: E.into(),
        resource: R.into(),
        shard: 0
    }));
    assert!(kinds.contains(&&ItemKind::EntityLimits {
        entity: E.into(),
        resource: Some(R.into())
    }));
    assert!(r.repaired.is_empty());

    let repairs = f
        .lim
        .admin()
        .set_limits_with_repairs(&scope(), &[rate("rpm", 7), rate("tk", 2000)])
        .await
        .unwrap();
    assert_eq!(
        lines(&repairs),
        [
            "default/ENTITY#u1 / #CONFIG#llm: attribute \"cascade\": expected a boolean: \
          replaced by the new limits (its cascade policy could not be read and was not kept)"
        ]
    );
    let (limits, _) = f.lim.get_limits(&scope()).await.unwrap();
    let caps: Vec<(String, i64)> = limits
        .iter()
        .map(|l| (l.name().to_string(), l.capacity_milli() / 1000))
        .collect();
    assert_eq!(caps, [("rpm".into(), 7), ("tk".into(), 2000)]);
    // The bucket is still corrupt: the acquire names it, and writes nothing.
    let e = f
        .lim
        .acquire(E, R, &[("rpm", 1)])
        .await
        .map(drop)
        .unwrap_err();
    assert!(
        matches!(e, Error::Corrupt(_)) && e.to_string().contains("b_tk_tk"),
        "{e}"
    );

    let r = f.lim.admin().doctor(true).await.unwrap();
    assert_eq!(
        lines(&r.repaired),
        [
            "default/BUCKET#u1#llm#0 / #STATE: attribute \"b_tk_tk\": expected a number, found S: \
          deleted with every bucket item of u1 / llm (1 in all): the next acquire creates them \
          afresh, at full capacity"
        ]
    );
    assert!(r.remaining().is_empty());
    assert!(h.raw.raw_get(&bucket).is_none());
    assert_eq!(f.lim.admin().doctor(false).await.unwrap().corrupt, vec![]);

    let mut lease = f
        .lim
        .acquire(E, R, &[("rpm", 1), ("tk", 10)])
        .await
        .unwrap();
    assert_eq!(status(&lease, "rpm"), (7, 6));
    assert_eq!(status(&lease, "tk"), (2000, 1990));
    lease.commit().await.unwrap();
}

/// `entity delete` over a corrupt META, a corrupt config item and a corrupt bucket on its
/// second shard: every item of the entity goes (6: META, two configs, three buckets over two
/// resources), the three corrupt ones reported; `u10`, whose keys share the prefix
/// `ENTITY#u1`, keeps all of its own.
pub async fn entity_delete_removes_a_corrupt_entity(b: &Backend) {
    let h = b.harness(T0).await;
    for e in [E, "u10"] {
        entity(&h, e).await;
    }
    h.lim
        .admin()
        .set_limits(&Scope::Entity(E.into(), None), &[rate("rpm", 10)])
        .await
        .unwrap();
    h.lim
        .admin()
        .set_limits(&scope(), &[rate("rpm", 5)])
        .await
        .unwrap();
    h.lim
        .admin()
        .set_limits(&Scope::Resource(R.into()), &[rate("rpm", 100)])
        .await
        .unwrap();
    for (e, r) in [(E, R), (E, "api"), ("u10", R)] {
        h.lim.acquire(e, r, &[("rpm", 1)]).await.unwrap();
    }
    // A second shard of u1/llm, created by an acquire drawn to it.
    h.lim.admin().bump_shard_count(E, R, 1).await.unwrap();
    h.rng.pin(1);
    h.lim.acquire(E, R, &[("rpm", 1)]).await.unwrap();
    assert!(h.raw.raw_get(&h.key(E, R, 1)).is_some());
    set_attr(
        &h,
        &keys::entity_meta(NS, E),
        "cascade",
        Value::S("x".into()),
    );
    set_attr(
        &h,
        &keys::entity_config(NS, E, R),
        "l_rpm_cp",
        Value::S("x".into()),
    );
    set_attr(&h, &h.key(E, R, 1), "b_rpm_tk", Value::S("x".into()));

    let f = fresh(&h);
    let e = f.lim.get_entity(E).await.unwrap_err();
    assert!(matches!(e, Error::Corrupt(_)), "{e:?}");
    assert!(
        e.to_string()
            .contains("default/ENTITY#u1|#META: attribute cascade"),
        "{e}"
    );
    let d = f.lim.admin().delete_entity_with_repairs(E).await.unwrap();
    assert_eq!(d.deleted_items, 6);
    assert_eq!(
        lines(&d.repairs),
        [
            "default/BUCKET#u1#llm#1 / #STATE: attribute \"b_rpm_tk\": expected a number, \
             found S: deleted with entity u1",
            "default/ENTITY#u1 / #CONFIG#llm: attribute \"l_rpm_cp\": expected a number: \
             deleted with entity u1",
            "default/ENTITY#u1 / #META: attribute \"cascade\": expected a boolean: deleted \
             with entity u1",
        ]
    );
    assert_eq!(f.lim.get_entity(E).await.unwrap(), None);
    for s in [Scope::Entity(E.into(), None), scope()] {
        assert_eq!(f.lim.get_limits(&s).await.unwrap().0, vec![]);
    }
    for k in [h.key(E, R, 0), h.key(E, R, 1), h.key(E, "api", 0)] {
        assert!(h.raw.raw_get(&k).is_none(), "{k}");
    }
    assert_eq!(f.lim.admin().delete_entity(E).await.unwrap(), 0);
    // The neighbour is whole: its META, its bucket, the resource's limits.
    assert!(f.lim.get_entity("u10").await.unwrap().is_some());
    let r = f.lim.admin().doctor(false).await.unwrap();
    assert_eq!(r.corrupt, vec![]);
    assert_eq!(r.scanned - r.unrecognised, 3);
    let lease = f.lim.acquire("u10", R, &[("rpm", 1)]).await.unwrap();
    assert_eq!(status(&lease, "rpm"), (100, 98));
}

/// Items the backend cannot decode at all (not even into the item model): every read names
/// the item and the attribute, the doctor lists them, and the repairs that never read them
/// (an unconditional put, a purge) replace or delete them. Skipped on MemoryStore, which
/// cannot hold such an item.
pub async fn repairs_over_items_the_store_cannot_decode(b: &Backend) {
    let h = b.harness(T0).await;
    entity(&h, E).await;
    h.lim
        .admin()
        .set_limits(&scope(), &[rate("rpm", 5), rate("tk", 1000)])
        .await
        .unwrap();
    h.lim
        .admin()
        .set_limits(&Scope::Resource(R.into()), &[rate("rpm", 100)])
        .await
        .unwrap();
    h.lim
        .acquire(E, R, &[("rpm", 1), ("tk", 10)])
        .await
        .unwrap();
    let cfg = keys::entity_config(NS, E, R);
    let res = keys::resource_config(NS, R);
    let meta = keys::entity_meta(NS, E);
    let bucket = h.key(E, R, 0);
    let stage = |key: &Key, attr: &str| {
        let item = h.raw.raw_get(key).expect("item exists");
        h.raw.raw_put_undecodable(key, item, attr)
    };
    if !stage(&cfg, "l_rpm_cp") {
        return;
    }
    assert!(stage(&res, "l_rpm_ra") && stage(&bucket, "b_tk_tk"));

    let f = fresh(&h);
    let e = f.lim.get_limits(&scope()).await.unwrap_err();
    assert!(matches!(e, Error::Corrupt(_)), "{e:?}");
    let m = e.to_string();
    assert!(
        m.contains("default/ENTITY#u1|#CONFIG#llm") && m.contains("attribute l_rpm_cp"),
        "{m}"
    );
    // Not an outage: the acquire is refused as corrupt, whatever the policy.
    let e = f
        .lim
        .acquire(E, R, &[("rpm", 1)])
        .await
        .map(drop)
        .unwrap_err();
    assert!(matches!(e, Error::Corrupt(_)), "{e:?}");
    assert!(e.to_string().contains("attribute l_rpm_"), "{e}");

    let r = f.lim.admin().doctor(false).await.unwrap();
    let mut found: Vec<(String, Option<&str>)> = r
        .corrupt
        .iter()
        .map(|c| (c.key.to_string(), c.attribute.as_deref()))
        .collect();
    found.sort();
    assert_eq!(
        found,
        [
            (
                "default/BUCKET#u1#llm#0|#STATE".to_string(),
                Some("b_tk_tk")
            ),
            (
                "default/ENTITY#u1|#CONFIG#llm".to_string(),
                Some("l_rpm_cp")
            ),
            ("default/RESOURCE#llm|#CONFIG".to_string(), Some("l_rpm_ra")),
        ]
    );
    // Each backend says why in its words; both quote the number.
    assert!(
        r.corrupt
            .iter()
            .all(|c: &CorruptItem| c.reason.contains("1.5")),
        "{:?}",
        r.corrupt
    );

    let repairs = f
        .lim
        .admin()
        .set_limits_with_repairs(&scope(), &[rate("rpm", 7), rate("tk", 2000)])
        .await
        .unwrap();
    assert_eq!(repairs.len(), 1);
    assert_eq!(repairs[0].corrupt.attribute.as_deref(), Some("l_rpm_cp"));
    assert!(
        repairs[0]
            .action
            .contains("cascade policy could not be read"),
        "{}",
        repairs[0].action
    );
    let (deleted, repairs) = f
        .lim
        .admin()
        .delete_limits_with_repairs(&Scope::Resource(R.into()))
        .await
        .unwrap();
    assert!(deleted);
    assert_eq!(repairs.len(), 1);
    assert_eq!(repairs[0].corrupt.attribute.as_deref(), Some("l_rpm_ra"));
    assert!(h.raw.raw_get(&res).is_none());
    let r = f.lim.admin().doctor(true).await.unwrap();
    assert_eq!(r.repaired.len(), 1);
    assert_eq!(r.repaired[0].corrupt.key, bucket);
    assert!(r.remaining().is_empty());

    let mut lease = f
        .lim
        .acquire(E, R, &[("rpm", 1), ("tk", 10)])
        .await
        .unwrap();
    assert_eq!(status(&lease, "rpm"), (7, 6));
    assert_eq!(status(&lease, "tk"), (2000, 1990));
    lease.commit().await.unwrap();

    // Corrupt again, META too: the entity is deleted whole.
    assert!(stage(&bucket, "b_rpm_tk") && stage(&meta, "created_at"));
    let e = f.lim.get_entity(E).await.unwrap_err();
    assert!(e.to_string().contains("attribute created_at"), "{e}");
    let d = f.lim.admin().delete_entity_with_repairs(E).await.unwrap();
    assert_eq!(d.deleted_items, 3, "META, config, bucket");
    let mut attrs: Vec<Option<&str>> = d
        .repairs
        .iter()
        .map(|r| r.corrupt.attribute.as_deref())
        .collect();
    attrs.sort();
    assert_eq!(attrs, [Some("b_rpm_tk"), Some("created_at")]);
    assert_eq!(f.lim.get_entity(E).await.unwrap(), None);
    let r = f.lim.admin().doctor(false).await.unwrap();
    assert_eq!((r.scanned - r.unrecognised, r.corrupt.len()), (0, 0));
}

/// Sound items of every kind — system policy, calendar and window quotas, a schedule,
/// cascade policies, a parent, a doubled entity, leases adjusted and rolled back — are
/// never reported.
pub async fn doctor_finds_nothing_in_sound_items(b: &Backend) {
    let h = b.harness(T0).await;
    h.lim
        .admin()
        .set_system_limits(&[rate("rpm", 100)], Some(OnUnavailable::Allow))
        .await
        .unwrap();
    let night = Schedule::new(&["* 22:00-06:00 10/10"], "Europe/Berlin").unwrap();
    let api = [
        rate("rpm", 100).with_schedule(night).unwrap(),
        Limit::quota_calendar("rpd", 1000, "0 0 * * *", "Europe/Berlin").unwrap(),
    ];
    for s in [
        Scope::Resource("api".into()),
        Scope::Entity("x".into(), Some("api".into())),
    ] {
        h.lim.admin().set_limits(&s, &api).await.unwrap();
    }
    let session = Limit::quota_after("session", 10, Duration::from_secs(18_000)).unwrap();
    h.lim
        .admin()
        .create_entity("org", None, None, BTreeMap::new())
        .await
        .unwrap();
    h.lim
        .admin()
        .create_entity_with(
            "team",
            NewEntity {
                parent_id: Some("org"),
                cascade: true,
                metadata: BTreeMap::from([("tier".to_string(), "gold".to_string())]),
                ..NewEntity::default()
            },
        )
        .await
        .unwrap();
    for e in ["org", "team"] {
        h.lim
            .admin()
            .set_limits(
                &Scope::Entity(e.into(), Some(R.into())),
                std::slice::from_ref(&session),
            )
            .await
            .unwrap();
    }
    h.lim
        .admin()
        .set_cascade(&Scope::Entity("team".into(), Some(R.into())), Some(true))
        .await
        .unwrap();
    h.lim
        .acquire("team", R, &[("session", 1)])
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    let mut lease = h
        .lim
        .acquire("x", "api", &[("rpm", 3), ("rpd", 2)])
        .await
        .unwrap();
    lease.adjust("rpd", -1).unwrap();
    lease.commit().await.unwrap();
    h.lim.admin().bump_shard_count("x", "api", 1).await.unwrap();
    h.rng.pin(1);
    h.lim
        .acquire("x", "api", &[("rpm", 1), ("rpd", 1)])
        .await
        .unwrap()
        .rollback()
        .await
        .unwrap();
    assert!(
        h.raw.raw_get(&h.key("x", "api", 1)).is_some(),
        "{:?}",
        h.raw.raw_get(&h.key("x", "api", 0))
    );
    h.lim.acquire("y", "other", &[("rpm", 1)]).await.unwrap();
    let r = h.lim.admin().doctor(true).await.unwrap();
    assert_eq!(r.corrupt, vec![]);
    assert_eq!(r.repaired, vec![]);
    // 2 configs (system, api), 2 METAs, 3 entity configs, buckets: team, org (cascade),
    // x ×2, y.
    assert_eq!(r.scanned - r.unrecognised, 12);
}

/// `doctor --repair` over a corrupt second shard deletes both shards of that (entity,
/// resource) and nothing else; the next acquire starts from one full bucket.
pub async fn doctor_repair_deletes_every_shard(b: &Backend) {
    let h = b.harness(T0).await;
    h.lim
        .admin()
        .set_limits(&Scope::Entity(E.into(), None), &[rate("rpm", 10)])
        .await
        .unwrap();
    for r in [R, "api"] {
        h.lim.acquire(E, r, &[("rpm", 2)]).await.unwrap();
    }
    h.lim.admin().bump_shard_count(E, R, 1).await.unwrap();
    h.rng.pin(1);
    h.lim.acquire(E, R, &[("rpm", 1)]).await.unwrap();
    assert!(h.raw.raw_get(&h.key(E, R, 1)).is_some());
    set_attr(&h, &h.key(E, R, 1), "rf", Value::S("soon".into()));
    let f = fresh(&h);
    let r = f.lim.admin().doctor(true).await.unwrap();
    assert_eq!(
        lines(&r.repaired),
        [
            "default/BUCKET#u1#llm#1 / #STATE: attribute \"rf\": expected a number, found S: \
          deleted with every bucket item of u1 / llm (2 in all): the next acquire creates \
          them afresh, at full capacity"
        ]
    );
    for s in [0, 1] {
        assert!(h.raw.raw_get(&h.key(E, R, s)).is_none(), "shard {s}");
    }
    assert_eq!(h.n(E, "api", 0, "b_rpm_tk"), Some(8000), "api untouched");
    h.rng.pin(0);
    let lease = f.lim.acquire(E, R, &[("rpm", 1)]).await.unwrap();
    assert_eq!(status(&lease, "rpm"), (10, 9));
    assert_eq!(h.n(E, R, 0, "shard_count"), Some(1));
}
