//! Entity administration: [`Entity`] and its META item; create, read, list children and
//! delete ([`EntityDeleted`]).

use std::collections::BTreeMap;

use serde_json::Value as Json;
use tollgate_core::expr::Condition;
use tollgate_core::ids::validate_entity_id;
use tollgate_core::keys;
use tollgate_core::value::{Item, Key, Value};
use tollgate_core::RuleError;
use tollgate_store::{DeleteRequest, PutRequest, Query, Store, StoreError, TransactOp};

use crate::audit::{self, Action, Target};
use crate::config;
use crate::doctor::{self, CorruptItem, Repair};
use crate::error::{Error, Result};
use crate::limiter::Limiter;

/// What [`crate::Admin::delete_entity_with_repairs`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct EntityDeleted {
    /// Items deleted (0 if the entity did not exist).
    pub deleted_items: usize,
    /// The corrupt items among them.
    pub repairs: Vec<Repair>,
}

/// An entity from its META item.
fn entity_of(id: &str, i: &Item) -> Result<Entity> {
    let s = |a: &str| i.get(a).and_then(Value::as_s).map(str::to_string);
    let metadata = match i.get("metadata") {
        Some(Value::M(m)) => m
            .iter()
            .filter_map(|(k, v)| v.as_s().map(|v| (k.clone(), v.to_string())))
            .collect(),
        _ => BTreeMap::new(),
    };
    Ok(Entity {
        id: id.into(),
        name: s("name").unwrap_or_else(|| id.into()),
        parent_id: s("parent_id"),
        cascade: config::decode_cascade(i)?.unwrap_or(false),
        metadata,
        created_at_ms: i.get("created_at").and_then(Value::as_n).unwrap_or(0),
    })
}

/// The "before" of an entity's deletion: its META (as the entity, `null` without one), the
/// limits stored for it per resource, and how many items were deleted.
fn entity_image(id: &str, images: &[(Key, Option<Item>)]) -> Json {
    let mut entity = Json::Null;
    let mut limits = serde_json::Map::new();
    for (k, item) in images {
        let Some(item) = item else { continue };
        if &*k.sk == keys::META {
            entity = match entity_of(id, item) {
                Ok(e) => serde_json::to_value(e).unwrap_or_default(),
                Err(err) => serde_json::json!({ "corrupt": err.to_string() }),
            };
        } else if let Some(r) = k.sk.strip_prefix("#CONFIG#") {
            limits.insert(r.into(), audit::config_image(Some(item)));
        }
    }
    serde_json::json!({ "entity": entity, "limits": limits, "items": images.len() })
}

/// An entity (a user, key or tenant).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Entity {
    /// Id.
    pub id: String,
    /// Display name (defaults to the id).
    pub name: String,
    /// Parent entity, if any.
    pub parent_id: Option<String>,
    /// The entity's base cascade policy (META `cascade`, ADR-146): whether its acquires
    /// also debit the parent where no config level says otherwise.
    #[serde(default)]
    pub cascade: bool,
    /// Free-form metadata.
    pub metadata: BTreeMap<String, String>,
    /// Creation time (epoch ms).
    pub created_at_ms: i64,
}

/// Options of [`crate::Admin::create_entity_with`].
#[derive(Debug, Clone, Default)]
pub struct NewEntity<'a> {
    /// Display name (defaults to the id).
    pub name: Option<&'a str>,
    /// Parent entity, if any.
    pub parent_id: Option<&'a str>,
    /// Base cascade policy (META `cascade`, ADR-146).
    pub cascade: bool,
    /// Free-form metadata.
    pub metadata: BTreeMap<String, String>,
}

impl Limiter {
    /// The implementation of [`crate::Admin::create_entity`].
    pub(crate) async fn create_entity(
        &self,
        id: &str,
        name: Option<&str>,
        parent_id: Option<&str>,
        metadata: BTreeMap<String, String>,
    ) -> Result<Entity> {
        self.create_entity_with(
            id,
            NewEntity {
                name,
                parent_id,
                cascade: false,
                metadata,
            },
        )
        .await
    }

