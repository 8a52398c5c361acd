//! Materialisation: what one limit's balance on one shard is at `now`, before consumption —
//! the lazy refill, a calendar reset, a window opened or rolled, or a seed.
//!
//! This is the one place that decides a balance; the slow path writes what it returns and
//! the fast path's projection (`would_refill_satisfy`) reads it.

use crate::bucket::{LimitState, WCU_CAPACITY, WCU_PERIOD_MS};
use crate::grant::GrantShare;
use crate::limit::{Effective, Limit, Refill};
use crate::refill::{refill, Drip};
use crate::units::{EpochMs, Millitokens, ShardCount};
use crate::window;

/// Rule "effective parameters and per-shard share": a limit's share of one shard is
/// `C // S`; dripping limits also divide their rate (never the period); `wcu` divides
/// nothing.
pub fn share(capacity: i64, shard_count: i64) -> i64 {
    capacity / shard_count.max(1)
}

/// Per-shard drip rate: `ra // S`, at least 1 milli per period so a shard always refills.
pub fn shard_rate(ra: i64, shard_count: i64) -> i64 {
    (ra / shard_count.max(1)).max(1)
}

/// What happened to the balance on this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// A dripping limit refilled (possibly by 0).
    Refill,
    /// The limit was absent on the item and is seeded.
    Seed,
    /// A calendar edge passed since `rf`: reset to the share.
    CalendarReset,
    /// The duration window had ended (or never opened): a new one opens now.
    WindowOpen,
    /// A fanned-out window start not yet applied: roll into it.
    WindowRoll,
    /// A quota inside its period: balance kept.
    Kept,
}

impl Transition {
    /// Whether the transition replaces the balance (a SET, written as an ADD pinned to the
    /// balance read): calendar reset, window open, window roll.
    pub fn is_set(self) -> bool {
        matches!(
            self,
            Transition::CalendarReset | Transition::WindowOpen | Transition::WindowRoll
        )
    }
}

/// How to seed a limit the item does not carry yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Seed {
    /// The balance to start with (a full share, a grant moved from a sibling, or a dripping
    /// limit's part of a split).
    pub balance: i64,
    /// For windows: the start to adopt (`None` opens one at now).
    pub join_ws: Option<i64>,
    /// For dripping limits: the shard count the new share is sized at (`None`: the pass's).
    pub count: Option<i64>,
}

/// One limit, materialised on one shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evaluated {
    /// Limit name (shared with the limit).
    pub name: crate::expr::Name,
    /// The balance read (0 when seeded).
    pub read_balance: i64,
    /// The balance after this pass's transition, before consumption.
    pub balance: i64,
    /// The per-shard ceiling.
    pub ceiling: i64,
    /// What happened.
    pub transition: Transition,
    /// Drip remainder to write (`b_{n}_rc`).
    pub carry: Option<i64>,
    /// The window start in force after this pass.
    pub window_start_ms: Option<i64>,
    /// Window opened on this pass (to stamp `ws`/`rsa` and fan out).
    pub opened: bool,
    /// `wa` value to write (a value, never a path).
    pub window_applied_ms: Option<i64>,
    /// `gc` to write (quota granted, reset or rolled on this pass).
    pub grant_count: Option<i64>,
    /// `pe` to write (calendar quotas: the edge the balance reflects).
    pub period_applied_ms: Option<i64>,
    /// The window length to stamp (s).
    pub window_s: Option<i64>,
    /// The read state's `tc` (for projections).
    pub consumed: i64,
    /// The effective (scheduled, undivided) parameters this pass materialised: what the
    /// write stamps as `cp`/`ra` (ADR-135).
    pub params: Effective,
    /// The item read carries a schedule for this limit (`b_{n}_sched`).
    pub sched_stored: bool,
    /// Dripping limits: the per-shard drip rate (milli per `rp`); 0 for quotas.
    pub rate: i64,
    /// Dripping limits: the share count to stamp as `b_{n}_gc`, when the item does not
    /// carry it yet (a seed, or an item written before the drip grant count existed).
    pub drip_grant_count: Option<i64>,
    /// The `b_{n}_gc` the state read carried (the write pins it: a split of this shard
    /// lowers its share and must not be undone by a write planned before it).
    pub grant_count_read: Option<i64>,
    /// Quotas: the top-up above the grant the state read carried (`b_{n}_tu`, ADR-149).
    pub tu_read: Option<i64>,
    /// Quotas: the top-up in force after this pass — kept inside the period, gone when the
    /// grant is re-sized (a reset, an open, a roll). The write SETs or REMOVEs it to match.
    pub topped_up: Option<i64>,
    /// The state read already holds the parameters an rf-locked write stamps
    /// (`writes::stamp_params`): `cp`/`ra`/`rp` equal to [`Evaluated::params`] and the limit's
    /// period, a calendar's `rsched`/`tz` equal to its own, and no schedule stored or
    /// configured. The write leaves them out (rule [`crate::writes::restates`]).
    pub params_held: bool,
    /// The drip remainder the state read holds (`b_{n}_rc`, read as 0 when absent); `None`
    /// when the limit is seeded.
    pub carry_read: Option<i64>,
}

