//! The aggregator's refill pass (spec-shards-windows-quotas.md §4.11, `try_refill_bucket`):
//! from the latest image of one bucket item, the shard count in force and `now`, decide the
//! one conditional write that rolls pending duration windows, applies calendar resets,
//! drips refills into buckets that are being drained and clamps balances above their
//! ceiling.
//!
//! Every balance comes from [`evaluate`] (the one home of materialisation) and the written
//! `rf` from [`next_rf`]; this module only decides *whether* the aggregator may write and
//! what it pins. The item is self-describing: the limits are rebuilt from the stored
//! `cp/ra/rp/rsched/tz/rsa`, and a scheduled limit's `sched` with its base `bcp/bra`
//! ([`stored_limits`]); an item whose stored schedule cannot be evaluated is skipped
//! (ADR-135 `sched_error`).
//!
//! What the aggregator never does: open (anchor) a window — a window is anchored by a use,
//! and an exhausted quota produces no write to react to — and fan out a window start (that
//! would cost S² writes per batch instead of S).

use std::collections::BTreeMap;

use crate::bucket::{attr, field, BucketImage};
use crate::error::RuleError;
use crate::expr::{Condition, Update};
use crate::keys::battr;
use crate::limit::{Limit, Refill};
use crate::materialize::{evaluate, evaluate_wcu, valid_until, Evaluated, Transition};
use crate::schedule::Schedule;
use crate::window;
use crate::writes::{next_rf, set_pin};

/// The limits stored on a bucket item, rebuilt from its own attributes (`cp`, `ra`, `rp`,
/// `rsched`/`tz`, `rsa`): the aggregator needs no config read. A stored combination no
/// limit can have is reported as corrupt, naming the limit.
///
/// A scheduled limit (`b_{n}_sched`) is rebuilt from its base values `bcp`/`bra` (its `cp`/`ra`
/// are materialised) and its decoded schedule; a schedule that does not decode, or a
/// missing base, is corrupt naming that attribute.
pub fn stored_limits(img: &BucketImage) -> Result<Vec<Limit>, RuleError> {
    img.limits
        .iter()
        .map(|(n, st)| {
            let corrupt = |attribute: String, reason: String| RuleError::Corrupt {
                key: img.key_text(),
                attribute,
                reason,
            };
            let sched = stored_schedule(img, n)?;
            let (cp, ra) = match (&sched, st.base_capacity, st.base_refill_amount) {
                (None, _, _) => (st.capacity, st.refill_amount),
                (Some(_), Some(cp), Some(ra)) => (cp, ra),
                (Some(_), None, _) => {
                    return Err(corrupt(
                        battr(n, field::BCP),
                        "missing (sched present)".into(),
                    ))
                }
                (Some(_), Some(_), None) => {
                    return Err(corrupt(
                        battr(n, field::BRA),
                        "missing (sched present)".into(),
                    ))
                }
            };
            let cal = st
                .calendar
                .as_ref()
                .map(|(c, tz)| (c.as_str(), tz.as_str()));
            let l = Limit::from_parts(n, cp, ra, st.refill_period_ms, cal, st.window_s).map_err(
                |e| {
                    corrupt(
                        battr(n, field::CP),
                        format!("stored parameters do not form a limit: {e}"),
                    )
                },
            )?;
            match sched {
                None => Ok(l),
                Some(s) => l
                    .with_schedule(s)
                    .map_err(|e| corrupt(battr(n, field::SCHED), e.to_string())),
            }
        })
        .collect()
}

/// The stored schedule of limit `n` on the item, decoded; one that cannot be evaluated is
/// corrupt naming `b_{n}_sched`.
pub fn stored_schedule(img: &BucketImage, n: &str) -> Result<Option<Schedule>, RuleError> {
    let Some(raw) = img.limits.get(n).and_then(|st| st.schedule.as_deref()) else {
        return Ok(None);
    };
    Schedule::decode(raw)
        .map(Some)
        .map_err(|e| RuleError::Corrupt {
            key: img.key_text(),
            attribute: battr(n, field::SCHED),
            reason: format!("stored schedule cannot be evaluated: {e}"),
        })
}

