//! `FaultyStore<S>`: wraps any store and injects, by seed, the failures a distributed store
//! shows: spurious conflicts, throttling, writes applied whose response is lost, stale reads
//! and delays.
//!
//! Every request draws the same number of random values from one seeded [`SmallRng`], in
//! request order, whatever the request and whatever its outcome, so a given seed and the
//! same sequence of requests inject the same faults. (Concurrent requests reach the RNG in
//! the order the scheduler lets them; a deterministic simulator serialises them.)
//!
//! Injected faults, per request kind:
//!
//! | fault                  | reads                 | put / update / delete                | transaction                                   |
//! |------------------------|-----------------------|--------------------------------------|-----------------------------------------------|
//! | delay                  | sleep, then go on     | sleep, then go on                    | sleep, then go on                             |
//! | throttle               | `Throttled`           | `Throttled`, nothing applied         | `Throttled`, nothing applied                  |
//! | transaction conflict   | —                     | `TransactionConflict`, nothing applied | `TransactionCanceled`: one op `TransactionConflict`, others `None` |
//! | condition race         | —                     | (conditional only) `Throttled`, nothing applied | (with a condition) `TransactionCanceled`: first conditioned op `TransactionConflict` |
//! | lost response          | —                     | applied by the inner store, then `Ambiguous` | applied, then `Ambiguous`                |
//! | stale read             | non-consistent reads see each item as it was up to [`STALE_DEPTH`] writes ago (chosen per item, by seed; a batch may mix fresh and stale items); index queries see each item as it was before its last write | — | — |
//!
//! A real racing writer cannot be emulated generically (it would need a write that makes the
//! condition false), so a "condition race" surfaces as the retryable refusal a contended
//! item produces instead. A lost response is reported whatever the inner outcome was: the
//! caller cannot tell a lost success from a lost refusal.
//!
//! Invalid requests (overlapping paths, too many operations, …) are forwarded untouched, so
//! validation errors stay exact.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tollgate_core::value::{Item, Key};

use crate::eval::{validate_item, validate_update};
use crate::{
    validate_token, validate_transaction, CancelReason, DeleteRequest, PutRequest, Query, ScanPage,
    Store, StoreError, TransactOp, UpdateRequest,
};

/// How many earlier versions of an item a stale read may serve. DynamoDB's eventually
/// consistent reads lag by time, not by a version count, so on a hot item a stale read can be
/// several writes behind; one version would hide hazards that need an older view (ADR-139 W9:
/// a sibling seen before its roll and before the count propagation that followed it).
pub const STALE_DEPTH: usize = 4;

/// Per-request probabilities (0.0 ..= 1.0) of each fault.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultConfig {
    /// A conditional write is refused as if it raced another writer (see the module docs).
    pub condition_race: f64,
    /// A write is refused with a transaction conflict.
    pub transaction_conflict: f64,
    /// A request is throttled.
    pub throttle: f64,
    /// A write is applied but its response is lost (`Ambiguous`).
    pub lost_response: f64,
    /// A non-consistent read sees items as they were some writes ago (see [`STALE_DEPTH`]).
    pub stale_read: f64,
    /// A request is delayed by a seeded duration up to `max_delay`.
    pub delay: f64,
    /// The longest injected delay.
    pub max_delay: Duration,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig::none()
    }
}

impl FaultConfig {
    /// No faults.
    pub fn none() -> Self {
        FaultConfig {
            condition_race: 0.0,
            transaction_conflict: 0.0,
            throttle: 0.0,
            lost_response: 0.0,
            stale_read: 0.0,
            delay: 0.0,
            max_delay: Duration::ZERO,
        }
    }

    /// Every fault with probability `p`, delays up to 5 ms.
    pub fn uniform(p: f64) -> Self {
        FaultConfig {
            condition_race: p,
            transaction_conflict: p,
            throttle: p,
            lost_response: p,
            stale_read: p,
            delay: p,
            max_delay: Duration::from_millis(5),
        }
    }
}

/// How many faults of each kind were injected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Conditional writes refused as races.
    pub condition_races: u64,
    /// Writes refused with a transaction conflict.
    pub transaction_conflicts: u64,
    /// Requests throttled.
    pub throttles: u64,
    /// Writes forwarded whose response was replaced by `Ambiguous`.
    pub lost_responses: u64,
    /// Reads that served at least one stale item.
    pub stale_reads: u64,
    /// Requests delayed.
    pub delays: u64,
}

impl FaultStats {
    /// Every injected fault.
    pub fn total(&self) -> u64 {
        self.condition_races
            + self.transaction_conflicts
            + self.throttles
            + self.lost_responses
            + self.stale_reads
            + self.delays
    }
}

