//! SqliteStore beyond the shared conformance suite: persistence, corrupt rows, busy files,
//! two connections on one file, and a differential run against MemoryStore.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::expr::{Condition, ReturnValues, SetValue, Update};
use tollgate_core::value::{Item, Key, Value};
use tollgate_sqlite::{SqliteConfig, SqliteStore, SCHEMA_VERSION};
use tollgate_store::{
    CancelReason, DeleteRequest, MemoryStore, PutRequest, Query, Store, StoreError, TransactOp,
    UpdateRequest,
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

#[tokio::test]
async fn writes_survive_reopen_and_schema_version_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let k = Key::new("e1", "#STATE");
    {
        let s = SqliteStore::open(&path).unwrap();
        put_n(&s, &k, 42).await;
        s.transact_write(
            vec![TransactOp::Put(PutRequest {
                key: Key::new("e2", "#STATE"),
                item: Item::new(),
                condition: None,
            })],
            Some("tok-1".into()),
        )
        .await
        .unwrap();
    }
    let s = SqliteStore::open(&path).unwrap();
    assert_eq!(n_of(&s, &k).await, Some(42));
    // The token survived the reopen: the same transaction is not applied again.
    s.delete(DeleteRequest {
        key: Key::new("e2", "#STATE"),
        condition: None,
    })
    .await
    .unwrap();
    s.transact_write(
        vec![TransactOp::Put(PutRequest {
            key: Key::new("e2", "#STATE"),
            item: Item::new(),
            condition: None,
        })],
        Some("tok-1".into()),
    )
    .await
    .unwrap();
    assert_eq!(s.get(&Key::new("e2", "#STATE"), true).await.unwrap(), None);
    s.integrity_check().unwrap();

    let raw = rusqlite::Connection::open(&path).unwrap();
    let v: i64 = raw
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, SCHEMA_VERSION);
    let mode: String = raw
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    drop(SqliteStore::open(&path).unwrap());
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    drop(raw);
    // A configuration problem, not an outage: Validation (never `is_unavailable`), naming
    // the file and both versions.
    match SqliteStore::open(&path) {
        Err(e @ StoreError::Validation(_)) => {
            assert!(!e.is_unavailable());
            let m = e.to_string();
            assert!(
                m.contains(&format!("schema version {}", SCHEMA_VERSION + 1)),
                "{m}"
            );
            assert!(m.contains(&format!("version {SCHEMA_VERSION}")), "{m}");
            assert!(m.contains(&path.display().to_string()), "{m}");
        }
        other => panic!("expected Validation, got {other:?}"),
    }
}

/// A file this build must not use is a configuration error naming the file, never an
/// outage (`is_unavailable` is false, so a limiter cannot fail open on it), and the file is
/// left as it was.
#[test]
fn a_file_that_is_not_a_tollgate_store_is_refused_as_validation() {
    let dir = tempfile::tempdir().unwrap();
    let refused = |path: &std::path::Path, needle: &str| match SqliteStore::open(path) {
        Err(e @ StoreError::Validation(_)) => {
            assert!(!e.is_unavailable());
            let m = e.to_string();
            assert!(m.contains(&path.display().to_string()), "{m}");
            assert!(m.contains("not a tollgate store"), "{m}");
            assert!(m.contains(needle), "{m}");
        }
        other => panic!("{}: expected Validation, got {other:?}", path.display()),
    };

    // Not SQLite at all.
    let junk = dir.path().join("junk.db");
    std::fs::write(&junk, vec![0x5au8; 8192]).unwrap();
    refused(&junk, "cannot read it as a database");
    assert_eq!(std::fs::read(&junk).unwrap(), vec![0x5au8; 8192]);

    // Another application's database (no schema version, its own tables).
    let foreign = dir.path().join("foreign.db");
    let raw = rusqlite::Connection::open(&foreign).unwrap();
    raw.execute_batch("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        .unwrap();
    drop(raw);
    refused(&foreign, "users");
    let raw = rusqlite::Connection::open(&foreign).unwrap();
    let tables: i64 = raw
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tables, 1, "nothing was created in the foreign file");
    let mode: String = raw
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        mode, "delete",
        "the foreign file's journal mode was left alone"
    );

    // Version 1 claimed, but not our tables.
    let impostor = dir.path().join("impostor.db");
    let raw = rusqlite::Connection::open(&impostor).unwrap();
    raw.execute_batch("CREATE TABLE items (k TEXT); PRAGMA user_version = 1")
        .unwrap();
    drop(raw);
    refused(&impostor, "table items has columns (k)");
}

