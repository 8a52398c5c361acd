//! Path 2 of a doubling (§4.7): cloning shard 0 into a slot the doubling opened, funded
//! by moves (ADR-145).

use tollgate_core::bucket::{field, BucketImage};
use tollgate_core::expr::Condition;
use tollgate_core::keys::battr;
use tollgate_core::limit::{Limit, Refill};
use tollgate_core::materialize::{evaluate, Evaluated};
use tollgate_core::value::Value;
use tollgate_core::writes::{create_item, BucketIdentity, ItemStamp, TtlWrite};
use tollgate_store::{PutRequest, TransactOp};

use crate::error::Pass;
use crate::request::{Landed, Request};
use crate::shards;

use super::Aggregator;

impl Aggregator {
    /// One Path-2 clone. `Ok(false)` when the slot was created by someone else first.
    pub(super) async fn clone_one(
        &self,
        req: &Request,
        img0: &BucketImage,
        slot: u32,
        s: i64,
    ) -> Pass<bool> {
        let inner = &self.inner;
        let now = inner.clock().now_ms();
        let all: Vec<&Limit> = req.limits.iter().collect();
        let plan = shards::plan_seeds_of(inner, req, &all, slot, s, now, true, true).await?;
        if plan.split_first.is_some() {
            // The family splits one level at a time: a client creates the levels in order.
            return Ok(false);
        }
        let s = plan.shard_count;
        let evals: Vec<Evaluated> = req
            .limits
            .iter()
            .map(|l| evaluate(l, None, plan.now, s, plan.now, plan.seed(l.name())))
            .collect();
        // The clone's balances are its own (a split, moves): its trust horizon is not shard
        // 0's, so its first use materialises it.
        let stamp = ItemStamp {
            refilled_at_ms: img0.refilled_at_ms,
            valid_until_ms: Some(0),
            ttl: img0.ttl.map_or(TtlWrite::Remove, TtlWrite::Set),
            params_hash: &req.params_hash,
            read: None,
        };
        let id = BucketIdentity {
            ns: inner.ns(),
            entity: &req.entity,
            resource: &req.resource,
            shard: slot,
            shard_count: s,
        };
        let mut item = create_item(&id, &stamp, &req.limits, &evals, &[]);
        // ADR-140: the window state is shard 0's, verbatim; the snapshot restarts.
        for l in req.limits.iter() {
            if !matches!(l.refill(), Refill::Window { .. }) {
                continue;
            }
            let n = l.name();
            let st = img0.limits.get(n);
            for (f, v) in [
                ("ws", st.and_then(|s| s.window_start_ms)),
                ("rsa", st.and_then(|s| s.window_s)),
                ("wa", st.and_then(|s| s.window_applied_ms)),
            ] {
                match v {
                    Some(v) => item.insert(battr(n, f).into(), Value::N(v)),
                    None => item.remove(battr(n, f).as_str()),
                };
            }
            item.insert(battr(n, field::WTC).into(), Value::N(0));
        }
        if img0.params_hash.is_none() {
            item.remove(tollgate_core::bucket::attr::PH);
        }
        let put = PutRequest {
            key: inner.bucket_key(req, slot),
            item,
            condition: Some(Condition::not_exists("PK")),
        };
        // No pin on shard 0's count here: a clone sized at a count a doubling has since
        // overtaken still conserves the allowance — its `gc` records the count it was sized
        // at, so it covers (and funds) the slots the newer doubling opened, and every reset
        // is sized at shard 0's count, not the item's. (Removing such a pin failed no test.)
        let mut donors = plan.moves.clone();
        donors.extend(plan.splits.iter().cloned());
        match inner
            .commit_slot(req, slot, TransactOp::Put(put), &donors, None)
            .await?
        {
            Landed::Wrote(_) => {
                inner.shards().raise(&req.entity, &req.resource, s);
                for m in &donors {
                    inner
                        .rejections()
                        .forget(&req.entity, &req.resource, m.shard);
                }
                Ok(true)
            }
            Landed::LostLock(_) => Ok(false),
        }
    }
}
