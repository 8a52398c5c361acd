//! Crash consistency: a writer process doing conditional debits is SIGKILLed again and again;
//! after every kill the file is reopened, passes `PRAGMA integrity_check`, and the stored
//! counter reflects every debit the writer saw acknowledged, plus at most the ones in flight
//! (one per debiting task: with several tasks the store group-commits their debits). At the
//! end the change feed holds every applied debit, exactly.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

use tollgate_core::value::{Item, Key, Value};
use tollgate_sqlite::SqliteStore;
use tollgate_store::{ChangeFeed, FeedCursor, PutRequest, Store};

const START: i64 = 1_000_000;
const ROUNDS: u64 = 24;

async fn stock(path: &std::path::Path, n: i64) {
    let s = SqliteStore::open(path).unwrap();
    let mut item = Item::new();
    item.insert("n".into(), Value::N(n));
    s.put(PutRequest {
        key: Key::new("crash", "#COUNTER"),
        item,
        condition: None,
    })
    .await
    .unwrap();
}

async fn counter(path: &std::path::Path) -> i64 {
    let s = SqliteStore::open(path).expect("reopen after kill");
    s.integrity_check().expect("integrity_check after kill");
    let raw = rusqlite::Connection::open(path).expect("raw open");
    let check: String = raw
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check");
    assert_eq!(check, "ok");
    s.get(&Key::new("crash", "#COUNTER"), true)
        .await
        .expect("read counter")
        .and_then(|i| i.get("n").and_then(Value::as_n))
        .expect("counter present")
}

#[tokio::test]
async fn sigkilled_writer_loses_no_acknowledged_debit() {
    kill_and_check(1, ROUNDS).await;
}

/// The same with 8 concurrent debiting tasks in the writer, so kills land in group commits
/// of several debits: still every acknowledged debit is applied, at most 8 more.
#[tokio::test]
async fn sigkilled_group_committing_writer_loses_no_acknowledged_debit() {
    kill_and_check(8, 16).await;
}

async fn kill_and_check(tasks: i64, rounds: u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.db");
    stock(&path, START).await;

    let exe = env!("CARGO_BIN_EXE_tollgate-sqlite-crashwriter");
    let mut expected = START;
    let (mut acknowledged_total, mut in_flight_total) = (0i64, 0i64);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..rounds {
        let mut child = Command::new(exe)
            .arg(&path)
            .arg(tasks.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn writer");
        let stdout = child.stdout.take().expect("piped stdout");
        // Count complete lines until EOF (the kill closes the pipe).
        let reader = thread::spawn(move || {
            BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .filter(|l| l == "debit")
                .count() as i64
        });
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // Every sixth kill lands during start-up or open (schema check, WAL recovery of the
        // previous kill); the others mid-run.
        let delay_ms = if round % 6 == 5 {
            1 + (seed >> 33) % 5
        } else {
            5 + (seed >> 33) % 150
        };
        thread::sleep(Duration::from_millis(delay_ms));
        child.kill().expect("SIGKILL the writer");
        let status = child.wait().expect("reap writer");
        assert!(
            !status.success(),
            "round {round}: writer exited on its own ({status})"
        );
        let acknowledged = reader.join().expect("reader thread");
        let found = expected - counter(&path).await;
        eprintln!(
            "round {round}: killed after {delay_ms} ms, acknowledged {acknowledged}, applied {found}"
        );
        assert!(
            found >= acknowledged,
            "round {round}: {acknowledged} debits acknowledged but only {found} applied"
        );
        assert!(
            found <= acknowledged + tasks,
            "round {round}: {found} debits applied but only {acknowledged} acknowledged \
             (+{tasks} in flight)"
        );
        acknowledged_total += acknowledged;
        in_flight_total += found - acknowledged;
        expected -= found;
    }
    eprintln!(
        "{tasks} task(s), {rounds} kills: {acknowledged_total} acknowledged debits, {} applied ({in_flight_total} in flight at a kill)",
        acknowledged_total + in_flight_total
    );
    assert!(
        acknowledged_total > 0,
        "the writer never got a debit acknowledged"
    );
    feed_holds_every_debit(&path, START, expected).await;
}

/// The change feed, read by a store that holds nothing, shows the stock put and then
/// every applied debit, one by one, each change's old image the previous one's new image:
/// including the changes a killed writer left without their new images (`feed.rs`).
async fn feed_holds_every_debit(path: &std::path::Path, start: i64, end: i64) {
    let s = SqliteStore::open(path).unwrap();
    let n = |i: &Option<std::sync::Arc<Item>>| i.as_ref().and_then(|i| i.get("n")?.as_n());
    let mut cursor = FeedCursor::start();
    let mut last: Option<i64> = None;
    let mut changes = 0i64;
    loop {
        let b = s.read_feed(&cursor, 1000).await.expect("read the feed");
        if b.changes.is_empty() {
            break;
        }
        for c in &b.changes {
            assert_eq!(n(&c.old), last, "change {}", c.position.seq);
            let want = last.map_or(start, |l| l - 1);
            assert_eq!(n(&c.new), Some(want), "change {}", c.position.seq);
            last = n(&c.new);
            changes += 1;
        }
        cursor = b.cursor;
    }
    assert_eq!(last, Some(end));
    assert_eq!(changes, 1 + start - end);
}

/// Two writer processes on one file, each debiting until the stock is gone: together they
/// get exactly the stock acknowledged, never more (no lost update across processes).
#[tokio::test]
async fn two_writer_processes_share_the_stock_exactly() {
    share_between_two_processes(1).await;
}

/// The same with 8 debiting tasks per process: two writers group-committing on one file
/// (SQLite's lock serialises their batches) still acknowledge exactly the stock.
#[tokio::test]
async fn two_group_committing_processes_share_the_stock_exactly() {
    share_between_two_processes(8).await;
}

async fn share_between_two_processes(tasks: usize) {
    const STOCK: i64 = 600;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("two.db");
    stock(&path, STOCK).await;
    let exe = env!("CARGO_BIN_EXE_tollgate-sqlite-crashwriter");
    let children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(exe)
                .arg(&path)
                .arg(tasks.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn writer")
        })
        .collect();
    let mut per_process = Vec::new();
    for child in children {
        let out = child.wait_with_output().expect("writer output");
        assert!(out.status.success(), "writer failed: {}", out.status);
        let n = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| *l == "debit")
            .count() as i64;
        per_process.push(n);
    }
    eprintln!("two processes of {tasks} task(s) acknowledged {per_process:?} debits of {STOCK}");
    assert_eq!(per_process.iter().sum::<i64>(), STOCK);
    assert_eq!(counter(&path).await, 0);
}
