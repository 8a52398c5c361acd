//! The store conformance suite on SqliteStore: every check on a fresh temp-file store, and
//! again on a fresh in-memory store.

use std::sync::atomic::{AtomicUsize, Ordering};

use tollgate_sqlite::SqliteStore;
use tollgate_store::conformance::{self, run_all, CheckResult};
use tollgate_store::Store;

fn report(results: Vec<(&'static str, CheckResult)>, what: &str) {
    assert!(!results.is_empty(), "the suite ran no check");
    let names: Vec<&str> = results.iter().map(|(n, _)| *n).collect();
    eprintln!("{what}: {} checks ran: {}", names.len(), names.join(", "));
    if let Err(failed) = conformance::report(&results) {
        panic!("{what}: {failed}");
    }
}

#[tokio::test]
async fn conformance_on_temp_files() {
    let dir = tempfile::tempdir().expect("temp dir");
    let n = AtomicUsize::new(0);
    let make = || -> Box<dyn Store> {
        let i = n.fetch_add(1, Ordering::SeqCst);
        let path = dir.path().join(format!("conf-{i}.db"));
        Box::new(SqliteStore::open(&path).expect("open temp store"))
    };
    report(run_all(&make).await, "file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_in_memory_on_multi_thread_runtime() {
    let make = || -> Box<dyn Store> {
        Box::new(SqliteStore::open_in_memory().expect("open in-memory store"))
    };
    report(run_all(&make).await, "memory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feed_conformance_on_temp_files_and_in_memory() {
    let dir = tempfile::tempdir().expect("temp dir");
    let n = AtomicUsize::new(0);
    let results = conformance::feed::run_feed_all(|| {
        let i = n.fetch_add(1, Ordering::SeqCst);
        let path = dir.path().join(format!("feed-{i}.db"));
        async move {
            let b: Box<dyn tollgate_store::ChangeFeed> =
                Box::new(SqliteStore::open(&path).expect("open temp store"));
            b
        }
    })
    .await;
    report(results, "feed on files");
    let results = conformance::feed::run_feed_all(|| async {
        let b: Box<dyn tollgate_store::ChangeFeed> =
            Box::new(SqliteStore::open_in_memory().expect("open in-memory store"));
        b
    })
    .await;
    report(results, "feed in memory");
}
