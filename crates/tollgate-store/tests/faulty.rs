//! FaultyStore: seeded, counted, switchable fault injection.

use std::time::Duration;

use tollgate_core::expr::{Condition, ReturnValues, Update};
use tollgate_core::value::{Item, Key, Value};
use tollgate_store::{
    CancelReason, DeleteRequest, FaultConfig, FaultStats, FaultyStore, MemoryStore, PutRequest,
    Query, Store, StoreError, TransactOp, UpdateRequest,
};

fn only(f: impl FnOnce(&mut FaultConfig)) -> FaultConfig {
    let mut c = FaultConfig::none();
    f(&mut c);
    c
}

fn add(key: &Key, cond: Option<Condition>) -> UpdateRequest {
    UpdateRequest {
        key: key.clone(),
        update: Update::new().add("n", 1),
        condition: cond,
        returns: ReturnValues::None,
    }
}

fn n_of(item: Option<Item>) -> Option<i64> {
    item?.get("n")?.as_n()
}

async fn raw_n(s: &FaultyStore<MemoryStore>, key: &Key) -> Option<i64> {
    n_of(s.inner().raw_get(key))
}

/// A fixed mixed workload; returns every outcome, printed.
async fn workload(s: &FaultyStore<MemoryStore>) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..300u32 {
        let k = Key::new(format!("e{}", i % 7), "#STATE");
        let r = match i % 5 {
            0 => format!("{:?}", s.update(add(&k, None)).await),
            1 => format!(
                "{:?}",
                s.update(add(&k, Some(Condition::exists("PK")))).await
            ),
            2 => format!("{:?}", s.get(&k, false).await),
            3 => format!(
                "{:?}",
                s.transact_write(
                    vec![
                        TransactOp::Update(add(&k, None)),
                        TransactOp::Check {
                            key: Key::new("gate", "#STATE"),
                            condition: Condition::not_exists("PK"),
                        },
                    ],
                    None,
                )
                .await
            ),
            _ => format!("{:?}", s.query(Query::table(k.pk.to_string(), None)).await),
        };
        out.push(r);
    }
    out
}

#[tokio::test(start_paused = true)]
async fn same_seed_same_faults() {
    let cfg = FaultConfig::uniform(0.15);
    let a = FaultyStore::new(MemoryStore::new(), 42, cfg);
    let b = FaultyStore::new(MemoryStore::new(), 42, cfg);
    let c = FaultyStore::new(MemoryStore::new(), 43, cfg);
    let (ra, rb, rc) = (workload(&a).await, workload(&b).await, workload(&c).await);
    assert_eq!(ra, rb);
    assert_eq!(a.stats(), b.stats());
    assert_eq!(a.inner().raw_items(), b.inner().raw_items());
    assert_ne!(ra, rc, "another seed injects other faults");
    let st = a.stats();
    assert!(st.throttles > 0 && st.transaction_conflicts > 0 && st.condition_races > 0);
    assert!(
        st.lost_responses > 0 && st.stale_reads > 0 && st.delays > 0,
        "{st:?}"
    );
}

#[tokio::test]
async fn lost_response_applies_the_write() {
    let s = FaultyStore::new(MemoryStore::new(), 1, only(|c| c.lost_response = 1.0));
    let k = Key::new("k", "#STATE");
    let r = s.update(add(&k, None)).await;
    assert!(matches!(r, Err(StoreError::Ambiguous(_))), "{r:?}");
    assert_eq!(raw_n(&s, &k).await, Some(1), "applied despite the error");
    // A transaction with a token: lost, then resent with faults off, applies once.
    let tx = || vec![TransactOp::Update(add(&k, None))];
    let r = s.transact_write(tx(), Some("tok-1".into())).await;
    assert!(matches!(r, Err(StoreError::Ambiguous(_))));
    s.set_enabled(false);
    s.transact_write(tx(), Some("tok-1".into()))
        .await
        .expect("resent transaction");
    assert_eq!(raw_n(&s, &k).await, Some(2));
    // A refused write whose response is lost is still reported as unknown.
    s.set_enabled(true);
    let r = s.update(add(&k, Some(Condition::eq("n", 99)))).await;
    assert!(matches!(r, Err(StoreError::Ambiguous(_))));
    assert_eq!(raw_n(&s, &k).await, Some(2));
    assert_eq!(s.stats().lost_responses, 3);
    assert_eq!(s.stats().total(), 3);
}

