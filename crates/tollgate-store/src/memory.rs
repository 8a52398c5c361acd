//! `MemoryStore`: the reference semantics (DynamoDB's), in one process's memory.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tollgate_core::expr::{project, ReturnValues};
use tollgate_core::value::{Item, Key};

use crate::error::{CancelReason, StoreError};
use crate::eval::{
    apply_actions, apply_in_place, apply_update_stored, eval_condition, key_item, plan_transact_op,
    validate_item, validate_update,
};
use crate::feed::{Change, ChangeFeed, FeedBatch, FeedCursor, FeedPosition};
use crate::{
    validate_token, validate_transaction, DeleteRequest, PutRequest, Query, ScanPage, Store,
    TransactOp, UpdateRequest,
};

#[derive(Debug, Clone, Default)]
struct Slot {
    /// The item now (`None` = deleted). Shared, not copied, with the change feed's entries
    /// and with [`MemoryStore::raw_image`]'s callers; a write copies it only while it is
    /// shared.
    cur: Option<Arc<Item>>,
    /// The item before the last write: what an eventually consistent read may still see.
    prev: Option<Arc<Item>>,
}

/// A per-item token bucket of write capacity, in milli-writes.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    milli: i64,
    at_ms: i64,
}

/// The items by key: found by hashing (every read and write), walked in key order from
/// [`Items::order`] (queries, scans). A key once written keeps its slot (a delete leaves
/// it empty), so the order only grows.
#[derive(Debug, Default)]
struct Items {
    slots: HashMap<Key, Slot, foldhash::fast::RandomState>,
    order: BTreeSet<Key>,
}

impl Items {
    fn get(&self, key: &Key) -> Option<&Slot> {
        self.slots.get(key)
    }

    fn get_mut(&mut self, key: &Key) -> Option<&mut Slot> {
        self.slots.get_mut(key)
    }

    /// The slot of `key`, made (empty) when it has none.
    fn slot(&mut self, key: &Key) -> &mut Slot {
        if !self.slots.contains_key(key) {
            self.order.insert(key.clone());
        }
        self.slots.entry(key.clone()).or_default()
    }

    /// Every key in key order.
    fn keys(&self) -> impl Iterator<Item = &Key> {
        self.order.iter()
    }

    /// The slots in key order from `from`.
    fn range(&self, from: std::ops::Bound<&Key>) -> impl Iterator<Item = (&Key, &Slot)> {
        self.order
            .range::<Key, _>((from, std::ops::Bound::Unbounded))
            .filter_map(|k| Some((k, self.slots.get(k)?)))
    }

    /// The slots in key order.
    fn values(&self) -> impl Iterator<Item = &Slot> {
        self.order.iter().filter_map(|k| self.slots.get(k))
    }
}

#[derive(Debug, Default)]
struct Inner {
    items: Items,
    /// Idempotency tokens of applied transactions, with the operations they carried.
    tokens: HashMap<String, Vec<TransactOp>>,
    buckets: HashMap<Key, Bucket>,
    /// The change feed: applied writes after `trimmed_through`, oldest first.
    log: VecDeque<Change>,
    /// The sequence number of the last change appended (0: none yet).
    last_seq: i64,
    /// Changes up to this sequence number were forgotten (trimmed or over the bound).
    trimmed_through: i64,
    /// Whether this store keeps a change feed ([`MemoryStore::with_change_feed`]).
    feed_on: bool,
    /// Item versions the feed let go of (trimmed, unshared), kept to be written over by
    /// the next copy instead of freed and allocated again ([`recycle`], [`copy_of`]).
    spares: Vec<Arc<Item>>,
}

/// Most unshared item versions kept for reuse. A feed trim lets go of a whole aggregator
/// pass of changes at once (about 40,000 at 30 k writes a second: a 1 s pause and the pass),
/// and every write until the next trim copies an item: kept, nearly all of them are written
/// over instead of freed and allocated again. Each trim then keeps no more spares than it
/// let go of ([`MIN_SPARES`] at least), so they are never more than the feed itself held
/// before its last trim, and a quiet feed gives them back.
const MAX_SPARES: usize = 65_536;

/// Spares a trim keeps however few changes it let go of.
const MIN_SPARES: usize = 1_024;

/// Most changes the in-process feed keeps; older ones are dropped (a consumer that falls
/// further behind gets a clear error, not a silent gap).
pub const FEED_CAPACITY: usize = 100_000;

