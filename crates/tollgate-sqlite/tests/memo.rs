//! The writer's memo of the rows it wrote (`ops::Memo`): a write of a remembered row skips
//! reading it only while no other connection has committed and nothing the memo remembers
//! was rolled back. Each test makes the memo wrong in one way (another connection's write, a
//! transaction rolled back to its savepoint, a whole batch rolled back) and checks that the
//! next write sees the row as stored: its condition, its result and its change row.
//!
//! Faults are injected with triggers on the `changes` table, created from a raw connection.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::{params, Connection, OptionalExtension};
use tollgate_core::expr::{Condition, ReturnValues, Update};
use tollgate_core::value::{Item, Key, Value};
use tollgate_sqlite::{SqliteConfig, SqliteStore};
use tollgate_store::{
    ChangeFeed, DeleteRequest, FeedCursor, FeedPosition, PutRequest, Store, StoreError, TransactOp,
    UpdateRequest,
};

/// A store on a new file named `name` in a temporary directory (kept while the first
/// element lives), its path, and a second, raw connection to the same file.
fn store_and_raw(
    name: &str,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    SqliteStore,
    Connection,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    let s = SqliteStore::open(&path).unwrap();
    let raw = Connection::open(&path).unwrap();
    (dir, path, s, raw)
}

/// `ADD n` under `condition`, answering the new item.
fn add(k: &Key, n: i64, condition: Option<Condition>) -> UpdateRequest {
    UpdateRequest {
        key: k.clone(),
        update: Update::new().add("n", n),
        condition,
        returns: ReturnValues::AllNew,
    }
}

fn n_of(i: Option<&Item>) -> Option<i64> {
    i.and_then(|i| i.get("n")).and_then(Value::as_n)
}

/// An item as another program would store it: valid, but not byte for byte the text this
/// store writes (spaces), so a stale memo cannot pass for it.
fn foreign_text(k: &Key, n: i64) -> String {
    format!(
        r#"{{ "PK": {{"s": "{}"}}, "SK": {{"s": "{}"}}, "n": {{"n": {n}}} }}"#,
        k.pk, k.sk
    )
}

fn write_foreign(raw: &Connection, k: &Key, n: i64) -> String {
    let text = foreign_text(k, n);
    raw.execute(
        "INSERT OR REPLACE INTO items (pk, sk, item) VALUES (?1, ?2, ?3)",
        params![k.pk, k.sk, text],
    )
    .expect("foreign write");
    text
}

fn stored_text(raw: &Connection, k: &Key) -> Option<String> {
    raw.query_row(
        "SELECT item FROM items WHERE pk = ?1 AND sk = ?2",
        params![k.pk, k.sk],
        |r| r.get(0),
    )
    .optional()
    .expect("read the row")
}

/// The old and new images of the newest change, as another process reads them off the feed:
/// decoded from the stored row (the old one rebuilt from its difference to the new one when
/// it is stored as one).
async fn last_change(path: &Path) -> (Option<Item>, Option<Item>) {
    let raw = Connection::open(path).unwrap();
    let newest: i64 = raw
        .query_row("SELECT max(seq) FROM changes", [], |r| r.get(0))
        .expect("read the feed");
    let other = SqliteStore::open(path).unwrap();
    let mut at = FeedCursor::start();
    if newest > 1 {
        at.advance(&FeedPosition {
            stream: String::new(),
            seq: (newest - 1).to_string(),
        });
    }
    let batch = other.read_feed(&at, 1).await.expect("read the feed");
    let change = batch.changes.into_iter().next().expect("the newest change");
    let owned = |i: Option<Arc<Item>>| i.map(|i| Item::clone(&i));
    (owned(change.old), owned(change.new))
}

/// A stored text, decoded.
fn decoded(text: Option<String>) -> Option<Item> {
    text.map(|t| serde_json::from_str(&t).expect("an item"))
}

/// Two writes of `k` by the store, so the second ran with the memo trusted (an unchanged
/// file since the previous batch) and the memo holds `k`.
async fn remembered(s: &SqliteStore, k: &Key) -> i64 {
    s.update(add(k, 1, None)).await.expect("update");
    let n = n_of(s.update(add(k, 1, None)).await.expect("update").as_ref());
    n.expect("n")
}

