//! ADR-149 reset and top-up: an operator refills an entity's bucket for a resource to full,
//! or adds tokens above the current grant, on every shard in one transaction.
//!
//! The rules here act on limits already materialised at `now` ([`crate::materialize`]):
//! the limiter reads every shard, evaluates each limit as the slow path would, passes the
//! results through [`reset`] or [`top_up`], and writes them with the rf-locked normal write
//! (`vu = 0`, `op` stamped) — so refill, grant and window stamps keep their one home.

use crate::bucket::BucketImage;
use crate::limit::{Limit, Refill};
use crate::materialize::{share, Evaluated, Transition};

/// Rule "a reset refills to full" (ADR-149): a dripping limit's balance becomes its ceiling
/// (no carry); a calendar quota's becomes the share `C_eff // S` with `gc = S`, the current
/// period marked applied; a `reset_after` quota gets a full share in a window opened at the
/// reset instant (`ws = wa = now`, `gc = S`). Any top-up (`tu`) is dropped.
///
/// Deviation from the original (docs/decisions.md, ADR-149): upstream leaves a session
/// window ending exactly at the reset instant (`ws = now − rsa`), which moves `ws` back; a
/// fan-out planned before the reset could then land on top of it. Opening the new window at
/// the reset keeps `ws` monotonic and gives every shard the same start.
pub fn reset(limit: &Limit, mut e: Evaluated, shard_count: i64, now: i64) -> Evaluated {
    let s = shard_count.max(1);
    let part = share(e.params.capacity, s);
    match limit.refill() {
        Refill::Drip { .. } => {
            e.balance = e.ceiling;
            e.carry = Some(0);
        }
        Refill::Calendar(cal) => {
            e.balance = part;
            e.ceiling = part;
            e.grant_count = Some(s);
            e.period_applied_ms = e.period_applied_ms.or_else(|| cal.prev_edge(now));
            e.transition = Transition::CalendarReset;
        }
        Refill::Window { .. } => {
            let ws = now.max(e.window_start_ms.unwrap_or(now));
            e.balance = part;
            e.ceiling = part;
            e.window_start_ms = Some(ws);
            e.window_applied_ms = Some(ws);
            e.grant_count = Some(s);
            e.opened = true;
            e.transition = Transition::WindowOpen;
        }
    }
    e.topped_up = None;
    debug_assert!(e.balance <= e.ceiling, "a reset never exceeds the ceiling");
    e
}

/// Rule "a top-up raises the ceiling for the period" (ADR-149): a quota shard's balance and
/// ceiling both grow by `portion` (milli), tracked in `tu` until the next reset; a dripping
/// limit has no grant to raise, so its top-up is bounded by the headroom `ceiling − balance`.
/// Returns the limit after the top-up and the part of `portion` applied.
pub fn top_up(limit: &Limit, mut e: Evaluated, portion: i64) -> (Evaluated, i64) {
    debug_assert!(portion >= 0, "a top-up adds");
    let portion = portion.max(0);
    let applied = match limit.refill() {
        Refill::Drip { .. } => portion.min((e.ceiling - e.balance).max(0)),
        Refill::Calendar(_) | Refill::Window { .. } => {
            e.ceiling += portion;
            e.topped_up = Some(e.topped_up.unwrap_or(0) + portion);
            portion
        }
    };
    e.balance += applied;
    (e, applied)
}

/// Rule "a top-up splits by grant" (ADR-149): `amount` (milli) is divided across the shards
/// in proportion to the weight `S // g` of each shard's grant count `g` (a shard sized at a
/// smaller count holds a larger grant), the remainder of the integer division going to the
/// lowest shard id. `grants` lists (shard, grant count); the result is (shard, portion) in
/// shard order and sums to `amount`.
pub fn split_top_up(amount: i64, shard_count: i64, grants: &[(u32, i64)]) -> Vec<(u32, i64)> {
    let s = shard_count.max(1);
    let mut g: Vec<(u32, i64)> = grants
        .iter()
        .map(|(i, gc)| (*i, (s / (*gc).clamp(1, s)).max(1)))
        .collect();
    g.sort_unstable();
    let total: i64 = g.iter().map(|(_, w)| *w).sum();
    if total == 0 {
        return Vec::new();
    }
    let mut out: Vec<(u32, i64)> = g
        .iter()
        .map(|(i, w)| {
            let p = i128::from(amount) * i128::from(*w) / i128::from(total);
            (*i, i64::try_from(p).unwrap_or(amount))
        })
        .collect();
    let rest = amount - out.iter().map(|(_, p)| *p).sum::<i64>();
    if let Some(first) = out.first_mut() {
        first.1 += rest;
    }
    debug_assert_eq!(out.iter().map(|(_, p)| *p).sum::<i64>(), amount);
    out
}

