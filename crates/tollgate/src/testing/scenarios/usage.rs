//! Usage snapshots from the change feed (issue #14): totals equal admitted net consumption
//! exactly, per entity, resource, limit and window; a restarted or duplicated aggregator
//! counts each change once.
#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::testing::*;
use crate::{FeedAggregator, Limit, Scope, UsageOptions, UsageQuery, Window};

pub(super) const R: &str = "llm";
/// The start of the hour holding T0 (2025-09-04T15:00:00Z).
const HOUR0: i64 = 1_756_998_000_000;
const HOUR_MS: i64 = 3_600_000;

/// Usage by (entity, window, start): (limit → millitokens, requests).
pub(super) type Usage = BTreeMap<(String, Window, i64), (BTreeMap<String, i64>, i64)>;

/// Expected usage.
#[derive(Default, Debug)]
pub(super) struct Ledger(pub(super) Usage);

impl Ledger {
    pub(super) fn add(&mut self, entity: &str, at: i64, amounts: &[(&str, i64)], requests: i64) {
        for w in [Window::Hourly, Window::Daily, Window::Monthly] {
            let e = self
                .0
                .entry((entity.to_string(), w, w.start_ms(at)))
                .or_default();
            for (l, t) in amounts {
                *e.0.entry((*l).to_string()).or_default() += t * 1000;
            }
            e.1 += requests;
        }
    }
}

pub(super) fn options(windows: &[Window]) -> UsageOptions {
    UsageOptions {
        windows: windows.to_vec(),
        ..UsageOptions::default()
    }
}

pub(super) async fn aggregator(h: &H, opts: UsageOptions) -> Option<FeedAggregator> {
    let feed = h.raw.clone().change_feed()?;
    Some(FeedAggregator::new(&h.lim, feed, opts).expect("aggregator"))
}

