//! Administrative calls on the buckets: disable an entity's resource, double its shards.

use super::*;
use crate::audit::{Action, Target};
use tollgate_core::bypass::Enforcement;

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
        let shards: Vec<u32> = (0..s.max(0) as u32).collect();
        let target = Target::Entity {
            entity: entity.into(),
            resource: Some(resource.into()),
        };
        let action = if disabled {
            Action::Disable
        } else {
            Action::Enable
        };
        let update = if disabled {
            Update::new().set(attr::DISABLED, true)
        } else {
            Update::new().remove(attr::DISABLED)
        };
        self.stamp_shards(
            entity,
            resource,
            shards,
            action,
            &target,
            update,
            serde_json::json!({ "disabled": was, "shards": s }),
            |n| serde_json::json!({ "disabled": disabled, "shards": n }),
        )
        .await
    }

    /// ADR-151: put an entity's use of a resource in `mode` — enforce (limits refuse what
    /// they cannot cover), disabled (every acquire refused, as [`Limiter::set_disabled`]),
    /// or bypass (every acquire admitted and recorded in `tc`, `rq` and usage, no balance
    /// debited but the write-capacity meter `wcu`; no window opened or rolled, no quota
    /// reset). Every shard of the bucket is stamped in one transaction with the audit
    /// record; shards created later take shard 0's stamp. An entity without a bucket for
    /// the resource set to bypass gets its shard 0 created first (funded, no window
    /// opened) so its first request is bypassed too; set to enforce or disabled it has
    /// nothing to stamp (0, no record). Returns how many shard items were written.
    ///
    /// A process that last saw the other stamp writes once in the old shape, fails its
    /// condition and writes again in the item's (see `tollgate_core::bypass`): the stamp
    /// takes effect at once everywhere. Leases granted under one mode finish in it.
    pub async fn set_enforcement(
        &self,
        entity: &str,
        resource: &str,
        mode: Enforcement,
    ) -> Result<usize> {
        validate_entity_id(entity)?;
        validate_resource(resource)?;
        let inner = &self.inner;
        let k0 = keys::bucket(inner.ns(), entity, resource, 0);
        let mut read = inner.store.get(&k0, true).await?;
        if read.is_none() && mode == Enforcement::Bypass {
            let now = inner.clock.now_ms();
            let res = inner
                .config
                .resolve(inner.store.as_ref(), inner.ns(), entity, resource, now)
                .await?;
            let req = Request {
                cascade: res.cascade,
                bypass: true,
                ..inner.request_hashed(
                    entity,
                    resource,
                    Vec::new(),
                    res.limits,
                    Some(res.ph),
                    res.source,
                    now,
                )?
            };
            inner.slow(&req, 0, None).await?;
            read = inner.store.get(&k0, true).await?;
        }
        let (s, was) = match read {
            Some(i) => {
                let img = BucketImage::decode(&i)?;
                (img.shard_count, Enforcement::of(&img))
            }
            None => (0, Enforcement::Enforce),
        };
        let target = Target::Entity {
            entity: entity.into(),
            resource: Some(resource.into()),
        };
        let shards: Vec<u32> = (0..s.max(0) as u32).collect();
        self.stamp_shards(
            entity,
            resource,
            shards,
            Action::Enforcement,
            &target,
            mode.stamp_update(),
            serde_json::json!({ "enforcement": was.as_str(), "shards": s }),
            |n| serde_json::json!({ "enforcement": mode.as_str(), "shards": n }),
        )
        .await
    }

    /// Stamp `update` on `shards` of (entity, resource) in one transaction with the audit
    /// record (a shard deleted meanwhile is left out); 0 and no record when there are none.
    #[allow(clippy::too_many_arguments)]
    async fn stamp_shards(
        &self,
        entity: &str,
        resource: &str,
        mut shards: Vec<u32>,
        action: Action,
        target: &Target,
        update: Update,
        before: serde_json::Value,
        after: impl Fn(usize) -> serde_json::Value,
    ) -> Result<usize> {
        let inner = &self.inner;
        for _ in 0..5 {
            if shards.is_empty() {
                return Ok(0);
            }
            let ops = shards
                .iter()
                .map(|shard| {
                    TransactOp::Update(UpdateRequest {
                        key: keys::bucket(inner.ns(), entity, resource, *shard),
                        update: update.clone(),
                        condition: Some(Condition::exists("PK")),
                        returns: ReturnValues::None,
                    })
                })
                .collect();
            let record = self.audit_record(action, target, before.clone(), after(shards.len()));
            match self.audited(ops, record).await {
                Ok(_) => {
                    inner.rejections.clear();
                    inner.images.clear();
                    return Ok(shards.len());
                }
                Err(StoreError::TransactionCanceled { reasons }) => {
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
            bypass: false,
        };
        self.inner.bump(&req, old).await
    }
}
