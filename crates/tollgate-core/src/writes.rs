//! Write plans: the speculative fast-path write and its failure classification, the
//! rf-locked normal write, the consumption-only retry, create, and adjust/rollback.

use crate::bucket::{attr, field, BucketImage, WCU_COST};
use crate::expr::{Condition, Update};
use crate::keys::battr;
use crate::limit::{Limit, Refill};
use crate::materialize::{evaluate, Evaluated, Transition};
use crate::value::{Item, Value};

/// A named amount, in millitokens.
pub type Amounts = [(String, i64)];

/// TTL handling on slow-path writes (ADR-119/136).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtlWrite {
    /// Entity-level limits: no TTL (REMOVE it).
    Remove,
    /// Default-level limits: SET `ttl` to this epoch second.
    Set(i64),
}

/// Rule "TTL horizon": the time to recover from empty to full, times the multiplier —
/// drip `⌈cp / ra⌉ × rp`, calendar the longest period, window exactly `rsa`.
pub fn ttl_for(limits: &[Limit], now_ms: i64, multiplier: i64) -> Option<i64> {
    if multiplier <= 0 {
        return None;
    }
    let horizon_ms = limits
        .iter()
        .map(|l| match l.refill() {
            // #557: a scheduled limit's horizon is the worst over its base and every entry.
            Refill::Drip { amount, period_ms } => std::iter::once((l.capacity_milli(), *amount))
                .chain(l.schedule().into_iter().flat_map(|s| {
                    s.entries()
                        .iter()
                        .map(|e| (e.capacity_milli(), e.rate_milli().unwrap_or(*amount)))
                }))
                .map(|(cp, ra)| (cp + ra - 1) / ra * period_ms)
                .max()
                .unwrap_or(0),
            Refill::Calendar(c) => c.period_ms(now_ms),
            Refill::Window { reset_after_s } => reset_after_s * 1000,
        })
        .max()?;
    Some(now_ms / 1000 + horizon_ms / 1000 * multiplier)
}

/// The speculative write (§4.3): ADD the amounts and one `wcu`, conditioned on the item
/// existing, every named balance covering its amount (a zero amount still requires
/// `tk >= 0`), `wcu` covering one write, the item not expired, its parameters current
/// (`ph`), not disabled, `vu` not reached, and every named dripping limit inside its trust
/// horizon ([`trusted`]). It reads nothing and touches no `rf`, window or grant; it counts
/// the request and dates its consumption ([`crate::usage::count_request`]).
pub fn fast_write(
    amounts: &Amounts,
    limits: &[Limit],
    ph: &str,
    now_ms: i64,
) -> (Update, Condition) {
    // Sized once: the amounts' two actions each, `wcu`'s two, `rq` and `wt`.
    let mut u = Update::with_capacity(2 * amounts.len() + 4);
    // The condition's terms, flat: `PK`, a balance each, `wcu`, TTL, disabled, bypass, `ph`,
    // `vu` and a trust horizon each.
    let mut c = Vec::with_capacity(2 * amounts.len() + 8);
    c.push(Condition::exists("PK"));
    for (n, amt) in amounts {
        let attr = |f: &'static str| match limits.iter().find(|l| l.name() == n) {
            Some(l) => l.attr(f),
            None => battr(n, f).into(),
        };
        let tk = attr(field::TK);
        u = u.add(tk.clone(), -amt).add(attr(field::TC), *amt);
        if !crate::soft::exempt(limits, n) {
            c.push(Condition::ge(tk, *amt));
        }
    }
    u = u
        .add(crate::bucket::wcu_attr::TK, -WCU_COST)
        .add(crate::bucket::wcu_attr::TC, WCU_COST);
    u = crate::usage::stamp_write_time(crate::usage::count_request(u), now_ms);
    c.extend([
        Condition::ge(crate::bucket::wcu_attr::TK, WCU_COST),
        Condition::not_exists(attr::TTL).or(Condition::gt(attr::TTL, now_ms / 1000)),
        Condition::not_exists(attr::DISABLED),
        crate::bypass::stamp(false),
        Condition::eq(attr::PH, ph),
    ]);
    trusted_terms(&mut c, limits, amounts, now_ms);
    debug_assert!(
        c.iter().all(|t| !matches!(t, Condition::And(_))),
        "the terms are flat: the conjunction is what `Condition::all` would build"
    );
    (u, Condition::And(c))
}

/// Whether `limit` drips (it has a trust horizon).
fn drips(limits: &[Limit], name: &str) -> bool {
    limits
        .iter()
        .any(|l| l.name() == name && matches!(l.refill(), Refill::Drip { .. }))
}

/// The condition under which a balance-only `ADD` of `amounts` (a fast-path debit, the
/// consumption-only retry, a lease's reported usage) is exact at `now_ms`: the item's `vu`
/// (its boundaries: calendar edges, window ends, schedule changes) not reached, and every
/// named dripping limit inside its trust horizon `b_{n}_fu` (rule
/// [`crate::materialize::drip_full_at`]; a limit without one — written by a writer that does
/// not know the rule — is never trusted).
pub fn trusted(limits: &[Limit], amounts: &Amounts, now_ms: i64) -> Condition {
    let mut terms = Vec::with_capacity(1 + amounts.len());
    trusted_terms(&mut terms, limits, amounts, now_ms);
    Condition::all(terms)
}

