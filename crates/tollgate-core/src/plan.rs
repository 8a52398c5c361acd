//! The acquire planner: rule "plan in the core, execute in the limiter" (docs/rules.md).
//! What the rf-locked slow pass on one shard writes — or why it refuses, with the statuses
//! that say so — as a pure function of the item read, the request and `now`; and the
//! entity-wide statuses every refusal and availability answer is built from. The limiter
//! reads what a plan needs (the item, the siblings a seed needs, shard 0's count), asks
//! here, executes the write and feeds a failure back as a new pass.

use crate::bucket::{attr, BucketImage};
use crate::bypass::Enforcement;
use crate::expr::{Condition, Update};
use crate::materialize::{evaluate, evaluate_wcu, valid_until, Evaluated};
use crate::seeding::SeedPlan;
use crate::status::{limit_status, ShardView};
use crate::units::{EpochMs, ShardCount};
use crate::writes::{next_rf, normal_write, Amounts, Charging, ItemStamp, TtlWrite};
use crate::{Limit, LimitStatus};

/// An acquire as the planner sees it: the limits in force, the amounts in millitokens,
/// and what every write of it stamps.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// The limits in force for the (entity, resource).
    pub limits: &'a [Limit],
    /// Millitokens per limit name.
    pub amounts: &'a Amounts,
    /// The parameter hash every slow write stamps (`ph`).
    pub params_hash: &'a str,
    /// TTL handling.
    pub ttl: TtlWrite,
    /// The effective cascade policy, stamped on the item.
    pub cascade: bool,
    /// The pass's shape: bypassed (`tc` and `wcu` only) or enforced — the item's stamp,
    /// or the mode this pass flips it to.
    pub bypass: bool,
    /// The mode the config sets for the pair (`None`: enforced).
    pub mode: Option<Enforcement>,
}

/// What shard 0's count pin of a grant needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountPin {
    /// Shard 0 holds this count (1: no count attribute, or 1).
    Count(i64),
    /// Shard 0 has no item.
    Absent,
}

impl CountPin {
    /// Rule "a grant is sized at the live shard count": the condition on shard 0 that its
    /// count is still the one the grant was sized at.
    pub fn condition(self) -> Condition {
        match self {
            CountPin::Count(s) if s <= 1 => Condition::exists("PK").and(
                Condition::not_exists(attr::SHARD_COUNT).or(Condition::eq(attr::SHARD_COUNT, 1)),
            ),
            CountPin::Count(s) => Condition::exists("PK").and(Condition::eq(attr::SHARD_COUNT, s)),
            CountPin::Absent => Condition::not_exists("PK"),
        }
    }
}

/// The inputs of one slow pass on one shard.
#[derive(Debug, Clone, Copy)]
pub struct SlowPass<'a> {
    /// The request.
    pub ask: Ask<'a>,
    /// The item as read (or as a failed write returned it).
    pub image: &'a BucketImage,
    /// The shard planned.
    pub shard: u32,
    /// The largest shard count known before planning: the cached one, the item's, the
    /// seed plan's.
    pub shard_count: ShardCount,
    /// The seeds of the limits the item lacks (empty when it has every limit).
    pub seeds: &'a SeedPlan,
    /// Shard 0's stored count, when it has been read (`Some(None)`: shard 0 has no item).
    pub shard0_count: Option<Option<i64>>,
    /// The instant planned at (read after the item and any sibling read).
    pub now: EpochMs,
}

/// What a slow pass does.
#[derive(Debug)]
pub enum SlowPlan {
    /// The pass grants, resets or rolls a quota on a shard other than 0, whose count pin
    /// needs shard 0's stored count: read it (consistently) and plan again with it.
    ReadShard0,
    /// The pass, planned.
    Pass(PassPlan),
}

/// A planned slow pass.
#[derive(Debug)]
pub struct PassPlan {
    /// The shard count the pass evaluated at (never below the one it was given).
    pub shard_count: ShardCount,
    /// Every limit, materialised at `now` before the debit (index = the ask's limits).
    pub evals: Vec<Evaluated>,
    /// The pin on shard 0's count the commit carries (a quota granted, reset or rolled).
    pub pin: Option<CountPin>,
    /// What the pass does.
    pub outcome: PassOutcome,
}

