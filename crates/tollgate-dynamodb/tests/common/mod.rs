//! Shared set-up of the DynamoDB Local tests: find the endpoint, make fresh tables.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use tokio::sync::OnceCell;
use tollgate_core::value::{Item, Key};
use tollgate_dynamodb::DynamoDbStore;
use tollgate_store::{
    DeleteRequest, PutRequest, Query, Store, StoreError, TransactOp, UpdateRequest,
};

const HOW_TO: &str = "\
These tests need DynamoDB Local. Start it and point the tests at it:

    scripts/dynamodb-local start 8765     # prints the endpoint, e.g. http://127.0.0.1:8765
    export TOLLGATE_DYNAMODB_ENDPOINT=http://127.0.0.1:8765
    export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1

(stop it afterwards with `scripts/dynamodb-local stop 8765`), or skip these tests with
TOLLGATE_SKIP_DYNAMODB=1.";

/// The endpoint of DynamoDB Local, `None` when the tests are to be skipped. Panics (fails
/// the test) with instructions when neither the endpoint nor the skip flag is set.
pub fn endpoint(test: &str) -> Option<String> {
    if std::env::var("TOLLGATE_SKIP_DYNAMODB").is_ok_and(|v| v == "1") {
        eprintln!("SKIP {test}: TOLLGATE_SKIP_DYNAMODB=1");
        return None;
    }
    match std::env::var("TOLLGATE_DYNAMODB_ENDPOINT") {
        Ok(e) if !e.trim().is_empty() => Some(e.trim().to_string()),
        _ => panic!("{test}: TOLLGATE_DYNAMODB_ENDPOINT is not set.\n\n{HOW_TO}"),
    }
}

/// A unique table name for this process and call.
pub fn table_name(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "tollgate-test-{tag}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// The deadline of the tests' stores. Longer than the 1 s default: these tests check
/// behaviour, not latency, on a shared two-core machine where DynamoDB Local (a JVM) can
/// stall for a second under load. `tests/hung_store.rs` tests the deadline itself.
pub const TEST_DEADLINE: Duration = Duration::from_secs(10);

/// A store over a new, not yet created table (credentials fall back to test/test).
pub async fn store_for(endpoint: &str, table: &str) -> DynamoDbStore {
    let mut b = DynamoDbStore::builder(table)
        .endpoint(endpoint)
        .deadline(TEST_DEADLINE);
    if std::env::var("AWS_ACCESS_KEY_ID").is_err() {
        b = b.static_credentials("test", "test");
    }
    b.build().await.expect("store builds")
}

/// A store over a freshly created table.
pub async fn fresh_store(endpoint: &str, tag: &str) -> DynamoDbStore {
    let s = store_for(endpoint, &table_name(tag)).await;
    s.create_table().await.expect("table created");
    s
}

/// A store whose table is created on first use: the conformance suite asks for a fresh
/// store from a synchronous closure.
pub struct LazyTable {
    endpoint: String,
    table: String,
    cell: OnceCell<DynamoDbStore>,
    created: Arc<Mutex<Vec<String>>>,
}

impl LazyTable {
    pub fn new(endpoint: &str, created: Arc<Mutex<Vec<String>>>) -> Self {
        LazyTable {
            endpoint: endpoint.to_string(),
            table: table_name("conf"),
            cell: OnceCell::new(),
            created,
        }
    }

    async fn s(&self) -> &DynamoDbStore {
        self.cell
            .get_or_init(|| async {
                let s = store_for(&self.endpoint, &self.table).await;
                s.create_table().await.expect("table created");
                if let Ok(mut c) = self.created.lock() {
                    c.push(self.table.clone());
                }
                s
            })
            .await
    }
}

#[async_trait]
impl Store for LazyTable {
    async fn get(&self, key: &Key, consistent: bool) -> Result<Option<Item>, StoreError> {
        self.s().await.get(key, consistent).await
    }
    async fn batch_get(
        &self,
        keys: &[Key],
        consistent: bool,
    ) -> Result<Vec<Option<Item>>, StoreError> {
        self.s().await.batch_get(keys, consistent).await
    }
    async fn put(&self, req: PutRequest) -> Result<(), StoreError> {
        self.s().await.put(req).await
    }
    async fn update(&self, req: UpdateRequest) -> Result<Option<Item>, StoreError> {
        self.s().await.update(req).await
    }
    async fn delete(&self, req: DeleteRequest) -> Result<Option<Item>, StoreError> {
        self.s().await.delete(req).await
    }
    async fn transact_write(
        &self,
        ops: Vec<TransactOp>,
        token: Option<String>,
    ) -> Result<(), StoreError> {
        self.s().await.transact_write(ops, token).await
    }
    async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError> {
        self.s().await.query(q).await
    }
    fn backend(&self) -> &'static str {
        "dynamodb"
    }
    async fn scan(
        &self,
        pk_prefix: &str,
        after: Option<Key>,
        limit: usize,
    ) -> Result<tollgate_store::ScanPage, StoreError> {
        self.s().await.scan(pk_prefix, after, limit).await
    }
    async fn purge(&self, key: &Key) -> Result<(), StoreError> {
        self.s().await.purge(key).await
    }
}
