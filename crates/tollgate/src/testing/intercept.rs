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

/// Every request passes through to `inner`; the first `n` transactions are applied and
/// then answered with [`StoreError::Ambiguous`] — "the write landed, the response was lost".
pub struct LostResponses {
    inner: Arc<dyn TestStore>,
    left: std::sync::atomic::AtomicU32,
}

impl LostResponses {
    /// A store over `inner` losing the responses of its next `n` transactions.
    pub fn new(inner: Arc<dyn TestStore>, n: u32) -> Self {
        LostResponses {
            inner,
            left: std::sync::atomic::AtomicU32::new(n),
        }
    }
}

#[async_trait]
impl Store for LostResponses {
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
        self.inner.update(r).await
    }
    async fn delete(&self, r: DeleteRequest) -> Result<Option<Item>, StoreError> {
        self.inner.delete(r).await
    }
    async fn transact_write(
        &self,
        o: Vec<TransactOp>,
        t: Option<String>,
    ) -> Result<(), StoreError> {
        self.inner.transact_write(o, t).await?;
        let lose = self
            .left
            .fetch_update(
                std::sync::atomic::Ordering::SeqCst,
                std::sync::atomic::Ordering::SeqCst,
                |n| n.checked_sub(1),
            )
            .is_ok();
        if lose {
            return Err(StoreError::Ambiguous("response lost (staged)".into()));
        }
        Ok(())
    }
    async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError> {
        self.inner.query(q).await
    }
    fn backend(&self) -> &'static str {
        "lost-responses"
    }
}