const RACE: usize = 0;
const CONFLICT: usize = 1;
const THROTTLE: usize = 2;
const LOST: usize = 3;
const STALE: usize = 4;
const DELAY: usize = 5;

/// The faults drawn for one request.
#[derive(Debug, Clone, Copy, Default)]
struct Draw {
    delay: Option<Duration>,
    throttle: bool,
    conflict: bool,
    race: bool,
    lost: bool,
    stale: bool,
    pick: u64,
}

/// A store wrapper that injects seeded faults (see the module docs).
#[derive(Debug)]
pub struct FaultyStore<S> {
    inner: S,
    config: Mutex<FaultConfig>,
    rng: Mutex<SmallRng>,
    enabled: AtomicBool,
    stats: [AtomicU64; 6],
    /// Per key, the items before the last [`STALE_DEPTH`] writes forwarded, newest first
    /// (`None` = it was absent).
    shadow: Mutex<HashMap<Key, VecDeque<Option<Arc<Item>>>>>,
}

impl<S> FaultyStore<S> {
    /// Wrap `inner`, drawing faults from `seed` with the probabilities of `config`.
    pub fn new(inner: S, seed: u64, config: FaultConfig) -> Self {
        FaultyStore {
            inner,
            config: Mutex::new(config),
            rng: Mutex::new(SmallRng::seed_from_u64(seed)),
            enabled: AtomicBool::new(true),
            stats: Default::default(),
            shadow: Mutex::new(HashMap::new()),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Switch fault injection on or off. While off, requests pass straight through and draw
    /// nothing from the RNG; previous versions are still recorded for later stale reads.
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::SeqCst);
    }