/// The terms of [`trusted`], appended to `out` (a conjunction the caller builds).
fn trusted_terms(out: &mut Vec<Condition>, limits: &[Limit], amounts: &Amounts, now_ms: i64) {
    out.push(Condition::not_exists(attr::VU).or(Condition::gt(attr::VU, now_ms)));
    if crate::mutants::off(crate::mutants::Mutant::TrustHorizon) {
        return;
    }
    for (n, _) in amounts {
        if let Some(l) = limits
            .iter()
            .find(|l| l.name() == n && matches!(l.refill(), Refill::Drip { .. }))
        {
            out.push(Condition::gt(l.attr(field::FU), now_ms));
        }
    }
}

/// Whether the image trusts a balance-only write of `amounts` at `now_ms` (the same rule
/// as [`trusted`], read off a decoded item).
pub fn image_trusted(img: &BucketImage, limits: &[Limit], amounts: &Amounts, now_ms: i64) -> bool {
    if img.valid_until_ms.is_some_and(|v| v <= now_ms) {
        return false;
    }
    if crate::mutants::off(crate::mutants::Mutant::TrustHorizon) {
        return true;
    }
    amounts.iter().all(|(n, _)| {
        !drips(limits, n)
            || img
                .limits
                .get(n.as_str())
                .and_then(|st| st.full_at_ms)
                .is_some_and(|fu| fu > now_ms)
    })
}

/// Why a speculative write failed, read off the old item (§4.3 classification order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FastFailure {
    /// No item: create it on the slow path.
    Missing,
    /// The (entity, resource) is disabled: refuse, no slow path.
    Disabled,
    /// The item carries the other ADR-151 stamp than the write was shaped for (see
    /// [`crate::bypass::mismatch`]): write again in the item's shape.
    StampMismatch,
    /// Past its TTL but not yet swept: decide on the slow path.
    Expired,
    /// `vu` reached (calendar edge, window end, forced slow): slow path.
    Boundary,
    /// Stored parameters differ from the caller's limits: slow path re-materialises.
    ParamsChanged,
    /// A named limit is not on the item: the slow path seeds it.
    LimitMissing,
    /// Only `wcu` is short: the item is hot.
    WcuExhausted,
    /// `wcu` and an app limit are short.
    Both,
    /// An app limit is short.
    AppLimit,
}

/// Classify a failed speculative write from the returned old image.
pub fn classify_fast_failure(
    old: Option<&BucketImage>,
    amounts: &Amounts,
    limits: &[Limit],
    ph: &str,
    now_ms: i64,
) -> FastFailure {
    let Some(img) = old else {
        return FastFailure::Missing;
    };
    if img.disabled {
        return FastFailure::Disabled;
    }
    if crate::bypass::mismatch(img, false) {
        return FastFailure::StampMismatch;
    }
    if img.ttl.is_some_and(|t| t <= now_ms / 1000) {
        return FastFailure::Expired;
    }
    if !image_trusted(img, limits, amounts, now_ms) {
        return FastFailure::Boundary;
    }
    if img.params_hash.as_deref() != Some(ph) {
        return FastFailure::ParamsChanged;
    }
    if amounts
        .iter()
        .any(|(n, _)| !img.limits.contains_key(n.as_str()))
    {
        return FastFailure::LimitMissing;
    }
    let wcu_short = img.wcu.as_ref().is_none_or(|w| w.balance < WCU_COST);
    let app_short = amounts.iter().any(|(n, a)| {
        img.limits
            .get(n.as_str())
            .is_some_and(|s| crate::soft::short(limits, n, s.balance, *a))
    });
    match (wcu_short, app_short) {
        (true, true) => FastFailure::Both,
        (true, false) => FastFailure::WcuExhausted,
        _ => FastFailure::AppLimit,
    }
}

/// Where the fast path goes after its speculative write failed (see [`route_fast_failure`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FastRoute {
    /// The (entity, resource) is disabled: refuse, no slow path.
    Disabled,
    /// The slow path on this shard; `with_image`: it plans from the failed write's image
    /// (no read needed).
    Slow { with_image: bool },
    /// The item's ADR-151 stamp differs from the write's shape: write again in its shape.
    Reshape,
    /// Only write capacity is short, on a hot shard: double the shard count.
    Double,
    /// Even refilled, this shard cannot pay: probe other shards, then refuse honestly.
    /// `remember`: an app limit is short, so the refusal goes into the rejection cache.
    Probe { remember: bool },
}

