//! Scenarios that had no test yet: the calendar edge through the fast path (81), the quota
//! ceiling of an ancestor grant (79), pre-v0.15 stamps both ways (55, 56), when the
//! rollover fan-out runs (W13), reporting (W18), windows and the write's own reading (W12),
//! the quota walk with spending (Q5) and transaction conflicts on a move (Q11).
#![allow(missing_docs)]

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::value::Value;
use tollgate_store::{CancelReason, StoreError, TransactOp};

use crate::testing::hook::On;
use crate::testing::intercept::Intercept;
use crate::testing::*;
use crate::{Error, Limit, Limiter, OnUnavailable, Options, Scope};

const T1: i64 = T0 + W + 1000;
const E: &str = "e";
const R: &str = "llm";
/// The first UTC midnight after T0 (T0 is 15:33:20 UTC).
const MIDNIGHT: i64 = 1_757_030_400_000;
const DAY: i64 = 86_400_000;

fn session() -> Limit {
    Limit::quota_after("session", 10, Duration::from_secs(18_000)).unwrap()
}

fn rpd() -> Limit {
    Limit::quota_calendar("rpd", 1000, "0 0 * * *", "UTC").unwrap()
}

async fn limits(h: &H, l: &[Limit]) {
    h.lim
        .admin()
        .set_limits(&Scope::Entity(E.into(), Some(R.into())), l)
        .await
        .unwrap();
}

/// Make a client learn the entity's shard count (a CAS that loses adopts the stored count).
async fn warm(l: &Limiter) {
    l.admin().bump_shard_count(E, R, 1).await.unwrap();
}

fn tk(h: &H, shard: u32) -> i64 {
    h.n(E, R, shard, "b_session_tk").unwrap()
}

fn rejected(r: Result<crate::Lease, Error>) -> Box<crate::Exceeded> {
    match r {
        Err(Error::RateLimitExceeded(x)) => x,
        Err(e) => panic!("expected a rejection, got {e}"),
        Ok(_) => panic!("expected a rejection, got a lease"),
    }
}

/// Rollover fan-out writes attempted by a client (landed or refused).
fn fanouts(l: &Limiter) -> u64 {
    let s = l.stats();
    s.fanout_writes + s.fanout_failures
}

/// TWO(leftover) of spec §5, as in sharded.rs: shard 0 opened T1 and fanned out to shard 1
/// (`ws = T1`, `wa = T0`, `vu = 0`, `wtc = 1000`, tk = leftover).
async fn two(h: &H, leftover: i64) {
    limits(h, &[session()]).await;
    h.at(T0);
    h.lim.acquire(E, R, &[("session", 0)]).await.unwrap();
    assert_eq!(h.lim.admin().bump_shard_count(E, R, 1).await.unwrap(), 2);
    h.at(T0 + 1000);
    h.rng.pin(1);
    h.lim.acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!((tk(h, 0), tk(h, 1)), (5000, 4000));
    h.set_n(E, R, 1, "b_session_tk", leftover * 1000);
    h.at(T1);
    h.rng.pin(0);
    h.slow().acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!(h.n(E, R, 1, "b_session_ws"), Some(T1));
    assert_eq!(h.n(E, R, 1, "b_session_wa"), Some(T0));
}

/// A pre-v0.15 writer's normal write on a bucket carrying a window it cannot see:
/// `SET rf = :its_clock REMOVE vu`.
fn old_writer(h: &H, shard: u32, rf: i64) {
    h.set_n(E, R, shard, "rf", rf);
    h.remove(E, R, shard, "vu");
}