/// Every stored snapshot of `entities`, as the ledger holds them (zero counters dropped).
pub(super) async fn stored(
    h: &H,
    entities: &[&str],
) -> BTreeMap<(String, Window, i64), (BTreeMap<String, i64>, i64)> {
    let mut out = BTreeMap::new();
    for e in entities {
        let mut after = None;
        loop {
            let page = h
                .lim
                .usage(&UsageQuery {
                    entity: Some((*e).to_string()),
                    resource: Some(R.into()),
                    limit: Some(7),
                    after: after.clone(),
                    ..UsageQuery::default()
                })
                .await
                .expect("usage query");
            for s in page.snapshots {
                let milli: BTreeMap<String, i64> =
                    s.milli.into_iter().filter(|(_, v)| *v != 0).collect();
                out.insert((s.entity, s.window, s.start_ms), (milli, s.requests));
            }
            match page.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
    }
    out
}

pub(super) fn clean(l: &Ledger) -> Usage {
    l.0.iter()
        .map(|(k, (m, r))| {
            (
                k.clone(),
                (
                    m.iter()
                        .filter(|(_, v)| **v != 0)
                        .map(|(a, b)| (a.clone(), *b))
                        .collect(),
                    *r,
                ),
            )
        })
        .collect()
}

/// The ledger's usage of one window kind, zero counters dropped.
pub(super) fn window(l: &Ledger, w: Window) -> Usage {
    clean(l)
        .into_iter()
        .filter(|((_, at, _), _)| *at == w)
        .collect()
}

/// A daily aggregator (no background work, `absorb` as given) whose store requests go through
/// a `FaultyStore` over the harness's store with `faults`, and that store (its feed is the
/// harness's own).
async fn faulted_aggregator(
    h: &H,
    feed: Arc<dyn tollgate_store::ChangeFeed>,
    seed: u64,
    faults: tollgate_store::FaultConfig,
    absorb: bool,
) -> (
    Arc<tollgate_store::FaultyStore<Arc<dyn TestStore>>>,
    FeedAggregator,
) {
    let faulty = Arc::new(tollgate_store::FaultyStore::new(
        h.raw.clone(),
        seed,
        faults,
    ));
    let lim = crate::Limiter::builder(faulty.clone())
        .clock(h.clock.clone())
        .build()
        .expect("limiter");
    let agg = FeedAggregator::new(
        &lim,
        feed,
        UsageOptions {
            background: false,
            absorb,
            ..options(&[Window::Daily])
        },
    )
    .expect("aggregator");
    (faulty, agg)
}

pub(super) async fn setup(h: &H) {
    h.lim
        .admin()
        .set_limits(
            &Scope::Resource(R.into()),
            &[
                Limit::per_minute("rpm", 1000).unwrap(),
                Limit::per_minute("tpm", 1_000_000).unwrap(),
            ],
        )
        .await
        .unwrap();
}

/// Drive the mixed workload, recording what was admitted in `led`.
async fn workload(h: &H, led: &mut Ledger) {
    // A new bucket: its first consumption (a create) counts.
    h.at(T0);
    h.lim
        .acquire("alice", R, &[("rpm", 1), ("tpm", 500)])
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    led.add("alice", T0, &[("rpm", 1), ("tpm", 500)], 1);
    // Fast path (the bucket is warm; `rf` does not move).
    h.at(T0 + 1000);
    h.lim
        .acquire("alice", R, &[("rpm", 1), ("tpm", 300)])
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    led.add("alice", T0 + 1000, &[("rpm", 1), ("tpm", 300)], 1);
    // Slow path.
    h.at(T0 + 2000);
    h.slow()
        .acquire("alice", R, &[("rpm", 1), ("tpm", 200)])
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    led.add("alice", T0 + 2000, &[("rpm", 1), ("tpm", 200)], 1);
    // Adjusted up, then down; and a rollback (its request still counted, its tokens not).
    h.at(T0 + 3000);
    let mut l = h
        .lim
        .acquire("alice", R, &[("rpm", 1), ("tpm", 1000)])
        .await
        .unwrap();
    led.add("alice", T0 + 3000, &[("rpm", 1), ("tpm", 1000)], 1);
    h.at(T0 + 4000);
    l.adjust("tpm", 500).unwrap();
    l.commit().await.unwrap();
    led.add("alice", T0 + 4000, &[("tpm", 500)], 0);
    let mut l = h
        .lim
        .acquire("alice", R, &[("rpm", 1), ("tpm", 1000)])
        .await
        .unwrap();
    led.add("alice", T0 + 4000, &[("rpm", 1), ("tpm", 1000)], 1);
    l.adjust("tpm", -400).unwrap();
    l.commit().await.unwrap();
    led.add("alice", T0 + 4000, &[("tpm", -400)], 0);
    h.at(T0 + 5000);
    let mut l = h
        .lim
        .acquire("alice", R, &[("rpm", 1), ("tpm", 2000)])
        .await
        .unwrap();
    led.add("alice", T0 + 5000, &[("rpm", 1), ("tpm", 2000)], 1);
    l.rollback().await.unwrap();
    led.add("alice", T0 + 5000, &[("rpm", -1), ("tpm", -2000)], 0);
    // Several shards: bob doubles twice; shards 1 and 3 are new buckets.
    h.at(T0 + 6000);
    h.rng.pin(0);
    h.lim
        .acquire("bob", R, &[("rpm", 1), ("tpm", 100)])
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    led.add("bob", T0 + 6000, &[("rpm", 1), ("tpm", 100)], 1);
    assert_eq!(
        h.lim.admin().bump_shard_count("bob", R, 1).await.unwrap(),
        2
    );
    h.rng.pin(1);
    h.lim
        .acquire("bob", R, &[("rpm", 1), ("tpm", 110)])
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    led.add("bob", T0 + 6000, &[("rpm", 1), ("tpm", 110)], 1);
    assert_eq!(
        h.lim.admin().bump_shard_count("bob", R, 2).await.unwrap(),
        4
    );
    h.at(T0 + 7000);
    for (shard, tpm) in [(3, 120), (0, 130), (1, 140)] {
        h.rng.pin(shard);
        h.lim
            .acquire("bob", R, &[("rpm", 1), ("tpm", tpm)])
            .await
            .unwrap()
            .commit()
            .await
            .unwrap();
        led.add("bob", T0 + 7000, &[("rpm", 1), ("tpm", tpm)], 1);
    }
    // The next hour: a fast-path write is dated by its own time, not the item's stale `rf`.
    let next = HOUR0 + HOUR_MS + 60_000;
    h.at(next);
    h.rng.pin(0);
    h.lim
        .acquire("alice", R, &[("rpm", 1), ("tpm", 700)])
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    led.add("alice", next, &[("rpm", 1), ("tpm", 700)], 1);
    h.rng.pin(3);
    h.lim
        .acquire("bob", R, &[("rpm", 1), ("tpm", 150)])
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    led.add("bob", next, &[("rpm", 1), ("tpm", 150)], 1);
}

/// Usage totals equal admitted net consumption exactly — per entity, resource, limit and
/// window — over fast and slow paths, new buckets, adjustments both ways, a rollback, several
/// shards and an hour boundary.
pub async fn usage_equals_admitted_net_consumption(b: &Backend) {
    let h = b.harness(T0).await;
    let Some(agg) = aggregator(&h, options(&Window::ALL)).await else {
        return;
    };
    setup(&h).await;
    let mut led = Ledger::default();
    workload(&h, &mut led).await;
    let rep = agg.pass().await.expect("pass");
    assert!(rep.usage_changes >= 15, "{rep:?}");
    assert_eq!(rep.lost_races, 0);
    let got = stored(&h, &["alice", "bob"]).await;
    assert_eq!(got, clean(&led));
    // Concrete numbers: alice's first hour, in millitokens and requests.
    let a0 = &got[&("alice".to_string(), Window::Hourly, HOUR0)];
    assert_eq!(a0.0["tpm"], (500 + 300 + 200 + 1500 + 600) * 1000);
    assert_eq!(a0.0["rpm"], 5000);
    assert_eq!(
        a0.1, 6,
        "six acquires (the rolled-back one included), two limits each"
    );
    let a1 = &got[&("alice".to_string(), Window::Hourly, HOUR0 + HOUR_MS)];
    assert_eq!((a1.0["tpm"], a1.1), (700_000, 1));
    let bob_day = &got[&("bob".to_string(), Window::Daily, Window::Daily.start_ms(T0))];
    assert_eq!(bob_day.0["tpm"], (100 + 110 + 120 + 130 + 140 + 150) * 1000);
    assert_eq!(bob_day.1, 6);
    // A second pass finds nothing new and changes nothing.
    let again = agg.pass().await.expect("second pass");
    assert_eq!(again.usage_changes, 0, "{again:?}");
    assert_eq!(stored(&h, &["alice", "bob"]).await, clean(&led));
    // Resource mode: both entities' snapshots, through the index.
    let by_resource = h
        .lim
        .usage(&UsageQuery {
            resource: Some(R.into()),
            window: Some(Window::Daily),
            ..UsageQuery::default()
        })
        .await
        .expect("resource query");
    let mut who: Vec<String> = by_resource
        .snapshots
        .iter()
        .map(|s| s.entity.clone())
        .collect();
    who.sort();
    // An index may lag: poll briefly.
    let mut tries = 0;
    while who != ["alice", "bob"] && tries < 40 {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let p = h
            .lim
            .usage(&UsageQuery {
                resource: Some(R.into()),
                window: Some(Window::Daily),
                ..UsageQuery::default()
            })
            .await
            .expect("resource query");
        who = p.snapshots.iter().map(|s| s.entity.clone()).collect();
        who.sort();
        tries += 1;
    }
    assert_eq!(who, ["alice", "bob"]);
}

/// An aggregator killed mid-feed (after two small batches) and a fresh one started in its
/// place, plus a second aggregator racing on the same checkpoint: every change counted once.
pub async fn usage_survives_restart_and_duplicate_aggregators(b: &Backend) {
    let h = b.harness(T0).await;
    let small = UsageOptions {
        batch: 3,
        max_batches: Some(2),
        ..options(&[Window::Hourly])
    };
    let Some(first) = aggregator(&h, small.clone()).await else {
        return;
    };
    setup(&h).await;
    let mut led = Ledger::default();
    workload(&h, &mut led).await;
    let rep = first.pass().await.expect("bounded pass");
    assert!(rep.changes <= 6 && rep.commits >= 1, "{rep:?}");
    // Killed: its in-memory read position is gone with it.
    drop(first);
    // A duplicate reads the same changes as the restarted one, concurrently.
    let restarted = aggregator(&h, options(&[Window::Hourly]))
        .await
        .expect("feed");
    let duplicate = aggregator(&h, options(&[Window::Hourly]))
        .await
        .expect("feed");
    let (a, b2) = tokio::join!(restarted.pass(), duplicate.pass());
    let (a, b2) = (a.expect("restarted pass"), b2.expect("duplicate pass"));
    // Whatever the interleaving, the stored totals are the ledger's, counted once.
    let want = window(&led, Window::Hourly);
    assert_eq!(stored(&h, &["alice", "bob"]).await, want, "{a:?} {b2:?}");
    // More traffic, then the restarted one alone: still exact.
    h.at(HOUR0 + HOUR_MS + 120_000);
    h.rng.pin(0);
    h.lim
        .acquire("alice", R, &[("rpm", 2), ("tpm", 9)])
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    led.add(
        "alice",
        HOUR0 + HOUR_MS + 120_000,
        &[("rpm", 2), ("tpm", 9)],
        1,
    );
    restarted.pass().await.expect("pass");
    duplicate.pass().await.expect("pass");
    assert_eq!(
        stored(&h, &["alice", "bob"]).await,
        window(&led, Window::Hourly)
    );
}

/// A commit whose response is lost (applied, but the aggregator sees an error) is not
/// counted again by the next pass: the checkpoint moved with the snapshots.
pub async fn usage_commit_with_a_lost_response_counts_once(b: &Backend) {
    use tollgate_store::FaultConfig;
    let h = b.harness(T0).await;
    let Some(feed) = h.raw.clone().change_feed() else {
        return;
    };
    setup(&h).await;
    let mut led = Ledger::default();
    workload(&h, &mut led).await;
    let (faulty, agg) = faulted_aggregator(
        &h,
        feed,
        3,
        FaultConfig {
            lost_response: 1.0,
            ..FaultConfig::none()
        },
        false,
    )
    .await;
    let err = agg.pass().await;
    assert!(
        err.is_err(),
        "the lost response surfaces as an error: {err:?}"
    );
    faulty.set_enabled(false);
    let rep = agg.pass().await.expect("pass after the outage");
    assert_eq!(rep.usage_changes, 0, "nothing left to count: {rep:?}");
    assert_eq!(
        stored(&h, &["alice", "bob"]).await,
        window(&led, Window::Daily)
    );
}

/// An absorbing aggregator (`UsageOptions::absorb`) sums and trims the feed between passes
/// and commits what it holds (rule "held usage is committed from memory, never re-read"):
/// nothing is stored until its pass; a commit refused before it lands and one whose answer
/// is lost are each settled by the next pass from memory — on a memory store the feed no
/// longer has those changes — and counted once.
pub async fn usage_absorbed_between_passes_counts_once(b: &Backend) {
    use tollgate_store::{FaultConfig, FeedCursor};
    let h = b.harness(T0).await;
    let Some(feed) = h.raw.clone().change_feed() else {
        return;
    };
    setup(&h).await;
    let mut led = Ledger::default();
    workload(&h, &mut led).await;
    let daily = |led: &Ledger| window(led, Window::Daily);
    let (faulty, agg) = faulted_aggregator(&h, feed.clone(), 5, FaultConfig::none(), true).await;
    let first = feed
        .read_feed(&FeedCursor::start(), 1)
        .await
        .expect("the feed holds the workload");
    assert_eq!(first.changes.len(), 1);
    agg.absorb().await.expect("absorb");
    assert!(
        stored(&h, &["alice", "bob"]).await.is_empty(),
        "absorbing stores nothing"
    );
    // Trimmed as read where the backend keeps its own feed (memory and SQLite: one stream,
    // `""`; DynamoDB Streams keeps its records 24 hours whatever a consumer says): the
    // first change is no longer there.
    if first.changes[0].position.stream.is_empty() {
        let after = feed.read_feed(&FeedCursor::start(), 1).await;
        assert!(
            after.is_err() || after.as_ref().is_ok_and(|a| a.changes != first.changes),
            "{after:?}"
        );
    }
    // A commit refused before it lands: the next pass commits the same sums.
    faulty.set_config(FaultConfig {
        throttle: 1.0,
        ..FaultConfig::none()
    });
    assert!(
        agg.pass().await.is_err(),
        "a throttled commit fails the pass"
    );
    assert!(stored(&h, &["alice", "bob"]).await.is_empty());
    faulty.set_config(FaultConfig::none());
    let rep = agg.pass().await.expect("pass after the throttle");
    assert_eq!(rep.commits, 1, "{rep:?}");
    assert_eq!(stored(&h, &["alice", "bob"]).await, daily(&led));
    // More traffic; this commit lands but its answer is lost.
    h.at(HOUR0 + HOUR_MS + 120_000);
    h.rng.pin(0);
    for (who, amounts) in [
        ("alice", [("rpm", 2), ("tpm", 9)]),
        ("bob", [("rpm", 1), ("tpm", 40)]),
    ] {
        h.lim
            .acquire(who, R, &amounts)
            .await
            .unwrap()
            .commit()
            .await
            .unwrap();
        led.add(who, HOUR0 + HOUR_MS + 120_000, &amounts, 1);
    }
    agg.absorb().await.expect("absorb");
    faulty.set_config(FaultConfig {
        lost_response: 1.0,
        ..FaultConfig::none()
    });
    assert!(agg.pass().await.is_err(), "the lost answer fails the pass");
    faulty.set_config(FaultConfig::none());
    assert_eq!(
        stored(&h, &["alice", "bob"]).await,
        daily(&led),
        "it landed"
    );
    let rep = agg.pass().await.expect("pass after the lost answer");
    assert_eq!((rep.usage_changes, rep.commits), (0, 1), "{rep:?}");
    assert_eq!(stored(&h, &["alice", "bob"]).await, daily(&led), "once");
    // It reads only the commit's own writes, which carry no usage.
    let again = agg.pass().await.expect("a pass with nothing new");
    assert_eq!((again.usage_changes, again.commits), (0, 0), "{again:?}");
    assert_eq!(stored(&h, &["alice", "bob"]).await, daily(&led));
}
