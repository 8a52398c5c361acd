//! Charges: the usage half of a commit, written at the instant it is reported, on the
//! lease's first part or spread over the entity's shards (see the module rules in `super`).

use std::collections::BTreeMap;
use std::sync::Arc;

use tollgate_core::bucket::BucketImage;
use tollgate_core::expr::{Condition, ReturnValues};
use tollgate_core::mutants::{self, Mutant};
use tollgate_core::writes::{adjust_write, refund_trust, refund_untrust, trusted, Charging};
use tollgate_store::{StoreError, UpdateRequest};

use crate::acquire::Request;
use crate::error::{Error, Flow, Result};
use crate::limiter::Inner;

use super::{retrying, Lease, Part};

impl Lease {
    /// Commit: refunds first (on the parts holding the limit, in order, all in one write or
    /// transaction), then usage on the first part; each step leaves `pending` and `held`
    /// as far as it landed.
    pub(super) async fn write_pending(&mut self) -> Result<()> {
        let mut plan: BTreeMap<usize, Vec<(String, i64)>> = BTreeMap::new();
        for (n, d) in self.pending.iter().filter(|(_, d)| **d < 0) {
            let mut rest = -d;
            for (i, p) in self.parts.iter().enumerate() {
                let take = p.held.get(n).copied().unwrap_or(0).min(rest);
                if take > 0 {
                    plan.entry(i).or_default().push((n.clone(), take));
                    rest -= take;
                }
                if rest == 0 {
                    break;
                }
            }
            if rest > 0 {
                // Only without the lease-net rule (its mutant): the original refunded the
                // whole amount on the shard debited, whatever the lease held.
                debug_assert!(
                    mutants::off(Mutant::LeaseNet),
                    "refunds stay within what is held"
                );
                let on_first = plan.entry(0).or_default();
                match on_first.iter_mut().find(|(m, _)| m == n) {
                    Some((_, t)) => *t += rest,
                    None => on_first.push((n.clone(), rest)),
                }
            }
        }
        let usage: Vec<(String, i64)> = self
            .pending
            .iter()
            .filter(|(_, d)| **d > 0)
            .map(|(n, d)| (n.clone(), *d))
            .collect();
        if usage.is_empty() {
            if !plan.is_empty() {
                self.refund_parts(plan.into_iter().collect()).await?;
            }
            self.pending.clear();
            return Ok(());
        }
        // Usage lands on the first part together with that part's refunds, in one write. A
        // lease holding refunds on other shards too (it was debited across several) writes
        // them all in one transaction with the usage, charged across the entity.
        let first = plan.remove(&0).unwrap_or_default();
        if !plan.is_empty() {
            let (Some(lim), Some(req)) = (self.lim.clone(), self.req.clone()) else {
                return Ok(());
            };
            let mut ride: Vec<crate::entity::RideAlong<'_>> = plan
                .iter()
                .map(|(i, r)| crate::entity::RideAlong {
                    shard: self.parts[*i].shard,
                    refunds: r.clone(),
                    pins: &self.parts[*i].pins,
                    spread: false,
                })
                .collect();
            if !first.is_empty() {
                ride.push(crate::entity::RideAlong {
                    shard: self.parts[0].shard,
                    refunds: first.clone(),
                    pins: &self.parts[0].pins,
                    spread: false,
                });
            }
            let s = lim
                .shards
                .get(&req.entity, &req.resource)
                .unwrap_or(1)
                .max(2);
            let landed = lim
                .entity_charge(&req, s, self.parts[0].shard, &usage, &ride)
                .await?;
            drop(ride);
            self.land_all(landed);
            self.pending.clear();
            return Ok(());
        }
        let mut deltas = usage;
        deltas.extend(first.into_iter().map(|(n, t)| (n, -t)));
        self.charge_first(&deltas).await?;
        self.pending.clear();
        Ok(())
    }

