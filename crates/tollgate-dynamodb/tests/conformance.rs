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
