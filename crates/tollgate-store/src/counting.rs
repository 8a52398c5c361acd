//! `Counting<S>`: counts the requests an operation makes to a store (the real cost on DynamoDB).

use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use tollgate_core::value::{Item, Key};

use crate::{
    DeleteRequest, PutRequest, Query, ScanPage, Store, StoreError, TransactOp, UpdateRequest,
};

/// Request counts, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// `get` requests.
    pub gets: u64,
    /// `batch_get` requests.
    pub batch_gets: u64,
    /// `put` requests.
    pub puts: u64,
    /// `update` requests.
    pub updates: u64,
    /// `delete` requests.
    pub deletes: u64,
    /// `transact_write` requests.
    pub transactions: u64,
    /// `query` requests.
    pub queries: u64,
}

impl StoreStats {
    /// Read requests (get, batch get, query).
    pub fn reads(&self) -> u64 {
        self.gets + self.batch_gets + self.queries
    }
    /// Write requests (put, update, delete, transaction).
    pub fn writes(&self) -> u64 {
        self.puts + self.updates + self.deletes + self.transactions
    }
    /// Every request.
    pub fn total(&self) -> u64 {
        self.reads() + self.writes()
    }
    /// The difference `self − earlier`.
    pub fn since(&self, earlier: &StoreStats) -> StoreStats {
        StoreStats {
            gets: self.gets - earlier.gets,
            batch_gets: self.batch_gets - earlier.batch_gets,
            puts: self.puts - earlier.puts,
            updates: self.updates - earlier.updates,
            deletes: self.deletes - earlier.deletes,
            transactions: self.transactions - earlier.transactions,
            queries: self.queries - earlier.queries,
        }
    }
}

#[derive(Debug, Default)]
struct Counters([AtomicU64; 7]);

/// A store wrapper that counts every request it forwards.
#[derive(Debug)]
pub struct Counting<S> {
    inner: S,
    c: Counters,
}

impl<S> Counting<S> {
    /// Wrap a store.
    pub fn new(inner: S) -> Self {
        Counting {
            inner,
            c: Counters::default(),
        }
    }
    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }
    /// Counts so far.
    pub fn stats(&self) -> StoreStats {
        let l = |i: usize| self.c.0[i].load(Ordering::Relaxed);
        StoreStats {
            gets: l(0),
            batch_gets: l(1),
            puts: l(2),
            updates: l(3),
            deletes: l(4),
            transactions: l(5),
            queries: l(6),
        }
    }
    fn bump(&self, i: usize) {
        self.c.0[i].fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl<S: Store> Store for Counting<S> {
    async fn get(&self, key: &Key, consistent: bool) -> Result<Option<Item>, StoreError> {
        self.bump(0);
        self.inner.get(key, consistent).await
    }
    async fn batch_get(
        &self,
        keys: &[Key],
        consistent: bool,
    ) -> Result<Vec<Option<Item>>, StoreError> {
        self.bump(1);
        self.inner.batch_get(keys, consistent).await
    }
    async fn batch_get_shared(
        &self,
        keys: &[Key],
        consistent: bool,
    ) -> Result<Vec<Option<std::sync::Arc<Item>>>, StoreError> {
        self.bump(1);
        self.inner.batch_get_shared(keys, consistent).await
    }
    async fn put(&self, req: PutRequest) -> Result<(), StoreError> {
        self.bump(2);
        self.inner.put(req).await
    }
    async fn update(&self, req: UpdateRequest) -> Result<Option<Item>, StoreError> {
        self.bump(3);
        self.inner.update(req).await
    }
    async fn update_shared(
        &self,
        req: UpdateRequest,
    ) -> Result<Option<std::sync::Arc<Item>>, StoreError> {
        self.bump(3);
        self.inner.update_shared(req).await
    }
    async fn delete(&self, req: DeleteRequest) -> Result<Option<Item>, StoreError> {
        self.bump(4);
        self.inner.delete(req).await
    }
    async fn transact_write(
        &self,
        ops: Vec<TransactOp>,
        token: Option<String>,
    ) -> Result<(), StoreError> {
        self.bump(5);
        self.inner.transact_write(ops, token).await
    }
    async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError> {
        self.bump(6);
        self.inner.query(q).await
    }
    /// Counted as a query (one request per page).
    async fn scan(
        &self,
        pk_prefix: &str,
        after: Option<Key>,
        limit: usize,
    ) -> Result<ScanPage, StoreError> {
        self.bump(6);
        self.inner.scan(pk_prefix, after, limit).await
    }
    /// Counted as a delete.
    async fn purge(&self, key: &Key) -> Result<(), StoreError> {
        self.bump(4);
        self.inner.purge(key).await
    }
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
}

/// Feed reads are not store requests of the request path: they are forwarded uncounted.
#[async_trait]
impl<S: crate::ChangeFeed> crate::ChangeFeed for Counting<S> {
    async fn read_feed(
        &self,
        cursor: &crate::FeedCursor,
        limit: usize,
    ) -> Result<crate::FeedBatch, StoreError> {
        self.inner.read_feed(cursor, limit).await
    }
    async fn trim_feed(
        &self,
        cursor: &crate::FeedCursor,
        before_ms: i64,
    ) -> Result<(), StoreError> {
        self.inner.trim_feed(cursor, before_ms).await
    }
}