    /// Write `deltas` (milli; positive: reported usage, negative: refunds of what this
    /// part holds) on the first part at the instant they are reported: one balance-only
    /// `ADD` while the shard is trusted and covers the usage (the refunds keeping its trust
    /// horizon or pulling `vu` in); otherwise one rf-locked write that materialises the
    /// balance first — spread over the entity's shards when this one cannot cover the usage
    /// (see the module rules).
    pub(super) async fn charge_first(&mut self, deltas: &[(String, i64)]) -> Result<()> {
        let (Some(lim), Some(req)) = (self.lim.clone(), self.req.clone()) else {
            return Ok(());
        };
        let (key, shard) = (self.parts[0].key.clone(), self.parts[0].shard);
        lim.rejections.forget(&req.entity, &req.resource, shard);
        let s = lim
            .shards
            .get(&req.entity, &req.resource)
            .unwrap_or(1)
            .max(1);
        let refunds: Vec<(String, i64)> = deltas
            .iter()
            .filter(|(_, d)| *d < 0)
            .map(|(n, d)| (n.clone(), -d))
            .collect();
        let drip_refund = refunds
            .iter()
            .any(|(n, _)| req.limits.iter().any(|l| l.name() == n && !l.is_quota()));
        let usage: Vec<(String, i64)> = deltas.iter().filter(|(_, d)| *d > 0).cloned().collect();
        let mut condition = Condition::exists("PK");
        if s > 1 && !mutants::off(Mutant::EntityDebit) {
            // A dripping refund lands here only while this shard is not in debt (see
            // `refund_parts`).
            for (n, _) in refunds
                .iter()
                .filter(|(n, _)| req.limits.iter().any(|l| l.name() == n && !l.is_quota()))
            {
                condition = condition.and(Condition::ge(tollgate_core::keys::battr(n, "tk"), 0));
            }
        }
        for (n, d) in deltas {
            if *d > 0 {
                condition = condition.and(Condition::ge(tollgate_core::keys::battr(n, "tk"), *d));
            } else if let Some(p) = self.parts[0].pins.get(n) {
                condition = condition.and(p.clone());
            }
        }
        let mut update = adjust_write(deltas, &[], lim.clock.now_ms());
        if drip_refund {
            match self.parts[0]
                .image
                .as_ref()
                .and_then(|img| refund_trust(img, &req.limits, &refunds, s))
            {
                Some(t) => condition = condition.and(t),
                None => update = refund_untrust(update, &req.limits, &refunds),
            }
        }
        // Each attempt carries a fresh clock reading: the trust check is only as good as
        // the `now` it compares (a resent request with an old one could pass it late).
        let r = retrying(|| {
            let u = UpdateRequest {
                key: key.clone(),
                update: update.clone(),
                condition: Some(condition.clone().and(trusted(
                    &req.limits,
                    &usage,
                    lim.clock.now_ms(),
                ))),
                returns: ReturnValues::AllNew,
            };
            let store = lim.store.clone();
            async move { store.update(u).await }
        })
        .await;
        let old = match r {
            Ok(new) => {
                self.land(0, deltas);
                lim.remember(&req, shard, new.as_ref())?;
                return Ok(());
            }
            Err(StoreError::ConditionFailed { old: None }) => {
                tracing::warn!(key = %key, "lease target bucket is gone; adjustment dropped");
                self.land(0, deltas);
                return Ok(());
            }
            Err(StoreError::ConditionFailed { old: Some(old) }) => old,
            Err(e) => return Err(e.into()),
        };
        // A quota refund whose period ended is recorded in `tc` only.
        let tc_only: Vec<String> = refunds
            .iter()
            .filter(|(n, _)| {
                self.parts[0]
                    .pins
                    .get(n)
                    .is_some_and(|p| !tollgate_store::eval::eval_condition(Some(&old), p))
            })
            .map(|(n, _)| n.clone())
            .collect();
        let part = self.parts[0].clone();
        let landed = lim
            .charge_materialised(&req, &part, *old, deltas, &tc_only)
            .await?;
        self.land_all(landed);
        Ok(())
    }

    /// Record what an entity-wide charge landed, shard by shard (new shards become parts).
    fn land_all(&mut self, landed: Vec<crate::entity::Landing>) {
        for crate::entity::Landing {
            shard: sh,
            key: k,
            charged: takes,
        } in landed
        {
            let i = match self.parts.iter().position(|p| p.shard == sh) {
                Some(i) => i,
                None => {
                    self.parts.push(Part {
                        shard: sh,
                        key: k,
                        held: BTreeMap::new(),
                        pins: BTreeMap::new(),
                        image: None,
                        bypassed: false,
                    });
                    self.parts.len() - 1
                }
            };
            self.land(i, &takes);
        }
    }
}

