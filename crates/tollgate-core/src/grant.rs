//! ADR-145: a sharded quota conserves its allowance. A new or seeded quota shard is funded
//! by a move from a covering sibling, not minted.

use crate::bucket::{field, LimitState};
use crate::expr::Condition;
use crate::keys::battr;
use crate::limit::{Limit, Refill};
use crate::units::{Millitokens, ShardCount};
use crate::window;

/// A sibling shard's quota state, as read (strongly consistently).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sibling {
    /// Shard index.
    pub shard: u32,
    /// Its balance.
    pub balance: i64,
    /// Its grant count (`gc`; the item's shard count where absent).
    pub grant_count: i64,
    /// Whether its grant is for the current period or window.
    pub current: bool,
}

/// The plan for funding one slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The donor shard and its `gc`, when a sibling covers the slot.
    pub donor: Option<(u32, i64)>,
    /// Millitokens the new slot starts with.
    pub tokens: i64,
}

/// Rule "quota grants and moves" (ADR-145): a current sibling `i` covers slot `j` iff
/// `j % gc_i == i % gc_i`; the covering sibling with the largest `gc` (closest ancestor,
/// ties to the lowest id) donates `min(share, max(0, tk))`; with no covering sibling the
/// slot gets a fresh share.
pub fn plan_quota_grant(siblings: &[Sibling], slot: u32, share: i64) -> Grant {
    let donor = siblings
        .iter()
        .filter(|s| s.shard != slot && s.current && s.grant_count >= 1)
        .filter(|s| slot as i64 % s.grant_count == s.shard as i64 % s.grant_count)
        .max_by(|a, b| {
            a.grant_count
                .cmp(&b.grant_count)
                .then(b.shard.cmp(&a.shard))
        });
    match donor {
        None => Grant {
            donor: None,
            tokens: share,
        },
        Some(d) => {
            let tokens = share.min(d.balance.max(0));
            // A grant is within the share and within what the donor holds: moved, not minted.
            debug_assert!(
                tokens <= share && tokens <= d.balance.max(0),
                "grant beyond share or donor"
            );
            Grant {
                donor: Some((d.shard, d.grant_count)),
                tokens,
            }
        }
    }
}

/// What a quota shard's grant is sized from: its stored grant count (`gc`, absent on a
/// legacy item), its balance, the limit's whole capacity and the entity's shard count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantShare {
    /// The stored grant count, if any.
    pub grant_count: Option<i64>,
    /// The shard's balance (without a top-up).
    pub balance: Millitokens,
    /// The limit's capacity, undivided.
    pub capacity: Millitokens,
    /// The shard count to infer from when no grant count is stored.
    pub shard_count: ShardCount,
}

/// Rule R7 (ADR-145): the grant count of a legacy quota shard that carries no `gc` — start
/// from its stored shard count and halve while its balance exceeds `C // g`.
pub fn infer_gc(share: GrantShare) -> i64 {
    let GrantShare {
        grant_count: gc,
        balance: Millitokens(tk),
        capacity: Millitokens(capacity),
        shard_count,
    } = share;
    if let Some(g) = gc.filter(|g| *g >= 1) {
        return g;
    }
    let mut g = shard_count.get();
    while g > 1 && tk > capacity / g {
        g /= 2;
    }
    g
}

/// Whether a shard's grant of `limit` belongs to the current period: a live window that
/// this shard has applied (`ws <= wa`, or `ws <= rf` unmarked), or a calendar quota reset
/// since the latest edge (`edge <= rf`, or no edge in reach).
pub fn quota_grant_is_current(limit: &Limit, st: &LimitState, rf: i64, now: i64) -> bool {
    match limit.refill() {
        Refill::Window { reset_after_s } => match st.window_start_ms {
            Some(ws) => {
                !window::ended(ws, reset_after_s * 1000, now)
                    && ws <= st.window_applied_ms.unwrap_or(rf)
            }
            None => false,
        },
        Refill::Calendar(c) => c
            .prev_edge(now)
            .is_none_or(|edge| edge <= st.period_applied_ms.unwrap_or(rf)),
        Refill::Drip { .. } => false,
    }
}

