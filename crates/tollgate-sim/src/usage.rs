//! The feed aggregator as one more actor (`RunConfig::aggregator`), and the invariant
//! `usage-counted-once`: after the run, the usage snapshots equal the net consumption and the
//! admitted requests the bucket items hold — each change counted once, however the
//! aggregator was killed, restarted, duplicated or faulted.
//!
//! The actor runs small bounded passes between the clients' requests; now and then it is
//! "killed" (dropped, its in-memory read position lost, a fresh one started) or runs two
//! aggregators at once on the same checkpoint. Its passes commit 1, 2, 3 or 99 snapshot
//! items per transaction and sum up to 1 to 8 changes or the whole pass, so most of them
//! claim the checkpoint and apply in several transactions, and a fault between claim and
//! finalize leaves a claim for the next pass (rule "a pass's usage is applied exactly once:
//! claim, apply per item at most once, finalize"). Every store request it makes is a
//! scheduling point with the run's faults (lost responses, throttles, races, hangs).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::Rng;
use tollgate::{FeedAggregator, Limiter, Snapshot, UsageOptions, Window};
use tollgate_core::value::Value;
use tollgate_store::MemoryStore;

use crate::ledger::Violation;
use crate::sched::{Shared, SimStore, SkewClock};
use crate::workload::NS;

fn build(
    sh: &Arc<Shared>,
    id: usize,
    deadline: Option<Duration>,
    batch: usize,
    max: Option<usize>,
    (commit_items, max_pass_changes): (usize, usize),
    absorb: bool,
) -> Option<FeedAggregator> {
    let store = Arc::new(SimStore {
        client: id,
        sh: sh.clone(),
    });
    let clock = Arc::new(SkewClock {
        base: sh.now.clone(),
        skew: 0,
    });
    let mut b = Limiter::builder(store.clone()).namespace(NS).clock(clock);
    if let Some(d) = deadline {
        b = b.store_timeout(d);
    }
    let lim = b.build().ok()?;
    let feed: Arc<dyn tollgate_store::ChangeFeed> = match deadline {
        Some(d) => Arc::new(tollgate_store::Deadline::new(store, d)),
        None => store,
    };
    FeedAggregator::new(
        &lim,
        feed,
        UsageOptions {
            windows: vec![Window::Hourly, Window::Daily],
            batch,
            max_batches: max,
            commit_items,
            max_pass_changes,
            background: false,
            absorb,
            ..UsageOptions::default()
        },
    )
    .ok()
}

/// How a pass commits: snapshot items per transaction (few, so that most passes claim the
/// checkpoint and apply in several transactions) and changes per commit.
fn commits(rng: &mut SmallRng) -> (usize, usize) {
    let items = [1, 2, 3, 99][rng.gen_range(0..4)];
    let changes = if rng.gen_bool(0.5) {
        rng.gen_range(1..=8)
    } else {
        50_000
    };
    (items, changes)
}

/// An aggregator with its commit sizes, batch size and batches per pass drawn from `rng`.
fn drawn(
    sh: &Arc<Shared>,
    id: usize,
    deadline: Option<Duration>,
    rng: &mut SmallRng,
    absorb: bool,
) -> Option<FeedAggregator> {
    let c = commits(rng);
    let batch = rng.gen_range(1..=6);
    let max = rng.gen_range(1..=3);
    build(sh, id, deadline, batch, Some(max), c, absorb)
}

/// The absorbing aggregator of a run (`RunConfig::absorb`), kept for the final pass: the
/// usage it holds is in no feed any more.
pub type Absorber = Arc<std::sync::Mutex<Option<Arc<FeedAggregator>>>>;

