//! An acquire the shards tried cannot cover alone, admitted across the entity's shards
//! when the entity can pay (the debit is the `entity` module's), else refused with the
//! entity's statuses.

use std::collections::BTreeMap;
use std::sync::Arc;

use tollgate_core::materialize::Evaluated;
use tollgate_core::mutants::{self, Mutant};
use tollgate_core::status::{limit_status, ShardView};
use tollgate_core::writes::refund_pin;

use crate::entity::{Charged, Landing, Touched};
use crate::error::{Error, Exceeded, Result};
use crate::lease::{Lease, Part};
use crate::limiter::{Inner, Stats};
use crate::request::Request;

impl Inner {
    /// An acquire the shards tried cannot cover alone: admit it across the entity's shards
    /// when the entity can pay, else refuse honestly.
    pub(crate) async fn entity_acquire(
        self: &Arc<Self>,
        req: &Request,
        s: i64,
        preferred: u32,
        _now: i64,
    ) -> Result<Lease> {
        match self
            .entity_debit(req, s, preferred, &req.amounts, false, &[])
            .await?
        {
            Charged::Short(statuses) => {
                let x = Exceeded::new(&req.entity, &req.resource, statuses);
                debug_assert!(
                    !x.violations().is_empty() || mutants::off(Mutant::EntityDebit),
                    "a refusal names a limit"
                );
                Err(Error::RateLimitExceeded(Box::new(x)))
            }
            Charged::Landed(parts) => {
                Stats::bump(&self.stats().slow_admits);
                let now = self.clock().now_ms();
                let mut after: BTreeMap<String, Vec<Evaluated>> = BTreeMap::new();
                let mut lease_parts = Vec::new();
                for Touched {
                    landing:
                        Landing {
                            shard,
                            key,
                            charged: takes,
                        },
                    evals,
                } in parts
                {
                    let mut pins = BTreeMap::new();
                    for (l, e) in req.limits.iter().zip(&evals) {
                        if let Some(p) = refund_pin(l, e.window_start_ms, e.period_applied_ms, now)
                        {
                            pins.insert(l.name().to_string(), p);
                        }
                        let take = takes
                            .iter()
                            .find(|(n, _)| n == l.name())
                            .map_or(0, |(_, t)| *t);
                        after
                            .entry(l.name().to_string())
                            .or_default()
                            .push(Evaluated {
                                balance: e.balance - take,
                                opened: false,
                                ..e.clone()
                            });
                    }
                    lease_parts.push(Part {
                        shard,
                        key,
                        held: takes.into_iter().collect(),
                        pins,
                        image: None,
                        bypassed: false,
                    });
                }
                let s_now = self.shards().count(&req.entity, &req.resource).unwrap_or(s);
                let statuses = req
                    .limits
                    .iter()
                    .filter_map(|l| {
                        let a = req.amounts.iter().find(|(n, _)| n == l.name())?.1;
                        let evals = after.get(l.name())?;
                        let views: Vec<ShardView<'_>> =
                            evals.iter().map(|e| ShardView::of(e, s_now)).collect();
                        Some(limit_status(l, &views, a, false, now))
                    })
                    .collect();
                Ok(Lease::granted(self.clone(), req, lease_parts, statuses))
            }
        }
    }
}
