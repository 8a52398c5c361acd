//! The store contract of tollgate.
//!
//! A [`Store`] holds items (maps of attribute → value) under a (PK, SK) key and applies typed
//! conditional writes with DynamoDB's semantics. [`MemoryStore`] is the reference; other
//! backends (SQLite, DynamoDB) must pass the same [`conformance`] suite.

pub mod conformance;
pub mod counting;
pub mod deadline;
pub mod error;
pub mod eval;
pub mod faulty;
pub mod feed;
pub mod memory;

use async_trait::async_trait;
pub use error::{CancelReason, StoreError};
use tollgate_core::expr::{Condition, ReturnValues, Update};
use tollgate_core::value::{Item, Key};

pub use counting::{Counting, StoreStats};
pub use deadline::Deadline;
pub use faulty::{FaultConfig, FaultStats, FaultyStore};
pub use feed::{Change, ChangeFeed, FeedBatch, FeedCursor, FeedPosition};
pub use memory::{MemoryStore, MillisClock};

/// A conditional put of a whole item.
#[derive(Debug, Clone, PartialEq)]
pub struct PutRequest {
    /// Where.
    pub key: Key,
    /// The whole item (key attributes are stamped by the store).
    pub item: Item,
    /// Must hold on the old item.
    pub condition: Option<Condition>,
}

/// A conditional update of one item (creates it when absent and the condition allows).
#[derive(Debug, Clone, PartialEq)]
pub struct UpdateRequest {
    /// Where.
    pub key: Key,
    /// What.
    pub update: Update,
    /// Must hold on the old item.
    pub condition: Option<Condition>,
    /// What to return on success. On a condition failure the old item is always returned
    /// (`ReturnValuesOnConditionCheckFailure = ALL_OLD`).
    pub returns: ReturnValues,
}

/// A conditional delete.
#[derive(Debug, Clone, PartialEq)]
pub struct DeleteRequest {
    /// Where.
    pub key: Key,
    /// Must hold on the old item.
    pub condition: Option<Condition>,
}

/// One operation of a transaction.
#[derive(Debug, Clone, PartialEq)]
pub enum TransactOp {
    /// A put.
    Put(PutRequest),
    /// An update (its `returns` is ignored).
    Update(UpdateRequest),
    /// A delete.
    Delete(DeleteRequest),
    /// A condition that must hold on an item the transaction does not write.
    Check {
        /// Where.
        key: Key,
        /// What must hold.
        condition: Condition,
    },
}

impl TransactOp {
    /// The item this operation addresses.
    pub fn key(&self) -> &Key {
        match self {
            TransactOp::Put(p) => &p.key,
            TransactOp::Update(u) => &u.key,
            TransactOp::Delete(d) => &d.key,
            TransactOp::Check { key, .. } => key,
        }
    }
}

/// Most operations in one transaction (DynamoDB's limit).
pub const MAX_TRANSACT_OPS: usize = 100;

/// An item a backend holds but cannot decode into the item model (a number that is not an
/// `i64`, a type the model does not know, stored text that is not an item).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undecodable {
    /// The item's key.
    pub key: Key,
    /// The attribute at fault, when the backend can tell.
    pub attribute: Option<String>,
    /// What is wrong.
    pub reason: String,
}

impl std::fmt::Display for Undecodable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.attribute {
            Some(a) => write!(f, "item {}: attribute {a}: {}", self.key, self.reason),
            None => write!(f, "item {}: {}", self.key, self.reason),
        }
    }
}

/// One entry of a [`ScanPage`]: the item, or why the backend could not decode it.
pub type Scanned = Result<Item, Undecodable>;

/// One page of [`Store::scan`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScanPage {
    /// The items, in the backend's order (key order on `MemoryStore` and SQLite).
    pub items: Vec<Scanned>,
    /// Where the next page starts (pass it as `after`); `None` when the scan is complete.
    pub next: Option<Key>,
}

/// A query over a partition of the table or of a global secondary index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// `None` for the table; `Some("GSI1")` etc. for an index whose key attributes are
    /// `GSI1PK` / `GSI1SK`.
    pub index: Option<String>,
    /// The partition key value.
    pub pk: String,
    /// Only items whose sort key begins with this.
    pub sk_prefix: Option<String>,
    /// Strongly consistent (table queries only).
    pub consistent: bool,
}

