//! The aggregator (§4.7 Paths 1 and 2, §4.11): the refill pass, proactive doubling and
//! Path-2 clones (scenarios 52, 53, 54, 60, 80; W11, Q9), and the pins of its refill write.
#![allow(missing_docs)]

use std::sync::Arc;

use super::sharded::{limits, rpd, session, tk, two, E, R, T1};
use crate::testing::hook::On;
use crate::testing::*;
use crate::{Aggregator, Limit};
use tollgate_core::value::Value;

/// Run `f` to completion from inside a staged hook action (which is synchronous): lands
/// another writer's async work between a pass's read and its write.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

/// Make shard 0 look hot to the proactive-doubling projection: `wcu` spent, refill baseline
/// at `now` (so nothing has dripped back).
fn hot(h: &H, now: i64) {
    h.set_n(E, R, 0, "b_wcu_tk", 0);
    h.set_n(E, R, 0, "rf", now);
}

/// Scenario 52: a Path-2 clone of a shard with a pending roll (`wa = T0`, `ws = T1`,
/// `wtc = 7000`) copies `ws`, `rsa`, `rf`, `vu`, `wa` verbatim and restarts the snapshot:
/// `tc = 0`, `wtc = 0`.
pub async fn s52_clone_of_a_pending_shard_restarts_the_snapshot(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[session()]).await;
    h.lim.acquire(E, R, &[("session", 3)]).await.unwrap();
    h.set_n(E, R, 0, "b_session_tc", 7000);
    h.set_n(E, R, 0, "b_session_wtc", 7000);
    h.set_n(E, R, 0, "b_session_ws", T1);
    h.set_n(E, R, 0, "vu", 0);
    assert_eq!(h.lim.admin().bump_shard_count(E, R, 1).await.unwrap(), 2);
    h.at(T1 + 1000);
    let agg = Aggregator::new(&h.lim);
    let rep = agg.clone_missing_shards(E, R, 1).await.unwrap();
    assert_eq!(rep.cloned, [1]);
    let (s0, s1) = (h.item(E, R, 0), h.item(E, R, 1));
    for a in ["b_session_ws", "b_session_rsa", "b_session_wa", "rf", "vu"] {
        assert_eq!(s1.get(a), s0.get(a), "{a} copied verbatim");
    }
    assert_eq!(h.n(E, R, 1, "b_session_wa"), Some(T0));
    assert_eq!(h.n(E, R, 1, "b_session_tc"), Some(0));
    assert_eq!(h.n(E, R, 1, "b_session_wtc"), Some(0));
    assert_eq!(h.n(E, R, 1, "shard_count"), Some(2));
}

/// Scenario 53 and W11: a fan-out puts `ws = T1` on shard 0 (`rf < T1`, `vu = 0`), the
/// aggregator doubles proactively and clones shard 1 (copying `ws`, `rf`, `vu = 0`). After
/// both shards rolled — by a client, or by the aggregator first — and whether 0 or 8 had
/// been spent in the old window: admitted (2) + spendable == 10.
pub async fn s53_w11_clone_of_an_unapplied_shard_rolls_to_one_allowance(b: &Backend) {
    for by_aggregator in [false, true] {
        for spent in [0, 8] {
            let h = b.harness(T0).await;
            limits(&h, &[session()]).await;
            h.lim.acquire(E, R, &[("session", spent)]).await.unwrap();
            // The fan-out of T1 onto shard 0: start, snapshot, forced slow path.
            h.set_n(E, R, 0, "b_session_ws", T1);
            h.set_n(E, R, 0, "b_session_wtc", spent * 1000);
            h.set_n(E, R, 0, "vu", 0);
            h.at(T1 + 5000);
            hot(&h, T1 + 5000);
            let agg = Aggregator::new(&h.lim);
            let rep = agg.maybe_double(E, R).await.unwrap();
            assert_eq!(rep.doubled, Some((1, 2)));
            assert_eq!(rep.cloned, [1]);
            assert_eq!(h.n(E, R, 1, "b_session_ws"), Some(T1));
            assert_eq!(
                h.n(E, R, 1, "b_session_wa"),
                Some(T0),
                "pending, as shard 0"
            );
            assert_eq!(h.n(E, R, 1, "rf"), Some(T1 + 5000));
            assert_eq!(h.n(E, R, 1, "vu"), Some(0));
            if by_aggregator {
                let rep = agg.refill_entity(E, R).await.unwrap();
                assert_eq!(
                    rep.rolled, 1,
                    "shard 0 rolls; the clone already holds its share"
                );
                assert_eq!(tk(&h, 0), 5000);
                assert_eq!(h.n(E, R, 0, "b_session_wa"), Some(T1));
            }
            h.at(T1 + 10_000);
            for shard in [0, 1] {
                h.rng.pin(shard);
                h.slow().acquire(E, R, &[("session", 1)]).await.unwrap();
                assert_eq!(h.n(E, R, shard, "b_session_wa"), Some(T1), "shard {shard}");
            }
            assert_eq!(
                2 + h.spendable(E, R, "session", 2),
                10,
                "aggregator {by_aggregator}, spent {spent}"
            );
        }
    }
}