/// The time source of the feed's write times.
#[derive(Clone, Default)]
struct FeedClock(Option<MillisClock>);

impl std::fmt::Debug for FeedClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "FeedClock(set)"
        } else {
            "FeedClock(system)"
        })
    }
}

fn system_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The time source of a write ceiling: epoch milliseconds.
pub type MillisClock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// A per-item write ceiling: `per_second` writes per second per key, token-bucket style
/// (a burst of up to `per_second` writes, refilled continuously).
#[derive(Clone)]
struct Ceiling {
    per_second: u32,
    clock: MillisClock,
}

impl std::fmt::Debug for Ceiling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ceiling")
            .field("per_second", &self.per_second)
            .finish_non_exhaustive()
    }
}

/// An in-memory store with DynamoDB's semantics for conditions, updates, return values and
/// transactions. With [`MemoryStore::set_stale_reads`] on, a read that is not strongly
/// consistent sees each item as it was before its latest write. With
/// [`MemoryStore::with_write_ceiling`], writes to one item beyond a rate fail with
/// [`StoreError::Throttled`] (DynamoDB's per-partition write limit, scaled down).
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
    stale_reads: AtomicBool,
    ceiling: Option<Ceiling>,
    feed_clock: Mutex<FeedClock>,
}

impl MemoryStore {
    /// An empty store. It keeps no change feed (its writes copy nothing for one); see
    /// [`MemoryStore::with_change_feed`].
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store that keeps a change feed ([`ChangeFeed`]): every applied write is
    /// logged in process, with copies of its old and new item, up to [`FEED_CAPACITY`]
    /// changes not yet trimmed. The memory of up to 16,384 trimmed versions (16–32 MB of
    /// bucket items) is kept and written over by later writes: a trim does not free it.
    pub fn with_change_feed() -> Self {
        let s = Self::default();
        s.lock().feed_on = true;
        s
    }

    /// An empty store that lets each item take at most `per_second` writes per second
    /// (token bucket: a full bucket holds `per_second` writes and refills continuously),
    /// timed by `clock` (epoch milliseconds). Every put, update and delete, and every
    /// operation of a transaction (checks included), takes one write from its item's
    /// bucket, whether or not its condition holds, as DynamoDB charges failed conditional
    /// writes. A write whose bucket is empty fails with [`StoreError::Throttled`] and
    /// changes nothing; a transaction fails as a whole if any of its items is empty.
    /// Reads are never throttled. `per_second == 0` refuses every write.
    pub fn with_write_ceiling(per_second: u32, clock: MillisClock) -> Self {
        MemoryStore {
            ceiling: Some(Ceiling { per_second, clock }),
            ..Self::default()
        }
    }

    /// Take one write from the bucket of each key, all or none.
    fn charge(&self, g: &mut Inner, keys: &[&Key]) -> Result<(), StoreError> {
        let Some(c) = &self.ceiling else {
            return Ok(());
        };
        let now = (c.clock)();
        let cap = i64::from(c.per_second) * 1000;
        let refill = |b: Option<&Bucket>| -> Bucket {
            match b {
                None => Bucket {
                    milli: cap,
                    at_ms: now,
                },
                Some(b) => {
                    let elapsed = now.saturating_sub(b.at_ms).max(0);
                    Bucket {
                        milli: b
                            .milli
                            .saturating_add(elapsed.saturating_mul(i64::from(c.per_second)))
                            .min(cap),
                        at_ms: now.max(b.at_ms),
                    }
                }
            }
        };
        let mut next = Vec::with_capacity(keys.len());
        for k in keys {
            let b = refill(g.buckets.get(*k));
            if b.milli < 1000 {
                return Err(StoreError::Throttled(format!(
                    "write ceiling of {} per second reached on {k}",
                    c.per_second
                )));
            }
            next.push(((*k).clone(), b));
        }
        for (k, mut b) in next {
            b.milli -= 1000;
            g.buckets.insert(k, b);
        }
        Ok(())
    }

    /// Date the feed's changes by `clock` (epoch ms) instead of the system clock.
    pub fn set_feed_clock(&self, clock: MillisClock) {
        *self.feed_clock.lock().unwrap_or_else(|e| e.into_inner()) = FeedClock(Some(clock));
    }

    fn feed_now(&self) -> i64 {
        let c = self
            .feed_clock
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        c.0.map_or_else(system_ms, |c| c())
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
        self.lock()
            .items
            .get(key)
            .and_then(|s| s.cur.as_deref().cloned())
    }