/// Scenario 81: a daily quota (`0 0 * * *` UTC, 10 tokens, S = 1) spent at 23:59:59; at
/// 00:00:00.000 the fast write fails on its `vu` guard (vu = midnight, half-open), the slow
/// path sees the edge past the shard's period and resets: 10000 − 1000, `vu` = next midnight.
pub async fn s81_daily_quota_at_midnight(b: &Backend) {
    let h = b.harness(MIDNIGHT - 1000).await;
    let daily = Limit::quota_calendar("daily", 10, "0 0 * * *", "UTC").unwrap();
    limits(&h, &[daily]).await;
    h.lim.acquire(E, R, &[("daily", 9)]).await.unwrap();
    h.lim.acquire(E, R, &[("daily", 1)]).await.unwrap();
    assert_eq!(
        h.lim.stats().fast_admits,
        1,
        "the second spend took the fast path"
    );
    assert_eq!(h.n(E, R, 0, "b_daily_tk"), Some(0));
    assert_eq!(h.n(E, R, 0, "vu"), Some(MIDNIGHT));
    rejected(h.lim.acquire(E, R, &[("daily", 1)]).await);
    h.at(MIDNIGHT);
    let (before, reqs) = (h.lim.stats(), h.stats());
    h.lim.acquire(E, R, &[("daily", 1)]).await.unwrap();
    let (after, d) = (h.lim.stats(), h.stats().since(&reqs));
    assert_eq!(
        after.fast_admits, before.fast_admits,
        "past vu: no fast write"
    );
    assert_eq!(after.slow_admits, before.slow_admits + 1);
    assert_eq!(
        d.updates, 1,
        "this client's last image is past its vu: the normal write, planned from it: {d:?}"
    );
    assert_eq!(h.n(E, R, 0, "b_daily_tk"), Some(9000));
    assert_eq!(h.n(E, R, 0, "b_daily_tc"), Some(11_000));
    assert_eq!(h.n(E, R, 0, "vu"), Some(MIDNIGHT + DAY));
}

/// Scenario 79 (ADR-145 ceiling): a quota shard granted at gc = 1 keeps a ceiling of C // 1
/// on S = 4 — it may hold (and spend) up to C, never clamped to C // 4 — until its next
/// reset sizes it at S (then gc = 4, ceiling C // 4).
pub async fn s79_ceiling_until_reset(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[rpd()]).await;
    h.lim.acquire(E, R, &[("rpd", 0)]).await.unwrap();
    assert_eq!(h.lim.admin().bump_shard_count(E, R, 1).await.unwrap(), 2);
    assert_eq!(h.lim.admin().bump_shard_count(E, R, 2).await.unwrap(), 4);
    warm(&h.slow()).await;
    h.rng.pin(0);
    h.slow().acquire(E, R, &[("rpd", 1)]).await.unwrap();
    assert_eq!(
        h.n(E, R, 0, "b_rpd_tk"),
        Some(999_000),
        "not clamped to 250"
    );
    assert_eq!(h.n(E, R, 0, "b_rpd_gc"), Some(1));
    // It spends beyond a share of 250 on its own.
    h.lim.acquire(E, R, &[("rpd", 600)]).await.unwrap();
    assert_eq!(h.n(E, R, 0, "b_rpd_tk"), Some(399_000));
    let a = h
        .lim
        .check_availability(E, R, crate::Amounts::new())
        .await
        .unwrap();
    assert_eq!(a.limits[0].available, 399);
    // The next period: reset to the share at S = 4.
    h.at(MIDNIGHT + 1000);
    h.slow().acquire(E, R, &[("rpd", 1)]).await.unwrap();
    assert_eq!(h.n(E, R, 0, "b_rpd_tk"), Some(249_000));
    assert_eq!(h.n(E, R, 0, "b_rpd_gc"), Some(4));
    assert!(h.slow().acquire(E, R, &[("rpd", 250)]).await.is_err());
}

/// Scenarios 55 and 56 (§5.7). 55 is missing from the notes; reconstructed from §5.7,
/// ADR-139 §wa and scenario 47 as: TWO(0), an old writer stamps shard 1 *forward*
/// (`rf = T1 + 60,000`, past the fanned-out start) → the acquire at T1 + 120,000 still
/// rolls (the marker, not rf, decides): tk 4000, `wa = T1`, one admitted. 56 continues it:
/// an old writer stamps `rf = T1 − 10,000` (backward; no second roll), acquire at
/// T1 + 180,000; it stamps `rf = T1 + 999,000` (ahead of the clock), acquire at
/// T1 + 240,000 → 3 admitted in window T1 on shard 1, tk 2000, `wa = T1`. Both clients.
pub async fn s55_s56_old_writer_stamps_both_ways(b: &Backend) {
    for fast in [true, false] {
        let h = b.harness(T0).await;
        two(&h, 0).await;
        let lim = if fast { h.lim.clone() } else { h.slow() };
        warm(&lim).await;
        h.rng.pin(1);
        old_writer(&h, 1, T1 + 60_000);
        h.at(T1 + 120_000);
        lim.acquire(E, R, &[("session", 1)]).await.unwrap();
        assert_eq!(
            (tk(&h, 1), h.n(E, R, 1, "b_session_wa")),
            (4000, Some(T1)),
            "55, fast = {fast}: the forward stamp did not skip the roll"
        );
        old_writer(&h, 1, T1 - 10_000);
        h.at(T1 + 180_000);
        lim.acquire(E, R, &[("session", 1)]).await.unwrap();
        assert_eq!(
            tk(&h, 1),
            3000,
            "fast = {fast}: the backward stamp rolled twice"
        );
        old_writer(&h, 1, T1 + 999_000);
        h.at(T1 + 240_000);
        lim.acquire(E, R, &[("session", 1)]).await.unwrap();
        assert_eq!(tk(&h, 1), 2000);
        assert_eq!(h.n(E, R, 1, "b_session_wa"), Some(T1));
        let since_snapshot = h.n(E, R, 1, "b_session_tc").unwrap() - 1000;
        assert_eq!(since_snapshot, 3000, "3 admitted on shard 1 in window T1");
        assert_eq!(tk(&h, 0), 4000, "shard 0 untouched");
    }
}