/// Scenario 54, aggregator half: one shard, acquire 3 at T0 (tk 7000, wa T0); an old
/// writer stamps `rf = T0 − 5000`; the aggregator at T0 + 1000 sees the window applied
/// (`wa`) and writes nothing: tk stays 7000.
pub async fn s54_aggregator_leaves_a_backward_rf_alone(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[session()]).await;
    h.lim.acquire(E, R, &[("session", 3)]).await.unwrap();
    h.set_n(E, R, 0, "rf", T0 - 5000);
    h.at(T0 + 1000);
    let rep = Aggregator::new(&h.lim).refill_entity(E, R).await.unwrap();
    assert_eq!((rep.shards_read, rep.writes, rep.rolled), (1, 0, 0));
    assert_eq!(tk(&h, 0), 7000);
    assert_eq!(h.n(E, R, 0, "rf"), Some(T0 - 5000));
}

/// Scenario 60: TWO(0) with shard 1's `wa` removed; the aggregator at T1 + 120,000 rolls
/// it (by `ws > rf`) to 5000 − max(0, 1000 − 1000) and marks `wa = T1`.
pub async fn s60_aggregator_marks_an_unmarked_roll(b: &Backend) {
    let h = b.harness(T0).await;
    two(&h, 0).await;
    h.remove(E, R, 1, "b_session_wa");
    h.at(T1 + 120_000);
    let rep = Aggregator::new(&h.lim).refill_entity(E, R).await.unwrap();
    assert_eq!((rep.rolled, rep.refilled_items, rep.lost), (1, 1, 0));
    assert_eq!(h.n(E, R, 1, "b_session_wa"), Some(T1));
    assert_eq!(tk(&h, 1), 5000);
    assert_eq!(h.n(E, R, 1, "b_session_gc"), Some(2));
    assert!(h.n(E, R, 1, "rf").unwrap() >= T1);
    assert_eq!(h.n(E, R, 1, "vu"), Some(T1 + W));
    // Applied now: a second pass has nothing to do.
    let rep = Aggregator::new(&h.lim).refill_entity(E, R).await.unwrap();
    assert_eq!(rep.writes, 0);
}

/// Scenario 80 (#587 regression): the aggregator's proactive doubling walk 1 → 32 with
/// Path-2 clones, spending every shard down to 2 tokens before each doubling, never admits
/// more than C = 1000 in the period (historically 3496): admitted + spendable == 1000.
pub async fn s80_proactive_doubling_walk_with_clones(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[rpd()]).await;
    h.lim.acquire(E, R, &[("rpd", 0)]).await.unwrap();
    let agg = Aggregator::new(&h.lim);
    let mut admitted = 0;
    let mut s = 1;
    while s < 32 {
        for shard in 0..s as u32 {
            let left = h.n(E, R, shard, "b_rpd_tk").unwrap() / 1000;
            if left > 2 {
                h.rng.pin(shard);
                h.lim.acquire(E, R, &[("rpd", left - 2)]).await.unwrap();
                admitted += left - 2;
            }
        }
        hot(&h, h.n(E, R, 0, "rf").unwrap());
        let rep = agg.maybe_double(E, R).await.unwrap();
        assert_eq!(rep.doubled, Some((s, s * 2)));
        assert_eq!(rep.cloned.len() as i64, s, "every new slot cloned");
        s *= 2;
        assert!(admitted + h.spendable(E, R, "rpd", s as u32) <= 1000);
    }
    for shard in 0..32 {
        let left = h.n(E, R, shard, "b_rpd_tk").unwrap() / 1000;
        if left > 0 {
            h.rng.pin(shard);
            h.lim.acquire(E, R, &[("rpd", left)]).await.unwrap();
            admitted += left;
        }
    }
    assert_eq!(admitted, 1000);
}

