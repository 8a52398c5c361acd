//! Namespaces (spec-base-system.md §7.3): register, list, soft delete, recover, purge;
//! nothing crosses namespaces.
#![allow(missing_docs)]

use crate::audit::AuditQuery;
use crate::namespace::NamespaceStatus;
use crate::testing::*;
use crate::{Action, Error, Limit, Limiter, Scope};
use tollgate_store::Store;

const R: &str = "llm";

async fn open(h: &H, name: &str) -> Result<Limiter, Error> {
    Limiter::builder(h.store.clone())
        .clock(h.clock.clone())
        .rng(h.rng.clone())
        .principal("ops")
        .open_namespace(name)
        .await
}

async fn items_under(h: &H, prefix: &str) -> usize {
    let mut n = 0;
    let mut after = None;
    loop {
        let p = h.raw.scan(prefix, after, 100).await.unwrap();
        n += p.items.len();
        match p.next {
            Some(k) => after = Some(k),
            None => return n,
        }
    }
}

/// Register is idempotent and gives a fresh id (`default` keeps the id `default`); a
/// limiter opened on a name writes only under its id; the same entity in two namespaces
/// has two sets of limits and buckets.
pub async fn ns_register_and_isolation(b: &Backend) {
    let h = b.harness(T0).await;
    let admin = h.lim.acting_as("ops").unwrap();
    let acme = admin.admin().register_namespace("acme").await.unwrap();
    assert_eq!(acme.id.len(), 11);
    assert_ne!(acme.id, "acme");
    assert_eq!(acme.status, NamespaceStatus::Active);
    assert_eq!(
        admin.admin().register_namespace("acme").await.unwrap(),
        acme
    );
    let default = admin.admin().register_namespace("default").await.unwrap();
    assert_eq!(default.id, "default");
    let names: Vec<_> = admin
        .list_namespaces()
        .await
        .unwrap()
        .into_iter()
        .map(|n| (n.name, n.status))
        .collect();
    assert_eq!(
        names,
        [
            ("acme".to_string(), NamespaceStatus::Active),
            ("default".to_string(), NamespaceStatus::Active)
        ]
    );
    // Unknown names and the reserved registry namespace are refused.
    assert!(matches!(
        open(&h, "nobody").await.unwrap_err(),
        Error::NamespaceNotFound(_)
    ));
    assert!(admin.admin().register_namespace("_").await.is_err());

    let a = open(&h, "acme").await.unwrap();
    let scope = Scope::Entity("e".into(), Some(R.into()));
    a.admin()
        .set_limits(&scope, &[Limit::per_minute("rpm", 2).unwrap()])
        .await
        .unwrap();
    h.lim
        .admin()
        .set_limits(&scope, &[Limit::per_minute("rpm", 5).unwrap()])
        .await
        .unwrap();
    for _ in 0..2 {
        a.acquire("e", R, &[("rpm", 1)]).await.unwrap();
    }
    assert!(matches!(
        a.acquire("e", R, &[("rpm", 1)]).await.unwrap_err(),
        Error::RateLimitExceeded(_)
    ));
    // The default namespace's "e" is another entity: its own 5.
    for _ in 0..5 {
        h.lim.acquire("e", R, &[("rpm", 1)]).await.unwrap();
    }
    assert!(h.lim.acquire("e", R, &[("rpm", 1)]).await.is_err());
    let acme_bucket = tollgate_core::keys::bucket(&acme.id, "e", R, 0);
    let tk = h
        .raw
        .raw_get(&acme_bucket)
        .and_then(|i| i.get("b_rpm_tk").and_then(|v| v.as_n()));
    assert_eq!(tk, Some(0));
    assert_eq!(h.n("e", R, 0, "b_rpm_tk"), Some(0));
    // Records: two registrations (the second acme call wrote nothing), by the principal.
    let log = h
        .lim
        .audit_log(&AuditQuery {
            registry: true,
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    let acts: Vec<_> = log
        .records
        .iter()
        .map(|r| (r.action, r.namespace.clone().unwrap(), r.principal.clone()))
        .collect();
    assert_eq!(
        acts,
        [
            (Action::NamespaceRegister, "default".into(), "ops".into()),
            (Action::NamespaceRegister, "acme".into(), "ops".into()),
        ]
    );
    // The namespace's own audit log holds its limits change only.
    let own = a.audit_log(&AuditQuery::default()).await.unwrap();
    assert_eq!(own.records.len(), 1);
}

/// Soft delete refuses acquires (at once on the limiter that deleted, within the config
/// TTL on another), keeps the data; recover brings it back; a name registered again
/// blocks the old id's recovery; purge refuses an active namespace, then deletes every
/// item under the id and nothing else.
pub async fn ns_delete_recover_purge(b: &Backend) {
    let h = b.harness(T0).await;
    let admin = h.lim.acting_as("ops").unwrap();
    let acme = admin.admin().register_namespace("acme").await.unwrap();
    let a = open(&h, "acme").await.unwrap();
    a.admin()
        .set_limits(
            &Scope::Entity("e".into(), Some(R.into())),
            &[Limit::per_minute("rpm", 10).unwrap()],
        )
        .await
        .unwrap();
    h.lim
        .admin()
        .set_limits(&Scope::System, &[Limit::per_minute("rpm", 3).unwrap()])
        .await
        .unwrap();
    a.acquire("e", R, &[("rpm", 1)]).await.unwrap();
    h.lim.acquire("e", R, &[("rpm", 1)]).await.unwrap();
    let under = format!("{}/", acme.id);
    let before = items_under(&h, &under).await;
    assert!(before >= 3, "config, bucket, audit record: {before}");

    assert!(matches!(
        admin.admin().purge_namespace(&acme.id).await.unwrap_err(),
        Error::NamespaceState { .. }
    ));
    let gone = admin
        .admin()
        .delete_namespace("acme")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(gone.status, NamespaceStatus::Deleted);
    assert_eq!(gone.deleted_at_ms, Some(T0));
    assert!(admin
        .admin()
        .delete_namespace("acme")
        .await
        .unwrap()
        .is_none());
    // `a` read its config before the deletion: it sees it once its cache expires.
    a.acquire("e", R, &[("rpm", 1)]).await.unwrap();
    h.at(T0 + 61_000);
    let e = a.acquire("e", R, &[("rpm", 1)]).await.unwrap_err();
    assert!(matches!(e, Error::NamespaceDeleted { .. }), "{e}");
    assert!(matches!(
        open(&h, "acme").await.unwrap_err(),
        Error::NamespaceNotFound(_)
    ));
    assert_eq!(items_under(&h, &under).await, before, "the data stays");
    // Recover by id: admitted again.
    assert!(matches!(
        admin
            .admin()
            .recover_namespace("unknownid00")
            .await
            .unwrap_err(),
        Error::NamespaceNotFound(_)
    ));
    let back = admin.admin().recover_namespace(&acme.id).await.unwrap();
    assert_eq!(back.status, NamespaceStatus::Active);
    assert!(matches!(
        admin.admin().recover_namespace(&acme.id).await.unwrap_err(),
        Error::NamespaceState { .. }
    ));
    let a2 = open(&h, "acme").await.unwrap();
    a2.acquire("e", R, &[("rpm", 1)]).await.unwrap();
    // Deleted again, its name registered anew: the old id cannot come back.
    admin.admin().delete_namespace("acme").await.unwrap();
    let fresh = admin.admin().register_namespace("acme").await.unwrap();
    assert_ne!(fresh.id, acme.id);
    let e = admin.admin().recover_namespace(&acme.id).await.unwrap_err();
    assert!(e.to_string().contains("registered again"), "{e}");
    // Purge the old id: everything under it goes, nothing else.
    let default_items = items_under(&h, "default/").await;
    let n = admin.admin().purge_namespace(&acme.id).await.unwrap();
    assert!(n >= before, "{n} >= {before}");
    assert_eq!(items_under(&h, &under).await, 0);
    assert_eq!(items_under(&h, "default/").await, default_items);
    assert_eq!(
        admin.admin().purge_namespace(&acme.id).await.unwrap(),
        0,
        "no-op"
    );
    let ids: Vec<_> = admin
        .list_namespaces()
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.id)
        .collect();
    assert_eq!(ids, std::slice::from_ref(&fresh.id));
    // A limiter still serving the purged id refuses (its registry record is gone).
    h.at(T0 + 200_000);
    let e = a2.acquire("e", R, &[("rpm", 1)]).await.unwrap_err();
    assert!(
        matches!(&e, Error::NamespaceDeleted { status, .. } if status == "purged"),
        "{e}"
    );
    h.lim.acquire("e", R, &[("rpm", 1)]).await.unwrap();
    // Every registry change has its record, newest first.
    let log = h
        .lim
        .audit_log(&AuditQuery {
            registry: true,
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    let acts: Vec<_> = log.records.iter().map(|r| r.action).collect();
    assert_eq!(
        acts,
        [
            Action::NamespacePurge,
            Action::NamespaceRegister,
            Action::NamespaceDelete,
            Action::NamespaceRecover,
            Action::NamespaceDelete,
            Action::NamespaceRegister,
        ]
    );
}