/// W13: the rollover fan-out runs only after a landed write that opened a window, over
/// S = max(cached, item) shards. Not for S = 1, not without an open, not for a rejected
/// request, not after the consumption-only retry, not when the write failed, not for a
/// created shard that joined shard 0's live window. (W13's "the shard was just created" is
/// read as a join: a created shard that *opens* fans out — spec §4.6 and scenario 30.)
pub async fn w13_when_the_fanout_runs(b: &Backend) {
    // S = 1: opening and re-opening never fan out.
    let h = b.harness(T0).await;
    limits(&h, &[session()]).await;
    h.lim.acquire(E, R, &[("session", 1)]).await.unwrap();
    h.at(T0 + W);
    h.lim.acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!(h.n(E, R, 0, "b_session_ws"), Some(T0 + W));
    assert_eq!(fanouts(&h.lim), 0);

    // S = 2.
    let h = b.harness(T0).await;
    limits(&h, &[session()]).await;
    h.lim.acquire(E, R, &[("session", 0)]).await.unwrap();
    h.lim.admin().bump_shard_count(E, R, 1).await.unwrap();
    h.at(T0 + 1000);
    h.rng.pin(1);
    h.lim.acquire(E, R, &[("session", 0)]).await.unwrap();
    assert_eq!(h.n(E, R, 1, "b_session_ws"), Some(T0));
    assert_eq!(
        fanouts(&h.lim),
        0,
        "a created shard that joins never fans out"
    );
    // No open: a pass inside the live window.
    h.rng.pin(0);
    h.slow().acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!(fanouts(&h.slow()), 0, "no open, no fan-out");
    // The window ended; a request that can never fit (capacity 10) writes nothing.
    h.at(T1);
    rejected(h.slow().acquire(E, R, &[("session", 11)]).await);
    assert_eq!(fanouts(&h.slow()), 0, "a rejected request anchors nothing");
    assert_eq!(h.n(E, R, 0, "b_session_ws"), Some(T0));
    // The opening pass loses its rf lock to a writer that left the item past its trust
    // horizon (the window ended): no consumption-only retry there (it would spend the
    // ended window's balance); the pass re-plans from the item the failed write returned,
    // opens the window and fans it out once.
    let k0 = h.key(E, R, 0);
    let (lim, hk) = h.hooked(false);
    let k = k0.clone();
    hk.stage(On::Update, Some(k0.clone()), move |m| {
        let mut i = m.raw_get(&k).unwrap();
        i.insert("rf".into(), Value::N(T1 - 1));
        m.raw_put(&k, i);
    });
    lim.acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!(
        fanouts(&lim),
        1,
        "the landed open fans out to the S − 1 = 1 sibling"
    );
    assert_eq!(h.n(E, R, 0, "b_session_ws"), Some(T1));
    assert_eq!(h.n(E, R, 1, "b_session_ws"), Some(T1));

    // S = max(cached, item): the client caches 2, shard 0's item says 8 → 7 siblings.
    let h = b.harness(T0).await;
    limits(&h, &[session()]).await;
    h.lim.acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!(h.lim.admin().bump_shard_count(E, R, 1).await.unwrap(), 2);
    h.set_n(E, R, 0, "shard_count", 8);
    h.at(T1);
    h.rng.pin(0);
    h.lim.acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!(h.n(E, R, 0, "b_session_ws"), Some(T1));
    assert_eq!(fanouts(&h.lim), 7);
}

