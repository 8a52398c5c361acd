//! Rule "a debit belongs to the entity" (the planner is `tollgate_core::spread`), executed:
//! when the shard an acquire (or a lease's reported usage) was aimed at cannot cover it,
//! read every shard of the entity (strongly consistently), materialise each, and either
//! charge several shards in one transaction — all or none — or refuse with statuses that
//! speak of what the entity has (the same balances the decision used).
//!
//! The entity-wide debit and the shard types it works over are here; its two entry points,
//! an acquire and a lease's usage, are in `admit`, and the types it exchanges with a lease
//! in `landing`.

mod admit;
mod landing;

use std::collections::BTreeMap;
use std::sync::Arc;

use tollgate_core::bucket::BucketImage;
use tollgate_core::materialize::Evaluated;
use tollgate_core::mutants::{self, Mutant};
use tollgate_core::spread::{plan_refund, plan_spread};
use tollgate_core::status::{limit_status, ShardView};
use tollgate_core::value::Key;
use tollgate_core::writes::Charging;
use tollgate_core::LimitStatus;
use tollgate_store::{CancelReason, StoreError, TransactOp};

use crate::error::{Error, Result};
use crate::limiter::Inner;
use crate::request::{backoff, Request};

pub(crate) use landing::{Landing, RideAlong};

/// One shard as the entity-wide planner saw it.
struct Seen {
    shard: u32,
    key: Key,
    item: Option<std::sync::Arc<tollgate_core::value::Item>>,
    img: Option<BucketImage>,
    /// Materialised at now, one per limit of the request (empty: the shard cannot take
    /// part — it does not exist, or does not carry every limit yet).
    evals: Vec<Evaluated>,
}

/// One shard an entity-wide charge wrote, with the evaluations behind its write.
pub(crate) struct Touched {
    pub landing: Landing,
    pub evals: Vec<Evaluated>,
}

/// What an entity-wide charge did.
pub(crate) enum Charged {
    /// Landed: per shard touched, what was charged there.
    Landed(Vec<Touched>),
    /// The entity cannot pay (acquires only): the statuses that say so.
    Short(Vec<LimitStatus>),
}

impl Inner {
    async fn read_entity(&self, req: &Request, s: i64) -> Result<Vec<Seen>> {
        let keys: Vec<Key> = (0..s as u32).map(|i| self.bucket_key(req, i)).collect();
        let items = self.store().batch_get_shared(&keys, true).await?;
        let mut out = Vec::with_capacity(keys.len());
        for (i, (key, item)) in keys.into_iter().zip(items).enumerate() {
            let img = item
                .as_ref()
                .map(|it| self.decode_shard(req, i as u32, it, key.clone()))
                .transpose()?;
            out.push(Seen {
                shard: i as u32,
                key,
                item,
                img,
                evals: Vec::new(),
            });
        }
        Ok(out)
    }

    /// Materialise every shard that carries all the request's limits at `now`.
    fn materialise_seen(&self, req: &Request, seen: &mut [Seen], s: i64, now: i64) {
        for x in seen.iter_mut() {
            x.evals = match &x.img {
                Some(img) if req.limits.iter().all(|l| img.limits.contains_key(l.name())) => req
                    .limits
                    .iter()
                    .map(|l| {
                        tollgate_core::materialize::evaluate(
                            l,
                            img.limits.get(l.name()),
                            img.refilled_at_ms,
                            s.max(img.shard_count),
                            now,
                            None,
                        )
                    })
                    .collect(),
                _ => Vec::new(),
            };
        }
    }