#[tokio::test]
async fn throttling_applies_nothing() {
    let s = FaultyStore::new(MemoryStore::new(), 1, only(|c| c.throttle = 1.0));
    let k = Key::new("k", "#STATE");
    assert!(matches!(
        s.update(add(&k, None)).await,
        Err(StoreError::Throttled(_))
    ));
    assert!(matches!(
        s.put(PutRequest {
            key: k.clone(),
            item: Item::new(),
            condition: None
        })
        .await,
        Err(StoreError::Throttled(_))
    ));
    assert!(matches!(
        s.transact_write(vec![TransactOp::Update(add(&k, None))], None)
            .await,
        Err(StoreError::Throttled(_))
    ));
    assert!(matches!(
        s.get(&k, true).await,
        Err(StoreError::Throttled(_))
    ));
    assert!(matches!(
        s.query(Query::table("k", None)).await,
        Err(StoreError::Throttled(_))
    ));
    assert_eq!(s.inner().raw_items(), vec![]);
    assert_eq!(s.stats().throttles, 5);
    // Invalid requests are not faulted: their validation error stays exact.
    let bad = UpdateRequest {
        key: k.clone(),
        update: Update::new().set("a", 1).set("a", 2),
        condition: None,
        returns: ReturnValues::None,
    };
    assert!(matches!(
        s.update(bad).await,
        Err(StoreError::Validation(_))
    ));
}

#[tokio::test]
async fn transaction_conflicts() {
    let s = FaultyStore::new(
        MemoryStore::new(),
        7,
        only(|c| c.transaction_conflict = 1.0),
    );
    let (a, b, g) = (
        Key::new("a", "#STATE"),
        Key::new("b", "#STATE"),
        Key::new("g", "#STATE"),
    );
    assert_eq!(
        s.update(add(&a, None)).await,
        Err(StoreError::TransactionConflict)
    );
    for _ in 0..20 {
        let r = s
            .transact_write(
                vec![
                    TransactOp::Update(add(&a, None)),
                    TransactOp::Update(add(&b, None)),
                    TransactOp::Check {
                        key: g.clone(),
                        condition: Condition::not_exists("PK"),
                    },
                ],
                None,
            )
            .await;
        let Err(StoreError::TransactionCanceled { reasons }) = r else {
            panic!("want a cancelled transaction, got {r:?}");
        };
        assert_eq!(reasons.len(), 3);
        let conflicts = reasons
            .iter()
            .filter(|r| **r == CancelReason::TransactionConflict)
            .count();
        let innocent = reasons.iter().filter(|r| **r == CancelReason::None).count();
        assert_eq!((conflicts, innocent), (1, 2), "{reasons:?}");
    }
    assert_eq!(s.inner().raw_items(), vec![]);
    assert_eq!(s.stats().transaction_conflicts, 21);
}

#[tokio::test]
async fn condition_races_hit_only_conditional_writes() {
    let s = FaultyStore::new(MemoryStore::new(), 7, only(|c| c.condition_race = 1.0));
    let (a, b) = (Key::new("a", "#STATE"), Key::new("b", "#STATE"));
    s.update(add(&a, None)).await.expect("unconditional passes");
    let r = s.update(add(&a, Some(Condition::exists("PK")))).await;
    assert!(matches!(r, Err(StoreError::Throttled(_))), "{r:?}");
    let r = s
        .delete(DeleteRequest {
            key: a.clone(),
            condition: Some(Condition::exists("PK")),
        })
        .await;
    assert!(matches!(r, Err(StoreError::Throttled(_))), "{r:?}");
    assert_eq!(raw_n(&s, &a).await, Some(1));
    let r = s
        .transact_write(
            vec![
                TransactOp::Update(add(&b, None)),
                TransactOp::Update(add(&a, Some(Condition::exists("PK")))),
            ],
            None,
        )
        .await;
    assert_eq!(
        r,
        Err(StoreError::TransactionCanceled {
            reasons: vec![CancelReason::None, CancelReason::TransactionConflict]
        })
    );
    s.transact_write(vec![TransactOp::Update(add(&b, None))], None)
        .await
        .expect("unconditional transaction passes");
    assert_eq!(s.stats().condition_races, 3);
}

