//! Sharded hot buckets (scenarios 11–18, S1–S11), sharded quotas (Q), and windows across
//! shards (scenarios 27–65, W).
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use crate::testing::hook::On;
use crate::testing::*;
use crate::{Error, Limit, Scope};
use tollgate_core::value::Value;

pub(super) const T1: i64 = T0 + W + 1000;
pub(super) const E: &str = "e";
pub(super) const R: &str = "llm";

pub(super) fn session() -> Limit {
    Limit::quota_after("session", 10, Duration::from_secs(18_000)).unwrap()
}

pub(super) async fn limits(h: &H, l: &[Limit]) {
    h.lim
        .admin()
        .set_limits(&Scope::Entity(E.into(), Some(R.into())), l)
        .await
        .unwrap();
}

/// Make a client learn the entity's shard count (a CAS that loses adopts the stored count).
pub(super) async fn warm(l: &crate::Limiter) {
    l.admin().bump_shard_count(E, R, 1).await.unwrap();
}

pub(super) fn tk(h: &H, shard: u32) -> i64 {
    h.n(E, R, shard, "b_session_tk").unwrap()
}

/// TWO(leftover): the standard two-shard setup of spec §5.
pub(super) async fn two(h: &H, leftover: i64) {
    limits(h, &[session()]).await;
    h.at(T0);
    h.lim.acquire(E, R, &[("session", 0)]).await.unwrap();
    assert_eq!((tk(h, 0), h.n(E, R, 0, "b_session_gc")), (10_000, Some(1)));
    assert_eq!(h.lim.admin().bump_shard_count(E, R, 1).await.unwrap(), 2);
    h.at(T0 + 1000);
    h.rng.pin(1);
    h.lim.acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!(h.n(E, R, 1, "b_session_ws"), Some(T0));
    assert_eq!(h.n(E, R, 1, "b_session_wa"), Some(T0));
    assert_eq!((tk(h, 0), tk(h, 1)), (5000, 4000));
    assert_eq!(h.n(E, R, 1, "b_session_tc"), Some(1000));
    assert_eq!(h.n(E, R, 1, "b_session_gc"), Some(2));
    h.set_n(E, R, 1, "b_session_tk", leftover * 1000);
    h.at(T1);
    h.rng.pin(0);
    h.slow().acquire(E, R, &[("session", 1)]).await.unwrap();
}

/// Scenario 38 (W14): the fan-out's write shape, and 1 write for S − 1 = 1, L = 1.
pub async fn s38_fanout_write_shape(b: &Backend) {
    let h = b.harness(T0).await;
    two(&h, 0).await;
    assert_eq!(h.n(E, R, 0, "b_session_ws"), Some(T1));
    assert_eq!(h.n(E, R, 0, "b_session_wa"), Some(T1));
    assert_eq!(tk(&h, 0), 4000);
    assert_eq!(h.n(E, R, 1, "b_session_ws"), Some(T1));
    assert_eq!(h.n(E, R, 1, "b_session_wa"), Some(T0));
    assert_eq!(h.n(E, R, 1, "vu"), Some(0));
    assert_eq!(h.n(E, R, 1, "b_session_wtc"), Some(1000));
    assert_eq!(tk(&h, 1), 0);
}

/// Scenario 43: the fan-out never touches tk, rf, wa or gc.
pub async fn s43_fanout_touches_no_balance(b: &Backend) {
    let h = b.harness(T0).await;
    two(&h, 3).await;
    let after = h.item(E, R, 1);
    assert_eq!(after.get("b_session_tk"), Some(&Value::N(3000)));
    assert_eq!(after.get("rf"), Some(&Value::N(T0 + 1000)));
    assert_eq!(after.get("b_session_wa"), Some(&Value::N(T0)));
    assert_eq!(after.get("b_session_gc"), Some(&Value::N(2)));
}

/// Scenario 45: the roll target charges consumption since the snapshot.
pub async fn s45_roll_target(b: &Backend) {
    let h = b.harness(T0).await;
    two(&h, 0).await;
    h.at(T1 + 120_000);
    h.rng.pin(1);
    h.slow().acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!(tk(&h, 1), 4000);
    assert_eq!(h.n(E, R, 1, "b_session_wa"), Some(T1));
    assert_eq!(h.n(E, R, 1, "b_session_gc"), Some(2));
    assert!(h.n(E, R, 1, "rf").unwrap() >= T1);
    // One allowance per window: 8 spendable + 2 admitted in window T1 = 10.
    assert_eq!(h.spendable(E, R, "session", 2), 8);
}

/// Scenario 40: a lost fan-out leaves a shard staggered, never over-admitting.
pub async fn s40_lost_fanout(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[session()]).await;
    h.lim.acquire(E, R, &[("session", 0)]).await.unwrap();
    h.lim.admin().bump_shard_count(E, R, 1).await.unwrap();
    h.at(T0 + 1000);
    h.rng.pin(1);
    h.lim.acquire(E, R, &[("session", 1)]).await.unwrap();
    h.set_n(E, R, 1, "b_session_tk", 0);
    let before = h.item(E, R, 1);
    h.at(T1);
    h.rng.pin(0);
    h.slow().acquire(E, R, &[("session", 1)]).await.unwrap();
    // Drop the fan-out write: shard 1 as it was.
    h.raw.raw_put(&h.key(E, R, 1), before);
    h.at(T1 + 60_000);
    h.rng.pin(1);
    h.slow().acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!(h.n(E, R, 1, "b_session_ws"), Some(T1 + 60_000));
    assert_eq!(tk(&h, 1), 4000, "opened its own window with a fresh share");
    // Shard 0 was not moved (its window T1 is live at T1 + 60,000) and not restored twice.
    assert_eq!(h.n(E, R, 0, "b_session_ws"), Some(T1));
    assert_eq!(tk(&h, 0), 4000);
}

