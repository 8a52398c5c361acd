//! MemoryStore's per-item write ceiling.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use tollgate_core::expr::{Condition, ReturnValues, Update};
use tollgate_core::value::{Item, Key, Value};
use tollgate_store::{
    DeleteRequest, MemoryStore, PutRequest, Store, StoreError, TransactOp, UpdateRequest,
};

fn store(per_second: u32) -> (MemoryStore, Arc<AtomicI64>) {
    let now = Arc::new(AtomicI64::new(1_800_000_000_000));
    let c = now.clone();
    (
        MemoryStore::with_write_ceiling(per_second, Arc::new(move || c.load(Ordering::SeqCst))),
        now,
    )
}

fn add(key: &Key) -> UpdateRequest {
    UpdateRequest {
        key: key.clone(),
        update: Update::new().add("n", 1),
        condition: None,
        returns: ReturnValues::None,
    }
}

async fn n(s: &MemoryStore, key: &Key) -> Option<i64> {
    s.get(key, true).await.ok().flatten()?.get("n")?.as_n()
}

#[tokio::test]
async fn burst_then_throttle_then_refill() {
    let (s, now) = store(3);
    let a = Key::new("a", "#STATE");
    for _ in 0..3 {
        s.update(add(&a)).await.expect("within the ceiling");
    }
    let r = s.update(add(&a)).await;
    assert!(matches!(r, Err(StoreError::Throttled(_))), "{r:?}");
    assert_eq!(
        n(&s, &a).await,
        Some(3),
        "a throttled write changes nothing"
    );
    // Another item has its own bucket; reads are never throttled.
    s.update(add(&Key::new("b", "#STATE")))
        .await
        .expect("own bucket");
    for _ in 0..10 {
        s.get(&a, true).await.expect("reads pass");
    }
    // 333 ms refill 999 milli-writes: not yet one write.
    now.fetch_add(333, Ordering::SeqCst);
    assert!(matches!(
        s.update(add(&a)).await,
        Err(StoreError::Throttled(_))
    ));
    now.fetch_add(1, Ordering::SeqCst);
    s.update(add(&a)).await.expect("refilled one write");
    assert!(matches!(
        s.update(add(&a)).await,
        Err(StoreError::Throttled(_))
    ));
    // A long idle time refills at most a full bucket.
    now.fetch_add(60_000, Ordering::SeqCst);
    for _ in 0..3 {
        s.update(add(&a)).await.expect("full bucket again");
    }
    assert!(matches!(
        s.update(add(&a)).await,
        Err(StoreError::Throttled(_))
    ));
    assert_eq!(n(&s, &a).await, Some(7));
}

#[tokio::test]
async fn puts_deletes_and_failed_conditions_count() {
    let (s, _now) = store(3);
    let k = Key::new("k", "#STATE");
    s.put(PutRequest {
        key: k.clone(),
        item: Item::new(),
        condition: None,
    })
    .await
    .expect("put");
    let r = s
        .put(PutRequest {
            key: k.clone(),
            item: Item::new(),
            condition: Some(Condition::not_exists("PK")),
        })
        .await;
    assert!(matches!(r, Err(StoreError::ConditionFailed { .. })));
    s.delete(DeleteRequest {
        key: k.clone(),
        condition: None,
    })
    .await
    .expect("delete");
    let r = s
        .delete(DeleteRequest {
            key: k.clone(),
            condition: None,
        })
        .await;
    assert!(matches!(r, Err(StoreError::Throttled(_))), "{r:?}");
}

#[tokio::test]
async fn transactions_charge_every_item_all_or_nothing() {
    let (s, now) = store(2);
    let (a, b) = (Key::new("a", "#STATE"), Key::new("b", "#STATE"));
    s.update(add(&a)).await.expect("a 1");
    s.update(add(&a)).await.expect("a 2");
    let tx = || {
        vec![
            TransactOp::Update(add(&b)),
            TransactOp::Check {
                key: a.clone(),
                condition: Condition::exists("PK"),
            },
        ]
    };
    let r = s.transact_write(tx(), None).await;
    assert!(matches!(r, Err(StoreError::Throttled(_))), "{r:?}");
    assert_eq!(n(&s, &b).await, None, "nothing applied");
    // b's bucket was not charged by the refused transaction: two writes remain.
    s.update(add(&b)).await.expect("b 1");
    s.update(add(&b)).await.expect("b 2");
    assert!(matches!(
        s.update(add(&b)).await,
        Err(StoreError::Throttled(_))
    ));
    now.fetch_add(500, Ordering::SeqCst);
    s.transact_write(tx(), None)
        .await
        .expect("one write each refilled");
    assert_eq!(n(&s, &b).await, Some(3));
}

#[tokio::test]
async fn zero_ceiling_refuses_writes_and_no_ceiling_never_throttles() {
    let (s, _) = store(0);
    let k = Key::new("k", "#STATE");
    assert!(matches!(
        s.update(add(&k)).await,
        Err(StoreError::Throttled(_))
    ));
    let plain = MemoryStore::new();
    for _ in 0..1000 {
        plain.update(add(&k)).await.expect("no ceiling");
    }
    assert_eq!(
        plain
            .get(&k, true)
            .await
            .expect("get")
            .and_then(|i| i.get("n").cloned()),
        Some(Value::N(1000))
    );
}
