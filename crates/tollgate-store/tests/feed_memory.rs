//! The change-feed conformance checks on the reference store, through every wrapper, and
//! on a broken feed (the checks must be able to fail).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tollgate_core::value::{Item, Key};
use tollgate_store::conformance::feed::{feed_checks, run_feed_all};
use tollgate_store::conformance::report;
use tollgate_store::{
    ChangeFeed, Counting, Deadline, DeleteRequest, FaultConfig, FaultyStore, FeedBatch, FeedCursor,
    MemoryStore, PutRequest, Query, Store, StoreError, TransactOp, UpdateRequest,
};

async fn memory() -> Box<dyn ChangeFeed> {
    Box::new(MemoryStore::with_change_feed())
}

#[tokio::test]
async fn memory_feed_conforms() {
    let results = run_feed_all(memory).await;
    assert_eq!(results.len(), feed_checks().len());
    assert!(results.len() >= 4);
    report(&results).expect("memory feed");
}

#[tokio::test]
async fn feed_conforms_through_the_wrappers() {
    let results = run_feed_all(|| async {
        let faulty = FaultyStore::new(MemoryStore::with_change_feed(), 7, FaultConfig::none());
        let b: Box<dyn ChangeFeed> = Box::new(Counting::new(Deadline::new(
            Arc::new(faulty),
            Duration::from_secs(5),
        )));
        b
    })
    .await;
    report(&results).expect("wrapped feed");
}

/// A feed that loses old images.
struct NoOldImages(MemoryStore);

#[async_trait]
impl ChangeFeed for NoOldImages {
    async fn read_feed(&self, cursor: &FeedCursor, limit: usize) -> Result<FeedBatch, StoreError> {
        let mut b = self.0.read_feed(cursor, limit).await?;
        for c in &mut b.changes {
            c.old = None;
        }
        Ok(b)
    }
}

#[async_trait]
impl Store for NoOldImages {
    async fn get(&self, key: &Key, consistent: bool) -> Result<Option<Item>, StoreError> {
        self.0.get(key, consistent).await
    }
    async fn batch_get(&self, keys: &[Key], c: bool) -> Result<Vec<Option<Item>>, StoreError> {
        self.0.batch_get(keys, c).await
    }
    async fn put(&self, req: PutRequest) -> Result<(), StoreError> {
        self.0.put(req).await
    }
    async fn update(&self, req: UpdateRequest) -> Result<Option<Item>, StoreError> {
        self.0.update(req).await
    }
    async fn delete(&self, req: DeleteRequest) -> Result<Option<Item>, StoreError> {
        self.0.delete(req).await
    }
    async fn transact_write(
        &self,
        ops: Vec<TransactOp>,
        token: Option<String>,
    ) -> Result<(), StoreError> {
        self.0.transact_write(ops, token).await
    }
    async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError> {
        self.0.query(q).await
    }
    fn backend(&self) -> &'static str {
        "no-old-images"
    }
}

#[tokio::test]
async fn a_feed_without_old_images_fails_named_checks() {
    let results = run_feed_all(|| async {
        let b: Box<dyn ChangeFeed> = Box::new(NoOldImages(MemoryStore::with_change_feed()));
        b
    })
    .await;
    let failed: Vec<&str> = results
        .iter()
        .filter(|(_, r)| r.is_err())
        .map(|(n, _)| *n)
        .collect();
    assert!(failed.contains(&"feed_records_each_write"), "{failed:?}");
    assert!(
        failed.contains(&"feed_cursor_resumes_in_order"),
        "{failed:?}"
    );
}

#[tokio::test]
async fn trimmed_changes_are_refused_not_skipped() {
    let s = MemoryStore::with_change_feed();
    for i in 0..3 {
        s.put(PutRequest {
            key: Key::new("t", format!("{i}")),
            item: Default::default(),
            condition: None,
        })
        .await
        .expect("put");
    }
    let b = s.read_feed(&FeedCursor::start(), 2).await.expect("read");
    assert_eq!(b.changes.len(), 2);
    // Nothing is older than the retention yet: nothing goes.
    s.trim_feed(&b.cursor, 0).await.expect("trim");
    assert_eq!(
        s.read_feed(&FeedCursor::start(), 10)
            .await
            .expect("read")
            .changes
            .len(),
        3
    );
    s.trim_feed(&b.cursor, i64::MAX).await.expect("trim");
    let rest = s.read_feed(&b.cursor, 10).await.expect("read rest");
    assert_eq!(rest.changes.len(), 1);
    assert_eq!(rest.changes[0].position.seq, "3");
    let err = s.read_feed(&FeedCursor::start(), 10).await;
    assert!(matches!(err, Err(StoreError::Validation(_))), "{err:?}");
}

