//! Lazy refill of dripping limits, with the fractional remainder carried per limit.
//!
//! The original stores one refill stamp `rf` per item and rewrites it with the commit time on
//! every rf-locked write, so a slow limit sharing an item with busy limits loses its
//! sub-token remainder on every write and can starve (spec-base-system.md §11 #5). tollgate
//! keeps the unconverted remainder of each limit in `b_{n}_rc` (in milli·ms / ms units: the
//! numerator of `elapsed × ra mod rp`), written under the same rf lock, so the credit over
//! any sequence of writes equals `⌊total elapsed × ra / rp⌋` exactly.

use crate::units::{EpochMs, Millitokens};

/// A refill outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refilled {
    /// The balance after refill, clamped to the ceiling (the clamp never lifts debt).
    pub balance: i64,
    /// The remainder to carry into the next refill, in `[0, rp)`.
    pub carry: i64,
    /// Millitokens credited (before the clamp).
    pub added: i64,
}

/// A dripping limit as a refill reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drip {
    /// The balance as stored (may be negative: debt).
    pub balance: Millitokens,
    /// The most the balance refills to.
    pub ceiling: Millitokens,
    /// Credited per period.
    pub amount: Millitokens,
    /// The period (ms).
    pub period_ms: i64,
    /// When the balance was last refilled (`rf`).
    pub refilled_at: EpochMs,
    /// The remainder carried from the last refill (milli·ms / ms: the numerator of
    /// `elapsed × amount mod period`).
    pub carry: i64,
}

/// Rule "lazy refill with carried remainder" (§4.2): credit `⌊(elapsed × ra + carry) / rp⌋`,
/// no credit when the clock is at or behind `rf`, clamp to `cap` without lifting debt, and
/// carry nothing while the bucket is full.
pub fn refill(d: Drip, now: EpochMs) -> Refilled {
    let Drip {
        balance: Millitokens(tk),
        ceiling: Millitokens(cap),
        amount: Millitokens(ra),
        period_ms: rp,
        refilled_at: EpochMs(rf),
        carry,
    } = d;
    let now = now.0;
    let out = refill_unchecked(tk, cap, ra, rp, rf, carry, now);
    // The rule's guarantees: a refill never lifts a balance above its ceiling, never takes
    // tokens away below it, and carries less than one token's worth of remainder.
    debug_assert!(
        out.balance <= cap.max(0) || out.balance <= tk,
        "refill above the ceiling: {out:?}, cap {cap}"
    );
    debug_assert!(
        out.balance >= tk.min(cap),
        "refill took tokens away: {tk} -> {out:?}"
    );
    debug_assert!(
        out.carry >= 0 && (rp <= 0 || out.carry < rp),
        "carry out of range: {out:?}"
    );
    out
}

fn refill_unchecked(
    tk: i64,
    cap: i64,
    ra: i64,
    rp: i64,
    rf: i64,
    carry: i64,
    now: i64,
) -> Refilled {
    let carry = carry.clamp(0, (rp - 1).max(0));
    let elapsed = now.saturating_sub(rf);
    if elapsed <= 0 || ra <= 0 || rp <= 0 {
        return Refilled {
            balance: tk.min(cap),
            carry,
            added: 0,
        };
    }
    let num = elapsed as i128 * ra as i128 + carry as i128;
    let added = i64::try_from(num / rp as i128).unwrap_or(i64::MAX);
    let rem = (num % rp as i128) as i64;
    let raw = tk.saturating_add(added);
    if raw >= cap {
        Refilled {
            balance: cap.max(tk.min(cap)),
            carry: 0,
            added,
        }
    } else {
        Refilled {
            balance: raw,
            carry: rem,
            added,
        }
    }
}