impl Evaluated {
    /// The credit this pass applies: `balance − read_tk`, written as an `ADD`.
    pub fn credit(&self) -> i64 {
        self.balance - self.read_balance
    }
}

/// The `wcu` guard's state at `now`: a drip of 1000 tokens per second, undivided.
pub fn evaluate_wcu(state: Option<&LimitState>, rf: i64, now: i64) -> Evaluated {
    let (tk, rc) = state
        .map(|s| (s.balance, s.refill_carry))
        .unwrap_or((WCU_CAPACITY, 0));
    let r = match state {
        Some(_) => refill(
            Drip {
                balance: Millitokens(tk),
                ceiling: Millitokens(WCU_CAPACITY),
                amount: Millitokens(WCU_CAPACITY),
                period_ms: WCU_PERIOD_MS,
                refilled_at: EpochMs(rf),
                carry: rc,
            },
            EpochMs(now),
        ),
        None => crate::refill::Refilled {
            balance: WCU_CAPACITY,
            carry: 0,
            added: 0,
        },
    };
    Evaluated {
        name: crate::expr::Name::Static(crate::ids::WCU),
        read_balance: state.map(|s| s.balance).unwrap_or(0),
        balance: r.balance,
        ceiling: WCU_CAPACITY,
        transition: if state.is_some() {
            Transition::Refill
        } else {
            Transition::Seed
        },
        carry: Some(r.carry),
        window_start_ms: None,
        opened: false,
        window_applied_ms: None,
        grant_count: None,
        period_applied_ms: None,
        window_s: None,
        consumed: state.map(|s| s.consumed).unwrap_or(0),
        params: Effective {
            capacity: WCU_CAPACITY,
            refill_amount: WCU_CAPACITY,
        },
        sched_stored: false,
        rate: WCU_CAPACITY,
        drip_grant_count: None,
        grant_count_read: None,
        tu_read: None,
        topped_up: None,
        params_held: state.is_some(),
        carry_read: state.map(|s| s.refill_carry),
    }
}

/// Rule "a dripping share is sized at the shard's own grant count": the shard count a
/// dripping limit's ceiling `C // g` and rate `ra // g` are sized at is the item's `b_{n}_gc`
/// — the count at which the shard was created or last split (see `shards::plan_seeds` in
/// the limiter) — never simply the entity's current count, so that a doubling neither
/// shrinks a shard's balance nor mints one for the new shards: the shards' families
/// partition the entity and `Σ C // g ≤ C`. An item written before the rule (no `gc`) is
/// sized at the count in force, as it was then.
pub fn drip_share_count(state: &LimitState, shard_count: i64) -> i64 {
    state
        .grant_count
        .filter(|g| *g >= 1)
        .unwrap_or(shard_count.max(1))
}