/// Every kind of write of a row the memo holds, after another connection wrote that row:
/// each sees the other's value (its condition, its answer) and records the other's text,
/// byte for byte, as the change's old image.
#[tokio::test]
async fn a_row_another_connection_wrote_between_two_of_our_writes_is_read() {
    let (_dir, path, s, raw) = store_and_raw("memo.db");
    let k = Key::new("memo", "k");

    // update: the condition holds only on the other's value.
    assert_eq!(remembered(&s, &k).await, 2);
    let theirs = write_foreign(&raw, &k, 50);
    let new = s.update(add(&k, -10, Some(Condition::ge("n", 40)))).await;
    assert_eq!(n_of(new.unwrap().as_ref()), Some(40));
    assert_eq!(
        last_change(&path).await,
        (decoded(Some(theirs)), decoded(stored_text(&raw, &k)))
    );

    // update: the condition fails on the other's value, and writes nothing.
    let theirs = write_foreign(&raw, &k, 0);
    match s.update(add(&k, -1, Some(Condition::ge("n", 1)))).await {
        Err(StoreError::ConditionFailed { old }) => assert_eq!(n_of(old.as_deref()), Some(0)),
        other => panic!("the debit must fail on the other's n = 0, got {other:?}"),
    }
    assert_eq!(stored_text(&raw, &k), Some(theirs));

    // update after the other deleted the row: it is absent.
    assert_eq!(remembered(&s, &k).await, 2);
    raw.execute("DELETE FROM items WHERE pk = 'memo' AND sk = 'k'", [])
        .unwrap();
    let new = s.update(add(&k, 7, Some(Condition::not_exists("n")))).await;
    assert_eq!(n_of(new.unwrap().as_ref()), Some(7));
    assert_eq!(last_change(&path).await.0, None);

    // conditional put.
    assert_eq!(remembered(&s, &k).await, 9);
    let theirs = write_foreign(&raw, &k, 60);
    let item: Item = [("n".into(), Value::N(1))].into_iter().collect();
    s.put(PutRequest {
        key: k.clone(),
        item,
        condition: Some(Condition::eq("n", 60)),
    })
    .await
    .expect("the put's condition holds on the other's value");
    assert_eq!(
        last_change(&path).await,
        (decoded(Some(theirs)), decoded(stored_text(&raw, &k)))
    );

    // unconditional put: the old image is still the other's text.
    remembered(&s, &k).await;
    let theirs = write_foreign(&raw, &k, 61);
    let item: Item = [("n".into(), Value::N(2))].into_iter().collect();
    s.put(PutRequest {
        key: k.clone(),
        item,
        condition: None,
    })
    .await
    .unwrap();
    assert_eq!(last_change(&path).await.0, decoded(Some(theirs)));

    // delete: answers the other's item.
    assert_eq!(remembered(&s, &k).await, 4);
    let theirs = write_foreign(&raw, &k, 70);
    let old = s
        .delete(DeleteRequest {
            key: k.clone(),
            condition: Some(Condition::eq("n", 70)),
        })
        .await
        .unwrap();
    assert_eq!(n_of(old.as_ref()), Some(70));
    assert_eq!(last_change(&path).await, (decoded(Some(theirs)), None));

    // purge.
    assert_eq!(remembered(&s, &k).await, 2);
    let theirs = write_foreign(&raw, &k, 80);
    s.purge(&k).await.unwrap();
    assert_eq!(last_change(&path).await, (decoded(Some(theirs)), None));
    assert_eq!(stored_text(&raw, &k), None);

    // transact_write.
    assert_eq!(remembered(&s, &k).await, 2);
    let theirs = write_foreign(&raw, &k, 90);
    s.transact_write(
        vec![TransactOp::Update(add(&k, 1, Some(Condition::eq("n", 90))))],
        None,
    )
    .await
    .expect("the transaction's condition holds on the other's value");
    assert_eq!(
        last_change(&path).await,
        (decoded(Some(theirs)), decoded(stored_text(&raw, &k)))
    );

    // And a second store on the file (another process, as far as the first can tell).
    assert_eq!(remembered(&s, &k).await, 93);
    let b = SqliteStore::open(&path).unwrap();
    let theirs = n_of(b.update(add(&k, 1000, None)).await.unwrap().as_ref());
    let ours = n_of(s.update(add(&k, 1, None)).await.unwrap().as_ref());
    assert_eq!(ours, theirs.map(|n| n + 1));
}