    /// Read every shard, plan with `plan_spread` per limit, commit all or none (bounded
    /// re-plans on conflicts), or report the entity short.
    pub(crate) async fn entity_debit(
        self: &Arc<Self>,
        req: &Request,
        s: i64,
        preferred: u32,
        amounts: &[(String, i64)],
        debt: bool,
        extra: &[RideAlong<'_>],
    ) -> Result<Charged> {
        let mut s = s.max(1);
        for attempt in 0..5u32 {
            let mut seen = match self.read_entity(req, s).await {
                Err(Error::Unavailable(e)) if e.is_retryable() => {
                    tokio::time::sleep(backoff(attempt)).await;
                    continue;
                }
                r => r?,
            };
            let stored = seen
                .first()
                .and_then(|x| x.img.as_ref())
                .map_or(1, |i| i.shard_count);
            if stored > s {
                s = stored;
                self.shards().raise(&req.entity, &req.resource, s);
                seen = self.read_entity(req, s).await?;
            }
            // Materialised at the instant after the read: the writes carry this `now`.
            let now = self.clock().now_ms();
            self.materialise_seen(req, &mut seen, s, now);
            if !debt
                && seen
                    .iter()
                    .any(|x| x.img.as_ref().is_some_and(|i| i.disabled))
            {
                return Err(Error::ResourceDisabled {
                    entity: req.entity.to_string(),
                    resource: req.resource.to_string(),
                });
            }
            // Per limit: the takes per shard.
            let mut plan: Vec<(String, Vec<i64>)> = Vec::new();
            let mut short = false;
            for (n, a) in amounts {
                let Some(li) = req.limits.iter().position(|l| l.name() == n) else {
                    continue;
                };
                let balances: Vec<Option<i64>> = seen
                    .iter()
                    .map(|x| {
                        let only_preferred = !debt && mutants::off(Mutant::EntityDebit);
                        if only_preferred && x.shard != preferred {
                            return None;
                        }
                        x.evals.get(li).map(|e| e.balance)
                    })
                    .collect();
                // ADR-151: a soft limit is taken like usage (debt allowed), never short.
                let owed = debt || tollgate_core::soft::exempt(&req.limits, n);
                match plan_spread(&balances, preferred as usize, *a, owed) {
                    Some(t) => plan.push((n.clone(), t)),
                    None => short = true,
                }
            }
            if short {
                return Ok(Charged::Short(
                    self.entity_statuses(req, &seen, amounts, s, now),
                ));
            }
            // Per shard touched: its amounts.
            let mut per_shard: BTreeMap<u32, Vec<(String, i64)>> = BTreeMap::new();
            for (n, takes) in &plan {
                for (i, t) in takes.iter().enumerate() {
                    if *t != 0 {
                        per_shard.entry(i as u32).or_default().push((n.clone(), *t));
                    }
                }
            }
            if per_shard.is_empty() {
                per_shard.insert(preferred, Vec::new());
            }
            // The lease's refunds: in its period they credit the balance, past it `tc` only.
            let mut tc_only: BTreeMap<u32, Vec<String>> = BTreeMap::new();
            for r in extra {
                let x = seen.get(r.shard as usize);
                let item = x.and_then(|x| x.item.as_deref());
                for (n, m) in &r.refunds {
                    let li = req.limits.iter().position(|l| l.name() == n);
                    if r.spread && li.is_some_and(|i| !req.limits[i].is_quota()) {
                        let li = li.unwrap_or(0);
                        let balances: Vec<Option<i64>> = seen
                            .iter()
                            .map(|x| x.evals.get(li).map(|e| e.balance))
                            .collect();
                        for (i, c) in plan_refund(&balances, *m).into_iter().enumerate() {
                            if c != 0 {
                                per_shard.entry(i as u32).or_default().push((n.clone(), -c));
                            }
                        }
                        continue;
                    }
                    // Its period ended (the pin fails), or this very write resets it.
                    let resets = x.is_some_and(|x| {
                        x.evals
                            .iter()
                            .any(|e| e.name == *n && e.transition.is_set())
                    });
                    if resets
                        || r.pins
                            .get(n)
                            .is_some_and(|p| !tollgate_store::eval::eval_condition(item, p))
                    {
                        tc_only.entry(r.shard).or_default().push(n.clone());
                    }
                    per_shard.entry(r.shard).or_default().push((n.clone(), -m));
                }
            }
            // One amount per limit per shard (a take and a refund of the same limit, or two
            // parts' refunds, land as their sum: a write names each limit once).
            for amts in per_shard.values_mut() {
                let mut merged: Vec<(String, i64)> = Vec::with_capacity(amts.len());
                for (n, a) in amts.drain(..) {
                    match merged.iter_mut().find(|(m, _)| *m == n) {
                        Some((_, t)) => *t += a,
                        None => merged.push((n, a)),
                    }
                }
                *amts = merged;
            }
            let mut ops = Vec::new();
            let mut touched = Vec::new();
            let mut grants = false;
            for (shard, amts) in &per_shard {
                let x = &seen[*shard as usize];
                let Some(img) = &x.img else { continue };
                if x.evals.is_empty() {
                    continue;
                }
                grants |= x.evals.iter().any(|e| e.grant_count.is_some());
                let tc_only = tc_only.get(shard).map_or(&[][..], |v| v.as_slice());
                let (write, _) = self.materialising_write(
                    req,
                    &x.key,
                    img,
                    &x.evals,
                    amts,
                    Charging { debt, tc_only },
                    now,
                );
                ops.push(TransactOp::Update(write));
                touched.push(Touched {
                    landing: Landing {
                        shard: *shard,
                        key: x.key.clone(),
                        charged: amts.clone(),
                    },
                    evals: x.evals.clone(),
                });
            }
            if !debt {
                // One admitted acquire, however many shards it spreads over.
                if let Some(TransactOp::Update(u)) = ops.first_mut() {
                    u.update = tollgate_core::usage::count_request(std::mem::take(&mut u.update));
                }
            }
            if grants {
                // Rule "a grant is sized at the live shard count" (see `commit_slot`).
                let k0 = self.bucket_key(req, 0);
                let c = tollgate_core::plan::CountPin::Count(s).condition();
                match ops.iter_mut().find(|op| *op.key() == k0) {
                    Some(TransactOp::Update(u)) => {
                        u.condition = Some(match u.condition.take() {
                            Some(x) => x.and(c),
                            None => c,
                        });
                    }
                    _ => ops.push(TransactOp::Check {
                        key: k0,
                        condition: c,
                    }),
                }
            }
            let single = ops.len() == 1 && matches!(ops[0], TransactOp::Update(_));
            let r = if single {
                match ops.pop() {
                    Some(TransactOp::Update(u)) => self.store().update(u).await.map(Some),
                    _ => unreachable_update(),
                }
            } else {
                self.store().transact_write(ops, None).await.map(|()| None)
            };
            match r {
                Ok(new) => {
                    for t in &touched {
                        let shard = t.landing.shard;
                        self.rejections().forget(&req.entity, &req.resource, shard);
                        if new.is_none() {
                            self.images().forget(&req.entity, &req.resource, shard);
                        }
                        crate::shards::fan_out(self, req, shard, s, &t.evals).await;
                    }
                    if let (Some(new), Some(t)) = (new, touched.first()) {
                        self.remember(req, t.landing.shard, &t.landing.key, new.as_ref(), None)?;
                    }
                    return Ok(Charged::Landed(touched));
                }
                Err(StoreError::ConditionFailed { .. })
                | Err(StoreError::TransactionCanceled { .. })
                | Err(StoreError::TransactionConflict)
                | Err(StoreError::Throttled(_)) => {
                    if let Err(StoreError::TransactionCanceled { reasons }) = &r {
                        if reasons
                            .iter()
                            .any(|x| matches!(x, CancelReason::Validation(_)))
                        {
                            return Err(Error::Misconfigured(StoreError::Validation(format!(
                                "entity-wide debit refused: {reasons:?}"
                            ))));
                        }
                    }
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Contended {
            entity: req.entity.to_string(),
            resource: req.resource.to_string(),
        })
    }

    /// The statuses of a refusal decided by `entity_debit`: from the same materialised
    /// balances (every shard that can take part), exceeded where their sum is short.
    fn entity_statuses(
        &self,
        req: &Request,
        seen: &[Seen],
        amounts: &[(String, i64)],
        s: i64,
        now: i64,
    ) -> Vec<LimitStatus> {
        req.limits
            .iter()
            .enumerate()
            .filter_map(|(li, l)| {
                let a = amounts.iter().find(|(n, _)| n == l.name())?.1;
                let evals: Vec<&Evaluated> = seen.iter().filter_map(|x| x.evals.get(li)).collect();
                let views: Vec<ShardView<'_>> = evals.iter().map(|e| ShardView::of(e, s)).collect();
                let total: i64 = evals.iter().map(|e| e.balance).sum();
                Some(limit_status(l, &views, a, total < a, now))
            })
            .collect()
    }
}

fn unreachable_update(
) -> std::result::Result<Option<Option<tollgate_core::value::Item>>, StoreError> {
    Err(StoreError::Validation(
        "an entity-wide debit of one shard is one update".into(),
    ))
}