#[tokio::test]
async fn a_corrupt_row_is_reported_with_its_key_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let s = SqliteStore::open(&path).unwrap();
    let good = Key::new("p", "a");
    let bad = Key::new("p", "b");
    put_n(&s, &good, 1).await;
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute(
        "INSERT INTO items (pk, sk, item, gsi1pk, gsi1sk) VALUES ('p', 'b', '{not json', 'g', 'x')",
        [],
    )
    .unwrap();
    let is_corrupt = |r: &StoreError| matches!(r, StoreError::Corrupt(m) if m.contains("p|b"));

    let e = s.get(&bad, true).await.unwrap_err();
    assert!(is_corrupt(&e), "{e:?}");
    let e = s
        .batch_get(&[good.clone(), bad.clone()], true)
        .await
        .unwrap_err();
    assert!(is_corrupt(&e), "{e:?}");
    let e = s.query(Query::table("p", None)).await.unwrap_err();
    assert!(is_corrupt(&e), "{e:?}");
    let e = s.query(Query::index("GSI1", "g", None)).await.unwrap_err();
    assert!(is_corrupt(&e), "{e:?}");
    let e = s.update(debit(&bad)).await.unwrap_err();
    assert!(is_corrupt(&e), "{e:?}");
    let e = s
        .transact_write(
            vec![
                TransactOp::Update(debit(&good)),
                TransactOp::Update(debit(&bad)),
            ],
            None,
        )
        .await
        .unwrap_err();
    assert!(is_corrupt(&e), "{e:?}");
    // Nothing was written by the refused calls; the good row is still readable.
    assert_eq!(n_of(&s, &good).await, Some(1));

    // A row whose item is not text at all.
    raw.execute("UPDATE items SET item = 7 WHERE pk = 'p' AND sk = 'b'", [])
        .unwrap();
    let e = s.get(&bad, true).await.unwrap_err();
    assert!(is_corrupt(&e), "{e:?}");
}

