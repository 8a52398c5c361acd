//! The namespace registry (spec-base-system.md §7.3): several tenants in one store, each
//! under its own key prefix, the namespace id. Nothing crosses namespaces: every key the
//! limiter builds starts with its id.
//!
//! The registry lives in the reserved namespace `_`: a forward record per name
//! (`#NAMESPACE#{name}` → id, present while the namespace is active) and a reverse record
//! per id (`#NSID#{id}` → name, status `active` / `deleted` / `purging`), written together
//! in one transaction with the change's audit record (in `_` too, so a purge keeps it).
//!
//! - Register: idempotent; a new name gets a random id (8 random bytes, URL-safe base64,
//!   redrawn while it does not start with a letter or digit). The name `default` is the
//!   exception: its id is `default`, the prefix every table used before the registry, so
//!   existing data stays where it is.
//! - Soft delete: the forward record goes, the reverse record says `deleted`. The data
//!   stays, and acquires in the namespace are refused with [`Error::NamespaceDeleted`]:
//!   the reverse record rides in the limiter's config batch read (no request of its own),
//!   so a limiter sees the deletion at once if it made it, else within its config TTL.
//! - Recover: by id; refused while active or being purged, and when the name was
//!   registered again meanwhile (the forward record's put is conditioned on its absence).
//! - Purge: by id; refused while active; marks `purging`, deletes every item under the
//!   id's prefix, then the reverse record.
//!
//! The registry's records, opening a limiter by name and reading the registry are here;
//! registering, soft-deleting and recovering are in `lifecycle`, purging in `purge`.

mod lifecycle;
mod purge;

use tollgate_core::ids::validate_entity_id;
use tollgate_core::keys;
use tollgate_core::value::{Item, Value};
use tollgate_core::RuleError;
use tollgate_store::{Query, StoreError};

use crate::error::{Error, Result};
use crate::limiter::{Limiter, LimiterBuilder};

/// The name whose id is the name itself (the prefix of tables older than the registry).
pub const DEFAULT_NAMESPACE: &str = "default";

/// A namespace's registry state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NamespaceStatus {
    /// In use.
    Active,
    /// Soft-deleted: its data stays, nothing is admitted in it.
    Deleted,
    /// Its items are being deleted.
    Purging,
}

impl NamespaceStatus {
    fn as_str(self) -> &'static str {
        match self {
            NamespaceStatus::Active => "active",
            NamespaceStatus::Deleted => "deleted",
            NamespaceStatus::Purging => "purging",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [
            NamespaceStatus::Active,
            NamespaceStatus::Deleted,
            NamespaceStatus::Purging,
        ]
        .into_iter()
        .find(|v| v.as_str() == s)
    }
}

/// A registered namespace.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Namespace {
    /// Its name.
    pub name: String,
    /// Its id: the prefix of its keys.
    pub id: String,
    /// Its state.
    pub status: NamespaceStatus,
    /// When it was registered (epoch ms).
    pub created_at_ms: i64,
    /// When it was soft-deleted (epoch ms), if it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleted_at_ms: Option<i64>,
}

const NAME: &str = "namespace_name";
const ID: &str = "namespace_id";
const STATUS: &str = "status";
const CREATED: &str = "created_at";
const DELETED: &str = "deleted_at";

impl Namespace {
    fn item(&self) -> Item {
        let mut i = Item::new();
        i.insert(NAME.into(), Value::S(self.name.clone()));
        i.insert(ID.into(), Value::S(self.id.clone()));
        i.insert(STATUS.into(), Value::S(self.status.as_str().into()));
        i.insert(CREATED.into(), Value::N(self.created_at_ms));
        if let Some(d) = self.deleted_at_ms {
            i.insert(DELETED.into(), Value::N(d));
        }
        i
    }

    fn decode(item: &Item) -> Result<Namespace> {
        let key = tollgate_core::value::Key::of(item)
            .map(|k| k.to_string())
            .unwrap_or_default();
        let corrupt = |a: &str, why: &str| {
            Error::from(RuleError::Corrupt {
                key: key.clone(),
                attribute: a.into(),
                reason: why.into(),
            })
        };
        let text = |a: &str| {
            item.get(a)
                .and_then(Value::as_s)
                .map(str::to_string)
                .ok_or_else(|| corrupt(a, "expected a string"))
        };
        let status = text(STATUS)?;
        Ok(Namespace {
            name: text(NAME)?,
            id: text(ID)?,
            status: NamespaceStatus::parse(&status)
                .ok_or_else(|| corrupt(STATUS, "expected active, deleted or purging"))?,
            created_at_ms: item
                .get(CREATED)
                .and_then(Value::as_n)
                .ok_or_else(|| corrupt(CREATED, "expected a number"))?,
            deleted_at_ms: item.get(DELETED).and_then(Value::as_n),
        })
    }

    fn image(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// Check a namespace name: an id's rules (letters, digits, `_ . - : @`, starting with a
/// letter or digit), so the reserved registry namespace `_` is never one.
pub fn validate_name(name: &str) -> Result<()> {
    Ok(validate_entity_id(name)?)
}

fn state(namespace: &str, reason: impl Into<String>) -> Error {
    Error::NamespaceState {
        namespace: namespace.into(),
        reason: reason.into(),
    }
}

fn canceled(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::TransactionCanceled { .. } | StoreError::ConditionFailed { .. }
    )
}

impl LimiterBuilder {
    /// Build a limiter in the namespace registered as `name` (its id becomes the key
    /// prefix). `default` needs no registration (its id is `default`); any other name must
    /// be registered and active, else [`Error::NamespaceNotFound`]. One read of the
    /// registry.
    pub async fn open_namespace(self, name: &str) -> Result<Limiter> {
        validate_name(name)?;
        let store = self.store_handle();
        let (id, registered) = match store.get(&keys::namespace_forward(name), true).await? {
            Some(i) => (Namespace::decode(&i)?.id, true),
            None if name == DEFAULT_NAMESPACE => (DEFAULT_NAMESPACE.to_string(), false),
            None => return Err(Error::NamespaceNotFound(name.into())),
        };
        let mut b = self.namespace(&id);
        b.registered = registered;
        b.build()
    }
}

impl Limiter {
    async fn reverse(&self, id: &str) -> Result<Option<Namespace>> {
        match self
            .inner()
            .store()
            .get(&keys::namespace_reverse(id), true)
            .await?
        {
            Some(i) => Ok(Some(Namespace::decode(&i)?)),
            None => Ok(None),
        }
    }

    /// The active namespace registered as `name`, if any.
    pub async fn get_namespace(&self, name: &str) -> Result<Option<Namespace>> {
        validate_name(name)?;
        match self
            .inner()
            .store()
            .get(&keys::namespace_forward(name), true)
            .await?
        {
            Some(i) => Ok(Some(Namespace::decode(&i)?)),
            None => Ok(None),
        }
    }

    /// Every namespace the registry holds, by name: active, soft-deleted and being purged
    /// (filter on [`Namespace::status`]). One query of the registry.
    pub async fn list_namespaces(&self) -> Result<Vec<Namespace>> {
        let items = self
            .inner()
            .store()
            .query(Query::table(keys::registry_pk(), Some(keys::NSID_PREFIX)))
            .await?;
        let mut out = items
            .iter()
            .map(Namespace::decode)
            .collect::<Result<Vec<_>>>()?;
        out.sort_by(|a, b| (&a.name, &a.id).cmp(&(&b.name, &b.id)));
        Ok(out)
    }
}