    /// The current item, shared rather than copied (the simulator's ledger reads every
    /// write's images with it).
    pub fn raw_image(&self, key: &Key) -> Option<Arc<Item>> {
        self.lock().items.get(key).and_then(|s| s.cur.clone())
    }

    /// Raw write, bypassing conditions (tests stage exact item states with it).
    pub fn raw_put(&self, key: &Key, mut item: Item) {
        key.stamp(&mut item);
        let mut g = self.lock();
        let slot = g.items.slot(key);
        slot.prev = slot.cur.take();
        slot.cur = Some(Arc::new(item));
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
            .filter_map(|s| s.cur.as_deref().cloned())
            .collect()
    }

    fn read(&self, g: &Inner, key: &Key, consistent: bool) -> Option<Item> {
        self.read_ref(g, key, consistent).cloned()
    }

    /// What a read sees, before it is copied out.
    fn read_ref<'g>(&self, g: &'g Inner, key: &Key, consistent: bool) -> Option<&'g Item> {
        self.read_slot(g, key, consistent).map(|v| &**v)
    }

    /// The version a read sees, as the store holds it (shared, not copied).
    fn read_slot<'g>(&self, g: &'g Inner, key: &Key, consistent: bool) -> Option<&'g Arc<Item>> {
        let slot = g.items.get(key)?;
        if !consistent && self.stale_reads.load(Ordering::SeqCst) {
            slot.prev.as_ref()
        } else {
            slot.cur.as_ref()
        }
    }
}

/// A copy of `src`, made in `spare`'s memory when nothing else holds it (see
/// [`copy_into`]), else in a version the feed let go of (`spares`), else a fresh one.
fn copy_of(spare: Option<Arc<Item>>, spares: &mut Vec<Arc<Item>>, src: &Item) -> Arc<Item> {
    let Some(mut p) = spare.and_then(unshared).or_else(|| spares.pop()) else {
        return Arc::new(src.clone());
    };
    // A spare is kept only unshared, and nothing takes it from the store's lock.
    debug_assert_eq!(Arc::strong_count(&p), 1, "a reused version is unshared");
    match Arc::get_mut(&mut p) {
        Some(buf) => {
            copy_into(buf, src);
            p
        }
        None => Arc::new(src.clone()),
    }
}

/// `v` when nothing else holds it.
fn unshared(mut v: Arc<Item>) -> Option<Arc<Item>> {
    Arc::get_mut(&mut v).is_some().then_some(v)
}

/// Keep `v` for reuse by [`copy_of`] when this was its last holder (a trimmed change's
/// image no slot and no other change shares); otherwise only let go of it.
fn recycle(spares: &mut Vec<Arc<Item>>, v: Arc<Item>) {
    if spares.len() < MAX_SPARES {
        spares.extend(unshared(v));
    }
}

/// Forget the oldest change of the feed, keeping its images for reuse when it held them
/// last.
fn pop_oldest(g: &mut Inner) {
    if let Some(c) = g.log.pop_front() {
        g.trimmed_through += 1;
        for v in [c.old, c.new].into_iter().flatten() {
            recycle(&mut g.spares, v);
        }
    }
}

/// Make `dst` equal to `src`. When both hold the same attribute names (an item updated
/// again and again: its previous version and its current one), values are overwritten in
/// place and nothing is allocated; otherwise `dst` becomes a fresh copy.
fn copy_into(dst: &mut Item, src: &Item) {
    dst.clone_from_item(src);
}

/// `UPDATED_NEW`: the attributes the update wrote, as they are after it; `None` when none
/// of them remains (DynamoDB then omits `Attributes`).
fn updated_new(new: &Item, update: &tollgate_core::expr::Update) -> Option<Item> {
    let names: Vec<String> = update
        .actions
        .iter()
        .map(|a| a.target().to_string())
        .collect();
    Some(project(new, &names)).filter(|p| !p.is_empty())
}

/// Apply one write and append it to the feed when the store keeps one (a write that
/// changes nothing is not a change).
fn write(g: &mut Inner, key: &Key, new: Option<Item>, at_ms: i64) {
    install(g, key, new.map(Arc::new), |old, new| old != new, at_ms);
}