/// W18: reporting. After consuming 1500 of 10,000, availability shows 8500 and the window's
/// end; the refusal's status of the session limit is a quota with its capacity and reset
/// instant and no refill amount; with no window live (never used, or ended) there is no
/// reset instant, and none is ever in the past.
pub async fn w18_reporting(b: &Backend) {
    let h = b.harness(T0).await;
    let big = Limit::quota_after("session", 10_000, Duration::from_secs(18_000)).unwrap();
    limits(&h, &[big]).await;
    let a = h
        .lim
        .check_availability(E, R, crate::Amounts::new())
        .await
        .unwrap();
    assert_eq!(
        (a.limits[0].resets_at_ms, a.resets_at_ms),
        (None, None),
        "never used: no window is live"
    );
    h.lim.acquire(E, R, &[("session", 1500)]).await.unwrap();
    h.at(T0 + 60_000);
    let a = h
        .lim
        .check_availability(E, R, crate::Amounts::new())
        .await
        .unwrap();
    assert_eq!(a.limits[0].available, 8500);
    assert_eq!(a.limits[0].resets_at_ms, Some(T0 + W));
    assert_eq!(a.resets_at_ms, Some(T0 + W));
    let x = rejected(h.lim.acquire(E, R, &[("session", 9000)]).await);
    let st = &x.statuses[0];
    assert_eq!((st.kind.as_str(), st.capacity), ("quota", 10_000));
    assert_eq!(st.resets_at_ms, Some(T0 + W));
    assert_eq!(x.resets_at_ms, Some(T0 + W));
    let body = serde_json::to_value(st).unwrap();
    let keys: Vec<&String> = body.as_object().unwrap().keys().collect();
    assert!(keys.iter().all(|k| !k.contains("refill")), "{keys:?}");
    for t in [T0 + W, T0 + W + 1, T0 + 2 * W] {
        h.at(t);
        let a = h
            .lim
            .check_availability(E, R, crate::Amounts::new())
            .await
            .unwrap();
        assert_eq!(
            (a.limits[0].resets_at_ms, a.resets_at_ms),
            (None, None),
            "ended at {t}"
        );
    }
    // Opened again: the new window's end, in the future.
    let l = h.lim.acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!(l.statuses()[0].resets_at_ms, Some(T0 + 3 * W));
    let a = h
        .lim
        .check_availability(E, R, crate::Amounts::new())
        .await
        .unwrap();
    assert_eq!(a.limits[0].resets_at_ms, Some(T0 + 3 * W));
}