/// The store's own deletes (`delete`, `purge`, a transaction's delete) of a row the memo
/// holds, with the memo trusted: the next write finds the row absent.
#[tokio::test]
async fn our_own_deletes_leave_nothing_remembered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deletes.db");
    let s = SqliteStore::open(&path).unwrap();
    let k = Key::new("memo", "k");
    let absent = || add(&k, 1, Some(Condition::not_exists("n")));
    assert_eq!(remembered(&s, &k).await, 2);
    s.purge(&k).await.unwrap();
    assert_eq!(n_of(s.update(absent()).await.unwrap().as_ref()), Some(1));
    assert_eq!(remembered(&s, &k).await, 3);
    let gone = DeleteRequest {
        key: k.clone(),
        condition: None,
    };
    s.delete(gone.clone()).await.unwrap();
    assert_eq!(n_of(s.update(absent()).await.unwrap().as_ref()), Some(1));
    assert_eq!(remembered(&s, &k).await, 3);
    s.transact_write(vec![TransactOp::Delete(gone)], None)
        .await
        .unwrap();
    assert_eq!(n_of(s.update(absent()).await.unwrap().as_ref()), Some(1));
}

/// Make every change row of an item in partition `boom` fail with `RAISE(action, ...)`
/// (`ABORT`: the statement and the transaction's savepoint; `ROLLBACK`: the whole batch).
fn fail_changes_of_boom(raw: &Connection, action: &str) {
    raw.execute_batch(&format!(
        "CREATE TRIGGER boom BEFORE INSERT ON changes WHEN NEW.pk = 'boom'
         BEGIN SELECT RAISE({action}, 'injected fault'); END;"
    ))
    .unwrap();
}

/// A transaction rolled back to its savepoint after it wrote a row the memo holds (a later
/// operation of it failed): the next write of that row sees the value from before the
/// transaction.
#[tokio::test]
async fn a_write_after_a_rolled_back_transaction_sees_the_value_before_it() {
    let (_dir, path, s, raw) = store_and_raw("savepoint.db");
    fail_changes_of_boom(&raw, "ABORT");
    let k = Key::new("memo", "k");
    assert_eq!(remembered(&s, &k).await, 2);
    let before = stored_text(&raw, &k);
    let boom: Item = [("n".into(), Value::N(1))].into_iter().collect();
    let r = s
        .transact_write(
            vec![
                // Written (and remembered) first, then taken back when the put fails.
                TransactOp::Update(add(&k, 10, None)),
                TransactOp::Put(PutRequest {
                    key: Key::new("boom", "x"),
                    item: boom,
                    condition: None,
                }),
            ],
            None,
        )
        .await;
    assert!(
        matches!(&r, Err(StoreError::Unavailable(m)) if m.contains("injected fault")),
        "{r:?}"
    );
    assert_eq!(
        stored_text(&raw, &k),
        before,
        "the savepoint took the write back"
    );
    let new = s.update(add(&k, 1, Some(Condition::eq("n", 2)))).await;
    assert_eq!(n_of(new.unwrap().as_ref()), Some(3));
    assert_eq!(last_change(&path).await.0, decoded(before));
    // The rolled-back changes' numbers were given again: the feed shows what was stored.
    feed_is_as_stored(&s, &path).await;
}