/// Scenario 42 and 44: the floor refuses a live sibling; a deleted sibling is not created.
pub async fn s42_s44_fanout_floor_and_deleted_sibling(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[session()]).await;
    h.lim.acquire(E, R, &[("session", 0)]).await.unwrap();
    h.lim.admin().bump_shard_count(E, R, 1).await.unwrap();
    h.rng.pin(1);
    h.at(T0 + 1000);
    h.lim.acquire(E, R, &[("session", 1)]).await.unwrap();
    // Shard 1 opens a new window artificially at T0 + 1 h (as a concurrent opener would):
    // the fan-out to shard 0 (ws = T0, live) must be refused by the floor.
    let cond = tollgate_core::window::fanout_condition("session", T0 + 3_600_000, 18_000);
    let item = h.item(E, R, 0);
    assert!(!tollgate_store::eval::eval_condition(Some(&item), &cond));
    // Deleted sibling: a fan-out never creates it.
    h.raw.raw_delete(&h.key(E, R, 1));
    h.at(T1);
    h.rng.pin(0);
    h.slow().acquire(E, R, &[("session", 1)]).await.unwrap();
    assert!(h.raw.raw_get(&h.key(E, R, 1)).is_none());
    assert_eq!(h.slow().stats().fanout_writes, 0);
}

/// Scenario 47: a burnt shard still rolls; the fast path's projection goes slow instead of
/// rejecting, and exactly the share is admitted.
pub async fn s47_burnt_shard_still_rolls(b: &Backend) {
    let h = b.harness(T0).await;
    two(&h, 0).await;
    // Older writer: SET rf = its clock, REMOVE vu on shard 1; shard 0 drained.
    h.set_n(E, R, 1, "rf", T1 + 60_000);
    h.remove(E, R, 1, "vu");
    h.set_n(E, R, 0, "b_session_tk", 0);
    h.at(T1 + 120_000);
    h.rng.pin(1);
    let mut admitted = 0;
    for _ in 0..10 {
        if h.lim.acquire(E, R, &[("session", 1)]).await.is_ok() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 5);
    assert_eq!(h.n(E, R, 1, "b_session_wa"), Some(T1));
}

/// Scenario 49: a retry that lost the lock is charged by the roll. The writer that took
/// the lock decides which: one that left the item trusted (`vu` later than now) lets the
/// consumption-only retry debit the un-rolled balance, which the roll then charges through
/// `tc − wtc` (an older writer that removes `vu` leaves it so too); one that left it past
/// its boundary (`vu = 0`) makes the pass re-plan from the item it returned and roll there.
/// Either way window T1 admits 5 on shard 1.
pub async fn s49_retry_that_lost_the_lock_is_charged(b: &Backend) {
    for (staged_vu, tk_after, wa_after) in [
        (Some(T1 + 600_000), 2000, T0),
        (None, 2000, T0),
        (Some(0), 4000, T1),
    ] {
        let h = b.harness(T0).await;
        two(&h, 3).await;
        h.at(T1 + 20_000);
        h.rng.pin(1);
        let (lim, hk) = h.hooked(false);
        warm(&lim).await;
        let k = h.key(E, R, 1);
        hk.stage(On::Update, Some(k.clone()), move |m| {
            let mut i = m.raw_get(&k).unwrap();
            i.insert("rf".into(), Value::N(T1 + 15_000));
            match staged_vu {
                Some(v) => i.insert("vu".into(), Value::N(v)),
                None => i.remove("vu"),
            };
            m.raw_put(&k, i);
        });
        lim.acquire(E, R, &[("session", 1)]).await.unwrap();
        assert_eq!(tk(&h, 1), tk_after);
        assert_eq!(h.n(E, R, 1, "b_session_tc"), Some(2000));
        assert_eq!(h.n(E, R, 1, "b_session_wa"), Some(wa_after));
        h.at(T1 + 30_000);
        // Past the staged trust horizon for the slow client too.
        h.set_n(E, R, 1, "vu", 0);
        let mut more = 0;
        for _ in 0..10 {
            if h.slow().acquire(E, R, &[("session", 1)]).await.is_ok() {
                more += 1;
            }
        }
        // Shard 1 rolls to 5000 − (2000 − 1000) = 4000; then the entity's request is taken
        // from shard 0's 4000 (a debit belongs to the entity).
        assert_eq!(h.n(E, R, 1, "b_session_tc"), Some(6000));
        assert_eq!(more, 8);
    }
}

/// Scenario 51 is a core unit test; scenario 54: a backward rf from a slow clock does not
/// roll twice, and the written rf is the pass's now.
pub async fn s54_backward_rf(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[session()]).await;
    h.lim.acquire(E, R, &[("session", 3)]).await.unwrap();
    h.set_n(E, R, 0, "rf", T0 - 5000);
    h.at(T0 + 1000);
    h.slow().acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!(tk(&h, 0), 6000);
    assert_eq!(h.n(E, R, 0, "rf"), Some(T0 + 1000));
}

/// Scenario 58: an unmarked item rolls once by `ws > rf`, then is marked.
pub async fn s58_unmarked_fallback(b: &Backend) {
    let h = b.harness(T0).await;
    two(&h, 0).await;
    h.remove(E, R, 1, "b_session_wa");
    h.rng.pin(1);
    h.at(T1 + 1000);
    h.slow().acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!((tk(&h, 1), h.n(E, R, 1, "b_session_wa")), (4000, Some(T1)));
    h.at(T1 + 2000);
    h.slow().acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!(tk(&h, 1), 3000);
}

/// Scenario 59: migration marks an unmarked item without rolling.
pub async fn s59_migration_marks_without_rolling(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[session()]).await;
    h.lim.acquire(E, R, &[("session", 3)]).await.unwrap();
    h.remove(E, R, 0, "b_session_wa");
    h.at(T0 + 1000);
    h.slow().acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!((tk(&h, 0), h.n(E, R, 0, "b_session_wa")), (6000, Some(T0)));
}