/// Q9 (#633 R3): shard 0 (S = 1) lacks the quota, which is then added. A slow acquire(1)
/// seeds it, but a doubling to 2 and a Path-2 clone of shard 1 land between its read and
/// its write: the seed sized at S = 1 loses its count pin and is never written; the pass
/// re-plans at S = 2. Later passes seed shard 1 at S = 2; the period admits exactly 1000.
pub async fn q9_seed_racing_a_doubling_and_a_clone(b: &Backend) {
    let h = b.harness(T0).await;
    let rpm = Limit::per_minute("rpm", 100).unwrap();
    limits(&h, std::slice::from_ref(&rpm)).await;
    h.lim.acquire(E, R, &[("rpm", 1)]).await.unwrap();
    limits(&h, &[rpm, rpd()]).await;
    let (lim, hk) = h.hooked(false);
    let (other, agg) = (h.lim.clone(), Arc::new(Aggregator::new(&h.lim)));
    let k0 = h.key(E, R, 0);
    hk.stage(On::Update, Some(k0), move |_| {
        block_on(async {
            other.admin().bump_shard_count(E, R, 1).await.unwrap();
            let rep = agg.clone_missing_shards(E, R, 1).await.unwrap();
            assert_eq!(rep.cloned, [1]);
        })
    });
    h.rng.pin(0);
    lim.acquire(E, R, &[("rpd", 1)]).await.unwrap();
    assert!(
        h.n(E, R, 1, "b_rpd_tk").is_none(),
        "the clone had no rpd to copy"
    );
    assert_eq!(h.n(E, R, 0, "b_rpd_gc"), Some(2), "sized at S = 2, not 1");
    assert_eq!(h.n(E, R, 0, "b_rpd_tk"), Some(499_000));
    h.rng.pin(1);
    lim.acquire(E, R, &[("rpd", 1)]).await.unwrap();
    assert_eq!(h.tks(E, R, "rpd", 2), vec![499_000, 499_000]);
    assert_eq!(2 + h.spendable(E, R, "rpd", 2), 1000);
}

/// The `ws` pin (§4.11): the aggregator read shard 1 pending in window T1; before its
/// write lands, a newer fan-out (an opener whose clock is 10 s ahead) moves the window to
/// T2 = T1 + W. The aggregator's roll for T1 fails instead of restoring a window the
/// entity has left; the next client pass rolls once, into T2.
pub async fn aggregator_roll_pinned_on_ws(b: &Backend) {
    let h = b.harness(T0).await;
    two(&h, 3).await;
    let t2 = T1 + W;
    let (lim, hk) = h.hooked(false);
    let agg = Aggregator::new(&lim);
    let k1 = h.key(E, R, 1);
    hk.stage(On::Update, Some(k1.clone()), move |m| {
        let mut i = m.raw_get(&k1).unwrap();
        let tc = i["b_session_tc"].clone();
        i.insert("b_session_ws".into(), Value::N(t2));
        i.insert("b_session_wtc".into(), tc);
        i.insert("vu".into(), Value::N(0));
        m.raw_put(&k1, i);
    });
    h.at(t2 - 10_000);
    let rep = agg.refill_entity(E, R).await.unwrap();
    assert_eq!((rep.lost, rep.rolled), (1, 0));
    assert_eq!(tk(&h, 1), 3000, "no restore for window T1");
    assert_eq!(h.n(E, R, 1, "b_session_wa"), Some(T0));
    assert_eq!(h.n(E, R, 1, "vu"), Some(0), "still forced to the slow path");
    h.at(t2 + 1000);
    h.rng.pin(1);
    h.slow().acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!(h.n(E, R, 1, "b_session_wa"), Some(t2));
    assert_eq!(
        tk(&h, 1),
        4000,
        "one roll: 5000 − max(0, 1000 − 1000) − 1000"
    );
}