/// A batch rolled back whole (SQLite ended its transaction midway) after one of its writes
/// was remembered: the next write of that row sees the value from before the batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_after_a_rolled_back_batch_sees_the_value_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("batch.db");
    let config = SqliteConfig::default().with_deadline(Duration::from_secs(30));
    let s = Arc::new(SqliteStore::open_with(&path, &config).unwrap());
    let raw = Connection::open(&path).unwrap();
    fail_changes_of_boom(&raw, "ROLLBACK");
    let k = Key::new("memo", "k");
    assert_eq!(remembered(&s, &k).await, 2);
    let before = stored_text(&raw, &k);

    // Park the writer on a first request behind a held write lock, queue the two writes
    // behind it, then let go: they run as one batch, which the second one's change row
    // rolls back whole.
    raw.execute_batch("BEGIN IMMEDIATE").unwrap();
    let submitted = |s: &SqliteStore| s.group_commit_stats().submitted;
    let batches = s.group_commit_stats().batches;
    let first = tokio::spawn({
        let s = Arc::clone(&s);
        async move { s.update(add(&Key::new("warm", "w"), 1, None)).await }
    });
    wait_until(|| s.group_commit_stats().batches > batches).await;
    let queued = submitted(&s);
    let ours = tokio::spawn({
        let (s, k) = (Arc::clone(&s), k.clone());
        async move { s.update(add(&k, 100, None)).await }
    });
    wait_until(|| submitted(&s) > queued).await;
    let boom = tokio::spawn({
        let s = Arc::clone(&s);
        async move { s.update(add(&Key::new("boom", "x"), 1, None)).await }
    });
    wait_until(|| submitted(&s) > queued + 1).await;
    raw.execute_batch("ROLLBACK").unwrap();
    first.await.unwrap().expect("the first batch commits");
    let (ours, boom) = (ours.await.unwrap(), boom.await.unwrap());
    assert!(
        matches!(&ours, Err(StoreError::Unavailable(m)) if m.contains("rolled back")),
        "{ours:?}"
    );
    assert!(boom.is_err(), "{boom:?}");
    assert_eq!(stored_text(&raw, &k), before, "the batch was rolled back");

    let new = s.update(add(&k, 1, Some(Condition::eq("n", 2)))).await;
    assert_eq!(n_of(new.unwrap().as_ref()), Some(3));
    assert_eq!(last_change(&path).await.0, decoded(before));
    // The rolled-back changes' numbers were given again: the feed shows what was stored.
    feed_is_as_stored(&s, &path).await;
}

/// The same operations on an in-memory database (one connection: the memo is always
/// trusted after the first batch, and reads run inside the writer's transaction).
#[tokio::test]
async fn an_in_memory_store_reads_what_its_memo_holds() {
    let s = SqliteStore::open_in_memory().unwrap();
    let k = Key::new("memo", "k");
    assert_eq!(remembered(&s, &k).await, 2);
    let got = s.get(&k, true).await.unwrap();
    assert_eq!(n_of(got.as_ref()), Some(2));
    match s.update(add(&k, -5, Some(Condition::ge("n", 5)))).await {
        Err(StoreError::ConditionFailed { old }) => assert_eq!(n_of(old.as_deref()), Some(2)),
        other => panic!("expected ConditionFailed, got {other:?}"),
    }
    let old = s
        .delete(DeleteRequest {
            key: k.clone(),
            condition: None,
        })
        .await
        .unwrap();
    assert_eq!(n_of(old.as_ref()), Some(2));
    assert_eq!(s.get(&k, true).await.unwrap(), None);
    let new = s.update(add(&k, 1, Some(Condition::not_exists("n")))).await;
    assert_eq!(n_of(new.unwrap().as_ref()), Some(1));
}

/// The feed as `s` reads it (this process's changes taken as its writer published them)
/// is the feed as a store that decodes every change from its stored text reads it.
async fn feed_is_as_stored(s: &SqliteStore, path: &std::path::Path) {
    let shape = |b: tollgate_store::FeedBatch| {
        b.changes
            .into_iter()
            .map(|c| (c.position.seq, c.key, c.old, c.new))
            .collect::<Vec<_>>()
    };
    let ours = shape(s.read_feed(&FeedCursor::start(), 1000).await.unwrap());
    let fresh = SqliteStore::open(path).unwrap();
    let stored = shape(fresh.read_feed(&FeedCursor::start(), 1000).await.unwrap());
    assert!(!ours.is_empty());
    assert_eq!(ours, stored);
}

