//! Audit records of administrative changes: what one record holds, its item layout, and
//! the listing rule (ADR-008, ADR-106).
//!
//! A record is written in the same store transaction as the change it describes, so a
//! change that lands always has its record and a change refused (a condition failure, a
//! store error) has none. Records live in their target's partition
//! (`{ns}/AUDIT#ENTITY#{e}`, `{ns}/AUDIT#RESOURCE#{r}`, `{ns}/AUDIT#SYSTEM`) under
//! `#AUDIT#{ulid}`, and all of a namespace's records in one GSI1 partition (`{ns}/AUDIT`,
//! `AUDIT#{ulid}`): one query lists an entity's history or everything.

use serde::Serialize;
use serde_json::Value as Json;

use crate::error::RuleError;
use crate::keys;
use crate::value::{Item, Key, Value};

/// What an administrative change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Action {
    /// Limits stored at a level (replacing what was there).
    #[serde(rename = "limits.set")]
    LimitsSet,
    /// The limits of a level deleted.
    #[serde(rename = "limits.delete")]
    LimitsDelete,
    /// A level's cascade policy set or unset.
    #[serde(rename = "cascade.set")]
    CascadeSet,
    /// An entity created.
    #[serde(rename = "entity.create")]
    EntityCreate,
    /// An entity deleted with its limits and buckets.
    #[serde(rename = "entity.delete")]
    EntityDelete,
    /// An entity's use of a resource disabled.
    #[serde(rename = "resource.disable")]
    Disable,
    /// An entity's use of a resource enabled again.
    #[serde(rename = "resource.enable")]
    Enable,
    /// An entity's use of a resource set to enforce, disabled or bypassed (ADR-151).
    #[serde(rename = "resource.enforcement")]
    Enforcement,
    /// Corrupt bucket items deleted by `doctor --repair` (every shard of the pair).
    #[serde(rename = "buckets.repair")]
    BucketsRepair,
    /// An entity's buckets for a resource reset to full on every shard (ADR-149).
    #[serde(rename = "bucket.reset")]
    BucketReset,
    /// Tokens added above an entity's grant for a resource, on every shard (ADR-149).
    #[serde(rename = "bucket.top_up")]
    BucketTopUp,
    /// An entity moved to a new parent (or made a root), ADR-150.
    #[serde(rename = "entity.move")]
    EntityMove,
    /// A namespace registered (spec-base-system.md §7.3).
    #[serde(rename = "namespace.register")]
    NamespaceRegister,
    /// A namespace soft-deleted (its data stays).
    #[serde(rename = "namespace.delete")]
    NamespaceDelete,
    /// A soft-deleted namespace recovered.
    #[serde(rename = "namespace.recover")]
    NamespaceRecover,
    /// A soft-deleted namespace's items deleted, and its registry record.
    #[serde(rename = "namespace.purge")]
    NamespacePurge,
}

impl Action {
    /// Every action, in declaration order.
    pub const ALL: [Action; 16] = [
        Action::LimitsSet,
        Action::LimitsDelete,
        Action::CascadeSet,
        Action::EntityCreate,
        Action::EntityDelete,
        Action::Disable,
        Action::Enable,
        Action::Enforcement,
        Action::BucketsRepair,
        Action::BucketReset,
        Action::BucketTopUp,
        Action::EntityMove,
        Action::NamespaceRegister,
        Action::NamespaceDelete,
        Action::NamespaceRecover,
        Action::NamespacePurge,
    ];

    /// The stored (and listed) name, e.g. `limits.set`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::LimitsSet => "limits.set",
            Action::LimitsDelete => "limits.delete",
            Action::CascadeSet => "cascade.set",
            Action::EntityCreate => "entity.create",
            Action::EntityDelete => "entity.delete",
            Action::Disable => "resource.disable",
            Action::Enable => "resource.enable",
            Action::Enforcement => "resource.enforcement",
            Action::BucketsRepair => "buckets.repair",
            Action::BucketReset => "bucket.reset",
            Action::BucketTopUp => "bucket.top_up",
            Action::EntityMove => "entity.move",
            Action::NamespaceRegister => "namespace.register",
            Action::NamespaceDelete => "namespace.delete",
            Action::NamespaceRecover => "namespace.recover",
            Action::NamespacePurge => "namespace.purge",
        }
    }

    /// The action of a stored name.
    pub fn parse(s: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.as_str() == s)
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a change was made to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// The system defaults.
    System,
    /// A resource's defaults.
    Resource(String),
    /// An entity: its META, its limits (all resources, or one), or its use of one resource.
    Entity {
        /// The entity.
        entity: String,
        /// The resource, when the change concerns one.
        resource: Option<String>,
    },
    /// A namespace in the registry (its records live in the registry namespace `_`, so
    /// a purge keeps them).
    Namespace(String),
}