/// Materialise `limit` on a shard whose item has `state` for it (or none) and stamp `rf`,
/// with `shard_count` shards, at `now`.
///
/// Rules, in one place:
/// - drip: lazy refill with carry to `C // S` at `ra // S` (§4.2);
/// - calendar quota: `prev_edge(now) > rf` ⇒ SET to the share, `gc = S` (ADR-137, §4.10);
/// - window quota: ended (half-open) or never opened ⇒ open at now with the full share,
///   `ws = wa = now`, `gc = S`; unapplied (`ws > wa`, or `ws > rf` unmarked) ⇒ roll to
///   `share − max(0, tc − wtc)`, never above the share, `wa = ws`, `gc = S` (ADR-139/140);
///   otherwise keep, and stamp `wa` with the value read (marks unmarked items);
/// - a quota inside its period keeps its balance, clamped to its ceiling `C // gc`.
///
/// `C` and `ra` are the limit's effective parameters at `now` ([`Limit::effective`],
/// ADR-135: the schedule first, then the division by `S`). So at a schedule boundary a
/// lowered capacity clamps the balance to the new per-shard cap on this pass, and a raised
/// one mints nothing: a dripping limit refills toward the new cap at the (new) rate, a
/// quota keeps its balance until its next reset grants the new share.
pub fn evaluate(
    limit: &Limit,
    state: Option<&LimitState>,
    rf: i64,
    shard_count: i64,
    now: i64,
    seed: Option<Seed>,
) -> Evaluated {
    let s = shard_count.max(1);
    let params = limit.effective(now);
    let cap = params.capacity;
    let part = share(cap, s);
    let mut e = Evaluated {
        name: limit.shared_name(),
        read_balance: state.map(|st| st.balance).unwrap_or(0),
        balance: 0,
        ceiling: part,
        transition: Transition::Kept,
        carry: None,
        window_start_ms: None,
        opened: false,
        window_applied_ms: None,
        grant_count: None,
        period_applied_ms: None,
        window_s: limit.rsa(),
        consumed: state.map(|st| st.consumed).unwrap_or(0),
        params,
        sched_stored: state.is_some_and(|st| st.schedule.is_some()),
        rate: 0,
        drip_grant_count: None,
        grant_count_read: state.and_then(|st| st.grant_count),
        tu_read: state.and_then(|st| st.topped_up),
        topped_up: None,
        params_held: state.is_some_and(|st| holds_params(limit, st, &params)),
        carry_read: state.map(|st| st.refill_carry),
    };
    let Some(st) = state else {
        let seed = seed.unwrap_or(Seed {
            balance: part,
            ..Seed::default()
        });
        e.transition = Transition::Seed;
        e.balance = seed.balance.min(part);
        match limit.refill() {
            Refill::Drip { .. } => {
                let g = seed.count.unwrap_or(s).max(1);
                e.ceiling = share(cap, g);
                e.rate = shard_rate(params.refill_amount, g);
                e.balance = seed.balance.min(e.ceiling);
                e.carry = Some(0);
                e.drip_grant_count = Some(g);
            }
            Refill::Calendar(cal) => {
                e.grant_count = Some(s);
                e.period_applied_ms = cal.prev_edge(now);
            }
            Refill::Window { .. } => {
                let ws = seed.join_ws.unwrap_or(now);
                e.opened = seed.join_ws.is_none();
                e.window_start_ms = Some(ws);
                e.window_applied_ms = Some(ws);
                e.grant_count = Some(s);
            }
        }
        return e;
    };
    match limit.refill() {
        Refill::Drip { period_ms, .. } => {
            let g = drip_share_count(st, s);
            e.ceiling = share(cap, g);
            e.rate = shard_rate(params.refill_amount, g);
            e.drip_grant_count = st.grant_count.is_none().then_some(g);
            let r = refill(
                Drip {
                    balance: Millitokens(st.balance),
                    ceiling: Millitokens(e.ceiling),
                    amount: Millitokens(e.rate),
                    period_ms: *period_ms,
                    refilled_at: EpochMs(rf),
                    carry: st.refill_carry,
                },
                EpochMs(now),
            );
            e.balance = r.balance;
            e.carry = Some(r.carry);
            e.transition = Transition::Refill;
        }
        Refill::Calendar(cal) => {
            let ceiling = topped_up_ceiling(cap, st, s);
            e.ceiling = ceiling;
            // Rule "calendar reset" (ADR-137) with a period-applied marker: a reset is due
            // when the latest edge is newer than the edge the balance reflects (`pe`; `rf`
            // on unmarked items), so a writer that stamps `rf` without resetting (or moves it
            // back) can neither skip nor repeat a reset.
            let applied = st.period_applied_ms.unwrap_or(rf);
            match cal.prev_edge(now) {
                Some(edge) if edge > applied => {
                    e.balance = part;
                    e.grant_count = Some(s);
                    e.ceiling = part;
                    e.period_applied_ms = Some(edge);
                    e.transition = Transition::CalendarReset;
                }
                edge => {
                    e.balance = st.balance.min(ceiling);
                    e.topped_up = st.topped_up;
                    e.period_applied_ms = edge
                        .map(|x| x.max(st.period_applied_ms.unwrap_or(x)))
                        .or(st.period_applied_ms);
                }
            }
        }
        Refill::Window { reset_after_s } => {
            let len = reset_after_s * 1000;
            let ceiling = topped_up_ceiling(cap, st, s);
            e.ceiling = ceiling;
            match st.window_start_ms {
                Some(ws) if !window::ended(ws, len, now) => {
                    e.window_start_ms = Some(ws);
                    if window::unapplied(ws, st.window_applied_ms, rf) {
                        e.balance = window::roll_target(part, st.consumed, st.window_consumed);
                        e.window_applied_ms = Some(ws);
                        e.grant_count = Some(s);
                        e.ceiling = part;
                        e.transition = Transition::WindowRoll;
                    } else {
                        e.balance = st.balance.min(ceiling);
                        e.topped_up = st.topped_up;
                        e.window_applied_ms = Some(st.window_applied_ms.unwrap_or(ws));
                    }
                }
                _ => {
                    e.balance = part;
                    e.window_start_ms = Some(now);
                    e.window_applied_ms = Some(now);
                    e.grant_count = Some(s);
                    e.ceiling = part;
                    e.opened = true;
                    e.transition = Transition::WindowOpen;
                }
            }
        }
    }
    e
}

