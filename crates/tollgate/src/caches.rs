//! Process-local caches: each (entity, resource)'s shard count, and the reject-only cache of
//! recently seen bucket images (ADR-147).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex};

use compact_str::CompactString;
use tollgate_core::bucket::{BucketImage, Shapes};

/// The caches' hash map: foldhash, seeded per process, instead of SipHash — every acquire
/// makes several lookups by entity and resource name, and hashing them was a visible part
/// of its cost.
pub(crate) type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// One entry of a [`ByShard`]: its (entity, resource, shard) and value. The names are held
/// in the slot itself up to 24 bytes each (`CompactString`), so a look-up compares them in
/// the cache line it probed: boxed, each name was one more line to load per look-up, cold
/// at thousands of entities (cachegrind on the warm acquire at 10,000 entities: the name
/// comparison took ~6.7 of its ~280 first-level data-cache misses).
#[derive(Debug)]
struct Slot<V> {
    entity: CompactString,
    resource: CompactString,
    shard: u32,
    value: V,
}

/// Values by (entity, resource, shard), in one flat table: a lookup hashes the three once
/// and probes once (nested maps by entity, then resource, then shard took three hashes and
/// three dependent probes, each a likely cache miss at thousands of entities), comparing
/// the names in place, so it allocates nothing; the names are copied only by an insert of
/// a new entry.
pub(crate) struct ByShard<V> {
    table: hashbrown::HashTable<Slot<V>>,
    hasher: foldhash::fast::RandomState,
}

impl<V: std::fmt::Debug> std::fmt::Debug for ByShard<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByShard")
            .field("len", &self.table.len())
            .finish_non_exhaustive()
    }
}

impl<V> Default for ByShard<V> {
    fn default() -> Self {
        ByShard {
            table: hashbrown::HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }
}

impl<V> Slot<V> {
    /// Whether this entry is (entity `e`, resource `r`, `shard`).
    fn is(&self, e: &str, r: &str, shard: u32) -> bool {
        self.shard == shard && self.entity == e && self.resource == r
    }
}

/// The hash of (entity, resource, shard): the names apart by a byte no `str` holds.
fn slot_hash(hasher: &foldhash::fast::RandomState, e: &str, r: &str, shard: u32) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = hasher.build_hasher();
    h.write(e.as_bytes());
    h.write_u8(0xff);
    h.write(r.as_bytes());
    h.write_u32(shard);
    h.finish()
}

impl<V> ByShard<V> {
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    fn hash(&self, e: &str, r: &str, shard: u32) -> u64 {
        slot_hash(&self.hasher, e, r, shard)
    }

    pub(crate) fn get(&self, e: &str, r: &str, shard: u32) -> Option<&V> {
        self.table
            .find(self.hash(e, r, shard), |s| s.is(e, r, shard))
            .map(|s| &s.value)
    }

    pub(crate) fn get_mut(&mut self, e: &str, r: &str, shard: u32) -> Option<&mut V> {
        let h = self.hash(e, r, shard);
        self.table
            .find_mut(h, |s| s.is(e, r, shard))
            .map(|s| &mut s.value)
    }

    /// Insert; the entity's and resource's names are copied only for a new entry.
    pub(crate) fn insert(&mut self, e: &str, r: &str, shard: u32, v: V) {
        if let Some(old) = self.get_mut(e, r, shard) {
            *old = v;
            return;
        }
        let h = self.hash(e, r, shard);
        let hasher = &self.hasher;
        self.table.insert_unique(
            h,
            Slot {
                entity: e.into(),
                resource: r.into(),
                shard,
                value: v,
            },
            |s| slot_hash(hasher, &s.entity, &s.resource, s.shard),
        );
    }

    /// [`ByShard::insert`] into a cache bounded by [`CAP`]: a new entry at the bound starts
    /// the cache over.
    fn insert_bounded(&mut self, e: &str, r: &str, shard: u32, v: V) {
        if self.len() >= CAP && self.get(e, r, shard).is_none() {
            self.clear();
        }
        self.insert(e, r, shard, v);
    }

