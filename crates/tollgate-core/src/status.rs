//! What a caller is told: per-limit availability, retry-after and the one reset instant.

use serde::{Deserialize, Serialize};

use crate::limit::{Limit, Refill, MILLI};
use crate::materialize::{shard_rate, Evaluated};
use crate::refill::time_to_refill;
use crate::value::AttrName;

/// The state of one limit for one request, entity-wide.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitStatus {
    /// Limit name (held inline up to 24 bytes: a status is made on every acquire).
    pub limit: AttrName,
    /// `"rate"` or `"quota"`.
    pub kind: AttrName,
    /// Capacity in tokens (entity-wide).
    pub capacity: i64,
    /// Tokens available now (entity-wide; negative in debt).
    pub available: i64,
    /// Tokens requested.
    pub requested: i64,
    /// Whether this limit refused the request.
    pub exceeded: bool,
    /// For an exceeded limit: ms until a retry can succeed (never 0). `None` when the
    /// request can never fit (larger than the capacity).
    pub retry_after_ms: Option<i64>,
    /// When the allowance resets: the window end or calendar edge for quotas, the instant
    /// the bucket is full again for rate limits. `None` when nothing is pending.
    pub resets_at_ms: Option<i64>,
}

/// A shard's materialised view of one limit, the unit statuses are summed from.
#[derive(Debug, Clone)]
pub struct ShardView<'a> {
    /// The evaluation at now.
    pub eval: &'a Evaluated,
    /// The shard count it was evaluated with.
    pub shard_count: i64,
    /// Carried remainder.
    pub carry: i64,
}

impl<'a> ShardView<'a> {
    /// The view of one shard's evaluation at `shard_count`, carrying its remainder.
    pub fn of(eval: &'a Evaluated, shard_count: i64) -> Self {
        ShardView {
            eval,
            shard_count,
            carry: eval.carry.unwrap_or(0),
        }
    }
}

/// Rule "retry-after and the one reset instant": build a limit's status from the views of
/// the shards read (one for a fast-path decision, all of them for availability).
///
/// - available = Σ balances (debt counted); capacity = the entity's capacity;
/// - a request is judged against the entity, not one shard (a request larger than one
///   shard's share is debited from several, see [`crate::spread`]): it can never fit — no
///   retry-after — exactly when it is larger than the entity's capacity;
/// - quotas reset at one instant per entity: the window end `ws + rsa` of the window in
///   force (the latest start among the shards: shards converge on one), or the next
///   calendar edge;
/// - an exceeded rate limit retries when the shards read have dripped in enough, together,
///   to cover it ([`entity_refill_time`]).
pub fn limit_status(
    limit: &Limit,
    views: &[ShardView<'_>],
    requested_milli: i64,
    exceeded: bool,
    now_ms: i64,
) -> LimitStatus {
    let available: i64 = views.iter().map(|v| v.eval.balance).sum();
    // ADR-135 / #475: the capacity and rate reported are the ones in force at `now`.
    let eff = limit.effective(now_ms);
    let never = requested_milli > eff.capacity;
    let (kind, resets_at, retry) = match limit.refill() {
        Refill::Drip { period_ms, .. } => {
            let rate = |v: &ShardView<'_>| {
                if v.eval.rate > 0 {
                    v.eval.rate
                } else {
                    shard_rate(eff.refill_amount, v.shard_count)
                }
            };
            let full_in = views
                .iter()
                .filter_map(|v| {
                    time_to_refill(
                        v.eval.ceiling - v.eval.balance,
                        rate(v),
                        *period_ms,
                        v.carry,
                    )
                })
                .max()
                .unwrap_or(0);
            let retry = if never {
                None
            } else {
                let shards: smallvec::SmallVec<[(i64, i64, i64, i64); 4]> = views
                    .iter()
                    .map(|v| (v.eval.balance, v.eval.ceiling, rate(v), v.carry))
                    .collect();
                Some(entity_refill_time(&shards, requested_milli, *period_ms).unwrap_or(full_in))
            };
            ("rate", (full_in > 0).then_some(now_ms + full_in), retry)
        }
        Refill::Calendar(c) => {
            let next = c.next_edge(now_ms);
            let retry = if never {
                None
            } else {
                next.map(|n| (n - now_ms).max(1))
            };
            ("quota", next, retry)
        }
        Refill::Window { reset_after_s } => {
            // Rule "no live window, no reset instant" (W18): a window this evaluation would
            // open (ended or never used) is not in force until a write anchors it, so it
            // reports nothing rather than a start that moves with every call.
            let end = views
                .iter()
                .filter(|v| !v.eval.opened)
                .filter_map(|v| v.eval.window_start_ms)
                .max()
                .map(|ws| ws + reset_after_s * 1000)
                .filter(|e| *e > now_ms);
            let retry = if never {
                None
            } else {
                // With no live window the next use opens one with the full allowance.
                Some(end.map_or(1, |e| (e - now_ms).max(1)))
            };
            ("quota", end, retry)
        }
    };
    LimitStatus {
        limit: limit.name().into(),
        kind: AttrName::const_new(kind),
        capacity: eff.capacity / MILLI,
        available: available.div_euclid(MILLI),
        requested: requested_milli / MILLI,
        exceeded,
        retry_after_ms: if exceeded {
            retry.map(|r| r.max(1))
        } else {
            None
        },
        resets_at_ms: resets_at,
    }
}