    /// The implementation of [`crate::Admin::create_entity_with`].
    pub(crate) async fn create_entity_with(&self, id: &str, new: NewEntity<'_>) -> Result<Entity> {
        let NewEntity {
            name,
            parent_id,
            cascade,
            metadata,
        } = new;
        validate_entity_id(id)?;
        if let Some(p) = parent_id {
            validate_entity_id(p)?;
            if p == id {
                return Err(Error::Invalid(RuleError::InvalidIdentifier {
                    value: p.into(),
                    reason: "an entity cannot be its own parent",
                }));
            }
        }
        let ns = self.inner().ns();
        let e = Entity {
            id: id.into(),
            name: name.unwrap_or(id).into(),
            parent_id: parent_id.map(str::to_string),
            cascade,
            metadata,
            created_at_ms: self.now_ms(),
        };
        let mut item = Item::new();
        item.insert("entity_id".into(), e.id.clone().into());
        item.insert("name".into(), e.name.clone().into());
        item.insert("created_at".into(), Value::N(e.created_at_ms));
        item.insert(config::CASCADE.into(), Value::Bool(e.cascade));
        item.insert(
            "metadata".into(),
            Value::M(Box::new(
                e.metadata
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::S(v.clone())))
                    .collect(),
            )),
        );
        match &e.parent_id {
            Some(p) => {
                item.insert("parent_id".into(), p.clone().into());
                item.insert("GSI1PK".into(), keys::gsi1_parent(ns, p).into());
                item.insert("GSI1SK".into(), format!("CHILD#{id}").into());
            }
            None => {
                item.insert("parent_id".into(), Value::Null);
            }
        }
        let target = Target::Entity {
            entity: id.into(),
            resource: None,
        };
        let after = serde_json::to_value(&e).unwrap_or_default();
        let record = self.audit_record(Action::EntityCreate, &target, Json::Null, after);
        item.insert(audit::AUDIT_ID.into(), Value::S(record.id.clone()));
        let put = TransactOp::Put(PutRequest {
            key: keys::entity_meta(ns, id),
            item,
            condition: Some(Condition::not_exists("PK")),
        });
        match self.audited(vec![put], record).await {
            Ok(_) => {
                // The META is cached with the config (parent and cascade policy).
                self.inner().config().evict(&keys::entity_meta(ns, id));
                Ok(e)
            }
            Err(err) if audit::moved(&err, 0).is_some() => Err(Error::EntityExists(id.into())),
            Err(err) => Err(err.into()),
        }
    }

    /// Read an entity (`None` if absent).
    pub async fn get_entity(&self, id: &str) -> Result<Option<Entity>> {
        validate_entity_id(id)?;
        let key = keys::entity_meta(self.inner().ns(), id);
        let Some(i) = self.inner().store().get(&key, true).await? else {
            return Ok(None);
        };
        entity_of(id, &i).map(Some)
    }

    /// Children of an entity.
    pub async fn children(&self, id: &str) -> Result<Vec<String>> {
        validate_entity_id(id)?;
        let items = self
            .inner()
            .store()
            .query(Query::index(
                "GSI1",
                keys::gsi1_parent(self.inner().ns(), id),
                Some("CHILD#"),
            ))
            .await?;
        Ok(items
            .iter()
            .filter_map(|i| i.get("entity_id").and_then(Value::as_s).map(str::to_string))
            .collect())
    }

    /// The implementation of [`crate::Admin::delete_entity`].
    pub(crate) async fn delete_entity(&self, id: &str) -> Result<usize> {
        Ok(self.delete_entity_with_repairs(id).await?.deleted_items)
    }

    /// The implementation of [`crate::Admin::delete_entity_with_repairs`].
    pub(crate) async fn delete_entity_with_repairs(&self, id: &str) -> Result<EntityDeleted> {
        validate_entity_id(id)?;
        let ns = self.inner().ns();
        let store = &self.inner().store();
        let entity_pk = keys::entity_pk(ns, id);
        // Each key with its item when the query returned one (an index query returns keys).
        let mut images: Vec<(Key, Option<Item>)> =
            match store.query(Query::table(entity_pk.clone(), None)).await {
                Ok(items) => items
                    .into_iter()
                    .filter_map(|i| Some((Key::of(&i)?, Some(i))))
                    .collect(),
                Err(StoreError::Corrupt(_)) => doctor::scan_all(store.as_ref(), &entity_pk)
                    .await?
                    .iter()
                    .filter_map(doctor::scanned_key)
                    .filter(|k| *k.pk == *entity_pk)
                    .map(|k| (k, None))
                    .collect(),
                Err(e) => return Err(e.into()),
            };
        match store
            .query(Query::index(
                "GSI3",
                keys::gsi3_entity(ns, id),
                Some("BUCKET#"),
            ))
            .await
        {
            Ok(items) => images.extend(items.iter().filter_map(Key::of).map(|k| (k, None))),
            Err(StoreError::Corrupt(_)) => {
                // `{ns}/BUCKET#{id}#`: ids hold no `#`, so this entity's buckets only.
                let prefix = format!("{ns}/BUCKET#{id}#");
                images.extend(
                    doctor::scan_all(store.as_ref(), &prefix)
                        .await?
                        .iter()
                        .filter_map(doctor::scanned_key)
                        .map(|k| (k, None)),
                );
            }
            Err(e) => return Err(e.into()),
        }
        if images.is_empty() {
            return Ok(EntityDeleted::default());
        }
        // The record lands with the first delete — the META's, or another item the query
        // returned — so a deletion that starts landing is recorded even if a later delete
        // fails. Without any item image (keys from the index, or a scan after a corrupt
        // item), the record is written first, on its own: never a deletion without one.
        let anchor = images
            .iter()
            .position(|(k, i)| &*k.sk == keys::META && i.is_some())
            .or_else(|| images.iter().position(|(_, i)| i.is_some()));
        let target = Target::Entity {
            entity: id.into(),
            resource: None,
        };
        let record = self.audit_record(
            Action::EntityDelete,
            &target,
            entity_image(id, &images),
            Json::Null,
        );
        let mut repairs = Vec::new();
        let mut anchor_key = None;
        match anchor.map(|a| images[a].clone()) {
            Some((k, old)) => {
                let delete = TransactOp::Delete(DeleteRequest {
                    key: k.clone(),
                    condition: None,
                });
                self.audited(vec![delete], record).await?;
                if let Some(c) = old.and_then(|old| doctor::check_item(ns, &k, &old)) {
                    repairs.push(Repair::logged(c, format!("deleted with entity {id}")));
                }
                anchor_key = Some(k);
            }
            None => {
                self.audited(Vec::new(), record).await?;
            }
        }
        let keys_to_delete: Vec<Key> = images.into_iter().map(|(k, _)| k).collect();
        for k in keys_to_delete
            .iter()
            .filter(|k| Some(*k) != anchor_key.as_ref())
        {
            let req = DeleteRequest {
                key: k.clone(),
                condition: None,
            };
            let corrupt = match store.delete(req).await {
                Ok(old) => old.and_then(|old| doctor::check_item(ns, k, &old)),
                // The store cannot return the old item: delete it without.
                Err(StoreError::Corrupt(m)) => {
                    store.purge(k).await?;
                    Some(CorruptItem::from_message(ns, k, &m))
                }
                Err(e) => return Err(e.into()),
            };
            if let Some(c) = corrupt {
                repairs.push(Repair::logged(c, format!("deleted with entity {id}")));
            }
        }
        self.inner().shards().forget_entity(id);
        self.forget_cached();
        Ok(EntityDeleted {
            deleted_items: keys_to_delete.len(),
            repairs,
        })
    }
}