/// An undecodable row names its attribute; `scan` lists it with its key (and the good rows
/// beside it), an unconditional `put` replaces it and `purge` deletes it — the repairs
/// `delete` and a conditional write cannot make, since they read the old item.
#[tokio::test]
async fn an_undecodable_row_is_scanned_replaced_and_purged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let s = SqliteStore::open(&path).unwrap();
    for sk in ["a", "b", "c"] {
        put_n(&s, &Key::new("ns/p", sk), 1).await;
    }
    put_n(&s, &Key::new("ns/q", "a"), 2).await;
    let raw = rusqlite::Connection::open(&path).unwrap();
    // A number with a fraction: JSON, but not of the item model.
    raw.execute(
        "UPDATE items SET item = json_set(item, '$.n', json('{\"n\":1.5}')) WHERE pk = 'ns/p' AND sk = 'b'",
        [],
    )
    .unwrap();
    raw.execute(
        "INSERT INTO items (pk, sk, item) VALUES ('ns/p', 'd', '{not json')",
        [],
    )
    .unwrap();
    let e = s.get(&Key::new("ns/p", "b"), true).await.unwrap_err();
    match &e {
        StoreError::Corrupt(m) => {
            assert!(m.contains("ns/p|b") && m.contains("attribute n:"), "{m}")
        }
        other => panic!("{other:?}"),
    }

    // Pages of 2 over ns/p (4 rows) and ns/q (1): every row once, the bad ones as entries.
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = s.scan("ns/", after, 2).await.unwrap();
        assert!(page.items.len() <= 2);
        for e in page.items {
            seen.push(match e {
                Ok(i) => format!("ok {}", Key::of(&i).unwrap()),
                Err(u) => format!(
                    "bad {} {:?} {}",
                    u.key,
                    u.attribute,
                    u.reason.split(':').next().unwrap_or("")
                ),
            });
        }
        match page.next {
            Some(k) => after = Some(k),
            None => break,
        }
    }
    assert_eq!(
        seen,
        [
            "ok ns/p|a",
            "bad ns/p|b Some(\"n\") undecodable value",
            "ok ns/p|c",
            "bad ns/p|d None undecodable JSON",
            "ok ns/q|a",
        ]
    );

    // `delete` must return the old item, so it cannot remove an undecodable one ...
    let e = s
        .delete(DeleteRequest {
            key: Key::new("ns/p", "d"),
            condition: None,
        })
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Corrupt(_)), "{e:?}");
    // ... `purge` can, and an unconditional put replaces one.
    s.purge(&Key::new("ns/p", "d")).await.unwrap();
    put_n(&s, &Key::new("ns/p", "b"), 7).await;
    assert_eq!(n_of(&s, &Key::new("ns/p", "b")).await, Some(7));
    let page = s.scan("ns/p", None, 10).await.unwrap();
    assert_eq!(page.items.len(), 3);
    assert!(page.items.iter().all(Result::is_ok));
    assert_eq!(page.next, None);
}

#[tokio::test]
async fn a_write_blocked_beyond_the_busy_timeout_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let cfg = SqliteConfig::default().with_busy_timeout(Duration::from_millis(100));
    let s = SqliteStore::open_with(&path, &cfg).unwrap();
    let k = Key::new("p", "a");
    put_n(&s, &k, 3).await;
    let holder = rusqlite::Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let e = s.update(debit(&k)).await.unwrap_err();
    match &e {
        StoreError::Unavailable(m) => assert!(m.contains("busy"), "{m}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(e.is_unavailable());
    // Reads do not wait for the writer in WAL mode.
    assert_eq!(n_of(&s, &k).await, Some(3));
    holder.execute_batch("ROLLBACK").unwrap();
    s.update(debit(&k)).await.unwrap();
    assert_eq!(n_of(&s, &k).await, Some(2));
}

#[tokio::test]
async fn two_connections_on_one_file_see_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let a = SqliteStore::open(&path).unwrap();
    let b = SqliteStore::open(&path).unwrap();
    let k = Key::new("p", "a");
    put_n(&a, &k, 5).await;
    assert_eq!(n_of(&b, &k).await, Some(5));
    b.update(debit(&k)).await.unwrap();
    assert_eq!(n_of(&a, &k).await, Some(4));
    let e = a
        .put(PutRequest {
            key: k.clone(),
            item: Item::new(),
            condition: Some(Condition::not_exists("PK")),
        })
        .await
        .unwrap_err();
    match e {
        StoreError::ConditionFailed { old: Some(old) } => {
            assert_eq!(old.get("n"), Some(&Value::N(4)))
        }
        other => panic!("expected ConditionFailed with the old item, got {other:?}"),
    }
}

