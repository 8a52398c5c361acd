//! [`crate::Admin::doctor`]: the namespace scan, and the repair of corrupt buckets it makes with
//! `repair`.

use tollgate_core::keys;
use tollgate_core::value::Key;
use tollgate_store::StoreError;

use super::{
    bucket_prefix, check_item, scan_all, scanned_key, CorruptItem, DoctorReport, ItemKind, Repair,
    SCAN_PAGE,
};
use crate::error::Result;
use crate::limiter::Limiter;

impl Limiter {
    /// The implementation of [`crate::Admin::doctor`].
    pub(crate) async fn doctor(&self, repair: bool) -> Result<DoctorReport> {
        let ns = self.inner().ns();
        let store = self.inner().store().as_ref();
        let mut report = DoctorReport {
            namespace: ns.to_string(),
            ..DoctorReport::default()
        };
        let mut after = None;
        loop {
            let page = store.scan(&format!("{ns}/"), after, SCAN_PAGE).await?;
            for entry in &page.items {
                let key = match entry {
                    Err(u) => Some(u.key.clone()),
                    Ok(item) => Key::of(item),
                };
                match key.map(|k| ItemKind::of(ns, &k)) {
                    Some(ItemKind::AuditRecord { .. }) => report.audit_records += 1,
                    _ => report.scanned += 1,
                }
                let found = match entry {
                    Err(u) => Some(CorruptItem::undecodable(ns, u)),
                    Ok(item) => match Key::of(item) {
                        Some(k) => {
                            if ItemKind::of(ns, &k) == ItemKind::Other {
                                report.unrecognised += 1;
                            }
                            check_item(ns, &k, item)
                        }
                        None => None,
                    },
                };
                report.corrupt.extend(found);
            }
            match page.next {
                Some(k) => after = Some(k),
                None => break,
            }
        }
        if repair {
            report.repaired = self.repair_buckets(&report.corrupt).await?;
        }
        Ok(report)
    }

    /// Delete every bucket item of each (entity, resource) with a corrupt one among
    /// `corrupt`.
    async fn repair_buckets(&self, corrupt: &[CorruptItem]) -> Result<Vec<Repair>> {
        let store = self.inner().store().as_ref();
        let mut pairs: Vec<(&str, &str)> = corrupt
            .iter()
            .filter_map(|c| match &c.item {
                ItemKind::Bucket {
                    entity, resource, ..
                } => Some((entity.as_str(), resource.as_str())),
                _ => None,
            })
            .collect();
        pairs.sort_unstable();
        pairs.dedup();
        let mut repaired = Vec::new();
        for (entity, resource) in pairs {
            let mut keys = self.bucket_keys(entity, resource).await?;
            // A corrupt item may be missing from the index (its index attributes are what is
            // corrupt): its own key is known.
            for c in corrupt {
                if matches!(&c.item, ItemKind::Bucket { entity: e, resource: r, .. }
                    if e == entity && r == resource)
                    && !keys.contains(&c.key)
                {
                    keys.push(c.key.clone());
                }
            }
            // The record first: the items are purged one by one (a store may be unable to
            // delete an item it cannot decode in a transaction), so a repair that starts
            // landing is already recorded.
            let found: Vec<String> = corrupt
                .iter()
                .filter(|c| {
                    matches!(&c.item, ItemKind::Bucket { entity: e, resource: r, .. }
                        if e == entity && r == resource)
                })
                .map(ToString::to_string)
                .collect();
            let target = crate::audit::Target::Entity {
                entity: entity.into(),
                resource: Some(resource.into()),
            };
            let record = self.audit_record(
                crate::audit::Action::BucketsRepair,
                &target,
                serde_json::json!({ "corrupt": found, "items": keys.len() }),
                serde_json::Value::Null,
            );
            self.audited(Vec::new(), record).await?;
            for k in &keys {
                store.purge(k).await?;
            }
            let action = format!(
                "deleted with every bucket item of {entity} / {resource} ({} in all): the \
                 next acquire creates them afresh, at full capacity",
                keys.len()
            );
            for c in corrupt.iter().filter(|c| {
                matches!(&c.item, ItemKind::Bucket { entity: e, resource: r, .. }
                    if e == entity && r == resource)
            }) {
                repaired.push(Repair::logged(c.clone(), action.clone()));
            }
            self.inner().shards().forget_entity(entity);
        }
        if !repaired.is_empty() {
            self.forget_cached();
        }
        Ok(repaired)
    }
}

impl Limiter {
    /// The keys of every bucket item of (entity, resource): from the buckets' index (keys
    /// only on DynamoDB, so it never fails to decode there), or, when an item there cannot
    /// be decoded, from a scan of the pair's key prefix.
    async fn bucket_keys(&self, entity: &str, resource: &str) -> Result<Vec<Key>> {
        let ns = self.inner().ns();
        let store = self.inner().store().as_ref();
        let q = tollgate_store::Query::index(
            "GSI3",
            keys::gsi3_entity(ns, entity),
            Some(&format!("BUCKET#{resource}#")),
        );
        match store.query(q).await {
            Ok(items) => Ok(items.iter().filter_map(Key::of).collect()),
            Err(StoreError::Corrupt(_)) => {
                Ok(scan_all(store, &bucket_prefix(ns, entity, resource))
                    .await?
                    .iter()
                    .filter_map(scanned_key)
                    .collect())
            }
            Err(e) => Err(e.into()),
        }
    }
}