/// Rule "route a failed speculative write" (§4.3, ADR-134, upstream #480): a disabled
/// item refuses; a missing item, an expired one, a passed trust horizon, changed parameters
/// or a missing limit go to the slow path; a shortfall the refill up to `now` would cover
/// goes to the slow path, which materialises it — except that a write-capacity shortfall
/// on a shard whose projected `wcu` is below a fifth of its capacity doubles (only a
/// write-capacity shortfall doubles, never an app-limit refusal); a real shortfall probes
/// other shards before refusing.
pub fn route_fast_failure(
    failure: FastFailure,
    old: Option<&BucketImage>,
    limits: &[Limit],
    amounts: &Amounts,
    now_ms: i64,
) -> FastRoute {
    let short = matches!(
        failure,
        FastFailure::WcuExhausted | FastFailure::Both | FastFailure::AppLimit
    );
    debug_assert!(
        !short || old.is_some(),
        "a shortfall is classified from an image"
    );
    match (failure, old) {
        (FastFailure::Disabled, _) => FastRoute::Disabled,
        (FastFailure::StampMismatch, _) => FastRoute::Reshape,
        (FastFailure::Missing, _) => FastRoute::Slow { with_image: false },
        (_, None) => FastRoute::Slow { with_image: false },
        (FastFailure::WcuExhausted | FastFailure::Both, Some(img)) => {
            if !would_refill_satisfy(img, limits, amounts, now_ms) {
                return FastRoute::Probe { remember: false };
            }
            let wcu =
                crate::materialize::evaluate_wcu(img.wcu.as_ref(), img.refilled_at_ms, now_ms);
            if crate::seeding::should_double(wcu.balance, img.shard_count) {
                FastRoute::Double
            } else {
                FastRoute::Slow { with_image: true }
            }
        }
        (FastFailure::AppLimit, Some(img)) => {
            if would_refill_satisfy(img, limits, amounts, now_ms) {
                FastRoute::Slow { with_image: true }
            } else {
                FastRoute::Probe { remember: true }
            }
        }
        (
            FastFailure::Expired
            | FastFailure::Boundary
            | FastFailure::ParamsChanged
            | FastFailure::LimitMissing,
            Some(_),
        ) => FastRoute::Slow { with_image: true },
    }
}

/// Rule `would_refill_satisfy`: project every named limit from the image at `now` (refill,
/// calendar edge, ended window, pending roll — the same [`evaluate`] the slow path runs)
/// and say whether each covers its amount. A bypassed item (ADR-151) always satisfies.
pub fn would_refill_satisfy(
    img: &BucketImage,
    limits: &[Limit],
    amounts: &Amounts,
    now_ms: i64,
) -> bool {
    if img.bypass {
        return true;
    }
    amounts.iter().all(|(n, a)| {
        let Some(l) = limits.iter().find(|l| l.name() == n) else {
            return false;
        };
        let e = evaluate(
            l,
            img.limits.get(n.as_str()),
            img.refilled_at_ms,
            img.shard_count,
            now_ms,
            None,
        );
        !crate::soft::short(limits, n, e.balance, *a)
    })
}

/// Inputs of an rf-locked write that the item-level rules decide.
#[derive(Debug, Clone)]
pub struct ItemStamp<'a> {
    /// The instant written to `rf` (never backward: max of now, stored rf, windows).
    pub refilled_at_ms: i64,
    /// `vu` to SET, or REMOVE when `None`.
    pub valid_until_ms: Option<i64>,
    /// TTL handling.
    pub ttl: TtlWrite,
    /// Parameter hash of the limit set.
    pub params_hash: &'a str,
    /// The image an rf-locked write is locked on (its `rf` is the write's condition); `None`
    /// for a create. What it already holds is not restated (rule [`restates`]).
    pub read: Option<&'a BucketImage>,
}

/// Rule "the rf lock pins the stamps": an rf-locked write leaves out the SET (or REMOVE) of
/// an attribute that the item it is locked on already holds with the value it would write —
/// for the attributes that only writes moving `rf` change: `ph`, `ttl`, `cascade`, a
/// limit's `cp`/`ra`/`rp` (with a calendar's `rsched`/`tz`) and drip remainder `rc`, and
/// `wcu`'s `rc`. The write's condition `rf = read` holds only if no such write landed
/// since the read (each one moves `rf` strictly forward: rule "monotonic rf",
/// [`next_rf`]), so the item still holds the value read and restating it would change
/// nothing. What rf-less writes change (balances, `tc`, `fu`, `vu`, `shard_count`, the
/// ADR-151 stamps) is always written. The simulator checks the premise on every write
/// (invariant `rf-pins`); without the rf lock (the `RfLock` mutant) everything is restated.
pub fn restates<T: PartialEq>(read: Option<T>, written: T) -> bool {
    !crate::mutants::off(crate::mutants::Mutant::RfLock) && read.is_some_and(|r| r == written)
}

/// Rule "stored parameters are materialised" (ADR-135): `cp`/`ra` are the effective values
/// this pass evaluated; a scheduled limit also carries its schedule and base values so the
/// slow path and the aggregator can recompute without config, and an unscheduled one drops
/// a schedule it no longer has.
fn stamp_params(mut u: Update, l: &Limit, e: &Evaluated) -> Update {
    u = u
        .set(l.attr(field::CP), e.params.capacity)
        .set(l.attr(field::RA), e.params.refill_amount)
        .set(l.attr(field::RP), l.rp());
    match l.schedule() {
        Some(s) => {
            u = u
                .set(l.attr(field::SCHED), s.encode())
                .set(l.attr(field::BCP), l.capacity_milli())
                .set(l.attr(field::BRA), l.ra());
        }
        None if e.sched_stored => {
            u = u
                .remove(l.attr(field::SCHED))
                .remove(l.attr(field::BCP))
                .remove(l.attr(field::BRA));
        }
        None => {}
    }
    if let Some(c) = l.calendar() {
        u = u
            .set(l.attr(field::RSCHED), c.expr())
            .set(l.attr(field::TZ), c.tz());
    }
    u
}