/// 2 connections × 500 conditional decrements on n = 600: exactly 600 succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditional_writes_on_two_connections_serialize() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let k = Key::new("bucket", "#STATE");
    let a = SqliteStore::open(&path).unwrap();
    let b = SqliteStore::open(&path).unwrap();
    put_n(&a, &k, 600).await;
    let mut tasks = Vec::new();
    for s in [a.clone(), b.clone()] {
        let k = k.clone();
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut refused) = (0u32, 0u32);
            for _ in 0..500 {
                match s.update(debit(&k)).await {
                    Ok(_) => ok += 1,
                    Err(StoreError::ConditionFailed { old }) => {
                        assert_eq!(old.and_then(|o| o.get("n").cloned()), Some(Value::N(0)));
                        refused += 1
                    }
                    Err(e) => panic!("unexpected error: {e}"),
                }
            }
            (ok, refused)
        }));
    }
    let mut ok = 0;
    let mut refused = 0;
    for t in tasks {
        let (o, r) = t.await.unwrap();
        ok += o;
        refused += r;
    }
    assert_eq!(ok, 600);
    assert_eq!(refused, 400);
    assert_eq!(n_of(&a, &k).await, Some(0));
    assert_eq!(n_of(&b, &k).await, Some(0));
}

#[tokio::test]
async fn a_cancelled_transaction_writes_nothing_and_names_the_failing_op() {
    let s = SqliteStore::open_in_memory().unwrap();
    let (p, c) = (Key::new("parent", "#S"), Key::new("child", "#S"));
    put_n(&s, &p, 10).await;
    put_n(&s, &c, 0).await;
    let e = s
        .transact_write(
            vec![
                TransactOp::Update(debit(&p)),
                TransactOp::Update(debit(&c)),
                TransactOp::Put(PutRequest {
                    key: Key::new("audit", "1"),
                    item: Item::new(),
                    condition: None,
                }),
            ],
            Some("t".into()),
        )
        .await
        .unwrap_err();
    match e {
        StoreError::TransactionCanceled { reasons } => {
            assert_eq!(reasons.len(), 3);
            assert_eq!(reasons[0], CancelReason::None);
            assert!(
                matches!(&reasons[1], CancelReason::ConditionFailed { old: Some(o) } if o.get("n") == Some(&Value::N(0)))
            );
            assert_eq!(reasons[2], CancelReason::None);
        }
        other => panic!("expected TransactionCanceled, got {other:?}"),
    }
    assert_eq!(n_of(&s, &p).await, Some(10));
    assert_eq!(s.get(&Key::new("audit", "1"), true).await.unwrap(), None);
    // The token of a cancelled transaction is not remembered: a resend is evaluated.
    put_n(&s, &c, 1).await;
    s.transact_write(
        vec![TransactOp::Update(debit(&p)), TransactOp::Update(debit(&c))],
        Some("t".into()),
    )
    .await
    .unwrap();
    assert_eq!(n_of(&s, &p).await, Some(9));
    assert_eq!(n_of(&s, &c).await, Some(0));
}

// ---------------------------------------------------------------------------------------
// Differential: the same seeded operation sequence on MemoryStore and SqliteStore.

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn rand_key(r: &mut Lcg) -> Key {
    let pk = ["e/a", "e/b", "e/ä"][r.below(3) as usize];
    let sk = ["#STATE", "#LIMIT#x", "#LIMIT#y", "b_1", "B_2", ""][r.below(6) as usize];
    Key::new(pk, sk)
}

fn rand_value(r: &mut Lcg) -> Value {
    match r.below(5) {
        0 => Value::S(["g1", "g2", "x", "é"][r.below(4) as usize].into()),
        1 => Value::Bool(r.below(2) == 0),
        2 => Value::Ss(Box::new(
            ["a", "b"]
                .iter()
                .take(r.below(3) as usize)
                .map(|s| s.to_string())
                .collect(),
        )),
        _ => Value::N(r.below(7) as i64 - 2),
    }
}

fn rand_attr(r: &mut Lcg) -> &'static str {
    [
        "n", "m", "GSI1PK", "GSI1SK", "GSI2PK", "GSI5PK", "GSI5SK", "s",
    ][r.below(8) as usize]
}

