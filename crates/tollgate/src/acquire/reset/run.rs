//! The reset and top-up operations on [`Limiter`]: the validated request, the bounded
//! read-plan-write loop that lands an operation once, and the read of every shard.

use serde_json::json;
use tollgate_core::reset::landed;

use super::*;
use crate::audit::{Action, Target};

impl Limiter {
    /// The implementation of [`crate::Admin::reset`].
    pub(crate) async fn reset(
        &self,
        entity: &str,
        resource: &str,
        op: Option<&str>,
    ) -> Result<BucketOpOutcome> {
        self.bucket_op(entity, resource, BucketOp::Reset, op).await
    }

    /// The implementation of [`crate::Admin::top_up`].
    pub(crate) async fn top_up(
        &self,
        entity: &str,
        resource: &str,
        amounts: impl Into<Amounts>,
        op: Option<&str>,
    ) -> Result<BucketOpOutcome> {
        let amounts = amounts.into().into_millitokens()?;
        if amounts.is_empty() || amounts.iter().all(|(_, a)| *a == 0) {
            return Err(Error::Invalid(RuleError::InvalidAmount {
                limit: "*".into(),
                reason: "a top-up names at least one limit with a positive amount",
            }));
        }
        self.bucket_op(entity, resource, BucketOp::TopUp(amounts), op)
            .await
    }

    async fn bucket_op(
        &self,
        entity: &str,
        resource: &str,
        kind: BucketOp,
        op: Option<&str>,
    ) -> Result<BucketOpOutcome> {
        validate_entity_id(entity)?;
        validate_resource(resource)?;
        if let Some(op) = op {
            validate_op_id(op)?;
        }
        let inner = &self.inner();
        let op: String = match op {
            Some(o) => o.to_string(),
            None => inner.audit_ids().next(inner.clock().now_ms()),
        };
        // Administrative writes read the config fresh (ADR-147: and clear the caches).
        inner.config().clear();
        inner.rejections().clear();
        inner.images().clear();
        let now = inner.clock().now_ms();
        let res = inner
            .config()
            .resolve(inner.store().as_ref(), inner.ns(), entity, resource, now)
            .await?;
        if let Some(m) = res.unreachable {
            return Err(Error::Unavailable(StoreError::Unavailable(m)));
        }
        let amounts = match &kind {
            BucketOp::Reset => Vec::new(),
            BucketOp::TopUp(a) => a.clone(),
        };
        let req = Request {
            cascade: res.cascade,
            ..inner.request_hashed(
                entity,
                resource,
                amounts,
                res.limits.clone(),
                Some(res.params_hash.clone()),
                res.source,
                now,
            )?
        };
        let (action, target) = (
            match kind {
                BucketOp::Reset => Action::BucketReset,
                BucketOp::TopUp(_) => Action::BucketTopUp,
            },
            Target::Entity {
                entity: entity.into(),
                resource: Some(resource.into()),
            },
        );
        let mut created = false;
        // The last attempt whose outcome was lost (its added amounts, shards, record id):
        // when a re-read finds the id, that attempt is the one that landed.
        let mut lost: Option<(BTreeMap<String, i64>, usize, String)> = None;
        for attempt in 0..ATTEMPTS {
            let images = self.read_shards(&req).await?;
            if images.is_empty() {
                match kind {
                    BucketOp::Reset => {
                        return Ok(BucketOpOutcome {
                            op,
                            shards: 0,
                            already_applied: false,
                            added_milli: BTreeMap::new(),
                            audit_id: None,
                        })
                    }
                    // ADR-149 D5: an entity without a bucket gets shard 0 at its share
                    // first (the anchor any zero acquire writes), then the top-up.
                    BucketOp::TopUp(_) if !created => {
                        created = true;
                        let anchor = Request {
                            amounts: Arc::from([]),
                            ..req.clone()
                        };
                        inner.acquire(&anchor).await?;
                        continue;
                    }
                    BucketOp::TopUp(_) => {
                        return Err(Error::Contended {
                            entity: entity.into(),
                            resource: resource.into(),
                        })
                    }
                }
            }
            if landed(images.iter().map(|(_, i)| i), &op) {
                inner.rejections().clear();
                inner.images().clear();
                if let Some((added, shards, id)) = lost {
                    tracing::info!(%op, entity, resource, "bucket operation landed (response lost)");
                    return Ok(BucketOpOutcome {
                        op,
                        shards,
                        already_applied: false,
                        added_milli: added,
                        audit_id: Some(id),
                    });
                }
                tracing::info!(%op, entity, resource, "bucket operation already landed");
                return Ok(BucketOpOutcome {
                    op,
                    shards: images.len(),
                    already_applied: true,
                    added_milli: BTreeMap::new(),
                    audit_id: None,
                });
            }
            if images.iter().any(|(_, i)| i.disabled) {
                return Err(Error::ResourceDisabled {
                    entity: entity.into(),
                    resource: resource.into(),
                });
            }
            let now = inner.clock().now_ms();
            let plan = plan_op(inner, &req, &kind, &images, now);
            let ops: Vec<TransactOp> = plan
                .writes
                .iter()
                .map(|w| TransactOp::Update(w.clone()))
                .collect();
            let record = self.audit_record(
                action,
                &target,
                json!({ "balances_milli": plan.before }),
                json!({
                    "op": op,
                    "balances_milli": plan.after,
                    "added_milli": plan.added,
                }),
            );
            let ops = stamp_op(ops, &op);
            let record_id = record.id.clone();
            match self.audited(ops, record).await {
                Ok(r) => {
                    inner.rejections().clear();
                    inner.images().clear();
                    return Ok(BucketOpOutcome {
                        op,
                        shards: plan.writes.len(),
                        already_applied: false,
                        added_milli: plan.added,
                        audit_id: Some(r.id),
                    });
                }
                // Lost on the way back: re-read; the next pass sees the operation's id
                // if it landed.
                Err(e @ StoreError::Ambiguous(_)) => {
                    tracing::debug!(%op, attempt, error = %e, "bucket operation outcome unknown");
                    lost = Some((plan.added, plan.writes.len(), record_id));
                }
                // Refused (an `rf`, balance or count pin moved): re-read and re-plan.
                Err(e @ StoreError::TransactionCanceled { .. })
                | Err(e @ StoreError::TransactionConflict)
                | Err(e @ StoreError::Throttled(_)) => {
                    tracing::debug!(%op, attempt, error = %e, "bucket operation retried");
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Contended {
            entity: entity.into(),
            resource: resource.into(),
        })
    }

    /// Every shard of (entity, resource) as it is, strongly consistent: shard 0 (the source
    /// of the shard count), then the others. Shards not created yet are left out.
    async fn read_shards(&self, req: &Request) -> Result<Vec<(u32, BucketImage)>> {
        let inner = &self.inner();
        let k0 = inner.bucket_key(req, 0);
        let Some(i0) = inner.store().get(&k0, true).await? else {
            return Ok(Vec::new());
        };
        let img0 = BucketImage::decode(&i0)?;
        let s = img0.shard_count.clamp(1, MAX_SHARD_COUNT);
        let mut out = vec![(0, img0)];
        if s > 1 {
            let keys: Vec<Key> = (1..s as u32).map(|i| inner.bucket_key(req, i)).collect();
            let items = inner.store().batch_get_shared(&keys, true).await?;
            for (i, item) in (1..s as u32).zip(items) {
                if let Some(item) = item {
                    out.push((i, BucketImage::decode(&item)?));
                }
            }
        }
        inner.shards().raise(&req.entity, &req.resource, s);
        Ok(out)
    }
}
