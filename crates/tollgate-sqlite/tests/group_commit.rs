//! Group commit and deadlines: concurrent operations share one SQLite transaction (one
//! fsync) yet each keeps its own condition and result; a locked file becomes `Unavailable`
//! within the deadline; reads see every acknowledged write.
//!
//! Batches are made deterministic by holding the file's write lock from a raw connection:
//! the writer takes the first request and waits in `BEGIN IMMEDIATE`, the next requests
//! queue behind it in a known order, and releasing the lock lets them run as one batch.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tollgate_core::expr::{Condition, ReturnValues, Update};
use tollgate_core::value::{Item, Key, Value};
use tollgate_sqlite::{SqliteConfig, SqliteStore};
use tollgate_store::{
    CancelReason, DeleteRequest, PutRequest, Store, StoreError, TransactOp, UpdateRequest,
};

fn item(pairs: &[(&str, Value)]) -> Item {
    pairs
        .iter()
        .map(|(k, v)| ((*k).into(), v.clone()))
        .collect()
}

fn debit(key: &Key) -> UpdateRequest {
    UpdateRequest {
        key: key.clone(),
        update: Update::new().add("n", -1),
        condition: Some(Condition::ge("n", 1)),
        returns: ReturnValues::None,
    }
}

async fn put_n(s: &dyn Store, key: &Key, n: i64) {
    s.put(PutRequest {
        key: key.clone(),
        item: item(&[("n", Value::N(n))]),
        condition: None,
    })
    .await
    .expect("put");
}

async fn n_of(s: &dyn Store, key: &Key) -> Option<i64> {
    s.get(key, true)
        .await
        .expect("get")
        .and_then(|i| i.get("n").and_then(Value::as_n))
}

/// Poll until `cond` holds; fail the test after 10 s (a bound for a broken build, not a
/// timing assertion).
async fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A raw connection holding the file's write lock until dropped or rolled back.
fn hold_write_lock(path: &std::path::Path) -> rusqlite::Connection {
    let holder = rusqlite::Connection::open(path).expect("raw open");
    holder.execute_batch("BEGIN IMMEDIATE").expect("take lock");
    holder
}

/// Spawn `fut` and wait until the store has queued one more request, so requests enter the
/// queue in the order they are spawned.
async fn spawn_queued<T: Send + 'static>(
    store: &SqliteStore,
    fut: impl Future<Output = T> + Send + 'static,
) -> JoinHandle<T> {
    let before = store.group_commit_stats().submitted;
    let h = tokio::spawn(fut);
    wait_until("the request is queued", || {
        store.group_commit_stats().submitted > before
    })
    .await;
    h
}

/// Open `path` with a long deadline, hold its lock, and park the writer in `BEGIN
/// IMMEDIATE` on a first request (a debit of `warm|#S`, stocked with 1).
async fn parked_writer(
    path: &std::path::Path,
    config: SqliteConfig,
) -> (
    Arc<SqliteStore>,
    rusqlite::Connection,
    JoinHandle<Result<Option<Item>, StoreError>>,
) {
    let store = Arc::new(SqliteStore::open_with(path, &config).expect("open"));
    put_n(store.as_ref(), &Key::new("warm", "#S"), 1).await;
    let holder = hold_write_lock(path);
    let batches = store.group_commit_stats().batches;
    let s = Arc::clone(&store);
    let first = tokio::spawn(async move { s.update(debit(&Key::new("warm", "#S"))).await });
    wait_until("the writer takes the first request", || {
        store.group_commit_stats().batches > batches
    })
    .await;
    (store, holder, first)
}