fn rand_condition(r: &mut Lcg) -> Option<Condition> {
    match r.below(6) {
        0 => None,
        1 => Some(Condition::exists(rand_attr(r))),
        2 => Some(Condition::not_exists("PK")),
        3 => Some(Condition::ge("n", r.below(4) as i64)),
        4 => Some(Condition::Not(Box::new(Condition::lt("m", 1)))),
        _ => Some(Condition::eq(rand_attr(r), rand_value(r))),
    }
}

fn rand_update(r: &mut Lcg) -> Update {
    let mut u = Update::new();
    let mut used = Vec::new();
    for _ in 0..1 + r.below(3) {
        let a = rand_attr(r);
        if used.contains(&a) && r.below(4) != 0 {
            continue;
        }
        used.push(a);
        u = match r.below(5) {
            0 => u.add(a, r.below(5) as i64 - 2),
            1 => u.remove(a),
            2 => u.set_expr(
                a,
                SetValue::Plus(
                    Box::new(SetValue::IfNotExists("n".into(), Value::N(0))),
                    Box::new(SetValue::Value(Value::N(1))),
                ),
            ),
            _ => u.set(a, rand_value(r)),
        };
    }
    u
}

fn rand_op(r: &mut Lcg) -> TransactOp {
    let key = rand_key(r);
    match r.below(4) {
        0 => TransactOp::Put(PutRequest {
            key,
            item: (0..r.below(4))
                .map(|_| (rand_attr(r).into(), rand_value(r)))
                .collect(),
            condition: rand_condition(r),
        }),
        1 => TransactOp::Delete(DeleteRequest {
            key,
            condition: rand_condition(r),
        }),
        2 => TransactOp::Check {
            key,
            condition: rand_condition(r).unwrap_or(Condition::exists("PK")),
        },
        _ => TransactOp::Update(UpdateRequest {
            key,
            update: rand_update(r),
            condition: rand_condition(r),
            returns: [
                ReturnValues::None,
                ReturnValues::AllNew,
                ReturnValues::AllOld,
                ReturnValues::UpdatedNew,
            ][r.below(4) as usize],
        }),
    }
}

async fn step(s: &dyn Store, r: &mut Lcg) -> String {
    match r.below(8) {
        0 => format!("{:?}", s.get(&rand_key(r), r.below(2) == 0).await),
        1 => {
            let keys: Vec<Key> = (0..r.below(4)).map(|_| rand_key(r)).collect();
            format!("{:?}", s.batch_get(&keys, true).await)
        }
        2 => {
            let ops: Vec<TransactOp> = (0..1 + r.below(3)).map(|_| rand_op(r)).collect();
            let token = (r.below(3) == 0).then(|| format!("tok{}", r.below(4)));
            format!("{:?}", s.transact_write(ops, token).await)
        }
        3 => {
            let prefix =
                [None, Some(""), Some("#LIMIT"), Some("b"), Some("x")][r.below(5) as usize];
            let q = match r.below(4) {
                0 => Query::index("GSI1", ["g1", "g2", "x", "é"][r.below(4) as usize], prefix),
                1 => Query::index("GSI5", ["g1", "g2", "x", "é"][r.below(4) as usize], prefix),
                _ => Query::table(["e/a", "e/b", "e/ä"][r.below(3) as usize], prefix),
            };
            format!("{:?}", s.query(q).await)
        }
        _ => match rand_op(r) {
            TransactOp::Put(p) => format!("{:?}", s.put(p).await),
            TransactOp::Update(u) => format!("{:?}", s.update(u).await),
            TransactOp::Delete(d) => format!("{:?}", s.delete(d).await),
            TransactOp::Check { key, .. } => format!("{:?}", s.get(&key, true).await),
        },
    }
}