/// Scenario 61: `wa` is written as the value read, so a fan-out landing between a pass's
/// read and write leaves the new window unapplied for the next pass to roll.
pub async fn s61_wa_is_a_value(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[session()]).await;
    h.lim.acquire(E, R, &[("session", 0)]).await.unwrap();
    h.lim.admin().bump_shard_count(E, R, 1).await.unwrap();
    h.rng.pin(1);
    h.at(T0 + 1000);
    h.lim.acquire(E, R, &[("session", 1)]).await.unwrap(); // shard 1 joins T0: tk 4000
    let (lim, hk) = h.hooked(false);
    warm(&lim).await;
    let k = h.key(E, R, 1);
    // The pass reads shard 1 with ws = T0 (applied); a fan-out moving ws to T0 + 4000 lands
    // before the pass's rf-locked write.
    h.at(T0 + 5000);
    hk.stage(On::Update, Some(k.clone()), move |m| {
        let mut i = m.raw_get(&k).unwrap();
        i.insert("b_session_ws".into(), Value::N(T0 + 4000));
        i.insert("b_session_wtc".into(), Value::N(1000));
        i.insert("vu".into(), Value::N(0));
        m.raw_put(&k, i);
    });
    lim.acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!(
        h.n(E, R, 1, "b_session_wa"),
        Some(T0),
        "stamped with the value read"
    );
    assert_eq!(h.n(E, R, 1, "b_session_ws"), Some(T0 + 4000));
    // The next pass rolls it: share 5000 − (tc 2000 − wtc 1000) − 1 = 3000.
    warm(&h.slow()).await;
    h.at(T0 + 6000);
    h.slow().acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!(h.n(E, R, 1, "b_session_wa"), Some(T0 + 4000));
    assert_eq!(tk(&h, 1), 3000);
}

/// Scenario 62: rf is monotonic — a pass whose clock is behind the stored rf never moves it
/// back, credits nothing, and still takes the lock by stamping one past it.
pub async fn s62_rf_monotonic(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[Limit::per_second("rps", 10).unwrap()]).await;
    h.lim.acquire(E, R, &[("rps", 5)]).await.unwrap();
    h.set_n(E, R, 0, "rf", T0 + 10_000);
    h.slow().acquire(E, R, &[("rps", 1)]).await.unwrap();
    // Locking on the stored value means moving past it (C5): one past the stored rf.
    assert_eq!(h.n(E, R, 0, "rf"), Some(T0 + 10_001));
    assert_eq!(h.n(E, R, 0, "b_rps_tk"), Some(4000));
}

/// Scenario 64: the fast path's projection of a pending roll.
pub async fn s64_fast_path_projection(_b: &Backend) {
    use tollgate_core::bucket::{BucketImage, LimitState};
    let mut img = BucketImage {
        key: tollgate_core::value::Key::new("", ""),
        refilled_at_ms: T1 + 60_000,
        valid_until_ms: None,
        ttl: None,
        shard_count: 2,
        params_hash: None,
        limits: Default::default(),
        wcu: None,
        disabled: false,
        bypass: false,
        op: None,
        cascade: None,
        layout: Default::default(),
    };
    let st = LimitState {
        balance: 0,
        capacity: 10_000,
        consumed: 1000,
        window_start_ms: Some(T1),
        window_s: Some(18_000),
        window_applied_ms: Some(T0),
        window_consumed: Some(1000),
        grant_count: Some(2),
        ..Default::default()
    };
    img.limits.insert("session".into(), st.clone());
    let l = [session()];
    let a = [("session".to_string(), 1000)];
    assert!(tollgate_core::writes::would_refill_satisfy(
        &img,
        &l,
        &a,
        T1 + 1
    ));
    img.limits.insert(
        "session".into(),
        LimitState {
            window_applied_ms: Some(T1),
            ..st
        },
    );
    assert!(!tollgate_core::writes::would_refill_satisfy(
        &img,
        &l,
        &a,
        T1 + 1
    ));
}

/// Scenarios 27 and 28 (W2, W7): a new shard joins the live window, funded by a move.
pub async fn s27_s28_join_by_move(b: &Backend) {
    for (first, want, spend_after) in [(1, (4000, 4000), 8), (3, (2000, 4000), 6)] {
        let h = b.harness(T0).await;
        limits(&h, &[session()]).await;
        h.lim.acquire(E, R, &[("session", first)]).await.unwrap();
        h.lim.admin().bump_shard_count(E, R, 1).await.unwrap();
        h.at(T0 + 60_000);
        h.rng.pin(1);
        h.lim.acquire(E, R, &[("session", 1)]).await.unwrap();
        assert_eq!((tk(&h, 0), tk(&h, 1)), want);
        assert_eq!(h.n(E, R, 1, "b_session_ws"), Some(T0));
        assert_eq!(h.n(E, R, 1, "b_session_wa"), Some(T0));
        assert_eq!(h.n(E, R, 1, "rf"), Some(T0 + 60_000));
        assert_eq!(h.n(E, R, 1, "vu"), Some(T0 + W));
        assert_eq!(
            h.n(E, R, 0, "b_session_ws"),
            Some(T0),
            "no fan-out on a join"
        );
        assert_eq!(h.spendable(E, R, "session", 2), spend_after);
    }
}

/// Scenario 29 (W3): no sibling window — the new shard opens its own with a fresh share.
pub async fn s29_no_sibling_window(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[session()]).await;
    h.lim.acquire(E, R, &[("session", 1)]).await.unwrap();
    h.lim.admin().bump_shard_count(E, R, 1).await.unwrap();
    warm(&h.slow()).await;
    h.raw.raw_delete(&h.key(E, R, 0));
    h.at(T0 + 60_000);
    h.rng.pin(1);
    h.slow().acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!(h.n(E, R, 1, "b_session_ws"), Some(T0 + 60_000));
    assert_eq!(tk(&h, 1), 4000);
}

/// Scenarios 30 and 31 (W4, W5): the sibling's window ended — open, fan out, roll; dead
/// surplus is never a donor.
pub async fn s30_s31_sibling_window_ended(b: &Backend) {
    for (first, at) in [
        (10, T0 + W),
        (10, T0 + W + 3_600_000),
        (1, T0 + W + 3_600_000),
    ] {
        let h = b.harness(T0).await;
        limits(&h, &[session()]).await;
        h.lim.acquire(E, R, &[("session", first)]).await.unwrap();
        h.lim.admin().bump_shard_count(E, R, 1).await.unwrap();
        warm(&h.slow()).await;
        h.at(at);
        h.rng.pin(1);
        h.slow().acquire(E, R, &[("session", 1)]).await.unwrap();
        assert_eq!(h.n(E, R, 1, "b_session_ws"), Some(at));
        assert_eq!(tk(&h, 1), 4000);
        assert_eq!(h.n(E, R, 1, "vu"), Some(at + W));
        assert_eq!(h.n(E, R, 0, "b_session_ws"), Some(at), "fanned out");
        assert_eq!(tk(&h, 0), 10_000 - first * 1000, "fan-out moves no tokens");
        assert_eq!(h.n(E, R, 0, "vu"), Some(0));
        h.at(at + 1);
        h.rng.pin(0);
        h.slow().acquire(E, R, &[("session", 1)]).await.unwrap();
        assert_eq!(h.n(E, R, 0, "b_session_ws"), Some(at));
        assert_eq!(tk(&h, 0), 4000);
        assert_eq!(h.spendable(E, R, "session", 2), 8);
    }
}