/// Make `new` the current version of `key`, the current one its previous version, and log
/// the change when the store keeps a feed and `changed(old, new)` says it is one. The
/// version this displaces as the previous one is kept for reuse when nothing else holds
/// it ([`recycle`]).
fn install(
    g: &mut Inner,
    key: &Key,
    new: Option<Arc<Item>>,
    changed: impl FnOnce(&Option<Arc<Item>>, &Option<Arc<Item>>) -> bool,
    at_ms: i64,
) {
    let feed_on = g.feed_on;
    let slot = g.items.slot(key);
    let old = slot.cur.take();
    let change = (feed_on && changed(&old, &new)).then(|| (old.clone(), new.clone()));
    let displaced = std::mem::replace(&mut slot.prev, old);
    slot.cur = new;
    if let Some(d) = displaced {
        recycle(&mut g.spares, d);
    }
    if let Some((old, new)) = change {
        log_change(g, key, old, new, at_ms);
    }
}

/// Append a change to the in-process feed (bounded by [`FEED_CAPACITY`]).
fn log_change(
    g: &mut Inner,
    key: &Key,
    old: Option<Arc<Item>>,
    new: Option<Arc<Item>>,
    at_ms: i64,
) {
    debug_assert!(
        g.feed_on,
        "changes are logged only by a store that keeps a feed"
    );
    g.last_seq += 1;
    let seq = g.last_seq;
    g.log.push_back(Change {
        position: FeedPosition {
            stream: String::new(),
            seq: seq.to_string(),
        },
        key: key.clone(),
        old,
        new,
        at_ms,
    });
    while g.log.len() > FEED_CAPACITY {
        pop_oldest(g);
    }
}

/// What one transaction operation will write, staged before any operation is applied.
enum Staged {
    /// Nothing (a check, or a remove-only update of an absent item).
    Nothing,
    /// This version (`None`: a delete), compared whole with the current one for the feed.
    Write(Option<Item>),
    /// An existing item updated: its new version, made in a reused version's memory, and
    /// whether the update changed it (only the attributes it names can differ).
    Updated(Arc<Item>, bool),
}

/// Stage `op` against `cur`: its condition evaluated, its new version computed. An update
/// of an existing item is applied to a copy made in a spare version's memory ([`copy_of`])
/// rather than a fresh clone: the transactions of an aggregator pass update the same
/// snapshot items again and again. The update was validated with the transaction
/// ([`validate_transaction`]), so only its evaluation can fail here.
fn stage(
    op: &TransactOp,
    cur: Option<&Item>,
    spares: &mut Vec<Arc<Item>>,
) -> Result<Staged, CancelReason> {
    let (TransactOp::Update(u), Some(cur)) = (op, cur) else {
        return Ok(match plan_transact_op(op, cur)? {
            None => Staged::Nothing,
            Some(new) => Staged::Write(new),
        });
    };
    if let Some(c) = &u.condition {
        if !eval_condition(Some(cur), c) {
            return Err(CancelReason::ConditionFailed {
                old: Some(cur.clone()),
            });
        }
    }
    let mut new = copy_of(None, spares, cur);
    match apply_actions(Arc::make_mut(&mut new), cur, &u.update) {
        Ok(changed) => {
            debug_assert_eq!(changed, *new != *cur, "a change is told as it is written");
            Ok(Staged::Updated(new, changed))
        }
        Err(e) => {
            recycle(spares, new);
            Err(CancelReason::Validation(e.to_string()))
        }
    }
}

