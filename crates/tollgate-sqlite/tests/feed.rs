//! The SQLite change feed beyond the conformance checks: the upgrades of version-1 to
//! version-3 files, one feed shared by two stores on one file, old images stored as
//! differences, trimming.

use tollgate_core::value::{Key, Value};
use tollgate_sqlite::{FeedReadStats, SqliteStore, SCHEMA_VERSION};
use tollgate_store::{ChangeFeed, FeedCursor, PutRequest, Store, StoreError};

fn item(n: i64) -> tollgate_core::value::Item {
    [("n".into(), Value::N(n))].into_iter().collect()
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

/// The attribute `n` of an image, if any.
fn n_of(i: Option<&std::sync::Arc<tollgate_core::value::Item>>) -> Option<i64> {
    i.and_then(|i| i.get("n")).and_then(Value::as_n)
}

/// A cursor just after change `seq`.
fn after(seq: u64) -> FeedCursor {
    let mut c = FeedCursor::start();
    c.advance(&tollgate_store::FeedPosition {
        stream: String::new(),
        seq: seq.to_string(),
    });
    c
}

/// The numbers of a batch's changes.
fn seqs(b: &tollgate_store::FeedBatch) -> Vec<&str> {
    b.changes.iter().map(|c| c.position.seq.as_str()).collect()
}

/// The attribute `n` of each change's old and new image, in order.
fn shapes(b: &tollgate_store::FeedBatch) -> Vec<(Option<i64>, Option<i64>)> {
    b.changes
        .iter()
        .map(|c| (n_of(c.old.as_ref()), n_of(c.new.as_ref())))
        .collect()
}

/// Whether each change row, in order, stores its new image.
fn new_stored(raw: &rusqlite::Connection) -> Vec<bool> {
    raw.prepare("SELECT new IS NOT NULL FROM changes ORDER BY seq")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The schema version a file records.
fn user_version(path: &std::path::Path) -> i64 {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap()
}

/// Two stores on one new file (as two processes would open it), and the directory.
fn two_stores(name: &str) -> (tempfile::TempDir, SqliteStore, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    let (a, b) = (
        SqliteStore::open(&path).unwrap(),
        SqliteStore::open(&path).unwrap(),
    );
    (dir, a, b)
}

/// `ADD n` to the item at `k`, returning the new item.
fn add(k: &Key, n: i64) -> tollgate_store::UpdateRequest {
    tollgate_store::UpdateRequest {
        key: k.clone(),
        update: tollgate_core::expr::Update::new().add("n", n),
        condition: None,
        returns: tollgate_core::expr::ReturnValues::AllNew,
    }
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
         INSERT INTO items (pk, sk, item) VALUES ('p', 'old', '{\"PK\":{\"s\":\"p\"},\"SK\":{\"s\":\"old\"}}');
         PRAGMA user_version = 1;",
    )
    .unwrap();
    drop(raw);
    let s = SqliteStore::open(&path).expect("a version-1 file opens");
    assert_eq!(user_version(&path), SCHEMA_VERSION);
    assert_eq!(SCHEMA_VERSION, 5);
    // The item written under version 1 is still there.
    let old = s.get(&Key::new("p", "old"), true).await.unwrap();
    assert!(old.is_some(), "the version-1 item survives the upgrade");
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

/// A version-2 file (items in a `WITHOUT ROWID` table, a feed) is upgraded to version 3
/// in place: its items, their index entries and its feed (changes and sequence) all carry
/// over, and writes go on from there.
#[tokio::test]
async fn a_version_2_file_is_upgraded_with_its_items_indexes_and_feed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v2.db");
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch(
        "PRAGMA journal_mode = WAL;
         CREATE TABLE items (pk TEXT NOT NULL, sk TEXT NOT NULL, item TEXT NOT NULL,
            gsi1pk TEXT, gsi1sk TEXT, gsi2pk TEXT, gsi2sk TEXT, gsi3pk TEXT, gsi3sk TEXT,
            gsi4pk TEXT, gsi4sk TEXT, PRIMARY KEY (pk, sk)) WITHOUT ROWID;
         CREATE INDEX items_gsi1 ON items (gsi1pk, gsi1sk) WHERE gsi1pk IS NOT NULL;
         CREATE INDEX items_gsi2 ON items (gsi2pk, gsi2sk) WHERE gsi2pk IS NOT NULL;
         CREATE INDEX items_gsi3 ON items (gsi3pk, gsi3sk) WHERE gsi3pk IS NOT NULL;
         CREATE INDEX items_gsi4 ON items (gsi4pk, gsi4sk) WHERE gsi4pk IS NOT NULL;
         CREATE TABLE tokens (token TEXT PRIMARY KEY, ops TEXT NOT NULL,
            created_ms INTEGER NOT NULL) WITHOUT ROWID;
         CREATE TABLE changes (seq INTEGER PRIMARY KEY AUTOINCREMENT, pk TEXT NOT NULL,
            sk TEXT NOT NULL, old TEXT, new TEXT, at_ms INTEGER NOT NULL);
         INSERT INTO items (pk, sk, item, gsi1pk, gsi1sk) VALUES ('p', 'a',
            '{\"PK\":{\"s\":\"p\"},\"SK\":{\"s\":\"a\"},\"GSI1PK\":{\"s\":\"g\"},\"GSI1SK\":{\"s\":\"1\"},\"n\":{\"n\":2}}',
            'g', '1');
         INSERT INTO items (pk, sk, item, gsi1pk, gsi1sk) VALUES ('p', 'b',
            '{\"PK\":{\"s\":\"p\"},\"SK\":{\"s\":\"b\"},\"GSI1PK\":{\"s\":\"g\"},\"GSI1SK\":{\"s\":\"1\"},\"n\":{\"n\":5}}',
            'g', '1');
         INSERT INTO changes (pk, sk, old, new, at_ms) VALUES ('p', 'a', NULL,
            '{\"PK\":{\"s\":\"p\"},\"SK\":{\"s\":\"a\"},\"n\":{\"n\":1}}', 1);
         INSERT INTO changes (pk, sk, old, new, at_ms) VALUES ('p', 'a',
            '{\"PK\":{\"s\":\"p\"},\"SK\":{\"s\":\"a\"},\"n\":{\"n\":1}}',
            '{\"PK\":{\"s\":\"p\"},\"SK\":{\"s\":\"a\"},\"GSI1PK\":{\"s\":\"g\"},\"GSI1SK\":{\"s\":\"1\"},\"n\":{\"n\":2}}', 2);
         PRAGMA user_version = 2;",
    )
    .unwrap();
    drop(raw);
    let s = SqliteStore::open(&path).expect("a version-2 file opens");
    assert_eq!(user_version(&path), SCHEMA_VERSION);
    let n =
        |i: Option<tollgate_core::value::Item>| i.and_then(|i| i.get("n").and_then(Value::as_n));
    assert_eq!(n(s.get(&Key::new("p", "a"), true).await.unwrap()), Some(2));
    assert_eq!(n(s.get(&Key::new("p", "b"), true).await.unwrap()), Some(5));
    // The index partition, in (index sort key, primary key) order.
    let q = s
        .query(tollgate_store::Query {
            pk: "g".into(),
            index: Some("GSI1".into()),
            sk_prefix: None,
            consistent: false,
        })
        .await
        .unwrap();
    let ns: Vec<_> = q.into_iter().map(|i| n(Some(i))).collect();
    assert_eq!(ns, vec![Some(2), Some(5)]);
    // The feed: both old changes, then a new one numbered after them.
    put(&s, &Key::new("p", "a"), 9).await;
    let b = s.read_feed(&FeedCursor::start(), 10).await.unwrap();
    let shape: Vec<_> = b
        .changes
        .iter()
        .map(|c| {
            (
                c.position.seq.clone(),
                n_of(c.old.as_ref()),
                n_of(c.new.as_ref()),
            )
        })
        .collect();
    assert_eq!(
        shape,
        vec![
            ("1".to_string(), None, Some(1)),
            ("2".to_string(), Some(1), Some(2)),
            ("3".to_string(), Some(2), Some(9)),
        ]
    );
    s.integrity_check().unwrap();
}

/// A version-3 file (old images stored whole) is upgraded to version 5 in place: its
/// changes read as before, and the changes written after it store their old images as
/// differences, which another store on the file reads back exactly.
#[tokio::test]
async fn a_version_3_file_is_upgraded_and_its_whole_old_images_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v3.db");
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch(
        "PRAGMA journal_mode = WAL;
         CREATE TABLE tokens (token TEXT PRIMARY KEY, ops TEXT NOT NULL,
            created_ms INTEGER NOT NULL) WITHOUT ROWID;
         CREATE TABLE items (id INTEGER PRIMARY KEY, pk TEXT NOT NULL, sk TEXT NOT NULL,
            item TEXT NOT NULL, gsi1pk TEXT, gsi1sk TEXT, gsi2pk TEXT, gsi2sk TEXT,
            gsi3pk TEXT, gsi3sk TEXT, gsi4pk TEXT, gsi4sk TEXT);
         CREATE UNIQUE INDEX items_key ON items (pk, sk);
         CREATE INDEX items_gsi1 ON items (gsi1pk, gsi1sk, pk, sk) WHERE gsi1pk IS NOT NULL;
         CREATE INDEX items_gsi2 ON items (gsi2pk, gsi2sk, pk, sk) WHERE gsi2pk IS NOT NULL;
         CREATE INDEX items_gsi3 ON items (gsi3pk, gsi3sk, pk, sk) WHERE gsi3pk IS NOT NULL;
         CREATE INDEX items_gsi4 ON items (gsi4pk, gsi4sk, pk, sk) WHERE gsi4pk IS NOT NULL;
         CREATE TABLE changes (seq INTEGER PRIMARY KEY, pk TEXT NOT NULL, sk TEXT NOT NULL,
            old TEXT, new TEXT, at_ms INTEGER NOT NULL);
         INSERT INTO items (pk, sk, item) VALUES ('p', 'a',
            '{\"PK\":{\"s\":\"p\"},\"SK\":{\"s\":\"a\"},\"n\":{\"n\":2}}');
         INSERT INTO changes (pk, sk, old, new, at_ms) VALUES ('p', 'a', NULL,
            '{\"PK\":{\"s\":\"p\"},\"SK\":{\"s\":\"a\"},\"n\":{\"n\":1}}', 1);
         INSERT INTO changes (pk, sk, old, new, at_ms) VALUES ('p', 'a',
            '{\"PK\":{\"s\":\"p\"},\"SK\":{\"s\":\"a\"},\"n\":{\"n\":1}}',
            '{\"PK\":{\"s\":\"p\"},\"SK\":{\"s\":\"a\"},\"n\":{\"n\":2}}', 2);
         PRAGMA user_version = 3;",
    )
    .unwrap();
    drop(raw);
    let (a, b) = (
        SqliteStore::open(&path).expect("a version-3 file opens"),
        SqliteStore::open(&path).expect("and again"),
    );
    assert_eq!(user_version(&path), SCHEMA_VERSION);
    let raw = rusqlite::Connection::open(&path).unwrap();
    a.update(add(&Key::new("p", "a"), 5)).await.unwrap();
    // Read by the store that did not write: every image decoded from the rows.
    let got = b.read_feed(&FeedCursor::start(), 10).await.unwrap();
    assert_eq!(
        shapes(&got),
        vec![(None, Some(1)), (Some(1), Some(2)), (Some(2), Some(7))]
    );
    let stored: (Option<String>, Option<String>, Option<String>) = raw
        .query_row(
            "SELECT old, old_diff, new FROM changes WHERE seq = 3",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    // The writer's first batch stores its new image whole (`feed::record`'s rule).
    assert_eq!(stored.0, None);
    assert_eq!(stored.1.as_deref(), Some(r#"{"n":{"n":2}}"#));
    assert!(stored.2.is_some());
    a.integrity_check().unwrap();
}

/// A version-4 file (every new image stored whole) is upgraded to version 5 by its number
/// alone: its rows read as before, and the rows written after it, which leave their new
/// images to the item, read back exactly around them.
#[tokio::test]
async fn a_version_4_file_is_upgraded_and_its_whole_new_images_still_read() {
    let (dir, a, _b) = two_stores("v4.db");
    let k = Key::new("p", "a");
    put(&a, &k, 1).await;
    a.update(add(&k, 1)).await.unwrap();
    drop((a, _b));
    let path = dir.path().join("v4.db");
    let raw = rusqlite::Connection::open(&path).unwrap();
    // As version 4 wrote them: each row with its new image whole.
    raw.execute_batch(
        "UPDATE changes SET new = '{\"PK\":{\"s\":\"p\"},\"SK\":{\"s\":\"a\"},\"n\":{\"n\":1}}'
            WHERE seq = 1;
         UPDATE changes SET new = '{\"PK\":{\"s\":\"p\"},\"SK\":{\"s\":\"a\"},\"n\":{\"n\":2}}'
            WHERE seq = 2;
         PRAGMA user_version = 4;",
    )
    .unwrap();
    let (a, b) = (
        SqliteStore::open(&path).expect("a version-4 file opens"),
        SqliteStore::open(&path).expect("and again"),
    );
    assert_eq!(user_version(&path), SCHEMA_VERSION);
    // A reads the feed, so it holds its changes from here on (`feed::record`'s rule).
    a.read_feed(&after(2), 10).await.unwrap();
    a.update(add(&k, 5)).await.unwrap();
    put(&a, &Key::new("p", "b"), 9).await;
    let got = b.read_feed(&FeedCursor::start(), 10).await.unwrap();
    assert_eq!(
        shapes(&got),
        vec![
            (None, Some(1)),
            (Some(1), Some(2)),
            (Some(2), Some(7)),
            (None, Some(9))
        ]
    );
    let new_whole = new_stored(&raw);
    // Version 4's two rows, the writer's first batch, then a creation it holds.
    assert_eq!(new_whole, vec![true, true, true, false]);
}

/// A bucket-sized item (thirty attributes) of which a write changes three: the change row
/// keeps the old image as those three attributes (a fraction of the whole), and another
/// store on the file reads back exactly the image the previous write left.
#[tokio::test]
async fn a_write_of_a_few_attributes_stores_its_old_image_as_their_difference() {
    let (_dir, a, b) = two_stores("diff.db");
    a.read_feed(&FeedCursor::start(), 10).await.unwrap();
    let k = Key::new("default/BUCKET#user-1#api#0", "#STATE");
    let mut first: tollgate_core::value::Item = (0..30)
        .map(|i| (format!("b_limit{i:02}_tk").into(), Value::N(1_000_000 + i)))
        .collect();
    first.insert("ph".into(), Value::S("7dd43634b00f194f".into()));
    first.insert("gone".into(), Value::Bool(true));
    a.put(PutRequest {
        key: k.clone(),
        item: first.clone(),
        condition: None,
    })
    .await
    .unwrap();
    let update = tollgate_core::expr::Update::new()
        .add("b_limit03_tk", -1_000)
        .set("rf", Value::N(17))
        .remove("gone");
    let second = a
        .update(tollgate_store::UpdateRequest {
            key: k.clone(),
            update,
            condition: None,
            returns: tollgate_core::expr::ReturnValues::AllNew,
        })
        .await
        .unwrap()
        .expect("the new image");
    let got = b.read_feed(&FeedCursor::start(), 10).await.unwrap();
    assert_eq!(got.changes.len(), 2);
    let change = &got.changes[1];
    let mut want_old = first;
    want_old.insert("PK".into(), Value::S(k.pk.to_string()));
    want_old.insert("SK".into(), Value::S(k.sk.to_string()));
    assert_eq!(change.old.as_deref(), Some(&want_old));
    assert_eq!(change.new.as_deref(), Some(&second));
    let raw = rusqlite::Connection::open(_dir.path().join("diff.db")).unwrap();
    let (old, diff, new): (Option<String>, String, Option<String>) = raw
        .query_row(
            "SELECT old, old_diff, new FROM changes WHERE seq = 2",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    // The row keeps neither image whole: the new one is the item's.
    assert_eq!((old, new), (None, None));
    assert_eq!(
        diff,
        r#"{"b_limit03_tk":{"n":1000003},"gone":{"bool":true},"rf":null}"#
    );
    let item: String = raw
        .query_row("SELECT item FROM items", [], |r| r.get(0))
        .unwrap();
    assert!(
        diff.len() * 10 < item.len(),
        "{} of {}",
        diff.len(),
        item.len()
    );
}

/// A stored difference that is not one, or that comes with a whole old image too, or a
/// change whose new image is the one after it when there is none, is reported as corrupt
/// data, not taken for an image.
#[tokio::test]
async fn a_corrupt_old_image_difference_is_reported() {
    for (old, diff, new) in [
        (None, Some("not json"), Some(r#"{"n":{"n":1}}"#)),
        (None, Some(r#"{"n":{"q":1}}"#), Some(r#"{"n":{"n":1}}"#)),
        (
            Some(r#"{"n":{"n":1}}"#),
            Some("{}"),
            Some(r#"{"n":{"n":2}}"#),
        ),
        // An update or a creation whose new image is the one after it, of an item the file
        // does not hold (a change recorded without its write).
        (None, Some("{}"), None),
        (None, None, None),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("corrupt.db");
        let s = SqliteStore::open(&path).unwrap();
        let raw = rusqlite::Connection::open(&path).unwrap();
        raw.execute(
            "INSERT INTO changes (pk, sk, old, new, at_ms, old_diff) VALUES ('p', 'a', ?1, ?2, 1, ?3)",
            rusqlite::params![old, new, diff],
        )
        .unwrap();
        match s.read_feed(&FeedCursor::start(), 10).await {
            Err(StoreError::Corrupt(m)) => assert!(m.contains("change 1 of item"), "{m}"),
            other => panic!("{old:?} / {diff:?} / {new:?} must be corrupt, got {other:?}"),
        }
    }
}

/// A version-2 feed trimmed empty (`AUTOINCREMENT` remembered its highest number, 7, in
/// `sqlite_sequence`): after the upgrade the next change is still numbered 8, a consumer at
/// 7 reads it, and one from before is refused as trimmed.
#[tokio::test]
async fn a_version_2_feed_trimmed_empty_keeps_its_numbering() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v2-empty.db");
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch(
        "PRAGMA journal_mode = WAL;
         CREATE TABLE items (pk TEXT NOT NULL, sk TEXT NOT NULL, item TEXT NOT NULL,
            gsi1pk TEXT, gsi1sk TEXT, gsi2pk TEXT, gsi2sk TEXT, gsi3pk TEXT, gsi3sk TEXT,
            gsi4pk TEXT, gsi4sk TEXT, PRIMARY KEY (pk, sk)) WITHOUT ROWID;
         CREATE TABLE tokens (token TEXT PRIMARY KEY, ops TEXT NOT NULL,
            created_ms INTEGER NOT NULL) WITHOUT ROWID;
         CREATE TABLE changes (seq INTEGER PRIMARY KEY AUTOINCREMENT, pk TEXT NOT NULL,
            sk TEXT NOT NULL, old TEXT, new TEXT, at_ms INTEGER NOT NULL);
         INSERT INTO changes (seq, pk, sk, old, new, at_ms) VALUES (7, 'p', 'a', NULL, '{}', 1);
         DELETE FROM changes;
         PRAGMA user_version = 2;",
    )
    .unwrap();
    drop(raw);
    let s = SqliteStore::open(&path).expect("a version-2 file opens");
    let at_7 = after(7);
    assert!(s.read_feed(&at_7, 10).await.unwrap().changes.is_empty());
    put(&s, &Key::new("p", "a"), 1).await;
    let b = s.read_feed(&at_7, 10).await.unwrap();
    assert_eq!(seqs(&b), vec!["8"]);
    assert_eq!(b.cursor.last(""), Some("8"));
    match s.read_feed(&FeedCursor::start(), 10).await {
        Err(StoreError::Validation(m)) => assert!(m.contains("trimmed"), "{m}"),
        other => panic!("a read from before the trim must be refused, got {other:?}"),
    }
    // A consumer just before the marker reads past it to the change.
    let at_6 = after(6);
    let b = s.read_feed(&at_6, 10).await.unwrap();
    assert_eq!(seqs(&b), vec!["8"]);
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

/// Trimming removes the oldest changes up to the first one still retained, as
/// `MemoryStore` does: a change stamped before the retention by a process whose clock is
/// behind, but written after a retained one, stays (removing it would leave a hole that
/// refuses a reader positioned before it), and nothing past the cursor goes.
#[tokio::test]
async fn trim_removes_the_oldest_changes_up_to_the_first_retained_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trim.db");
    let s = SqliteStore::open(&path).unwrap();
    let raw = rusqlite::Connection::open(&path).unwrap();
    // Six changes stamped 100, 200, 300 (retained below), 150 (a clock behind), 400, 500.
    for at in [100, 200, 300, 150, 400, 500] {
        raw.execute(
            "INSERT INTO changes (pk, sk, old, new, at_ms) VALUES ('p', 'x', NULL, '{}', ?1)",
            [at],
        )
        .unwrap();
    }
    let count = |raw: &rusqlite::Connection| -> Vec<i64> {
        let mut st = raw.prepare("SELECT seq FROM changes ORDER BY seq").unwrap();
        let rows = st.query_map([], |r| r.get::<_, i64>(0)).unwrap();
        rows.collect::<Result<Vec<_>, _>>().unwrap()
    };
    let through_5 = s.read_feed(&FeedCursor::start(), 5).await.unwrap().cursor;
    // Retention boundary 250: 1 and 2 go; 3 is retained, so 4 stays behind it.
    s.trim_feed(&through_5, 250).await.unwrap();
    assert_eq!(count(&raw), vec![3, 4, 5, 6]);
    let from_start = s.read_feed(&FeedCursor::start(), 2).await;
    assert!(
        matches!(&from_start, Err(StoreError::Validation(m)) if m.contains("trimmed")),
        "a read from before the trim is refused"
    );
    // A reader positioned after 2 reads 3, 4, 5, 6 with no hole.
    let at_2 = after(2);
    let rest = s.read_feed(&at_2, 10).await.unwrap();
    assert_eq!(seqs(&rest), vec!["3", "4", "5", "6"]);
    // Everything old enough, but never past the cursor (5): 6 stays.
    s.trim_feed(&through_5, i64::MAX).await.unwrap();
    assert_eq!(count(&raw), vec![6]);
    // Nothing old enough: nothing goes.
    let through_6 = rest.cursor;
    s.trim_feed(&through_6, 0).await.unwrap();
    assert_eq!(count(&raw), vec![6]);
    // Everything consumed and old enough: the newest change stays all the same, holding
    // the highest number given, so the next change is numbered after it.
    s.trim_feed(&through_6, i64::MAX).await.unwrap();
    assert_eq!(count(&raw), vec![6]);
    put(&s, &Key::new("p", "y"), 1).await;
    let next = s.read_feed(&through_6, 10).await.unwrap();
    assert_eq!(seqs(&next), vec!["7"]);
}

/// A trim removes at most `TRIM_MAX_CHANGES` changes (a trim holds the writer thread, and
/// the requests batched with it, for the rows it deletes); the next trims go on from there
/// until everything old enough and counted is gone, the newest change kept as always.
#[tokio::test]
async fn a_trim_removes_a_bounded_number_of_changes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trim-bound.db");
    let s = SqliteStore::open(&path).unwrap();
    let mut raw = rusqlite::Connection::open(&path).unwrap();
    let total = 2 * tollgate_sqlite::TRIM_MAX_CHANGES + 100;
    let tx = raw.transaction().unwrap();
    for at in 0..total {
        tx.execute(
            "INSERT INTO changes (pk, sk, old, new, at_ms) VALUES ('p', 'x', NULL, '{}', ?1)",
            [at],
        )
        .unwrap();
    }
    tx.commit().unwrap();
    let held = |raw: &rusqlite::Connection| -> (i64, i64) {
        raw.query_row("SELECT count(*), min(seq) FROM changes", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap()
    };
    let all = s
        .read_feed(&FeedCursor::start(), total as usize)
        .await
        .unwrap()
        .cursor;
    let max = tollgate_sqlite::TRIM_MAX_CHANGES;
    s.trim_feed(&all, i64::MAX).await.unwrap();
    assert_eq!(held(&raw), (total - max, max + 1));
    s.trim_feed(&all, i64::MAX).await.unwrap();
    assert_eq!(held(&raw), (total - 2 * max, 2 * max + 1));
    s.trim_feed(&all, i64::MAX).await.unwrap();
    assert_eq!(held(&raw), (1, total), "the newest change stays");
}

/// In one read, a change's old image is the previous change's new one of the same key: the
/// same item, shared rather than decoded twice; across keys nothing is mixed up.
#[tokio::test]
async fn a_batch_shares_each_old_image_with_the_previous_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(dir.path().join("share.db")).unwrap();
    // The writer's images are kept for the reader from the process's first feed read on.
    let empty = s.read_feed(&FeedCursor::start(), 10).await.unwrap();
    assert!(empty.changes.is_empty());
    let (a, b) = (Key::new("p", "a"), Key::new("p", "b"));
    for n in 1..=3 {
        put(&s, &a, n).await;
        put(&s, &b, 10 * n).await;
    }
    let batch = s.read_feed(&FeedCursor::start(), 10).await.unwrap();
    assert_eq!(batch.changes.len(), 6);
    for k in [&a, &b] {
        let mine: Vec<_> = batch.changes.iter().filter(|c| c.key == *k).collect();
        assert_eq!(mine.len(), 3);
        assert_eq!(mine[0].old, None, "the first write created the item");
        for w in mine.windows(2) {
            assert_eq!(
                n_of(w[1].old.as_ref()),
                n_of(w[0].new.as_ref()),
                "{k}: old is the previous new"
            );
            let (prev_new, old) = (w[0].new.as_ref().unwrap(), w[1].old.as_ref().unwrap());
            assert!(
                std::sync::Arc::ptr_eq(prev_new, old),
                "{k}: shared, not decoded again"
            );
        }
    }
    let ns: Vec<_> = batch.changes.iter().map(|c| n_of(c.new.as_ref())).collect();
    assert_eq!(
        ns,
        vec![Some(1), Some(10), Some(2), Some(20), Some(3), Some(30)]
    );
}

/// The feed reader takes the images of the changes this process's writer committed as the
/// writer left them (the very items the updates returned), and decodes the ones another
/// store on the same file wrote.
#[tokio::test]
async fn the_feed_hands_back_the_writers_own_images_and_decodes_the_others() {
    let (_dir, a, b) = two_stores("handoff.db");
    let k = Key::new("p", "x");
    let add = |n: i64| add(&k, n);
    // The writer's images are kept for the reader from the process's first feed read on.
    let empty = a.read_feed(&FeedCursor::start(), 10).await.unwrap();
    assert!(empty.changes.is_empty());
    let first = a.update_shared(add(1)).await.unwrap().unwrap();
    let second = a.update_shared(add(2)).await.unwrap().unwrap();
    b.update(add(4)).await.unwrap();
    let batch = a.read_feed(&FeedCursor::start(), 10).await.unwrap();
    assert_eq!(batch.changes.len(), 3);
    let (c0, c1, c2) = (&batch.changes[0], &batch.changes[1], &batch.changes[2]);
    assert!(c0.old.is_none());
    assert!(std::sync::Arc::ptr_eq(c0.new.as_ref().unwrap(), &first));
    // The old image is the previous change's new one, shared.
    assert!(std::sync::Arc::ptr_eq(c1.old.as_ref().unwrap(), &first));
    assert!(std::sync::Arc::ptr_eq(c1.new.as_ref().unwrap(), &second));
    // Written by `b`: decoded from the stored text, with the same values.
    assert!(!std::sync::Arc::ptr_eq(c2.new.as_ref().unwrap(), &second));
    assert_eq!(
        (n_of(c2.old.as_ref()), n_of(c2.new.as_ref())),
        (Some(3), Some(7))
    );
    // `b` reads the same feed, decoding what `a` wrote: the same changes.
    let from_b = b.read_feed(&FeedCursor::start(), 10).await.unwrap();
    let shape = |c: &tollgate_store::Change| {
        (
            c.key.clone(),
            n_of(c.old.as_ref()),
            n_of(c.new.as_ref()),
            c.position.seq.clone(),
        )
    };
    assert_eq!(
        from_b.changes.iter().map(shape).collect::<Vec<_>>(),
        batch.changes.iter().map(shape).collect::<Vec<_>>()
    );
}

/// A read whose every change the writer of this process committed is answered from the
/// images it holds — but only while the file still holds those changes: a trimmed feed is
/// reported as trimmed even when its changes are held. What a read returned is let go, and a
/// read of the same changes again decodes them to the same values.
#[tokio::test]
async fn held_changes_are_served_only_while_the_file_holds_them() {
    let (_dir, a, b) = two_stores("held.db");
    let k = Key::new("p", "x");
    let empty = a.read_feed(&FeedCursor::start(), 10).await.unwrap();
    assert!(empty.changes.is_empty());
    let first = a.update_shared(add(&k, 1)).await.unwrap().unwrap();
    let second = a.update_shared(add(&k, 2)).await.unwrap().unwrap();
    let read = a.read_feed(&FeedCursor::start(), 10).await.unwrap();
    assert_eq!(read.changes.len(), 2);
    assert!(std::sync::Arc::ptr_eq(
        read.changes[0].new.as_ref().unwrap(),
        &first
    ));
    assert!(std::sync::Arc::ptr_eq(
        read.changes[1].new.as_ref().unwrap(),
        &second
    ));
    assert_eq!(read.cursor, after(2));
    assert!(read.changes.iter().all(|c| c.at_ms > 0), "the row's time");
    // Let go: the same changes read again are decoded, with the same values and times.
    let again = a.read_feed(&FeedCursor::start(), 10).await.unwrap();
    assert!(!std::sync::Arc::ptr_eq(
        again.changes[1].new.as_ref().unwrap(),
        &second
    ));
    let shape = |c: &tollgate_store::Change| {
        (
            c.key.clone(),
            n_of(c.old.as_ref()),
            n_of(c.new.as_ref()),
            c.position.seq.clone(),
            c.at_ms,
        )
    };
    assert_eq!(
        again.changes.iter().map(shape).collect::<Vec<_>>(),
        read.changes.iter().map(shape).collect::<Vec<_>>()
    );
    // Two more changes, held; another store on the file trims the feed through them.
    a.update_shared(add(&k, 4)).await.unwrap();
    a.update_shared(add(&k, 8)).await.unwrap();
    b.trim_feed(&after(3), i64::MAX).await.unwrap();
    let trimmed = a.read_feed(&after(2), 10).await;
    assert!(
        matches!(&trimmed, Err(tollgate_store::StoreError::Validation(m)) if m.contains("no longer holds")),
        "{trimmed:?}"
    );
    let rest = a.read_feed(&after(3), 10).await.unwrap();
    assert_eq!(rest.changes.len(), 1);
    assert_eq!(n_of(rest.changes[0].new.as_ref()), Some(15));
}

/// The writer remembers the rows it wrote, decoded, but trusts a memory only while the row
/// still holds the text it wrote: another process's write in between is read and decoded.
#[tokio::test]
async fn a_row_another_process_wrote_since_is_decoded_again() {
    let (_dir, a, b) = two_stores("memo.db");
    let k = Key::new("p", "x");
    let add = |n: i64| add(&k, n);
    let n =
        |i: Option<tollgate_core::value::Item>| i.and_then(|i| i.get("n").and_then(Value::as_n));
    assert_eq!(n(a.update(add(1)).await.unwrap()), Some(1));
    assert_eq!(n(b.update(add(10)).await.unwrap()), Some(11));
    // `a` remembers n = 1; the file holds 11.
    assert_eq!(n(a.update(add(100)).await.unwrap()), Some(111));
    assert_eq!(n(a.update(add(1000)).await.unwrap()), Some(1111));
    let olds: Vec<Option<i64>> = a
        .read_feed(&FeedCursor::start(), 10)
        .await
        .unwrap()
        .changes
        .iter()
        .map(|c| n_of(c.old.as_ref()))
        .collect();
    assert_eq!(olds, vec![None, Some(1), Some(11), Some(111)]);
}

/// Which rows leave their new image out (`feed::record`'s rule): only the changes this
/// process's feed reader will take from memory — none before the feed is first read here,
/// none in the writer's first batch or in a batch after another connection wrote — and
/// every one reads back exactly, from memory or, in another store, from the rows.
#[tokio::test]
async fn a_row_leaves_its_new_image_out_only_for_changes_read_here() {
    let (dir, a, b) = two_stores("rule.db");
    let k = Key::new("p", "a");
    put(&a, &k, 1).await; // 1: nobody reads here yet
    a.update(add(&k, 1)).await.unwrap(); // 2: still nobody
    let first = a.read_feed(&FeedCursor::start(), 10).await.unwrap();
    a.update(add(&k, 1)).await.unwrap(); // 3: read here, no one else wrote: left out
    put(&a, &Key::new("p", "c"), 5).await; // 4: a creation, left out
    put(&b, &Key::new("p", "b"), 1).await; // 5: B does not read its feed
    a.update(add(&k, 1)).await.unwrap(); // 6: B wrote since A's last batch
    a.update(add(&k, 1)).await.unwrap(); // 7: left out again
    let raw = rusqlite::Connection::open(dir.path().join("rule.db")).unwrap();
    let new_whole = new_stored(&raw);
    assert_eq!(new_whole, vec![true, true, false, false, true, true, false]);
    let want = vec![
        (None, Some(1)),
        (Some(1), Some(2)),
        (Some(2), Some(3)),
        (None, Some(5)),
        (None, Some(1)),
        (Some(3), Some(4)),
        (Some(4), Some(5)),
    ];
    assert_eq!(shapes(&first), want[..2]);
    // From memory where A holds them, and from the rows in B.
    let next = a.read_feed(&first.cursor, 10).await.unwrap();
    assert_eq!(shapes(&next), want[2..]);
    assert_eq!(
        shapes(&b.read_feed(&FeedCursor::start(), 10).await.unwrap()),
        want
    );
    // How each read was served: A decoded its first two rows (its reader held nothing
    // yet), then took 3, 4, 6 and 7 from memory and decoded B's 5; B, which holds none,
    // rebuilt all seven in one walk of the seven rows.
    let stats =
        |held_changes, decoded_changes, rebuilt_changes, rebuilds, rebuild_rows| FeedReadStats {
            held_changes,
            decoded_changes,
            rebuilt_changes,
            rebuilds,
            rebuild_rows,
        };
    assert_eq!(a.feed_read_stats(), stats(4, 3, 0, 0, 0));
    assert_eq!(b.feed_read_stats(), stats(0, 0, 7, 1, 7));
    // B again, three at a time: the walk returns three and keeps the other four, which the
    // next read takes from memory, with no walk.
    let three = b.read_feed(&FeedCursor::start(), 3).await.unwrap();
    let rest = b.read_feed(&three.cursor, 10).await.unwrap();
    assert_eq!(
        (shapes(&three), shapes(&rest)),
        (want[..3].to_vec(), want[3..].to_vec())
    );
    assert_eq!(b.feed_read_stats(), stats(4, 0, 10, 2, 14));
}

/// One write of [`the_feed_rebuilds_every_image_for_any_reader`]: by store A or B, on one of
/// four keys.
#[derive(Debug, Clone)]
enum Write {
    Put {
        by_a: bool,
        key: u8,
        n: i64,
        x: bool,
    },
    Add {
        by_a: bool,
        key: u8,
        n: i64,
    },
    SetX {
        by_a: bool,
        key: u8,
        x: Option<String>,
    },
    Delete {
        by_a: bool,
        key: u8,
    },
}

fn write_strategy() -> impl proptest::strategy::Strategy<Value = Write> {
    use proptest::prelude::*;
    prop_oneof![
        (any::<bool>(), 0u8..4, 1i64..1000, any::<bool>())
            .prop_map(|(by_a, key, n, x)| Write::Put { by_a, key, n, x }),
        (any::<bool>(), 0u8..4, 1i64..50).prop_map(|(by_a, key, n)| Write::Add { by_a, key, n }),
        (any::<bool>(), 0u8..4, proptest::option::of("[a-z]{1,5}"))
            .prop_map(|(by_a, key, x)| Write::SetX { by_a, key, x }),
        (any::<bool>(), 0u8..4).prop_map(|(by_a, key)| Write::Delete { by_a, key }),
    ]
}

type Image = Option<tollgate_core::value::Item>;

/// Apply `w` to the stores and to `shadow` (what the file holds: a put's item, an update's
/// answer, nothing after a delete): the change it records, if any (key, old image, new
/// image).
async fn apply_write(
    a: &SqliteStore,
    b: &SqliteStore,
    shadow: &mut std::collections::BTreeMap<u8, tollgate_core::value::Item>,
    w: &Write,
) -> Option<(Key, Image, Image)> {
    let key_of = |k: u8| Key::new("p", format!("k{k}"));
    let stamped = |k: u8, mut i: tollgate_core::value::Item| {
        let key = key_of(k);
        i.insert("PK".into(), Value::S(key.pk.to_string()));
        i.insert("SK".into(), Value::S(key.sk.to_string()));
        i
    };
    let (by_a, k) = match w {
        Write::Put { by_a, key, .. }
        | Write::Add { by_a, key, .. }
        | Write::SetX { by_a, key, .. }
        | Write::Delete { by_a, key } => (*by_a, *key),
    };
    let s = if by_a { a } else { b };
    let key = key_of(k);
    let old = shadow.get(&k).cloned();
    let new = match w {
        Write::Put { n, x, .. } => {
            let mut i = item(*n);
            if *x {
                i.insert("x".into(), Value::S(format!("put{n}")));
            }
            s.put(PutRequest {
                key: key.clone(),
                item: i.clone(),
                condition: None,
            })
            .await
            .expect("put");
            Some(stamped(k, i))
        }
        Write::Add { n, .. } => {
            // The item as the store answers it (`ALL_NEW`).
            s.update(add(&key, *n)).await.expect("add")
        }
        Write::SetX { x, .. } => {
            let update = match x {
                Some(x) => tollgate_core::expr::Update::new().set("x", Value::S(x.clone())),
                None => tollgate_core::expr::Update::new().remove("x"),
            };
            s.update(tollgate_store::UpdateRequest {
                key: key.clone(),
                update,
                condition: None,
                returns: tollgate_core::expr::ReturnValues::AllNew,
            })
            .await
            .expect("set")
        }
        Write::Delete { .. } => {
            s.delete(tollgate_store::DeleteRequest {
                key: key.clone(),
                condition: None,
            })
            .await
            .expect("delete");
            None
        }
    };
    match &new {
        Some(i) => shadow.insert(k, i.clone()),
        None => shadow.remove(&k),
    };
    (old != new).then_some((key, old, new))
}

/// Read the whole feed from `from` in batches of `limit`, as (key, old, new) by number.
async fn read_all(
    s: &SqliteStore,
    from: u64,
    limit: usize,
) -> Result<Vec<(u64, Key, Image, Image)>, StoreError> {
    let mut cursor = after(from);
    let mut out = Vec::new();
    loop {
        let b = s.read_feed(&cursor, limit).await?;
        if b.changes.is_empty() {
            return Ok(out);
        }
        assert!(b.changes.len() <= limit);
        for c in b.changes {
            out.push((
                c.position.seq.parse().unwrap(),
                c.key,
                c.old.map(|i| (*i).clone()),
                c.new.map(|i| (*i).clone()),
            ));
        }
        cursor = b.cursor;
    }
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(48))]

    /// Rows leave out the images their neighbours give (schema version 5): for any writes by
    /// two stores on one file, every reader — a third store that holds nothing, the writer
    /// that holds its own changes, from any position, in batches of any size, before and
    /// after a trim — reads back exactly the old and new image of every change.
    #[test]
    fn the_feed_rebuilds_every_image_for_any_reader(
        writes in proptest::collection::vec(write_strategy(), 1..40),
        cut in 0usize..40,
        window in 0usize..5,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (dir, a, b) = two_stores("rebuild.db");
            // A holds its own changes from its first read on.
            a.read_feed(&FeedCursor::start(), 1).await.unwrap();
            let mut shadow = std::collections::BTreeMap::new();
            let mut want = Vec::new();
            for w in &writes {
                if let Some(c) = apply_write(&a, &b, &mut shadow, w).await {
                    want.push(c);
                }
            }
            let want: Vec<(u64, Key, Image, Image)> = want
                .into_iter()
                .enumerate()
                .map(|(i, (k, o, n))| (i as u64 + 1, k, o, n))
                .collect();
            let c = SqliteStore::open(dir.path().join("rebuild.db")).unwrap();
            for limit in [1, 2, 3, 7, 1000] {
                assert_eq!(read_all(&c, 0, limit).await.unwrap(), want, "limit {limit}");
            }
            for from in 0..want.len() as u64 {
                assert_eq!(read_all(&c, from, 2).await.unwrap(), want[from as usize..]);
            }
            assert_eq!(read_all(&a, 0, 3).await.unwrap(), want, "the writer, held and read");
            // A reader that keeps few rebuilt changes: it walks the feed again and again.
            let d = SqliteStore::open_with(
                dir.path().join("rebuild.db"),
                &tollgate_sqlite::SqliteConfig::default().with_feed_rebuild_window(window),
            )
            .unwrap();
            for limit in [1, 2, 5] {
                assert_eq!(read_all(&d, 0, limit).await.unwrap(), want, "window {window}");
            }
            // Trim the oldest changes: the rest still read back exactly.
            let cut = (cut as u64).min(want.len() as u64);
            a.trim_feed(&after(cut), i64::MAX).await.unwrap();
            let kept = want.len().saturating_sub(1).min(cut as usize);
            let from = kept as u64;
            assert_eq!(read_all(&c, from, 3).await.unwrap(), want[kept..]);
            assert_eq!(read_all(&b, from, 1000).await.unwrap(), want[kept..]);
        });
    }
}

/// A read-only open of a file from an older tollgate refuses it without upgrading it, and
/// says how to: a command that writes upgrades it.
#[tokio::test]
async fn a_read_only_open_of_an_older_file_says_how_to_upgrade_it() {
    let (dir, a, _b) = two_stores("older.db");
    drop((a, _b));
    let path = dir.path().join("older.db");
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch("PRAGMA user_version = 4;")
        .unwrap();
    let cfg = tollgate_sqlite::SqliteConfig::default();
    match SqliteStore::open_read_only_with(&path, &cfg) {
        Err(StoreError::Unavailable(m)) => {
            assert!(
                m.contains("schema version 4, from an older tollgate"),
                "{m}"
            );
            assert!(m.contains("upgrades the file"), "{m}");
        }
        other => panic!(
            "an older file must be refused read-only, got {:?}",
            other.err()
        ),
    }
    assert_eq!(user_version(&path), 4, "not upgraded by a read-only open");
    SqliteStore::open(&path).expect("a writing open upgrades it");
    assert_eq!(user_version(&path), SCHEMA_VERSION);
}
