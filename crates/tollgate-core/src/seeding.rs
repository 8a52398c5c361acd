//! Seeding a limit on a shard that lacks it: the pure half of doubling (ADR-139/140,
//! ADR-145). The limiter reads the siblings (strongly consistently, see
//! [`needs_siblings`]) and asks [`plan_seeds`]; it executes the seeds, the donor debits
//! ([`move_updates`]) and the window joins the plan names.

use crate::bucket::{attr, field, BucketImage, MAX_SHARD_COUNT, WCU_CAPACITY};
use crate::expr::{Condition, Update};
use crate::grant::{
    donor_condition, infer_gc, plan_quota_grant, quota_grant_is_current, window_grant_overlaps,
    Grant, GrantShare, Sibling,
};
use crate::keys::battr;
use crate::limit::{Limit, Refill};
use crate::materialize::{drip_share_count, evaluate, share, Seed};
use crate::mutants::{self, Mutant};
use crate::units::{Millitokens, ShardCount};
use crate::window;

/// Rule "proactive doubling": a shard whose projected `wcu` balance is below 20 % of its
/// capacity is a hot partition and should double (if below the cap of 32 shards).
pub fn should_double(projected_wcu: i64, shard_count: i64) -> bool {
    shard_count < MAX_SHARD_COUNT && projected_wcu * 5 < WCU_CAPACITY
}

