//! The conformance suite on the reference store.

use tollgate_store::conformance::{checks, run_all};
use tollgate_store::{MemoryStore, Store};

tollgate_store::conformance_tests!(memory_store_conforms, async { MemoryStore::new() });

#[test]
fn suite_has_distinct_names() {
    let names: std::collections::BTreeSet<_> = checks().iter().map(|c| c.name).collect();
    assert_eq!(names.len(), checks().len());
    assert!(names.len() >= 30, "{} checks", names.len());
}

#[tokio::test]
async fn run_all_with_a_sync_factory() {
    let make = || -> Box<dyn Store> { Box::new(MemoryStore::new()) };
    let results = run_all(&make).await;
    assert_eq!(results.len(), checks().len());
    let failed: Vec<_> = results.iter().filter(|(_, r)| r.is_err()).collect();
    assert!(failed.is_empty(), "{failed:?}");
}
