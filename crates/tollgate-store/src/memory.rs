//! `MemoryStore`: the reference semantics (DynamoDB's), in one process's memory.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use async_trait::async_trait;
use tollgate_core::expr::{project, ReturnValues};
use tollgate_core::value::{Item, Key};

use crate::error::{CancelReason, StoreError};
use crate::eval::{apply_update, eval_condition};
use crate::{
    validate_transaction, DeleteRequest, PutRequest, Query, Store, TransactOp, UpdateRequest,
};

#[derive(Debug, Clone, Default)]
struct Slot {
    /// The item now (`None` = deleted).
    cur: Option<Item>,
    /// The item before the last write: what an eventually consistent read may still see.
    prev: Option<Item>,
}

#[derive(Debug, Default)]
struct Inner {
    items: BTreeMap<Key, Slot>,
    tokens: HashSet<String>,
}

/// An in-memory store with DynamoDB's semantics for conditions, updates, return values and
/// transactions. With [`MemoryStore::set_stale_reads`] on, a read that is not strongly
/// consistent sees each item as it was before its latest write.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
    stale_reads: AtomicBool,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Make eventually consistent reads return the previous version of each item.
    pub fn set_stale_reads(&self, on: bool) {
        self.stale_reads.store(on, Ordering::SeqCst);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-applied write: every write
        // computes its result before it touches the map. Recover the guard.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Raw read of the current item (tests stage and inspect exact states with it).
    pub fn raw_get(&self, key: &Key) -> Option<Item> {
        self.lock().items.get(key).and_then(|s| s.cur.clone())
    }

    /// Raw write, bypassing conditions (tests stage exact item states with it).
    pub fn raw_put(&self, key: &Key, mut item: Item) {
        key.stamp(&mut item);
        let mut g = self.lock();
        let slot = g.items.entry(key.clone()).or_default();
        slot.prev = slot.cur.take();
        slot.cur = Some(item);
    }

    /// Raw delete.
    pub fn raw_delete(&self, key: &Key) {
        let mut g = self.lock();
        if let Some(slot) = g.items.get_mut(key) {
            slot.prev = slot.cur.take();
        }
    }

    /// Every current item, in key order.
    pub fn raw_items(&self) -> Vec<Item> {
        self.lock()
            .items
            .values()
            .filter_map(|s| s.cur.clone())
            .collect()
    }

    fn read(&self, g: &Inner, key: &Key, consistent: bool) -> Option<Item> {
        let slot = g.items.get(key)?;
        if !consistent && self.stale_reads.load(Ordering::SeqCst) {
            slot.prev.clone()
        } else {
            slot.cur.clone()
        }
    }
}

fn key_item(key: &Key) -> Item {
    let mut i = Item::new();
    key.stamp(&mut i);
    i
}

fn write(g: &mut Inner, key: &Key, new: Option<Item>) {
    let slot = g.items.entry(key.clone()).or_default();
    slot.prev = slot.cur.take();
    slot.cur = new;
}