/// Whether `st` holds what `writes::stamp_params` would write for `limit` materialised with
/// `params`: the effective `cp`/`ra`, the period `rp`, a calendar's expression and zone; a
/// limit with a schedule (configured or stored) is always restamped (its base values and
/// encoded schedule are not compared).
fn holds_params(limit: &Limit, st: &LimitState, params: &Effective) -> bool {
    limit.schedule().is_none()
        && st.schedule.is_none()
        && st.capacity == params.capacity
        && st.refill_amount == params.refill_amount
        && st.refill_period_ms == limit.rp()
        && match limit.calendar() {
            Some(c) => st
                .calendar
                .as_ref()
                .is_some_and(|(expr, tz)| expr == c.expr() && tz == c.tz()),
            None => true,
        }
}

/// ADR-149 ceiling of a topped-up quota shard: the ADR-145 ceiling of its grant plus the
/// top-up it carries for the current period, `C // gc + tu` (the grant count inferred from
/// the balance without the top-up on a legacy item).
pub fn topped_up_ceiling(capacity: i64, st: &LimitState, shard_count: i64) -> i64 {
    let tu = st.topped_up.unwrap_or(0).max(0);
    quota_ceiling(GrantShare {
        grant_count: st.grant_count,
        balance: Millitokens(st.balance - tu),
        capacity: Millitokens(capacity),
        shard_count: ShardCount(shard_count),
    })
    .0 + tu
}