    /// Whether faults are being injected.
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::SeqCst)
    }

    /// Replace the probabilities.
    pub fn set_config(&self, config: FaultConfig) {
        *lock(&self.config) = config;
    }

    /// The probabilities in force.
    pub fn config(&self) -> FaultConfig {
        *lock(&self.config)
    }

    /// Faults injected so far.
    pub fn stats(&self) -> FaultStats {
        let l = |i: usize| self.stats[i].load(Ordering::Relaxed);
        FaultStats {
            condition_races: l(RACE),
            transaction_conflicts: l(CONFLICT),
            throttles: l(THROTTLE),
            lost_responses: l(LOST),
            stale_reads: l(STALE),
            delays: l(DELAY),
        }
    }

    fn bump(&self, i: usize) {
        self.stats[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Draw this request's faults: always the same number of values, whatever is used.
    fn draw(&self) -> Draw {
        if !self.is_enabled() {
            return Draw::default();
        }
        let c = self.config();
        let mut rng = lock(&self.rng);
        let max_us = u64::try_from(c.max_delay.as_micros()).unwrap_or(u64::MAX);
        let hit = |rng: &mut SmallRng, p: f64| rng.gen::<f64>() < p;
        let delay = hit(&mut rng, c.delay);
        let delay_us = rng.gen_range(0..=max_us);
        Draw {
            delay: delay.then(|| Duration::from_micros(delay_us)),
            throttle: hit(&mut rng, c.throttle),
            conflict: hit(&mut rng, c.transaction_conflict),
            race: hit(&mut rng, c.condition_race),
            lost: hit(&mut rng, c.lost_response),
            stale: hit(&mut rng, c.stale_read),
            pick: rng.gen(),
        }
    }

    /// Whether writes must record the item they replace (stale reads are possible).
    fn tracking(&self) -> bool {
        self.config().stale_read > 0.0
    }

    async fn before(&self, d: &Draw) -> Result<(), StoreError> {
        if let Some(t) = d.delay {
            self.bump(DELAY);
            tokio::time::sleep(t).await;
        }
        if d.throttle {
            self.bump(THROTTLE);
            return Err(StoreError::Throttled(
                "injected fault: throughput exceeded".into(),
            ));
        }
        Ok(())
    }

    /// The version a stale single-item read serves: always an earlier one, chosen by `pick`.
    fn stale(&self, key: &Key, pick: u64) -> Option<Option<Item>> {
        let g = lock(&self.shadow);
        let h = g.get(key)?;
        let i = usize::try_from(mix(pick, 0).checked_rem(h.len() as u64)?).unwrap_or(0);
        h.get(i).map(|v| v.as_deref().cloned())
    }
}

/// A seeded choice for the `i`-th item of one request (splitmix64 of `pick` and `i`).
fn mix(pick: u64, i: usize) -> u64 {
    let mut z = pick.wrapping_add(
        (i as u64)
            .wrapping_add(1)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section here is a plain read or insert: a poisoned guard is usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn lost() -> StoreError {
    StoreError::Ambiguous("injected fault: the write was sent but its response was lost".into())
}

/// The sort-key value an item has in the query's partition, if it belongs there.
fn query_sort_key(item: &Item, q: &Query) -> Option<String> {
    let (pk_attr, sk_attr) = match &q.index {
        None => ("PK".to_string(), "SK".to_string()),
        Some(ix) => (format!("{ix}PK"), format!("{ix}SK")),
    };
    if item.get(pk_attr.as_str())?.as_s()? != q.pk {
        return None;
    }
    let sk = item.get(sk_attr.as_str())?.as_s()?;
    match &q.sk_prefix {
        Some(p) if !sk.starts_with(p.as_str()) => None,
        _ => Some(sk.to_string()),
    }
}

impl<S: Store> FaultyStore<S> {
    /// The current items at `keys`, read consistently, if tracking (failures: not recorded).
    async fn pre_images(&self, keys: &[Key]) -> Option<Vec<Option<Arc<Item>>>> {
        if !self.tracking() || keys.is_empty() {
            return None;
        }
        self.inner.batch_get_shared(keys, true).await.ok()
    }

    fn record(
        &self,
        keys: &[Key],
        pre: Option<Vec<Option<Arc<Item>>>>,
        outcome_unknown_or_ok: bool,
    ) {
        let Some(pre) = pre else { return };
        if !outcome_unknown_or_ok {
            return;
        }
        let mut g = lock(&self.shadow);
        for (k, old) in keys.iter().zip(pre) {
            let h = g.entry(k.clone()).or_default();
            h.push_front(old);
            h.truncate(STALE_DEPTH);
        }
    }

    /// Forward a single-item write with the write faults of `d`.
    async fn single_write<T, F>(
        &self,
        d: Draw,
        key: &Key,
        conditional: bool,
        fwd: F,
    ) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = Result<T, StoreError>>,
    {
        self.before(&d).await?;
        if d.conflict {
            self.bump(CONFLICT);
            return Err(StoreError::TransactionConflict);
        }
        if d.race && conditional {
            self.bump(RACE);
            return Err(StoreError::Throttled(
                "injected fault: condition race on a contended item".into(),
            ));
        }
        let keys = [key.clone()];
        let pre = self.pre_images(&keys).await;
        let r = fwd.await;
        self.record(
            &keys,
            pre,
            matches!(r, Ok(_) | Err(StoreError::Ambiguous(_))),
        );
        if d.lost {
            self.bump(LOST);
            return Err(lost());
        }
        r
    }
}

/// Feed reads take the read faults (throttling, delays, outages) of a draw; what the feed
/// holds is the inner store's: a lost response to a write still applied the write, so its
/// change is there.
#[async_trait]
impl<S: crate::ChangeFeed> crate::ChangeFeed for FaultyStore<S> {
    async fn read_feed(
        &self,
        cursor: &crate::FeedCursor,
        limit: usize,
    ) -> Result<crate::FeedBatch, StoreError> {
        let d = self.draw();
        self.before(&d).await?;
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

#[async_trait]
impl<S: Store> Store for FaultyStore<S> {
    async fn get(&self, key: &Key, consistent: bool) -> Result<Option<Item>, StoreError> {
        let d = self.draw();
        self.before(&d).await?;
        let cur = self.inner.get(key, consistent).await?;
        if !consistent && d.stale {
            if let Some(old) = self.stale(key, d.pick) {
                self.bump(STALE);
                return Ok(old);
            }
        }
        Ok(cur)
    }

    async fn batch_get(
        &self,
        keys: &[Key],
        consistent: bool,
    ) -> Result<Vec<Option<Item>>, StoreError> {
        Ok(crate::owned_items(
            self.batch_get_shared(keys, consistent).await?,
        ))
    }

    async fn batch_get_shared(
        &self,
        keys: &[Key],
        consistent: bool,
    ) -> Result<Vec<Option<Arc<Item>>>, StoreError> {
        let d = self.draw();
        self.before(&d).await?;
        let mut out = self.inner.batch_get_shared(keys, consistent).await?;
        if !consistent && d.stale {
            let shadow = lock(&self.shadow);
            let mut any = false;
            // Each item independently: its current version or one of its earlier ones.
            for (i, (k, slot)) in keys.iter().zip(out.iter_mut()).enumerate() {
                if let Some(h) = shadow.get(k) {
                    let v = usize::try_from(mix(d.pick, i) % (h.len() as u64 + 1)).unwrap_or(0);
                    if let Some(old) = v.checked_sub(1).and_then(|j| h.get(j)) {
                        *slot = old.clone();
                        any = true;
                    }
                }
            }
            drop(shadow);
            if any {
                self.bump(STALE);
            }
        }
        Ok(out)
    }

    async fn put(&self, req: PutRequest) -> Result<(), StoreError> {
        let d = self.draw();
        if validate_item(&req.item).is_err() {
            return self.inner.put(req).await;
        }
        let key = req.key.clone();
        let conditional = req.condition.is_some();
        self.single_write(d, &key, conditional, self.inner.put(req))
            .await
    }

    async fn update(&self, req: UpdateRequest) -> Result<Option<Item>, StoreError> {
        Ok(self.update_shared(req).await?.map(Arc::unwrap_or_clone))
    }

    async fn update_shared(&self, req: UpdateRequest) -> Result<Option<Arc<Item>>, StoreError> {
        let d = self.draw();
        if validate_update(&req.update).is_err() {
            return self.inner.update_shared(req).await;
        }
        let key = req.key.clone();
        let conditional = req.condition.is_some();
        self.single_write(d, &key, conditional, self.inner.update_shared(req))
            .await
    }

    async fn delete(&self, req: DeleteRequest) -> Result<Option<Item>, StoreError> {
        let d = self.draw();
        let key = req.key.clone();
        let conditional = req.condition.is_some();
        self.single_write(d, &key, conditional, self.inner.delete(req))
            .await
    }

    async fn transact_write(
        &self,
        ops: Vec<TransactOp>,
        token: Option<String>,
    ) -> Result<(), StoreError> {
        let d = self.draw();
        if validate_transaction(&ops).is_err() || validate_token(token.as_deref()).is_err() {
            return self.inner.transact_write(ops, token).await;
        }
        self.before(&d).await?;
        let n = ops.len() as u64;
        let conflict_at = |i: usize| {
            (0..ops.len())
                .map(|j| {
                    if j == i {
                        CancelReason::TransactionConflict
                    } else {
                        CancelReason::None
                    }
                })
                .collect::<Vec<_>>()
        };
        if d.conflict {
            self.bump(CONFLICT);
            let i = usize::try_from(d.pick % n).unwrap_or(0);
            return Err(StoreError::TransactionCanceled {
                reasons: conflict_at(i),
            });
        }
        if d.race {
            let first_conditioned = ops.iter().position(|op| match op {
                TransactOp::Put(p) => p.condition.is_some(),
                TransactOp::Update(u) => u.condition.is_some(),
                TransactOp::Delete(x) => x.condition.is_some(),
                TransactOp::Check { .. } => true,
            });
            if let Some(i) = first_conditioned {
                self.bump(RACE);
                return Err(StoreError::TransactionCanceled {
                    reasons: conflict_at(i),
                });
            }
        }
        let written: Vec<Key> = ops
            .iter()
            .filter(|op| !matches!(op, TransactOp::Check { .. }))
            .map(|op| op.key().clone())
            .collect();
        let pre = self.pre_images(&written).await;
        let r = self.inner.transact_write(ops, token).await;
        self.record(
            &written,
            pre,
            matches!(r, Ok(()) | Err(StoreError::Ambiguous(_))),
        );
        if d.lost {
            self.bump(LOST);
            return Err(lost());
        }
        r
    }

    async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError> {
        let d = self.draw();
        self.before(&d).await?;
        // Index queries are never strongly consistent.
        let eventual = !q.consistent || q.index.is_some();
        let cur = self.inner.query(q.clone()).await?;
        if !(eventual && d.stale) {
            return Ok(cur);
        }
        let shadow = lock(&self.shadow);
        if shadow.is_empty() {
            return Ok(cur);
        }
        let mut by_key: BTreeMap<Key, Item> = BTreeMap::new();
        let mut keyless = Vec::new();
        for item in cur {
            match Key::of(&item) {
                Some(k) => {
                    by_key.insert(k, item);
                }
                None => keyless.push(item),
            }
        }
        let mut changed = false;
        for (k, old) in shadow.iter().filter_map(|(k, h)| Some((k, h.front()?))) {
            let was_there = by_key.remove(k).is_some();
            let now_there = match old {
                Some(item) if query_sort_key(item, &q).is_some() => {
                    by_key.insert(k.clone(), Item::clone(item));
                    true
                }
                _ => false,
            };
            changed |= was_there || now_there;
        }
        drop(shadow);
        if changed {
            self.bump(STALE);
        }
        let mut out: Vec<(String, Item)> = by_key
            .into_values()
            .chain(keyless)
            .filter_map(|i| query_sort_key(&i, &q).map(|sk| (sk, i)))
            .collect();
        out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        Ok(out.into_iter().map(|(_, i)| i).collect())
    }

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    /// Administration: forwarded without faults.
    async fn scan(
        &self,
        pk_prefix: &str,
        after: Option<Key>,
        limit: usize,
    ) -> Result<ScanPage, StoreError> {
        self.inner.scan(pk_prefix, after, limit).await
    }

    /// Administration: forwarded without faults (and not kept for stale reads).
    async fn purge(&self, key: &Key) -> Result<(), StoreError> {
        self.inner.purge(key).await
    }
}