/// Scenario 65: a seed on an existing shard joins the live window by a move.
pub async fn s65_seed_joins_live_window(b: &Backend) {
    let h = b.harness(T0).await;
    let rpm = Limit::per_minute("rpm", 100).unwrap();
    limits(&h, &[rpm.clone(), session()]).await;
    h.lim.acquire(E, R, &[("session", 1)]).await.unwrap();
    h.lim.admin().bump_shard_count(E, R, 1).await.unwrap();
    h.rng.pin(1);
    let o = crate::AcquireOptions {
        limits: Some(vec![rpm]),
        on_unavailable: None,
    };
    h.lim.acquire_with(E, R, &[("rpm", 1)], o).await.unwrap();
    assert!(h.n(E, R, 1, "b_session_tk").is_none());
    warm(&h.slow()).await;
    h.at(T0 + 60_000);
    h.slow().acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!(h.n(E, R, 1, "b_session_ws"), Some(T0));
    assert_eq!(h.n(E, R, 1, "b_session_wa"), Some(T0));
    assert_eq!((tk(&h, 0), tk(&h, 1)), (4000, 4000));
}

pub(super) fn rpd() -> Limit {
    Limit::quota_calendar("rpd", 1000, "0 0 * * *", "UTC").unwrap()
}

async fn quota_two(h: &H, drain_to: Option<i64>) {
    limits(h, &[rpd()]).await;
    h.lim.acquire(E, R, &[("rpd", 0)]).await.unwrap();
    if let Some(d) = drain_to {
        h.set_n(E, R, 0, "b_rpd_tk", d * 1000);
    }
    h.lim.admin().bump_shard_count(E, R, 1).await.unwrap();
    h.rng.pin(1);
}

fn rpd_tks(h: &H) -> (i64, i64) {
    (
        h.n(E, R, 0, "b_rpd_tk").unwrap() / 1000,
        h.n(E, R, 1, "b_rpd_tk").unwrap() / 1000,
    )
}

/// Q1, Q2 (#587), Q3, Q7: the split moves the grant; a spent parent gives what it has.
pub async fn q1_q2_q3_q7_splits(b: &Backend) {
    for (drain, amount, want) in [
        (None, 1, (500, 499)),
        (Some(2), 1, (0, 1)),
        (Some(700), 1, (200, 499)),
        (None, 10, (500, 490)),
    ] {
        let h = b.harness(T0).await;
        quota_two(&h, drain).await;
        h.lim.acquire(E, R, &[("rpd", amount)]).await.unwrap();
        assert_eq!(rpd_tks(&h), want, "drain {drain:?}");
        assert_eq!(h.n(E, R, 1, "b_rpd_gc"), Some(2));
    }
}

/// Q4: after the edge each shard resets to its share.
pub async fn q4_exact_reset(b: &Backend) {
    let h = b.harness(T0).await;
    quota_two(&h, None).await;
    h.lim.acquire(E, R, &[("rpd", 1)]).await.unwrap();
    h.set_n(E, R, 0, "b_rpd_tk", 0);
    h.set_n(E, R, 1, "b_rpd_tk", 0);
    h.at(T0 + 2 * 86_400_000);
    for s in [0, 1] {
        h.rng.pin(s);
        h.slow().acquire(E, R, &[("rpd", 1)]).await.unwrap();
    }
    assert_eq!(h.spendable(E, R, "rpd", 2), 998);
    assert_eq!(h.n(E, R, 0, "b_rpd_gc"), Some(2));
}

/// Q10: a rejected acquire keeps the move.
pub async fn q10_rejected_acquire_keeps_the_move(b: &Backend) {
    let h = b.harness(T0).await;
    quota_two(&h, None).await;
    // More than the entity has (a request up to 1,000 is admitted across both shards).
    let x = h.lim.acquire(E, R, &[("rpd", 1001)]).await.unwrap_err();
    assert_eq!(x.exceeded().unwrap().retry_after_ms, None, "can never fit");
    assert_eq!(rpd_tks(&h), (500, 500));
    assert_eq!(h.n(E, R, 1, "b_rpd_tc"), Some(0));
    assert_eq!(h.n(E, R, 1, "b_rpd_gc"), Some(2));
}

/// Q12 (scenario 78): the donor drops between plan and commit; the re-plan moves what is
/// left.
pub async fn q12_lost_move_replanned(b: &Backend) {
    let h = b.harness(T0).await;
    quota_two(&h, None).await;
    let (lim, hk) = h.hooked(false);
    warm(&lim).await;
    let k0 = h.key(E, R, 0);
    hk.stage(On::Transact, None, move |m| {
        let mut i = m.raw_get(&k0).unwrap();
        i.insert("b_rpd_tk".into(), Value::N(300_000));
        m.raw_put(&k0, i);
    });
    lim.acquire(E, R, &[("rpd", 100)]).await.unwrap();
    assert_eq!(rpd_tks(&h), (0, 200));
}