/// ADR-145 ceiling of a quota shard: `C // gc` (the shard count its grant was sized at;
/// the current count where no `gc` is stored).
pub fn quota_ceiling(share: GrantShare) -> Millitokens {
    Millitokens(share.capacity.0 / crate::grant::infer_gc(share))
}

/// Rule "the fast path trusts a dripping balance only until it would be full" (the trust
/// horizon, stored as `b_{n}_fu`): the instant at which a dripping limit written with
/// `consumed` at `rf_written` reaches its ceiling again. The fast path debits the stored
/// balance as of `rf` and the next refill adds all the time since; that is exact only while
/// no refill would have been clamped away at the ceiling in between, so a balance-only debit
/// of the limit is allowed only before this instant. A write that leaves the limit full (or
/// above its ceiling) trusts nothing: `rf_written`. `None` for quotas (and with the
/// `TrustHorizon` mutant).
pub fn drip_full_at(limit: &Limit, e: &Evaluated, consumed: i64, rf_written: i64) -> Option<i64> {
    let Refill::Drip { period_ms, .. } = limit.refill() else {
        return None;
    };
    if crate::mutants::off(crate::mutants::Mutant::TrustHorizon) {
        return None;
    }
    let after = e.balance - consumed;
    if after >= e.ceiling {
        return Some(rf_written);
    }
    let carry = e.carry.unwrap_or(0);
    crate::refill::time_to_refill(e.ceiling - after, e.rate, *period_ms, carry)
        .map(|t| rf_written.saturating_add(t))
}