/// Rule "monotonic rf": the `rf` an rf-locked write stamps is the largest of now, every
/// window start in force, and — for a write that holds the lock on a stored `rf` — one past
/// that stored value. Never backward (ADR-140), and always strictly past the locked value
/// (C5): a write that left `rf` unchanged would not take the lock, and a concurrent writer
/// that read the same `rf` could apply on top of it. A create (`locked = None`) stamps
/// `max(now, ws)`.
pub fn next_rf(now_ms: i64, locked: Option<i64>, evals: &[Evaluated]) -> i64 {
    if crate::mutants::off(crate::mutants::Mutant::MonotonicRf) {
        return now_ms;
    }
    let floor = match locked {
        Some(rf) => now_ms.max(rf.saturating_add(1)),
        None => now_ms,
    };
    let next = evals
        .iter()
        .filter_map(|e| e.window_start_ms)
        .fold(floor, i64::max);
    // Rule "monotonic rf": never backward, always past the locked value.
    debug_assert!(
        locked.is_none_or(|rf| next > rf || rf == i64::MAX),
        "rf moved back: {locked:?} -> {next}"
    );
    next
}

/// How an rf-locked write charges its amounts.
#[derive(Debug, Clone, Copy, Default)]
pub struct Charging<'a> {
    /// Debt allowed: no balance floor (a lease's reported usage); `false` for an acquire,
    /// whose consumption must be covered.
    pub debt: bool,
    /// Limits whose (negative) amount is a refund recorded in `tc` only (its period ended).
    pub tc_only: &'a [String],
}

/// The part of each amount that moves the balance (a `tc`-only refund moves none).
pub fn balance_charges(amounts: &Amounts, tc_only: &[String]) -> Vec<(String, i64)> {
    amounts
        .iter()
        .map(|(n, a)| (n.clone(), if tc_only.contains(n) { 0 } else { *a }))
        .collect()
}