/// What the refill pass decided for one item.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Nothing worth writing: no pending roll or reset with a non-zero delta, no balance
    /// above its ceiling, no bucket being drained. The item is left for a client.
    Nothing,
    /// A duration limit has an unapplied window that has already ended: the whole item is
    /// left for a client, which opens a fresh window (§4.8 "if the pending window has
    /// already ended").
    Skip {
        /// The limit whose pending window ended.
        limit: String,
    },
    /// A stored schedule cannot be evaluated (ADR-135 `sched_error`): the item is skipped.
    Unevaluable {
        /// The limit whose schedule is corrupt.
        limit: String,
        /// Why.
        reason: String,
    },
    /// Write this.
    Write(RefillWrite),
}

/// The refill write: one `UpdateItem` on the item the image was read from.
#[derive(Debug, Clone, PartialEq)]
pub struct RefillWrite {
    /// SET `rf`, `vu` (when expired), `wa`/`gc`/`pe`/`rc`; ADD the deltas.
    pub update: Update,
    /// `rf = expected`, `vu = expected` (or absent, as read), `ws = expected` per rolled
    /// limit, and the balance read per reset calendar quota.
    pub condition: Condition,
    /// Limits rolled into a fanned-out window.
    pub rolled: Vec<String>,
    /// Calendar quotas reset.
    pub reset: Vec<String>,
    /// Dripping limits refilled because they are being drained.
    pub refilled: Vec<String>,
    /// Limits clamped down to their ceiling.
    pub clamped: Vec<String>,
    /// A quota grant was sized at the pass's shard count (a roll or reset stamps
    /// `gc = S`): the write must also pin shard 0's count (ADR-145 R5), which lives on
    /// another item and is added by the caller.
    pub grants: bool,
    /// The `rf` written.
    pub refilled_at_ms: i64,
}