/// Milliseconds until shards `(balance, ceiling, rate, carry)` dripping at once hold
/// `requested` together (each clamped at its ceiling); `None` when they cannot, even full.
pub fn entity_refill_time(shards: &[(i64, i64, i64, i64)], requested: i64, rp: i64) -> Option<i64> {
    let at = |t: i64| -> i64 {
        shards
            .iter()
            .map(|(b, c, ra, carry)| {
                if t <= 0 || *ra <= 0 || rp <= 0 {
                    return (*b).min(*c);
                }
                let added = (i128::from(t) * i128::from(*ra) + i128::from(*carry)) / i128::from(rp);
                let v = i128::from(*b) + added;
                i64::try_from(v.min(i128::from(*c))).unwrap_or(i64::MAX)
            })
            .sum()
    };
    if at(0) >= requested {
        return Some(0);
    }
    let full = shards
        .iter()
        .filter_map(|(b, c, ra, carry)| time_to_refill(c - b, *ra, rp, *carry))
        .max()
        .unwrap_or(0);
    if at(full) < requested {
        return None;
    }
    let (mut lo, mut hi) = (0i64, full.max(1));
    while lo + 1 < hi {
        let mid = lo + (hi - lo) / 2;
        if at(mid) >= requested {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::materialize::evaluate;
    use std::time::Duration;

    const T0: i64 = 1_757_000_000_000;
    const W: i64 = 18_000_000;

    fn status_at(state: Option<&crate::bucket::LimitState>, now: i64) -> LimitStatus {
        let l = Limit::quota_after("session", 10_000, Duration::from_secs(18_000)).unwrap();
        let e = evaluate(&l, state, T0, 1, now, None);
        let v = ShardView {
            eval: &e,
            shard_count: 1,
            carry: 0,
        };
        limit_status(&l, &[v], 0, false, now)
    }

    /// W18: a live window reports its end; none live (never used, or ended) reports none —
    /// never a past instant, never a window that only this evaluation would open.
    #[test]
    fn w18_reset_instant_only_for_a_live_window() {
        assert_eq!(status_at(None, T0).resets_at_ms, None);
        let st = crate::bucket::LimitState {
            balance: 8_500_000,
            capacity: 10_000_000,
            consumed: 1_500_000,
            window_start_ms: Some(T0),
            window_s: Some(18_000),
            window_applied_ms: Some(T0),
            grant_count: Some(1),
            ..Default::default()
        };
        let live = status_at(Some(&st), T0 + 60_000);
        assert_eq!((live.resets_at_ms, live.available), (Some(T0 + W), 8500));
        assert_eq!(status_at(Some(&st), T0 + W).resets_at_ms, None);
        assert_eq!(status_at(Some(&st), T0 + W + 1).resets_at_ms, None);
    }
}