/// The rf-locked normal write (§4.4): SET `rf`, `vu`, `ttl`, `ph`, parameters and window /
/// grant stamps; ADD each limit's credit minus its consumption and the consumption to `tc`
/// (amounts may be negative: a lease's refund). Condition: `rf` unchanged; where consumption
/// exceeds the credit (and no debt is allowed), the live balance still covers the
/// difference (concurrent fast-path debits); a reset's balance is pinned to the value read;
/// a dripping balance may not have risen since the read (rule "the trust horizon is
/// computed from what was read": a refund landing in between would make the `vu` this
/// write stamps trust a balance that is full sooner); seeds require the limit to be absent.
pub fn normal_write(
    expected_rf: i64,
    stamp: &ItemStamp<'_>,
    limits: &[Limit],
    evals: &[Evaluated],
    wcu: &Evaluated,
    amounts: &Amounts,
    charging: Charging<'_>,
) -> (Update, Condition) {
    // Room for every action and condition term this write can carry (a limit sets at most
    // 16 fields, the item and the write-capacity guard 13; a limit adds at most 3 terms, the
    // item's 4 with what `plan::materialising_write` joins): the write is built in one
    // allocation each instead of growing.
    let read = stamp.read;
    debug_assert!(
        read.is_none_or(|i| i.refilled_at_ms == expected_rf),
        "the image read is the one the write is locked on"
    );
    let mut u = Update::with_capacity(13 + 16 * limits.len()).set(attr::RF, stamp.refilled_at_ms);
    if !restates(
        read.and_then(|i| i.params_hash.as_deref()),
        stamp.params_hash,
    ) {
        u = u.set(attr::PH, stamp.params_hash);
    }
    u = match stamp.valid_until_ms {
        Some(v) => u.set(attr::VU, v),
        None => u.remove(attr::VU),
    };
    let ttl = match stamp.ttl {
        TtlWrite::Set(t) => Some(t),
        TtlWrite::Remove => None,
    };
    if !restates(read.map(|i| i.ttl), ttl) {
        u = match ttl {
            Some(t) => u.set(attr::TTL, t),
            None => u.remove(attr::TTL),
        };
    }
    let mut c = Condition::And(Vec::with_capacity(4 + 3 * limits.len())).and(
        if !crate::mutants::off(crate::mutants::Mutant::RfLock) {
            Condition::eq(attr::RF, expected_rf)
        } else {
            Condition::exists("PK")
        },
    );
    for (l, e) in limits.iter().zip(evals) {
        let n = l.name();
        let consumed = amounts
            .iter()
            .find(|(a, _)| a == n)
            .map(|(_, v)| *v)
            .unwrap_or(0);
        // `params_held`: the state read holds what `stamp_params` writes.
        if !restates(read.map(|_| e.params_held), true) {
            u = stamp_params(u, l, e);
        }
        let credit = e.credit();
        let debit = if charging.tc_only.iter().any(|t| t == n) {
            0
        } else {
            consumed
        };
        if credit - debit != 0 || e.transition == Transition::Seed {
            u = u.add(l.attr(field::TK), credit - debit);
        }
        if consumed != 0 {
            u = u.add(l.attr(field::TC), consumed);
        }
        if let Some(g) = e.drip_grant_count {
            u = u.set(l.attr(field::GC), g);
        }
        if let Some(fu) = crate::materialize::drip_full_at(l, e, debit, stamp.refilled_at_ms) {
            u = u.set(l.attr(field::FU), fu);
        }
        if let Some(rc) = e.carry.filter(|rc| !restates(read.and(e.carry_read), *rc)) {
            u = u.set(l.attr(field::RC), rc);
        }
        // A window opened on this pass, or joined by a seed, stamps its start (with rsa).
        if e.opened || e.transition == Transition::Seed {
            if let Some(ws) = e.window_start_ms {
                u = u.set(l.attr(field::WS), ws);
            }
        }
        if let Some(rsa) = e.window_s {
            u = u.set(l.attr(field::RSA), rsa);
        }
        if let Some(wa) = e.window_applied_ms {
            u = u.set(l.attr(field::WA), wa);
        }
        if let Some(gc) = e.grant_count {
            u = u.set(l.attr(field::GC), gc);
        }
        if let Some(pe) = e.period_applied_ms {
            u = u.set(l.attr(field::PE), pe);
        }
        u = stamp_top_up(u, n, e);
        if e.transition == Transition::Seed {
            c = c.and(Condition::not_exists(l.attr(field::TK)));
        } else if e.transition.is_set() {
            c = c.and(set_pin(n, e.read_balance));
        } else {
            if !charging.debt && debit > credit && !crate::soft::exempt(limits, n) {
                c = c.and(Condition::ge(l.attr(field::TK), debit - credit));
            }
            if e.transition == Transition::Refill
                && !crate::mutants::off(crate::mutants::Mutant::TrustHorizon)
            {
                c = c.and(Condition::le(l.attr(field::TK), e.read_balance));
            }
            // Rule "a split is not undone": the share this pass materialised is the one
            // read (a split since lowered it, without moving `rf`).
            if e.transition == Transition::Refill {
                c = c.and(match e.grant_count_read {
                    Some(g) => Condition::eq(l.attr(field::GC), g),
                    None => Condition::not_exists(l.attr(field::GC)),
                });
            }
        }
    }
    // The write-capacity guard refills on every rf-locked write (the original only refilled
    // it from the aggregator, so a bucket without one doubled forever: §11 #6).
    if wcu.credit() != 0 || wcu.transition == Transition::Seed {
        u = u.add(crate::bucket::wcu_attr::TK, wcu.credit());
    }
    if wcu.transition == Transition::Seed {
        u = u
            .set(crate::bucket::wcu_attr::CP, crate::bucket::WCU_CAPACITY)
            .set(crate::bucket::wcu_attr::RA, crate::bucket::WCU_CAPACITY)
            .set(crate::bucket::wcu_attr::RP, crate::bucket::WCU_PERIOD_MS);
    }
    if let Some(rc) = wcu
        .carry
        .filter(|rc| !restates(read.and(wcu.carry_read), *rc))
    {
        u = u.set(crate::bucket::wcu_attr::RC, rc);
    }
    (u, c)
}

/// Rule "a top-up lasts one period" (ADR-149): the write stamps the top-up in force after
/// the pass — SET when it changed, REMOVE when a reset, open or roll re-sized the grant.
pub fn stamp_top_up(u: Update, limit: &str, e: &Evaluated) -> Update {
    match (e.tu_read, e.topped_up) {
        (read, Some(t)) if read != Some(t) => u.set(battr(limit, field::TU), t),
        (Some(_), None) => u.remove(battr(limit, field::TU)),
        _ => u,
    }
}

/// Rule "a reset is a SET": a calendar reset, window open or roll replaces the balance, so
/// the write that applies it (as an `ADD` of `target − read`) is pinned to the balance read —
/// a refund or debit that lands between the read and the write would otherwise be carried
/// across the reset.
pub fn set_pin(limit: &str, read_tk: i64) -> Condition {
    Condition::eq(battr(limit, field::TK), read_tk)
}

/// The consumption-only retry (§4.4), after the rf lock was lost: ADD the amounts, each
/// conditioned on the live balance covering it and — like the fast path — on the trust
/// horizon ([`trusted`]: the winner of the lock stamped one; a balance past it may have
/// refilled to its ceiling and must be materialised instead). No refill, no `rf`, `vu`,
/// window or grant stamp.
pub fn retry_write(amounts: &Amounts, limits: &[Limit], now_ms: i64) -> (Update, Condition) {
    let mut u = Update::new();
    let mut c = Condition::exists("PK")
        .and(crate::bypass::stamp(false))
        .and(trusted(limits, amounts, now_ms));
    for (n, a) in amounts {
        if *a != 0 {
            u = u.add(battr(n, field::TK), -a).add(battr(n, field::TC), *a);
        }
        if !crate::soft::exempt(limits, n) {
            c = c.and(Condition::ge(battr(n, field::TK), *a));
        }
    }
    (
        crate::usage::stamp_write_time(crate::usage::count_request(u), now_ms),
        c,
    )
}