/// Rule "an operation lands once" (ADR-149): a reset or top-up stamps its id (`op`) on every
/// shard it writes, so a retry that reads the id back on any shard knows the operation
/// already landed (its response was lost) and writes nothing.
pub fn landed<'a>(images: impl IntoIterator<Item = &'a BucketImage>, op: &str) -> bool {
    if crate::mutants::off(crate::mutants::Mutant::OpOnce) {
        return false;
    }
    images.into_iter().any(|img| img.op.as_deref() == Some(op))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::LimitState;
    use crate::limit::{Limit, MILLI};
    use crate::materialize::evaluate;

    const T0: i64 = 1_757_000_000_000;

    fn daily() -> Limit {
        Limit::quota_calendar("daily", 10, "0 0 * * *", "UTC").unwrap()
    }

    #[test]
    fn s98_split_by_grant_weight() {
        // gc [2, 2] on S = 2: halves.
        assert_eq!(
            split_top_up(10 * MILLI, 2, &[(0, 2), (1, 2)]),
            vec![(0, 5000), (1, 5000)]
        );
        // Odd milli: the remainder goes to shard 0.
        assert_eq!(
            split_top_up(10_001, 2, &[(1, 2), (0, 2)]),
            vec![(0, 5001), (1, 5000)]
        );
        // gc [1, 2] on S = 2: weights 2 : 1.
        assert_eq!(
            split_top_up(9 * MILLI, 2, &[(0, 1), (1, 2)]),
            vec![(0, 6000), (1, 3000)]
        );
        assert_eq!(split_top_up(10, 1, &[]), vec![]);
    }

    #[test]
    fn s96_s99_reset_and_top_up_of_a_calendar_quota() {
        let l = daily();
        let st = LimitState {
            balance: 1000,
            capacity: 10_000,
            grant_count: Some(2),
            period_applied_ms: Some(T0 - 3_600_000),
            topped_up: Some(2000),
            ..LimitState::default()
        };
        let e = evaluate(&l, Some(&st), T0, 2, T0 + 1000, None);
        assert_eq!(e.transition, Transition::Kept);
        assert_eq!(e.ceiling, 7000, "C // gc + tu");
        assert_eq!(e.topped_up, Some(2000));
        let r = reset(&l, e.clone(), 2, T0 + 1000);
        assert_eq!(
            (r.balance, r.grant_count, r.topped_up),
            (5000, Some(2), None)
        );
        assert!(r.transition.is_set());
        let (t, applied) = top_up(&l, e, 5000);
        assert_eq!(
            (t.balance, t.ceiling, t.topped_up, applied),
            (6000, 12_000, Some(7000), 5000)
        );
    }

    #[test]
    fn dripping_top_up_is_bounded_by_headroom() {
        let l = Limit::per_minute("rpm", 10).unwrap();
        let st = LimitState {
            balance: 8000,
            capacity: 10_000,
            refill_amount: 10_000,
            refill_period_ms: 60_000,
            grant_count: Some(1),
            ..LimitState::default()
        };
        let e = evaluate(&l, Some(&st), T0, 1, T0, None);
        let (t, applied) = top_up(&l, e.clone(), 5000);
        assert_eq!((t.balance, applied), (10_000, 2000));
        assert_eq!(reset(&l, e, 1, T0).balance, 10_000);
    }

    #[test]
    fn s100_session_reset_opens_at_the_reset() {
        let l = Limit::quota_after("session", 10, std::time::Duration::from_secs(18_000)).unwrap();
        let st = LimitState {
            balance: 0,
            capacity: 10_000,
            window_start_ms: Some(T0),
            window_applied_ms: Some(T0),
            window_s: Some(18_000),
            grant_count: Some(1),
            consumed: 10_000,
            ..LimitState::default()
        };
        let r_at = T0 + 3_600_000;
        let e = evaluate(&l, Some(&st), T0, 1, r_at, None);
        let r = reset(&l, e, 1, r_at);
        assert_eq!(
            (r.balance, r.window_start_ms, r.window_applied_ms),
            (10_000, Some(r_at), Some(r_at))
        );
        assert!(r.opened);
    }
}
