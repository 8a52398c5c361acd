//! Corrupt items: finding them (`tollgate doctor`, [`Limiter::doctor`]) and the repairs the
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

use serde::Serialize;
use tollgate_core::aggregate::stored_limits;
use tollgate_core::bucket::BucketImage;
use tollgate_core::keys::{self, DEFAULT_RESOURCE, META, STATE};
use tollgate_core::value::{Item, Key};
use tollgate_core::RuleError;
use tollgate_store::{Scanned, Store, StoreError, Undecodable};

use crate::config;
use crate::error::{Error, Result};
use crate::limiter::Limiter;

/// Items read per scan request.
pub const SCAN_PAGE: usize = 200;

/// What a stored item is, by its key (the layout of `tollgate_core::keys`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ItemKind {
    /// The system-wide limits.
    SystemLimits,
    /// A resource's limits.
    ResourceLimits {
        /// The resource.
        resource: String,
    },
    /// An entity's META item (name, parent, cascade policy, metadata).
    Entity {
        /// The entity.
        entity: String,
    },
    /// An entity's limits: for one resource, or its default for all (`resource: None`).
    EntityLimits {
        /// The entity.
        entity: String,
        /// The resource (`None`: the entity's default).
        resource: Option<String>,
    },
    /// One shard's bucket item of an (entity, resource).
    Bucket {
        /// The entity.
        entity: String,
        /// The resource.
        resource: String,
        /// The shard.
        shard: u32,
    },
    /// A record of the audit log (see `crate::audit`).
    AuditRecord {
        /// Its partition after `{ns}/AUDIT#`: `SYSTEM`, `RESOURCE#{r}` or `ENTITY#{e}`.
        target: String,
        /// Its id (a ULID).
        id: String,
    },
    /// A key of no layout tollgate knows (not checked).
    Other,
}

impl ItemKind {
    /// The kind of the item at `key` in namespace `ns`.
    pub fn of(ns: &str, key: &Key) -> ItemKind {
        Self::parse(ns, key).unwrap_or(ItemKind::Other)
    }

    fn parse(ns: &str, key: &Key) -> Option<ItemKind> {
        let rest = key.pk.strip_prefix(ns)?.strip_prefix('/')?;
        let sk = key.sk.as_str();
        // Each candidate is rebuilt with the key functions and compared, so a key only
        // resembling the layout is `Other`.
        let kind = if rest == "SYSTEM#" {
            ItemKind::SystemLimits
        } else if let Some(resource) = rest.strip_prefix("RESOURCE#") {
            ItemKind::ResourceLimits {
                resource: resource.into(),
            }
        } else if let Some(entity) = rest.strip_prefix("ENTITY#") {
            match sk.strip_prefix("#CONFIG#") {
                _ if sk == META => ItemKind::Entity {
                    entity: entity.into(),
                },
                Some(r) => ItemKind::EntityLimits {
                    entity: entity.into(),
                    resource: (r != DEFAULT_RESOURCE).then(|| r.into()),
                },
                None => return None,
            }
        } else if let (Some(target), Some(id)) = (
            rest.strip_prefix("AUDIT#"),
            sk.strip_prefix(keys::AUDIT_SK_PREFIX),
        ) {
            ItemKind::AuditRecord {
                target: target.into(),
                id: id.into(),
            }
        } else if let Some(b) = rest.strip_prefix("BUCKET#") {
            let (er, shard) = b.rsplit_once('#')?;
            let (entity, resource) = er.split_once('#')?;
            ItemKind::Bucket {
                entity: entity.into(),
                resource: resource.into(),
                shard: shard.parse().ok()?,
            }
        } else {
            return None;
        };
        (kind.key(ns).as_ref() == Some(key)).then_some(kind)
    }

