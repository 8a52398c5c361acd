//! Each guard, disabled with its mutant, is caught: a run finds a violation of the invariant
//! the guard protects. The mutant switch is process-global, so these run one at a time.

use std::sync::Mutex;

use tollgate_sim::{mutants, run_seed, Mutant, RunConfig};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Run seeds `0..max` of the runs `base` describes (its seed replaced) with `m` disabled;
/// return the first violation found.
fn first_violation(m: Mutant, base: &RunConfig, max: u64) -> Option<(u64, String)> {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    mutants::set(&[m]);
    let mut found = None;
    for seed in 0..max {
        let r = run_seed(&RunConfig {
            seed,
            ..base.clone()
        });
        if let Some(v) = r.violations.first() {
            found = Some((seed, v.invariant.to_string()));
            break;
        }
    }
    mutants::set(&[]);
    found
}

fn caught(m: Mutant, workload: Option<&'static str>, max: u64, invariants: &[&str]) {
    let base = RunConfig {
        workload,
        ..RunConfig::default()
    };
    caught_in(m, &base, max, invariants);
}

/// [`caught`] over the runs `base` describes.
fn caught_in(m: Mutant, base: &RunConfig, max: u64, invariants: &[&str]) {
    let found = first_violation(m, base, max);
    let Some((seed, inv)) = found else {
        panic!("mutant {} survived {max} seeds", m.name());
    };
    assert!(
        invariants.contains(&inv.as_str()),
        "mutant {} broke {inv} at seed {seed}, expected one of {invariants:?}",
        m.name()
    );
}

#[test]
fn window_floor_is_needed() {
    caught(
        Mutant::WindowFloor,
        Some("window"),
        120,
        &["window-allowance", "window-roll-charge"],
    );
}

#[test]
fn wa_marker_is_needed() {
    // The hazard needs an older writer whose clock lags a window start (its `rf` stamp lands
    // below `ws`); since the simulator gives such writers a lag of up to 30 s in half the
    // window runs, `--seeds 2000 --mutant WaMarker` over every workload catches it from seed
    // 240 on (8 seeds), and the window workload alone from seed 18.
    caught(
        Mutant::WaMarker,
        Some("window"),
        200,
        &["window-allowance", "window-roll-charge"],
    );
}

#[test]
fn wtc_charge_is_needed() {
    // The hot workload (up to 32 shards rolling into fanned-out windows) finds it from seed
    // 70; every workload in rotation rarely reaches it since the exactness rules made
    // sharded traffic take fewer rolls.
    caught(
        Mutant::WtcCharge,
        Some("hot"),
        400,
        &["window-roll-charge", "window-allowance"],
    );
}

/// Without "monotonic rf" an rf-locked write in the millisecond of the one before it
/// stamps the same `rf`: the item's pinned stamps change while `rf` stays (invariant
/// `rf-pins`, the premise of `writes::restates`), or `rf` goes back (`rf-monotonic`).
#[test]
fn monotonic_rf_is_needed() {
    caught(Mutant::MonotonicRf, None, 20, &["rf-monotonic", "rf-pins"]);
}

#[test]
fn rf_lock_is_needed() {
    caught(
        Mutant::RfLock,
        None,
        20,
        &[
            "rf-monotonic",
            "calendar-allowance",
            "window-allowance",
            "rate-allowance",
        ],
    );
}

#[test]
fn grant_move_is_needed() {
    caught(
        Mutant::GrantMove,
        Some("calendar"),
        60,
        &["calendar-allowance", "window-allowance"],
    );
}

#[test]
fn consistent_sibling_read_is_needed() {
    // A stale sibling view (a sibling not yet created, or before its reset) makes its grant
    // look uncovered, and the new shard gets fresh allowance (ADR-139 W9, ADR-145). Found in
    // the calendar workload at seed 283 once stale reads may lag several writes.
    caught(
        Mutant::ConsistentSiblingRead,
        Some("calendar"),
        400,
        &["calendar-allowance", "window-allowance"],
    );
}

#[test]
fn trust_horizon_is_needed() {
    // The idle-then-burst repro: without the per-limit trust horizon a warm client spends a
    // bucket that refilled to its ceiling as if the idle time were still to be credited.
    caught(Mutant::TrustHorizon, Some("burst"), 100, &["rate-envelope"]);
}

#[test]
fn lease_net_is_needed() {
    // A refund beyond what the lease consumed hands out tokens of earlier leases.
    caught(Mutant::LeaseNet, Some("burst"), 50, &["lease-net"]);
}

#[test]
fn entity_debit_is_needed() {
    // One shard deciding alone refuses while the entity could pay (and its status says so).
    caught(
        Mutant::EntityDebit,
        Some("drip"),
        50,
        &["honest-answer", "rate-envelope"],
    );
}

#[test]
fn drip_split_is_needed() {
    // A new dripping shard seeded with a fresh share mints what the entity did not have.
    caught(Mutant::DripSplit, Some("drip"), 100, &["rate-envelope"]);
}

#[test]
fn store_deadline_is_needed() {
    // Without the deadline a client waits out a hung request (600 s of virtual time).
    caught(Mutant::StoreDeadline, None, 60, &["deadline"]);
}

#[test]
fn multi_refund_is_needed() {
    // ADR-148: a refused multi-resource acquire that leaves a landed resource charged moves
    // `tc` for an operation that failed (the many workload finds it on its first seed).
    caught(Mutant::MultiRefund, Some("many"), 100, &["consumed-once"]);
}

#[test]
fn soft_scope_is_needed() {
    // ADR-151: a soft limit that exempts its enforced siblings lets `tok` over-admit
    // (the soft workload finds it on its first seed).
    caught(
        Mutant::SoftScope,
        Some("soft"),
        100,
        &["rate-allowance", "rate-envelope"],
    );
}

#[test]
fn bypass_stamp_is_needed() {
    // ADR-151: without the `bypass` stamp condition, a client whose last image said
    // "bypassed" writes `tc` only on an item whose bypass was lifted, and `tok` admits
    // without debiting (the soft workload, which switches bypass on and off at the pair and
    // the resource level, finds it from seed 15; `--seeds 2000 --workload soft --mutant
    // BypassStamp`: 61 violations; over every workload, `--seeds 2000 --mutant BypassStamp`:
    // 8, from seed 406).
    caught(
        Mutant::BypassStamp,
        Some("soft"),
        2000,
        &["rate-allowance", "rate-envelope"],
    );
}

#[test]
fn op_once_is_needed() {
    // ADR-149: an operator's top-up whose response was lost is retried; without the check
    // that reads its id back, the retry lands a second time and the clients spend the
    // tokens the operator added once. The topup workload alone catches it from seed 122;
    // `--seeds 2000 --mutant OpOnce` over every workload from seed 179 (3 seeds of 2000).
    caught(Mutant::OpOnce, Some("topup"), 400, &["calendar-allowance"]);
}

#[test]
fn usage_checkpoint_condition_is_needed() {
    let base = RunConfig {
        aggregator: true,
        ..RunConfig::default()
    };
    caught_in(Mutant::UsageCheckpoint, &base, 60, &["usage-counted-once"]);
}

#[test]
fn held_commit_is_needed() {
    // An absorbing aggregator that forgets the sums of a failed commit (as a pass that can
    // re-read them would) loses usage: the feed no longer has those changes.
    let base = RunConfig {
        aggregator: true,
        absorb: true,
        ..RunConfig::default()
    };
    caught_in(
        Mutant::HeldCommit,
        &base,
        60,
        &["usage-counted-once", "usage-overdraw"],
    );
}