impl MemoryStore {
    /// A conditional update, answered with the versions the store holds (shared, not
    /// copied).
    fn update_in(&self, req: UpdateRequest) -> Result<Option<Arc<Item>>, StoreError> {
        // Static checks fail the request before its condition is read (as DynamoDB does).
        validate_update(&req.update)?;
        let mut g = self.lock();
        self.charge(&mut g, &[&req.key])?;
        // An existing item is updated in place: one copy of it is kept as the previous
        // version (what a stale read sees, and what every right-hand side reads), and the
        // only other copy is what the request asks to have returned. While the feed (or a
        // reader) shares the current version, that version itself becomes the previous
        // one and the update writes a copy.
        let feed_on = g.feed_on;
        let inner = &mut *g;
        if let Some(Slot {
            cur: Some(cur),
            prev,
        }) = inner.items.get_mut(&req.key)
        {
            if let Some(c) = &req.condition {
                if !eval_condition(Some(cur), c) {
                    return Err(StoreError::ConditionFailed {
                        old: Some(Box::new(Item::clone(cur))),
                    });
                }
            }
            // Nothing will read the version before this write — no feed logs it, reads are
            // not stale, the caller does not ask for it — and nothing else holds the current
            // one: the update is applied to it directly, with no copy at all.
            let keep_old = feed_on
                || self.stale_reads.load(Ordering::SeqCst)
                || matches!(req.returns, ReturnValues::AllOld);
            if !keep_old {
                if let Some(item) = Arc::get_mut(cur) {
                    apply_in_place(item, &req.update)?;
                    // The previous version is no longer the one before this write.
                    *prev = None;
                    return Ok(match req.returns {
                        ReturnValues::None | ReturnValues::AllOld => None,
                        ReturnValues::AllNew => Some(Arc::clone(cur)),
                        ReturnValues::UpdatedNew => updated_new(cur, &req.update).map(Arc::new),
                    });
                }
            }
            // The previous version's memory is reused for the copy of the item as it is
            // when nothing else holds it (it is about to be dropped) and it has the same
            // shape; otherwise the current version is kept as it is and the update works
            // on a copy.
            let spare = prev.take();
            let old = if Arc::get_mut(cur).is_some() {
                copy_of(spare, &mut inner.spares, cur)
            } else {
                let old = Arc::clone(cur);
                *cur = copy_of(spare, &mut inner.spares, &old);
                old
            };
            // Unshared now in both cases: no copy here.
            let target = Arc::make_mut(cur);
            let changed = match apply_actions(target, &old, &req.update) {
                Ok(changed) => changed,
                Err(e) => {
                    *cur = old;
                    return Err(e);
                }
            };
            debug_assert_eq!(changed, **cur != *old, "a change is told as it is written");
            let out = match req.returns {
                ReturnValues::None => None,
                ReturnValues::AllNew => Some(Arc::clone(cur)),
                ReturnValues::AllOld => Some(Arc::clone(&old)),
                ReturnValues::UpdatedNew => updated_new(cur, &req.update).map(Arc::new),
            };
            let change = (feed_on && changed).then(|| (Arc::clone(&old), Arc::clone(cur)));
            *prev = Some(old);
            if let Some((old, new)) = change {
                let at_ms = self.feed_now();
                log_change(&mut g, &req.key, Some(old), Some(new), at_ms);
            }
            return Ok(out);
        }
        // Absent (never written, or deleted): the update creates it, unless it only removes.
        let cur = g.items.get(&req.key).and_then(|s| s.cur.as_deref());
        debug_assert!(cur.is_none(), "an existing item is updated in place above");
        if let Some(c) = &req.condition {
            if !eval_condition(None, c) {
                return Err(StoreError::ConditionFailed { old: None });
            }
        }
        let new = apply_update_stored(None, &key_item(&req.key), &req.update)?;
        let out = match req.returns {
            ReturnValues::None | ReturnValues::AllOld => None,
            ReturnValues::AllNew => new.clone().map(Arc::new),
            ReturnValues::UpdatedNew => new
                .as_ref()
                .and_then(|n| updated_new(n, &req.update))
                .map(Arc::new),
        };
        if new.is_some() {
            write(&mut g, &req.key, new, self.feed_now());
        }
        Ok(out)
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
        crate::validate_batch_keys(keys)?;
        let g = self.lock();
        Ok(keys.iter().map(|k| self.read(&g, k, consistent)).collect())
    }

    async fn batch_get_shared(
        &self,
        keys: &[Key],
        consistent: bool,
    ) -> Result<Vec<Option<Arc<Item>>>, StoreError> {
        crate::validate_batch_keys(keys)?;
        let g = self.lock();
        Ok(keys
            .iter()
            .map(|k| self.read_slot(&g, k, consistent).cloned())
            .collect())
    }

    async fn put(&self, req: PutRequest) -> Result<(), StoreError> {
        validate_item(&req.item)?;
        let mut g = self.lock();
        self.charge(&mut g, &[&req.key])?;
        let cur = g.items.get(&req.key).and_then(|s| s.cur.as_deref());
        if let Some(c) = &req.condition {
            if !eval_condition(cur, c) {
                return Err(StoreError::ConditionFailed {
                    old: cur.cloned().map(Box::new),
                });
            }
        }
        let mut item = req.item;
        req.key.stamp(&mut item);
        write(&mut g, &req.key, Some(item), self.feed_now());
        Ok(())
    }

