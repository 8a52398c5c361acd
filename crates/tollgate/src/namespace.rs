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

use base64::Engine;
use rand::RngCore;
use serde_json::json;
use tollgate_core::expr::Condition;
use tollgate_core::ids::validate_entity_id;
use tollgate_core::keys;
use tollgate_core::value::{Item, Value};
use tollgate_core::RuleError;
use tollgate_store::{DeleteRequest, PutRequest, Query, StoreError, TransactOp};

use crate::audit::{Action, Target};
use crate::error::{Error, Result};
use crate::limiter::{Limiter, LimiterBuilder};

/// The name whose id is the name itself (the prefix of tables older than the registry).
pub const DEFAULT_NAMESPACE: &str = "default";

/// Items deleted per page of a purge.
const PURGE_PAGE: usize = 25;

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

/// A fresh namespace id: 8 random bytes in URL-safe base64 (11 characters), redrawn while
/// it does not start with a letter or digit (a key prefix must).
fn fresh_id() -> String {
    let mut rng = rand::thread_rng();
    loop {
        let mut b = [0u8; 8];
        rng.fill_bytes(&mut b);
        let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        if id.starts_with(|c: char| c.is_ascii_alphanumeric()) {
            debug_assert_eq!(id.len(), 11);
            return id;
        }
    }
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
            .inner
            .store
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
            .inner
            .store
            .get(&keys::namespace_forward(name), true)
            .await?
        {
            Some(i) => Ok(Some(Namespace::decode(&i)?)),
            None => Ok(None),
        }
    }

    /// Register `name` and return it (idempotent: an active name is returned as it is,
    /// without a write or a record). One transaction puts the forward and reverse records,
    /// each on condition it does not exist, with the audit record.
    pub async fn register_namespace(&self, name: &str) -> Result<Namespace> {
        validate_name(name)?;
        for _ in 0..3 {
            if let Some(n) = self.get_namespace(name).await? {
                return Ok(n);
            }
            let id = if name == DEFAULT_NAMESPACE {
                DEFAULT_NAMESPACE.to_string()
            } else {
                fresh_id()
            };
            if name == DEFAULT_NAMESPACE {
                if let Some(old) = self.reverse(&id).await? {
                    // `default` was deleted: its id is fixed, so it comes back by recovery.
                    return Err(state(
                        name,
                        format!("it is {}: recover id {id}", old.status.as_str()),
                    ));
                }
            }
            let ns = Namespace {
                name: name.into(),
                id: id.clone(),
                status: NamespaceStatus::Active,
                created_at_ms: self.now_ms(),
                deleted_at_ms: None,
            };
            let ops = vec![
                TransactOp::Put(PutRequest {
                    key: keys::namespace_forward(name),
                    item: ns.item(),
                    condition: Some(Condition::not_exists("PK")),
                }),
                TransactOp::Put(PutRequest {
                    key: keys::namespace_reverse(&id),
                    item: ns.item(),
                    condition: Some(Condition::not_exists("PK")),
                }),
            ];
            let record = self.audit_record(
                Action::NamespaceRegister,
                &Target::Namespace(name.into()),
                serde_json::Value::Null,
                ns.image(),
            );
            match self.audited(ops, record).await {
                Ok(_) => {
                    tracing::info!(name, id = %id, "namespace registered");
                    return Ok(ns);
                }
                // Registered concurrently (or an id drawn twice): read what won.
                Err(e) if canceled(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Contended {
            entity: name.into(),
            resource: "-".into(),
        })
    }

    /// Every namespace the registry holds, by name: active, soft-deleted and being purged
    /// (filter on [`Namespace::status`]). One query of the registry.
    pub async fn list_namespaces(&self) -> Result<Vec<Namespace>> {
        let items = self
            .inner
            .store
            .query(Query::table(keys::registry_pk(), Some(keys::NSID_PREFIX)))
            .await?;
        let mut out = items
            .iter()
            .map(Namespace::decode)
            .collect::<Result<Vec<_>>>()?;
        out.sort_by(|a, b| (&a.name, &a.id).cmp(&(&b.name, &b.id)));
        Ok(out)
    }

    /// Soft-delete the namespace `name`: its forward record goes and its reverse record
    /// says `deleted`, in one transaction with the audit record. Its data stays; acquires
    /// in it are refused ([`Error::NamespaceDeleted`]). `None` when no active namespace
    /// has the name (nothing written).
    pub async fn delete_namespace(&self, name: &str) -> Result<Option<Namespace>> {
        let Some(before) = self.get_namespace(name).await? else {
            return Ok(None);
        };
        let after = Namespace {
            status: NamespaceStatus::Deleted,
            deleted_at_ms: Some(self.now_ms()),
            ..before.clone()
        };
        let ops = vec![
            TransactOp::Delete(DeleteRequest {
                key: keys::namespace_forward(name),
                condition: Some(Condition::eq(ID, Value::S(before.id.clone()))),
            }),
            TransactOp::Put(PutRequest {
                key: keys::namespace_reverse(&before.id),
                item: after.item(),
                condition: Some(Condition::eq(STATUS, Value::S("active".into()))),
            }),
        ];
        let record = self.audit_record(
            Action::NamespaceDelete,
            &Target::Namespace(name.into()),
            before.image(),
            after.image(),
        );
        match self.audited(ops, record).await {
            Ok(_) => {}
            Err(e) if canceled(&e) => {
                return Err(state(name, "it changed while being deleted: try again"))
            }
            Err(e) => return Err(e.into()),
        }
        if before.id == self.inner.ns() {
            self.forget_cached();
        }
        tracing::info!(name, id = %before.id, "namespace soft-deleted");
        Ok(Some(after))
    }

    /// Recover the soft-deleted namespace `id` and return it: the forward record is put
    /// back (on condition the name was not registered again meanwhile) and the reverse
    /// record says `active`, with the audit record. [`Error::NamespaceNotFound`] for an
    /// unknown id, [`Error::NamespaceState`] when it is active or being purged, or its
    /// name is taken.
    pub async fn recover_namespace(&self, id: &str) -> Result<Namespace> {
        validate_entity_id(id)?;
        let Some(before) = self.reverse(id).await? else {
            return Err(Error::NamespaceNotFound(id.into()));
        };
        match before.status {
            NamespaceStatus::Deleted => {}
            s => return Err(state(id, format!("it is {}, not deleted", s.as_str()))),
        }
        if self.get_namespace(&before.name).await?.is_some() {
            return Err(state(
                id,
                format!("its name {:?} was registered again", before.name),
            ));
        }
        let after = Namespace {
            status: NamespaceStatus::Active,
            deleted_at_ms: None,
            ..before.clone()
        };
        let ops = vec![
            TransactOp::Put(PutRequest {
                key: keys::namespace_forward(&before.name),
                item: after.item(),
                condition: Some(Condition::not_exists("PK")),
            }),
            TransactOp::Put(PutRequest {
                key: keys::namespace_reverse(id),
                item: after.item(),
                condition: Some(Condition::eq(STATUS, Value::S("deleted".into()))),
            }),
        ];
        let record = self.audit_record(
            Action::NamespaceRecover,
            &Target::Namespace(before.name.clone()),
            before.image(),
            after.image(),
        );
        match self.audited(ops, record).await {
            Ok(_) => {}
            Err(e) if canceled(&e) => {
                return Err(state(
                    id,
                    format!(
                        "its name {:?} was registered again, or it changed meanwhile",
                        before.name
                    ),
                ))
            }
            Err(e) => return Err(e.into()),
        }
        if id == self.inner.ns() {
            self.forget_cached();
        }
        tracing::info!(id, name = %after.name, "namespace recovered");
        Ok(after)
    }

    /// Purge the soft-deleted namespace `id`: mark it `purging` (with the audit record),
    /// delete every item under its prefix, then its reverse record. Returns the items
    /// deleted (0 for an unknown id: nothing to do). [`Error::NamespaceState`] when it is
    /// active. A purge that stopped half way (an outage) is finished by running it again.
    pub async fn purge_namespace(&self, id: &str) -> Result<usize> {
        validate_entity_id(id)?;
        let Some(before) = self.reverse(id).await? else {
            return Ok(0);
        };
        if before.status == NamespaceStatus::Active {
            return Err(state(id, "it is active: delete it first"));
        }
        if before.status == NamespaceStatus::Deleted {
            let after = Namespace {
                status: NamespaceStatus::Purging,
                ..before.clone()
            };
            let ops = vec![TransactOp::Put(PutRequest {
                key: keys::namespace_reverse(id),
                item: after.item(),
                condition: Some(Condition::eq(STATUS, Value::S("deleted".into()))),
            })];
            let record = self.audit_record(
                Action::NamespacePurge,
                &Target::Namespace(before.name.clone()),
                before.image(),
                json!({ "status": "purging", "namespace_id": id }),
            );
            match self.audited(ops, record).await {
                Ok(_) => {}
                Err(e) if canceled(&e) => {
                    return Err(state(id, "it changed while being purged: try again"))
                }
                Err(e) => return Err(e.into()),
            }
        }
        let prefix = format!("{id}/");
        let mut deleted = 0usize;
        let mut after = None;
        loop {
            let page = self
                .inner
                .store
                .scan(&prefix, after.clone(), PURGE_PAGE)
                .await?;
            for entry in &page.items {
                let key = match entry {
                    Ok(item) => tollgate_core::value::Key::of(item),
                    Err(u) => Some(u.key.clone()),
                };
                if let Some(k) = key {
                    debug_assert!(k.pk.starts_with(&prefix), "a purge stays in its namespace");
                    self.inner.store.purge(&k).await?;
                    deleted += 1;
                }
            }
            match page.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        self.inner.store.purge(&keys::namespace_reverse(id)).await?;
        if id == self.inner.ns() {
            self.forget_cached();
        }
        tracing::info!(id, name = %before.name, deleted, "namespace purged");
        Ok(deleted)
    }
}
