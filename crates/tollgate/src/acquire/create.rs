//! Creating a shard's item (seeded by a move or a split), and doubling the shard count.

use super::*;

impl Inner {
    /// Create a missing shard item (Put if absent, in one transaction with the moves that
    /// fund its quotas and the split that funds its dripping limits). Losing the race
    /// continues on the winner's item.
    pub(super) async fn create(
        self: &Arc<Self>,
        req: &Request,
        shard: u32,
        key: &Key,
        now: i64,
        moves: bool,
        known: &mut Option<Arc<BucketImage>>,
    ) -> Pass<Lease> {
        let cached = self.shards().count(&req.entity, &req.resource).unwrap_or(1);
        let shaped;
        let mut req = req;
        if shard != 0 {
            // A disabled entity stays disabled on the shards it grows, a bypassed one
            // bypassed (ADR-151: shard 0's stamp decides).
            let k0 = self.bucket_key(req, 0);
            if let Some(i) = self.store().get(&k0, true).await? {
                let s0 = BucketImage::decode(&i)?;
                if s0.disabled {
                    return Err(Flow::Fail(Error::ResourceDisabled {
                        entity: req.entity.to_string(),
                        resource: req.resource.to_string(),
                    }));
                }
                if s0.bypass != req.bypass {
                    shaped = Request {
                        bypass: s0.bypass,
                        ..req.clone()
                    };
                    req = &shaped;
                }
            }
        }
        let all: Vec<&Limit> = req.limits.iter().collect();
        let plan = shards::plan_seeds_of(
            self,
            req,
            &all,
            shard,
            cached.max(shard as i64 + 1),
            now,
            moves,
            true,
        )
        .await?;
        if let Some(first) = plan.split_first {
            // The family splits one level at a time: create the covering sibling's buddy
            // (nothing charged there), then plan this slot again.
            Box::pin(self.create_empty(req, first, moves)).await?;
            return Err(Flow::Reread);
        }
        let s = plan.shard_count;
        let now = plan.now.max(self.clock().now_ms());
        let evals: Vec<Evaluated> = req
            .limits
            .iter()
            .map(|l| {
                let e = evaluate(l, None, now, s, now, plan.seed(l.name()));
                if req.bypass {
                    tollgate_core::bypass::hold(e, None, now)
                } else {
                    e
                }
            })
            .collect();
        let refusal = self.refuse(req, &evals, s, now);
        if let (Some(x), true) = (&refusal, plan.moves.is_empty() && plan.splits.is_empty()) {
            if s > 1 {
                return self
                    .entity_acquire(req, s, shard, now)
                    .await
                    .map_err(Flow::from);
            }
            return Err(Flow::Fail(Error::RateLimitExceeded(x.clone())));
        }
        let amounts: &[(String, i64)] = if refusal.is_some() { &[] } else { &req.amounts };
        let rf = next_rf(now, None, &evals);
        let stamp = ItemStamp {
            refilled_at_ms: rf,
            valid_until_ms: if req.bypass {
                Some(tollgate_core::bypass::VALID_UNTIL)
            } else {
                valid_until(&req.limits, &evals, now)
            },
            ttl: req.ttl,
            params_hash: &req.params_hash,
            read: None,
        };
        let id = BucketIdentity {
            ns: self.ns(),
            entity: &req.entity,
            resource: &req.resource,
            shard,
            shard_count: s,
        };
        let mut item = create_item(&id, &stamp, &req.limits, &evals, amounts);
        if req.bypass {
            tollgate_core::bypass::stamp_created(&mut item, &evals);
        }
        // An item created with nothing asked (a split's intermediate level, a bypassed
        // scope's first shard) counts no request.
        tollgate_core::usage::stamp_created(
            &mut item,
            refusal.is_none() && !(req.bypass && req.amounts.is_empty()),
            now,
        );
        // ADR-146: the effective cascade policy is stamped on every item the slow path writes.
        item.insert(attr::CASCADE.into(), req.cascade.into());
        let put = PutRequest {
            key: key.clone(),
            item: item.clone(),
            condition: Some(Condition::not_exists("PK")),
        };
        // A create on shard 0 is pinned by its own `attribute_not_exists(PK)`; any other
        // shard that grants a quota pins shard 0's count as read.
        let pin = match plan.shard0 {
            Some(s0) if evals.iter().any(|e| e.grant_count.is_some()) => {
                Some(s0.map_or(CountPin::Absent, CountPin::Count))
            }
            _ => None,
        };
        let mut moves_ops = plan.moves.clone();
        moves_ops.extend(plan.splits.iter().cloned());
        let landed = self
            .commit_slot(req, shard, TransactOp::Put(put), &moves_ops, pin)
            .await?;
        match (landed, refusal) {
            (Landed::Wrote(_), Some(x)) => {
                self.shards().raise(&req.entity, &req.resource, s);
                self.images().forget(&req.entity, &req.resource, shard);
                if s > 1 {
                    return self
                        .entity_acquire(req, s, shard, now)
                        .await
                        .map_err(Flow::from);
                }
                Err(Flow::Fail(Error::RateLimitExceeded(x)))
            }
            (Landed::Wrote(_), None) => {
                Stats::bump(&self.stats().slow_admits);
                self.shards().raise(&req.entity, &req.resource, s);
                for m in &moves_ops {
                    self.rejections()
                        .forget(&req.entity, &req.resource, m.shard);
                    self.images().forget(&req.entity, &req.resource, m.shard);
                }
                let mut full = item;
                full.insert(
                    "PK".into(),
                    tollgate_core::value::Value::S(key.pk.to_string()),
                );
                full.insert(
                    "SK".into(),
                    tollgate_core::value::Value::S(key.sk.to_string()),
                );
                let new = self.remember(req, shard, key, Some(&full), None)?;
                self.after_materialise(req, shard, s, &evals).await;
                Ok(self.lease(req, shard, key.clone(), &evals, None, new, s, now))
            }
            (Landed::LostLock(old), _) => {
                let old = old.as_deref().map(BucketImage::decode).transpose()?;
                Box::pin(self.after_lost_lock(
                    req,
                    shard,
                    key,
                    s,
                    i64::MIN,
                    &evals,
                    old,
                    now,
                    known,
                ))
                .await
            }
        }
    }

