//! The SQLite change feed beyond the conformance checks: the upgrade of a version-1 file,
//! one feed shared by two stores on one file, trimming.

use tollgate_core::value::{Key, Value};
use tollgate_sqlite::{SqliteStore, SCHEMA_VERSION};
use tollgate_store::{ChangeFeed, FeedCursor, PutRequest, Store, StoreError};

fn item(n: i64) -> tollgate_core::value::Item {
    [("n".to_string(), Value::N(n))].into_iter().collect()
}

async fn put(s: &SqliteStore, k: &Key, n: i64) {
    s.put(PutRequest {
        key: k.clone(),
        item: item(n),
        condition: None,
    })
    .await
    .expect("put");
}

#[tokio::test]
async fn a_version_1_file_is_upgraded_and_its_feed_starts_at_the_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.db");
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch(
        "CREATE TABLE items (pk TEXT NOT NULL, sk TEXT NOT NULL, item TEXT NOT NULL,
            gsi1pk TEXT, gsi1sk TEXT, gsi2pk TEXT, gsi2sk TEXT, gsi3pk TEXT, gsi3sk TEXT,
            gsi4pk TEXT, gsi4sk TEXT, PRIMARY KEY (pk, sk)) WITHOUT ROWID;
         CREATE TABLE tokens (token TEXT PRIMARY KEY, ops TEXT NOT NULL,
            created_ms INTEGER NOT NULL) WITHOUT ROWID;
         INSERT INTO items (pk, sk, item) VALUES ('p', 'old', '{\"PK\":{\"S\":\"p\"},\"SK\":{\"S\":\"old\"}}');
         PRAGMA user_version = 1;",
    )
    .unwrap();
    drop(raw);
    let s = SqliteStore::open(&path).expect("a version-1 file opens");
    let raw = rusqlite::Connection::open(&path).unwrap();
    let v: i64 = raw
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, SCHEMA_VERSION);
    assert_eq!(SCHEMA_VERSION, 2);
    let b = s.read_feed(&FeedCursor::start(), 10).await.unwrap();
    assert!(b.changes.is_empty(), "{:?}", b.changes);
    let k = Key::new("p", "new");
    put(&s, &k, 3).await;
    let b = s.read_feed(&FeedCursor::start(), 10).await.unwrap();
    assert_eq!(b.changes.len(), 1);
    assert_eq!(b.changes[0].key, k);
    assert_eq!(b.changes[0].old, None);
    assert_eq!(b.cursor.last(""), Some("1"));
}

#[tokio::test]
async fn two_stores_on_one_file_share_one_feed_and_trim_is_refused_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    let a = SqliteStore::open(&path).unwrap();
    let b = SqliteStore::open(&path).unwrap();
    let k = Key::new("p", "x");
    put(&a, &k, 1).await;
    put(&b, &k, 2).await;
    put(&a, &k, 3).await;
    let from_b = b.read_feed(&FeedCursor::start(), 10).await.unwrap();
    let ns: Vec<Option<i64>> = from_b
        .changes
        .iter()
        .map(|c| {
            c.new
                .as_ref()
                .and_then(|i| i.get("n"))
                .and_then(Value::as_n)
        })
        .collect();
    assert_eq!(ns, vec![Some(1), Some(2), Some(3)]);
    // Old images chain across the two writers.
    assert_eq!(
        from_b.changes[2]
            .old
            .as_ref()
            .and_then(|i| i.get("n"))
            .and_then(Value::as_n),
        Some(2)
    );
    let first_two = a.read_feed(&FeedCursor::start(), 2).await.unwrap();
    a.trim_feed(&first_two.cursor, i64::MAX).await.unwrap();
    let rest = b.read_feed(&first_two.cursor, 10).await.unwrap();
    assert_eq!(rest.changes.len(), 1);
    assert_eq!(rest.changes[0].position.seq, "3");
    match b.read_feed(&FeedCursor::start(), 10).await {
        Err(StoreError::Validation(m)) => assert!(m.contains("trimmed"), "{m}"),
        other => panic!("a read from before the trim must be refused, got {other:?}"),
    }
}