/// Q14 (R5): a reset pass races a doubling. The reset sized at the stale count is never
/// written (its pin on the shard count fails); the pass re-reads and resets at S = 2.
pub async fn q14_reset_losing_its_pin(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[rpd()]).await;
    h.lim.acquire(E, R, &[("rpd", 900)]).await.unwrap(); // shard 0 at 100
    let midnight = 1_757_030_400_000;
    h.at(midnight + 1000);
    let (lim, hk) = h.hooked(false);
    let k0 = h.key(E, R, 0);
    hk.stage(On::Update, Some(k0.clone()), move |m| {
        let mut i = m.raw_get(&k0).unwrap();
        i.insert("shard_count".into(), Value::N(2));
        m.raw_put(&k0, i);
    });
    lim.acquire(E, R, &[("rpd", 1)]).await.unwrap();
    assert_eq!(h.n(E, R, 0, "b_rpd_tk"), Some(499_000));
    assert_eq!(h.n(E, R, 0, "b_rpd_gc"), Some(2));
    assert_eq!(h.n(E, R, 0, "b_rpd_pe"), Some(midnight));
}

/// Q15 / ADR-145 residual (a): a create planned at S = 4 is overtaken by a doubling to 8
/// before it lands. Its pin on shard 0's count fails; it re-plans at 8, so the period's
/// allowance stays exact (the original over-granted one share, 1125 of 1000).
pub async fn q15_create_overtaken_by_a_doubling(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[rpd()]).await;
    h.lim.acquire(E, R, &[("rpd", 0)]).await.unwrap();
    h.lim.admin().bump_shard_count(E, R, 1).await.unwrap();
    h.lim.admin().bump_shard_count(E, R, 2).await.unwrap();
    let (lim, hk) = h.hooked(false);
    lim.admin().bump_shard_count(E, R, 1).await.unwrap(); // learn the count (4)
    let k0 = h.key(E, R, 0);
    hk.stage(On::Transact, None, move |m| {
        let mut i = m.raw_get(&k0).unwrap();
        i.insert("shard_count".into(), Value::N(8));
        m.raw_put(&k0, i);
    });
    h.rng.pin(3);
    lim.acquire(E, R, &[("rpd", 0)]).await.unwrap();
    assert_eq!(h.n(E, R, 3, "b_rpd_gc"), Some(8));
    assert_eq!(h.n(E, R, 3, "b_rpd_tk"), Some(125_000));
    // Every remaining slot, then the total: exactly the allowance.
    for slot in 0..8 {
        h.rng.pin(slot);
        h.slow().acquire(E, R, &[("rpd", 0)]).await.unwrap();
    }
    let total: i64 = (0..8).map(|i| h.n(E, R, i, "b_rpd_tk").unwrap()).sum();
    assert_eq!(total, 1_000_000);
}

/// Scenario 76: the conservation walk — doubling 1 → 32 with nobody spending keeps exactly
/// the capacity (the old clamp rule kept 187 of 1000).
pub async fn s76_conservation_walk(b: &Backend) {
    for cap in [1000, 1024] {
        let h = b.harness(T0).await;
        limits(
            &h,
            &[Limit::quota_calendar("rpd", cap, "0 0 * * *", "UTC").unwrap()],
        )
        .await;
        h.lim.acquire(E, R, &[("rpd", 0)]).await.unwrap();
        let mut s = 1;
        let mut order = 7u32;
        while s < 32 {
            s = h.lim.admin().bump_shard_count(E, R, s).await.unwrap();
            order = (order * 13 + 5) % s as u32;
            let slot = (s as u32 / 2 + order % (s as u32 / 2)).min(s as u32 - 1);
            h.rng.pin(slot);
            h.slow().acquire(E, R, &[("rpd", 0)]).await.unwrap();
        }
        for slot in (0..32).rev() {
            h.rng.pin(slot);
            h.slow().acquire(E, R, &[("rpd", 0)]).await.unwrap();
        }
        let total: i64 = (0..32).map(|i| h.n(E, R, i, "b_rpd_tk").unwrap()).sum();
        assert_eq!(total, cap * 1000, "cap {cap}");
    }
}

/// Scenarios 12, 14, 15, S3: doubling on wcu, the cap, and count propagation.
pub async fn s12_s14_s15_doubling(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[Limit::per_minute("rpm", 100_000).unwrap()]).await;
    h.lim.acquire(E, R, &[("rpm", 1)]).await.unwrap();
    // S3: 1000 fast writes in the same instant spend shard 0's wcu (the create spent none).
    for _ in 0..1000 {
        h.lim.acquire(E, R, &[("rpm", 1)]).await.unwrap();
    }
    assert_eq!(h.n(E, R, 0, "b_wcu_tk"), Some(0));
    h.rng.pin(0);
    h.lim.acquire(E, R, &[("rpm", 1)]).await.unwrap();
    assert_eq!(h.n(E, R, 0, "shard_count"), Some(2));
    assert!(
        h.raw.raw_get(&h.key(E, R, 1)).is_some(),
        "drawn from [1, 2), created"
    );
    assert_eq!(h.lim.stats().doublings, 1);
    // 15: propagation 4 → 8 reaches shards below 8 only.
    let s = h.lim.admin().bump_shard_count(E, R, 2).await.unwrap();
    assert_eq!(s, 4);
    for i in 2..4 {
        h.rng.pin(i);
        h.lim.acquire(E, R, &[("rpm", 1)]).await.unwrap();
    }
    h.set_n(E, R, 3, "shard_count", 8);
    assert_eq!(h.lim.admin().bump_shard_count(E, R, 4).await.unwrap(), 8);
    for i in 0..4 {
        assert_eq!(h.n(E, R, i, "shard_count"), Some(8), "shard {i}");
    }
    // 14: the cap.
    assert_eq!(h.lim.admin().bump_shard_count(E, R, 32).await.unwrap(), 32);
}

/// Scenario 11 (#480): wcu and an app limit both short, refill would not help → no
/// doubling, a rejection.
pub async fn s11_no_doubling_for_app_limits(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[Limit::per_hour("rph", 2).unwrap()]).await;
    h.lim.acquire(E, R, &[("rph", 2)]).await.unwrap();
    h.set_n(E, R, 0, "b_wcu_tk", 0);
    assert!(matches!(
        h.lim.acquire(E, R, &[("rph", 1)]).await,
        Err(Error::RateLimitExceeded(_))
    ));
    assert_eq!(h.n(E, R, 0, "shard_count"), Some(1));
}