    /// Create shard `shard` charging nothing (an intermediate level of a dripping split);
    /// losing the race to another creator is fine.
    pub(super) async fn create_empty(
        self: &Arc<Self>,
        req: &Request,
        shard: u32,
        moves: bool,
    ) -> Result<()> {
        let empty = Request {
            amounts: Arc::from([]),
            ..req.clone()
        };
        let key = self.bucket_key(req, shard);
        match self.slow_once(&empty, shard, &key, moves, None).await {
            Ok(_) | Err(Error::RateLimitExceeded(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Work that follows a landed materialising write: propagate opened windows.
    pub(super) async fn after_materialise(
        &self,
        req: &Request,
        shard: u32,
        s: i64,
        evals: &[Evaluated],
    ) {
        shards::fan_out(self, req, shard, s, evals).await;
    }

    /// Rule "shard doubling": double the count on shard 0 by compare-and-set (never above
    /// 32, never lowered; a loser adopts the winner's count), then propagate it to the
    /// other shards (best effort, monotone). Every shard written is sent to the slow path
    /// once (`vu = 0`) so its dripping limits shrink to the new share.
    pub(crate) async fn bump(&self, req: &Request, old: i64) -> Result<i64> {
        let Some(plan) =
            tollgate_core::plan::doubling(ShardCount(old), self.opts().max_shard_count)
        else {
            return Ok(old);
        };
        let new = plan.new.get();
        let (update, condition) = plan.shard0;
        let r = self
            .store()
            .update(UpdateRequest {
                key: self.bucket_key(req, 0),
                update,
                condition: Some(condition),
                returns: ReturnValues::None,
            })
            .await;
        let got = match r {
            Ok(_) => {
                Stats::bump(&self.stats().doublings);
                tracing::info!(old, new, "shard count doubled");
                for s in 1..old as u32 {
                    let r = self
                        .store()
                        .update(UpdateRequest {
                            key: self.bucket_key(req, s),
                            update: plan.others.0.clone(),
                            condition: Some(plan.others.1.clone()),
                            returns: ReturnValues::None,
                        })
                        .await;
                    if let Err(e) = r {
                        tracing::debug!(error = %e, shard = s, "shard count propagation skipped");
                    }
                }
                new
            }
            Err(StoreError::ConditionFailed { old: item }) => match item {
                Some(i) => BucketImage::decode(&i)?.shard_count.max(old),
                None => old,
            },
            Err(e) => return Err(e.into()),
        };
        self.shards().raise(&req.entity, &req.resource, got);
        Ok(got)
    }
}