    fn remove(&mut self, e: &str, r: &str, shard: u32) {
        // Nothing to hash for (an admitted acquire forgets its shard's refusals, of which
        // there are usually none).
        if self.table.is_empty() {
            return;
        }
        let h = self.hash(e, r, shard);
        if let Ok(found) = self.table.find_entry(h, |s| s.is(e, r, shard)) {
            found.remove();
        }
    }

    fn retain(&mut self, mut keep: impl FnMut(&str, &V) -> bool) {
        self.table.retain(|s| keep(&s.entity, &s.value));
    }

    pub(crate) fn clear(&mut self) {
        self.table.clear();
    }
}

/// Most entries either cache keeps before it drops stale ones.
const CAP: usize = 10_000;

/// Cached shard counts, filled by every read or write that sees an item; never lowered.
/// Kept by (entity, resource) — shard 0 of a [`ByShard`].
#[derive(Debug, Default)]
pub struct ShardCounts(Mutex<ByShard<i64>>);

impl ShardCounts {
    fn lock(&self) -> std::sync::MutexGuard<'_, ByShard<i64>> {
        self.0.lock().unwrap_or_else(|x| x.into_inner())
    }
    /// The cached count.
    pub fn get(&self, e: &str, r: &str) -> Option<i64> {
        self.lock().get(e, r, 0).copied()
    }
    /// Raise the cached count (never lowers it).
    pub fn raise(&self, e: &str, r: &str, s: i64) {
        let mut g = self.lock();
        if let Some(v) = g.get_mut(e, r, 0) {
            *v = (*v).max(s);
            return;
        }
        if g.len() >= CAP * 10 {
            g.clear();
        }
        g.insert(e, r, 0, s);
    }
    /// Forget an entity's counts (it was deleted).
    pub fn forget_entity(&self, e: &str) {
        self.lock().retain(|entity, _| entity != e);
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
        if g.len() >= CAP {
            let ttl = self.ttl_ms;
            g.retain(|_, (at, _)| now - *at < ttl);
            if g.len() >= CAP {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The flat table finds each (entity, resource, shard) as nested maps did: a
    /// replacement keeps one entry, names split differently are different entries, and
    /// remove, retain and the bound drop what they say.
    #[test]
    fn by_shard_keeps_one_entry_per_entity_resource_and_shard() {
        let mut m = ByShard::default();
        m.insert("ab", "c", 0, 1);
        m.insert("a", "bc", 0, 2);
        m.insert("ab", "c", 1, 3);
        m.insert("ab", "c", 0, 4);
        assert_eq!(m.len(), 3);
        assert_eq!(m.get("ab", "c", 0), Some(&4));
        assert_eq!(m.get("a", "bc", 0), Some(&2));
        assert_eq!(m.get("ab", "c", 1), Some(&3));
        assert_eq!(m.get("abc", "", 0), None);
        *m.get_mut("a", "bc", 0).expect("held") += 10;
        assert_eq!(m.get("a", "bc", 0), Some(&12));
        m.remove("ab", "c", 1);
        assert_eq!((m.len(), m.get("ab", "c", 1)), (2, None));
        m.retain(|e, _| e != "a");
        assert_eq!((m.len(), m.get("a", "bc", 0)), (1, None));
        m.clear();
        for i in 0..CAP {
            m.insert_bounded(&format!("e{i}"), "r", 0, 0);
        }
        assert_eq!(m.len(), CAP);
        m.insert_bounded("one", "more", 0, 7);
        assert_eq!(m.len(), 1, "a new entry at the bound starts over");
        let counts = ShardCounts::default();
        counts.raise("e", "r", 2);
        counts.raise("e", "r", 1);
        counts.raise("e", "s", 4);
        assert_eq!(
            (counts.get("e", "r"), counts.get("e", "s")),
            (Some(2), Some(4))
        );
        counts.forget_entity("e");
        assert_eq!(counts.get("e", "r"), None);
    }
}
