//! `Deadline<S>`: a deadline on every request to a store, for any backend.
//!
//! Rule "a hung store is an outage": a request that has not answered within the deadline is
//! abandoned and reported as an outage, so the `on_unavailable` policy decides within the
//! deadline instead of after the client's own timeout. A read that ran out is
//! [`StoreError::Unavailable`] (nothing was changed); a write that ran out is
//! [`StoreError::Ambiguous`] (it may still be applied — the limiter's resend and lease rules
//! handle that outcome). Backends have their own native deadlines too (the DynamoDB SDK's
//! operation timeout, SQLite's busy timeout); this wrapper is the one a library user puts
//! around any store, including one of their own, through `LimiterBuilder::store_timeout`.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use tollgate_core::mutants::{self, Mutant};
use tollgate_core::value::{Item, Key};

use crate::{
    DeleteRequest, PutRequest, Query, ScanPage, Store, StoreError, TransactOp, UpdateRequest,
};

/// A store whose every request is bounded by a deadline.
#[derive(Debug)]
pub struct Deadline<S> {
    inner: S,
    limit: Duration,
}

impl<S> Deadline<S> {
    /// Wrap `inner`, bounding every request by `limit`.
    pub fn new(inner: S, limit: Duration) -> Self {
        Deadline { inner, limit }
    }
    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }
    /// The deadline.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    async fn bounded<T>(
        &self,
        op: &'static str,
        write: bool,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        if mutants::off(Mutant::StoreDeadline) {
            return f.await;
        }
        match tokio::time::timeout(self.limit, f).await {
            Ok(r) => r,
            Err(_) => {
                let m = format!(
                    "{op}: no answer within the deadline of {} ms",
                    self.limit.as_millis()
                );
                tracing::warn!(
                    op,
                    deadline_ms = self.limit.as_millis() as u64,
                    "store request passed its deadline"
                );
                Err(if write {
                    StoreError::Ambiguous(m)
                } else {
                    StoreError::Unavailable(m)
                })
            }
        }
    }
}

#[async_trait]
impl<S: Store> Store for Deadline<S> {
    async fn get(&self, key: &Key, consistent: bool) -> Result<Option<Item>, StoreError> {
        self.bounded("get", false, self.inner.get(key, consistent))
            .await
    }
    async fn batch_get(
        &self,
        keys: &[Key],
        consistent: bool,
    ) -> Result<Vec<Option<Item>>, StoreError> {
        self.bounded("batch_get", false, self.inner.batch_get(keys, consistent))
            .await
    }
    async fn batch_get_shared(
        &self,
        keys: &[Key],
        consistent: bool,
    ) -> Result<Vec<Option<std::sync::Arc<Item>>>, StoreError> {
        let read = self.inner.batch_get_shared(keys, consistent);
        self.bounded("batch_get", false, read).await
    }
    async fn put(&self, req: PutRequest) -> Result<(), StoreError> {
        self.bounded("put", true, self.inner.put(req)).await
    }
    async fn update(&self, req: UpdateRequest) -> Result<Option<Item>, StoreError> {
        self.bounded("update", true, self.inner.update(req)).await
    }
    async fn update_shared(
        &self,
        req: UpdateRequest,
    ) -> Result<Option<std::sync::Arc<Item>>, StoreError> {
        self.bounded("update", true, self.inner.update_shared(req))
            .await
    }
    async fn delete(&self, req: DeleteRequest) -> Result<Option<Item>, StoreError> {
        self.bounded("delete", true, self.inner.delete(req)).await
    }
    async fn transact_write(
        &self,
        ops: Vec<TransactOp>,
        token: Option<String>,
    ) -> Result<(), StoreError> {
        self.bounded(
            "transact_write",
            true,
            self.inner.transact_write(ops, token),
        )
        .await
    }
    async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError> {
        self.bounded("query", false, self.inner.query(q)).await
    }
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    async fn scan(
        &self,
        pk_prefix: &str,
        after: Option<Key>,
        limit: usize,
    ) -> Result<ScanPage, StoreError> {
        self.bounded("scan", false, self.inner.scan(pk_prefix, after, limit))
            .await
    }
    async fn purge(&self, key: &Key) -> Result<(), StoreError> {
        self.bounded("purge", true, self.inner.purge(key)).await
    }
}

/// Feed reads and trims are bounded like reads (a trim changes nothing a reader relies on).
#[async_trait]
impl<S: crate::ChangeFeed> crate::ChangeFeed for Deadline<S> {
    async fn read_feed(
        &self,
        cursor: &crate::FeedCursor,
        limit: usize,
    ) -> Result<crate::FeedBatch, StoreError> {
        self.bounded("read_feed", false, self.inner.read_feed(cursor, limit))
            .await
    }
    async fn trim_feed(
        &self,
        cursor: &crate::FeedCursor,
        before_ms: i64,
    ) -> Result<(), StoreError> {
        self.bounded("trim_feed", false, self.inner.trim_feed(cursor, before_ms))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    /// A store that never answers.
    struct Hung;

    #[async_trait]
    impl Store for Hung {
        async fn get(&self, _: &Key, _: bool) -> Result<Option<Item>, StoreError> {
            std::future::pending().await
        }
        async fn batch_get(&self, _: &[Key], _: bool) -> Result<Vec<Option<Item>>, StoreError> {
            std::future::pending().await
        }
        async fn put(&self, _: PutRequest) -> Result<(), StoreError> {
            std::future::pending().await
        }
        async fn update(&self, _: UpdateRequest) -> Result<Option<Item>, StoreError> {
            std::future::pending().await
        }
        async fn delete(&self, _: DeleteRequest) -> Result<Option<Item>, StoreError> {
            std::future::pending().await
        }
        async fn transact_write(
            &self,
            _: Vec<TransactOp>,
            _: Option<String>,
        ) -> Result<(), StoreError> {
            std::future::pending().await
        }
        async fn query(&self, _: Query) -> Result<Vec<Item>, StoreError> {
            std::future::pending().await
        }
        fn backend(&self) -> &'static str {
            "hung"
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_read_is_unavailable_and_a_hung_write_ambiguous() {
        let s = Deadline::new(Hung, Duration::from_millis(250));
        let t = tokio::time::Instant::now();
        let k = Key::new("PK", "SK");
        assert!(
            matches!(s.get(&k, true).await, Err(StoreError::Unavailable(m)) if m.contains("250 ms"))
        );
        assert_eq!(t.elapsed(), Duration::from_millis(250));
        let put = PutRequest {
            key: k.clone(),
            item: Item::new(),
            condition: None,
        };
        assert!(matches!(s.put(put).await, Err(StoreError::Ambiguous(_))));
        assert!(matches!(
            s.query(Query::table("PK", None)).await,
            Err(StoreError::Unavailable(_))
        ));
    }

    #[tokio::test]
    async fn a_live_store_answers_through_it() {
        let s = Deadline::new(MemoryStore::new(), Duration::from_secs(1));
        let k = Key::new("PK", "SK");
        s.put(PutRequest {
            key: k.clone(),
            item: Item::new(),
            condition: None,
        })
        .await
        .unwrap();
        assert!(s.get(&k, true).await.unwrap().is_some());
    }
}
