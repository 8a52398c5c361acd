//! A pass-through store whose writes a test may refuse with a chosen error — the one home
//! for "this write fails the way a real store would" in behaviour scenarios.

use std::sync::Arc;

use async_trait::async_trait;
use tollgate_core::value::{Item, Key};
use tollgate_store::{
    DeleteRequest, PutRequest, Query, Store, StoreError, TransactOp, UpdateRequest,
};

use super::TestStore;

/// Decides, for an update, whether it fails (and how) instead of reaching the store.
pub type OnUpdate = Box<dyn Fn(&UpdateRequest) -> Option<StoreError> + Send + Sync>;
/// Decides, for a transaction, whether it fails (and how) instead of reaching the store.
pub type OnTransact = Box<dyn Fn(&[TransactOp]) -> Option<StoreError> + Send + Sync>;

/// Every request passes through to `inner`, except updates and transactions the hooks
/// refuse.
pub struct Intercept {
    inner: Arc<dyn TestStore>,
    on_update: OnUpdate,
    on_transact: OnTransact,
}

impl Intercept {
    /// A store over `inner` refusing what the hooks say.
    pub fn new(inner: Arc<dyn TestStore>, on_update: OnUpdate, on_transact: OnTransact) -> Self {
        Intercept {
            inner,
            on_update,
            on_transact,
        }
    }
}

#[async_trait]
impl Store for Intercept {
    async fn get(&self, k: &Key, c: bool) -> Result<Option<Item>, StoreError> {
        self.inner.get(k, c).await
    }
    async fn batch_get(&self, k: &[Key], c: bool) -> Result<Vec<Option<Item>>, StoreError> {
        self.inner.batch_get(k, c).await
    }
    async fn put(&self, r: PutRequest) -> Result<(), StoreError> {
        self.inner.put(r).await
    }
    async fn update(&self, r: UpdateRequest) -> Result<Option<Item>, StoreError> {
        match (self.on_update)(&r) {
            Some(e) => Err(e),
            None => self.inner.update(r).await,
        }
    }
    async fn delete(&self, r: DeleteRequest) -> Result<Option<Item>, StoreError> {
        self.inner.delete(r).await
    }
    async fn transact_write(
        &self,
        o: Vec<TransactOp>,
        t: Option<String>,
    ) -> Result<(), StoreError> {
        match (self.on_transact)(&o) {
            Some(e) => Err(e),
            None => self.inner.transact_write(o, t).await,
        }
    }
    async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError> {
        self.inner.query(q).await
    }
    fn backend(&self) -> &'static str {
        "intercept"
    }
}
