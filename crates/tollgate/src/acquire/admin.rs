//! Administrative calls on the buckets: disable an entity's resource, double its shards.

use super::*;
use crate::audit::{Action, Target};

impl Limiter {
    /// Disable (or re-enable) an entity's use of a resource: every shard of its bucket is
    /// stamped `disabled`, which the fast path's condition and the slow path both refuse
    /// with [`Error::ResourceDisabled`]. Shards created later are disabled too (they read
    /// the stamp off shard 0). Returns how many shard items were written: every shard and
    /// the audit record in one transaction (a shard deleted meanwhile is left out); 0, and
    /// no record, when the entity has no bucket for the resource.
    pub async fn set_disabled(
        &self,
        entity: &str,
        resource: &str,
        disabled: bool,
    ) -> Result<usize> {
        validate_entity_id(entity)?;
        validate_resource(resource)?;
        let inner = &self.inner;
        let k0 = keys::bucket(inner.ns(), entity, resource, 0);
        let (s, was) = match inner.store.get(&k0, true).await? {
            Some(i) => {
                let img = BucketImage::decode(&i)?;
                (img.shard_count, img.disabled)
            }
            None => (0, false),
        };
        let mut shards: Vec<u32> = (0..s.max(0) as u32).collect();
        let target = Target::Entity {
            entity: entity.into(),
            resource: Some(resource.into()),
        };
        let action = if disabled {
            Action::Disable
        } else {
            Action::Enable
        };
        for _ in 0..5 {
            if shards.is_empty() {
                return Ok(0);
            }
            let ops = shards
                .iter()
                .map(|shard| {
                    TransactOp::Update(UpdateRequest {
                        key: keys::bucket(inner.ns(), entity, resource, *shard),
                        update: if disabled {
                            Update::new().set(attr::DISABLED, true)
                        } else {
                            Update::new().remove(attr::DISABLED)
                        },
                        condition: Some(Condition::exists("PK")),
                        returns: ReturnValues::None,
                    })
                })
                .collect();
            let record = self.audit_record(
                action,
                &target,
                serde_json::json!({ "disabled": was, "shards": s }),
                serde_json::json!({ "disabled": disabled, "shards": shards.len() }),
            );
            match self.audited(ops, record).await {
                Ok(_) => {
                    inner.rejections.clear();
                    inner.images.clear();
                    return Ok(shards.len());
                }
                Err(StoreError::TransactionCanceled { reasons }) => {
                    // Leave out the shards that are gone; anything else is a failure.
                    let gone: Vec<usize> = reasons
                        .iter()
                        .enumerate()
                        .filter(|(_, r)| matches!(r, CancelReason::ConditionFailed { old: None }))
                        .map(|(i, _)| i)
                        .collect();
                    if gone.is_empty() || gone.iter().any(|i| *i >= shards.len()) {
                        return Err(StoreError::TransactionCanceled { reasons }.into());
                    }
                    shards = shards
                        .into_iter()
                        .enumerate()
                        .filter(|(i, _)| !gone.contains(i))
                        .map(|(_, s)| s)
                        .collect();
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Contended {
            entity: entity.into(),
            resource: resource.into(),
        })
    }

    /// Double the shard count of (entity, resource) from `old` by compare-and-set on shard
    /// 0 (refused at 32; a loser adopts the winner's count). Returns the count now in force.
    /// Acquires do this by themselves when a shard runs out of write capacity; operators and
    /// tests may do it ahead of a known hot spot.
    pub async fn bump_shard_count(&self, entity: &str, resource: &str, old: i64) -> Result<i64> {
        validate_entity_id(entity)?;
        validate_resource(resource)?;
        let req = Request {
            entity: entity.into(),
            resource: resource.into(),
            amounts: Vec::new(),
            limits: Vec::new().into(),
            ph: "".into(),
            ttl: TtlWrite::Remove,
            cascade: false,
        };
        self.inner.bump(&req, old).await
    }
}
