//! Sharding rules that need the store: seeding a limit on a new shard (joining shard 0's
//! live window, quota grants) and the rollover fan-out of an opened window (ADR-139/140).

use tollgate_core::bucket::{attr, BucketImage, WCU_CAPACITY};
use tollgate_core::expr::{Condition, ReturnValues, SetValue, Update};
use tollgate_core::grant::{
    donor_condition, infer_gc, plan_quota_grant, quota_grant_is_current, window_grant_overlaps,
    Grant, Sibling,
};
use tollgate_core::keys::battr;
use tollgate_core::limit::{Limit, Refill};
use tollgate_core::materialize::{drip_share_count, evaluate, share, Evaluated, Seed};
use tollgate_core::mutants::{self, Mutant};
use tollgate_core::value::Value;
use tollgate_core::window;
use tollgate_store::{TransactOp, UpdateRequest};

use crate::acquire::Request;
use crate::error::Result;
use crate::limiter::{Inner, Stats};

/// Rule "proactive doubling": a shard whose projected `wcu` balance is below 20 % of its
/// capacity is a hot partition and should double (if below the cap of 32 shards).
pub fn should_double(projected_wcu: i64, shard_count: i64) -> bool {
    shard_count < tollgate_core::bucket::MAX_SHARD_COUNT && projected_wcu * 5 < WCU_CAPACITY
}

/// A donor debit planned with a seed (ADR-145 move): committed in the same transaction
/// as the write that creates or seeds the slot.
#[derive(Debug, Clone)]
pub(crate) struct Move {
    /// Donor shard.
    pub shard: u32,
    /// Quota name.
    pub limit: String,
    /// Millitokens moved.
    pub amount: i64,
    /// The donor's condition (same generation, same period, still holds the amount).
    pub condition: Condition,
    /// A dripping split (see [`plan_seeds`]): the donor's new grant count for the limit; the
    /// donor is also sent to the slow path once (`vu = 0`), which re-materialises it at its
    /// halved share.
    pub split_gc: Option<i64>,
}

/// How the limits missing on one shard are seeded, with the moves that fund them.
#[derive(Debug, Clone, Default)]
pub(crate) struct SeedPlan {
    /// Seed per limit name.
    pub seeds: Vec<(String, Seed)>,
    /// Donor debits.
    pub moves: Vec<Move>,
    /// The shard count the plan was sized at.
    pub shard_count: i64,
    /// The instant the plan decided at: the caller's now, or the newest `rf` among the
    /// siblings read if that is later (rule "never decide in a period older than the state
    /// read": a pass whose clock lags the siblings must not stamp its grant into a period
    /// they have already left, or the next pass would reset — and grant — it again).
    pub now: i64,
    /// Shard 0's count as the planner read it (`Some(None)`: absent), when it read it: the
    /// grant was sized against it, so the commit pins it.
    pub shard0: Option<Option<i64>>,
    /// Dripping splits that fund the slot (donor debits with their grant-count stamp).
    pub splits: Vec<Move>,
    /// The slot cannot be split into yet: its covering sibling must first split into this
    /// slot (the next level of the family), which is created first.
    pub split_first: Option<u32>,
}

impl SeedPlan {
    pub(crate) fn seed(&self, name: &str) -> Option<Seed> {
        self.seeds.iter().find(|(n, _)| n == name).map(|(_, s)| *s)
    }
}

/// Plan how to seed `missing` limits on `shard`, caller's count `s_caller`.
///
/// - dripping limits on a new shard of a sharded entity (rule "a doubling splits, it does
///   not mint"): the shard's family is covered by its closest existing ancestor — the
///   sibling `a` with the largest grant count `g` (`b_{n}_gc`) such that `shard ≡ a (mod g)`.
///   When the shard is `a`'s next-level buddy (`a + g`), `a` splits: the new shard gets
///   `⌊P / 2⌋` of `a`'s balance `P` materialised now, `a` keeps the rest, both are sized at
///   `2g`, in one transaction (`a` pinned on `rf` and `g`, sent to the slow path once).
///   When the buddy is another slot, that slot is created first ([`SeedPlan::split_first`]).
///   With no covering sibling (a new entity, or its ancestor expired) the shard gets a
///   fresh share. A limit seeded onto an existing item gets a fresh share;
/// - quotas on an unsharded entity: a fresh share (windows open at now);
/// - quotas with siblings (ADR-145): read the siblings strongly consistently, size at the
///   largest count seen, and move the grant from the covering current sibling; a slot no
///   current sibling covers gets a fresh share;
/// - windows (ADR-139/140): a shard joins the live window (shard 0's, or a later staggered
///   one: [`join_window`]); it opens its own only when no sibling's window is live. A sibling
///   whose ended window overlapped the joined one covers with nothing to move
///   ([`window_grant_overlaps`]).
///
/// With `moves` off (a second lost move), quotas covered by a sibling get nothing.
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

