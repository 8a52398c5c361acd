//! Process-local caches: each (entity, resource)'s shard count, and the reject-only cache of
//! recently seen bucket images (ADR-147).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex};

use tollgate_core::bucket::{BucketImage, Shapes};

/// The caches' hash map: foldhash, seeded per process, instead of SipHash — every acquire
/// makes several lookups by entity and resource name, and hashing them was a visible part
/// of its cost.
pub(crate) type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Values by entity, then resource: nested so a lookup by `&str` allocates nothing (a flat
/// map keyed by `(String, String)` would build both strings on every lookup).
type ByBucket<V> = Map<String, Map<String, V>>;

/// Values by (entity, resource, shard), with the number held.
#[derive(Debug)]
struct ByShard<V> {
    map: ByBucket<Map<u32, V>>,
    len: usize,
}

impl<V> Default for ByShard<V> {
    fn default() -> Self {
        ByShard {
            map: Map::default(),
            len: 0,
        }
    }
}

impl<V> ByShard<V> {
    fn get(&self, e: &str, r: &str, shard: u32) -> Option<&V> {
        self.map.get(e)?.get(r)?.get(&shard)
    }

    /// Insert; the entity's and resource's names are copied only when first seen.
    fn insert(&mut self, e: &str, r: &str, shard: u32, v: V) {
        let by_resource = match self.map.get_mut(e) {
            Some(m) => m,
            None => self.map.entry(e.to_string()).or_default(),
        };
        let by_shard = match by_resource.get_mut(r) {
            Some(m) => m,
            None => by_resource.entry(r.to_string()).or_default(),
        };
        if by_shard.insert(shard, v).is_none() {
            self.len += 1;
        }
    }

    /// [`ByShard::insert`] into a cache bounded by [`CAP`]: a new entry at the bound starts
    /// the cache over.
    fn insert_bounded(&mut self, e: &str, r: &str, shard: u32, v: V) {
        if self.len >= CAP && self.get(e, r, shard).is_none() {
            self.clear();
        }
        self.insert(e, r, shard, v);
    }

    fn remove(&mut self, e: &str, r: &str, shard: u32) {
        let removed = self
            .map
            .get_mut(e)
            .and_then(|m| m.get_mut(r))
            .and_then(|m| m.remove(&shard));
        if removed.is_some() {
            self.len -= 1;
        }
    }

    fn retain(&mut self, mut keep: impl FnMut(&V) -> bool) {
        let mut len = 0;
        for by_resource in self.map.values_mut() {
            for by_shard in by_resource.values_mut() {
                by_shard.retain(|_, v| keep(v));
                len += by_shard.len();
            }
            by_resource.retain(|_, m| !m.is_empty());
        }
        self.map.retain(|_, m| !m.is_empty());
        self.len = len;
    }

    fn clear(&mut self) {
        self.map.clear();
        self.len = 0;
    }
}

/// Most entries either cache keeps before it drops stale ones.
const CAP: usize = 10_000;

/// Cached shard counts, filled by every read or write that sees an item; never lowered.
#[derive(Debug, Default)]
pub struct ShardCounts(Mutex<(ByBucket<i64>, usize)>);

impl ShardCounts {
    /// The cached count.
    pub fn get(&self, e: &str, r: &str) -> Option<i64> {
        let g = self.0.lock().unwrap_or_else(|x| x.into_inner());
        g.0.get(e)?.get(r).copied()
    }
    /// Raise the cached count (never lowers it).
    pub fn raise(&self, e: &str, r: &str, s: i64) {
        let mut g = self.0.lock().unwrap_or_else(|x| x.into_inner());
        if let Some(v) = g.0.get_mut(e).and_then(|m| m.get_mut(r)) {
            *v = (*v).max(s);
            return;
        }
        if g.1 >= CAP * 10 {
            g.0.clear();
            g.1 = 0;
        }
        g.0.entry(e.to_string())
            .or_default()
            .insert(r.to_string(), s);
        g.1 += 1;
    }
    /// Forget an entity's counts (it was deleted).
    pub fn forget_entity(&self, e: &str) {
        let mut g = self.0.lock().unwrap_or_else(|x| x.into_inner());
        if let Some(m) = g.0.remove(e) {
            g.1 -= m.len();
        }
    }
}

/// ADR-147's reject-only cache: bucket images seen by failed fast writes and slow-path
/// reads, trusted for `ttl_ms`, used only to refuse (never to admit) and to steer draws
/// away from shards known short.
#[derive(Debug, Default)]
pub struct RejectionCache {
    ttl_ms: i64,
    map: Mutex<ByShard<(i64, Arc<BucketImage>)>>,
}

impl RejectionCache {
    /// A cache trusting entries for `ttl_ms` (0 disables it).
    pub fn new(ttl_ms: i64) -> Self {
        RejectionCache {
            ttl_ms,
            map: Mutex::new(ByShard::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ByShard<(i64, Arc<BucketImage>)>> {
        self.map.lock().unwrap_or_else(|x| x.into_inner())
    }

    /// Remember what a shard looked like at `now`.
    pub fn record(&self, e: &str, r: &str, shard: u32, img: impl Into<Arc<BucketImage>>, now: i64) {
        if self.ttl_ms <= 0 {
            return;
        }
        let mut g = self.lock();
        if g.len >= CAP {
            let ttl = self.ttl_ms;
            g.retain(|(at, _)| now - *at < ttl);
            if g.len >= CAP {
                g.clear();
            }
        }
        g.insert(e, r, shard, (now, img.into()));
    }

    /// A trusted view: younger than the TTL, before its `vu`, not past its item TTL.
    pub fn view(&self, e: &str, r: &str, shard: u32, now: i64) -> Option<Arc<BucketImage>> {
        let g = self.lock();
        let (at, img) = g.get(e, r, shard)?;
        let fresh = now - at < self.ttl_ms && now >= *at;
        let valid =
            img.valid_until_ms.is_none_or(|v| v > now) && img.ttl.is_none_or(|t| t > now / 1000);
        (fresh && valid).then(|| Arc::clone(img))
    }

    /// Forget one shard (a local credit changed it).
    pub fn forget(&self, e: &str, r: &str, shard: u32) {
        self.lock().remove(e, r, shard);
    }

    /// Forget everything (admin writes).
    pub fn clear(&self) {
        self.lock().clear();
    }
}

/// The last image of each bucket shard this process wrote or was shown by a failed write
/// (`ALL_NEW` / `ALL_OLD`). Used only to plan the next write without reading first (rule
/// "plan from what the store last said"): every write planned from it is conditioned on
/// what it assumes (`rf`, the balances read), so a stale entry costs one failed write,
/// whose returned image replaces it, never an over-admission. Images are shared (`Arc`)
/// with the leases and plans that use them, never copied.
///
/// It keeps the item shapes it decoded too ([`Shapes`]): an item read or returned for a
/// shard without an image here is decoded by place when another bucket had its shape.
///
/// And each shard's write gate ([`ImageCache::gate`]): rule "one rf-locked writer per shard
/// in a process".
#[derive(Debug, Default)]
pub struct ImageCache {
    images: Mutex<ByShard<Arc<BucketImage>>>,
    shapes: Shapes,
    gates: Mutex<ByShard<Gate>>,
}

/// A shard's write gate: held by the one task of this process that writes the shard under
/// its rf lock.
pub type Gate = Arc<tokio::sync::Mutex<()>>;

impl ImageCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, ByShard<Arc<BucketImage>>> {
        self.images.lock().unwrap_or_else(|x| x.into_inner())
    }
    /// The item shapes decoded lately.
    pub fn shapes(&self) -> &Shapes {
        &self.shapes
    }
    /// The last image of a shard.
    pub fn get(&self, e: &str, r: &str, shard: u32) -> Option<Arc<BucketImage>> {
        self.lock().get(e, r, shard).cloned()
    }
    /// Remember a shard's image.
    pub fn put(&self, e: &str, r: &str, shard: u32, img: impl Into<Arc<BucketImage>>) {
        self.lock().insert_bounded(e, r, shard, img.into());
    }
    /// Forget one shard.
    pub fn forget(&self, e: &str, r: &str, shard: u32) {
        self.lock().remove(e, r, shard);
    }
    /// Forget everything (administrative writes).
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Rule "one rf-locked writer per shard in a process": the shard's write gate, made on
    /// first use and kept with the images (as many at most; a gate dropped at the bound
    /// while held only lets two of this process's writers race once, as they did without
    /// gates — each write is still conditioned on what it assumes).
    ///
    /// An rf-locked write succeeds only if no other write landed on the shard since the
    /// image it was planned from, so concurrent ones on one shard all but one fail and are
    /// planned again from the image their failure returned: at 64 tasks on one hot entity a
    /// process sent about two writes per admitted acquire. Queued behind the gate, each is
    /// planned from the image the previous one left and sends one.
    pub fn gate(&self, e: &str, r: &str, shard: u32) -> Gate {
        let mut g = self.gates.lock().unwrap_or_else(|x| x.into_inner());
        if let Some(gate) = g.get(e, r, shard) {
            return Arc::clone(gate);
        }
        let gate = Gate::default();
        g.insert_bounded(e, r, shard, Arc::clone(&gate));
        gate
    }
}

/// The closure records this process wrote on a store without native TTL, by `ttl`.
#[derive(Debug, Default)]
pub(crate) struct Closures {
    due: Mutex<BinaryHeap<Reverse<(i64, String)>>>,
}

impl Closures {
    fn lock(&self) -> std::sync::MutexGuard<'_, BinaryHeap<Reverse<(i64, String)>>> {
        self.due.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn remember(&self, ttl_s: i64, id: String) {
        self.lock().push(Reverse((ttl_s, id)));
    }

    /// Remove and return the records whose `ttl` is at or before `now_s`.
    pub(crate) fn take_due(&self, now_s: i64) -> Vec<(i64, String)> {
        let mut h = self.lock();
        let mut out = Vec::new();
        while h.peek().is_some_and(|Reverse((t, _))| *t <= now_s) {
            if let Some(Reverse(x)) = h.pop() {
                out.push(x);
            }
        }
        out
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}