#[tokio::test]
async fn stale_reads_serve_the_previous_version() {
    let s = FaultyStore::new(MemoryStore::new(), 3, only(|c| c.stale_read = 1.0));
    let (a, b, c) = (Key::new("p", "A"), Key::new("p", "B"), Key::new("p", "C"));
    s.update(add(&a, None)).await.expect("a=1");
    s.update(add(&a, None)).await.expect("a=2");
    s.update(add(&b, None)).await.expect("b created");
    s.update(add(&c, None)).await.expect("c created");
    s.delete(DeleteRequest {
        key: c.clone(),
        condition: None,
    })
    .await
    .expect("c deleted");
    assert_eq!(n_of(s.get(&a, true).await.expect("get")), Some(2));
    // A stale single read always serves an earlier version: a was absent or 1.
    for _ in 0..20 {
        let v = n_of(s.get(&a, false).await.expect("get"));
        assert!(v.is_none() || v == Some(1), "a stale a is {v:?}");
        assert_eq!(
            s.get(&b, false).await.expect("get"),
            None,
            "b not yet visible"
        );
    }
    // A stale batch mixes, per item, the current version and earlier ones; c's current
    // version is "absent", its earlier ones absent or 1.
    let mut seen_c = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let got = s
            .batch_get(&[a.clone(), b.clone(), c.clone()], false)
            .await
            .expect("batch");
        let ns: Vec<Option<i64>> = got.into_iter().map(n_of).collect();
        assert!([None, Some(1), Some(2)].contains(&ns[0]), "{ns:?}");
        assert!([None, Some(1)].contains(&ns[1]), "{ns:?}");
        assert!([None, Some(1)].contains(&ns[2]), "{ns:?}");
        seen_c.insert(ns[2]);
    }
    assert_eq!(seen_c.len(), 2, "c seen both deleted and still there");
    let before = s.stats().stale_reads;
    // An eventually consistent query: a as it was, b absent, c back.
    let q = s.query(Query::table("p", None)).await.expect("query");
    let sks: Vec<(String, Option<i64>)> = q
        .iter()
        .map(|i| {
            (
                i.get("SK")
                    .and_then(Value::as_s)
                    .unwrap_or_default()
                    .to_string(),
                i.get("n").and_then(Value::as_n),
            )
        })
        .collect();
    assert_eq!(
        sks,
        vec![("A".to_string(), Some(1)), ("C".to_string(), Some(1))]
    );
    let mut cq = Query::table("p", None);
    cq.consistent = true;
    assert_eq!(s.query(cq).await.expect("query").len(), 2, "A and B");
    assert_eq!(s.stats().stale_reads, before + 1, "one stale query");
    assert_eq!(
        s.stats(),
        FaultStats {
            stale_reads: before + 1,
            ..FaultStats::default()
        }
    );
}

/// A stale read may lag several writes (up to `STALE_DEPTH`), never more.
#[tokio::test]
async fn stale_reads_lag_up_to_the_depth() {
    use tollgate_store::faulty::STALE_DEPTH;
    let s = FaultyStore::new(MemoryStore::new(), 9, only(|c| c.stale_read = 1.0));
    let a = Key::new("p", "A");
    for _ in 0..10 {
        s.update(add(&a, None)).await.expect("a += 1");
    }
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..200 {
        seen.insert(n_of(s.get(&a, false).await.expect("get")));
        seen.insert(n_of(
            s.batch_get(std::slice::from_ref(&a), false)
                .await
                .expect("batch")
                .remove(0),
        ));
    }
    let oldest = 10 - STALE_DEPTH as i64;
    let want: std::collections::BTreeSet<Option<i64>> = (oldest..=10).map(Some).collect();
    assert_eq!(
        seen, want,
        "every version from {oldest} to 10, nothing older"
    );
}

#[tokio::test(start_paused = true)]
async fn delays_are_bounded_and_counted() {
    let s = FaultyStore::new(
        MemoryStore::new(),
        9,
        only(|c| {
            c.delay = 1.0;
            c.max_delay = Duration::from_millis(40);
        }),
    );
    let k = Key::new("k", "#STATE");
    let start = tokio::time::Instant::now();
    for _ in 0..10 {
        let t = tokio::time::Instant::now();
        s.update(add(&k, None)).await.expect("update");
        assert!(t.elapsed() <= Duration::from_millis(40));
    }
    assert!(start.elapsed() > Duration::ZERO);
    assert_eq!(s.stats().delays, 10);
    assert_eq!(raw_n(&s, &k).await, Some(10));
}

#[tokio::test]
async fn switching_faults_off_and_on() {
    let s = FaultyStore::new(MemoryStore::new(), 5, only(|c| c.throttle = 1.0));
    let k = Key::new("k", "#STATE");
    s.set_enabled(false);
    assert!(!s.is_enabled());
    for _ in 0..5 {
        s.update(add(&k, None)).await.expect("faults off");
    }
    assert_eq!(s.stats().total(), 0);
    s.set_enabled(true);
    assert!(s.update(add(&k, None)).await.is_err());
    s.set_config(FaultConfig::none());
    s.update(add(&k, None)).await.expect("no faults configured");
    assert_eq!(raw_n(&s, &k).await, Some(6));
    assert_eq!(s.stats().throttles, 1);
}

// The conformance suite holds through the wrapper when it only delays requests (which also
// interleaves the concurrent check for real).
tollgate_store::conformance_tests!(faulty_store_with_delays_conforms, async {
    FaultyStore::new(
        MemoryStore::new(),
        11,
        only(|c| {
            c.delay = 0.3;
            c.max_delay = Duration::from_micros(300);
        }),
    )
});