/// [`plan_seeds`] for a whole new item (`creating`: dripping limits may split a sibling).
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
    let mut plan = SeedPlan {
        shard_count: s_caller.max(1),
        now,
        ..SeedPlan::default()
    };
    let quotas: Vec<&Limit> = missing.iter().copied().filter(|l| l.is_quota()).collect();
    let drips = creating && missing.iter().any(|l| !l.is_quota());
    let sharded = shard > 0 || s_caller > 1;
    let mut images: Vec<(u32, BucketImage)> = Vec::new();
    if (!quotas.is_empty() || drips) && sharded {
        images = read_siblings(inner, req, shard, s_caller).await?;
        let seen = images.iter().map(|(_, i)| i.shard_count).max().unwrap_or(1);
        if seen > s_caller {
            images = read_siblings(inner, req, shard, seen).await?;
        }
        plan.shard_count = s_caller.max(seen).max(shard as i64 + 1);
        if shard != 0 {
            plan.shard0 = Some(
                images
                    .iter()
                    .find(|(i, _)| *i == 0)
                    .map(|(_, img)| img.shard_count),
            );
        }
        plan.now = images.iter().map(|(_, i)| i.rf).fold(now, i64::max);
    }
    let s = plan.shard_count;
    let now = plan.now;
    for l in missing {
        let cap = l.effective(now).capacity;
        let part = share(cap, s);
        if !l.is_quota() {
            let seed = if drips && sharded && !mutants::off(Mutant::DripSplit) {
                match plan_drip_split(l, &images, shard, s, now) {
                    DripSeed::Fresh => Seed {
                        balance: part,
                        count: Some(s),
                        ..Seed::default()
                    },
                    DripSeed::Split {
                        donor,
                        g,
                        half,
                        condition,
                    } => {
                        plan.splits.push(Move {
                            shard: donor,
                            limit: l.name().into(),
                            amount: half,
                            condition,
                            split_gc: Some(2 * g),
                        });
                        Seed {
                            balance: half,
                            count: Some(2 * g),
                            ..Seed::default()
                        }
                    }
                    DripSeed::First(slot) => {
                        plan.split_first = Some(slot);
                        Seed::default()
                    }
                }
            } else {
                Seed {
                    balance: part,
                    ..Seed::default()
                }
            };
            plan.seeds.push((l.name().into(), seed));
            continue;
        }
        if !sharded {
            plan.seeds.push((
                l.name().into(),
                Seed {
                    balance: part,
                    ..Seed::default()
                },
            ));
            continue;
        }
        let join_ws = match l.refill() {
            Refill::Window { reset_after_s } => join_window(&images, l.name(), *reset_after_s, now),
            _ => None,
        };
        let siblings: Vec<Sibling> = images
            .iter()
            .filter_map(|(i, img)| {
                let st = img.limits.get(l.name())?;
                let (tk, current) = if quota_grant_is_current(l, st, img.rf, now) {
                    (st.tk, true)
                } else if join_ws.is_some_and(|j| window_grant_overlaps(l, st, img.rf, j)) {
                    // Covered in this phase already; its dead balance is not moved.
                    (0, true)
                } else {
                    (st.tk, false)
                };
                Some(Sibling {
                    shard: *i,
                    tk,
                    gc: infer_gc(st.gc, st.tk, cap, img.shard_count),
                    current,
                })
            })
            .collect();
        let grant = if mutants::off(Mutant::GrantMove) {
            Grant {
                donor: None,
                tokens: part,
            }
        } else {
            plan_quota_grant(&siblings, shard, part)
        };
        let tokens = match grant.donor {
            None => grant.tokens,
            Some(_) if !moves => 0,
            Some((d, _gc)) => {
                if grant.tokens > 0 {
                    if let Some((_, img)) = images.iter().find(|(i, _)| *i == d) {
                        if let Some(st) = img.limits.get(l.name()) {
                            plan.moves.push(Move {
                                shard: d,
                                limit: l.name().into(),
                                amount: grant.tokens,
                                condition: donor_condition(
                                    l,
                                    grant.tokens,
                                    st,
                                    img.rf,
                                    img.shard_count,
                                    now,
                                ),
                                split_gc: None,
                            });
                        }
                    }
                }
                grant.tokens
            }
        };
        plan.seeds.push((
            l.name().into(),
            Seed {
                balance: tokens,
                join_ws,
                ..Seed::default()
            },
        ));
    }
    Ok(plan)
}