/// The versions a trim lets go of are written over by later copies (`MemoryStore` keeps
/// them for reuse): whatever shape the items have, every read, every returned image and
/// every change the feed shows is the one a store that never trims shows, and nothing of
/// another item or an older version shows through.
#[tokio::test]
async fn reused_versions_hold_only_their_own_item() {
    use tollgate_core::expr::{ReturnValues, Update};
    let trimmed = MemoryStore::with_change_feed();
    let kept = MemoryStore::with_change_feed();
    let mut cursor = FeedCursor::start();
    let mut seen = FeedCursor::start();
    for round in 0..40i64 {
        for k in 0..5i64 {
            let key = Key::new("t", format!("{k}"));
            // Items of three shapes, and attributes that come and go.
            let mut u = Update::new()
                .add("n", round + k)
                .set("s", format!("r{round}k{k}"));
            if (round + k) % 3 == 0 {
                u = u.set(format!("extra{k}"), round);
            } else {
                u = u.remove(format!("extra{k}"));
            }
            if k == 4 {
                u = u.set(
                    "long",
                    "x".repeat(usize::try_from(round % 7 * 20).unwrap_or(0)),
                );
            }
            let req = UpdateRequest {
                key: key.clone(),
                update: u,
                condition: None,
                returns: ReturnValues::AllNew,
            };
            let a = trimmed.update(req.clone()).await.expect("update");
            let b = kept.update(req).await.expect("update");
            assert_eq!(a, b, "round {round} key {k}: the returned image");
        }
        let batch = trimmed.read_feed(&cursor, 1_000).await.expect("read");
        let reference = kept.read_feed(&seen, 1_000).await.expect("read");
        let strip = |b: &FeedBatch| {
            b.changes
                .iter()
                .map(|c| (c.key.clone(), c.old.clone(), c.new.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            strip(&batch),
            strip(&reference),
            "round {round}: the changes"
        );
        cursor = batch.cursor;
        seen = reference.cursor;
        // Every other round keeps a change back, so some versions stay shared.
        if round % 2 == 0 {
            trimmed.trim_feed(&cursor, i64::MAX).await.expect("trim");
        }
    }
    for k in 0..5 {
        let key = Key::new("t", format!("{k}"));
        assert_eq!(
            trimmed.get(&key, true).await.expect("get"),
            kept.get(&key, true).await.expect("get"),
            "key {k}"
        );
    }
}

/// Transactions update existing items in reused versions' memory: through rounds of
/// two-item transactions (shapes that change, writes that change nothing, transactions a
/// failed check cancels), with the feed trimmed every other round so versions are reused,
/// every item and every change is the one a model of the writes says — a cancelled
/// transaction writes and logs nothing, an update that changes nothing is no change, and
/// nothing of another item or an older version shows through.
#[tokio::test]
async fn transactions_in_reused_versions_hold_only_their_own_item() {
    use std::collections::BTreeMap;
    use tollgate_core::expr::{Condition, ReturnValues, Update};
    use tollgate_core::value::Value;
    let store = MemoryStore::with_change_feed();
    let mut cursor = FeedCursor::start();
    let mut model: BTreeMap<i64, Item> = BTreeMap::new();
    for round in 0..40i64 {
        let mut expected = Vec::new();
        for pair in 0..3i64 {
            let mut ops = Vec::new();
            let mut after = Vec::new();
            for k in [pair * 2, pair * 2 + 1] {
                let key = Key::new("t", format!("{k}"));
                // Every fourth round writes what the item already holds.
                let n = if round % 4 == 3 { round - 1 } else { round };
                let mut u = Update::new().set("n", n).set("s", format!("k{k}r{n}"));
                let mut item = model.get(&k).cloned().unwrap_or_else(|| {
                    let mut i = Item::new();
                    key.stamp(&mut i);
                    i
                });
                item.insert("n".into(), Value::N(n));
                item.insert("s".into(), Value::S(format!("k{k}r{n}")));
                if (n + k) % 3 == 0 {
                    u = u.set(format!("extra{k}"), n);
                    item.insert(format!("extra{k}").into(), Value::N(n));
                } else {
                    u = u.remove(format!("extra{k}"));
                    item.remove(format!("extra{k}").as_str());
                }
                ops.push(TransactOp::Update(UpdateRequest {
                    key: key.clone(),
                    update: u,
                    condition: None,
                    returns: ReturnValues::None,
                }));
                after.push((k, key, item));
            }
            let cancel = (round + pair) % 5 == 4;
            if cancel {
                ops.push(TransactOp::Check {
                    key: Key::new("t", "absent"),
                    condition: Condition::exists("PK"),
                });
            }
            let r = store.transact_write(ops, None).await;
            assert_eq!(r.is_ok(), !cancel, "round {round} pair {pair}: {r:?}");
            if cancel {
                continue;
            }
            for (k, key, item) in after {
                let old = model.insert(k, item.clone());
                if old.as_ref() != Some(&item) {
                    expected.push((key, old, Some(item)));
                }
            }
        }
        let batch = store.read_feed(&cursor, 1_000).await.expect("read");
        let got: Vec<_> = batch
            .changes
            .iter()
            .map(|c| {
                (
                    c.key.clone(),
                    c.old.as_deref().cloned(),
                    c.new.as_deref().cloned(),
                )
            })
            .collect();
        assert_eq!(got, expected, "round {round}: the changes");
        cursor = batch.cursor;
        if round % 2 == 0 {
            store.trim_feed(&cursor, i64::MAX).await.expect("trim");
        }
        for (k, item) in &model {
            let key = Key::new("t", format!("{k}"));
            let stored = store.get(&key, true).await.expect("get");
            assert_eq!(stored.as_ref(), Some(item), "round {round} key {k}");
        }
    }
}