/// Rule "staggered windows share one phase" (ADR-140 × ADR-145): a sibling whose applied
/// window overlapped the window a new shard joins (`join_ws`) was granted, for that phase,
/// every slot it covers. Concurrent openers or a lost fan-out can leave it in an earlier,
/// staggered window that has since ended: its balance is dead, but the slots it covered
/// already had their allowance in this phase. Such a sibling still covers the slot, with
/// nothing to move (the slot joins with 0 and gets its share at its next roll), so one
/// phase never grants a slot twice.
///
/// The applied window is `wa` (or `ws` when unmarked and `ws <= rf`); an item that is
/// neither is treated as not overlapping.
pub fn window_grant_overlaps(limit: &Limit, st: &LimitState, rf: i64, join_ws: i64) -> bool {
    let Refill::Window { reset_after_s } = limit.refill() else {
        return false;
    };
    let applied = match (st.window_applied_ms, st.window_start_ms) {
        (Some(wa), _) => Some(wa),
        (None, Some(ws)) if ws <= rf => Some(ws),
        _ => None,
    };
    applied.is_some_and(|a| !window::ended(a, reset_after_s * 1000, join_ws))
}

/// The donor's debit condition: it still exists, still holds the amount, is still in the
/// same grant generation (`gc`) and the same period (calendar: `rf` at or after the edge;
/// window: `wa` still the window start it was read with).
pub fn donor_condition(
    limit: &Limit,
    amount: i64,
    st: &LimitState,
    rf: i64,
    shard_count: i64,
    now: i64,
) -> Condition {
    let n = limit.name();
    let generation = match st.grant_count {
        Some(g) => Condition::eq(battr(n, field::GC), g),
        // A legacy donor: pinned by the shard count its gc was inferred from.
        None => Condition::not_exists(battr(n, field::GC))
            .and(Condition::eq("shard_count", shard_count)),
    };
    let mut c = Condition::exists("PK")
        .and(Condition::ge(battr(n, field::TK), amount))
        .and(generation);
    match limit.refill() {
        Refill::Calendar(cal) => {
            if let Some(edge) = cal.prev_edge(now) {
                let pe = battr(n, field::PE);
                c = c.and(
                    Condition::ge(pe.clone(), edge)
                        .or(Condition::not_exists(pe).and(Condition::ge("rf", edge))),
                );
            }
        }
        Refill::Window { .. } => {
            c = match st.window_applied_ms {
                Some(wa) => c.and(Condition::eq(battr(n, field::WA), wa)),
                None => c.and(Condition::eq("rf", rf)),
            };
        }
        Refill::Drip { .. } => {}
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard of an entity of `s` holding `tk` of a quota of capacity `C`.
    fn share(gc: Option<i64>, tk: i64, s: i64) -> GrantShare {
        GrantShare {
            grant_count: gc,
            balance: Millitokens(tk),
            capacity: Millitokens(C),
            shard_count: ShardCount(s),
        }
    }

    const C: i64 = 1_000_000;

    fn sib(shard: u32, tk: i64, gc: i64) -> Sibling {
        Sibling {
            shard,
            balance: tk,
            grant_count: gc,
            current: true,
        }
    }

    /// Scenarios 66–74 (Q16): the planner table.
    #[test]
    fn planner_table() {
        let p = plan_quota_grant;
        assert_eq!(
            p(&[], 0, C),
            Grant {
                donor: None,
                tokens: C
            }
        );
        assert_eq!(
            p(&[sib(0, C, 1)], 1, C / 2),
            Grant {
                donor: Some((0, 1)),
                tokens: C / 2
            }
        );
        assert_eq!(
            p(&[sib(1, 0, 2), sib(0, C / 2, 2)], 3, C / 4),
            Grant {
                donor: Some((1, 2)),
                tokens: 0
            }
        );
        assert_eq!(
            p(&[sib(0, C / 4, 4)], 3, C / 4),
            Grant {
                donor: None,
                tokens: C / 4
            }
        );
        let stale = Sibling {
            current: false,
            ..sib(1, C / 2, 2)
        };
        assert_eq!(p(&[stale], 3, C / 4).donor, None);
        assert_eq!(
            p(&[sib(0, C, 1), sib(1, C / 2, 2)], 3, C / 4).donor,
            Some((1, 2))
        );
        assert_eq!(
            p(&[sib(0, C, 1)], 5, C / 8),
            Grant {
                donor: Some((0, 1)),
                tokens: C / 8
            }
        );
        assert_eq!(
            p(&[sib(3, C / 4, 2), sib(1, C / 4, 2)], 5, C / 8).donor,
            Some((1, 2))
        );
        assert_eq!(
            p(&[sib(0, -5000, 1)], 1, C / 2),
            Grant {
                donor: Some((0, 1)),
                tokens: 0
            }
        );
    }

    /// Q17: legacy items without gc infer it; a gc below 1 reads as the shard count.
    #[test]
    fn legacy_gc_inference() {
        assert_eq!(infer_gc(share(None, 700_000, 2)), 1);
        assert_eq!(infer_gc(share(None, 400_000, 2)), 2);
        assert_eq!(infer_gc(share(Some(0), 400_000, 2)), 2);
        assert_eq!(infer_gc(share(Some(4), 900_000, 2)), 4);
        // Inferred at S = 1, shard 0 (700) covers slot 1: move 500, leaving 200.
        let g = infer_gc(share(None, 700_000, 2));
        let grant = plan_quota_grant(&[sib(0, 700_000, g)], 1, C / 2);
        assert_eq!(
            grant,
            Grant {
                donor: Some((0, 1)),
                tokens: 500_000
            }
        );
        // Holding 400 it keeps S = 2, and slot 1 gets a fresh 500.
        let g = infer_gc(share(None, 400_000, 2));
        assert_eq!(
            plan_quota_grant(&[sib(0, 400_000, g)], 1, C / 2).donor,
            None
        );
    }

    /// Scenario 75: quota_grant_is_current.
    #[test]
    fn grant_currency() {
        let w = 1_757_000_000_000;
        let session =
            Limit::quota_after("session", 10, std::time::Duration::from_secs(18_000)).unwrap();
        let st = |ws: Option<i64>, wa: Option<i64>| LimitState {
            window_start_ms: ws,
            window_applied_ms: wa,
            window_s: Some(18_000),
            ..Default::default()
        };
        assert!(quota_grant_is_current(
            &session,
            &st(Some(w), None),
            w,
            w + 1000
        ));
        assert!(!quota_grant_is_current(
            &session,
            &st(Some(w), None),
            w - 1,
            w + 1000
        ));
        assert!(!quota_grant_is_current(
            &session,
            &st(None, None),
            w,
            w + 1000
        ));
        assert!(quota_grant_is_current(
            &session,
            &st(Some(w), Some(w)),
            0,
            w + 1000
        ));
        assert!(!quota_grant_is_current(
            &session,
            &st(Some(w), Some(w - 1)),
            0,
            w + 1000
        ));
        assert!(!quota_grant_is_current(
            &session,
            &st(Some(w), Some(w)),
            w,
            w + 18_000_000
        ));
        let daily = Limit::quota_calendar("d", 10, "0 0 * * *", "UTC").unwrap();
        let m = 1_764_547_200_000; // a midnight
        let d = LimitState::default();
        assert!(quota_grant_is_current(&daily, &d, m, m + 5000));
        assert!(!quota_grant_is_current(&daily, &d, m - 1, m + 5000));
        // 29 February: the last edge can be years back; a grant taken after it is current.
        let leap = Limit::quota_calendar("l", 10, "0 0 29 2 *", "UTC").unwrap();
        let mid_2027 = 1_813_000_000_000;
        assert!(quota_grant_is_current(&leap, &d, mid_2027 - 1000, mid_2027));
    }

    /// Staggered windows: an ended sibling window still covers a join that it overlapped.
    #[test]
    fn window_grant_overlaps_table() {
        let session =
            Limit::quota_after("session", 10, std::time::Duration::from_secs(18_000)).unwrap();
        let w = 1_757_000_000_000_i64;
        let len = 18_000_000;
        let st = |ws: Option<i64>, wa: Option<i64>| LimitState {
            window_start_ms: ws,
            window_applied_ms: wa,
            window_s: Some(18_000),
            ..Default::default()
        };
        // (applied window, join start) → overlaps?
        assert!(window_grant_overlaps(
            &session,
            &st(Some(w), Some(w)),
            w,
            w + len - 1
        ));
        assert!(!window_grant_overlaps(
            &session,
            &st(Some(w), Some(w)),
            w,
            w + len
        ));
        // Unapplied: the balance is wa's window.
        assert!(window_grant_overlaps(
            &session,
            &st(Some(w + len), Some(w)),
            w,
            w + 10
        ));
        // Unmarked: ws when ws <= rf, else unknown (not overlapping).
        assert!(window_grant_overlaps(
            &session,
            &st(Some(w), None),
            w,
            w + 10
        ));
        assert!(!window_grant_overlaps(
            &session,
            &st(Some(w), None),
            w - 1,
            w + 10
        ));
        assert!(!window_grant_overlaps(&session, &st(None, None), w, w + 10));
        let cal = Limit::quota_calendar("rpd", 10, "0 0 * * *", "UTC").unwrap();
        assert!(!window_grant_overlaps(
            &cal,
            &st(Some(w), Some(w)),
            w,
            w + 10
        ));
    }
}
