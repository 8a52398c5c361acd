//! Sharding rules that need the store: seeding a limit on a new shard (joining shard 0's
//! live window, quota grants) and the rollover fan-out of an opened window (ADR-139/140).

use tollgate_core::bucket::{BucketImage, WCU_CAPACITY};
use tollgate_core::expr::{ReturnValues, SetValue, Update};
use tollgate_core::keys::battr;
use tollgate_core::limit::{Limit, Refill};
use tollgate_core::materialize::{share, Evaluated, Seed};
use tollgate_core::value::Value;
use tollgate_core::window;
use tollgate_store::UpdateRequest;

use crate::acquire::Request;
use crate::error::Result;
use crate::limiter::{Inner, Stats};

/// Rule "proactive doubling": a shard whose projected `wcu` balance is below 20 % of its
/// capacity is a hot partition and should double (if below the cap of 32 shards).
pub fn should_double(projected_wcu: i64, shard_count: i64) -> bool {
    shard_count < tollgate_core::bucket::MAX_SHARD_COUNT && projected_wcu * 5 < WCU_CAPACITY
}

/// How to seed limit `l` on `shard` of `s` shards.
///
/// - dripping limits: a full share;
/// - a window on shard 0, or where shard 0 has no live window: open a fresh share now (the
///   opener then fans the start out);
/// - a window on shard > 0 while shard 0's window is live: join it (ADR-139: a strongly
///   consistent read, since a stale pre-roll start looks ended and would mint a share);
/// - quotas on a shard > 0 are funded by a move from a covering sibling (ADR-145); without
///   a planned move this build grants nothing rather than mint a share.
pub(crate) async fn plan_seed(
    inner: &Inner,
    req: &Request,
    l: &Limit,
    shard: u32,
    s: i64,
    now: i64,
) -> Result<Seed> {
    let part = share(l.capacity_milli(), s);
    match l.refill() {
        Refill::Drip { .. } => Ok(Seed {
            balance: part,
            join_ws: None,
        }),
        _ if shard == 0 || s <= 1 => Ok(Seed {
            balance: part,
            join_ws: None,
        }),
        Refill::Window { reset_after_s } => {
            let k = inner.bucket_key(req, 0);
            let consistent = !tollgate_core::mutants::off(
                tollgate_core::mutants::Mutant::ConsistentSiblingRead,
            );
            let ws0 = match inner.store.get(&k, consistent).await? {
                Some(i) => BucketImage::decode(&i)?
                    .limits
                    .get(l.name())
                    .and_then(|st| st.ws),
                None => None,
            };
            match ws0 {
                Some(ws) if !window::ended(ws, reset_after_s * 1000, now) => Ok(Seed {
                    balance: 0,
                    join_ws: Some(ws),
                }),
                _ => Ok(Seed {
                    balance: 0,
                    join_ws: None,
                }),
            }
        }
        Refill::Calendar(_) => Ok(Seed {
            balance: 0,
            join_ws: None,
        }),
    }
}

/// ADR-139/140 rollover fan-out: after a landed write that opened a window on one shard,
/// move every sibling's window start to it — start and `wtc` snapshot only, never tokens —
/// under the ended-window floor condition. Failures never fail the caller; they are counted.
pub(crate) async fn fan_out(inner: &Inner, req: &Request, shard: u32, s: i64, evals: &[Evaluated]) {
    if s <= 1 {
        return;
    }
    for e in evals.iter().filter(|e| e.opened) {
        let (Some(ws), Some(rsa)) = (e.ws, e.rsa) else {
            continue;
        };
        for sib in (0..s as u32).filter(|x| *x != shard) {
            let n = &e.name;
            let update = Update::new()
                .set(battr(n, "ws"), ws)
                .set(battr(n, "rsa"), rsa)
                .set("vu", 0)
                .set_expr(
                    battr(n, "wtc"),
                    SetValue::IfNotExists(battr(n, "tc"), Value::N(0)),
                );
            let r = inner
                .store
                .update(UpdateRequest {
                    key: inner.bucket_key(req, sib),
                    update,
                    condition: Some(window::fanout_condition(n, ws, rsa)),
                    returns: ReturnValues::None,
                })
                .await;
            match r {
                Ok(_) => Stats::bump(&inner.stats.fanout_writes),
                Err(err) => {
                    Stats::bump(&inner.stats.fanout_failures);
                    tracing::debug!(error = %err, sibling = sib, "window fan-out write not applied");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// S7: the proactive doubling table.
    #[test]
    fn proactive_doubling() {
        assert!(should_double(100_000, 1));
        assert!(!should_double(200_000, 1));
        assert!(should_double(199_999, 1));
        assert!(should_double(0, 1));
        assert!(should_double(-5, 1));
        assert!(should_double(100_000, 2));
        assert!(!should_double(0, 32));
    }
}