/// Poll until `cond` holds; fail after 10 s (a bound for a broken build).
async fn wait_until(cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(10), "timed out");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// An update writes its new version into the memory of a version an earlier update
/// replaced, once the feed reader has let go of it (`ops::Memo::spare`). Items of several
/// shapes (a string that grows and shrinks, an attribute added and removed) are updated in
/// turn, the feed read after every round so that replaced versions come free: every answer
/// is the model's, every change read is the model's old and new item, and the feed this
/// process read is the feed as a store that decodes every stored change reads it.
#[tokio::test]
async fn updates_written_into_reused_versions_are_the_updates() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reuse.db");
    let s = SqliteStore::open(&path).unwrap();
    let keys: Vec<Key> = (0..4).map(|i| Key::new("reuse", format!("k{i}"))).collect();
    let mut model: Vec<Option<Item>> = vec![None; keys.len()];
    let mut cursor = FeedCursor::start();
    let mut read = Vec::new();
    for round in 0..24i64 {
        for (i, k) in keys.iter().enumerate() {
            let mut update = Update::new().add("n", round + 1);
            // A string whose length moves across the inline bound, on two keys.
            if i % 2 == 0 {
                update = update.set("s", "x".repeat(((round as usize) * 7 + i) % 40));
            }
            // An attribute that comes and goes, on the others.
            if i % 2 == 1 {
                update = if round % 3 == 0 {
                    update.set("extra", round)
                } else {
                    update.remove("extra")
                };
            }
            let req = UpdateRequest {
                key: k.clone(),
                update: update.clone(),
                condition: None,
                returns: ReturnValues::AllNew,
            };
            let want = tollgate_store::eval::apply_update(
                model[i].as_ref(),
                &tollgate_store::eval::key_item(k),
                &update,
            )
            .unwrap();
            let got = s.update(req).await.unwrap().expect("an item");
            assert_eq!(got, want, "round {round}, key {k}");
            let before = model[i].replace(want.clone());
            read.push((k.clone(), before, Some(want)));
        }
        // Read what the round wrote: the reader lets go of the versions it returned.
        let batch = s.read_feed(&cursor, 1000).await.unwrap();
        cursor = batch.cursor;
        let got: Vec<_> = batch
            .changes
            .into_iter()
            .map(|c| (c.key, c.old.as_deref().cloned(), c.new.as_deref().cloned()))
            .collect();
        let want = std::mem::take(&mut read);
        assert_eq!(got, want, "round {round}");
    }
    feed_is_as_stored(&s, &path).await;
}

/// A row this store wrote is written again from its text (`json::rewrite`). A changed index
/// attribute that no column holds (a number: only strings are indexed) leaves the row in
/// place; a changed string moves it in its index. Every text stored is the item's whole
/// encoding, and the index answers by the new values.
#[tokio::test]
async fn rewritten_rows_keep_their_index_columns_true() {
    let (_dir, path, s, raw) = store_and_raw("memo.db");
    let k = Key::new("memo", "ix");
    let rowid = |raw: &Connection| -> i64 {
        raw.query_row(
            "SELECT id FROM items WHERE pk = 'memo' AND sk = 'ix'",
            [],
            |r| r.get(0),
        )
        .expect("the row")
    };
    let item: Item = [
        ("n".into(), Value::N(0)),
        ("GSI1PK".into(), Value::N(1)),
        ("GSI2PK".into(), Value::S("a".into())),
        ("GSI2SK".into(), Value::S("x".into())),
    ]
    .into_iter()
    .collect();
    s.put(PutRequest {
        key: k.clone(),
        item,
        condition: None,
    })
    .await
    .expect("put");
    let first = rowid(&raw);
    let whole = |i: Option<Item>| serde_json::to_string(&i.expect("the item")).unwrap();
    let update = |u: Update| UpdateRequest {
        key: k.clone(),
        update: u,
        condition: None,
        returns: ReturnValues::AllNew,
    };
    // Twice, so the second is written from the first's text.
    for n in [1, 2] {
        let got = s
            .update(update(
                Update::new().add("n", 1).set("GSI1PK", Value::N(n + 1)),
            ))
            .await
            .expect("update");
        assert_eq!(n_of(got.as_ref()), Some(n));
        assert_eq!(stored_text(&raw, &k), Some(whole(got)));
        assert_eq!(rowid(&raw), first, "a number's change moves nothing");
    }
    let got = s
        .update(update(
            Update::new()
                .add("n", 1)
                .set("GSI2PK", Value::S("b".into())),
        ))
        .await
        .expect("update");
    assert_eq!(stored_text(&raw, &k), Some(whole(got)));
    let found = |pk: &str| {
        let q = tollgate_store::Query::index("GSI2", pk, None);
        let s = &s;
        async move { s.query(q).await.expect("query").len() }
    };
    assert_eq!((found("a").await, found("b").await), (0, 1));
    // And once more from that text, in place again.
    let moved = rowid(&raw);
    let got = s
        .update(update(Update::new().add("n", 1)))
        .await
        .expect("update");
    assert_eq!(n_of(got.as_ref()), Some(4));
    assert_eq!(stored_text(&raw, &k), Some(whole(got)));
    assert_eq!(rowid(&raw), moved);
    feed_is_as_stored(&s, &path).await;
}