impl Target {
    /// The partition the target's records live in.
    pub fn pk(&self, ns: &str) -> String {
        match self {
            Target::System => keys::audit_system_pk(ns),
            Target::Resource(r) => keys::audit_resource_pk(ns, r),
            Target::Entity { entity, .. } => keys::audit_entity_pk(ns, entity),
            Target::Namespace(n) => keys::audit_namespace_pk(n),
        }
    }

    /// `system`, `resource` or `entity`.
    pub fn level(&self) -> &'static str {
        match self {
            Target::System => "system",
            Target::Resource(_) => "resource",
            Target::Entity { .. } => "entity",
            Target::Namespace(_) => "namespace",
        }
    }

    /// The entity, if any.
    pub fn entity(&self) -> Option<&str> {
        match self {
            Target::Entity { entity, .. } => Some(entity),
            _ => None,
        }
    }

    /// The resource, if any.
    pub fn resource(&self) -> Option<&str> {
        match self {
            Target::Resource(r) => Some(r),
            Target::Entity { resource, .. } => resource.as_deref(),
            Target::System | Target::Namespace(_) => None,
        }
    }
}

/// One audit record.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Record {
    /// A ULID: unique, and sorting by it sorts by time (to the millisecond; within one
    /// millisecond in the order one limiter wrote them).
    pub id: String,
    /// When the change was made (epoch ms, the limiter's clock).
    pub at_ms: i64,
    /// Who made it: the CLI's user, the server's authenticated token name, or what the
    /// library caller said.
    pub principal: String,
    /// What was done.
    pub action: Action,
    /// `system`, `resource` or `entity`.
    pub level: &'static str,
    /// The entity changed, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entity: Option<String>,
    /// The resource concerned, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// The namespace name (registry records only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// What was stored before (`null`: nothing).
    pub before: Json,
    /// What is stored after (`null`: nothing).
    pub after: Json,
    /// When the record expires (epoch seconds, DynamoDB's `ttl`).
    pub expires_at_s: i64,
}

impl Record {
    /// The record's target.
    pub fn target(&self) -> Target {
        if let Some(n) = &self.namespace {
            return Target::Namespace(n.clone());
        }
        match (&self.entity, self.level) {
            (Some(e), _) => Target::Entity {
                entity: e.clone(),
                resource: self.resource.clone(),
            },
            (None, "resource") => Target::Resource(self.resource.clone().unwrap_or_default()),
            _ => Target::System,
        }
    }

    /// The record's key in `ns`.
    pub fn key(&self, ns: &str) -> Key {
        keys::audit_record(self.target().pk(ns), &self.id)
    }

    /// Whether the record's retention has passed at `now_ms` (DynamoDB deletes an item
    /// once its `ttl` is reached; the other stores hold it until purged, and no read shows
    /// it).
    pub fn expired(&self, now_ms: i64) -> bool {
        self.expires_at_s <= now_ms.div_euclid(1000)
    }
}

const ID: &str = "audit_id";
const AT: &str = "at";
const PRINCIPAL: &str = "principal";
const ACTION: &str = "action";
const LEVEL: &str = "level";
const ENTITY: &str = "entity_id";
const RESOURCE: &str = "resource";
const NAMESPACE: &str = "namespace";
const BEFORE: &str = "before";
const AFTER: &str = "after";
const TTL: &str = "ttl";

