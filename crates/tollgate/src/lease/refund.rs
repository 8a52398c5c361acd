//! Refunds: rollback and the refund half of a commit, one write or one transaction over
//! the parts that hold what is returned (see the module rules in `super`).

use tollgate_core::bucket::{attr, field, BucketImage};
use tollgate_core::expr::{Condition, ReturnValues, Update};
use tollgate_core::mutants::{self, Mutant};
use tollgate_core::writes::{adjust_write, refund_trust, refund_untrust};
use tollgate_store::{CancelReason, StoreError, TransactOp, UpdateRequest};

use crate::error::{Error, Result};

use super::{retrying, Lease, Part};

impl Lease {
    /// Rollback: every part refunds what it holds (one transaction when several do).
    pub(super) async fn refund_all(&mut self) -> Result<()> {
        let plan: Vec<(usize, Vec<(String, i64)>)> = (0..self.parts.len())
            .map(|i| {
                let r: Vec<(String, i64)> = self.parts[i]
                    .held
                    .iter()
                    .filter(|(_, m)| **m > 0)
                    .map(|(n, m)| (n.clone(), *m))
                    .collect();
                (i, r)
            })
            .filter(|(_, r)| !r.is_empty())
            .collect();
        self.refund_parts(plan).await
    }

    /// Refund (positive milli per limit) on several parts at once — one write, or one
    /// transaction when several parts take part (all or none). Per part: a balance-only
    /// `ADD` that keeps the trust horizon where it can, else pulls `vu` in with the same
    /// write; a quota refund whose period ended is recorded in `tc` only.
    pub(super) async fn refund_parts(
        &mut self,
        plan: Vec<(usize, Vec<(String, i64)>)>,
    ) -> Result<()> {
        let (Some(lim), Some(req)) = (self.lim.clone(), self.req.clone()) else {
            return Ok(());
        };
        let plan: Vec<(usize, Vec<(String, i64)>)> = plan
            .into_iter()
            .filter(|(_, r)| r.iter().any(|(_, m)| *m != 0))
            .collect();
        if plan.is_empty() {
            return Ok(());
        }
        let s = lim
            .shards()
            .count(&req.entity, &req.resource)
            .unwrap_or(1)
            .max(1);
        struct One {
            part: usize,
            refunds: Vec<(String, i64)>,
            deltas: Vec<(String, i64)>,
            tc_only: Vec<String>,
            trust: Option<Condition>,
            /// Some refunded limit drips: its trust horizon must be kept or pulled in.
            drips: bool,
        }
        let mut ones: Vec<One> = plan
            .into_iter()
            .map(|(i, refunds)| {
                let drips = refunds
                    .iter()
                    .any(|(n, _)| req.limits.iter().any(|l| l.name() == n && !l.is_quota()));
                let trust = self.parts[i]
                    .image
                    .as_ref()
                    .filter(|_| drips)
                    .and_then(|img| refund_trust(img, &req.limits, &refunds, s));
                One {
                    part: i,
                    deltas: refunds.iter().map(|(n, r)| (n.clone(), -r)).collect(),
                    refunds,
                    tc_only: Vec::new(),
                    trust,
                    drips,
                }
            })
            .collect();
        for o in &ones {
            lim.rejections()
                .forget(&req.entity, &req.resource, self.parts[o.part].shard);
        }
        // Rule "a refund repays the entity's debt": on a sharded entity a dripping refund
        // lands on its shard only while that shard is not in debt; otherwise it is spread
        // over the entity from the bottom up (`tollgate_core::spread::plan_refund`).
        // The shard count this limiter knows may be stale (the lease may date from before
        // a doubling), so every dripping refund carries the "not in debt" condition; a
        // failure shows the item, whose shard count then decides: spread over the
        // entity's shards, or — one shard — repay that shard's own debt (`debt_ok`).
        let guarded = !mutants::off(Mutant::EntityDebit);
        let mut debt_ok = false;
        let drip = |n: &str| req.limits.iter().any(|l| l.name() == n && !l.is_quota());
        let build = |o: &One, parts: &[Part], debt_ok: bool| -> UpdateRequest {
            let mut condition = Condition::exists("PK");
            if guarded && !debt_ok {
                for (n, _) in o.refunds.iter().filter(|(n, _)| drip(n)) {
                    condition =
                        condition.and(Condition::ge(tollgate_core::keys::battr(n, field::TK), 0));
                }
            }
            for (n, _) in &o.refunds {
                if !o.tc_only.contains(n) {
                    if let Some(p) = parts[o.part].pins.get(n) {
                        condition = condition.and(p.clone());
                    }
                }
            }
            let mut update = adjust_write(&o.deltas, &o.tc_only, lim.clock().now_ms());
            match (&o.trust, o.drips) {
                (Some(t), _) => condition = condition.and(t.clone()),
                // Nothing known to keep: pull the trust horizon in (the next acquire
                // materialises and clamps).
                (None, true) => update = refund_untrust(update, &req.limits, &o.refunds),
                (None, false) => {}
            }
            UpdateRequest {
                key: parts[o.part].key.clone(),
                update,
                condition: Some(condition),
                returns: ReturnValues::AllNew,
            }
        };
        let mut attempt = 0;
        let news: Vec<Option<tollgate_core::value::Item>> = loop {
            // Per part: the old item when its condition failed (`Some(None)`: gone).
            let failed: Vec<(usize, Option<tollgate_core::value::Item>)> = if ones.len() == 1 {
                let u = build(&ones[0], &self.parts, debt_ok);
                match retrying(|| lim.store().update(u.clone())).await {
                    Ok(n) => break vec![n],
                    Err(StoreError::ConditionFailed { old }) => vec![(0, old.map(|b| *b))],
                    Err(e) => return Err(e.into()),
                }
            } else {
                let ops: Vec<TransactOp> = ones
                    .iter()
                    .map(|o| TransactOp::Update(build(o, &self.parts, debt_ok)))
                    .collect();
                match retrying(|| lim.store().transact_write(ops.clone(), None)).await {
                    Ok(()) => break ones.iter().map(|_| None).collect(),
                    Err(StoreError::TransactionCanceled { reasons }) => {
                        let f: Vec<(usize, Option<tollgate_core::value::Item>)> = reasons
                            .into_iter()
                            .enumerate()
                            .filter_map(|(i, r)| match r {
                                CancelReason::ConditionFailed { old } => Some((i, old)),
                                _ => None,
                            })
                            .collect();
                        if f.is_empty() {
                            return Err(Error::Unavailable(StoreError::TransactionConflict));
                        }
                        f
                    }
                    Err(e) => return Err(e.into()),
                }
            };
            if attempt >= 3 {
                return Err(Error::Unavailable(StoreError::TransactionConflict));
            }
            attempt += 1;
            let seen_s = failed
                .iter()
                .filter_map(|(_, old)| old.as_ref())
                .filter_map(|old| {
                    old.get(attr::SHARD_COUNT)
                        .and_then(tollgate_core::value::Value::as_n)
                })
                .fold(s, i64::max);
            if seen_s > s {
                lim.shards().raise(&req.entity, &req.resource, seen_s);
            }
            let in_debt = guarded
                && failed.iter().any(|(j, old)| {
                    old.as_ref().is_some_and(|old| {
                        ones[*j].refunds.iter().any(|(n, _)| {
                            drip(n)
                                && old
                                    .get(tollgate_core::keys::battr(n, field::TK).as_str())
                                    .and_then(tollgate_core::value::Value::as_n)
                                    .is_some_and(|tk| tk < 0)
                        })
                    })
                });
            if in_debt && seen_s <= 1 {
                // One shard: the refund repays its own debt. The same failure may also
                // show the item moved on (its trust horizon, an ended period): that is
                // read below too, or the retry would meet the same condition again.
                debt_ok = true;
            } else if in_debt {
                let ride: Vec<crate::entity::RideAlong<'_>> = ones
                    .iter()
                    .map(|o| crate::entity::RideAlong {
                        shard: self.parts[o.part].shard,
                        refunds: o.refunds.clone(),
                        pins: &self.parts[o.part].pins,
                        spread: true,
                    })
                    .collect();
                let first = self.parts[ones[0].part].shard;
                let landed = lim.entity_charge(&req, seen_s, first, &[], &ride).await?;
                drop(ride);
                // The refunds were taken off what each part holds; where they landed is
                // the entity's.
                for o in &ones {
                    let deltas = o.deltas.clone();
                    self.land(o.part, &deltas);
                }
                for l in &landed {
                    lim.rejections().forget(&req.entity, &req.resource, l.shard);
                    lim.images().forget(&req.entity, &req.resource, l.shard);
                }
                return Ok(());
            }
            let mut gone = Vec::new();
            for (j, old) in failed {
                let Some(old) = old else {
                    gone.push(j);
                    continue;
                };
                let o = &mut ones[j];
                for (n, _) in &o.refunds {
                    let ended = self.parts[o.part]
                        .pins
                        .get(n)
                        .is_some_and(|p| !tollgate_store::eval::eval_condition(Some(&old), p));
                    if ended && !o.tc_only.contains(n) {
                        o.tc_only.push(n.clone());
                    }
                }
                // The item moved on since the lease saw it: its horizon cannot be kept
                // without knowing it, so the refund pulls `vu` in.
                if o.trust
                    .as_ref()
                    .is_some_and(|t| !tollgate_store::eval::eval_condition(Some(&old), t))
                {
                    o.trust = None;
                }
            }
            for j in gone.into_iter().rev() {
                let o = ones.remove(j);
                tracing::warn!(key = %self.parts[o.part].key, "lease target bucket is gone; refund dropped");
                let deltas = o.deltas.clone();
                self.land(o.part, &deltas);
            }
            if ones.is_empty() {
                return Ok(());
            }
        };
        for (o, new) in ones.iter().zip(news) {
            let deltas = o.deltas.clone();
            self.land(o.part, &deltas);
            let shard = self.parts[o.part].shard;
            let key = self.parts[o.part].key.clone();
            lim.rejections().forget(&req.entity, &req.resource, shard);
            let img = new.as_ref().and_then(|i| BucketImage::decode(i).ok());
            match &img {
                Some(img) => lim
                    .images()
                    .put(&req.entity, &req.resource, shard, img.clone()),
                None => lim.images().forget(&req.entity, &req.resource, shard),
            }
            // A refund that leaves a quota balance above its ceiling (e.g. after a reset)
            // forces the next acquire onto the slow path, which clamps it (scenario 8).
            if img.as_ref().is_some_and(|img| {
                tollgate_core::lease::refund_left_above_ceiling(img, &req.limits, s)
            }) {
                let r = lim
                    .store()
                    .update(UpdateRequest {
                        key: key.clone(),
                        update: Update::new().set(attr::VU, 0),
                        condition: Some(Condition::exists("PK")),
                        returns: ReturnValues::None,
                    })
                    .await;
                if let Err(e) = r {
                    tracing::debug!(error = %e, "could not force the slow path after a refund");
                }
                lim.images().forget(&req.entity, &req.resource, shard);
            }
        }
        Ok(())
    }

    /// Record on part `i` that `deltas` (milli, positive = usage) landed there.
    pub(super) fn land(&mut self, i: usize, deltas: &[(String, i64)]) {
        for (n, d) in deltas {
            *self.parts[i].held.entry(n.clone()).or_default() += d;
        }
    }
}