/// The instant from which the fast path may no longer write this item (`vu`): the earliest
/// of the next calendar edge, the end of every window in force and the next schedule
/// boundary of every scheduled limit (ADR-135/137/139). `None` = never. A dripping limit's
/// own trust horizon is per limit ([`drip_full_at`], stored as `b_{n}_fu`): a fast write
/// checks it only for the limits it debits, so an idle limit that sits full does not keep
/// a busy one off the fast path.
pub fn valid_until(limits: &[Limit], evals: &[Evaluated], now: i64) -> Option<i64> {
    let mut vu: Option<i64> = None;
    let mut take = |t: i64| vu = Some(vu.map_or(t, |v: i64| v.min(t)));
    for (l, e) in limits.iter().zip(evals) {
        debug_assert_eq!(e.name, l.name(), "evaluations follow the limits");
        if let Some(b) = l.next_boundary(now) {
            take(b)
        }
        match l.refill() {
            Refill::Calendar(c) => {
                if let Some(n) = c.next_edge(now) {
                    take(n)
                }
            }
            Refill::Window { reset_after_s } => {
                if let Some(ws) = e.window_start_ms {
                    take(ws + reset_after_s * 1000)
                }
            }
            Refill::Drip { .. } => {}
        }
    }
    vu
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const T0: i64 = 1_757_000_000_000;
    const W: i64 = 18_000_000;

    fn session() -> Limit {
        Limit::quota_after("session", 10, Duration::from_secs(18_000)).unwrap()
    }

    fn win(tk: i64, tc: i64, ws: i64, wa: Option<i64>, wtc: Option<i64>) -> LimitState {
        LimitState {
            balance: tk,
            capacity: 10_000,
            consumed: tc,
            window_start_ms: Some(ws),
            window_s: Some(18_000),
            window_applied_ms: wa,
            window_consumed: wtc,
            grant_count: Some(2),
            ..Default::default()
        }
    }

    #[test]
    fn window_open_roll_keep() {
        let l = session();
        // Ended exactly at ws + W (half-open): opens at now with the full share.
        let e = evaluate(
            &l,
            Some(&win(3000, 7000, T0, Some(T0), None)),
            T0,
            1,
            T0 + W,
            None,
        );
        assert_eq!(e.transition, Transition::WindowOpen);
        assert_eq!(
            (e.balance, e.window_start_ms, e.window_applied_ms),
            (10_000, Some(T0 + W), Some(T0 + W))
        );
        // Scenario 45: roll target 5000 − max(0, 1000 − 1000) on S = 2.
        let t1 = T0 + W + 1000;
        let e = evaluate(
            &l,
            Some(&win(0, 1000, t1, Some(T0), Some(1000))),
            t1,
            2,
            t1 + 120_000,
            None,
        );
        assert_eq!(e.transition, Transition::WindowRoll);
        assert_eq!(
            (e.balance, e.window_applied_ms, e.grant_count),
            (5000, Some(t1), Some(2))
        );
        // Scenario 51: a net credit never lifts the target above the share.
        let e = evaluate(
            &l,
            Some(&win(0, 1000, t1, Some(T0), Some(4000))),
            t1,
            2,
            t1 + 1,
            None,
        );
        assert_eq!(e.balance, 5000);
        // Live and applied: kept, wa stamped with the value read.
        let e = evaluate(
            &l,
            Some(&win(4000, 1000, T0, Some(T0), None)),
            T0,
            1,
            T0 + 5,
            None,
        );
        assert_eq!(
            (e.transition, e.balance, e.window_applied_ms),
            (Transition::Kept, 4000, Some(T0))
        );
        // Unmarked (no wa): ws > rf ⇒ roll; ws <= rf ⇒ applied, marked with ws.
        let e = evaluate(
            &l,
            Some(&win(0, 0, T0 + 10, None, None)),
            T0,
            1,
            T0 + 20,
            None,
        );
        assert_eq!(e.transition, Transition::WindowRoll);
        let e = evaluate(
            &l,
            Some(&win(7000, 0, T0, None, None)),
            T0 + 10,
            1,
            T0 + 20,
            None,
        );
        assert_eq!(
            (e.transition, e.window_applied_ms),
            (Transition::Kept, Some(T0))
        );
    }

    #[test]
    fn calendar_reset_forgives_debt() {
        // Scenario 82: tk −4000 before midnight → 10000 after (not 6000).
        let l = Limit::quota_calendar("daily", 10, "0 0 * * *", "UTC").unwrap();
        let midnight = 1_764_547_200_000; // 2025-12-01T00:00:00Z
        let st = LimitState {
            balance: -4000,
            capacity: 10_000,
            grant_count: Some(1),
            ..Default::default()
        };
        let e = evaluate(&l, Some(&st), midnight - 1, 1, midnight, None);
        assert_eq!(
            (e.transition, e.balance),
            (Transition::CalendarReset, 10_000)
        );
        let e = evaluate(&l, Some(&st), midnight - 1, 1, midnight - 1, None);
        assert_eq!((e.transition, e.balance), (Transition::Kept, -4000));
        // Scenario 83: S = 2 → each shard resets to 5000 with gc = 2.
        let e = evaluate(&l, Some(&st), midnight - 1, 2, midnight + 5, None);
        assert_eq!((e.balance, e.grant_count), (5000, Some(2)));
    }

    #[test]
    fn drip_divides_rate_and_capacity() {
        let l = Limit::per_minute("rpm", 1000).unwrap();
        let st = LimitState {
            balance: 0,
            capacity: 1_000_000,
            refill_amount: 1_000_000,
            refill_period_ms: 60_000,
            ..Default::default()
        };
        let e = evaluate(&l, Some(&st), 0, 2, 60_000, None);
        assert_eq!((e.balance, e.ceiling), (500_000, 500_000));
        let e = evaluate(&l, Some(&st), 0, 2, 6_000, None);
        assert_eq!(e.balance, 50_000);
    }

    /// ADR-135 per limit kind, at S = 2 (capacity 1000 by day, 100 on weekends, UTC): a
    /// dripping limit is clamped to the lowered per-shard cap on the pass after the boundary
    /// and refills toward a raised one at the rate in force; a calendar quota is clamped to
    /// `C_eff // gc` when lowered, keeps its balance when raised (nothing minted) and is
    /// reset to the new share at its next edge.
    #[test]
    fn scheduled_limits_per_kind() {
        use crate::schedule::Schedule;
        let weekend = || Schedule::new(&["sat,sun 00:00-24:00 100"], "UTC").unwrap();
        let sat = 1_763_769_600_000; // 2025-11-22T00:00:00Z, a Saturday
        let mon = sat + 2 * 86_400_000;
        let drip = Limit::per_minute("rpm", 1000)
            .unwrap()
            .with_schedule(weekend())
            .unwrap();
        let st = LimitState {
            balance: 400_000,
            capacity: 1_000_000,
            refill_amount: 1_000_000,
            refill_period_ms: 60_000,
            ..Default::default()
        };
        let e = evaluate(&drip, Some(&st), sat - 1, 2, sat, None);
        assert_eq!(
            (e.balance, e.ceiling, e.params.capacity),
            (50_000, 50_000, 100_000)
        );
        let low = LimitState {
            balance: 0,
            ..st.clone()
        };
        let e = evaluate(&drip, Some(&low), mon - 6_000, 2, mon, None);
        assert_eq!(
            (e.balance, e.ceiling),
            (50_000, 500_000),
            "6 s at 500/min per shard"
        );
        let q = Limit::quota_calendar("rpd", 1000, "0 0 1 * *", "UTC")
            .unwrap()
            .with_schedule(weekend())
            .unwrap();
        let qs = LimitState {
            balance: 300_000,
            capacity: 1_000_000,
            grant_count: Some(2),
            period_applied_ms: Some(sat - 21 * 86_400_000), // 2025-11-01
            ..Default::default()
        };
        let e = evaluate(&q, Some(&qs), sat - 1, 2, sat + 1, None);
        assert_eq!((e.transition, e.balance), (Transition::Kept, 50_000));
        let ql = LimitState {
            balance: 20_000,
            ..qs.clone()
        };
        let e = evaluate(&q, Some(&ql), mon - 1, 2, mon, None);
        assert_eq!(
            (e.transition, e.balance, e.ceiling),
            (Transition::Kept, 20_000, 500_000)
        );
        let dec1 = 1_764_547_200_000; // 2025-12-01T00:00:00Z, a Monday
        let e = evaluate(&q, Some(&ql), dec1 - 1, 2, dec1, None);
        assert_eq!(
            (e.transition, e.balance),
            (Transition::CalendarReset, 500_000)
        );
    }

    /// Scenario 79 (ADR-145 ceiling): a quota shard granted at gc = 1 on S = 4 keeps the
    /// ceiling C // 1 and its balance (not clamped to C // 4) inside its period; the reset
    /// at the next edge sizes it at S: share C // 4, gc = 4.
    #[test]
    fn s79_ancestor_grant_ceiling_until_reset() {
        let l = Limit::quota_calendar("rpd", 1000, "0 0 * * *", "UTC").unwrap();
        let midnight = 1_757_030_400_000;
        let st = LimitState {
            balance: 999_000,
            capacity: 1_000_000,
            grant_count: Some(1),
            period_applied_ms: Some(midnight - 86_400_000),
            ..Default::default()
        };
        let e = evaluate(&l, Some(&st), T0, 4, T0 + 1000, None);
        assert_eq!(
            (e.ceiling, e.balance, e.grant_count),
            (1_000_000, 999_000, None)
        );
        let e = evaluate(&l, Some(&st), T0, 4, midnight + 1000, None);
        assert_eq!(e.transition, Transition::CalendarReset);
        assert_eq!(
            (e.ceiling, e.balance, e.grant_count),
            (250_000, 250_000, Some(4))
        );
    }
}