/// What a planned pass does. A refusal says the shard cannot cover a named limit (its
/// statuses say which); the entity may still cover it across its shards, which the
/// limiter tries when it has several.
#[derive(Debug)]
pub enum PassOutcome {
    /// Refused, with nothing to write.
    Refused(Vec<LimitStatus>),
    /// Write this: the materialisation with the debit — or, when `refused`, with nothing
    /// debited (the write commits the moves that fund the slot; the grant is the slot's
    /// either way).
    Write {
        /// The rf-locked write.
        write: PassWrite,
        /// The refusal's statuses, when the request is refused all the same.
        refused: Option<Vec<LimitStatus>>,
    },
}

/// The rf-locked write of a pass.
#[derive(Debug, Clone)]
pub struct PassWrite {
    /// The update.
    pub update: Update,
    /// Its condition (the rf lock, the balances it relies on, the stamp it was shaped for,
    /// never onto a disabled item).
    pub condition: Condition,
    /// The `rf` it stamps.
    pub refilled_at_ms: i64,
}

/// Plan one slow pass: materialise every limit on the item at `now` (seeding the ones it
/// lacks from `seeds`; a bypassed pass holds what [`crate::bypass::hold`] holds), size a
/// quota grant at the live shard count (rule "a grant is sized at the live shard count":
/// on a shard other than 0 that needs shard 0's count, read first), refuse when a named
/// limit's balance does not cover its amount, and otherwise plan the rf-locked write that
/// materialises and debits. A refusal whose seeds move allowance still writes the move's
/// receiving side, debiting nothing.
pub fn plan_slow_pass(p: &SlowPass<'_>) -> SlowPlan {
    let ask = &p.ask;
    let img = p.image;
    let now = p.now.0;
    let eval_all = |s: i64| -> Vec<Evaluated> {
        ask.limits
            .iter()
            .map(|l| {
                let st = img.limits.get(l.name());
                let e = evaluate(l, st, img.refilled_at_ms, s, now, p.seeds.seed(l.name()));
                if ask.bypass {
                    crate::bypass::hold(e, st, img.refilled_at_ms)
                } else {
                    e
                }
            })
            .collect()
    };
    let mut s = p.shard_count.get();
    let mut evals = eval_all(s);
    let grants = evals.iter().any(|e| e.grant_count.is_some());
    let mut pin = grants.then_some(CountPin::Count(s));
    if grants && p.shard != 0 {
        let Some(s0) = p.shard0_count else {
            return SlowPlan::ReadShard0;
        };
        pin = Some(s0.map_or(CountPin::Absent, CountPin::Count));
        if s0.unwrap_or(1) > s {
            s = s0.unwrap_or(1);
            evals = eval_all(s);
        }
    }
    let refused = refusal(ask, &evals, s, now);
    let outcome = match (refused, p.seeds.moves.is_empty()) {
        (Some(st), true) => PassOutcome::Refused(st),
        (refused, _) => {
            let amounts: &Amounts = if refused.is_some() { &[] } else { ask.amounts };
            let tc_only = if ask.bypass {
                crate::bypass::tc_only(amounts)
            } else {
                Vec::new()
            };
            let charging = Charging {
                debt: false,
                tc_only: &tc_only,
            };
            let mut write = materialising_write(ask, img, &evals, amounts, charging, now);
            if refused.is_none() {
                write.update = crate::usage::count_request(write.update);
            }
            PassOutcome::Write { write, refused }
        }
    };
    debug_assert!(
        s >= p.shard_count.get(),
        "a pass never sizes below the count given"
    );
    SlowPlan::Pass(PassPlan {
        shard_count: ShardCount(s),
        evals,
        pin,
        outcome,
    })
}