/// How a new shard's dripping limit is funded.
enum DripSeed {
    /// No sibling covers the slot: a fresh share.
    Fresh,
    /// The covering sibling `donor` (grant count `g`) splits into this slot: `half` moves.
    Split {
        donor: u32,
        g: i64,
        half: i64,
        condition: Condition,
    },
    /// The covering sibling's next-level buddy is this other slot: create it first.
    First(u32),
}

/// The dripping split rule of [`plan_seeds`] for one limit on a new slot.
fn plan_drip_split(
    l: &Limit,
    images: &[(u32, BucketImage)],
    slot: u32,
    s: i64,
    now: i64,
) -> DripSeed {
    let n = l.name();
    let ancestor = images
        .iter()
        .filter_map(|(i, img)| {
            let st = img.limits.get(n)?;
            let g = drip_share_count(st, img.shard_count);
            (i64::from(slot) % g == i64::from(*i) % g).then_some((*i, g, img, st))
        })
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)));
    let Some((a, g, img, st)) = ancestor else {
        return DripSeed::Fresh;
    };
    if g >= s {
        // Only the slot itself could cover itself at the full count.
        return DripSeed::Fresh;
    }
    let buddy = i64::from(a) + g;
    if buddy != i64::from(slot) {
        return match u32::try_from(buddy) {
            Ok(b) => DripSeed::First(b),
            Err(_) => DripSeed::Fresh,
        };
    }
    let e = evaluate(l, Some(st), img.rf, img.shard_count.max(g), now, None);
    let half = e.balance.div_euclid(2);
    let gc = battr(n, "gc");
    let generation = match st.gc {
        Some(x) => Condition::eq(gc, x),
        None => Condition::not_exists(gc),
    };
    // The donor is pinned on the balance it was read with, not only on `rf`: a fast-path
    // debit leaves `rf` alone, and a split landing after one would move tokens already
    // spent (a shard at 0 going to −half, the new shard's half minted; found by the
    // simulator's drip workload in 3 of 100,000 seeds).
    DripSeed::Split {
        donor: a,
        g,
        half,
        condition: Condition::exists("PK")
            .and(Condition::eq(attr::RF, img.rf))
            .and(Condition::eq(battr(n, "tk"), st.tk))
            .and(generation),
    }
}

/// Rule "a new shard joins the entity's live window" (ADR-139/140): the start it adopts is
/// shard 0's live window — or, when shards are staggered (concurrent openers, a lost
/// fan-out) and a sibling already adopted a later live start, the newest live start among
/// the siblings read. Joining an older staggered window late would put the slot's share
/// into a phase whose allowance for that slot an ancestor already held (found by the
/// simulator: seed 4136 admitted 28 of 27 in one phase). `None`: no live window; the shard
/// opens its own and fans out.
fn join_window(
    images: &[(u32, BucketImage)],
    limit: &str,
    reset_after_s: i64,
    now: i64,
) -> Option<i64> {
    images
        .iter()
        .filter_map(|(_, img)| img.limits.get(limit)?.ws)
        .filter(|ws| !window::ended(*ws, reset_after_s * 1000, now))
        .max()
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
    let items = inner.store.batch_get(&keys, consistent).await?;
    let mut out = Vec::new();
    for (i, item) in ids.into_iter().zip(items) {
        if let Some(item) = item {
            out.push((i, BucketImage::decode(&item)?));
        }
    }
    Ok(out)
}

/// Donor debits as transaction operations: one update per donor shard, debiting every
/// quota it funds under all their conditions. A transaction may address an item once, so
/// two quotas funded by the same donor must share one operation (the simulator found
/// creates that failed as "addresses the item twice" on every attempt).
pub(crate) fn move_ops(inner: &Inner, req: &Request, moves: &[Move]) -> Vec<TransactOp> {
    // Per donor: its update, its condition, and whether it is split (sent slow once).
    let mut by_shard: Vec<(u32, Update, Condition, bool)> = Vec::new();
    for m in moves {
        let debit = |u: Update| {
            let u = u.add(battr(&m.limit, "tk"), -m.amount);
            match m.split_gc {
                Some(g) => u.set(battr(&m.limit, "gc"), g),
                None => u,
            }
        };
        match by_shard.iter_mut().find(|(s, _, _, _)| *s == m.shard) {
            Some((_, u, c, split)) => {
                *u = debit(std::mem::take(u));
                *c = std::mem::replace(c, Condition::exists("PK")).and(m.condition.clone());
                *split |= m.split_gc.is_some();
            }
            None => by_shard.push((
                m.shard,
                debit(Update::new()),
                m.condition.clone(),
                m.split_gc.is_some(),
            )),
        }
    }
    by_shard
        .into_iter()
        .map(|(shard, update, condition, split)| {
            TransactOp::Update(UpdateRequest {
                key: inner.bucket_key(req, shard),
                update: if split {
                    update.set(attr::VU, 0)
                } else {
                    update
                },
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