/// W12 (#623), windows at the write. A normal write that opens stamps the pair
/// (`ws`, `rsa`) = (T0 + 1, 18000); a window limit the request does not name is opened
/// and stamped too. tollgate writes when it acquires (a lease's commit only ADDs its
/// adjustments and never anchors), so "read at T0 + W − 1, committed at T0 + W + 1"
/// becomes: the write decided at its reading stands in the old window (consume 10 at T0,
/// acquire(0) read at T0 + W − 1 and landing at T0 + W + 1: ws T0, rf T0 + W − 1), and the
/// next pass anchors at its own reading: ws = rf = T0 + W + 1, tk 10, tc 10.
pub async fn w12_windows_at_the_write(b: &Backend) {
    let h = b.harness(T0 - W).await;
    let rpm = Limit::per_minute("rpm", 100).unwrap();
    limits(&h, &[rpm, session()]).await;
    h.slow().acquire(E, R, &[("session", 1)]).await.unwrap();
    h.at(T0 + 1);
    h.slow().acquire(E, R, &[("session", 1)]).await.unwrap();
    assert_eq!(h.n(E, R, 0, "b_session_ws"), Some(T0 + 1));
    assert_eq!(h.n(E, R, 0, "b_session_rsa"), Some(18_000));
    assert_eq!(h.n(E, R, 0, "b_session_wa"), Some(T0 + 1));
    // Undeclared: the window ended; an acquire naming only rpm opens it too.
    h.at(T0 + 1 + W);
    h.slow().acquire(E, R, &[("rpm", 1)]).await.unwrap();
    assert_eq!(h.n(E, R, 0, "b_session_ws"), Some(T0 + 1 + W));
    assert_eq!(h.n(E, R, 0, "b_session_rsa"), Some(18_000));
    assert_eq!(h.n(E, R, 0, "b_session_tk"), Some(10_000));

    // End to end.
    let h = b.harness(T0).await;
    limits(&h, &[session()]).await;
    h.lim.acquire(E, R, &[("session", 10)]).await.unwrap();
    h.at(T0 + W - 1);
    let (lim, hk) = h.hooked(false);
    let clock = h.clock.clone();
    hk.stage(On::Update, Some(h.key(E, R, 0)), move |_| {
        clock.set(T0 + W + 1)
    });
    lim.acquire(E, R, &[("session", 0)]).await.unwrap();
    assert_eq!(h.n(E, R, 0, "b_session_ws"), Some(T0));
    assert_eq!(h.n(E, R, 0, "rf"), Some(T0 + W - 1));
    assert_eq!(h.n(E, R, 0, "vu"), Some(T0 + W));
    assert_eq!(h.n(E, R, 0, "b_session_tk"), Some(0));
    h.lim.acquire(E, R, &[("session", 0)]).await.unwrap();
    assert_eq!(h.n(E, R, 0, "b_session_ws"), Some(T0 + W + 1));
    assert_eq!(h.n(E, R, 0, "rf"), Some(T0 + W + 1));
    assert_eq!(h.n(E, R, 0, "b_session_tk"), Some(10_000));
    assert_eq!(h.n(E, R, 0, "b_session_tc"), Some(10_000));
}

/// Σ tk of the quota over shards 0..s, in milli.
fn held(h: &H, limit: &str, s: i64) -> i64 {
    (0..s as u32)
        .filter_map(|i| h.raw.raw_get(&h.key(E, R, i)))
        .filter_map(|it| {
            it.get(format!("b_{limit}_tk").as_str())
                .and_then(Value::as_n)
        })
        .sum()
}

/// Q5: the walk with spending. Five times: drain every shard to 2 (those above it), spend
/// shard 0's `wcu`, acquire 1 (0 once shard 0 has given everything away) with the draw
/// pinned to 0 (the fast path doubles and creates a shard in the
/// new range), then materialise every missing shard. S ends at 32 and after every step
/// admitted + held == 1000 exactly (so admitted + spendable ≤ 1000; before ADR-145: 3428
/// admitted): each doubling changes what is held only by what that generation admitted.
pub async fn q5_walk_with_spending(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[rpd()]).await;
    h.lim.acquire(E, R, &[("rpd", 0)]).await.unwrap();
    let mut admitted = 0i64;
    let mut s = 1i64;
    for round in 0..5 {
        for i in 0..s as u32 {
            // An acquire of 0 on a shard already at 2 or below still restamps its `vu`.
            let t = (h.n(E, R, i, "b_rpd_tk").unwrap() / 1000 - 2).max(0);
            h.rng.pin(i);
            h.slow().acquire(E, R, &[("rpd", t)]).await.unwrap();
            admitted += t;
        }
        assert_eq!(
            admitted * 1000 + held(&h, "rpd", s),
            1_000_000,
            "round {round}"
        );
        h.set_n(E, R, 0, "b_wcu_tk", 0);
        warm(&h.lim).await;
        h.rng.pin(0);
        // Shard 0 may have given its last tokens away: then the trigger asks for 0.
        let first = (h.n(E, R, 0, "b_rpd_tk").unwrap() / 1000).min(1);
        if h.lim.acquire(E, R, &[("rpd", first)]).await.is_ok() {
            admitted += first;
        }
        let doubled = h.n(E, R, 0, "shard_count").unwrap();
        assert_eq!(doubled, 2 * s, "round {round}: wcu exhaustion doubles");
        s = doubled;
        assert_eq!(
            admitted * 1000 + held(&h, "rpd", s),
            1_000_000,
            "round {round}"
        );
        warm(&h.slow()).await;
        for i in 0..s as u32 {
            if h.raw.raw_get(&h.key(E, R, i)).is_none() {
                h.rng.pin(i);
                h.slow().acquire(E, R, &[("rpd", 0)]).await.unwrap();
            }
        }
        assert_eq!(
            admitted * 1000 + held(&h, "rpd", s),
            1_000_000,
            "round {round}"
        );
    }
    assert_eq!(s, 32);
    assert!(admitted + h.spendable(E, R, "rpd", 32) <= 1000);
}