/// The item of a record in `ns` (its key attributes are stamped by the store): the JSON
/// images as text, `ttl` in epoch seconds, and the GSI1 keys that list every record.
pub fn encode(ns: &str, r: &Record) -> Item {
    let mut i = Item::new();
    i.insert(ID.into(), Value::S(r.id.clone()));
    i.insert(AT.into(), Value::N(r.at_ms));
    i.insert(PRINCIPAL.into(), Value::S(r.principal.clone()));
    i.insert(ACTION.into(), Value::S(r.action.as_str().into()));
    i.insert(LEVEL.into(), Value::S(r.level.into()));
    if let Some(e) = &r.entity {
        i.insert(ENTITY.into(), Value::S(e.clone()));
    }
    if let Some(res) = &r.resource {
        i.insert(RESOURCE.into(), Value::S(res.clone()));
    }
    if let Some(n) = &r.namespace {
        i.insert(NAMESPACE.into(), Value::S(n.clone()));
    }
    i.insert(BEFORE.into(), Value::S(r.before.to_string()));
    i.insert(AFTER.into(), Value::S(r.after.to_string()));
    i.insert(TTL.into(), Value::N(r.expires_at_s));
    i.insert("GSI1PK".into(), Value::S(keys::gsi1_audit(ns)));
    i.insert(
        "GSI1SK".into(),
        Value::S(format!("{}{}", keys::GSI1_AUDIT_PREFIX, r.id)),
    );
    i
}

/// Decode a record's item; a missing or mistyped attribute is corrupt, naming it.
pub fn decode(item: &Item) -> Result<Record, RuleError> {
    let key = Key::of(item).map(|k| k.to_string()).unwrap_or_default();
    let corrupt = |a: &str, why: &str| RuleError::Corrupt {
        key: key.clone(),
        attribute: a.into(),
        reason: why.into(),
    };
    let text = |a: &str| -> Result<Option<String>, RuleError> {
        match item.get(a) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::S(s)) => Ok(Some(s.clone())),
            Some(_) => Err(corrupt(a, "expected a string")),
        }
    };
    let need = |a: &str| text(a)?.ok_or_else(|| corrupt(a, "missing"));
    let num = |a: &str| match item.get(a) {
        Some(Value::N(n)) => Ok(*n),
        None => Err(corrupt(a, "missing")),
        Some(_) => Err(corrupt(a, "expected a number")),
    };
    let json = |a: &str| -> Result<Json, RuleError> {
        match text(a)? {
            None => Ok(Json::Null),
            Some(s) => serde_json::from_str(&s).map_err(|e| corrupt(a, &format!("not JSON: {e}"))),
        }
    };
    let action = need(ACTION)?;
    let action = Action::parse(&action).ok_or_else(|| corrupt(ACTION, "unknown action"))?;
    let level = match need(LEVEL)?.as_str() {
        "system" => "system",
        "resource" => "resource",
        "entity" => "entity",
        "namespace" => "namespace",
        _ => {
            return Err(corrupt(
                LEVEL,
                "expected system, resource, entity or namespace",
            ))
        }
    };
    let namespace = text(NAMESPACE)?;
    if (level == "namespace") != namespace.is_some() {
        return Err(corrupt(NAMESPACE, "present exactly on namespace records"));
    }
    let entity = text(ENTITY)?;
    if (level == "entity") != entity.is_some() {
        return Err(corrupt(ENTITY, "present exactly on entity records"));
    }
    let resource = text(RESOURCE)?;
    if level == "resource" && resource.is_none() {
        return Err(corrupt(RESOURCE, "missing"));
    }
    Ok(Record {
        id: need(ID)?,
        at_ms: num(AT)?,
        principal: need(PRINCIPAL)?,
        action,
        level,
        entity,
        resource,
        namespace,
        before: json(BEFORE)?,
        after: json(AFTER)?,
        expires_at_s: num(TTL)?,
    })
}

/// One page of records, newest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Page {
    /// The records.
    pub records: Vec<Record>,
    /// Pass as the cursor for the next page; `None` on the last page.
    pub next_cursor: Option<String>,
}

/// The most records one page holds.
pub const MAX_PAGE: usize = 1000;