/// A donor debit planned with a seed (ADR-145 move): committed in the same transaction
/// as the write that creates or seeds the slot.
#[derive(Debug, Clone)]
pub struct Move {
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
pub struct SeedPlan {
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
    pub fn seed(&self, name: &str) -> Option<Seed> {
        self.seeds.iter().find(|(n, _)| n == name).map(|(_, s)| *s)
    }
}

/// Whether [`plan_seeds`] needs the siblings' images to seed `missing` on `shard` of an
/// entity the caller counts `s_caller` shards for: quotas, or dripping limits of a new item
/// (`creating`), on a sharded entity. The images must be read strongly consistently (a
/// stale image looks like an ended window or an unspent grant and mints allowance:
/// ADR-139 W9, ADR-145), at the largest shard count they show.
pub fn needs_siblings(missing: &[&Limit], shard: u32, s_caller: i64, creating: bool) -> bool {
    let sharded = shard > 0 || s_caller > 1;
    let quotas = missing.iter().any(|l| l.is_quota());
    let drips = creating && missing.iter().any(|l| !l.is_quota());
    sharded && (quotas || drips)
}

/// Plan how to seed `missing` limits on `shard`, caller's count `s_caller`, from the
/// siblings' images (`Some` exactly when [`needs_siblings`]; `creating`: a whole new item,
/// whose dripping limits may split a sibling).
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
pub fn plan_seeds(
    siblings: Option<&[(u32, BucketImage)]>,
    missing: &[&Limit],
    shard: u32,
    s_caller: i64,
    now: i64,
    moves: bool,
    creating: bool,
) -> SeedPlan {
    let mut plan = SeedPlan {
        shard_count: s_caller.max(1),
        now,
        ..SeedPlan::default()
    };
    let drips = creating && missing.iter().any(|l| !l.is_quota());
    let sharded = shard > 0 || s_caller > 1;
    let empty: &[(u32, BucketImage)] = &[];
    let images = siblings.unwrap_or(empty);
    if siblings.is_some() {
        debug_assert!(
            images.iter().all(|(i, _)| *i != shard),
            "the slot is not its own sibling"
        );
        let seen = images.iter().map(|(_, i)| i.shard_count).max().unwrap_or(1);
        plan.shard_count = s_caller.max(seen).max(shard as i64 + 1);
        if shard != 0 {
            plan.shard0 = Some(
                images
                    .iter()
                    .find(|(i, _)| *i == 0)
                    .map(|(_, img)| img.shard_count),
            );
        }
        plan.now = images
            .iter()
            .map(|(_, i)| i.refilled_at_ms)
            .fold(now, i64::max);
    }
    let s = plan.shard_count;
    let now = plan.now;
    for l in missing {
        let cap = l.effective(now).capacity;
        let part = share(cap, s);
        if !l.is_quota() {
            let seed = if drips && sharded && !mutants::off(Mutant::DripSplit) {
                match plan_drip_split(l, images, shard, s, now) {
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
            Refill::Window { reset_after_s } => join_window(images, l.name(), *reset_after_s, now),
            _ => None,
        };
        let siblings: Vec<Sibling> = images
            .iter()
            .filter_map(|(i, img)| {
                let st = img.limits.get(l.name())?;
                let (tk, current) = if quota_grant_is_current(l, st, img.refilled_at_ms, now) {
                    (st.balance, true)
                } else if join_ws
                    .is_some_and(|j| window_grant_overlaps(l, st, img.refilled_at_ms, j))
                {
                    // Covered in this phase already; its dead balance is not moved.
                    (0, true)
                } else {
                    (st.balance, false)
                };
                Some(Sibling {
                    shard: *i,
                    balance: tk,
                    grant_count: infer_gc(GrantShare {
                        grant_count: st.grant_count,
                        balance: Millitokens(st.balance),
                        capacity: Millitokens(cap),
                        shard_count: ShardCount(img.shard_count),
                    }),
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
                                    img.refilled_at_ms,
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
    plan
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
    let e = evaluate(
        l,
        Some(st),
        img.refilled_at_ms,
        img.shard_count.max(g),
        now,
        None,
    );
    let half = e.balance.div_euclid(2);
    let gc = battr(n, field::GC);
    let generation = match st.grant_count {
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
            .and(Condition::eq(attr::RF, img.refilled_at_ms))
            .and(Condition::eq(battr(n, field::TK), st.balance))
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
pub fn join_window(
    images: &[(u32, BucketImage)],
    limit: &str,
    reset_after_s: i64,
    now: i64,
) -> Option<i64> {
    images
        .iter()
        .filter_map(|(_, img)| img.limits.get(limit)?.window_start_ms)
        .filter(|ws| !window::ended(*ws, reset_after_s * 1000, now))
        .max()
}

/// Donor debits grouped per donor shard: one update per donor, debiting every quota it
/// funds under all their conditions (a transaction may address an item once, so two quotas
/// funded by the same donor share one operation; the simulator found creates that failed as
/// "addresses the item twice" on every attempt). A split donor is also sent to the slow
/// path once (`vu = 0`).
pub fn move_updates(moves: &[Move]) -> Vec<(u32, Update, Condition)> {
    let mut by_shard: Vec<(u32, Update, Condition, bool)> = Vec::new();
    for m in moves {
        let debit = |u: Update| {
            let u = u.add(battr(&m.limit, field::TK), -m.amount);
            match m.split_gc {
                Some(g) => u.set(battr(&m.limit, field::GC), g),
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
            let update = if split {
                update.set(attr::VU, 0)
            } else {
                update
            };
            (shard, update, condition)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::bucket::LimitState;

    const NOW: i64 = 1_000_000_000;

    fn image(shard_count: i64, rf: i64, limits: &[(&str, LimitState)]) -> BucketImage {
        BucketImage {
            key: crate::value::Key::new("t", ""),
            refilled_at_ms: rf,
            valid_until_ms: None,
            ttl: None,
            shard_count,
            params_hash: None,
            limits: limits
                .iter()
                .map(|(n, st)| ((*n).into(), st.clone()))
                .collect(),
            wcu: None,
            disabled: false,
            bypass: false,
            op: None,
            cascade: None,
            layout: Default::default(),
        }
    }

    fn session(ws: i64, tk: i64) -> LimitState {
        LimitState {
            balance: tk,
            capacity: 1_000_000,
            window_start_ms: Some(ws),
            window_s: Some(3600),
            ..LimitState::default()
        }
    }

    /// An unsharded entity reads nothing and seeds the full share.
    #[test]
    fn unsharded_seeds_a_fresh_share() {
        let q = Limit::quota_after("q", 1000, Duration::from_secs(3600)).unwrap();
        assert!(!needs_siblings(&[&q], 0, 1, true));
        let plan = plan_seeds(None, &[&q], 0, 1, NOW, true, true);
        assert_eq!(plan.shard_count, 1);
        assert_eq!(plan.seed("q").map(|s| s.balance), Some(1_000_000));
        assert!(plan.moves.is_empty() && plan.shard0.is_none());
    }

    /// ADR-145: shard 1 of two joins shard 0's live window and its grant moves from
    /// shard 0 (half of 1,000 tokens), pinned on shard 0's count; without moves it gets 0.
    #[test]
    fn a_quota_slot_is_funded_by_a_move_and_joins_the_live_window() {
        let q = Limit::quota_after("q", 1000, Duration::from_secs(3600)).unwrap();
        let ws = NOW - 60_000;
        let sib = [(0, image(2, NOW - 1000, &[("q", session(ws, 1_000_000))]))];
        assert!(needs_siblings(&[&q], 1, 2, false));
        let plan = plan_seeds(Some(&sib), &[&q], 1, 2, NOW, true, false);
        assert_eq!(plan.shard_count, 2);
        assert_eq!(plan.shard0, Some(Some(2)));
        let seed = plan.seed("q").unwrap();
        assert_eq!((seed.balance, seed.join_ws), (500_000, Some(ws)));
        assert_eq!(plan.moves.len(), 1);
        assert_eq!((plan.moves[0].shard, plan.moves[0].amount), (0, 500_000));
        let plan = plan_seeds(Some(&sib), &[&q], 1, 2, NOW, false, false);
        assert_eq!(plan.seed("q").map(|s| s.balance), Some(0));
        assert!(plan.moves.is_empty());
    }

    /// Rule "never decide in a period older than the state read": a sibling's later `rf`
    /// is the instant the plan decides at.
    #[test]
    fn the_plan_decides_at_the_newest_rf_read() {
        let q = Limit::quota_after("q", 1000, Duration::from_secs(3600)).unwrap();
        let sib = [(0, image(2, NOW + 5_000, &[("q", session(NOW, 1_000_000))]))];
        let plan = plan_seeds(Some(&sib), &[&q], 1, 2, NOW, true, false);
        assert_eq!(plan.now, NOW + 5_000);
    }

    /// Rule "a doubling splits, it does not mint": shard 1 of a 10-token drip takes half of
    /// shard 0's balance (8 tokens) and both are sized at 2.
    #[test]
    fn a_dripping_slot_splits_its_covering_sibling() {
        let d = Limit::per_minute("d", 10).unwrap();
        let st = LimitState {
            balance: 8_000,
            capacity: 10_000,
            refill_amount: 10_000,
            refill_period_ms: 60_000,
            ..LimitState::default()
        };
        let sib = [(0, image(1, NOW, &[("d", st)]))];
        assert!(needs_siblings(&[&d], 1, 2, true));
        assert!(!needs_siblings(&[&d], 1, 2, false));
        let plan = plan_seeds(Some(&sib), &[&d], 1, 2, NOW, true, true);
        let seed = plan.seed("d").unwrap();
        assert_eq!((seed.balance, seed.count), (4_000, Some(2)));
        assert_eq!(plan.splits.len(), 1);
        let m = &plan.splits[0];
        assert_eq!((m.shard, m.amount, m.split_gc), (0, 4_000, Some(2)));
        // A slot whose covering sibling's next-level buddy is another slot waits for it.
        let plan = plan_seeds(Some(&sib), &[&d], 3, 4, NOW, true, true);
        assert_eq!(plan.split_first, Some(1));
    }

    /// Rule "a new shard joins the entity's live window": the newest live start wins and an
    /// ended window is not joined.
    #[test]
    fn join_window_takes_the_newest_live_start() {
        let ims = [
            (0, image(3, NOW, &[("q", session(NOW - 10_000, 0))])),
            (2, image(3, NOW, &[("q", session(NOW - 5_000, 0))])),
        ];
        assert_eq!(join_window(&ims, "q", 3600, NOW), Some(NOW - 5_000));
        assert_eq!(join_window(&ims, "q", 3600, NOW + 3_600_000), None);
        assert_eq!(join_window(&ims, "other", 3600, NOW), None);
    }

    /// Two quotas funded by one donor share one operation; a split donor goes slow once.
    #[test]
    fn moves_from_one_donor_share_one_update() {
        let m = |limit: &str, split_gc| Move {
            shard: 0,
            limit: limit.into(),
            amount: 5,
            condition: Condition::exists("PK"),
            split_gc,
        };
        let ops = move_updates(&[m("a", None), m("b", None)]);
        assert_eq!(ops.len(), 1);
        let ops = move_updates(&[
            m("a", None),
            Move {
                shard: 1,
                ..m("b", Some(2))
            },
        ]);
        assert_eq!(ops.len(), 2);
        assert_ne!(ops[0].1, ops[1].1);
    }

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
