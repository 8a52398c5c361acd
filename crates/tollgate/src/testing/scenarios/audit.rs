//! The audit log (ADR-008): one record per administrative change — action, principal,
//! before / after — written in the change's transaction, so a refused change has none; an
//! entity's records newest first in one query, every record in another; records past
//! their retention never listed, and purged — on every backend.
#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use crate::audit::{AuditQuery, AuditRecord};
use crate::testing::hook::On;
use crate::testing::*;
use crate::{Action, Error, Limit, Scope};
use tollgate_core::keys;
use tollgate_core::value::Value;

const E: &str = "u1";
const R: &str = "llm";

fn rate(name: &str, per_minute: i64) -> Limit {
    Limit::per_minute(name, per_minute).unwrap()
}

async fn all(h: &H) -> Vec<AuditRecord> {
    let q = AuditQuery {
        limit: 1000,
        ..AuditQuery::default()
    };
    h.lim.audit_log(&q).await.unwrap().records
}

fn capacities(image: &serde_json::Value) -> Vec<(String, i64)> {
    image["limits"]
        .as_array()
        .map(|ls| {
            ls.iter()
                .map(|l| {
                    (
                        l["name"].as_str().unwrap_or("?").to_string(),
                        l["capacity"].as_i64().unwrap_or(-1),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Every administrative call of the library writes exactly one record, with the principal
/// of the handle that made it and the images before and after; listed newest first.
pub async fn every_admin_change_writes_one_record(b: &Backend) {
    let h = b.harness(T0).await;
    let alice = h.lim.acting_as("alice").unwrap();
    let bob = h.lim.acting_as("bob@example.com").unwrap();
    assert_eq!(h.lim.principal(), "library");

    alice
        .admin()
        .set_limits(&Scope::System, &[rate("rpm", 10)])
        .await
        .unwrap();
    h.at(T0 + 1);
    bob.admin()
        .set_limits(&Scope::Resource(R.into()), &[rate("rpm", 20)])
        .await
        .unwrap();
    h.at(T0 + 2);
    alice
        .admin()
        .create_entity(E, Some("User one"), None, BTreeMap::new())
        .await
        .unwrap();
    h.at(T0 + 3);
    let ent = Scope::Entity(E.into(), Some(R.into()));
    alice
        .admin()
        .set_limits(&ent, &[rate("rpm", 5)])
        .await
        .unwrap();
    h.at(T0 + 4);
    bob.admin()
        .set_limits(&ent, &[rate("rpm", 7), rate("tpm", 900)])
        .await
        .unwrap();
    h.at(T0 + 5);
    alice
        .admin()
        .set_cascade(&Scope::Entity(E.into(), None), Some(true))
        .await
        .unwrap();
    h.at(T0 + 6);
    // A bucket to disable.
    h.lim
        .acquire(E, R, &[("rpm", 1)])
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    assert_eq!(bob.admin().set_disabled(E, R, true).await.unwrap(), 1);
    h.at(T0 + 7);
    assert_eq!(bob.admin().set_disabled(E, R, false).await.unwrap(), 1);
    h.at(T0 + 8);
    assert!(alice.admin().delete_limits(&ent).await.unwrap());
    h.at(T0 + 9);
    assert!(alice
        .admin()
        .delete_limits(&Scope::Resource(R.into()))
        .await
        .unwrap());
    h.at(T0 + 10);
    assert!(bob.admin().delete_limits(&Scope::System).await.unwrap());
    h.at(T0 + 11);
    let n = alice.admin().delete_entity(E).await.unwrap();
    assert_eq!(
        n, 3,
        "META, the _default_ config holding the cascade flag, one bucket"
    );

    let rs = all(&h).await;
    let seen: Vec<(&str, &str, &str, Option<&str>, i64)> = rs
        .iter()
        .map(|r| {
            (
                r.action.as_str(),
                r.principal.as_str(),
                r.level,
                r.resource.as_deref(),
                r.at_ms - T0,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("entity.delete", "alice", "entity", None, 11),
            ("limits.delete", "bob@example.com", "system", None, 10),
            ("limits.delete", "alice", "resource", Some(R), 9),
            ("limits.delete", "alice", "entity", Some(R), 8),
            ("resource.enable", "bob@example.com", "entity", Some(R), 7),
            ("resource.disable", "bob@example.com", "entity", Some(R), 6),
            ("cascade.set", "alice", "entity", None, 5),
            ("limits.set", "bob@example.com", "entity", Some(R), 4),
            ("limits.set", "alice", "entity", Some(R), 3),
            ("entity.create", "alice", "entity", None, 2),
            ("limits.set", "bob@example.com", "resource", Some(R), 1),
            ("limits.set", "alice", "system", None, 0),
        ]
    );
    let ids: Vec<&str> = rs.iter().map(|r| r.id.as_str()).collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    sorted.dedup();
    assert_eq!(ids, sorted, "ids unique, newest first");
    // Before and after, per change.
    let by = |at: i64| rs.iter().find(|r| r.at_ms == T0 + at).unwrap();
    assert_eq!(by(0).before, serde_json::Value::Null);
    assert_eq!(capacities(&by(0).after), [("rpm".to_string(), 10)]);
    assert_eq!(capacities(&by(3).after), [("rpm".to_string(), 5)]);
    assert_eq!(capacities(&by(4).before), [("rpm".to_string(), 5)]);
    assert_eq!(
        capacities(&by(4).after),
        [("rpm".to_string(), 7), ("tpm".to_string(), 900)]
    );
    assert_eq!(by(2).after["name"], json!("User one"));
    assert_eq!(by(5).before, serde_json::Value::Null);
    assert_eq!(by(5).after["cascade"], json!(true));
    assert_eq!(by(6).before, json!({ "disabled": false, "shards": 1 }));
    assert_eq!(by(6).after, json!({ "disabled": true, "shards": 1 }));
    assert_eq!(by(7).after, json!({ "disabled": false, "shards": 1 }));
    assert_eq!(capacities(&by(8).before).len(), 2);
    assert_eq!(by(8).after, serde_json::Value::Null);
    assert_eq!(by(11).before["entity"]["name"], json!("User one"));
    assert_eq!(by(11).before["limits"]["_default_"]["cascade"], json!(true));
    assert_eq!(by(11).before["items"], json!(3));
    assert_eq!(by(11).after, serde_json::Value::Null);
    // Retention: 90 days from the change.
    assert_eq!(by(0).expires_at_s, T0 / 1000 + 90 * 24 * 3600);

    // An entity's history: one query of its partition, kept after its deletion.
    let store_before = h.stats();
    let page = h
        .lim
        .audit_log(&AuditQuery {
            entity: Some(E.into()),
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(h.stats().since(&store_before).reads(), 1, "one query");
    let at: Vec<i64> = page.records.iter().map(|r| r.at_ms - T0).collect();
    assert_eq!(at, [11, 8, 7, 6, 5, 4, 3, 2]);
    // Filtered by resource: what concerned `llm`, the resource defaults included.
    let page = h
        .lim
        .audit_log(&AuditQuery {
            resource: Some(R.into()),
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    let at: Vec<i64> = page.records.iter().map(|r| r.at_ms - T0).collect();
    assert_eq!(at, [9, 8, 7, 6, 4, 3, 1]);
}

/// A change that does not land writes no record: an entity created twice, a delete of
/// limits never set, a bad principal; a change whose
/// "before" moved under it (another writer between its read and its write) is retried
/// over what that writer left, and its one record says so.
pub async fn a_refused_change_writes_no_record(b: &Backend) {
    let h = b.harness(T0).await;
    let lim = h.lim.acting_as("ops").unwrap();
    lim.admin()
        .create_entity(E, None, None, BTreeMap::new())
        .await
        .unwrap();
    assert!(matches!(
        lim.admin()
            .create_entity(E, None, None, BTreeMap::new())
            .await,
        Err(Error::EntityExists(_))
    ));
    assert!(!lim
        .admin()
        .delete_limits(&Scope::Resource(R.into()))
        .await
        .unwrap());
    assert!(matches!(h.lim.acting_as(""), Err(Error::Invalid(_))));
    assert!(matches!(
        h.lim.acting_as("bad\u{7}bell"),
        Err(Error::Invalid(_))
    ));
    let rs = all(&h).await;
    assert_eq!(rs.len(), 1);
    assert_eq!(rs[0].action, Action::EntityCreate);

    // Another writer replaces the resource's limits between this change's read and write.
    let scope = Scope::Resource(R.into());
    lim.admin()
        .set_limits(&scope, &[rate("rpm", 1)])
        .await
        .unwrap();
    let (hooked, hook) = h.hooked(true);
    let hooked = hooked.acting_as("carol").unwrap();
    let key = keys::resource_config("default", R);
    let raced = crate::config::encode(&[rate("rpm", 42)], None);
    let k = key.clone();
    hook.stage(On::Put, Some(key.clone()), move |raw| {
        let mut item = raced;
        item.insert(
            "audit_id".into(),
            Value::S("01J00000000000000000000000".into()),
        );
        raw.raw_put(&k, item);
    });
    hooked
        .admin()
        .set_limits(&scope, &[rate("rpm", 3)])
        .await
        .unwrap();
    let rs = all(&h).await;
    let carol: Vec<&AuditRecord> = rs.iter().filter(|r| r.principal == "carol").collect();
    assert_eq!(carol.len(), 1, "the refused attempt left no record");
    assert_eq!(capacities(&carol[0].before), [("rpm".to_string(), 42)]);
    assert_eq!(capacities(&carol[0].after), [("rpm".to_string(), 3)]);
    let (now, _) = h.lim.get_limits(&scope).await.unwrap();
    assert_eq!(now[0].capacity_milli(), 3_000);
    // The item carries the id of the record that wrote it.
    let item = h.raw.raw_get(&key).unwrap();
    assert_eq!(item.get("audit_id"), Some(&Value::S(carol[0].id.clone())));
    assert_eq!(rs.len(), 3);
}

/// Pages follow the cursor to the end; records past their retention are never listed and
/// `purge_audit` deletes them; a bad cursor or page size is a typed error.
pub async fn pages_retention_and_purge(b: &Backend) {
    let h = b.harness(T0).await;
    let short = crate::Limiter::builder(h.store.clone())
        .clock(h.clock.clone())
        .principal("cron")
        .audit_retention(Duration::from_secs(60))
        .build()
        .unwrap();
    for i in 0..5 {
        h.at(T0 + i * 1000);
        short
            .admin()
            .set_limits(&Scope::Resource(format!("r{i}")), &[rate("rpm", 1 + i)])
            .await
            .unwrap();
    }
    h.at(T0 + 10_000);
    h.lim
        .admin()
        .set_limits(&Scope::System, &[rate("rpm", 9)])
        .await
        .unwrap();
    let mut q = AuditQuery {
        limit: 2,
        ..AuditQuery::default()
    };
    let mut pages = Vec::new();
    loop {
        let p = h.lim.audit_log(&q).await.unwrap();
        pages.push(
            p.records
                .iter()
                .map(|r| r.resource.clone().unwrap_or_else(|| r.level.into()))
                .collect::<Vec<_>>(),
        );
        match p.next_cursor {
            Some(c) => q.cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(
        pages,
        [
            vec!["system".to_string(), "r4".into()],
            vec!["r3".into(), "r2".into()],
            vec!["r1".into(), "r0".into()],
        ]
    );
    // 60 s after the third change (at T0 + 2 s), the first three are past their retention.
    h.at(T0 + 62_000);
    let left: Vec<String> = all(&h)
        .await
        .iter()
        .map(|r| r.resource.clone().unwrap_or_else(|| r.level.into()))
        .collect();
    assert_eq!(left, ["system", "r4", "r3"]);
    assert_eq!(h.lim.admin().purge_audit().await.unwrap(), 3);
    assert_eq!(h.lim.admin().purge_audit().await.unwrap(), 0);
    // Gone from the store too: back at T0 they would show.
    h.at(T0);
    assert_eq!(all(&h).await.len(), 3);

    for bad in [
        AuditQuery {
            cursor: Some("not-a-ulid".into()),
            ..AuditQuery::default()
        },
        AuditQuery {
            limit: 1001,
            ..AuditQuery::default()
        },
        AuditQuery {
            entity: Some("a#b".into()),
            ..AuditQuery::default()
        },
    ] {
        assert!(
            matches!(h.lim.audit_log(&bad).await, Err(Error::Invalid(_))),
            "{bad:?}"
        );
    }
}

/// `doctor --repair` records what it deleted: one record per (entity, resource) repaired,
/// naming the corrupt items and how many were deleted, before its deletes.
pub async fn a_doctor_repair_is_recorded(b: &Backend) {
    let h = b.harness(T0).await;
    h.lim
        .admin()
        .set_limits(&Scope::Resource(R.into()), &[rate("rpm", 10)])
        .await
        .unwrap();
    h.lim
        .acquire(E, R, &[("rpm", 1)])
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    let k = h.key(E, R, 0);
    let mut item = h.raw.raw_get(&k).unwrap();
    item.insert("b_rpm_tk".into(), Value::S("x".into()));
    h.raw.raw_put(&k, item);
    let medic = h.lim.acting_as("medic").unwrap();
    h.at(T0 + 5);
    let r = medic.admin().doctor(true).await.unwrap();
    assert_eq!(r.repaired.len(), 1);
    assert_eq!(
        (r.scanned, r.audit_records),
        (2, 1),
        "config and bucket; one record"
    );
    let rs = all(&h).await;
    assert_eq!(rs.len(), 2);
    let rec = &rs[0];
    assert_eq!(
        (rec.action, rec.principal.as_str(), rec.at_ms),
        (Action::BucketsRepair, "medic", T0 + 5)
    );
    assert_eq!(
        (rec.entity.as_deref(), rec.resource.as_deref()),
        (Some(E), Some(R))
    );
    assert_eq!(rec.before["items"], json!(1));
    let found = rec.before["corrupt"][0].as_str().unwrap_or_default();
    assert!(found.contains("b_rpm_tk"), "{found}");
    assert_eq!(rec.after, serde_json::Value::Null);
    assert!(h.raw.raw_get(&k).is_none());
    // Nothing corrupt: no repair, no record.
    medic.admin().doctor(true).await.unwrap();
    assert_eq!(all(&h).await.len(), 2);
}
