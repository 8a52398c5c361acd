//! ADR-150: move an entity to a new parent (or make it a root).
//!
//! tollgate keeps the parent on the entity's META only (bucket items do not copy it): an
//! acquire that cascades resolves the parent with the config, so the move reaches this
//! process's acquires at once and other processes' within their config cache TTL, like
//! any configuration change. The META carries a parent generation `pgen`, bumped by every
//! move and pinned by the next one, so two concurrent moves serialise and each record's
//! "before" is exactly what it replaced. A lease granted before the move keeps the parent
//! bucket it debited (its parts hold the keys), so its adjustments and rollback go there.

use serde_json::json;
use tollgate_core::expr::Condition;
use tollgate_core::expr::Update;
use tollgate_core::ids::validate_entity_id;
use tollgate_core::keys;
use tollgate_core::value::{Item, Value};
use tollgate_store::{StoreError, TransactOp, UpdateRequest};

use crate::audit::{self, Action, Target};
use crate::error::{Error, Result};
use crate::limiter::Limiter;

/// The META attribute holding the parent generation.
pub const PGEN: &str = "pgen";
/// The deepest ancestry the cycle check walks (upstream's bound).
pub const MAX_DEPTH: usize = 32;
const ATTEMPTS: u32 = 5;

/// What [`crate::Admin::set_parent`] did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Moved {
    /// The entity.
    pub id: String,
    /// Its parent before the move.
    pub old_parent: Option<String>,
    /// Its parent now.
    pub parent_id: Option<String>,
    /// The parent generation written.
    pub pgen: i64,
    /// The audit record (`None`: the entity already had that parent, nothing written).
    pub audit_id: Option<String>,
}

fn parent_of(i: &Item) -> Option<String> {
    i.get("parent_id").and_then(Value::as_s).map(str::to_string)
}

impl Limiter {
    /// The implementation of [`crate::Admin::set_parent`].
    pub(crate) async fn set_parent(&self, entity: &str, parent: Option<&str>) -> Result<Moved> {
        validate_entity_id(entity)?;
        if let Some(p) = parent {
            validate_entity_id(p)?;
        }
        let inner = &self.inner();
        let ns = inner.ns();
        let key = keys::entity_meta(ns, entity);
        for _ in 0..ATTEMPTS {
            let Some(meta) = inner.store().get(&key, true).await? else {
                return Err(Error::EntityNotFound(entity.into()));
            };
            let old_parent = parent_of(&meta);
            let pgen = meta.get(PGEN).and_then(Value::as_n).unwrap_or(0);
            if old_parent.as_deref() == parent {
                return Ok(Moved {
                    id: entity.into(),
                    old_parent: old_parent.clone(),
                    parent_id: old_parent,
                    pgen,
                    audit_id: None,
                });
            }
            if let Some(p) = parent {
                self.check_ancestry(entity, p).await?;
            }
            let mut u = Update::new().set(PGEN, pgen + 1);
            u = match parent {
                Some(p) => u
                    .set("parent_id", p)
                    .set("GSI1PK", keys::gsi1_parent(ns, p))
                    .set("GSI1SK", format!("CHILD#{entity}")),
                None => u
                    .set("parent_id", Value::Null)
                    .remove("GSI1PK")
                    .remove("GSI1SK"),
            };
            // Rule "a move pins the generation it read" (ADR-150): a concurrent move of the
            // same entity makes this one re-read.
            let pin = match meta.get(PGEN) {
                Some(v) => Condition::eq(PGEN, v.clone()),
                None => Condition::exists("PK").and(Condition::not_exists(PGEN)),
            };
            let record = self.audit_record(
                Action::EntityMove,
                &Target::Entity {
                    entity: entity.into(),
                    resource: None,
                },
                json!({ "parent_id": old_parent, "pgen": pgen }),
                json!({ "parent_id": parent, "pgen": pgen + 1 }),
            );
            let id = record.id.clone();
            let op = TransactOp::Update(UpdateRequest {
                key: key.clone(),
                update: u.set(audit::AUDIT_ID, id.clone()),
                condition: Some(pin),
                returns: tollgate_core::expr::ReturnValues::None,
            });
            match self.audited(vec![op], record).await {
                Ok(_) => {
                    inner.config().evict(&key);
                    inner.rejections().clear();
                    inner.images().clear();
                    tracing::info!(entity, parent, pgen = pgen + 1, "entity moved");
                    return Ok(Moved {
                        id: entity.into(),
                        old_parent,
                        parent_id: parent.map(str::to_string),
                        pgen: pgen + 1,
                        audit_id: Some(id),
                    });
                }
                Err(e) if audit::moved(&e, 0).is_some() => continue,
                Err(StoreError::TransactionConflict) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Contended {
            entity: entity.into(),
            resource: "".into(),
        })
    }

    /// Rule "no entity is its own ancestor" (ADR-150): walk `parent`'s ancestry (at most
    /// [`MAX_DEPTH`] levels, strongly consistent reads); finding `entity` refuses the move.
    /// The new parent must exist.
    async fn check_ancestry(&self, entity: &str, parent: &str) -> Result<()> {
        let ns = self.inner().ns();
        let mut at = parent.to_string();
        for depth in 0..=MAX_DEPTH {
            if at == entity {
                return Err(Error::ParentCycle {
                    entity: entity.into(),
                    parent: parent.into(),
                });
            }
            if depth == MAX_DEPTH {
                break;
            }
            let Some(meta) = self
                .inner()
                .store()
                .get(&keys::entity_meta(ns, &at), true)
                .await?
            else {
                if at == parent {
                    return Err(Error::EntityNotFound(parent.into()));
                }
                return Ok(());
            };
            match parent_of(&meta) {
                Some(p) => at = p,
                None => return Ok(()),
            }
        }
        Ok(())
    }
}