/// Rule "a refund keeps the trust horizon": the largest balance (as of `rf`) a dripping
/// limit may hold for its horizon `fu` to stay true — below it no refill is clamped away at
/// the ceiling before `fu`. A refund that would lift the balance above it must also pull
/// the horizon in.
pub fn trust_ceiling(ceiling: i64, rate: i64, rp: i64, carry: i64, rf: i64, fu: i64) -> i64 {
    if fu <= rf || rate <= 0 || rp <= 0 {
        return ceiling;
    }
    let elapsed = i128::from(fu - 1 - rf);
    let added = (elapsed * i128::from(rate) + i128::from(carry)) / i128::from(rp);
    i64::try_from(i128::from(ceiling) - added).unwrap_or(i64::MIN)
}

/// The condition under which a lease's refunds of dripping limits may land as a plain
/// `ADD` without touching their trust horizons ([`trust_ceiling`]): the item is still the
/// one `img` shows (`rf` and each refunded limit's `fu` unchanged, so its refill baseline,
/// remainder and parameters are too) and every refunded balance stays at or below its trust
/// ceiling. `refunds` are positive amounts of milli returned. `None` when a refunded
/// dripping limit has no horizon to keep (then the refund must pull it in: `fu = 0`).
pub fn refund_trust(
    img: &BucketImage,
    limits: &[Limit],
    refunds: &Amounts,
    shard_count: i64,
) -> Option<Condition> {
    let mut c = Condition::eq(attr::RF, img.refilled_at_ms);
    for (n, r) in refunds {
        if !drips(limits, n) {
            continue;
        }
        let l = limits.iter().find(|l| l.name() == n)?;
        let st = img.limits.get(n.as_str())?;
        let fu = st.full_at_ms?;
        let e = evaluate(
            l,
            Some(st),
            img.refilled_at_ms,
            shard_count,
            img.refilled_at_ms,
            None,
        );
        let max = trust_ceiling(
            e.ceiling,
            e.rate,
            l.rp(),
            st.refill_carry,
            img.refilled_at_ms,
            fu,
        );
        c = c
            .and(Condition::eq(battr(n, field::FU), fu))
            .and(Condition::le(battr(n, field::TK), max.saturating_sub(*r)));
    }
    Some(c)
}

/// Pull in the trust horizon of every refunded dripping limit (`SET b_{n}_fu = 0`), for a
/// refund [`refund_trust`] cannot keep it for.
pub fn refund_untrust(u: Update, limits: &[Limit], refunds: &Amounts) -> Update {
    refunds
        .iter()
        .filter(|(n, _)| drips(limits, n))
        .fold(u, |u, (n, _)| u.set(battr(n, field::FU), 0))
}

/// Adjust / rollback (path 4): ADD `−delta` to the balance and `+delta` to `tc` per limit;
/// may drive the balance into debt. Never touches `rf`, windows, grants. Limits named in
/// `tc_only` record the delta in `tc` only: a refund whose period has ended (see
/// [`refund_pin`]) must not lift the new period's balance.
pub fn adjust_write(deltas: &Amounts, tc_only: &[String], now_ms: i64) -> Update {
    let mut u = crate::usage::stamp_write_time(Update::new(), now_ms);
    for (n, d) in deltas {
        if *d != 0 {
            if !tc_only.contains(n) {
                u = u.add(battr(n, field::TK), -d);
            }
            u = u.add(battr(n, field::TC), *d);
        }
    }
    u
}

/// Rule "a refund stays in its period": the condition under which a refund of a quota's
/// debit may still credit the balance — the shard still holds the period or window the
/// debited balance belonged to. Calendar: its applied edge `pe` is still `pe_at_debit` (a
/// legacy item without `pe`: `rf` still before the next edge after `rf_at_debit`); window:
/// `ws` unchanged. A dripping limit needs none (`None`).
///
/// The period is the stored balance's, not the writer's clock: a consumption-only retry (or
/// a fast write from a clock behind the edge) can debit the old period's balance after the
/// edge, and a reset then replaces that balance; crediting the refund to the new period
/// would re-grant it (simulator seed 13318: 30 admitted against a daily 29).
pub fn refund_pin(
    limit: &Limit,
    ws_at_debit: Option<i64>,
    pe_at_debit: Option<i64>,
    rf_at_debit: i64,
) -> Option<Condition> {
    match limit.refill() {
        Refill::Drip { .. } => None,
        Refill::Calendar(c) => match pe_at_debit {
            Some(p) => Some(Condition::eq(limit.attr(field::PE), p)),
            None => c.next_edge(rf_at_debit).map(|edge| {
                Condition::not_exists(limit.attr(field::PE)).and(Condition::lt(attr::RF, edge))
            }),
        },
        Refill::Window { .. } => ws_at_debit.map(|ws| Condition::eq(limit.attr(field::WS), ws)),
    }
}

/// Identity attributes of a new bucket item.
#[derive(Debug, Clone)]
pub struct BucketIdentity<'a> {
    /// Namespace.
    pub ns: &'a str,
    /// Entity.
    pub entity: &'a str,
    /// Resource.
    pub resource: &'a str,
    /// Shard index.
    pub shard: u32,
    /// Shard count the creator used.
    pub shard_count: i64,
}