/// The `rf` pin (§4.11): a drained dripping bucket (100/min, tc 100) is refilled by the
/// aggregator at T0 + 30 s — but a client's slow pass that credited the same 30 s lands
/// first. The aggregator's write fails instead of crediting the same refill twice.
pub async fn aggregator_refill_pinned_on_rf(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[Limit::per_minute("rpm", 100).unwrap()]).await;
    h.lim.acquire(E, R, &[("rpm", 100)]).await.unwrap();
    let (lim, hk) = h.hooked(false);
    let agg = Aggregator::new(&lim);
    let k0 = h.key(E, R, 0);
    hk.stage(On::Update, Some(k0.clone()), move |m| {
        // The client's rf-locked write: refill 50 over 30 s, consume 1.
        let mut i = m.raw_get(&k0).unwrap();
        i.insert("rf".into(), Value::N(T0 + 30_000));
        i.insert("b_rpm_tk".into(), Value::N(49_000));
        i.insert("b_rpm_tc".into(), Value::N(101_000));
        m.raw_put(&k0, i);
    });
    h.at(T0 + 30_000);
    let rep = agg.refill_entity(E, R).await.unwrap();
    assert_eq!((rep.lost, rep.refilled), (1, 0));
    assert_eq!(h.n(E, R, 0, "b_rpm_tk"), Some(49_000));
    // Unraced, the same pass refills the drained bucket: 30 s more is 50 more.
    h.at(T0 + 60_000);
    let rep = Aggregator::new(&h.lim).refill_entity(E, R).await.unwrap();
    assert_eq!(rep.refilled, 1);
    assert_eq!(h.n(E, R, 0, "b_rpm_tk"), Some(99_000));
}

/// The shard-0 count pin (ADR-145 R5, the Q9/Q14 shape on the aggregator): shard 0 (S = 1)
/// holds 100 at midnight + 1 s; the aggregator's reset sized at S = 1 races a doubling to 2
/// and a Path-2 clone of shard 1 (a fresh 500: shard 0's grant is not current). The stale
/// reset (1000 at gc 1) is never written; the next pass resets at S = 2: exactly 1000.
pub async fn aggregator_reset_pinned_on_the_shard_count(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[rpd()]).await;
    h.lim.acquire(E, R, &[("rpd", 900)]).await.unwrap();
    let midnight = 1_757_030_400_000;
    h.at(midnight + 1000);
    h.set_n(E, R, 0, "vu", 0); // forced slow already: the doubling leaves vu as it was
    let (lim, hk) = h.hooked(false);
    let agg = Aggregator::new(&lim);
    let (other, cloner) = (h.lim.clone(), Arc::new(Aggregator::new(&h.lim)));
    let k0 = h.key(E, R, 0);
    hk.stage(On::Update, Some(k0), move |_| {
        block_on(async {
            other.admin().bump_shard_count(E, R, 1).await.unwrap();
            let rep = cloner.clone_missing_shards(E, R, 1).await.unwrap();
            assert_eq!(rep.cloned, [1]);
        })
    });
    let rep = agg.refill_entity(E, R).await.unwrap();
    assert_eq!((rep.lost, rep.reset), (1, 0));
    assert_eq!(h.tks(E, R, "rpd", 2), vec![100_000, 500_000]);
    let rep = agg.refill_entity(E, R).await.unwrap();
    assert_eq!(rep.reset, 1);
    assert_eq!(h.n(E, R, 0, "b_rpd_gc"), Some(2));
    assert_eq!(h.tks(E, R, "rpd", 2), vec![500_000, 500_000]);
}