/// The rf-locked write that materialises `evals` on `img` and charges `amounts` (the
/// normal write), stamped for the ask; never onto a disabled item, and conditioned on the
/// bypass stamp it was shaped for — a pass whose configured mode disagrees with the item's
/// stamp flips it (rule "a scope's mode reaches its buckets on their slow pass").
pub fn materialising_write(
    ask: &Ask<'_>,
    img: &BucketImage,
    evals: &[Evaluated],
    amounts: &Amounts,
    charging: Charging<'_>,
    now_ms: i64,
) -> PassWrite {
    let wcu = evaluate_wcu(img.wcu.as_ref(), img.refilled_at_ms, now_ms);
    let rf = next_rf(now_ms, Some(img.refilled_at_ms), evals);
    let stamp = ItemStamp {
        refilled_at_ms: rf,
        valid_until_ms: if ask.bypass {
            Some(crate::bypass::VALID_UNTIL)
        } else {
            valid_until(ask.limits, evals, now_ms)
        },
        ttl: ask.ttl,
        params_hash: ask.params_hash,
        read: Some(img),
    };
    let (update, condition) = normal_write(
        img.refilled_at_ms,
        &stamp,
        ask.limits,
        evals,
        &wcu,
        amounts,
        charging,
    );
    let mut update = crate::usage::stamp_write_time(update, now_ms);
    match crate::bypass::flip(img, ask.mode) {
        Some(true) if ask.bypass => update = update.set(attr::BYPASS, true),
        Some(false) if !ask.bypass => update = update.remove(attr::BYPASS),
        _ => {}
    }
    if !crate::writes::restates(img.cascade, ask.cascade) {
        update = update.set(attr::CASCADE, ask.cascade);
    }
    PassWrite {
        update,
        condition: condition
            .and(Condition::not_exists(attr::DISABLED))
            .and(crate::bypass::stamp(img.bypass)),
        refilled_at_ms: rf,
    }
}

/// The statuses of a refusal — every named limit's, the ones that do not cover their
/// amount marked exceeded — when a named limit's materialised balance (`evals`, this
/// shard's) does not cover its amount; `None` when every one does, or when the pass is
/// bypassed (rule "a bypassed scope records, never debits").
pub fn refusal(
    ask: &Ask<'_>,
    evals: &[Evaluated],
    shard_count: i64,
    now_ms: i64,
) -> Option<Vec<LimitStatus>> {
    if ask.bypass {
        return None;
    }
    let short =
        |l: &Limit, e: &Evaluated, a: i64| crate::soft::short(ask.limits, l.name(), e.balance, a);
    let named = |l: &Limit| {
        ask.amounts
            .iter()
            .find(|(n, _)| n == l.name())
            .map(|(_, a)| *a)
    };
    if !ask
        .limits
        .iter()
        .zip(evals)
        .any(|(l, e)| named(l).is_some_and(|a| short(l, e, a)))
    {
        return None;
    }
    let statuses = ask
        .limits
        .iter()
        .zip(evals)
        .filter_map(|(l, e)| {
            let a = named(l)?;
            let view = ShardView::of(e, shard_count);
            Some(limit_status(l, &[view], a, short(l, e, a), now_ms))
        })
        .collect();
    Some(statuses)
}

