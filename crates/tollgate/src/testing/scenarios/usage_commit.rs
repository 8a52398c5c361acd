//! A pass's usage committed exactly once (issue #17; rule "a pass's usage is applied exactly
//! once: claim, apply per item at most once, finalize"): a pass over more snapshot items than
//! one transaction holds commits them all once, and a claim left by a pass that crashed
//! between its claim and its finalize is finished once by the next pass — the same process,
//! a fresh one, or two at once.
#![allow(missing_docs)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tollgate_store::StoreError;

use super::usage::{aggregator, clean, options, setup, stored, Ledger, Usage, R};
use crate::testing::intercept::Intercept;
use crate::testing::*;
use crate::{checkpoint_key, FeedAggregator, UsageOptions, Window};

/// Entities: each one's acquire lands in two snapshot items (hourly, daily), so 60 make 120
/// items — more than the 99 one transaction holds beside the checkpoint.
const N: usize = 60;

fn names() -> Vec<String> {
    (0..N).map(|i| format!("e{i:03}")).collect()
}

/// One acquire per entity at `at`, `tpm` tokens each.
async fn traffic(h: &H, led: &mut Ledger, at: i64, tpm: i64) {
    h.at(at);
    for e in names() {
        h.lim
            .acquire(&e, R, &[("rpm", 1), ("tpm", tpm)])
            .await
            .unwrap()
            .commit()
            .await
            .unwrap();
        led.add(&e, at, &[("rpm", 1), ("tpm", tpm)], 1);
    }
}

fn hourly_daily() -> UsageOptions {
    UsageOptions {
        background: false,
        ..options(&[Window::Hourly, Window::Daily])
    }
}

fn want(led: &Ledger) -> Usage {
    clean(led)
        .into_iter()
        .filter(|((_, w, _), _)| *w != Window::Monthly)
        .collect()
}

async fn got(h: &H) -> Usage {
    let n = names();
    let refs: Vec<&str> = n.iter().map(String::as_str).collect();
    stored(h, &refs).await
}

/// Whether the checkpoint carries a claim.
async fn claimed(h: &H) -> bool {
    let k = checkpoint_key(h.lim.inner().ns(), "aggregator");
    let item = h.raw.get(&k, true).await.expect("checkpoint read");
    item.is_some_and(|i| i.contains_key("pending_to"))
}

/// 120 snapshot items summed in one pass are committed once — a claim, two transactions,
/// one finalize — and so are the next pass's, raced by a second aggregator, and a pass cut
/// into transactions of 7.
pub async fn usage_pass_beyond_one_transaction_counts_once(b: &Backend) {
    let h = b.harness(T0).await;
    let Some(agg) = aggregator(&h, hourly_daily()).await else {
        return;
    };
    setup(&h).await;
    let mut led = Ledger::default();
    traffic(&h, &mut led, T0, 10).await;
    let rep = agg.pass().await.expect("pass");
    assert_eq!(rep.usage_changes, N, "{rep:?}");
    // One commit (the finalize) for 120 items: 99, then 21 with the finalize.
    assert_eq!((rep.commits, rep.snapshot_writes), (1, 2 * N), "{rep:?}");
    assert_eq!((rep.lost_races, rep.claims_finished), (0, 0), "{rep:?}");
    assert_eq!(got(&h).await, want(&led));
    assert!(!claimed(&h).await);
    // Two aggregators on the same checkpoint at once.
    traffic(&h, &mut led, T0 + 1000, 20).await;
    let other = aggregator(&h, hourly_daily()).await.expect("feed");
    let (x, y) = tokio::join!(agg.pass(), other.pass());
    let (x, y) = (x.expect("pass"), y.expect("pass"));
    assert_eq!(got(&h).await, want(&led), "{x:?} {y:?}");
    assert!(
        x.snapshot_writes + y.snapshot_writes >= 2 * N,
        "{x:?} {y:?}"
    );
    // Seven items per transaction: 18 transactions, still one commit.
    traffic(&h, &mut led, T0 + 2000, 30).await;
    let small = aggregator(
        &h,
        UsageOptions {
            commit_items: 7,
            ..hourly_daily()
        },
    )
    .await
    .expect("feed");
    let rep = small.pass().await.expect("pass");
    assert_eq!((rep.commits, rep.snapshot_writes), (1, 2 * N), "{rep:?}");
    assert_eq!(got(&h).await, want(&led));
    // Nothing left: a further pass counts nothing.
    let again = agg.pass().await.expect("pass");
    assert_eq!(again.usage_changes, 0, "{again:?}");
    assert_eq!(got(&h).await, want(&led));
}