/// Rule "a reset is a SET" on the aggregator: a refund of yesterday's debit lands between
/// the aggregator's read and its reset write. The reset pinned on the balance read fails
/// rather than carry the refund across the edge; the next pass resets to exactly 1000.
pub async fn aggregator_reset_is_a_set_despite_a_concurrent_refund(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[rpd()]).await;
    h.lim.acquire(E, R, &[("rpd", 900)]).await.unwrap();
    h.at(1_757_030_400_000 + 1000);
    let (lim, hk) = h.hooked(false);
    let agg = Aggregator::new(&lim);
    let k0 = h.key(E, R, 0);
    hk.stage(On::Update, Some(k0.clone()), move |m| {
        let mut i = m.raw_get(&k0).unwrap();
        i.insert("b_rpd_tk".into(), Value::N(150_000));
        i.insert("b_rpd_tc".into(), Value::N(850_000));
        m.raw_put(&k0, i);
    });
    let rep = agg.refill_entity(E, R).await.unwrap();
    assert_eq!((rep.lost, rep.reset), (1, 0));
    let rep = agg.refill_entity(E, R).await.unwrap();
    assert_eq!(rep.reset, 1);
    assert_eq!(h.n(E, R, 0, "b_rpd_tk"), Some(1_000_000));
}

/// §4.11: an item with a pending window that has already ended is skipped whole — not even
/// its other limits are written (here a dripping balance above its ceiling) — and left for
/// a client, which opens a fresh window.
pub async fn aggregator_skips_an_item_whose_pending_window_ended(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[session(), Limit::per_minute("rpm", 100).unwrap()]).await;
    h.lim
        .acquire(E, R, &[("session", 1), ("rpm", 1)])
        .await
        .unwrap();
    let t = T0 + 1000;
    h.set_n(E, R, 0, "b_session_ws", t);
    h.set_n(E, R, 0, "b_session_wtc", 1000);
    h.set_n(E, R, 0, "vu", 0);
    h.set_n(E, R, 0, "b_rpm_tk", 150_000);
    let before = h.item(E, R, 0);
    h.at(t + W);
    let rep = Aggregator::new(&h.lim).refill_entity(E, R).await.unwrap();
    assert_eq!((rep.skipped, rep.writes), (1, 0));
    assert_eq!(h.item(E, R, 0), before, "the item is left untouched");
    // One millisecond earlier the same pending window is live: rolled (and rpm clamped).
    h.raw.raw_put(&h.key(E, R, 0), before);
    h.at(t + W - 1);
    let rep = Aggregator::new(&h.lim).refill_entity(E, R).await.unwrap();
    assert_eq!((rep.rolled, rep.clamped), (1, 1));
    assert_eq!(tk(&h, 0), 10_000);
}

/// The `vu` pin (§4.11): the aggregator read an item whose `vu` an old writer removed and
/// plans a clamp (rpm above its ceiling) with a `vu` restamp at the end of the live window
/// T0. A fan-out of a newer window (an opener 10 s ahead) lands first, setting `vu = 0` so
/// the next acquire rolls on the slow path. The aggregator's write fails rather than lift
/// that `vu = 0` and reopen the fast path on a shard with a pending roll.
pub async fn aggregator_restamp_pinned_on_vu(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[session(), Limit::per_minute("rpm", 100).unwrap()]).await;
    h.lim
        .acquire(E, R, &[("session", 1), ("rpm", 1)])
        .await
        .unwrap();
    h.set_n(E, R, 0, "rf", T0 + 500);
    h.remove(E, R, 0, "vu");
    h.set_n(E, R, 0, "b_rpm_tk", 150_000);
    let (lim, hk) = h.hooked(false);
    let agg = Aggregator::new(&lim);
    let k0 = h.key(E, R, 0);
    hk.stage(On::Update, Some(k0.clone()), move |m| {
        let mut i = m.raw_get(&k0).unwrap();
        let tc = i["b_session_tc"].clone();
        i.insert("b_session_ws".into(), Value::N(T0 + W));
        i.insert("b_session_wtc".into(), tc);
        i.insert("vu".into(), Value::N(0));
        m.raw_put(&k0, i);
    });
    h.at(T0 + W - 10_000);
    let rep = agg.refill_entity(E, R).await.unwrap();
    assert_eq!((rep.lost, rep.clamped), (1, 0));
    assert_eq!(h.n(E, R, 0, "vu"), Some(0));
    assert_eq!(h.n(E, R, 0, "b_rpm_tk"), Some(150_000));
}