#[tokio::test]
async fn the_same_operations_give_the_same_results_as_memory_store() {
    let dir = tempfile::tempdir().unwrap();
    for seed in 0..20u64 {
        let mem = Arc::new(MemoryStore::new());
        let sql = SqliteStore::open(dir.path().join(format!("d{seed}.db"))).unwrap();
        let (mut r1, mut r2) = (Lcg(seed), Lcg(seed));
        for i in 0..300 {
            let a = step(mem.as_ref(), &mut r1).await;
            let b = step(&sql, &mut r2).await;
            assert_eq!(a, b, "seed {seed}, step {i}");
        }
        for pk in ["e/a", "e/b", "e/ä"] {
            let a = mem.query(Query::table(pk, None)).await.unwrap();
            let b = sql.query(Query::table(pk, None)).await.unwrap();
            assert_eq!(a, b, "seed {seed}: final partition {pk}");
        }
        let all: usize = mem.raw_items().len();
        let mut n = 0;
        for pk in ["e/a", "e/b", "e/ä"] {
            n += sql.query(Query::table(pk, None)).await.unwrap().len();
        }
        assert_eq!(all, n, "seed {seed}: item count");
    }
}

/// Several connections opening a new file at once: the schema is created exactly once and
/// every opener works (the busy timeout covers the WAL switch and the schema transaction).
#[tokio::test]
async fn concurrent_first_opens_of_a_new_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.db");
    let handles: Vec<_> = (0..6)
        .map(|i| {
            let path = path.clone();
            std::thread::spawn(move || {
                let s = SqliteStore::open(&path).expect("open");
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                rt.block_on(put_n(&s, &Key::new("opener", i.to_string()), i));
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let s = SqliteStore::open(&path).unwrap();
    assert_eq!(
        s.query(Query::table("opener", None)).await.unwrap().len(),
        6
    );
    s.integrity_check().unwrap();
}

/// Outside any tokio runtime the store still works (the call runs inline).
#[test]
fn works_without_a_tokio_runtime() {
    let s = SqliteStore::open_in_memory().unwrap();
    let k = Key::new("p", "a");
    let fut = async {
        put_n(&s, &k, 2).await;
        s.update(debit(&k)).await.unwrap();
        n_of(&s, &k).await
    };
    use std::future::Future;
    // A minimal executor: the store's futures complete without a runtime.
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut fut = std::pin::pin!(fut);
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(n) => assert_eq!(n, Some(1)),
        std::task::Poll::Pending => panic!("the store's future did not complete inline"),
    }
}

/// A file store's checkpoints run on their own thread (`src/checkpoint.rs`): a few hundred
/// WAL frames, far below the 1,000 at which the writer's own commit would checkpoint, still
/// reach the main database file within about a second of the last write. (With the
/// checkpointer gone the main file stays at its first size until the WAL's 1,000th frame.)
#[tokio::test]
async fn the_checkpointer_moves_committed_pages_into_the_main_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let s = SqliteStore::open(&path).unwrap();
    let first = std::fs::metadata(&path).unwrap().len();
    let text = "x".repeat(4_000);
    for i in 0..60 {
        s.put(PutRequest {
            key: Key::new(format!("e{i}"), "#STATE"),
            item: item(&[("blob", Value::S(text.clone()))]),
            condition: None,
        })
        .await
        .unwrap();
    }
    let wal = dir.path().join("t.db-wal");
    let wal_frames = std::fs::metadata(&wal).unwrap().len() / 4_096;
    assert!(
        wal_frames < 1_000,
        "the writer checkpointed itself ({wal_frames} frames)"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let grown = loop {
        let now = std::fs::metadata(&path).unwrap().len();
        if now >= first + 60 * 4_000 || std::time::Instant::now() > deadline {
            break now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        grown >= first + 60 * 4_000,
        "the main file did not receive the rows: {first} -> {grown} bytes"
    );
    let last = s.get(&Key::new("e59", "#STATE"), true).await.unwrap();
    assert_eq!(
        last.and_then(|i| i.get("blob").cloned()),
        Some(Value::S(text))
    );
}