/// The outcome of planning one transaction operation against the current state.
fn plan_op(g: &Inner, op: &TransactOp) -> Result<Option<Option<Item>>, CancelReason> {
    let cur = g.items.get(op.key()).and_then(|s| s.cur.as_ref());
    let cond = match op {
        TransactOp::Put(p) => p.condition.as_ref(),
        TransactOp::Update(u) => u.condition.as_ref(),
        TransactOp::Delete(d) => d.condition.as_ref(),
        TransactOp::Check { condition, .. } => Some(condition),
    };
    if let Some(c) = cond {
        if !eval_condition(cur, c) {
            return Err(CancelReason::ConditionFailed { old: cur.cloned() });
        }
    }
    match op {
        TransactOp::Put(p) => {
            let mut item = p.item.clone();
            p.key.stamp(&mut item);
            Ok(Some(Some(item)))
        }
        TransactOp::Update(u) => apply_update(cur, &key_item(&u.key), &u.update)
            .map(|i| Some(Some(i)))
            .map_err(|e| CancelReason::Validation(e.to_string())),
        TransactOp::Delete(_) => Ok(Some(None)),
        TransactOp::Check { .. } => Ok(None),
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn get(&self, key: &Key, consistent: bool) -> Result<Option<Item>, StoreError> {
        let g = self.lock();
        Ok(self.read(&g, key, consistent))
    }

    async fn batch_get(
        &self,
        keys: &[Key],
        consistent: bool,
    ) -> Result<Vec<Option<Item>>, StoreError> {
        if keys.len() > 100 {
            return Err(StoreError::Validation(
                "a batch read holds at most 100 keys".into(),
            ));
        }
        let g = self.lock();
        Ok(keys.iter().map(|k| self.read(&g, k, consistent)).collect())
    }

    async fn put(&self, req: PutRequest) -> Result<(), StoreError> {
        let mut g = self.lock();
        let cur = g.items.get(&req.key).and_then(|s| s.cur.as_ref());
        if let Some(c) = &req.condition {
            if !eval_condition(cur, c) {
                return Err(StoreError::ConditionFailed {
                    old: cur.cloned().map(Box::new),
                });
            }
        }
        let mut item = req.item;
        req.key.stamp(&mut item);
        write(&mut g, &req.key, Some(item));
        Ok(())
    }

    async fn update(&self, req: UpdateRequest) -> Result<Option<Item>, StoreError> {
        let mut g = self.lock();
        let cur = g.items.get(&req.key).and_then(|s| s.cur.clone());
        if let Some(c) = &req.condition {
            if !eval_condition(cur.as_ref(), c) {
                return Err(StoreError::ConditionFailed {
                    old: cur.map(Box::new),
                });
            }
        }
        let new = apply_update(cur.as_ref(), &key_item(&req.key), &req.update)?;
        let out = match req.returns {
            ReturnValues::None => None,
            ReturnValues::AllNew => Some(new.clone()),
            ReturnValues::AllOld => cur.clone(),
            ReturnValues::UpdatedNew => {
                let names: Vec<String> = req
                    .update
                    .actions
                    .iter()
                    .map(|a| a.target().to_string())
                    .collect();
                Some(project(&new, &names))
            }
        };
        write(&mut g, &req.key, Some(new));
        Ok(out)
    }

    async fn delete(&self, req: DeleteRequest) -> Result<Option<Item>, StoreError> {
        let mut g = self.lock();
        let cur = g.items.get(&req.key).and_then(|s| s.cur.clone());
        if let Some(c) = &req.condition {
            if !eval_condition(cur.as_ref(), c) {
                return Err(StoreError::ConditionFailed {
                    old: cur.map(Box::new),
                });
            }
        }
        if cur.is_some() {
            write(&mut g, &req.key, None);
        }
        Ok(cur)
    }

    async fn transact_write(
        &self,
        ops: Vec<TransactOp>,
        token: Option<String>,
    ) -> Result<(), StoreError> {
        validate_transaction(&ops)?;
        let mut g = self.lock();
        if let Some(t) = &token {
            if g.tokens.contains(t) {
                return Ok(());
            }
        }
        let mut planned = Vec::with_capacity(ops.len());
        let mut reasons = Vec::with_capacity(ops.len());
        let mut failed = false;
        for op in &ops {
            match plan_op(&g, op) {
                Ok(p) => {
                    planned.push(p);
                    reasons.push(CancelReason::None);
                }
                Err(r) => {
                    failed = true;
                    planned.push(None);
                    reasons.push(r);
                }
            }
        }
        if failed {
            return Err(StoreError::TransactionCanceled { reasons });
        }
        for (op, p) in ops.iter().zip(planned) {
            if let Some(new) = p {
                write(&mut g, op.key(), new);
            }
        }
        if let Some(t) = token {
            g.tokens.insert(t);
        }
        Ok(())
    }

    async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError> {
        let g = self.lock();
        let consistent = q.consistent && q.index.is_none();
        let (pk_attr, sk_attr) = match &q.index {
            None => ("PK".to_string(), "SK".to_string()),
            Some(ix) => (format!("{ix}PK"), format!("{ix}SK")),
        };
        let mut out: Vec<(String, Item)> = g
            .items
            .keys()
            .filter_map(|k| self.read(&g, k, consistent))
            .filter(|i| i.get(&pk_attr).and_then(|v| v.as_s()) == Some(q.pk.as_str()))
            .filter_map(|i| {
                let sk = i.get(&sk_attr)?.as_s()?.to_string();
                match &q.sk_prefix {
                    Some(p) if !sk.starts_with(p.as_str()) => None,
                    _ => Some((sk, i)),
                }
            })
            .collect();
        out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        Ok(out.into_iter().map(|(_, i)| i).collect())
    }

    fn backend(&self) -> &'static str {
        "memory"
    }
}