/// Entity-wide statuses of the limits `amounts` names, summed over the shard images given
/// (index = shard). A missing shard counts for nothing while any shard exists (a new shard
/// is funded from its siblings: a move for quotas, a split for dripping limits), and as a
/// fresh one when none does. A limit is exceeded when `judged` names it and the entity's
/// balance (every shard's, debt counted) does not cover its amount.
pub fn entity_statuses(
    limits: &[Limit],
    amounts: &Amounts,
    images: &[Option<&BucketImage>],
    shard_count: i64,
    now_ms: i64,
    judged: Option<&Amounts>,
) -> Vec<LimitStatus> {
    let none_exist = images.iter().all(|i| i.is_none());
    let mut out = Vec::new();
    for (l, a) in limits.iter().filter_map(|l| {
        amounts
            .iter()
            .find(|(n, _)| n == l.name())
            .map(|(_, a)| (l, *a))
    }) {
        let evals: Vec<Evaluated> = images
            .iter()
            .filter_map(|img| match img {
                Some(img) => Some(evaluate(
                    l,
                    img.limits.get(l.name()),
                    img.refilled_at_ms,
                    shard_count.max(img.shard_count),
                    now_ms,
                    None,
                )),
                None if none_exist => Some(evaluate(l, None, now_ms, shard_count, now_ms, None)),
                None => None,
            })
            .collect();
        let views: Vec<ShardView<'_>> = evals
            .iter()
            .map(|e| ShardView::of(e, shard_count))
            .collect();
        let total: i64 = evals.iter().map(|e| e.balance).sum();
        let exceeded = judged
            .and_then(|j| j.iter().find(|(n, _)| n == l.name()))
            .is_some_and(|(_, want)| crate::soft::short(limits, l.name(), total, *want));
        out.push(limit_status(l, &views, a, exceeded, now_ms));
    }
    out
}

/// A doubling of an entity's shard count, as planned.
#[derive(Debug, Clone)]
pub struct Doubling {
    /// The count after it.
    pub new: ShardCount,
    /// The compare-and-set on shard 0: the count, and `vu = 0` (the next write on the shard
    /// takes the slow path and re-materialises its dripping limits at the new share; a
    /// stale full balance would otherwise be spent on top of the new shards' shares).
    pub shard0: (Update, Condition),
    /// The same write on every other existing shard (best effort, monotone: never lowers a
    /// count).
    pub others: (Update, Condition),
}