/// The actor: `passes` bounded passes between the clients' requests — of the one absorbing
/// aggregator kept in `absorber` when there is one.
pub async fn aggregator(
    sh: Arc<Shared>,
    id: usize,
    mut rng: SmallRng,
    deadline: Option<Duration>,
    absorber: Option<Absorber>,
) {
    if let Some(slot) = absorber {
        return absorbing(sh, id, rng, deadline, slot).await;
    }
    let passes = rng.gen_range(4..=12);
    let mut agg = drawn(&sh, id, deadline, &mut rng, false);
    for _ in 0..passes {
        for _ in 0..rng.gen_range(5..=40) {
            sh.turn(id).await;
        }
        if rng.gen_bool(0.25) {
            // Killed and restarted: whatever it read past the checkpoint is forgotten.
            agg = drawn(&sh, id, deadline, &mut rng, false);
            trace(&sh, "AGGREGATOR restarted");
        }
        let Some(a) = &agg else { return };
        if rng.gen_bool(0.3) {
            // A duplicate on the same checkpoint, at the same time.
            let c = commits(&mut rng);
            if let Some(b) = build(&sh, id, deadline, rng.gen_range(1..=6), Some(2), c, false) {
                let (x, y) = tokio::join!(a.pass(), b.pass());
                trace(
                    &sh,
                    &format!("AGGREGATOR pair: {} / {}", outcome(&x), outcome(&y)),
                );
                continue;
            }
        }
        let r = a.pass().await;
        trace(&sh, &format!("AGGREGATOR pass: {}", outcome(&r)));
    }
}

/// The absorbing actor (rule "held usage is committed from memory, never re-read"): one
/// aggregator for the whole run — the sole consumer its option requires — that sums and
/// trims the feed at random turns between its passes, under the run's faults.
async fn absorbing(
    sh: Arc<Shared>,
    id: usize,
    mut rng: SmallRng,
    deadline: Option<Duration>,
    slot: Absorber,
) {
    let passes = rng.gen_range(4..=12);
    let Some(a) = drawn(&sh, id, deadline, &mut rng, true) else {
        return;
    };
    let a = Arc::new(a);
    *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(a.clone());
    for _ in 0..passes {
        for _ in 0..rng.gen_range(5..=40) {
            sh.turn(id).await;
            if rng.gen_bool(0.2) {
                if let Err(e) = a.absorb().await {
                    trace(&sh, &format!("AGGREGATOR absorb: error: {e}"));
                }
            }
        }
        let r = a.pass().await;
        trace(&sh, &format!("AGGREGATOR pass: {}", outcome(&r)));
    }
}

fn outcome(r: &tollgate::Result<tollgate::PassReport>) -> String {
    match r {
        Ok(p) => format!(
            "{} changes, {} with usage, {} commits, {} lost races, {} claims finished",
            p.changes, p.usage_changes, p.commits, p.lost_races, p.claims_finished
        ),
        Err(e) => format!("error: {e}"),
    }
}

fn trace(sh: &Shared, line: &str) {
    let mut g = sh.lock();
    if let Some(t) = g.trace.as_mut() {
        t.push(line.to_string());
    }
}

/// After quiesce (faults off): one unbounded pass of a fresh aggregator — or, for an
/// absorbing one, its own passes until one reads and commits nothing (each reads a few
/// batches).
pub async fn catch_up(
    sh: Arc<Shared>,
    id: usize,
    out: Arc<std::sync::Mutex<Vec<Violation>>>,
    absorber: Absorber,
) {
    let failed = |detail: String| {
        out.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Violation {
                invariant: "usage-counted-once",
                detail,
            });
    };
    let held = absorber.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(a) = held {
        for _ in 0..100_000 {
            match a.pass().await {
                // Read nothing and had nothing left to commit (a pass may commit what an
                // earlier one failed to, reading nothing itself).
                Ok(r) if r.changes == 0 && r.commits == 0 => return,
                Ok(_) => {}
                Err(e) => {
                    return failed(format!(
                        "a final pass of the absorbing aggregator failed with faults off: {e}"
                    ))
                }
            }
        }
        return failed("the absorbing aggregator never read the feed to its end".into());
    }
    let Some(a) = build(&sh, id, None, 100, None, (2, 50_000), false) else {
        return;
    };
    if let Err(e) = a.pass().await {
        failed(format!(
            "the final aggregator pass failed with faults off: {e}"
        ));
    }
}

/// Per `entity/resource`: (limit → millitokens, requests).
type Totals = BTreeMap<String, (BTreeMap<String, i64>, i64)>;