#[derive(Debug, Clone, Copy)]
enum Finisher {
    /// The crashed aggregator itself, once the store answers again.
    Same,
    /// A fresh aggregator (the crashed process restarted).
    Fresh,
    /// Two fresh aggregators at once.
    Pair,
}

/// A pass that claimed the checkpoint and then failed — before any snapshot update, or
/// after the first of its two transactions — leaves the claim; the next pass finishes it:
/// the totals are exact (not lost, not doubled) and the claim is gone.
pub async fn usage_claim_left_by_a_crash_is_finished_once(b: &Backend) {
    for (after, finisher) in [
        (0, Finisher::Same),
        (1, Finisher::Same),
        (0, Finisher::Fresh),
        (1, Finisher::Fresh),
        (0, Finisher::Pair),
        (1, Finisher::Pair),
    ] {
        let h = b.harness(T0).await;
        let Some(feed) = h.raw.clone().change_feed() else {
            return;
        };
        setup(&h).await;
        let mut led = Ledger::default();
        traffic(&h, &mut led, T0, 10).await;
        // The store fails every transaction after the first `after` (the claim is an update).
        let down = Arc::new(AtomicBool::new(true));
        let sent = Arc::new(AtomicUsize::new(0));
        let (d, s) = (down.clone(), sent.clone());
        let on_transact = move |_: &[tollgate_store::TransactOp]| {
            (d.load(Ordering::SeqCst) && s.fetch_add(1, Ordering::SeqCst) >= after)
                .then(|| StoreError::Unavailable("crashed".into()))
        };
        let store = Intercept::new(h.raw.clone(), Box::new(|_| None), Box::new(on_transact));
        let crashing = crate::Limiter::builder(Arc::new(store))
            .clock(h.clock.clone())
            .build()
            .expect("limiter");
        let agg = FeedAggregator::new(&crashing, feed, hourly_daily()).expect("aggregator");
        let err = agg.pass().await;
        assert!(err.is_err(), "{after} {finisher:?}: {err:?}");
        assert!(claimed(&h).await, "{after} {finisher:?}: the claim is left");
        let partial = got(&h).await;
        let applied: usize = partial.len();
        assert_eq!(applied, if after == 0 { 0 } else { 99 }, "{finisher:?}");
        down.store(false, Ordering::SeqCst);
        let reps = match finisher {
            Finisher::Same => vec![agg.pass().await.expect("pass")],
            Finisher::Fresh => {
                let fresh = aggregator(&h, hourly_daily()).await.expect("feed");
                vec![fresh.pass().await.expect("pass")]
            }
            Finisher::Pair => {
                let x = aggregator(&h, hourly_daily()).await.expect("feed");
                let y = aggregator(&h, hourly_daily()).await.expect("feed");
                let (x, y) = tokio::join!(x.pass(), y.pass());
                vec![x.expect("pass"), y.expect("pass")]
            }
        };
        let finished: usize = reps.iter().map(|r| r.claims_finished).sum();
        assert!(finished >= 1, "{after} {finisher:?}: {reps:?}");
        let written: usize = reps.iter().map(|r| r.snapshot_writes).sum();
        // Exactly the updates the crash left out, each by one of the finishers.
        assert_eq!(written, 2 * N - applied, "{after} {finisher:?}: {reps:?}");
        assert_eq!(got(&h).await, want(&led), "{after} {finisher:?}: {reps:?}");
        assert!(!claimed(&h).await, "{after} {finisher:?}");
        // Nothing is left to count.
        let again = aggregator(&h, hourly_daily()).await.expect("feed");
        let rep = again.pass().await.expect("pass");
        assert_eq!((rep.usage_changes, rep.claims_finished), (0, 0), "{rep:?}");
        assert_eq!(got(&h).await, want(&led), "{after} {finisher:?}");
    }
}