/// Conflicts injected so far (`seen`) and still to inject (`left`).
struct Conflicts {
    left: AtomicI64,
    seen: AtomicI64,
}

/// A slow-path client over `h`'s store whose transactions carrying a quota move (an update
/// beside the slot's own write) fail with `TransactionConflict` on the moved item, `n`
/// times; everything else passes through.
async fn conflicting(h: &H, n: i64, policy: OnUnavailable) -> (Limiter, Arc<Conflicts>) {
    let c = Arc::new(Conflicts {
        left: AtomicI64::new(n),
        seen: AtomicI64::new(0),
    });
    let counts = c.clone();
    let on_transact = move |o: &[TransactOp]| {
        let is_move = |op: &TransactOp| matches!(op, TransactOp::Update(_));
        if !(o.iter().skip(1).any(is_move) && counts.left.load(Ordering::SeqCst) > 0) {
            return None;
        }
        counts.left.fetch_sub(1, Ordering::SeqCst);
        counts.seen.fetch_add(1, Ordering::SeqCst);
        let reasons = o
            .iter()
            .enumerate()
            .map(|(i, op)| {
                if i > 0 && is_move(op) {
                    CancelReason::TransactionConflict
                } else {
                    CancelReason::None
                }
            })
            .collect();
        Some(StoreError::TransactionCanceled { reasons })
    };
    let store = Intercept::new(h.raw.clone(), Box::new(|_| None), Box::new(on_transact));
    let lim = Limiter::builder(Arc::new(store))
        .clock(h.clock.clone())
        .rng(h.rng.clone())
        .options(Options {
            speculative: false,
            on_unavailable: policy,
            ..opts()
        })
        .build()
        .unwrap();
    warm(&lim).await;
    (lim, c)
}

/// Q11: transaction conflicts on the create-with-move. One conflict → retried as-is, lands
/// [500, 499]. Persistent conflicts → 1 try + 3 retries with moves, then once more without
/// moves (the slot would get no grant) → the acquire of 1 is refused with
/// RateLimitExceeded — not unavailable, under both `block` and `allow` — and nothing is
/// written; a following acquire(0) creates shard 1 empty with gc = 2: [1000, 0].
pub async fn q11_transaction_conflicts(b: &Backend) {
    let setup = |h: H| async move {
        limits(&h, &[rpd()]).await;
        h.lim.acquire(E, R, &[("rpd", 0)]).await.unwrap();
        h.lim.admin().bump_shard_count(E, R, 1).await.unwrap();
        h.rng.pin(1);
        h
    };
    let h = setup(b.harness(T0).await).await;
    let (lim, c) = conflicting(&h, 1, OnUnavailable::Block).await;
    lim.acquire(E, R, &[("rpd", 1)]).await.unwrap();
    assert_eq!(c.seen.load(Ordering::SeqCst), 1);
    assert_eq!(h.tks(E, R, "rpd", 2), vec![500_000, 499_000]);

    for policy in [OnUnavailable::Block, OnUnavailable::Allow] {
        let h = setup(b.harness(T0).await).await;
        let (lim, c) = conflicting(&h, i64::MAX, policy).await;
        let l = lim.acquire(E, R, &[("rpd", 1)]).await.unwrap();
        assert!(
            !l.is_degraded(),
            "{policy:?}: charged, never a degraded admit"
        );
        assert_eq!(
            l.shards(),
            vec![0],
            "{policy:?}: the entity paid from shard 0"
        );
        assert!(c.seen.load(Ordering::SeqCst) >= 4, "1 try + 3 retries");
        assert!(h.raw.raw_get(&h.key(E, R, 1)).is_none(), "nothing written");
        assert_eq!(h.n(E, R, 0, "b_rpd_tk"), Some(999_000));
        lim.acquire(E, R, &[("rpd", 0)]).await.unwrap();
        assert_eq!(h.tks(E, R, "rpd", 2), vec![999_000, 0]);
        assert_eq!(h.n(E, R, 1, "b_rpd_gc"), Some(2));
        assert_eq!(
            h.n(E, R, 0, "b_rpd_gc"),
            Some(1),
            "shard 0 still covers slot 1"
        );
    }
}
