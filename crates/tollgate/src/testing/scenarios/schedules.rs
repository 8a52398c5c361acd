//! Scheduled limits (ADR-135, scenario 85 of spec §5.9): a time-of-day schedule changes a
//! limit's effective capacity and rate at wall-clock boundaries in the limit's time zone.
#![allow(missing_docs)]

use crate::testing::*;
use crate::{Error, Limit, Scope};
use tollgate_core::schedule::Schedule;
use tollgate_core::value::Value;

const R: &str = "api";

fn t(s: &str) -> i64 {
    s.parse::<jiff::Timestamp>().unwrap().as_millisecond()
}

/// 100 per minute by day, 10 per minute (capacity 10) from 22:00 to 06:00 Berlin time.
fn rpm() -> Limit {
    Limit::per_minute("rpm", 100)
        .unwrap()
        .with_schedule(Schedule::new(&["* 22:00-06:00 10/10"], "Europe/Berlin").unwrap())
        .unwrap()
}

async fn limits(h: &H, e: &str, l: &[Limit]) {
    h.lim
        .admin()
        .set_limits(&Scope::Entity(e.into(), Some(R.into())), l)
        .await
        .unwrap();
}

fn text(h: &H, e: &str, shard: u32, a: &str) -> Option<String> {
    match h.item(e, R, shard).get(a) {
        Some(Value::S(s)) => Some(s.clone()),
        _ => None,
    }
}

/// Scenario 85: a scheduled capacity change at a boundary. Capacity 100 by day, 10 by night
/// (Europe/Berlin), S = 1, on the night of the 2026 fall-back (03:00 CEST → 02:00 CET):
/// - created by day: `cp` = 100,000, `vu` = 22:00 CEST = 20:00Z, schedule and base stored;
///   the limit's trust horizon `fu` is the instant it is full again (3 s later);
/// - a warm acquire just before the boundary, past `fu` (the bucket is full again), plans
///   from this client's last image: one write, no read;
/// - the first acquire exactly at the boundary (half-open: the night regime) is past `vu`:
///   again one write planned from the last image: `cp` rewritten to 10,000, `tk` clamped to
///   the new cap and debited (9,000), `vu` restamped to 06:00 CET = 05:00Z — nine real
///   hours later, not eight — and `fu` the night bucket's full instant (6 s);
/// - the next acquire inside `fu` is on the fast path;
/// - at the morning boundary a raised capacity mints nothing: the balance refills toward
///   100,000 at the day rate (30 s × 100/min = 50 tokens from an empty bucket);
/// - a rejection by night reports the night capacity (10), and 11 tokens never fit.
pub async fn s85_scheduled_capacity_at_a_boundary(b: &Backend) {
    let night = t("2026-10-24T20:00:00Z"); // 22:00 CEST
    let day = night - 30_000; // 21:59:30 CEST (inside the config cache's 60 s)
    let morning = t("2026-10-25T05:00:00Z"); // 06:00 CET
    let h = b.harness(day).await;
    limits(&h, "e", &[rpm()]).await;
    h.lim.acquire("e", R, &[("rpm", 5)]).await.unwrap();
    assert_eq!(h.n("e", R, 0, "b_rpm_cp"), Some(100_000));
    assert_eq!(h.n("e", R, 0, "b_rpm_bcp"), Some(100_000));
    assert_eq!(h.n("e", R, 0, "b_rpm_bra"), Some(100_000));
    assert_eq!(h.n("e", R, 0, "b_rpm_tk"), Some(95_000));
    assert_eq!(h.n("e", R, 0, "vu"), Some(night));
    assert_eq!(
        h.n("e", R, 0, "b_rpm_fu"),
        Some(day + 3000),
        "5 tokens at 100/min"
    );
    assert_eq!(
        text(&h, "e", 0, "b_rpm_sched").as_deref(),
        Some("1|Europe/Berlin|* 22:00-06:00 10/10")
    );

    h.at(night - 1);
    let s = h.stats();
    h.lim.acquire("e", R, &[("rpm", 1)]).await.unwrap();
    let d = h.stats().since(&s);
    assert_eq!((d.writes(), d.reads()), (1, 0), "warm: one write, no read");
    assert_eq!(h.n("e", R, 0, "b_rpm_tk"), Some(99_000));

    h.at(night);
    let s = h.stats();
    h.lim.acquire("e", R, &[("rpm", 1)]).await.unwrap();
    let d = h.stats().since(&s);
    assert_eq!(
        (d.writes(), d.reads()),
        (1, 0),
        "the rf-locked write, planned from the last image"
    );
    assert_eq!(h.n("e", R, 0, "b_rpm_cp"), Some(10_000));
    assert_eq!(h.n("e", R, 0, "b_rpm_ra"), Some(10_000));
    assert_eq!(h.n("e", R, 0, "b_rpm_tk"), Some(9_000));
    assert_eq!(h.n("e", R, 0, "vu"), Some(morning));
    assert_eq!(
        h.n("e", R, 0, "b_rpm_fu"),
        Some(night + 6000),
        "1 token at 10/min"
    );
    assert_eq!(morning - night, 9 * 3_600_000, "the fall-back night");

    h.at(night + 1000);
    let s = h.stats();
    h.lim.acquire("e", R, &[("rpm", 1)]).await.unwrap();
    let d = h.stats().since(&s);
    assert_eq!((d.writes(), d.reads()), (1, 0), "back on the fast path");
    assert_eq!(h.n("e", R, 0, "b_rpm_tk"), Some(8_000));
    // #475: a rejection reports the capacity in force (10 by night), and 11 never fits.
    match h.lim.acquire("e", R, &[("rpm", 11)]).await {
        Err(Error::RateLimitExceeded(x)) => {
            assert_eq!(x.statuses[0].capacity, 10);
            assert_eq!(x.retry_after_ms, None);
        }
        r => panic!("expected a rejection, got {:?}", r.map(|_| ())),
    }

    // Empty the night bucket 30 s before the morning boundary (it refilled to its cap of
    // 10 over the night).
    h.at(morning - 30_000);
    h.slow().acquire("e", R, &[("rpm", 10)]).await.unwrap();
    assert_eq!(h.n("e", R, 0, "b_rpm_tk"), Some(0));
    h.at(morning);
    h.lim.acquire("e", R, &[("rpm", 1)]).await.unwrap();
    assert_eq!(h.n("e", R, 0, "b_rpm_cp"), Some(100_000));
    assert_eq!(
        h.n("e", R, 0, "b_rpm_tk"),
        Some(49_000),
        "no mint to 100,000"
    );
    assert_eq!(h.n("e", R, 0, "vu"), Some(t("2026-10-25T21:00:00Z")));
    assert_eq!(
        h.n("e", R, 0, "b_rpm_fu"),
        Some(morning + 30_600),
        "51 tokens short at 100/min"
    );
}