impl Query {
    /// A table query.
    pub fn table(pk: impl Into<String>, sk_prefix: Option<&str>) -> Self {
        Query {
            index: None,
            pk: pk.into(),
            sk_prefix: sk_prefix.map(str::to_string),
            consistent: false,
        }
    }
    /// An index query.
    pub fn index(index: &str, pk: impl Into<String>, sk_prefix: Option<&str>) -> Self {
        Query {
            index: Some(index.to_string()),
            pk: pk.into(),
            sk_prefix: sk_prefix.map(str::to_string),
            consistent: false,
        }
    }
}

/// The store contract. Every method is one request to the backing store.
#[async_trait]
pub trait Store: Send + Sync {
    /// Read one item.
    async fn get(&self, key: &Key, consistent: bool) -> Result<Option<Item>, StoreError>;
    /// Read several items in one request; results in key order.
    async fn batch_get(
        &self,
        keys: &[Key],
        consistent: bool,
    ) -> Result<Vec<Option<Item>>, StoreError>;
    /// [`Store::batch_get`] (the same one request, the same answer), the items shared: a
    /// store that keeps its items shared ([`MemoryStore`]) hands out the versions it holds
    /// instead of copying them; the default wraps what `batch_get` returns.
    async fn batch_get_shared(
        &self,
        keys: &[Key],
        consistent: bool,
    ) -> Result<Vec<Option<std::sync::Arc<Item>>>, StoreError> {
        let items = self.batch_get(keys, consistent).await?;
        Ok(items
            .into_iter()
            .map(|i| i.map(std::sync::Arc::new))
            .collect())
    }
    /// Conditional put.
    async fn put(&self, req: PutRequest) -> Result<(), StoreError>;
    /// Conditional update; returns what `req.returns` asks for.
    async fn update(&self, req: UpdateRequest) -> Result<Option<Item>, StoreError>;
    /// [`Store::update`] (the same one request, the same answer), returning the item shared:
    /// a store that keeps its items shared ([`MemoryStore`]) hands out the version it holds
    /// instead of copying it; the default wraps what `update` returns.
    async fn update_shared(
        &self,
        req: UpdateRequest,
    ) -> Result<Option<std::sync::Arc<Item>>, StoreError> {
        Ok(self.update(req).await?.map(std::sync::Arc::new))
    }
    /// Conditional delete; returns the old item.
    async fn delete(&self, req: DeleteRequest) -> Result<Option<Item>, StoreError>;
    /// All-or-nothing write of up to [`MAX_TRANSACT_OPS`] operations on distinct items.
    /// `token` makes a resent transaction idempotent (DynamoDB's `ClientRequestToken`).
    async fn transact_write(
        &self,
        ops: Vec<TransactOp>,
        token: Option<String>,
    ) -> Result<(), StoreError>;
    /// Items of one partition (of the table or an index), in sort-key order.
    async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError>;
    /// A short name of the backend, for logs and metrics.
    fn backend(&self) -> &'static str;

    /// One page of the items whose partition key begins with `pk_prefix`, after the key
    /// `after` (exclusive; `None` starts at the beginning), strongly consistent, each
    /// decoded on its own: an item the backend cannot decode is an `Err(`[`Undecodable`]`)`
    /// entry, not a failure of the call. A page holds at most `limit` entries — possibly
    /// fewer, even none, with a `next` still to read.
    ///
    /// For administration (`tollgate doctor`, the repair of corrupt items), never the
    /// request path: on DynamoDB it is a `Scan` of the whole table, filtered. The default
    /// (a backend without scans) refuses with [`StoreError::Validation`].
    async fn scan(
        &self,
        pk_prefix: &str,
        after: Option<Key>,
        limit: usize,
    ) -> Result<ScanPage, StoreError> {
        let _ = (pk_prefix, after, limit);
        Err(StoreError::Validation(format!(
            "the {} store cannot scan",
            self.backend()
        )))
    }

    /// Delete one item without a condition and without returning it, whatever it holds:
    /// also an item the backend cannot decode (which `delete`, returning the old item,
    /// cannot). For repairs. The default is an unconditional [`Store::delete`].
    async fn purge(&self, key: &Key) -> Result<(), StoreError> {
        self.delete(DeleteRequest {
            key: key.clone(),
            condition: None,
        })
        .await
        .map(drop)
    }
}

