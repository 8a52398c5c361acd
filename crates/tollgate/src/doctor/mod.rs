//! Corrupt items: finding them (`tollgate doctor`, [`crate::Admin::doctor`]) and the repairs the
//! administrative writes make over them (docs/repair.md).
//!
//! An item is corrupt when the engine cannot read it: the backend cannot decode it into the
//! item model (a number that is not an `i64`, stored text that is not an item:
//! [`tollgate_store::Undecodable`]), or it decodes but the engine's own decoder refuses it (an
//! attribute of the wrong type, half of a pair, parameters no limit can have). The check of
//! each kind of item is the decoder the engine reads it with — [`config::decode`] and
//! [`config::decode_cascade`] for limits and entities, `BucketImage::decode` and
//! `aggregate::stored_limits` for buckets — so the doctor lists exactly what would fail an
//! acquire, a `limits get` or an `entity get` with `corrupt_data`.
//!
//! Repairs never guess at a corrupt item's content: an item is replaced whole (`limits set`)
//! or deleted (`entity delete`, `limits delete`, `doctor --repair` for buckets), and each
//! repair is reported ([`Repair`]) and logged as a warning.
//!
//! Split by what each part holds: what an item is by its key (`kind`), the check of one
//! item ([`CorruptItem`], `check`), the repairs and the doctor's report (`report`), and
//! the doctor's scan with its bucket repair (`scan`); the store helpers the administrative
//! writes use are here.
//!
//! [`crate::Admin::doctor`]: crate::Admin::doctor
//! [`config::decode`]: crate::config::decode
//! [`config::decode_cascade`]: crate::config::decode_cascade

mod check;
mod kind;
mod report;
mod scan;

use tollgate_core::keys::{self, STATE};
use tollgate_core::value::{Item, Key};
use tollgate_store::{Scanned, Store, StoreError};

use crate::error::Result;

pub use check::{check_item, split_attribute, CorruptItem};
pub use kind::ItemKind;
pub use report::{DoctorReport, Repair};

/// Items read per scan request.
pub const SCAN_PAGE: usize = 200;

/// Every entry of the items whose partition key begins with `prefix`, page by page.
pub(crate) async fn scan_all(store: &dyn Store, prefix: &str) -> Result<Vec<Scanned>> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let page = store.scan(prefix, after, SCAN_PAGE).await?;
        out.extend(page.items);
        match page.next {
            Some(k) => after = Some(k),
            None => return Ok(out),
        }
    }
}

/// The key of a scanned entry, decoded or not (`None`: an item without string keys).
pub(crate) fn scanned_key(s: &Scanned) -> Option<Key> {
    match s {
        Ok(i) => Key::of(i),
        Err(u) => Some(u.key.clone()),
    }
}

/// The bucket-partition prefix of an (entity, resource): `{ns}/BUCKET#{e}#{r}#`. Ids and
/// resources hold no `#`, so it matches that pair's shards only.
fn bucket_prefix(ns: &str, entity: &str, resource: &str) -> String {
    let k = keys::bucket(ns, entity, resource, 0);
    let p = k.pk.strip_suffix('0').unwrap_or(&k.pk).to_string();
    debug_assert!(p.ends_with('#') && &*k.sk == STATE, "bucket key layout");
    p
}