fn patient() -> SqliteConfig {
    SqliteConfig::default().with_deadline(Duration::from_secs(30))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_batch_gives_each_operation_its_own_result() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let (store, holder, first) = parked_writer(&path, patient()).await;
    let (stock, empty, audit, u, x) = (
        Key::new("stock", "#S"),
        Key::new("empty", "#S"),
        Key::new("audit", "1"),
        Key::new("u", "#S"),
        Key::new("x", "#S"),
    );
    // The lock is held, so the items are stocked by the batch itself, first in the queue.
    let mut queued = Vec::new();
    for (k, n) in [(&stock, 10), (&empty, 0), (&u, 1)] {
        let (s, k) = (Arc::clone(&store), k.clone());
        queued.push(
            spawn_queued(&store, async move {
                s.put(PutRequest {
                    key: k,
                    item: item(&[("n", Value::N(n))]),
                    condition: None,
                })
                .await
                .map(|()| None::<Item>)
            })
            .await,
        );
    }
    // 16 debits of a stock of 10.
    let mut debits = Vec::new();
    for _ in 0..16 {
        let (s, k) = (Arc::clone(&store), stock.clone());
        debits.push(spawn_queued(&store, async move { s.update(debit(&k)).await }).await);
    }
    // A transaction cancelled by its second operation: its first must not apply.
    let cancelled = {
        let (s, x, empty) = (Arc::clone(&store), x.clone(), empty.clone());
        spawn_queued(&store, async move {
            s.transact_write(
                vec![
                    TransactOp::Update(UpdateRequest {
                        key: x,
                        update: Update::new().add("n", 5),
                        condition: None,
                        returns: ReturnValues::None,
                    }),
                    TransactOp::Update(debit(&empty)),
                ],
                None,
            )
            .await
        })
        .await
    };
    // A transaction that applies, after it.
    let applied = {
        let (s, audit, u) = (Arc::clone(&store), audit.clone(), u.clone());
        spawn_queued(&store, async move {
            s.transact_write(
                vec![
                    TransactOp::Put(PutRequest {
                        key: audit,
                        item: Item::new(),
                        condition: Some(Condition::not_exists("PK")),
                    }),
                    TransactOp::Update(debit(&u)),
                ],
                Some("tok-1".into()),
            )
            .await
        })
        .await
    };
    // A put whose condition fails on an item written earlier in the same batch.
    let refused_put = {
        let (s, audit) = (Arc::clone(&store), audit.clone());
        spawn_queued(&store, async move {
            s.put(PutRequest {
                key: audit,
                item: Item::new(),
                condition: Some(Condition::not_exists("PK")),
            })
            .await
        })
        .await
    };
    // A delete of the item the cancelled transaction would have created: nothing to delete.
    let delete = {
        let (s, x) = (Arc::clone(&store), x.clone());
        spawn_queued(&store, async move {
            s.delete(DeleteRequest {
                key: x,
                condition: None,
            })
            .await
        })
        .await
    };
    let queued_requests = 3 + 16 + 4;
    let stats = store.group_commit_stats();
    assert_eq!(
        stats.batches, 2,
        "the warm-up put and the parked debit, nothing else yet"
    );

    drop(holder); // releases the lock; the parked batch and then the queued one run
    assert_eq!(first.await.unwrap(), Ok(None));
    for q in queued {
        assert_eq!(q.await.unwrap(), Ok(None));
    }
    let (mut ok, mut refused) = (0, 0);
    for d in debits {
        match d.await.unwrap() {
            Ok(None) => ok += 1,
            Err(StoreError::ConditionFailed { old: Some(old) }) => {
                assert_eq!(old.get("n"), Some(&Value::N(0)));
                refused += 1;
            }
            other => panic!("unexpected debit result {other:?}"),
        }
    }
    assert_eq!((ok, refused), (10, 6), "each debit saw the ones before it");
    match cancelled.await.unwrap() {
        Err(StoreError::TransactionCanceled { reasons }) => {
            assert_eq!(reasons[0], CancelReason::None);
            assert!(matches!(
                &reasons[1],
                CancelReason::ConditionFailed { old: Some(o) } if o.get("n") == Some(&Value::N(0))
            ));
        }
        other => panic!("expected a cancelled transaction, got {other:?}"),
    }
    assert_eq!(applied.await.unwrap(), Ok(()));
    match refused_put.await.unwrap() {
        Err(StoreError::ConditionFailed { old: Some(_) }) => {}
        other => panic!("expected the put's condition to fail, got {other:?}"),
    }
    assert_eq!(delete.await.unwrap(), Ok(None));

    let stats = store.group_commit_stats();
    assert_eq!(stats.batches, 3, "one more batch for everything queued");
    assert_eq!(stats.max_batch_requests, queued_requests);
    assert_eq!(stats.expired + stats.abandoned, 0);
    assert_eq!(n_of(store.as_ref(), &stock).await, Some(0));
    assert_eq!(n_of(store.as_ref(), &u).await, Some(0));
    assert_eq!(n_of(store.as_ref(), &Key::new("warm", "#S")).await, Some(0));
    assert_eq!(
        store.get(&x, true).await.unwrap(),
        None,
        "cancelled: x not created"
    );
    assert!(store.get(&audit, true).await.unwrap().is_some());
    // The token of the applied transaction was stored in that batch: a resend is a no-op.
    put_n(store.as_ref(), &u, 1).await;
    store
        .transact_write(
            vec![
                TransactOp::Put(PutRequest {
                    key: audit.clone(),
                    item: Item::new(),
                    condition: Some(Condition::not_exists("PK")),
                }),
                TransactOp::Update(debit(&u)),
            ],
            Some("tok-1".into()),
        )
        .await
        .unwrap();
    assert_eq!(n_of(store.as_ref(), &u).await, Some(1));
    // And all of it is in the file, for another connection.
    let other = SqliteStore::open(&path).unwrap();
    assert_eq!(n_of(&other, &stock).await, Some(0));
    assert_eq!(other.get(&x, true).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_respect_the_item_bound() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let (store, holder, first) = parked_writer(&path, patient().with_max_batch_ops(4)).await;
    let mut queued = Vec::new();
    // 10 single puts, then one transaction of 6 items (above the bound: it goes alone).
    for i in 0..10 {
        let s = Arc::clone(&store);
        queued.push(
            spawn_queued(&store, async move {
                put_n(s.as_ref(), &Key::new("p", i.to_string()), i).await;
            })
            .await,
        );
    }
    let big = {
        let s = Arc::clone(&store);
        spawn_queued(&store, async move {
            let ops = (0..6)
                .map(|i| {
                    TransactOp::Put(PutRequest {
                        key: Key::new("big", i.to_string()),
                        item: Item::new(),
                        condition: None,
                    })
                })
                .collect();
            s.transact_write(ops, None).await
        })
        .await
    };
    let before = store.group_commit_stats();
    drop(holder);
    first.await.unwrap().unwrap();
    for q in queued {
        q.await.unwrap();
    }
    big.await.unwrap().unwrap();
    let after = store.group_commit_stats();
    // Batches of 4, 4, 2 puts, then the transaction alone.
    assert_eq!(after.batches - before.batches, 4);
    assert_eq!(after.max_batch_requests, 4);
    assert_eq!(after.items - before.items, 10 + 6);
    for i in 0..10 {
        assert_eq!(
            n_of(store.as_ref(), &Key::new("p", i.to_string())).await,
            Some(i)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_caller_gave_up_is_not_applied() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let (store, holder, first) = parked_writer(&path, patient()).await;
    let k = Key::new("a", "#S");
    let s = Arc::clone(&store);
    let k2 = k.clone();
    let gave_up = spawn_queued(&store, async move { put_n(s.as_ref(), &k2, 7).await }).await;
    gave_up.abort();
    assert!(gave_up.await.unwrap_err().is_cancelled());
    drop(holder);
    first.await.unwrap().unwrap();
    // The writer skipped it: it is counted, and nothing was written.
    wait_until("the writer reaches the abandoned request", || {
        store.group_commit_stats().abandoned == 1
    })
    .await;
    assert_eq!(store.get(&k, true).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_write_lock_becomes_unavailable_within_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let deadline = Duration::from_millis(200);
    // The busy timeout stays at its 5 s default: the deadline is what bounds the wait.
    let store = Arc::new(
        SqliteStore::open_with(&path, &SqliteConfig::default().with_deadline(deadline)).unwrap(),
    );
    let k = Key::new("p", "a");
    put_n(store.as_ref(), &k, 3).await;
    let holder = hold_write_lock(&path);
    let start = Instant::now();
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let (s, k) = (Arc::clone(&store), k.clone());
            tokio::spawn(async move { (s.update(debit(&k)).await, Instant::now()) })
        })
        .collect();
    for c in calls {
        let (r, done) = c.await.unwrap();
        match &r {
            Err(e @ StoreError::Unavailable(_)) => assert!(e.is_unavailable()),
            other => panic!("expected Unavailable, got {other:?}"),
        }
        let took = done - start;
        assert!(
            took < deadline * 10,
            "answered after {took:?}, deadline {deadline:?}"
        );
    }
    // Reads do not wait for the lock in WAL mode.
    assert_eq!(n_of(store.as_ref(), &k).await, Some(3));
    holder.execute_batch("ROLLBACK").unwrap();
    // Nothing of the refused debits was applied; the store works again.
    assert_eq!(n_of(store.as_ref(), &k).await, Some(3));
    store.update(debit(&k)).await.unwrap();
    assert_eq!(n_of(store.as_ref(), &k).await, Some(2));
}

/// Every acknowledged write is visible to a read issued after the acknowledgement, on this
/// store's read connections and on another store's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_see_every_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let a = Arc::new(SqliteStore::open(&path).unwrap());
    let b = Arc::new(SqliteStore::open(&path).unwrap());
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let (a, b) = (Arc::clone(&a), Arc::clone(&b));
            tokio::spawn(async move {
                let k = Key::new(format!("e{t}"), "#S");
                for i in 1..=40i64 {
                    let new = a
                        .update(UpdateRequest {
                            key: k.clone(),
                            update: Update::new().add("n", 1),
                            condition: None,
                            returns: ReturnValues::AllNew,
                        })
                        .await
                        .unwrap()
                        .and_then(|i| i.get("n").and_then(Value::as_n));
                    assert_eq!(new, Some(i));
                    let reader: &dyn Store = if i % 2 == 0 { a.as_ref() } else { b.as_ref() };
                    assert_eq!(n_of(reader, &k).await, Some(i), "task {t}, write {i}");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let stats = a.group_commit_stats();
    assert_eq!(stats.requests, 16 * 40);
    eprintln!(
        "16 tasks × 40 writes: {} batches, mean {:.1}, largest {}",
        stats.batches,
        stats.mean_batch_requests(),
        stats.max_batch_requests
    );
}

/// 2 stores on one file × 16 tasks × 40 conditional debits of a stock of 1000: exactly 1000
/// succeed, whatever the batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_debits_from_two_stores_are_exact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let stores = [
        Arc::new(SqliteStore::open(&path).unwrap()),
        Arc::new(SqliteStore::open(&path).unwrap()),
    ];
    let k = Key::new("bucket", "#S");
    put_n(stores[0].as_ref(), &k, 1000).await;
    let mut tasks = Vec::new();
    for s in &stores {
        for _ in 0..16 {
            let (s, k) = (Arc::clone(s), k.clone());
            tasks.push(tokio::spawn(async move {
                let mut ok = 0u32;
                for _ in 0..40 {
                    match s.update(debit(&k)).await {
                        Ok(_) => ok += 1,
                        Err(StoreError::ConditionFailed { .. }) => {}
                        Err(e) => panic!("unexpected error: {e}"),
                    }
                }
                ok
            }));
        }
    }
    let mut ok = 0;
    for t in tasks {
        ok += t.await.unwrap();
    }
    assert_eq!(ok, 1000);
    assert_eq!(n_of(stores[1].as_ref(), &k).await, Some(0));
    for s in &stores {
        let st = s.group_commit_stats();
        eprintln!(
            "store: {} batches for {} requests (largest {})",
            st.batches, st.requests, st.max_batch_requests
        );
    }
}

#[test]
fn settings_that_cannot_work_are_refused() {
    for (cfg, what) in [
        (
            SqliteConfig::default().with_deadline(Duration::ZERO),
            "deadline",
        ),
        (
            SqliteConfig::default().with_max_batch_ops(0),
            "max_batch_ops",
        ),
    ] {
        match SqliteStore::open_with(tollgate_sqlite::IN_MEMORY, &cfg) {
            Err(StoreError::Validation(m)) => assert!(m.contains(what), "{m}"),
            other => panic!("expected Validation for {what}, got {other:?}"),
        }
    }
}
