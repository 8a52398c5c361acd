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

/// A store that forgets the old item on condition failures: the suite must name the checks
/// that notice.
struct ForgetsOld(MemoryStore);

#[async_trait::async_trait]
impl Store for ForgetsOld {
    async fn get(
        &self,
        key: &tollgate_core::value::Key,
        consistent: bool,
    ) -> Result<Option<tollgate_core::value::Item>, tollgate_store::StoreError> {
        self.0.get(key, consistent).await
    }
    async fn batch_get(
        &self,
        keys: &[tollgate_core::value::Key],
        consistent: bool,
    ) -> Result<Vec<Option<tollgate_core::value::Item>>, tollgate_store::StoreError> {
        self.0.batch_get(keys, consistent).await
    }
    async fn put(&self, req: tollgate_store::PutRequest) -> Result<(), tollgate_store::StoreError> {
        self.0.put(req).await.map_err(forget)
    }
    async fn update(
        &self,
        req: tollgate_store::UpdateRequest,
    ) -> Result<Option<tollgate_core::value::Item>, tollgate_store::StoreError> {
        self.0.update(req).await.map_err(forget)
    }
    async fn delete(
        &self,
        req: tollgate_store::DeleteRequest,
    ) -> Result<Option<tollgate_core::value::Item>, tollgate_store::StoreError> {
        self.0.delete(req).await.map_err(forget)
    }
    async fn transact_write(
        &self,
        ops: Vec<tollgate_store::TransactOp>,
        token: Option<String>,
    ) -> Result<(), tollgate_store::StoreError> {
        self.0.transact_write(ops, token).await
    }
    async fn query(
        &self,
        q: tollgate_store::Query,
    ) -> Result<Vec<tollgate_core::value::Item>, tollgate_store::StoreError> {
        self.0.query(q).await
    }
    fn backend(&self) -> &'static str {
        "forgets-old"
    }
}

fn forget(e: tollgate_store::StoreError) -> tollgate_store::StoreError {
    match e {
        tollgate_store::StoreError::ConditionFailed { .. } => {
            tollgate_store::StoreError::ConditionFailed { old: None }
        }
        e => e,
    }
}

#[tokio::test]
async fn report_names_every_failing_check() {
    let make = || -> Box<dyn Store> { Box::new(ForgetsOld(MemoryStore::new())) };
    let results = run_all(&make).await;
    let msg = tollgate_store::conformance::report(&results).expect_err("must fail");
    for name in [
        "put_if_absent",
        "update_condition_failed_returns_old",
        "conditional_delete_failure_returns_old",
        "concurrent_conditional_add",
    ] {
        assert!(msg.contains(name), "{name} missing from:\n{msg}");
    }
    assert!(!msg.contains("transaction_all_or_nothing"), "{msg}");
}