    async fn update(&self, req: UpdateRequest) -> Result<Option<Item>, StoreError> {
        // A copy of what the request asks to have returned (the store keeps its own).
        Ok(self.update_in(req)?.map(Arc::unwrap_or_clone))
    }

    async fn update_shared(&self, req: UpdateRequest) -> Result<Option<Arc<Item>>, StoreError> {
        self.update_in(req)
    }

    async fn delete(&self, req: DeleteRequest) -> Result<Option<Item>, StoreError> {
        let mut g = self.lock();
        self.charge(&mut g, &[&req.key])?;
        let cur = g
            .items
            .get(&req.key)
            .and_then(|s| s.cur.as_deref().cloned());
        if let Some(c) = &req.condition {
            if !eval_condition(cur.as_ref(), c) {
                return Err(StoreError::ConditionFailed {
                    old: cur.map(Box::new),
                });
            }
        }
        if cur.is_some() {
            write(&mut g, &req.key, None, self.feed_now());
        }
        Ok(cur)
    }

    async fn transact_write(
        &self,
        ops: Vec<TransactOp>,
        token: Option<String>,
    ) -> Result<(), StoreError> {
        validate_transaction(&ops)?;
        validate_token(token.as_deref())?;
        let mut g = self.lock();
        if let Some(t) = &token {
            if let Some(seen) = g.tokens.get(t) {
                // DynamoDB: the same token with other parameters is refused
                // (IdempotentParameterMismatch); with the same ones it succeeds, unapplied.
                return if *seen == ops {
                    Ok(())
                } else {
                    Err(StoreError::Validation(format!(
                        "idempotent parameter mismatch: token {t} was used for another transaction"
                    )))
                };
            }
        }
        let keys: Vec<&Key> = ops.iter().map(TransactOp::key).collect();
        self.charge(&mut g, &keys)?;
        let mut planned = Vec::with_capacity(ops.len());
        let mut reasons = Vec::with_capacity(ops.len());
        let mut failed = false;
        let inner = &mut *g;
        for op in &ops {
            let cur = inner.items.get(op.key()).and_then(|s| s.cur.as_deref());
            match stage(op, cur, &mut inner.spares) {
                Ok(p) => {
                    planned.push(p);
                    reasons.push(CancelReason::None);
                }
                Err(r) => {
                    failed = true;
                    planned.push(Staged::Nothing);
                    reasons.push(r);
                }
            }
        }
        if failed {
            for p in planned {
                if let Staged::Updated(new, _) = p {
                    recycle(&mut g.spares, new);
                }
            }
            return Err(StoreError::TransactionCanceled { reasons });
        }
        let at = self.feed_now();
        for (op, p) in ops.iter().zip(planned) {
            match p {
                Staged::Nothing => {}
                Staged::Write(new) => write(&mut g, op.key(), new, at),
                Staged::Updated(new, changed) => {
                    install(&mut g, op.key(), Some(new), |_, _| changed, at)
                }
            }
        }
        if let Some(t) = token {
            g.tokens.insert(t, ops);
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
        // Matched on the stored items; only the matches are copied out.
        let mut out: Vec<(String, Item)> = g
            .items
            .keys()
            .filter_map(|k| self.read_ref(&g, k, consistent))
            .filter(|i| i.get(pk_attr.as_str()).and_then(|v| v.as_s()) == Some(q.pk.as_str()))
            .filter_map(|i| {
                let sk = i.get(sk_attr.as_str())?.as_s()?.to_string();
                match &q.sk_prefix {
                    Some(p) if !sk.starts_with(p.as_str()) => None,
                    _ => Some((sk, i.clone())),
                }
            })
            .collect();
        out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        Ok(out.into_iter().map(|(_, i)| i).collect())
    }

    fn backend(&self) -> &'static str {
        "memory"
    }

    /// Items are typed here, so every entry decodes.
    async fn scan(
        &self,
        pk_prefix: &str,
        after: Option<Key>,
        limit: usize,
    ) -> Result<ScanPage, StoreError> {
        use std::ops::Bound;
        let limit = limit.max(1);
        let g = self.lock();
        let start = match after {
            Some(k) => (k, true),
            None => (Key::new(pk_prefix, ""), false),
        };
        let from = if start.1 {
            Bound::Excluded(&start.0)
        } else {
            Bound::Included(&start.0)
        };
        let mut live = g
            .items
            .range(from)
            .take_while(|(k, _)| k.pk.starts_with(pk_prefix))
            .filter_map(|(k, slot)| Some((k, slot.cur.as_deref()?)));
        let items: Vec<_> = live
            .by_ref()
            .take(limit)
            .map(|(_, i)| Ok(i.clone()))
            .collect();
        // More to read: the next page starts after the last key returned.
        let next = match live.next() {
            Some(_) => items.last().and_then(|i| i.as_ref().ok()).and_then(Key::of),
            None => None,
        };
        Ok(ScanPage { items, next })
    }
}

