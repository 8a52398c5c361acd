//! Sharding steps that need the store: reading the siblings a seed plan needs
//! ([`tollgate_core::seeding`] plans it), the donor debits as transaction operations, and
//! the rollover fan-out of an opened window (ADR-139/140).

use tollgate_core::bucket::{field, BucketImage};
use tollgate_core::expr::{ReturnValues, SetValue, Update};
use tollgate_core::keys::battr;
use tollgate_core::limit::Limit;
use tollgate_core::materialize::Evaluated;
use tollgate_core::mutants::{self, Mutant};
pub use tollgate_core::seeding::should_double;
use tollgate_core::seeding::{move_updates, needs_siblings};
pub(crate) use tollgate_core::seeding::{Move, SeedPlan};
use tollgate_core::value::Value;
use tollgate_core::window;
use tollgate_store::{TransactOp, UpdateRequest};

use crate::error::Result;
use crate::limiter::{Inner, Stats};
use crate::request::Request;

/// [`tollgate_core::seeding::plan_seeds`] for limits missing on an existing item.
pub(crate) async fn plan_seeds(
    inner: &Inner,
    req: &Request,
    missing: &[&Limit],
    shard: u32,
    s_caller: i64,
    now: i64,
    moves: bool,
) -> Result<SeedPlan> {
    plan_seeds_of(inner, req, missing, shard, s_caller, now, moves, false).await
}

/// Read what [`tollgate_core::seeding::plan_seeds`] needs (the siblings, at the largest
/// count they show) and plan; `creating`: a whole new item.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn plan_seeds_of(
    inner: &Inner,
    req: &Request,
    missing: &[&Limit],
    shard: u32,
    s_caller: i64,
    now: i64,
    moves: bool,
    creating: bool,
) -> Result<SeedPlan> {
    let images = if needs_siblings(missing, shard, s_caller, creating) {
        let mut images = read_siblings(inner, req, shard, s_caller).await?;
        let seen = images.iter().map(|(_, i)| i.shard_count).max().unwrap_or(1);
        if seen > s_caller {
            images = read_siblings(inner, req, shard, seen).await?;
        }
        Some(images)
    } else {
        None
    };
    Ok(tollgate_core::seeding::plan_seeds(
        images.as_deref(),
        missing,
        shard,
        s_caller,
        now,
        moves,
        creating,
    ))
}

/// The other shards' items, read strongly consistently (a stale image would look like an
/// ended window or an unspent grant and mint allowance: ADR-139 W9, ADR-145).
async fn read_siblings(
    inner: &Inner,
    req: &Request,
    shard: u32,
    s: i64,
) -> Result<Vec<(u32, BucketImage)>> {
    let ids: Vec<u32> = (0..s as u32).filter(|i| *i != shard).collect();
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let keys: Vec<_> = ids.iter().map(|i| inner.bucket_key(req, *i)).collect();
    let consistent = !mutants::off(Mutant::ConsistentSiblingRead);
    let items = inner.store().batch_get_shared(&keys, consistent).await?;
    let mut out = Vec::new();
    for ((i, item), key) in ids.into_iter().zip(items).zip(keys) {
        if let Some(item) = item {
            out.push((i, inner.decode_shard(req, i, &item, key)?));
        }
    }
    Ok(out)
}

/// The donor debits of a plan as transaction operations on the donors' items.
pub(crate) fn move_ops(inner: &Inner, req: &Request, moves: &[Move]) -> Vec<TransactOp> {
    move_updates(moves)
        .into_iter()
        .map(|(shard, update, condition)| {
            TransactOp::Update(UpdateRequest {
                key: inner.bucket_key(req, shard),
                update,
                condition: Some(condition),
                returns: ReturnValues::None,
            })
        })
        .collect()
}

/// ADR-139/140 rollover fan-out: after a landed write that opened a window on one shard,
/// move every sibling's window start to it — start and `wtc` snapshot only, never tokens —
/// under the ended-window floor condition. Failures never fail the caller; they are counted.
pub(crate) async fn fan_out(inner: &Inner, req: &Request, shard: u32, s: i64, evals: &[Evaluated]) {
    if s <= 1 {
        return;
    }
    for e in evals.iter().filter(|e| e.opened) {
        let (Some(ws), Some(rsa)) = (e.window_start_ms, e.window_s) else {
            continue;
        };
        for sib in (0..s as u32).filter(|x| *x != shard) {
            let n = &e.name;
            let update = Update::new()
                .set(battr(n, field::WS), ws)
                .set(battr(n, field::RSA), rsa)
                .set("vu", 0)
                .set_expr(
                    battr(n, field::WTC),
                    SetValue::IfNotExists(battr(n, field::TC).into(), Value::N(0)),
                );
            let r = inner
                .store()
                .update(UpdateRequest {
                    key: inner.bucket_key(req, sib),
                    update,
                    condition: Some(window::fanout_condition(n, ws, rsa)),
                    returns: ReturnValues::None,
                })
                .await;
            match r {
                Ok(_) => Stats::bump(&inner.stats().fanout_writes),
                Err(err) => {
                    Stats::bump(&inner.stats().fanout_failures);
                    tracing::debug!(error = %err, sibling = sib, "window fan-out write not applied");
                }
            }
        }
    }
}