/// Check the shape of a transaction every backend must refuse.
pub fn validate_transaction(ops: &[TransactOp]) -> Result<(), StoreError> {
    if ops.is_empty() || ops.len() > MAX_TRANSACT_OPS {
        return Err(StoreError::Validation(format!(
            "a transaction holds 1 to {MAX_TRANSACT_OPS} operations, not {}",
            ops.len()
        )));
    }
    let mut seen = std::collections::BTreeSet::new();
    for op in ops {
        if !seen.insert(op.key()) {
            return Err(StoreError::Validation(format!(
                "transaction addresses {} twice",
                op.key()
            )));
        }
        match op {
            TransactOp::Update(u) => eval::validate_update(&u.update)?,
            TransactOp::Put(p) => eval::validate_item(&p.item)?,
            TransactOp::Delete(_) | TransactOp::Check { .. } => {}
        }
    }
    Ok(())
}

/// The most keys one `batch_get` takes (DynamoDB's `BatchGetItem` bound).
pub const MAX_BATCH_GET_KEYS: usize = 100;

/// DynamoDB's static checks of a batch read's keys, before anything is read: at most
/// [`MAX_BATCH_GET_KEYS`], no key twice (compared pairwise: at most 100 keys, no set built).
pub fn validate_batch_keys(keys: &[Key]) -> Result<(), StoreError> {
    if keys.len() > MAX_BATCH_GET_KEYS {
        return Err(StoreError::Validation(format!(
            "a batch read holds at most {MAX_BATCH_GET_KEYS} keys"
        )));
    }
    match keys
        .iter()
        .enumerate()
        .find(|(i, k)| keys[..*i].contains(k))
    {
        Some((_, dup)) => Err(StoreError::Validation(format!(
            "provided list of item keys contains duplicates: {dup}"
        ))),
        None => Ok(()),
    }
}

/// Items read shared, as owned items: each copied only when something else still holds it
/// (what `batch_get` answers where `batch_get_shared` is the primary read).
pub fn owned_items(items: Vec<Option<std::sync::Arc<Item>>>) -> Vec<Option<Item>> {
    items
        .into_iter()
        .map(|i| i.map(std::sync::Arc::unwrap_or_clone))
        .collect()
}

/// Check a transaction's idempotency token: DynamoDB takes 1 to 36 characters.
pub fn validate_token(token: Option<&str>) -> Result<(), StoreError> {
    match token {
        Some(t) if t.is_empty() || t.chars().count() > 36 => Err(StoreError::Validation(format!(
            "a client request token holds 1 to 36 characters, not {}",
            t.len()
        ))),
        _ => Ok(()),
    }
}

#[async_trait]
impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    async fn get(&self, key: &Key, consistent: bool) -> Result<Option<Item>, StoreError> {
        (**self).get(key, consistent).await
    }
    async fn batch_get(
        &self,
        keys: &[Key],
        consistent: bool,
    ) -> Result<Vec<Option<Item>>, StoreError> {
        (**self).batch_get(keys, consistent).await
    }
    async fn batch_get_shared(
        &self,
        keys: &[Key],
        consistent: bool,
    ) -> Result<Vec<Option<std::sync::Arc<Item>>>, StoreError> {
        (**self).batch_get_shared(keys, consistent).await
    }
    async fn put(&self, req: PutRequest) -> Result<(), StoreError> {
        (**self).put(req).await
    }
    async fn update(&self, req: UpdateRequest) -> Result<Option<Item>, StoreError> {
        (**self).update(req).await
    }
    async fn update_shared(
        &self,
        req: UpdateRequest,
    ) -> Result<Option<std::sync::Arc<Item>>, StoreError> {
        (**self).update_shared(req).await
    }
    async fn delete(&self, req: DeleteRequest) -> Result<Option<Item>, StoreError> {
        (**self).delete(req).await
    }
    async fn transact_write(
        &self,
        ops: Vec<TransactOp>,
        token: Option<String>,
    ) -> Result<(), StoreError> {
        (**self).transact_write(ops, token).await
    }
    async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError> {
        (**self).query(q).await
    }
    fn backend(&self) -> &'static str {
        (**self).backend()
    }
    async fn scan(
        &self,
        pk_prefix: &str,
        after: Option<Key>,
        limit: usize,
    ) -> Result<ScanPage, StoreError> {
        (**self).scan(pk_prefix, after, limit).await
    }
    async fn purge(&self, key: &Key) -> Result<(), StoreError> {
        (**self).purge(key).await
    }
}