impl Inner {
    /// Write `deltas` (debt allowed; negative: refunds, `tc_only` ones in `tc` alone) on
    /// `shard`, materialised from `img`: one rf-locked write when the shard covers the usage
    /// (or is the entity's only one); else one transaction that takes the usage across the
    /// entity's shards with this shard's refunds. Returns where it landed: (shard, key, milli
    /// per limit).
    pub(crate) async fn charge_materialised(
        self: &Arc<Self>,
        req: &Request,
        part: &Part,
        item: tollgate_core::value::Item,
        deltas: &[(String, i64)],
        tc_only: &[String],
    ) -> Result<Vec<crate::entity::Landing>> {
        let (shard, key, pins) = (part.shard, &part.key, &part.pins);
        let mut item = item;
        let deltas = deltas.to_vec();
        let mut retries = 0;
        for _ in 0..6 {
            let img = BucketImage::decode(&item)?;
            let now = self.clock.now_ms();
            let mut s = self
                .shards
                .get(&req.entity, &req.resource)
                .unwrap_or(1)
                .max(img.shard_count);
            let at = |s: i64| -> Vec<tollgate_core::materialize::Evaluated> {
                req.limits
                    .iter()
                    .map(|l| {
                        tollgate_core::materialize::evaluate(
                            l,
                            img.limits.get(l.name()),
                            img.rf,
                            s,
                            now,
                            None,
                        )
                    })
                    .collect()
            };
            let mut evals = at(s);
            // Rule "a grant is sized at the live shard count" (see `Inner::commit_slot`): a
            // quota this write resets or rolls is sized at shard 0's count, pinned.
            let mut pin = None;
            if evals.iter().any(|e| e.gc.is_some()) {
                let s0 = if shard == 0 {
                    Some(img.shard_count)
                } else {
                    self.shard0_count(req).await?
                };
                if s0.unwrap_or(1) > s {
                    s = s0.unwrap_or(1);
                    evals = at(s);
                }
                pin = Some(s0.map_or(crate::acquire::CountPin::Absent, |c| {
                    crate::acquire::CountPin::Count(c.max(s))
                }));
            }
            let covers = deltas.iter().filter(|(_, d)| *d > 0).all(|(n, d)| {
                evals
                    .iter()
                    .find(|e| e.name == *n)
                    .is_some_and(|e| e.balance >= *d)
            });
            // A dripping refund on a shard in debt repays the entity from the bottom up.
            let in_debt = deltas.iter().any(|(n, d)| {
                *d < 0
                    && req.limits.iter().any(|l| l.name() == n && !l.is_quota())
                    && evals.iter().any(|e| e.name == *n && e.balance < 0)
            });
            if (!covers || in_debt) && s > 1 && !mutants::off(Mutant::EntityDebit) {
                // The usage is taken across the entity; this shard's refunds ride in the
                // same transaction.
                let usage: Vec<(String, i64)> =
                    deltas.iter().filter(|(_, d)| *d > 0).cloned().collect();
                let refunds: Vec<(String, i64)> = deltas
                    .iter()
                    .filter(|(_, d)| *d < 0)
                    .map(|(n, d)| (n.clone(), -d))
                    .collect();
                let ride = [crate::entity::RideAlong {
                    shard,
                    refunds,
                    pins,
                    spread: in_debt,
                }];
                return self.entity_charge(req, s, shard, &usage, &ride).await;
            }
            // Rule "a refund stays in its period", on the item this write is planned from: a
            // refund whose period ended (its pin fails here) or that this very write resets
            // is recorded in `tc` only.
            let tc_only: Vec<String> = deltas
                .iter()
                .filter(|(_, d)| *d < 0)
                .map(|(n, _)| n.clone())
                .filter(|n| {
                    tc_only.contains(n)
                        || pins
                            .get(n)
                            .is_some_and(|p| !tollgate_store::eval::eval_condition(Some(&item), p))
                        || evals.iter().any(|e| e.name == *n && e.transition.is_set())
                })
                .collect();
            let (write, _) = self.materialising_write(
                req,
                key,
                &img,
                &evals,
                &deltas,
                Charging {
                    debt: true,
                    tc_only: &tc_only,
                },
                now,
            );
            let landed = if pin.is_some() {
                match self
                    .commit_slot(
                        req,
                        shard,
                        tollgate_store::TransactOp::Update(write),
                        &[],
                        pin,
                    )
                    .await
                {
                    Ok(Ok(new)) => Ok(new.map(|b| *b)),
                    Ok(Err(crate::acquire::LostLock(old))) => {
                        Err(StoreError::ConditionFailed { old })
                    }
                    // Shard 0's count moved (a doubling): plan again.
                    Err(Flow::Reread) | Err(Flow::MoveLost) => continue,
                    Err(Flow::Fail(Error::Unavailable(e))) => Err(e),
                    Err(Flow::Fail(e)) => return Err(e),
                }
            } else {
                self.store.update(write).await
            };
            // Throttled or conflicting: nothing applied; planned again with a fresh clock
            // reading after a back-off (a resent write would carry the old one).
            if let Err(e) = &landed {
                if e.is_retryable() && retries < 3 {
                    tokio::time::sleep(crate::acquire::backoff(retries)).await;
                    retries += 1;
                    continue;
                }
            }
            match landed {
                Ok(new) => {
                    self.remember(req, shard, new.as_ref())?;
                    crate::shards::fan_out(self, req, shard, s, &evals).await;
                    return Ok(vec![crate::entity::Landing {
                        shard,
                        key: key.clone(),
                        charged: deltas,
                    }]);
                }
                Err(StoreError::ConditionFailed { old: Some(old) }) => {
                    item = *old;
                }
                Err(StoreError::ConditionFailed { old: None }) => {
                    tracing::warn!(key = %key, "lease target bucket is gone; adjustment dropped");
                    return Ok(vec![crate::entity::Landing {
                        shard,
                        key: key.clone(),
                        charged: deltas,
                    }]);
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Unavailable(StoreError::TransactionConflict))
    }
}