/// Scenario 13: concurrent doublers — one CAS wins, the loser adopts the winner's count.
pub async fn s13_concurrent_doublers(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[Limit::per_minute("rpm", 10).unwrap()]).await;
    h.lim.acquire(E, R, &[("rpm", 1)]).await.unwrap();
    let other = h.slow();
    assert_eq!(h.lim.admin().bump_shard_count(E, R, 1).await.unwrap(), 2);
    assert_eq!(other.admin().bump_shard_count(E, R, 1).await.unwrap(), 2);
    assert_eq!(h.n(E, R, 0, "shard_count"), Some(2));
}

/// Scenario 16: the create race — the loser's consumption-only retry lands on the winner's
/// item.
pub async fn s16_create_race(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[Limit::per_minute("rpm", 10).unwrap()]).await;
    // The winner's item, as another client's create leaves it (3 spent).
    h.slow().acquire(E, R, &[("rpm", 3)]).await.unwrap();
    let winner = h.item(E, R, 0);
    h.raw.raw_delete(&h.key(E, R, 0));
    // Our pass reads "missing"; the winner's Put lands just before ours.
    let (lim, hk) = h.hooked(false);
    let k = h.key(E, R, 0);
    hk.stage(On::Put, Some(k.clone()), move |m| m.raw_put(&k, winner));
    let lease = lim.acquire(E, R, &[("rpm", 2)]).await.unwrap();
    assert_eq!(lease.consumed()["rpm"], 2);
    assert_eq!(
        h.n(E, R, 0, "b_rpm_tk"),
        Some(5000),
        "winner's 10 − 3, then our 2"
    );
    assert_eq!(h.n(E, R, 0, "b_rpm_tc"), Some(5000));
}

/// Scenario 17 and S5: probing at most 2 untried shards; a drained shard is passed over.
pub async fn s17_s5_shard_probes(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[Limit::per_hour("rph", 400).unwrap()]).await;
    h.lim.acquire(E, R, &[("rph", 0)]).await.unwrap();
    h.lim.admin().bump_shard_count(E, R, 1).await.unwrap();
    h.lim.admin().bump_shard_count(E, R, 2).await.unwrap();
    for i in 1..4 {
        h.rng.pin(i);
        h.lim.acquire(E, R, &[("rph", 0)]).await.unwrap();
    }
    // Shards hold 100 each (0 keeps its old 400 until clamped). Drain 0, 1, 2.
    for i in 0..3 {
        h.set_n(E, R, i, "b_rph_tk", 0);
    }
    h.rng.pin(0);
    let s = h.stats();
    let r = h.lim.acquire(E, R, &[("rph", 1)]).await;
    let d = h.stats().since(&s);
    assert!(
        d.updates <= 3,
        "at most the drawn shard and 2 probes: {d:?}"
    );
    match r {
        Ok(_) => assert_eq!(h.n(E, R, 3, "b_rph_tk"), Some(99_000)),
        Err(x) => {
            // The two probes missed shard 3: refused with the entity's statuses.
            let st = &x.exceeded().unwrap().statuses[0];
            assert_eq!((st.capacity, st.available), (400, 100));
        }
    }
    // S5: two shards of 100 each; shard 0 drained by 100 single-token writes; a draw of
    // shard 0 is admitted through a probe of shard 1; with both drained, a rejection.
    let h = b.harness(T0).await;
    limits(&h, &[Limit::per_hour("rph", 200).unwrap()]).await;
    h.lim.acquire(E, R, &[("rph", 0)]).await.unwrap();
    h.lim.admin().bump_shard_count(E, R, 1).await.unwrap();
    h.rng.pin(1);
    h.lim.acquire(E, R, &[("rph", 0)]).await.unwrap();
    h.rng.pin(0);
    for _ in 0..100 {
        h.lim.acquire(E, R, &[("rph", 1)]).await.unwrap();
    }
    assert_eq!(h.tks(E, R, "rph", 2), vec![0, 100_000]);
    h.lim.acquire(E, R, &[("rph", 1)]).await.unwrap();
    assert_eq!(h.tks(E, R, "rph", 2), vec![0, 99_000]);
    h.set_n(E, R, 1, "b_rph_tk", 0);
    assert!(h.lim.acquire(E, R, &[("rph", 1)]).await.is_err());
}

/// S6: wcu is invisible — never in statuses, never adjustable.
pub async fn s6_wcu_is_invisible(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[Limit::per_minute("rpm", 1).unwrap()]).await;
    let mut l = h.lim.acquire(E, R, &[("rpm", 1)]).await.unwrap();
    assert!(l.statuses().iter().all(|s| s.limit != "wcu"));
    assert!(l.adjust("wcu", 1).is_err());
    let x = h.lim.acquire(E, R, &[("rpm", 1)]).await.unwrap_err();
    assert!(x
        .exceeded()
        .unwrap()
        .statuses
        .iter()
        .all(|s| s.limit != "wcu"));
    let a = h
        .lim
        .check_availability(E, R, crate::Amounts::new())
        .await
        .unwrap();
    assert!(a.limits.iter().all(|s| s.limit != "wcu"));
}

/// S9: GSI3 finds every bucket of an entity.
pub async fn s9_gsi3_discovery(b: &Backend) {
    let h = b.harness(T0).await;
    for r in ["gpt-4", "gpt-3.5"] {
        h.lim
            .admin()
            .set_limits(
                &Scope::Resource(r.into()),
                &[Limit::per_minute("rpm", 10).unwrap()],
            )
            .await
            .unwrap();
        h.rng.pin(0);
        h.lim.acquire(E, r, &[("rpm", 1)]).await.unwrap();
        h.lim.admin().bump_shard_count(E, r, 1).await.unwrap();
        h.rng.pin(1);
        h.lim.acquire(E, r, &[("rpm", 1)]).await.unwrap();
    }
    use tollgate_store::{Query, Store};
    let items = h
        .store
        .query(Query::index("GSI3", "default/ENTITY#e", Some("BUCKET#")))
        .await
        .unwrap();
    let mut sks: Vec<String> = items
        .iter()
        .map(|i| i["GSI3SK"].as_s().unwrap().to_string())
        .collect();
    sks.sort();
    assert_eq!(
        sks,
        [
            "BUCKET#gpt-3.5#0",
            "BUCKET#gpt-3.5#1",
            "BUCKET#gpt-4#0",
            "BUCKET#gpt-4#1"
        ]
    );
    assert_eq!(h.lim.admin().delete_entity(E).await.unwrap(), 4);
}