/// Read `key` for a repair: `Ok(None)` when absent, `Err(corrupt)` when the store cannot
/// decode it.
pub(crate) async fn read_for_repair(
    store: &dyn Store,
    ns: &str,
    key: &Key,
) -> Result<std::result::Result<Option<Item>, CorruptItem>> {
    match store.get(key, true).await {
        Ok(item) => Ok(Ok(item)),
        Err(StoreError::Corrupt(m)) => Ok(Err(CorruptItem::from_message(ns, key, &m))),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;
    use tollgate_core::value::Value;
    use tollgate_core::Limit;

    #[test]
    fn kinds_round_trip_through_their_keys() {
        let kinds = [
            ItemKind::SystemLimits,
            ItemKind::ResourceLimits {
                resource: "openai/gpt-4".into(),
            },
            ItemKind::Entity {
                entity: "u1".into(),
            },
            ItemKind::EntityLimits {
                entity: "u1".into(),
                resource: None,
            },
            ItemKind::EntityLimits {
                entity: "u1".into(),
                resource: Some("llm".into()),
            },
            ItemKind::Bucket {
                entity: "u1@x.com".into(),
                resource: "a/b".into(),
                shard: 31,
            },
            ItemKind::AuditRecord {
                target: "RESOURCE#a/b".into(),
                id: "01KBDW0Q6N4J6Y3SXQ9V7T2C1M".into(),
            },
        ];
        for k in kinds {
            let key = k.key("ns").unwrap();
            assert_eq!(ItemKind::of("ns", &key), k, "{key}");
            assert_eq!(ItemKind::of("other", &key), ItemKind::Other, "{key}");
        }
        for (pk, sk) in [
            ("ns/BUCKET#u1#llm#x", STATE),
            ("ns/BUCKET#u1#llm#0", "#META"),
            ("ns/ENTITY#u1", "#LEASE#1"),
            ("ns/SYSTEM#", "#META"),
            ("nsx/SYSTEM#", "#CONFIG"),
        ] {
            assert_eq!(ItemKind::of("ns", &Key::new(pk, sk)), ItemKind::Other);
        }
        assert_eq!(bucket_prefix("ns", "u1", "llm"), "ns/BUCKET#u1#llm#");
    }

    /// The attribute is named from what every decoder says.
    #[test]
    fn every_decoder_names_the_attribute() {
        let key = keys::entity_config("ns", "u1", "llm");
        let mut item = config::encode(&[Limit::per_minute("rpm", 5).unwrap()], None);
        key.stamp(&mut item);
        assert_eq!(check_item("ns", &key, &item), None);
        item.insert("l_rpm_cp".into(), Value::S("x".into()));
        let c = check_item("ns", &key, &item).unwrap();
        assert_eq!(c.attribute.as_deref(), Some("l_rpm_cp"));
        assert_eq!(c.reason, "expected a number");
        assert_eq!(
            c.to_string(),
            "ns/ENTITY#u1 / #CONFIG#llm: attribute \"l_rpm_cp\": expected a number"
        );
        item.insert("l_rpm_cp".into(), Value::N(5000));
        item.insert(config::CASCADE.into(), Value::S("yes".into()));
        let c = check_item("ns", &key, &item).unwrap();
        assert_eq!(c.attribute.as_deref(), Some("cascade"));
        assert_eq!(c.reason, "expected a boolean");

        let key = keys::bucket("ns", "u1", "llm", 2);
        let mut item = Item::new();
        key.stamp(&mut item);
        item.insert("rf".into(), Value::N(1));
        item.insert("b_tk_tk".into(), Value::S("x".into()));
        item.insert("b_tk_cp".into(), Value::N(1));
        let c = check_item("ns", &key, &item).unwrap();
        assert_eq!(c.attribute.as_deref(), Some("b_tk_tk"));
        assert_eq!(c.reason, "expected a number, found S");
        assert!(matches!(c.item, ItemKind::Bucket { shard: 2, .. }));

        // The stores' own messages.
        for (m, a, r) in [
            (
                "item ns/p|b: attribute n: undecodable value: invalid type",
                Some("n"),
                "undecodable value: invalid type",
            ),
            (
                "item ns/p|b: attribute m.k: number \"1.5\" is not an i64 (x)",
                Some("m.k"),
                "number \"1.5\" is not an i64 (x)",
            ),
            (
                "item ns/p|d: undecodable JSON: key must be a string",
                None,
                "item ns/p|d: undecodable JSON: key must be a string",
            ),
        ] {
            let (got_a, got_r) = split_attribute(m);
            assert_eq!(got_a.as_deref(), a, "{m}");
            assert_eq!(got_r, r, "{m}");
        }
    }
}