/// Rule "shard doubling": double `old` by compare-and-set on shard 0 — never above
/// `max` (at most [`crate::bucket::MAX_SHARD_COUNT`]), never lowered — then propagate it to
/// the other shards. `None` when `old` is already at the cap.
pub fn doubling(old: ShardCount, max: i64) -> Option<Doubling> {
    let old = old.get();
    if old >= crate::bucket::MAX_SHARD_COUNT.min(max) {
        return None;
    }
    let new = old * 2;
    let update = Update::new().set(attr::SHARD_COUNT, new).set(attr::VU, 0);
    Some(Doubling {
        new: ShardCount(new),
        shard0: (update.clone(), CountPin::Count(old).condition()),
        others: (
            update,
            Condition::exists("PK").and(Condition::lt(attr::SHARD_COUNT, new)),
        ),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::bucket::{field, LimitState};
    use crate::expr::Action;
    use crate::keys::battr;
    use crate::limit::MILLI;
    use crate::value::Value;

    const T0: i64 = 1_700_000_000_000;
    const MIN: i64 = 60_000;

    fn ask<'a>(limits: &'a [Limit], amounts: &'a Amounts) -> Ask<'a> {
        Ask {
            limits,
            amounts,
            params_hash: "ph",
            ttl: TtlWrite::Remove,
            cascade: false,
            bypass: false,
            mode: None,
        }
    }

    fn image(rf: i64, shard_count: i64, limits: &[(&Limit, LimitState)]) -> BucketImage {
        BucketImage {
            key: crate::value::Key::new("t", ""),
            refilled_at_ms: rf,
            valid_until_ms: None,
            ttl: None,
            shard_count,
            params_hash: Some("ph".into()),
            limits: limits
                .iter()
                .map(|(l, st)| (l.name().into(), st.clone()))
                .collect(),
            wcu: None,
            disabled: false,
            bypass: false,
            op: None,
            cascade: None,
            layout: Default::default(),
        }
    }

    fn state(l: &Limit, tk: i64) -> LimitState {
        LimitState {
            balance: tk,
            capacity: l.capacity_milli(),
            refill_amount: l.ra(),
            refill_period_ms: l.rp(),
            ..LimitState::default()
        }
    }

    fn pass<'a>(a: Ask<'a>, img: &'a BucketImage, seeds: &'a SeedPlan, shard: u32) -> SlowPass<'a> {
        SlowPass {
            ask: a,
            image: img,
            shard,
            shard_count: ShardCount(img.shard_count),
            seeds,
            shard0_count: None,
            now: EpochMs(T0 + MIN),
        }
    }

    /// What `u` adds to attribute `name`.
    fn added(u: &Update, name: &str) -> Option<i64> {
        u.actions.iter().find_map(|a| match a {
            Action::Add(n, Value::N(v)) if n == name => Some(*v),
            _ => None,
        })
    }

    fn names(c: &Condition) -> Vec<String> {
        let mut out = Vec::new();
        c.names(&mut out);
        out
    }

    #[test]
    fn a_covered_pass_writes_the_refill_and_the_debit_under_the_rf_lock() {
        let l = [Limit::per_minute("rpm", 10).unwrap()];
        let amounts = vec![("rpm".to_string(), 3 * MILLI)];
        let img = image(T0, 1, &[(&l[0], state(&l[0], 2 * MILLI))]);
        let seeds = SeedPlan::default();
        let SlowPlan::Pass(p) = plan_slow_pass(&pass(ask(&l, &amounts), &img, &seeds, 0)) else {
            panic!("no shard-0 read is needed on shard 0");
        };
        // A minute refilled the whole capacity: 10 tokens before the debit.
        assert_eq!(p.evals[0].balance, 10 * MILLI);
        assert_eq!(p.pin, None, "no quota grant, no pin");
        let PassOutcome::Write {
            write: w,
            refused: None,
        } = p.outcome
        else {
            panic!("admitted: {:?}", p.outcome);
        };
        assert!(w.refilled_at_ms > T0, "rf moves past the locked value");
        // The refill (8 tokens) minus the debit (3), added to the balance; the debit to tc.
        let tk = battr("rpm", field::TK);
        assert_eq!(added(&w.update, &tk), Some(5 * MILLI));
        assert_eq!(added(&w.update, &battr("rpm", field::TC)), Some(3 * MILLI));
        // Locked on the rf read, never onto a disabled item, shaped enforced.
        let c = names(&w.condition);
        for a in [attr::RF, attr::DISABLED, attr::BYPASS] {
            assert!(c.iter().any(|n| n == a), "{a} in {c:?}");
        }
    }

    #[test]
    fn a_short_pass_refuses_with_statuses_and_writes_nothing() {
        let l = [Limit::per_minute("rpm", 10).unwrap()];
        let amounts = vec![("rpm".to_string(), 11 * MILLI)];
        let img = image(T0 + MIN, 1, &[(&l[0], state(&l[0], 0))]);
        let seeds = SeedPlan::default();
        let SlowPlan::Pass(p) = plan_slow_pass(&pass(ask(&l, &amounts), &img, &seeds, 0)) else {
            panic!("planned");
        };
        // A refusal without a move writes nothing.
        let PassOutcome::Refused(st) = p.outcome else {
            panic!("refused: {:?}", p.outcome);
        };
        assert_eq!(st.len(), 1);
        assert!(st[0].exceeded);
        assert_eq!(st[0].limit, "rpm");
        // Bypassed, the same pass admits, its debit in `tc` only.
        let a = Ask {
            bypass: true,
            ..ask(&l, &amounts)
        };
        let SlowPlan::Pass(p) = plan_slow_pass(&pass(a, &img, &seeds, 0)) else {
            panic!("planned");
        };
        let PassOutcome::Write {
            write: w,
            refused: None,
        } = p.outcome
        else {
            panic!("a bypassed pass admits: {:?}", p.outcome);
        };
        assert_eq!(added(&w.update, &battr("rpm", field::TK)).unwrap_or(0), 0);
        assert_eq!(added(&w.update, &battr("rpm", field::TC)), Some(11 * MILLI));
    }

    #[test]
    fn a_grant_off_shard_0_reads_shard_0_and_is_sized_at_its_count() {
        let q = [Limit::quota_after("session", 100, Duration::from_secs(3600)).unwrap()];
        let amounts = vec![("session".to_string(), MILLI)];
        // Shard 1 of 2 whose window ended two hours ago: the pass opens a new one, a grant.
        let st = LimitState {
            window_start_ms: Some(T0 - 2 * 3_600_000),
            window_s: Some(3600),
            ..state(&q[0], 0)
        };
        let img = image(T0 - 3_600_000, 2, &[(&q[0], st.clone())]);
        let seeds = SeedPlan::default();
        let input = pass(ask(&q, &amounts), &img, &seeds, 1);
        assert!(matches!(plan_slow_pass(&input), SlowPlan::ReadShard0));
        // Shard 0 says 4 shards now: the grant is sized at 4 and pinned on it.
        let at4 = SlowPass {
            shard0_count: Some(Some(4)),
            ..input
        };
        let SlowPlan::Pass(p) = plan_slow_pass(&at4) else {
            panic!("planned with shard 0's count");
        };
        assert_eq!(p.shard_count, ShardCount(4));
        assert_eq!(p.pin, Some(CountPin::Count(4)));
        assert_eq!(p.evals[0].grant_count, Some(4));
        let sized =
            |s| evaluate(&q[0], Some(&st), img.refilled_at_ms, s, input.now.0, None).balance;
        assert_eq!(p.evals[0].balance, sized(4));
        assert_ne!(sized(4), sized(2), "the count matters");
        // Shard 0 has no item: the grant is pinned on its absence.
        let absent = SlowPass {
            shard0_count: Some(None),
            ..input
        };
        let SlowPlan::Pass(p) = plan_slow_pass(&absent) else {
            panic!("planned");
        };
        assert_eq!(
            (p.shard_count, p.pin),
            (ShardCount(2), Some(CountPin::Absent))
        );
        // On shard 0 itself nothing is read: pinned at the count given.
        let on0 = pass(ask(&q, &amounts), &img, &seeds, 0);
        let SlowPlan::Pass(p) = plan_slow_pass(&on0) else {
            panic!("planned");
        };
        assert_eq!(p.pin, Some(CountPin::Count(2)));
    }

    #[test]
    fn entity_statuses_sum_the_shards_and_judge_the_entity() {
        let l = [Limit::per_minute("rpm", 10).unwrap()];
        let now = T0 + MIN;
        let a = image(now, 2, &[(&l[0], state(&l[0], 3 * MILLI))]);
        let b = image(now, 2, &[(&l[0], state(&l[0], 4 * MILLI))]);
        let want = vec![("rpm".to_string(), 8 * MILLI)];
        let st = entity_statuses(&l, &want, &[Some(&a), Some(&b)], 2, now, Some(&want));
        assert_eq!(st[0].available, 7);
        assert!(st[0].exceeded, "7 of the entity's tokens do not cover 8");
        let fits = vec![("rpm".to_string(), 7 * MILLI)];
        let st = entity_statuses(&l, &fits, &[Some(&a), Some(&b)], 2, now, Some(&fits));
        assert!(!st[0].exceeded);
        // No shard exists: a fresh entity, at capacity.
        let st = entity_statuses(&l, &fits, &[None, None], 2, now, Some(&fits));
        assert_eq!(st[0].available, 10);
    }

    #[test]
    fn doubling_stops_at_the_cap() {
        let d = doubling(ShardCount(4), 32).expect("room to double");
        assert_eq!(d.new, ShardCount(8));
        assert_eq!(d.shard0.1, CountPin::Count(4).condition());
        assert!(doubling(ShardCount(32), 64).is_none(), "never above 32");
        assert!(
            doubling(ShardCount(8), 8).is_none(),
            "never above the configured cap"
        );
        assert_eq!(
            doubling(ShardCount(1), 32).map(|d| d.new),
            Some(ShardCount(2))
        );
    }

    #[test]
    fn a_count_pin_names_shard_0s_count() {
        let n = |p: CountPin| names(&p.condition());
        assert!(n(CountPin::Count(4)).contains(&attr::SHARD_COUNT.to_string()));
        assert!(n(CountPin::Count(1)).contains(&attr::SHARD_COUNT.to_string()));
        assert_eq!(n(CountPin::Absent), vec!["PK".to_string()]);
    }
}