/// S10: refill recovery on both paths.
pub async fn s10_refill_recovery(b: &Backend) {
    for fast in [true, false] {
        let mut o = opts();
        o.speculative = fast;
        let h = b.harness_with(T0, o).await;
        limits(
            &h,
            &[Limit::rate("rpm", 100, 100, Duration::from_secs(1)).unwrap()],
        )
        .await;
        h.lim.acquire(E, R, &[("rpm", 100)]).await.unwrap();
        let x = h.lim.acquire(E, R, &[("rpm", 100)]).await.unwrap_err();
        assert!(x.exceeded().unwrap().retry_after_ms.unwrap() > 0);
        h.at(T0 + 1100);
        let l = h.lim.acquire(E, R, &[("rpm", 50)]).await.unwrap();
        assert_eq!(l.consumed()["rpm"], 50);
    }
}

/// S11, as tollgate conserves it: a dripping limit on a new shard is split off its covering
/// sibling (the original gave it a full share, minting one: 998 spent of 1000, then 500 more
/// on the new shard). Shard 0 keeps half of its balance, the new shard gets the other half.
pub async fn s11_dripping_on_new_shard(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[Limit::per_minute("rpm", 1000).unwrap()]).await;
    h.lim.acquire(E, R, &[("rpm", 996)]).await.unwrap();
    h.lim.admin().bump_shard_count(E, R, 1).await.unwrap();
    h.rng.pin(1);
    let s = h.stats();
    h.lim.acquire(E, R, &[("rpm", 1)]).await.unwrap();
    assert_eq!(
        h.stats().since(&s).batch_gets,
        1,
        "the new shard reads its siblings to find the one it splits"
    );
    assert_eq!(h.tks(E, R, "rpm", 2), vec![2000, 1000]);
    assert_eq!(h.n(E, R, 0, "b_rpm_gc"), Some(2));
    assert_eq!(h.n(E, R, 1, "b_rpm_gc"), Some(2));
}

/// Scenario 18: draws are random over every shard.
pub async fn s18_random_selection(b: &Backend) {
    let h = b.harness(T0).await;
    let store = h.store.clone();
    let lim = crate::Limiter::builder(store.clone())
        .clock(h.clock.clone())
        .rng(Arc::new(crate::SeededRng::new(7)))
        .build()
        .unwrap();
    lim.admin()
        .set_limits(
            &Scope::Entity(E.into(), Some(R.into())),
            &[Limit::per_minute("rpm", 100_000).unwrap()],
        )
        .await
        .unwrap();
    lim.acquire(E, R, &[("rpm", 1)]).await.unwrap();
    lim.admin().bump_shard_count(E, R, 1).await.unwrap();
    lim.admin().bump_shard_count(E, R, 2).await.unwrap();
    for _ in 0..64 {
        lim.acquire(E, R, &[("rpm", 1)]).await.unwrap();
    }
    for s in 0..4 {
        let k = tollgate_core::keys::bucket("default", E, R, s);
        let tc = h
            .raw
            .raw_get(&k)
            .and_then(|i| i.get("b_rpm_tc").and_then(Value::as_n))
            .unwrap_or(0);
        assert!(tc > 0, "shard {s} never drawn");
    }
}

/// Availability and rejections speak of the entity: capacity and availability summed over
/// shards (#475); a request larger than one shard's share is admitted across shards when
/// the entity can pay, and refused — with what the entity has — when it cannot.
pub async fn entity_wide_statuses(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[rpd()]).await;
    h.lim.acquire(E, R, &[("rpd", 0)]).await.unwrap();
    h.lim.admin().bump_shard_count(E, R, 1).await.unwrap();
    h.rng.pin(1);
    h.lim.acquire(E, R, &[("rpd", 100)]).await.unwrap();
    let a = h.lim.check_availability(E, R, &[("rpd", 1)]).await.unwrap();
    assert_eq!((a.limits[0].capacity, a.limits[0].available), (1000, 900));
    assert!(a.allowed);
    // 600 > the 400 left on shard 1: 400 from it and 200 from shard 0, one transaction.
    let l = h.lim.acquire(E, R, &[("rpd", 600)]).await.unwrap();
    assert_eq!(l.consumed()["rpd"], 600);
    assert_eq!(h.spendable(E, R, "rpd", 2), 300);
    let x = h.lim.acquire(E, R, &[("rpd", 301)]).await.unwrap_err();
    let st = &x.exceeded().unwrap().statuses[0];
    assert_eq!((st.capacity, st.available, st.exceeded), (1000, 300, true));
    assert!(st.retry_after_ms.is_some(), "fits after the reset");
}

/// Doubling conserves a dripping allowance: the old shard keeps its whole family's balance
/// until a new shard splits it off, so spending on shard 0 right after doubling to 32 is the
/// entity's own allowance, and spending over every shard still admits exactly the capacity
/// (the clock does not move: no refill).
pub async fn doubling_clamps_old_shards_to_the_new_share(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[Limit::per_hour("rph", 320).unwrap()]).await;
    h.lim.acquire(E, R, &[("rph", 0)]).await.unwrap();
    let mut s = 1;
    while s < 32 {
        s = h.lim.admin().bump_shard_count(E, R, s).await.unwrap();
    }
    h.rng.pin(0);
    let mut on_shard_0 = 0;
    for _ in 0..40 {
        if h.lim.acquire(E, R, &[("rph", 1)]).await.is_ok() {
            on_shard_0 += 1;
        }
    }
    assert_eq!(on_shard_0, 40);
    let mut admitted = on_shard_0;
    for i in 0..400u32 {
        h.rng.pin((i * 7) % 32);
        if h.lim.acquire(E, R, &[("rph", 1)]).await.is_ok() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 320, "exactly the capacity, over every shard");
}

/// Stage shard `s` in window `ws` (applied), with grant `gc`, balance `tk`, `rf = rf`.
fn stage_window(h: &H, s: u32, ws: i64, rf: i64, gc: i64, tk_milli: i64) {
    h.set_n(E, R, s, "b_session_ws", ws);
    h.set_n(E, R, s, "b_session_wa", ws);
    h.set_n(E, R, s, "b_session_gc", gc);
    h.set_n(E, R, s, "b_session_tk", tk_milli);
    h.set_n(E, R, s, "rf", rf);
    h.set_n(E, R, s, "vu", ws + W);
    h.set_n(E, R, s, "shard_count", 4);
}

