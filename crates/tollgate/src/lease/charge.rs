//! Charges: the usage half of a commit, written at the instant it is reported, on the
//! lease's first part or spread over the entity's shards (see the module rules in `super`).

use std::collections::BTreeMap;

use tollgate_core::bucket::field;
use tollgate_core::expr::{Condition, ReturnValues};
use tollgate_core::mutants::{self, Mutant};
use tollgate_core::writes::{adjust_write, refund_trust, refund_untrust, trusted};
use tollgate_store::{StoreError, UpdateRequest};

use crate::error::Result;

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
                .shards()
                .count(&req.entity, &req.resource)
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
        lim.rejections().forget(&req.entity, &req.resource, shard);
        let s = lim
            .shards()
            .count(&req.entity, &req.resource)
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
                condition =
                    condition.and(Condition::ge(tollgate_core::keys::battr(n, field::TK), 0));
            }
        }
        for (n, d) in deltas {
            if *d > 0 {
                condition =
                    condition.and(Condition::ge(tollgate_core::keys::battr(n, field::TK), *d));
            } else if let Some(p) = self.parts[0].pins.get(n) {
                condition = condition.and(p.clone());
            }
        }
        let mut update = adjust_write(deltas, &[], lim.clock().now_ms());
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
                    lim.clock().now_ms(),
                ))),
                returns: ReturnValues::AllNew,
            };
            let store = lim.store().clone();
            async move { store.update(u).await }
        })
        .await;
        let old = match r {
            Ok(new) => {
                self.land(0, deltas);
                lim.remember(&req, shard, &key, new.as_ref(), None)?;
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