/// Scenario 85 at S = 2: the schedule is applied first, then divided by the shard count —
/// at the boundary the shard re-materialised is clamped to 10,000 // 2 = 5,000 (minus the
/// request), while `cp` stays the undivided 10,000; the other shard keeps its day balance
/// until it is next touched, when it too is clamped to 5,000. (The new shard is split off
/// shard 0 by day: 50,000 each.)
pub async fn s85_boundary_divides_after_the_schedule(b: &Backend) {
    let day = t("2026-10-24T19:00:00Z");
    let night = t("2026-10-24T20:00:00Z");
    let h = b.harness(day).await;
    limits(&h, "e", &[rpm()]).await;
    h.lim.acquire("e", R, &[("rpm", 0)]).await.unwrap();
    assert_eq!(h.lim.admin().bump_shard_count("e", R, 1).await.unwrap(), 2);
    h.rng.pin(1);
    h.lim.acquire("e", R, &[("rpm", 0)]).await.unwrap();
    assert_eq!(h.tks("e", R, "rpm", 2), [50_000, 50_000]);
    h.rng.pin(0);
    h.slow().acquire("e", R, &[("rpm", 0)]).await.unwrap();
    assert_eq!(h.tks("e", R, "rpm", 2), [50_000, 50_000]);

    h.at(night);
    h.rng.pin(1);
    h.lim.acquire("e", R, &[("rpm", 2)]).await.unwrap();
    assert_eq!(h.tks("e", R, "rpm", 2), [50_000, 3_000]);
    assert_eq!(h.n("e", R, 1, "b_rpm_cp"), Some(10_000));
    assert_eq!(h.n("e", R, 1, "vu"), Some(t("2026-10-25T05:00:00Z")));
    assert_eq!(
        h.n("e", R, 1, "b_rpm_fu"),
        Some(night + 24_000),
        "2 tokens at 10/min over 2 shards"
    );
    // Shard 0's stored vu is still the boundary: its fast path fails too.
    h.rng.pin(0);
    h.lim.acquire("e", R, &[("rpm", 1)]).await.unwrap();
    assert_eq!(h.tks("e", R, "rpm", 2), [4_000, 3_000]);
}

/// ADR-120 × ADR-135: the schedule is part of the parameter hash, so changing it reaches
/// the bucket on the next acquire (the fast path fails on `ph`); removing it drops the
/// stored schedule, its base values and `vu`.
pub async fn s85_schedule_change_syncs(b: &Backend) {
    let night = t("2026-10-24T21:00:00Z"); // 23:00 CEST
    let h = b.harness(night).await;
    limits(&h, "e", &[rpm()]).await;
    h.lim.acquire("e", R, &[("rpm", 1)]).await.unwrap();
    assert_eq!(h.n("e", R, 0, "b_rpm_tk"), Some(9_000));
    let wider = Limit::per_minute("rpm", 100)
        .unwrap()
        .with_schedule(Schedule::new(&["* 22:00-06:00 20/20"], "Europe/Berlin").unwrap())
        .unwrap();
    limits(&h, "e", &[wider]).await;
    h.at(night + 1000);
    h.lim.acquire("e", R, &[("rpm", 1)]).await.unwrap();
    assert_eq!(h.n("e", R, 0, "b_rpm_cp"), Some(20_000));
    assert_eq!(
        text(&h, "e", 0, "b_rpm_sched").as_deref(),
        Some("1|Europe/Berlin|* 22:00-06:00 20/20")
    );
    limits(&h, "e", &[Limit::per_minute("rpm", 100).unwrap()]).await;
    h.at(night + 2000);
    h.lim.acquire("e", R, &[("rpm", 1)]).await.unwrap();
    assert_eq!(h.n("e", R, 0, "b_rpm_cp"), Some(100_000));
    for a in ["b_rpm_sched", "b_rpm_bcp", "b_rpm_bra", "vu"] {
        assert!(!h.item("e", R, 0).contains_key(a), "{a} removed");
    }
}
