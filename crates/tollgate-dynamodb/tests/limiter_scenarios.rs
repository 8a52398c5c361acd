//! The limiter behaviour scenarios — the same code the reference backend runs
//! (crates/tollgate/tests/scenarios.rs) — on DynamoDB Local, one fresh table per scenario.

mod common;

use std::sync::Arc;

use tollgate::testing::{Backend, TestStore};
use tollgate_core::value::{Item, Key};
use tollgate_dynamodb::DynamoDbStore;
use tollgate_store::{DeleteRequest, PutRequest, Store};

/// Raw item access for staging states: strongly consistent reads and unconditional writes,
/// run to completion on the test's runtime.
struct Raw(DynamoDbStore, String);

fn block<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

#[async_trait::async_trait]
impl Store for Raw {
    async fn get(&self, k: &Key, c: bool) -> Result<Option<Item>, tollgate_store::StoreError> {
        self.0.get(k, c).await
    }
    async fn batch_get(
        &self,
        k: &[Key],
        c: bool,
    ) -> Result<Vec<Option<Item>>, tollgate_store::StoreError> {
        self.0.batch_get(k, c).await
    }
    async fn put(&self, r: PutRequest) -> Result<(), tollgate_store::StoreError> {
        self.0.put(r).await
    }
    async fn update(
        &self,
        r: tollgate_store::UpdateRequest,
    ) -> Result<Option<Item>, tollgate_store::StoreError> {
        self.0.update(r).await
    }
    async fn delete(&self, r: DeleteRequest) -> Result<Option<Item>, tollgate_store::StoreError> {
        self.0.delete(r).await
    }
    async fn transact_write(
        &self,
        o: Vec<tollgate_store::TransactOp>,
        t: Option<String>,
    ) -> Result<(), tollgate_store::StoreError> {
        self.0.transact_write(o, t).await
    }
    async fn query(
        &self,
        q: tollgate_store::Query,
    ) -> Result<Vec<Item>, tollgate_store::StoreError> {
        self.0.query(q).await
    }
    fn backend(&self) -> &'static str {
        self.0.backend()
    }
    async fn scan(
        &self,
        pk_prefix: &str,
        after: Option<Key>,
        limit: usize,
    ) -> Result<tollgate_store::ScanPage, tollgate_store::StoreError> {
        self.0.scan(pk_prefix, after, limit).await
    }
    async fn purge(&self, key: &Key) -> Result<(), tollgate_store::StoreError> {
        self.0.purge(key).await
    }
}

#[async_trait::async_trait]
impl tollgate_store::ChangeFeed for Raw {
    async fn read_feed(
        &self,
        cursor: &tollgate_store::FeedCursor,
        limit: usize,
    ) -> Result<tollgate_store::FeedBatch, tollgate_store::StoreError> {
        self.0.read_feed(cursor, limit).await
    }
}

impl TestStore for Raw {
    fn change_feed(self: Arc<Self>) -> Option<Arc<dyn tollgate_store::ChangeFeed>> {
        Some(self)
    }
    fn raw_get(&self, key: &Key) -> Option<Item> {
        block(self.0.get(key, true)).expect("raw get")
    }
    fn raw_put(&self, key: &Key, item: Item) {
        block(self.0.put(PutRequest {
            key: key.clone(),
            item,
            condition: None,
        }))
        .expect("raw put")
    }
    fn raw_delete(&self, key: &Key) {
        block(self.0.delete(DeleteRequest {
            key: key.clone(),
            condition: None,
        }))
        .expect("raw delete");
    }
    /// A second client of the same table, as another process would open it.
    fn twin(&self) -> Option<tollgate::testing::StoreFuture> {
        let endpoint = self.1.clone();
        let table = self.0.table().to_string();
        Some(Box::pin(async move {
            let s = common::store_for(&endpoint, &table).await;
            Arc::new(Raw(s, endpoint)) as Arc<dyn TestStore>
        }))
    }

    /// Written through the store, then the attribute set to `N "1.5"` with the SDK: a
    /// number DynamoDB holds and the item model (`i64`) cannot.
    fn raw_put_undecodable(&self, key: &Key, item: Item, attribute: &str) -> bool {
        use aws_sdk_dynamodb::types::AttributeValue;
        self.raw_put(key, item);
        block(
            self.0
                .client()
                .update_item()
                .table_name(self.0.table())
                .key("PK", AttributeValue::S(key.pk.to_string()))
                .key("SK", AttributeValue::S(key.sk.to_string()))
                .update_expression("SET #a = :v")
                .expression_attribute_names("#a", attribute)
                .expression_attribute_values(":v", AttributeValue::N("1.5".into()))
                .send(),
        )
        .expect("raw update");
        true
    }
}

fn dynamodb() -> Option<Backend> {
    let endpoint = common::endpoint("limiter_scenarios")?;
    Some(Backend::new(move || {
        let endpoint = endpoint.clone();
        Box::pin(async move {
            let s = common::fresh_store(&endpoint, "scn").await;
            Arc::new(Raw(s, endpoint)) as Arc<dyn TestStore>
        })
    }))
}

tollgate::scenario_tests!(dynamodb());
