//! A lease's usage written materialised: one rf-locked write on its shard, or one
//! transaction across the entity's shards when the shard cannot cover it.

use std::sync::Arc;

use tollgate_core::bucket::BucketImage;
use tollgate_core::mutants::{self, Mutant};
use tollgate_core::writes::Charging;
use tollgate_store::StoreError;

use crate::error::{Error, Flow, Result};
use crate::limiter::Inner;
use crate::request::{Landed, Request};

use super::Part;

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
            let now = self.clock().now_ms();
            let mut s = self
                .shards()
                .count(&req.entity, &req.resource)
                .unwrap_or(1)
                .max(img.shard_count);
            let at = |s: i64| -> Vec<tollgate_core::materialize::Evaluated> {
                req.limits
                    .iter()
                    .map(|l| {
                        tollgate_core::materialize::evaluate(
                            l,
                            img.limits.get(l.name()),
                            img.refilled_at_ms,
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
            if evals.iter().any(|e| e.grant_count.is_some()) {
                let s0 = if shard == 0 {
                    Some(img.shard_count)
                } else {
                    self.shard0_count(req).await?
                };
                if s0.unwrap_or(1) > s {
                    s = s0.unwrap_or(1);
                    evals = at(s);
                }
                pin = Some(s0.map_or(crate::request::CountPin::Absent, |c| {
                    crate::request::CountPin::Count(c.max(s))
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
                    Ok(Landed::Wrote(new)) => Ok(new.map(Arc::unwrap_or_clone)),
                    Ok(Landed::LostLock(old)) => Err(StoreError::ConditionFailed { old }),
                    // Shard 0's count moved (a doubling): plan again.
                    Err(Flow::Reread) | Err(Flow::MoveLost) => continue,
                    Err(Flow::Fail(Error::Unavailable(e))) => Err(e),
                    Err(Flow::Fail(e)) => return Err(e),
                }
            } else {
                self.store().update(write).await
            };
            // Throttled or conflicting: nothing applied; planned again with a fresh clock
            // reading after a back-off (a resent write would carry the old one).
            if let Err(e) = &landed {
                if e.is_retryable() && retries < 3 {
                    tokio::time::sleep(crate::request::backoff(retries)).await;
                    retries += 1;
                    continue;
                }
            }
            match landed {
                Ok(new) => {
                    self.remember(req, shard, key, new.as_ref(), None)?;
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