/// Without zero counters and entities that used nothing.
fn clean(m: &Totals) -> Totals {
    m.iter()
        .map(|(e, (l, r))| {
            let l: BTreeMap<String, i64> = l
                .iter()
                .filter(|(_, v)| **v != 0)
                .map(|(a, b)| (a.clone(), *b))
                .collect();
            (e.clone(), (l, *r))
        })
        .filter(|(_, (l, r))| !l.is_empty() || *r != 0)
        .collect()
}

/// `usage-counted-once`: per entity, resource and window kind, the snapshots' totals equal
/// the sum over the shards of each limit's `tc` and of `rq` (every resource a workload
/// charges: the multi-resource workload charges two).
pub fn check(mem: &MemoryStore, overdraw: &BTreeMap<(String, String), i64>) -> Vec<Violation> {
    let items = mem.raw_items();
    let mut truth: Totals = BTreeMap::new();
    let prefix = format!("{NS}/BUCKET#");
    for i in &items {
        let Some(pk) = i.get("PK").and_then(Value::as_s) else {
            continue;
        };
        if !pk.starts_with(&prefix) {
            continue;
        }
        let (Some(e), Some(r)) = (
            i.get("entity_id").and_then(Value::as_s),
            i.get("resource").and_then(Value::as_s),
        ) else {
            continue;
        };
        let t = truth.entry(format!("{e}/{r}")).or_default();
        for (k, v) in i {
            if let (Some(l), Some(n)) = (
                k.strip_prefix("b_").and_then(|r| r.strip_suffix("_tc")),
                v.as_n(),
            ) {
                if l != "wcu" {
                    *t.0.entry(l.to_string()).or_default() += n;
                }
            }
        }
        t.1 += i.get("rq").and_then(Value::as_n).unwrap_or(0);
    }
    let mut out = Vec::new();
    let mut overdrawn: Vec<BTreeMap<(String, String), i64>> = Vec::new();
    for w in [Window::Hourly, Window::Daily] {
        let mut got: Totals = BTreeMap::new();
        let mut od: BTreeMap<(String, String), i64> = BTreeMap::new();
        for s in items
            .iter()
            .filter_map(Snapshot::decode)
            .filter(|s| s.window == w)
        {
            let g = got
                .entry(format!("{}/{}", s.entity, s.resource))
                .or_default();
            for (l, m) in &s.milli {
                *g.0.entry(l.clone()).or_default() += m;
            }
            for (l, m) in &s.overdraw {
                let k = (format!("{}/{}", s.entity, s.resource), l.clone());
                *od.entry(k).or_default() += m;
            }
            g.1 += s.requests;
        }
        od.retain(|_, m| *m != 0);
        overdrawn.push(od);
        let (want, have) = (clean(&truth), clean(&got));
        if want != have {
            out.push(Violation {
                invariant: "usage-counted-once",
                detail: format!("{} snapshots {have:?}, buckets hold {want:?}", w.name()),
            });
        }
    }
    out.extend(check_overdraw(&overdrawn, overdraw));
    out
}

/// `usage-overdraw` (ADR-151): every window kind's snapshots count exactly the overdraw
/// the ledger computed from the images of every applied write (`ledger`: per
/// `entity/resource` and limit, the consumption that took a balance below zero), none
/// negative — each change counted once, none lost, through restarts and duplicate
/// aggregators. Not checked: "overdraw ≥ the debt the shards hold at the end": clean runs
/// end with small debts on enforced limits that no overdraw explains (refills and resets
/// that consume nothing), so that bound fails.
fn check_overdraw(
    per_window: &[BTreeMap<(String, String), i64>],
    ledger: &BTreeMap<(String, String), i64>,
) -> Vec<Violation> {
    let mut out = Vec::new();
    let v = |detail: String| Violation {
        invariant: "usage-overdraw",
        detail,
    };
    let Some(first) = per_window.first() else {
        return out;
    };
    for od in per_window {
        if let Some((k, m)) = od.iter().find(|(_, m)| **m < 0) {
            out.push(v(format!("{k:?}: negative overdraw {m}")));
        }
        if od != first {
            out.push(v(format!("window kinds disagree: {first:?} vs {od:?}")));
        }
        if od != ledger {
            out.push(v(format!(
                "snapshots count overdraw {od:?}, the applied writes made {ledger:?}"
            )));
        }
    }
    out
}
