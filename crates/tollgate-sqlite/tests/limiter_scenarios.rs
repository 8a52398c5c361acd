//! The limiter behaviour scenarios — the same code the reference backend runs
//! (crates/tollgate/tests/scenarios.rs) — on the embedded store, one fresh file per scenario.

use std::sync::Arc;

use tollgate::testing::{Backend, TestStore};
use tollgate_core::value::{Item, Key};
use tollgate_sqlite::SqliteStore;
use tollgate_store::{
    DeleteRequest, PutRequest, Query, Store, StoreError, TransactOp, UpdateRequest,
};

/// A store on its own temporary file, with raw access for staging states (unconditional
/// writes through the store itself, run to completion on the test's runtime).
struct Raw {
    store: SqliteStore,
    path: std::path::PathBuf,
    /// The temporary directory (owned by the first store on the file; a twin borrows it).
    _dir: Arc<tempfile::TempDir>,
}

fn block<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

#[async_trait::async_trait]
impl Store for Raw {
    async fn get(&self, k: &Key, c: bool) -> Result<Option<Item>, StoreError> {
        self.store.get(k, c).await
    }
    async fn batch_get(&self, k: &[Key], c: bool) -> Result<Vec<Option<Item>>, StoreError> {
        self.store.batch_get(k, c).await
    }
    async fn put(&self, r: PutRequest) -> Result<(), StoreError> {
        self.store.put(r).await
    }
    async fn update(&self, r: UpdateRequest) -> Result<Option<Item>, StoreError> {
        self.store.update(r).await
    }
    async fn delete(&self, r: DeleteRequest) -> Result<Option<Item>, StoreError> {
        self.store.delete(r).await
    }
    async fn transact_write(
        &self,
        o: Vec<TransactOp>,
        t: Option<String>,
    ) -> Result<(), StoreError> {
        self.store.transact_write(o, t).await
    }
    async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError> {
        self.store.query(q).await
    }
    fn backend(&self) -> &'static str {
        self.store.backend()
    }
    async fn scan(
        &self,
        pk_prefix: &str,
        after: Option<Key>,
        limit: usize,
    ) -> Result<tollgate_store::ScanPage, tollgate_store::StoreError> {
        self.store.scan(pk_prefix, after, limit).await
    }
    async fn purge(&self, key: &Key) -> Result<(), tollgate_store::StoreError> {
        self.store.purge(key).await
    }
}

#[async_trait::async_trait]
impl tollgate_store::ChangeFeed for Raw {
    async fn read_feed(
        &self,
        cursor: &tollgate_store::FeedCursor,
        limit: usize,
    ) -> Result<tollgate_store::FeedBatch, StoreError> {
        self.store.read_feed(cursor, limit).await
    }
    async fn trim_feed(
        &self,
        cursor: &tollgate_store::FeedCursor,
        before_ms: i64,
    ) -> Result<(), StoreError> {
        self.store.trim_feed(cursor, before_ms).await
    }
}

impl TestStore for Raw {
    fn change_feed(self: Arc<Self>) -> Option<Arc<dyn tollgate_store::ChangeFeed>> {
        Some(self)
    }
    fn raw_get(&self, key: &Key) -> Option<Item> {
        block(self.store.get(key, true)).expect("raw get")
    }
    fn raw_put(&self, key: &Key, item: Item) {
        block(self.store.put(PutRequest {
            key: key.clone(),
            item,
            condition: None,
        }))
        .expect("raw put")
    }
    fn raw_delete(&self, key: &Key) {
        block(self.store.delete(DeleteRequest {
            key: key.clone(),
            condition: None,
        }))
        .expect("raw delete");
    }
    /// A second connection to the same file, as another process would open it.
    fn twin(&self) -> Option<tollgate::testing::StoreFuture> {
        let path = self.path.clone();
        let dir = self._dir.clone();
        Some(Box::pin(async move {
            let store = SqliteStore::open(&path).expect("reopen sqlite");
            Arc::new(Raw {
                store,
                path,
                _dir: dir,
            }) as Arc<dyn TestStore>
        }))
    }

    /// Written through the store (so its index columns are right), then the attribute
    /// rewritten in the file to a JSON number with a fraction.
    fn raw_put_undecodable(&self, key: &Key, item: Item, attribute: &str) -> bool {
        self.raw_put(key, item);
        let conn = rusqlite::Connection::open(&self.path).expect("open the file");
        let n = conn
            .execute(
                "UPDATE items SET item = json_set(item, '$.' || ?1, json('{\"n\":1.5}'))
                 WHERE pk = ?2 AND sk = ?3",
                rusqlite::params![attribute, key.pk, key.sk],
            )
            .expect("rewrite the item");
        assert_eq!(n, 1, "{key}");
        true
    }
}

fn sqlite() -> Option<Backend> {
    Some(Backend::new(|| {
        Box::pin(async {
            let dir = tempfile::tempdir().expect("temp dir");
            let path = dir.path().join("tollgate.db");
            let store = SqliteStore::open(&path).expect("open sqlite");
            Arc::new(Raw {
                store,
                path,
                _dir: Arc::new(dir),
            }) as Arc<dyn TestStore>
        })
    }))
}

tollgate::scenario_tests!(sqlite());