/// Milliseconds until `deficit` millitokens have dripped in at `ra` per `rp`, given the
/// carried remainder. Never 0 for a positive deficit.
pub fn time_to_refill(deficit: i64, ra: i64, rp: i64, carry: i64) -> Option<i64> {
    if deficit <= 0 {
        return Some(0);
    }
    if ra <= 0 {
        return None;
    }
    let need = deficit as i128 * rp as i128 - carry as i128;
    let t = (need + ra as i128 - 1) / ra as i128;
    Some(i64::try_from(t).unwrap_or(i64::MAX).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refill of `tk` towards `cap` at `ra` per `rp`, refilled last at `rf`, at `now`.
    fn drip(tk: i64, cap: i64, ra: i64, rp: i64, rf: i64, carry: i64, now: i64) -> Refilled {
        let d = Drip {
            balance: Millitokens(tk),
            ceiling: Millitokens(cap),
            amount: Millitokens(ra),
            period_ms: rp,
            refilled_at: EpochMs(rf),
            carry,
        };
        refill(d, EpochMs(now))
    }

    /// Scenario 1: cp = ra = 100 tokens per 60 s, empty at rf = 0, evaluated at 30 s.
    #[test]
    fn refill_math() {
        let r = drip(0, 100_000, 100_000, 60_000, 0, 0, 30_000);
        assert_eq!(r.added, 50_000);
        assert_eq!(r.balance, 50_000);
        // time converted = 50,000 × 60,000 / 100,000 = 30,000 ms: nothing left to carry.
        assert_eq!(r.carry, 0);
        // At or behind rf: no credit, only the clamp.
        assert_eq!(drip(0, 100_000, 100_000, 60_000, 0, 0, 0).balance, 0);
        assert_eq!(drip(7, 100_000, 100_000, 60_000, 500, 0, 100).balance, 7);
    }

    /// Scenario 2: ra = 1000 milli per 3,000 ms, 4,000 ms elapsed → 1333 credited and one
    /// millisecond's worth carried (the original's baseline advances to 3,999, not 4,000).
    #[test]
    fn fractional_carry() {
        let r = drip(0, 1_000_000, 1000, 3000, 0, 0, 4000);
        assert_eq!(r.added, 1333);
        assert_eq!(r.balance, 1333);
        assert_eq!(r.carry, 1000); // = 1 ms × ra
        let time_used = r.added * 3000 / 1000;
        assert_eq!(time_used, 3999);
        // The carried millisecond is credited with the next 2 ms: 3 ms × 1000 / 3000 = 1.
        let r2 = drip(r.balance, 1_000_000, 1000, 3000, 4000, r.carry, 4002);
        assert_eq!(r2.added, 1);
        assert_eq!(r2.carry, 0);
    }

    /// Scenario 3: the clamp never lifts debt.
    #[test]
    fn clamp_never_lifts_debt() {
        let r = drip(-4000, 5000, 1000, 500, 0, 0, 1000);
        assert_eq!(r.added, 2000);
        assert_eq!(r.balance, -2000);
        // A balance above the ceiling (refund after a reset) is clamped down.
        assert_eq!(drip(9000, 5000, 1000, 500, 0, 0, 0).balance, 5000);
        assert_eq!(drip(9000, 5000, 1000, 500, 0, 0, 100).balance, 5000);
    }

    /// The starvation fix: 1 token per 100 s written every 30 ms for 3 s still credits the
    /// exact 30 milli, where rewriting rf at each commit would credit 0.
    #[test]
    fn slow_limit_does_not_starve_under_frequent_writes() {
        let (cap, ra, rp) = (1000, 1000, 100_000);
        let (mut tk, mut carry, mut rf) = (0, 0, 0);
        for i in 1..=100 {
            let now = i * 30;
            let r = drip(tk, cap, ra, rp, rf, carry, now);
            tk = r.balance;
            carry = r.carry;
            rf = now;
        }
        assert_eq!(tk, 30);
    }

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        assert_eq!(time_to_refill(1000, 100_000, 60_000, 0), Some(600));
        assert_eq!(time_to_refill(1, 100_000, 60_000, 0), Some(1));
        assert_eq!(time_to_refill(1, 1000, 3000, 2999), Some(1));
        assert_eq!(time_to_refill(0, 1000, 3000, 0), Some(0));
        assert_eq!(time_to_refill(5, 0, 3000, 0), None);
    }
}
