//! Duration windows (ADR-139/140): the predicates and targets of opening, rolling and
//! propagating one window start across the shards of an entity.

use crate::bucket::field;
use crate::expr::Condition;
use crate::keys::battr;

/// Half-open window: it has ended at exactly `ws + len`.
pub fn ended(ws: i64, len_ms: i64, now: i64) -> bool {
    ws + len_ms <= now
}

/// ADR-140 roll predicate: a window start not yet applied to this shard's balance —
/// `ws > wa`, or `ws > rf` on an item without `wa`.
pub fn unapplied(ws: i64, wa: Option<i64>, rf: i64) -> bool {
    match wa {
        Some(wa) if !crate::mutants::off(crate::mutants::Mutant::WaMarker) => ws > wa,
        _ => ws > rf,
    }
}

/// ADR-140 roll target = share − max(0, tc − wtc), never above the share; no snapshot
/// (`wtc` absent) charges nothing.
pub fn roll_target(share: i64, tc: i64, wtc: Option<i64>) -> i64 {
    match wtc {
        Some(w) if !crate::mutants::off(crate::mutants::Mutant::WtcCharge) => {
            share - (tc - w).max(0)
        }
        _ => share,
    }
}

/// ADR-139/140 fan-out condition on a sibling: it exists, it is marked (or its `rf` is
/// older than the new start), and its own window had ended by the new start (the
/// ended-window floor) — so concurrent openers cannot reset each other inside one window.
pub fn fanout_condition(limit: &str, new_ws: i64, rsa_s: i64) -> Condition {
    let ws = battr(limit, field::WS);
    let floor = if !crate::mutants::off(crate::mutants::Mutant::WindowFloor) {
        Condition::le(ws.clone(), new_ws - rsa_s * 1000)
    } else {
        Condition::lt(ws.clone(), new_ws)
    };
    Condition::exists("PK")
        .and(Condition::exists(battr(limit, field::WA)).or(Condition::lt("rf", new_ws)))
        .and(Condition::not_exists(ws).or(floor))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scenario 63 / W15: the window-rolled predicate table.
    #[test]
    fn roll_predicate_table() {
        assert!(unapplied(200, None, 100));
        assert!(!unapplied(100, None, 100));
        assert!(!unapplied(200, Some(200), 100));
        assert!(unapplied(300, Some(200), 400));
    }

    #[test]
    fn half_open() {
        assert!(!ended(0, 10, 9));
        assert!(ended(0, 10, 10));
    }

    #[test]
    fn roll_targets() {
        assert_eq!(roll_target(5000, 1000, Some(1000)), 5000);
        assert_eq!(roll_target(5000, 3000, Some(1000)), 3000);
        assert_eq!(roll_target(5000, 1000, Some(4000)), 5000);
        assert_eq!(roll_target(5000, 9000, None), 5000);
    }
}