/// Create (§4.4/§4.6): the whole item, every limit at its evaluated balance minus the
/// consumption, `rf = max(now, ws)`, `wcu` full, GSI keys; written with
/// `attribute_not_exists(PK)`.
pub fn create_item(
    id: &BucketIdentity<'_>,
    stamp: &ItemStamp<'_>,
    limits: &[Limit],
    evals: &[Evaluated],
    amounts: &Amounts,
) -> Item {
    let mut i = Item::new();
    let mut put = |k: String, v: Value| {
        i.insert(k.into(), v);
    };
    put(attr::ENTITY.into(), id.entity.into());
    put(attr::RESOURCE.into(), id.resource.into());
    put(attr::SHARD.into(), Value::N(id.shard as i64));
    put(attr::SHARD_COUNT.into(), Value::N(id.shard_count));
    put(attr::RF.into(), Value::N(stamp.refilled_at_ms));
    put(attr::PH.into(), stamp.params_hash.into());
    if let Some(v) = stamp.valid_until_ms {
        put(attr::VU.into(), Value::N(v));
    }
    if let TtlWrite::Set(t) = stamp.ttl {
        put(attr::TTL.into(), Value::N(t));
    }
    put(
        "GSI2PK".into(),
        crate::keys::gsi2_resource(id.ns, id.resource).into(),
    );
    put(
        "GSI2SK".into(),
        format!("BUCKET#{}#{}", id.entity, id.shard).into(),
    );
    put(
        "GSI3PK".into(),
        crate::keys::gsi3_entity(id.ns, id.entity).into(),
    );
    put(
        "GSI3SK".into(),
        format!("BUCKET#{}#{}", id.resource, id.shard).into(),
    );
    put("GSI4PK".into(), id.ns.into());
    put(
        "GSI4SK".into(),
        format!("BUCKET#{}#{}#{}", id.entity, id.resource, id.shard).into(),
    );
    for (l, e) in limits.iter().zip(evals) {
        let n = l.name();
        let consumed = amounts
            .iter()
            .find(|(a, _)| a == n)
            .map(|(_, v)| *v)
            .unwrap_or(0);
        put(battr(n, field::TK), Value::N(e.balance - consumed));
        put(battr(n, field::TC), Value::N(consumed));
        put(battr(n, field::CP), Value::N(e.params.capacity));
        put(battr(n, field::RA), Value::N(e.params.refill_amount));
        put(battr(n, field::RP), Value::N(l.rp()));
        if let Some(s) = l.schedule() {
            put(battr(n, field::SCHED), s.encode().into());
            put(battr(n, field::BCP), Value::N(l.capacity_milli()));
            put(battr(n, field::BRA), Value::N(l.ra()));
        }
        if let Some(c) = l.calendar() {
            put(battr(n, field::RSCHED), c.expr().into());
            put(battr(n, field::TZ), c.tz().into());
        }
        if let Some(rc) = e.carry {
            put(battr(n, field::RC), Value::N(rc));
        }
        if let Some(ws) = e.window_start_ms {
            put(battr(n, field::WS), Value::N(ws));
        }
        if let Some(rsa) = e.window_s {
            put(battr(n, field::RSA), Value::N(rsa));
        }
        if let Some(wa) = e.window_applied_ms {
            put(battr(n, field::WA), Value::N(wa));
        }
        if let Some(gc) = e.grant_count.or(e.drip_grant_count) {
            put(battr(n, field::GC), Value::N(gc));
        }
        if let Some(fu) = crate::materialize::drip_full_at(l, e, consumed, stamp.refilled_at_ms) {
            put(battr(n, field::FU), Value::N(fu));
        }
        if let Some(pe) = e.period_applied_ms {
            put(battr(n, field::PE), Value::N(pe));
        }
    }
    put(
        crate::bucket::wcu_attr::TK.to_string(),
        Value::N(crate::bucket::WCU_CAPACITY),
    );
    put(crate::bucket::wcu_attr::TC.to_string(), Value::N(0));
    put(
        crate::bucket::wcu_attr::CP.to_string(),
        Value::N(crate::bucket::WCU_CAPACITY),
    );
    put(
        crate::bucket::wcu_attr::RA.to_string(),
        Value::N(crate::bucket::WCU_CAPACITY),
    );
    put(
        crate::bucket::wcu_attr::RP.to_string(),
        Value::N(crate::bucket::WCU_PERIOD_MS),
    );
    i
}