/// Rule "audit page" (ADR-008): the records of one listing newest first (ULIDs order by
/// time), without those past their retention at `now_ms`, only those concerning
/// `resource` when given, strictly older than `cursor` (the last id of the previous page),
/// at most `limit` (1 to [`MAX_PAGE`]); `next_cursor` is the page's last id when older
/// records remain.
pub fn page(
    mut records: Vec<Record>,
    resource: Option<&str>,
    cursor: Option<&str>,
    limit: usize,
    now_ms: i64,
) -> Page {
    let limit = limit.clamp(1, MAX_PAGE);
    records.retain(|r| {
        !r.expired(now_ms)
            && resource.is_none_or(|want| r.resource.as_deref() == Some(want))
            && cursor.is_none_or(|c| r.id.as_str() < c)
    });
    records.sort_by(|a, b| b.id.cmp(&a.id));
    let more = records.len() > limit;
    records.truncate(limit);
    debug_assert!(
        records.windows(2).all(|w| w[0].id > w[1].id),
        "newest first"
    );
    let next_cursor = more.then(|| records.last().map(|r| r.id.clone())).flatten();
    Page {
        records,
        next_cursor,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, resource: Option<&str>, ttl_s: i64) -> Record {
        Record {
            id: id.into(),
            at_ms: 1_000,
            principal: "alice".into(),
            action: Action::LimitsSet,
            level: "entity",
            entity: Some("e".into()),
            resource: resource.map(str::to_string),
            namespace: None,
            before: Json::Null,
            after: serde_json::json!({"limits": []}),
            expires_at_s: ttl_s,
        }
    }

    #[test]
    fn round_trip_and_corruption() {
        let r = rec("01ARZ3NDEKTSV4RRFFQ69G5FAV", Some("gpt-4"), 99);
        let mut item = encode("ns", &r);
        assert_eq!(item.get("GSI1PK"), Some(&Value::S("ns/AUDIT".into())));
        assert_eq!(
            item.get("GSI1SK"),
            Some(&Value::S("AUDIT#01ARZ3NDEKTSV4RRFFQ69G5FAV".into()))
        );
        assert_eq!(item.get("ttl"), Some(&Value::N(99)));
        assert_eq!(decode(&item).unwrap(), r);
        assert_eq!(&*r.key("ns").pk, "ns/AUDIT#ENTITY#e");
        assert_eq!(&*r.key("ns").sk, "#AUDIT#01ARZ3NDEKTSV4RRFFQ69G5FAV");
        item.insert("after".into(), Value::S("{nope".into()));
        assert!(decode(&item).unwrap_err().to_string().contains("after"));
        item.insert("after".into(), Value::S("null".into()));
        item.insert("action".into(), Value::S("limits.explode".into()));
        assert!(decode(&item).unwrap_err().to_string().contains("action"));
        item.insert("action".into(), Value::S("limits.set".into()));
        item.remove("entity_id");
        assert!(decode(&item).unwrap_err().to_string().contains("entity_id"));
    }

    #[test]
    fn actions_round_trip() {
        for a in Action::ALL {
            assert_eq!(Action::parse(a.as_str()), Some(a));
            assert_eq!(serde_json::to_value(a).unwrap(), Json::from(a.as_str()));
        }
    }

    /// Rule "audit page": newest first, expired and other resources left out, pages by
    /// cursor until the last.
    #[test]
    fn pages_newest_first() {
        let rs = vec![
            rec("01A", Some("r"), 10),
            rec("01C", Some("r"), 10),
            rec("01B", None, 10),
            rec("01D", Some("r"), 4), // expired at 5 s
            rec("01E", Some("x"), 10),
        ];
        let p = page(rs.clone(), None, None, 2, 5_000);
        let ids: Vec<&str> = p.records.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["01E", "01C"]);
        assert_eq!(p.next_cursor.as_deref(), Some("01C"));
        let p = page(rs.clone(), None, Some("01C"), 2, 5_000);
        let ids: Vec<&str> = p.records.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["01B", "01A"]);
        assert_eq!(p.next_cursor, None);
        let p = page(rs.clone(), Some("r"), None, 10, 5_000);
        let ids: Vec<&str> = p.records.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["01C", "01A"]);
        // Before its ttl the record shows.
        assert_eq!(page(rs, Some("r"), None, 10, 3_999).records.len(), 3);
    }
}