/// Shards 0 and 1 in window T0 (scenario 27), then the count doubled to 4.
async fn four_shards(b: &Backend) -> H {
    let h = b.harness(T0).await;
    limits(&h, &[session()]).await;
    h.lim.acquire(E, R, &[("session", 1)]).await.unwrap();
    h.lim.admin().bump_shard_count(E, R, 1).await.unwrap();
    h.at(T0 + 60_000);
    h.rng.pin(1);
    h.lim.acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!(h.lim.admin().bump_shard_count(E, R, 2).await.unwrap(), 4);
    h
}

/// Staggered windows, join (simulator seed 4136; ADR-139/140 × ADR-145): shard 0 is in an
/// older staggered window S0 = T1 + 30 min, shard 1 already opened a later one B. A slot
/// created now adopts B, the newest live start. Joining S0 late would put slot 3's share
/// into the phase starting at T1, where shard 1 (gc 2 then) had already held it.
pub async fn stagger_join_newest_live_start(b: &Backend) {
    let h = four_shards(b).await;
    let s0 = T1 + 1_800_000;
    let later = T1 + W + 300_000;
    stage_window(&h, 0, s0, s0, 4, 2500);
    stage_window(&h, 1, later, later, 4, 2500);
    let now = T1 + W + 600_000;
    h.at(now);
    warm(&h.slow()).await;
    h.rng.pin(3);
    h.slow().acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!(
        h.n(E, R, 3, "b_session_ws"),
        Some(later),
        "newest live start"
    );
    assert_eq!(h.n(E, R, 3, "b_session_wa"), Some(later));
    assert_eq!(h.n(E, R, 3, "vu"), Some(later + W));
    assert_eq!(tk(&h, 3), 1500, "uncovered: a fresh quarter share, less 1");
    assert_eq!(
        h.n(E, R, 0, "b_session_ws"),
        Some(s0),
        "a join fans nothing out"
    );
}

/// Staggered windows, cover (ADR-139/140 × ADR-145): shard 1's applied window T1 (gc 2,
/// covering slots 1 and 3) ended, but it overlapped the live window S0 that slot 3 joins. In
/// that phase slot 3's allowance was already shard 1's: slot 3 joins with nothing, and
/// shard 1's dead balance is not moved. (A fresh share here is the double grant the
/// simulator found as 18 of 16 at seed 6722.)
pub async fn stagger_dead_cover_grants_nothing(b: &Backend) {
    let h = four_shards(b).await;
    let s0 = T1 + 1_800_000;
    stage_window(&h, 0, s0, s0, 4, 2500);
    stage_window(&h, 1, T1, T1 + 60_000, 2, 3000);
    let now = T1 + W + 600_000;
    h.at(now);
    warm(&h.slow()).await;
    h.rng.pin(3);
    h.slow().acquire(E, R, &[("session", 0)]).await.unwrap();
    assert_eq!(h.n(E, R, 3, "b_session_ws"), Some(s0));
    assert_eq!(tk(&h, 3), 0, "covered in this phase: nothing granted");
    assert_eq!(h.n(E, R, 3, "b_session_gc"), Some(4));
    assert_eq!(tk(&h, 1), 3000, "a dead balance is never moved");
    // Slot 2: no sibling covers it (shard 0's gc 4 covers only slot 0) — a fresh quarter.
    h.rng.pin(2);
    h.slow().acquire(E, R, &[("session", 0)]).await.unwrap();
    assert_eq!(tk(&h, 2), 2500);
}

/// Scenario 35: a corrupt `ws` on a sibling is met by the create's sibling read — a typed
/// error naming `b_session_ws` (the original raised RateLimiterUnavailable; a corrupt item
/// is not an outage, so tollgate says `Corrupt`), and nothing is written.
pub async fn s35_corrupt_sibling_ws(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[session()]).await;
    h.lim.acquire(E, R, &[("session", 1)]).await.unwrap();
    h.lim.admin().bump_shard_count(E, R, 1).await.unwrap();
    let k = h.key(E, R, 0);
    let mut i = h.item(E, R, 0);
    i.insert("b_session_ws".into(), Value::S("1.5".into()));
    h.raw.raw_put(&k, i);
    h.at(T0 + 60_000);
    h.rng.pin(1);
    let e = h.slow().acquire(E, R, &[("session", 1)]).await.unwrap_err();
    assert!(matches!(e, Error::Corrupt(_)), "{e}");
    assert!(e.to_string().contains("b_session_ws"), "{e}");
    assert!(
        h.raw.raw_get(&h.key(E, R, 1)).is_none(),
        "shard 1 not created"
    );
}

/// Two quotas funded by one donor (ADR-145): a session window and a daily quota on one
/// item both move from shard 0 when shard 1 is created — in one transaction that debits
/// shard 0 once for both (a transaction may address an item only once; two debit operations
/// made every create fail, found by the simulator).
pub async fn two_quotas_move_from_one_donor(b: &Backend) {
    let h = b.harness(T0).await;
    let daily = Limit::quota_calendar("rpd", 1000, "0 0 * * *", "UTC").unwrap();
    limits(&h, &[session(), daily]).await;
    h.lim
        .acquire(E, R, &[("session", 1), ("rpd", 1)])
        .await
        .unwrap();
    h.lim.admin().bump_shard_count(E, R, 1).await.unwrap();
    h.at(T0 + 60_000);
    h.rng.pin(1);
    let before = h.stats();
    h.lim
        .acquire(E, R, &[("session", 1), ("rpd", 1)])
        .await
        .unwrap();
    assert_eq!(h.stats().since(&before).transactions, 1);
    assert_eq!(h.tks(E, R, "session", 2), vec![4000, 4000]);
    assert_eq!(h.tks(E, R, "rpd", 2), vec![499_000, 499_000]);
    assert_eq!(
        h.n(E, R, 1, "b_session_ws"),
        Some(T0),
        "joined the live window"
    );
}
