//! Rules of leases that need no store: what an adjustment may do to a lease's net, and
//! when a refund must send the bucket to the slow path. The limiter's `Lease` executes
//! them (docs/rules.md).

use crate::bucket::BucketImage;
use crate::limit::{Limit, MILLI};
use crate::materialize::evaluate;
use crate::mutants::{self, Mutant};

/// Rule "a lease's net never goes below zero": per limit, what a lease consumed — the
/// acquire's debit `held_milli` plus the adjustments not yet written `pending_milli` —
/// plus the new adjustment `delta` (tokens) never drops below zero, so a refund returns at
/// most what the lease took, never tokens of earlier leases. Returns the new pending
/// amount (milli), or `Err(consumed)`: the whole tokens the lease consumed so far.
pub fn adjust_pending(held_milli: i64, pending_milli: i64, delta: i64) -> Result<i64, i64> {
    let net = held_milli
        .saturating_add(pending_milli)
        .saturating_add(delta.saturating_mul(MILLI));
    if net < 0 && !mutants::off(Mutant::LeaseNet) {
        return Err(held_milli.saturating_add(pending_milli) / MILLI);
    }
    Ok(pending_milli.saturating_add(delta.saturating_mul(MILLI)))
}

/// Rule "a refund above the ceiling goes slow once" (scenario 8): a refund that leaves a
/// balance of `img` above its limit's ceiling at the item's own `rf` (after a reset, say)
/// must send the next acquire to the slow path, which clamps it. `false` when the item is
/// already sent there (`vu = 0`).
pub fn refund_left_above_ceiling(img: &BucketImage, limits: &[Limit], shard_count: i64) -> bool {
    if img.valid_until_ms.is_some_and(|v| v <= 0) {
        return false;
    }
    img.limits.iter().any(|(n, st)| {
        limits.iter().find(|l| l.name() == n).is_some_and(|l| {
            let e = evaluate(
                l,
                Some(st),
                img.refilled_at_ms,
                shard_count,
                img.refilled_at_ms,
                None,
            );
            st.balance > e.ceiling
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::LimitState;

    /// The over-refund repro of the exactness issue: a lease of 1 adjusted by −61 is
    /// refused with 1 consumed; −1 is the most it may return.
    #[test]
    fn a_net_below_zero_is_refused() {
        assert_eq!(adjust_pending(1_000, 0, -61), Err(1));
        assert_eq!(adjust_pending(1_000, 0, -1), Ok(-1_000));
        assert_eq!(adjust_pending(1_000, 5_000, -6), Ok(-1_000));
        assert_eq!(adjust_pending(0, 0, -1), Err(0));
        assert_eq!(adjust_pending(0, 0, 230), Ok(230_000));
    }

    #[test]
    fn a_balance_above_its_ceiling_goes_slow() {
        let l = Limit::per_minute("rpm", 10).unwrap();
        let st = |tk| LimitState {
            balance: tk,
            capacity: 10_000,
            refill_amount: 10_000,
            refill_period_ms: 60_000,
            ..LimitState::default()
        };
        let img = |tk, vu| BucketImage {
            key: crate::value::Key::new("k", ""),
            refilled_at_ms: 1_000,
            valid_until_ms: vu,
            ttl: None,
            shard_count: 1,
            params_hash: None,
            limits: [("rpm".into(), st(tk))].into_iter().collect(),
            wcu: None,
            disabled: false,
            bypass: false,
            op: None,
            cascade: None,
            layout: Default::default(),
        };
        assert!(refund_left_above_ceiling(
            &img(12_000, None),
            std::slice::from_ref(&l),
            1
        ));
        assert!(!refund_left_above_ceiling(
            &img(10_000, None),
            std::slice::from_ref(&l),
            1
        ));
        assert!(!refund_left_above_ceiling(
            &img(12_000, Some(0)),
            std::slice::from_ref(&l),
            1
        ));
        assert!(refund_left_above_ceiling(&img(6_000, Some(5)), &[l], 2));
    }
}