/// Rule "aggregator refill" (§4.11, ADR-139/140/145), pure.
///
/// - any duration limit with an unapplied window (`ws > wa`, or `ws > rf` unmarked) that
///   has already ended ⇒ [`Decision::Skip`] for the whole item;
/// - a pending roll ⇒ `tk := share − max(0, tc − wtc)` (never above the share), `wa := ws`
///   (the value read), `gc := S`, pinned on `ws`;
/// - a calendar edge newer than the edge applied ⇒ `tk := share`, `gc := S`, `pe := edge`,
///   pinned on the balance read;
/// - a window that ended (applied) or never opened is not touched: never anchored here;
/// - a balance above its ceiling is always clamped down;
/// - a dripping limit's positive refill *makes the write worth doing* only while the bucket
///   is being drained: its projected balance is below `consumed[limit]`, the consumption
///   since the aggregator's previous image of the item (the change feed's
///   `NewImage.consumed − OldImage.consumed`; no old image ⇒ the whole `tc`). Once the item is written
///   for any reason, every dripping limit (and `wcu`) is credited its refill with the
///   remainder carried, because the written `rf` is the refill baseline of every limit on
///   the item — skipping one limit's credit there would lose it;
/// - a roll or reset whose delta is 0 does not by itself make a write ("a shard already
///   holding exactly its share has nothing to restore"), but is stamped when the item is
///   written anyway.
///
/// The written `rf` is [`next_rf`] over the window starts in force; `vu` is SET to the next
/// boundary when the stored one has expired (or is absent) and that boundary is after now.
/// The write is conditioned on `rf` and `vu` as read.
///
/// ADR-151: a bypassed item is left alone (rule "bypass never opens, rolls or resets",
/// [`crate::bypass`]): its balances wait for the first enforced pass.
pub fn plan_refill(
    img: &BucketImage,
    shard_count: i64,
    now: i64,
    consumed: &BTreeMap<String, i64>,
) -> Result<Decision, RuleError> {
    if img.bypass {
        return Ok(Decision::Nothing);
    }
    for n in img.limits.keys() {
        if let Err(e) = stored_schedule(img, n) {
            return Ok(Decision::Unevaluable {
                limit: n.to_string(),
                reason: e.to_string(),
            });
        }
    }
    let limits = stored_limits(img)?;
    let s = shard_count.max(1);
    for l in &limits {
        if let (Refill::Window { reset_after_s }, Some(st)) = (l.refill(), img.limits.get(l.name()))
        {
            if let Some(ws) = st.window_start_ms {
                if window::unapplied(ws, st.window_applied_ms, img.refilled_at_ms)
                    && window::ended(ws, reset_after_s * 1000, now)
                {
                    return Ok(Decision::Skip {
                        limit: l.name().to_string(),
                    });
                }
            }
        }
    }
    // Windows that would open here are not in force: the aggregator never anchors one.
    let evals: Vec<Evaluated> = limits
        .iter()
        .map(|l| {
            let e = evaluate(
                l,
                img.limits.get(l.name()),
                img.refilled_at_ms,
                s,
                now,
                None,
            );
            if e.transition == Transition::WindowOpen {
                Evaluated {
                    window_start_ms: None,
                    ..e
                }
            } else {
                e
            }
        })
        .collect();
    let mut worth = false;
    let mut w = RefillWrite {
        update: Update::new(),
        condition: Condition::eq(attr::RF, img.refilled_at_ms).and(crate::bypass::stamp(false)),
        rolled: Vec::new(),
        reset: Vec::new(),
        refilled: Vec::new(),
        clamped: Vec::new(),
        grants: false,
        refilled_at_ms: next_rf(now, Some(img.refilled_at_ms), &evals),
    };
    for e in &evals {
        let n = e.name.as_str();
        let credit = e.credit();
        match e.transition {
            Transition::WindowRoll => {
                worth |= credit != 0;
                w.rolled.push(n.to_string());
            }
            Transition::CalendarReset => {
                worth |= credit != 0;
                w.reset.push(n.to_string());
            }
            Transition::Refill if credit > 0 && consumed.get(n).is_some_and(|d| e.balance < *d) => {
                worth = true;
                w.refilled.push(n.to_string());
            }
            Transition::Refill | Transition::Kept if credit < 0 => {
                worth = true;
                w.clamped.push(n.to_string());
            }
            _ => {}
        }
    }
    if !worth {
        return Ok(Decision::Nothing);
    }
    let mut u = Update::new().set(attr::RF, w.refilled_at_ms);
    let mut c = Condition::eq(attr::RF, img.refilled_at_ms).and(match img.valid_until_ms {
        Some(v) => Condition::eq(attr::VU, v),
        None => Condition::not_exists(attr::VU),
    });
    for e in &evals {
        let n = e.name.as_str();
        let credit = e.credit();
        match e.transition {
            Transition::WindowOpen | Transition::Seed => continue,
            Transition::WindowRoll => {
                // Pinned on the window start read, not on the balance: a debit landing
                // between the read and the write (retry, adjust) is charged by the ADD
                // itself, and a refund of a debit from this window is owed back; a
                // refund from the old window finds `ws` moved and credits `tc` only.
                if let (Some(ws), Some(wa)) = (e.window_start_ms, e.window_applied_ms) {
                    c = c.and(Condition::eq(battr(n, field::WS), ws));
                    u = u.set(battr(n, field::WA), wa);
                }
            }
            Transition::CalendarReset => {
                // A refund of a debit from the ended period still credits the balance
                // until the reset is applied (its pin is the edge): pin the balance read.
                c = c.and(set_pin(n, e.read_balance));
                if let Some(pe) = e.period_applied_ms {
                    u = u.set(battr(n, field::PE), pe);
                }
            }
            Transition::Refill => {
                // Rule "the trust horizon is computed from what was read" (see
                // `writes::normal_write`): a refund landing in between fails the pin.
                if !crate::mutants::off(crate::mutants::Mutant::TrustHorizon) {
                    c = c.and(Condition::le(battr(n, field::TK), e.read_balance));
                }
                // A split since the image lowered the share (see `writes::normal_write`).
                c = c.and(match e.grant_count_read {
                    Some(g) => Condition::eq(battr(n, field::GC), g),
                    None => Condition::not_exists(battr(n, field::GC)),
                });
            }
            Transition::Kept => {}
        }
        if credit != 0 {
            u = u.add(battr(n, field::TK), credit);
        }
        if let Some(rc) = e.carry {
            u = u.set(battr(n, field::RC), rc);
        }
        // The trust horizon moves with the balance and the `rf` written (the balance read
        // is pinned above).
        if let Some(l) = limits.iter().find(|l| l.name() == n) {
            if let Some(fu) = crate::materialize::drip_full_at(l, e, 0, w.refilled_at_ms) {
                u = u.set(battr(n, field::FU), fu);
            }
        }
        // ADR-135: a scheduled limit's stored parameters follow the regime materialised.
        if e.sched_stored
            && img.limits.get(n).is_some_and(|st| {
                (st.capacity, st.refill_amount) != (e.params.capacity, e.params.refill_amount)
            })
        {
            u = u
                .set(battr(n, field::CP), e.params.capacity)
                .set(battr(n, field::RA), e.params.refill_amount);
        }
        if e.transition.is_set() {
            if let Some(gc) = e.grant_count {
                u = u.set(battr(n, field::GC), gc);
                w.grants = true;
            }
        }
        u = crate::writes::stamp_top_up(u, n, e);
    }
    if img.wcu.is_some() {
        let wcu = evaluate_wcu(img.wcu.as_ref(), img.refilled_at_ms, now);
        if wcu.credit() != 0 {
            u = u.add(crate::bucket::wcu_attr::TK, wcu.credit());
        }
        if let Some(rc) = wcu.carry {
            u = u.set(crate::bucket::wcu_attr::RC, rc);
        }
    }
    if img.valid_until_ms.is_none_or(|v| v <= now) {
        if let Some(next) = valid_until(&limits, &evals, now).filter(|v| *v > now) {
            u = u.set(attr::VU, next);
        }
    }
    w.update = u;
    w.condition = c;
    Ok(Decision::Write(w))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::LimitState;
    use crate::expr::{Action, SetValue};
    use crate::value::Value;

    const T0: i64 = 1_757_000_000_000;
    const W: i64 = 18_000_000;
    const T1: i64 = T0 + W + 1000;

    fn image(rf: i64, vu: Option<i64>, limits: &[(&str, LimitState)]) -> BucketImage {
        BucketImage {
            key: crate::value::Key::new("k", ""),
            refilled_at_ms: rf,
            valid_until_ms: vu,
            ttl: None,
            shard_count: 2,
            params_hash: None,
            limits: limits
                .iter()
                .map(|(n, s)| (crate::value::AttrName::from(*n), s.clone()))
                .collect(),
            wcu: None,
            disabled: false,
            bypass: false,
            op: None,
            cascade: None,
            layout: Default::default(),
        }
    }

    fn session(tk: i64, tc: i64, ws: i64, wa: Option<i64>, wtc: Option<i64>) -> LimitState {
        LimitState {
            balance: tk,
            capacity: 10_000,
            refill_period_ms: W,
            consumed: tc,
            window_start_ms: Some(ws),
            window_s: Some(18_000),
            window_applied_ms: wa,
            window_consumed: wtc,
            grant_count: Some(2),
            ..Default::default()
        }
    }

    fn rpm(tk: i64, tc: i64) -> LimitState {
        LimitState {
            balance: tk,
            capacity: 100_000,
            refill_amount: 100_000,
            refill_period_ms: 60_000,
            consumed: tc,
            ..Default::default()
        }
    }

    fn set_of(u: &Update, name: &str) -> Option<i64> {
        u.actions.iter().find_map(|a| match a {
            Action::Set(n, SetValue::Value(Value::N(v))) if n == name => Some(*v),
            _ => None,
        })
    }

    fn add_of(u: &Update, name: &str) -> Option<i64> {
        u.actions.iter().find_map(|a| match a {
            Action::Add(n, Value::N(v)) if n == name => Some(*v),
            _ => None,
        })
    }

    fn write(d: Decision) -> RefillWrite {
        match d {
            Decision::Write(w) => w,
            d => panic!("expected a write, got {d:?}"),
        }
    }

    /// Scenario 60 shape: an unmarked shard with a fanned-out window T1 rolls to
    /// share − max(0, tc − wtc), is marked `wa = T1`, `gc = S`, and pins `ws`.
    #[test]
    fn unmarked_roll_is_written_and_marked() {
        let img = image(
            T0 + 1000,
            Some(0),
            &[("session", session(0, 1000, T1, None, Some(1000)))],
        );
        let w = write(plan_refill(&img, 2, T1 + 120_000, &BTreeMap::new()).unwrap());
        assert_eq!(w.rolled, ["session"]);
        assert!(w.grants);
        assert_eq!(add_of(&w.update, "b_session_tk"), Some(5000));
        assert_eq!(set_of(&w.update, "b_session_wa"), Some(T1));
        assert_eq!(set_of(&w.update, "b_session_gc"), Some(2));
        assert_eq!(set_of(&w.update, "rf"), Some(T1 + 120_000));
        assert_eq!(set_of(&w.update, "vu"), Some(T1 + W));
        let pins = format!("{:?}", w.condition);
        assert!(pins.contains("b_session_ws"), "{pins}");
        assert!(pins.contains("\"vu\""), "{pins}");
    }

    /// §4.11: an unapplied window that already ended skips the whole item, even when
    /// another limit on it would be written.
    #[test]
    fn ended_unapplied_window_skips_the_item() {
        let img = image(
            T0 + 1000,
            Some(0),
            &[
                ("session", session(0, 1000, T1, Some(T0), Some(1000))),
                ("rpm", rpm(200_000, 0)),
            ],
        );
        assert_eq!(
            plan_refill(&img, 2, T1 + W, &BTreeMap::new()).unwrap(),
            Decision::Skip {
                limit: "session".into()
            }
        );
        // The same image one millisecond earlier: the window is live and rolls.
        assert!(matches!(
            plan_refill(&img, 2, T1 + W - 1, &BTreeMap::new()).unwrap(),
            Decision::Write(_)
        ));
    }

    /// Scenario 54 shape: an applied window with a backward rf is not rolled again; an
    /// ended applied window is never anchored.
    #[test]
    fn applied_or_ended_windows_are_left() {
        let img = image(
            T0 - 5000,
            Some(T0 + W),
            &[(
                "session",
                LimitState {
                    grant_count: Some(1),
                    ..session(7000, 3000, T0, Some(T0), None)
                },
            )],
        );
        assert_eq!(
            plan_refill(&img, 1, T0 + 1000, &BTreeMap::new()).unwrap(),
            Decision::Nothing
        );
        assert_eq!(
            plan_refill(&img, 1, T0 + W + 5, &BTreeMap::new()).unwrap(),
            Decision::Nothing
        );
    }

    /// Drip: a positive refill is written only while the bucket is being drained
    /// (projected below the consumption since the previous image); a clamp always.
    #[test]
    fn drip_only_when_drained_clamp_always() {
        let img = image(0, None, &[("rpm", rpm(0, 90_000))]);
        let none = BTreeMap::new();
        assert_eq!(
            plan_refill(&img, 1, 30_000, &none).unwrap(),
            Decision::Nothing
        );
        let drained = BTreeMap::from([("rpm".to_string(), 90_000)]);
        let w = write(plan_refill(&img, 1, 30_000, &drained).unwrap());
        assert_eq!(w.refilled, ["rpm"]);
        assert_eq!(add_of(&w.update, "b_rpm_tk"), Some(50_000));
        assert!(!w.grants);
        // Projected 50,000 is not below 40,000 consumed: not being drained.
        let slow = BTreeMap::from([("rpm".to_string(), 40_000)]);
        assert_eq!(
            plan_refill(&img, 1, 30_000, &slow).unwrap(),
            Decision::Nothing
        );
        // Above the ceiling of S = 2 (50,000): clamped whatever the consumption.
        let img = image(0, None, &[("rpm", rpm(80_000, 0))]);
        let w = write(plan_refill(&img, 2, 0, &none).unwrap());
        assert_eq!(w.clamped, ["rpm"]);
        assert_eq!(add_of(&w.update, "b_rpm_tk"), Some(-30_000));
        assert_eq!(
            set_of(&w.update, "rf"),
            Some(1),
            "rf never stays or moves back"
        );
    }

    /// ADR-135 on the aggregator: a scheduled limit is rebuilt from its stored base and
    /// schedule; past the boundary the refill pass clamps to the new per-shard cap, rewrites
    /// `cp`/`ra` and restamps the expired `vu` with the next boundary. A stored schedule that
    /// cannot be evaluated skips the item (`sched_error`); a missing base is corrupt.
    #[test]
    fn scheduled_limit_rebuilt_clamped_and_restamped() {
        let night = 1_764_540_000_000; // 2025-11-30T22:00:00Z
        let st = LimitState {
            schedule: Some("1|UTC|* 22:00-06:00 10/10".into()),
            base_capacity: Some(100_000),
            base_refill_amount: Some(100_000),
            ..rpm(40_000, 0)
        };
        let img = image(night - 1000, Some(night), &[("rpm", st.clone())]);
        let limits = stored_limits(&img).unwrap();
        assert_eq!(limits[0].capacity_milli(), 100_000);
        assert!(limits[0].schedule().is_some());
        let w = write(plan_refill(&img, 2, night, &BTreeMap::new()).unwrap());
        assert_eq!(w.clamped, ["rpm"]);
        assert_eq!(add_of(&w.update, "b_rpm_tk"), Some(-35_000));
        assert_eq!(set_of(&w.update, "b_rpm_cp"), Some(10_000));
        assert_eq!(set_of(&w.update, "b_rpm_ra"), Some(10_000));
        assert_eq!(set_of(&w.update, "vu"), Some(night + 8 * 3_600_000));
        // Clamped to its ceiling, the bucket is full: its trust horizon is the write's own
        // `rf` (rule `materialize::drip_full_at`).
        assert_eq!(set_of(&w.update, "b_rpm_fu"), Some(w.refilled_at_ms));
        for (raw, attr) in [
            ("1|UTC|* 22:00-06:00", "b_rpm_sched"),
            ("7|UTC|* 22:00-06:00 10", "b_rpm_sched"),
        ] {
            let bad = LimitState {
                schedule: Some(raw.into()),
                ..st.clone()
            };
            let img = image(night - 1000, Some(night), &[("rpm", bad)]);
            match plan_refill(&img, 2, night, &BTreeMap::new()).unwrap() {
                Decision::Unevaluable { limit, reason } => {
                    assert_eq!(limit, "rpm");
                    assert!(reason.contains(attr), "{reason}");
                }
                d => panic!("expected a skip, got {d:?}"),
            }
        }
        let img = image(
            night - 1000,
            Some(night),
            &[(
                "rpm",
                LimitState {
                    base_capacity: None,
                    ..st
                },
            )],
        );
        let e = stored_limits(&img).unwrap_err().to_string();
        assert!(e.contains("b_rpm_bcp"), "{e}");
    }

    /// Calendar reset: SET to the share with gc = S and the edge marked, pinned on the
    /// balance read (debt forgiven, scenario 82/83 numbers).
    #[test]
    fn calendar_reset() {
        let midnight = 1_764_547_200_000;
        let st = LimitState {
            balance: -4000,
            capacity: 10_000,
            grant_count: Some(1),
            calendar: Some(("0 0 * * *".into(), "UTC".into())),
            ..Default::default()
        };
        let img = image(midnight - 1, Some(midnight), &[("daily", st)]);
        let w = write(plan_refill(&img, 2, midnight + 5, &BTreeMap::new()).unwrap());
        assert_eq!(w.reset, ["daily"]);
        assert_eq!(add_of(&w.update, "b_daily_tk"), Some(9000));
        assert_eq!(set_of(&w.update, "b_daily_gc"), Some(2));
        assert_eq!(set_of(&w.update, "b_daily_pe"), Some(midnight));
        assert_eq!(set_of(&w.update, "vu"), Some(midnight + 86_400_000));
        assert!(format!("{:?}", w.condition).contains("b_daily_tk"));
    }
}