/// The in-process feed: one stream, sequence numbers 1, 2, … in apply order. Raw writes
/// (`raw_put`, `raw_delete`: test staging) bypass it.
#[async_trait]
impl ChangeFeed for MemoryStore {
    async fn read_feed(&self, cursor: &FeedCursor, limit: usize) -> Result<FeedBatch, StoreError> {
        let after = cursor.single_seq()?;
        let g = self.lock();
        if !g.feed_on {
            return Err(StoreError::Validation(
                "this MemoryStore keeps no change feed (MemoryStore::with_change_feed)".into(),
            ));
        }
        if after < g.trimmed_through {
            return Err(StoreError::Validation(format!(
                "the feed no longer holds changes {}..={} (cursor at {after})",
                after + 1,
                g.trimmed_through
            )));
        }
        let skip = usize::try_from(after - g.trimmed_through).unwrap_or(usize::MAX);
        let changes: Vec<Change> = g
            .log
            .iter()
            .skip(skip)
            .take(limit.max(1))
            .cloned()
            .collect();
        let mut next = cursor.clone();
        if let Some(c) = changes.last() {
            next.advance(&c.position);
        }
        Ok(FeedBatch {
            changes,
            cursor: next,
        })
    }

    async fn trim_feed(&self, cursor: &FeedCursor, before_ms: i64) -> Result<(), StoreError> {
        let through = cursor.single_seq()?;
        let mut g = self.lock();
        let from = g.trimmed_through;
        while g.trimmed_through < through && g.log.front().is_some_and(|c| c.at_ms < before_ms) {
            pop_oldest(&mut g);
        }
        let popped = usize::try_from(g.trimmed_through - from).unwrap_or(usize::MAX);
        if popped > 0 {
            // As many spares as the writes until the next trim are likely to copy into.
            g.spares.truncate(popped.max(MIN_SPARES));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::expr::Update;

    fn bump(key: &Key) -> UpdateRequest {
        UpdateRequest {
            key: key.clone(),
            update: Update::default().add("n", 1),
            condition: None,
            returns: ReturnValues::None,
        }
    }

    /// Trimmed versions are kept to be written over, as many as the trim let go of
    /// ([`MIN_SPARES`] at least): a busy feed's whole pass, a quiet feed's few.
    #[tokio::test]
    async fn a_trim_keeps_as_many_spares_as_it_let_go_of() {
        let s = MemoryStore::with_change_feed();
        let writes = |n: usize, key: Key| {
            let s = &s;
            async move {
                for _ in 0..n {
                    s.update_in(bump(&key)).expect("update");
                }
            }
        };
        let keys: Vec<Key> = (0..4).map(|i| Key::new(format!("k{i}"), "s")).collect();
        for k in &keys {
            writes(1_000, k.clone()).await;
        }
        let end = || {
            let mut c = FeedCursor::start();
            let p = position_of_last(&s);
            c.advance(&p);
            c
        };
        s.trim_feed(&end(), i64::MAX).await.expect("trim");
        let kept = s.lock().spares.len();
        assert!(
            kept > MIN_SPARES && kept <= 4_000,
            "a 4,000-change trim keeps its versions: {kept}"
        );
        // Spares are written over by the next copies: each takes one, except the first,
        // which reuses the key's own previous version (no longer held by the feed).
        writes(500, keys[0].clone()).await;
        assert_eq!(s.lock().spares.len(), kept - 499, "each copy takes one");
        // A quiet pass: a trim of 500 keeps the floor.
        s.trim_feed(&end(), i64::MAX).await.expect("trim");
        assert_eq!(s.lock().spares.len(), MIN_SPARES.min(kept));
        assert!(s.lock().log.is_empty());
    }

    fn position_of_last(s: &MemoryStore) -> FeedPosition {
        let g = s.lock();
        FeedPosition {
            stream: String::new(),
            seq: g.last_seq.to_string(),
        }
    }
}
