//! The store conformance suite on DynamoDB Local (one fresh table per check).

mod common;

use std::sync::{Arc, Mutex};

use tollgate_store::Store;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_on_dynamodb_local() {
    let Some(endpoint) = common::endpoint("conformance_on_dynamodb_local") else {
        return;
    };
    let created = Arc::new(Mutex::new(Vec::new()));
    let make = {
        let (endpoint, created) = (endpoint.clone(), created.clone());
        move || -> Box<dyn Store> { Box::new(common::LazyTable::new(&endpoint, created.clone())) }
    };
    let results = tollgate_store::conformance::run_all(&make).await;
    let mut failed = Vec::new();
    for (name, r) in &results {
        match r {
            Ok(()) => eprintln!("PASS {name}"),
            Err(e) => {
                eprintln!("FAIL {name}: {e}");
                failed.push(format!("{name}: {e}"));
            }
        }
    }
    // Tear down the tables the checks created (DynamoDB Local keeps them in memory).
    let tables: Vec<String> = created.lock().map(|c| c.clone()).unwrap_or_default();
    let admin = common::store_for(&endpoint, "tollgate-admin").await;
    for t in tables {
        let _ = tollgate_dynamodb::delete_table(admin.client(), &t).await;
    }
    eprintln!(
        "{} of {} conformance checks passed",
        results.len() - failed.len(),
        results.len()
    );
    assert!(failed.is_empty(), "failing checks:\n{}", failed.join("\n"));
}

/// The change-feed checks on DynamoDB Local's streams (one fresh table per check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feed_conformance_on_dynamodb_local() {
    let Some(endpoint) = common::endpoint("feed_conformance_on_dynamodb_local") else {
        return;
    };
    let mut tables = Vec::new();
    let mut results = Vec::new();
    for check in tollgate_store::conformance::feed::feed_checks() {
        let s = common::fresh_store(&endpoint, "feed").await;
        tables.push(s.table().to_string());
        let r = (check.run)(&s).await;
        match &r {
            Ok(()) => eprintln!("PASS {}", check.name),
            Err(e) => eprintln!("FAIL {}: {e}", check.name),
        }
        results.push((check.name, r));
    }
    let admin = common::store_for(&endpoint, "tollgate-admin").await;
    for t in tables {
        let _ = tollgate_dynamodb::delete_table(admin.client(), &t).await;
    }
    assert!(results.len() >= 4);
    if let Err(m) = tollgate_store::conformance::report(&results) {
        panic!("{m}");
    }
}
