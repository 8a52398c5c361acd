//! A pass-through store that a test can take down, hang or make refuse every request as
//! invalid — the one home for "the store has trouble" in behaviour scenarios.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use tollgate_core::value::{Item, Key};
use tollgate_store::{
    DeleteRequest, PutRequest, Query, Store, StoreError, TransactOp, UpdateRequest,
};

use super::TestStore;

/// How the store behaves now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every request reaches the store.
    Up,
    /// Every request fails at once: `Unavailable` (connection refused).
    Down,
    /// Every request hangs: it never answers (a frozen server).
    Hung,
    /// Every request is refused as invalid: `Validation` (a missing table, a bug).
    Invalid,
}

/// Every request passes through to `inner` while [`Mode::Up`]; otherwise fails as the
/// mode says. Raw access always reaches `inner`.
pub struct Outage {
    inner: Arc<dyn TestStore>,
    mode: AtomicU8,
    refused: AtomicU64,
}

impl Outage {
    /// Up, over `inner`.
    pub fn new(inner: Arc<dyn TestStore>) -> Self {
        Outage {
            inner,
            mode: AtomicU8::new(0),
            refused: AtomicU64::new(0),
        }
    }
    /// Switch the mode.
    pub fn set(&self, m: Mode) {
        let v = match m {
            Mode::Up => 0,
            Mode::Down => 1,
            Mode::Hung => 2,
            Mode::Invalid => 3,
        };
        self.mode.store(v, Ordering::SeqCst);
    }
    /// The mode now.
    pub fn mode(&self) -> Mode {
        match self.mode.load(Ordering::SeqCst) {
            0 => Mode::Up,
            1 => Mode::Down,
            2 => Mode::Hung,
            _ => Mode::Invalid,
        }
    }
    /// Requests that did not reach the store.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::SeqCst)
    }

    /// `Ok` to pass through; the failure otherwise (hangs forever when hung).
    async fn gate(&self) -> Result<(), StoreError> {
        let m = self.mode();
        if m != Mode::Up {
            self.refused.fetch_add(1, Ordering::SeqCst);
        }
        match m {
            Mode::Up => Ok(()),
            Mode::Down => Err(StoreError::Unavailable("connection refused".into())),
            Mode::Invalid => Err(StoreError::Validation(
                "Requested resource not found: table nosuch".into(),
            )),
            Mode::Hung => std::future::pending().await,
        }
    }
}

#[async_trait]
impl Store for Outage {
    async fn get(&self, k: &Key, c: bool) -> Result<Option<Item>, StoreError> {
        self.gate().await?;
        self.inner.get(k, c).await
    }
    async fn batch_get(&self, k: &[Key], c: bool) -> Result<Vec<Option<Item>>, StoreError> {
        self.gate().await?;
        self.inner.batch_get(k, c).await
    }
    async fn put(&self, r: PutRequest) -> Result<(), StoreError> {
        self.gate().await?;
        self.inner.put(r).await
    }
    async fn update(&self, r: UpdateRequest) -> Result<Option<Item>, StoreError> {
        self.gate().await?;
        self.inner.update(r).await
    }
    async fn delete(&self, r: DeleteRequest) -> Result<Option<Item>, StoreError> {
        self.gate().await?;
        self.inner.delete(r).await
    }
    async fn transact_write(
        &self,
        o: Vec<TransactOp>,
        t: Option<String>,
    ) -> Result<(), StoreError> {
        self.gate().await?;
        self.inner.transact_write(o, t).await
    }
    async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError> {
        self.gate().await?;
        self.inner.query(q).await
    }
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    async fn scan(
        &self,
        pk_prefix: &str,
        after: Option<Key>,
        limit: usize,
    ) -> Result<tollgate_store::ScanPage, StoreError> {
        self.gate().await?;
        self.inner.scan(pk_prefix, after, limit).await
    }
    async fn purge(&self, key: &Key) -> Result<(), StoreError> {
        self.gate().await?;
        self.inner.purge(key).await
    }
}

impl TestStore for Outage {
    fn raw_get(&self, key: &Key) -> Option<Item> {
        self.inner.raw_get(key)
    }
    fn raw_put(&self, key: &Key, item: Item) {
        self.inner.raw_put(key, item)
    }
    fn raw_delete(&self, key: &Key) {
        self.inner.raw_delete(key)
    }
    fn raw_put_undecodable(&self, key: &Key, item: Item, attribute: &str) -> bool {
        self.inner.raw_put_undecodable(key, item, attribute)
    }
}