/// A stable hash of a limit set (FNV-1a over a canonical description), stamped on bucket
/// items as `ph` so the fast path fails over to the slow path — which re-materialises the
/// stored parameters — as soon as a client holds a changed limit set (param sync, ADR-120).
pub fn params_hash(limits: &[Limit]) -> String {
    let mut parts: Vec<String> = limits
        .iter()
        .map(|l| {
            let cal = l
                .calendar()
                .map(|c| format!("{}@{}", c.expr(), c.tz()))
                .unwrap_or_default();
            let sched = l.schedule().map(|s| s.encode()).unwrap_or_default();
            // ADR-151: switching a limit between soft and enforced changes the hash (the
            // fast path's `ph` term then sends the next write to the slow path); an
            // enforced limit's hash is unchanged from before soft limits existed.
            format!(
                "{}:{}:{}:{}:{}:{}{}",
                l.name(),
                l.capacity_milli(),
                l.ra(),
                l.rp(),
                cal,
                sched,
                if l.is_soft() { ":soft" } else { "" }
            )
        })
        .collect();
    parts.sort();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.join("|").bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Schedule;

    fn night(cap: &str) -> Limit {
        Limit::per_minute("rpm", 100)
            .unwrap()
            .with_schedule(Schedule::new(&[format!("* 22:00-06:00 {cap}")], "UTC").unwrap())
            .unwrap()
    }

    /// ADR-120 × ADR-135: the schedule is part of the parameter hash.
    #[test]
    fn schedule_changes_the_parameter_hash() {
        let plain = params_hash(&[Limit::per_minute("rpm", 100).unwrap()]);
        assert_ne!(params_hash(&[night("10")]), plain);
        assert_ne!(params_hash(&[night("10")]), params_hash(&[night("20")]));
        assert_eq!(params_hash(&[night("10")]), params_hash(&[night("10")]));
    }

    /// #557: a scheduled dripping limit's TTL horizon is the worst over its base and every
    /// entry: 100 per minute by day (60 s to fill) but 100 at 1 per minute overnight (6000 s).
    #[test]
    fn ttl_horizon_is_the_worst_regime() {
        assert_eq!(ttl_for(&[night("10")], 0, 1), Some(60));
        assert_eq!(ttl_for(&[night("100/1")], 0, 1), Some(6000));
    }
}

#[cfg(test)]
mod route_tests {
    use super::*;
    use crate::bucket::{BucketImage, LimitState, WCU_CAPACITY};

    const NOW: i64 = 1_000_000_000;

    /// A 10-per-minute bucket holding `tk` milli at `rf`, its `wcu` holding `wcu` at `rf`.
    fn image(tk: i64, wcu: i64, rf: i64) -> BucketImage {
        let st = LimitState {
            balance: tk,
            capacity: 10_000,
            refill_amount: 10_000,
            refill_period_ms: 60_000,
            ..LimitState::default()
        };
        BucketImage {
            key: crate::value::Key::new("k", ""),
            refilled_at_ms: rf,
            valid_until_ms: None,
            ttl: None,
            shard_count: 1,
            params_hash: None,
            limits: [("rpm".into(), st)].into_iter().collect(),
            wcu: Some(LimitState {
                balance: wcu,
                capacity: WCU_CAPACITY,
                refill_amount: WCU_CAPACITY,
                refill_period_ms: 1_000,
                ..LimitState::default()
            }),
            disabled: false,
            bypass: false,
            op: None,
            cascade: None,
            layout: Default::default(),
        }
    }

    fn route(f: FastFailure, img: Option<&BucketImage>) -> FastRoute {
        let l = [Limit::per_minute("rpm", 10).unwrap()];
        route_fast_failure(f, img, &l, &[("rpm".to_string(), 1_000)], NOW)
    }

    #[test]
    fn disabled_missing_and_stale_items() {
        let img = image(5_000, WCU_CAPACITY, NOW);
        assert_eq!(
            route(FastFailure::Disabled, Some(&img)),
            FastRoute::Disabled
        );
        assert_eq!(
            route(FastFailure::Missing, None),
            FastRoute::Slow { with_image: false }
        );
        for f in [
            FastFailure::Expired,
            FastFailure::Boundary,
            FastFailure::ParamsChanged,
            FastFailure::LimitMissing,
        ] {
            assert_eq!(route(f, Some(&img)), FastRoute::Slow { with_image: true });
        }
    }

    /// A shortfall the refill covers is materialised on the slow path; a real one probes
    /// and is remembered.
    #[test]
    fn an_app_shortfall_goes_slow_only_when_the_refill_pays() {
        // Empty 6 s ago: 1 token refilled since, enough for 1.
        let refilled = image(0, WCU_CAPACITY, NOW - 6_000);
        assert_eq!(
            route(FastFailure::AppLimit, Some(&refilled)),
            FastRoute::Slow { with_image: true }
        );
        let empty = image(0, WCU_CAPACITY, NOW);
        assert_eq!(
            route(FastFailure::AppLimit, Some(&empty)),
            FastRoute::Probe { remember: true }
        );
    }

    /// Rule #480: only a write-capacity shortfall doubles, and only on a hot shard.
    #[test]
    fn only_a_write_capacity_shortfall_on_a_hot_shard_doubles() {
        let hot = image(5_000, 0, NOW);
        assert_eq!(
            route(FastFailure::WcuExhausted, Some(&hot)),
            FastRoute::Double
        );
        let cooled = image(5_000, 0, NOW - 10_000);
        assert_eq!(
            route(FastFailure::WcuExhausted, Some(&cooled)),
            FastRoute::Slow { with_image: true }
        );
        let both_short = image(0, 0, NOW);
        assert_eq!(
            route(FastFailure::Both, Some(&both_short)),
            FastRoute::Probe { remember: false }
        );
    }
}