    /// The key of an item of this kind (`None` for [`ItemKind::Other`]).
    pub fn key(&self, ns: &str) -> Option<Key> {
        Some(match self {
            ItemKind::SystemLimits => keys::system_config(ns),
            ItemKind::ResourceLimits { resource } => keys::resource_config(ns, resource),
            ItemKind::Entity { entity } => keys::entity_meta(ns, entity),
            ItemKind::EntityLimits { entity, resource } => {
                keys::entity_config(ns, entity, resource.as_deref().unwrap_or(DEFAULT_RESOURCE))
            }
            ItemKind::Bucket {
                entity,
                resource,
                shard,
            } => keys::bucket(ns, entity, resource, *shard),
            ItemKind::AuditRecord { target, id } => {
                keys::audit_record(format!("{ns}/AUDIT#{target}"), id)
            }
            ItemKind::Other => return None,
        })
    }
}

impl std::fmt::Display for ItemKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ItemKind::SystemLimits => write!(f, "the system limits"),
            ItemKind::ResourceLimits { resource } => write!(f, "the limits of resource {resource}"),
            ItemKind::Entity { entity } => write!(f, "entity {entity}"),
            ItemKind::EntityLimits {
                entity,
                resource: Some(r),
            } => write!(f, "the limits of entity {entity} for resource {r}"),
            ItemKind::EntityLimits {
                entity,
                resource: None,
            } => write!(f, "the default limits of entity {entity}"),
            ItemKind::Bucket {
                entity,
                resource,
                shard,
            } => write!(f, "the bucket of {entity} / {resource}, shard {shard}"),
            ItemKind::AuditRecord { target, id } => write!(f, "audit record {id} of {target}"),
            ItemKind::Other => write!(f, "an item of unknown layout"),
        }
    }
}

/// An item the engine cannot read, with the attribute at fault and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CorruptItem {
    /// The item's key.
    #[serde(flatten)]
    pub key: Key,
    /// What the item is.
    pub item: ItemKind,
    /// The attribute at fault, when one is (`None`: the item as a whole).
    pub attribute: Option<String>,
    /// What is wrong with it.
    pub reason: String,
}

impl std::fmt::Display for CorruptItem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} / {}", self.key.pk, self.key.sk)?;
        match &self.attribute {
            Some(a) => write!(f, ": attribute {a:?}: {}", self.reason),
            None => write!(f, ": {}", self.reason),
        }
    }
}

impl CorruptItem {
    fn new(ns: &str, key: &Key, attribute: Option<String>, reason: String) -> Self {
        debug_assert!(!reason.is_empty(), "a corrupt item says why");
        CorruptItem {
            item: ItemKind::of(ns, key),
            key: key.clone(),
            attribute,
            reason,
        }
    }

    /// From an entry a scan could not decode.
    pub fn undecodable(ns: &str, u: &Undecodable) -> Self {
        Self::new(ns, &u.key, u.attribute.clone(), u.reason.clone())
    }

    /// From a store's or the engine's corrupt message about the item at `key`.
    pub fn from_message(ns: &str, key: &Key, message: &str) -> Self {
        let (attribute, reason) = split_attribute(message);
        Self::new(ns, key, attribute, reason)
    }

    fn from_error(ns: &str, key: &Key, e: &Error) -> Self {
        match e {
            Error::Corrupt(m) => Self::from_message(ns, key, m),
            Error::Invalid(RuleError::Corrupt {
                attribute, reason, ..
            }) => Self::new(ns, key, Some(attribute.clone()), reason.clone()),
            other => Self::new(ns, key, None, other.to_string()),
        }
    }
}

/// `(attribute, reason)` from a corrupt message. Every decoder says `attribute NAME: why`
/// (`RuleError::Corrupt`, the SQLite and DynamoDB stores), after the item's key when it
/// names one; a message without it is the item's as a whole.
pub fn split_attribute(message: &str) -> (Option<String>, String) {
    if let Some(at) = message.find("attribute ") {
        if let Some((name, why)) = message[at + "attribute ".len()..].split_once(": ") {
            if !name.is_empty() && !name.contains(char::is_whitespace) {
                return (Some(name.to_string()), why.to_string());
            }
        }
    }
    (None, message.to_string())
}

/// Check one stored item the way the engine reads it: `Some` when it cannot be read.
pub fn check_item(ns: &str, key: &Key, item: &Item) -> Option<CorruptItem> {
    let kind = ItemKind::of(ns, key);
    let failed: Option<Error> = match &kind {
        ItemKind::SystemLimits
        | ItemKind::ResourceLimits { .. }
        | ItemKind::EntityLimits { .. } => config::decode(item)
            .err()
            .or_else(|| config::decode_cascade(item).err())
            .or_else(|| config::decode_merge(item).err()),
        ItemKind::Entity { .. } => config::decode_cascade(item).err(),
        ItemKind::Bucket { .. } => BucketImage::decode(item)
            .and_then(|img| stored_limits(&img).map(drop))
            .err()
            .map(Error::from),
        ItemKind::AuditRecord { .. } => tollgate_core::audit::decode(item).err().map(Error::from),
        ItemKind::Other => None,
    };
    failed.map(|e| CorruptItem::from_error(ns, key, &e))
}

/// One repair an administrative write or the doctor made over a corrupt item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Repair {
    /// The corrupt item.
    #[serde(flatten)]
    pub corrupt: CorruptItem,
    /// What was done to it.
    pub action: String,
}

impl std::fmt::Display for Repair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.corrupt, self.action)
    }
}

impl Repair {
    /// Record and log a repair (a warning, target `tollgate::repair`).
    pub(crate) fn logged(corrupt: CorruptItem, action: impl Into<String>) -> Repair {
        let r = Repair {
            corrupt,
            action: action.into(),
        };
        tracing::warn!(
            target: "tollgate::repair",
            key = %r.corrupt.key,
            attribute = r.corrupt.attribute.as_deref().unwrap_or("-"),
            reason = %r.corrupt.reason,
            action = %r.action,
            "repaired a corrupt item"
        );
        r
    }
}

/// What [`Limiter::doctor`] found (and, with `repair`, did).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DoctorReport {
    /// The namespace scanned.
    pub namespace: String,
    /// Items read (audit records not included).
    pub scanned: usize,
    /// Audit records read (checked as the others are).
    pub audit_records: usize,
    /// Items of a key layout tollgate does not know, not checked.
    pub unrecognised: usize,
    /// Every corrupt item, in scan order.
    pub corrupt: Vec<CorruptItem>,
    /// What `repair` deleted.
    pub repaired: Vec<Repair>,
}

impl DoctorReport {
    /// The corrupt items no repair of this run removed.
    pub fn remaining(&self) -> Vec<&CorruptItem> {
        self.corrupt
            .iter()
            .filter(|c| !self.repaired.iter().any(|r| r.corrupt.key == c.key))
            .collect()
    }
}

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
    debug_assert!(p.ends_with('#') && k.sk == STATE, "bucket key layout");
    p
}

impl Limiter {
    /// Scan the namespace and list every item the engine cannot read, naming the
    /// attribute (see the module docs for what is checked). With `repair`, delete every
    /// bucket item of each (entity, resource) that has a corrupt one: the next acquire
    /// creates them afresh (at full capacity: what the entity spent in the current window is
    /// forgotten). Corrupt limits and entities are left for `limits set` / `limits delete`
    /// / `entity delete`, which replace or delete them. On DynamoDB this reads the whole
    /// table.
    pub async fn doctor(&self, repair: bool) -> Result<DoctorReport> {
        let ns = self.inner.ns();
        let store = self.inner.store.as_ref();
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
        let store = self.inner.store.as_ref();
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
            self.inner.shards.forget_entity(entity);
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
        let ns = self.inner.ns();
        let store = self.inner.store.as_ref();
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
