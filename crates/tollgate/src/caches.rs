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
    /// The entry of (entity `e`, resource `r`, `shard`) holding `value`.
    fn new(e: &str, r: &str, shard: u32, value: V) -> Self {
        Slot {
            entity: e.into(),
            resource: r.into(),
            shard,
            value,
        }
    }

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

    /// The table's entry for (e, r, shard): one hash, one probe.
    fn entry(&mut self, e: &str, r: &str, shard: u32) -> hashbrown::hash_table::Entry<'_, Slot<V>> {
        let h = self.hash(e, r, shard);
        let hasher = &self.hasher;
        self.table.entry(
            h,
            |s| s.is(e, r, shard),
            |s| slot_hash(hasher, &s.entity, &s.resource, s.shard),
        )
    }

    /// Insert; the entity's and resource's names are copied only for a new entry.
    pub(crate) fn insert(&mut self, e: &str, r: &str, shard: u32, v: V) {
        match self.entry(e, r, shard) {
            hashbrown::hash_table::Entry::Occupied(mut old) => old.get_mut().value = v,
            hashbrown::hash_table::Entry::Vacant(new) => {
                new.insert(Slot::new(e, r, shard, v));
            }
        }
    }

    /// The value of (e, r, shard), made by `make` when absent (the names copied then only).
    fn get_or_insert_with(
        &mut self,
        e: &str,
        r: &str,
        shard: u32,
        make: impl FnOnce() -> V,
    ) -> &mut V {
        &mut self
            .entry(e, r, shard)
            .or_insert_with(|| Slot::new(e, r, shard, make()))
            .into_mut()
            .value
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

/// Most images, and most gates, the shard cache keeps before it drops them all (and the
/// rejection cache its entries).
const CAP: usize = 10_000;

/// Most shard counts the shard cache keeps before it drops them all.
const COUNT_CAP: usize = CAP * 10;

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

/// What this process keeps of one (entity, resource, shard): the three parts of a
/// [`ShardCache`] share one entry, so an acquire's look-ups of its shard count, image and gate hash the names
/// once into one table and probe one slot — the later ones in a cache line the first one
/// loaded. (Three tables cost three cold probes per acquire at thousands of entities:
/// ~20 % of the warm acquire's samples at 10,000 entities under perf, 2026-12-07.)
#[derive(Debug, Default)]
struct ShardEntry {
    /// The (entity, resource)'s shard count, kept on shard 0's entry only.
    count: Option<i64>,
    /// The shard's last image.
    image: Option<Arc<BucketImage>>,
    /// The shard's write gate.
    gate: Option<Gate>,
}

impl ShardEntry {
    fn is_empty(&self) -> bool {
        self.count.is_none() && self.image.is_none() && self.gate.is_none()
    }
}

/// The shard cache's table and how many entries hold each part (each bounded on its own).
#[derive(Debug, Default)]
struct ShardTable {
    map: ByShard<ShardEntry>,
    counts: usize,
    images: usize,
    gates: usize,
}

impl ShardTable {
    /// The entry of (e, r, shard), made empty when absent.
    fn entry(&mut self, e: &str, r: &str, shard: u32) -> &mut ShardEntry {
        self.map
            .get_or_insert_with(e, r, shard, ShardEntry::default)
    }

    /// Take a part out of every entry (`drop` is given each entry's entity and empties what
    /// it takes), dropping entries left with nothing.
    fn drop_all(&mut self, mut drop: impl FnMut(&str, &mut ShardEntry)) {
        self.map.table.retain(|s| {
            drop(&s.entity, &mut s.value);
            !s.value.is_empty()
        });
    }

    /// Remove (e, r, shard)'s entry if nothing is left in it.
    fn tidy(&mut self, e: &str, r: &str, shard: u32) {
        if self.map.get(e, r, shard).is_some_and(ShardEntry::is_empty) {
            self.map.remove(e, r, shard);
        }
    }

    fn check(&self) {
        debug_assert!(
            self.counts <= COUNT_CAP && self.images <= CAP && self.gates <= CAP,
            "each part stays within its bound"
        );
        debug_assert!(
            self.map.len() <= self.counts + self.images + self.gates,
            "no entry is kept empty"
        );
    }
}

/// The per-shard state this process keeps, in one table by (entity, resource, shard):
///
/// - **shard counts**, filled by every read or write that sees an item and never lowered
///   ([`ShardCache::count`], [`ShardCache::raise`]); kept on shard 0's entry;
/// - **the last image** of each bucket shard this process wrote or was shown by a failed
///   write (`ALL_NEW` / `ALL_OLD`) ([`ShardCache::get`], [`ShardCache::put`]). Used only to
///   plan the next write without reading first (rule "plan from what the store last
///   said"): every write planned from it is conditioned on what it assumes (`rf`, the
///   balances read), so a stale entry costs one failed write, whose returned image
///   replaces it, never an over-admission. Images are shared (`Arc`) with the leases and
///   plans that use them, never copied;
/// - **each shard's write gate** ([`ShardCache::gate`]): rule "one rf-locked writer per
///   shard in a process".
///
/// Each part has its own bound: a new image when [`CAP`] are held drops every image (a new
/// gate, every gate; a new count past [`COUNT_CAP`], every count), as separate caches did.
///
/// It keeps the item shapes it decoded too ([`Shapes`]): an item read or returned for a
/// shard without an image here is decoded by place when another bucket had its shape.
#[derive(Debug, Default)]
pub struct ShardCache {
    table: Mutex<ShardTable>,
    shapes: Shapes,
}

/// A shard's write gate: held by the one task of this process that writes the shard under
/// its rf lock.
pub type Gate = Arc<tokio::sync::Mutex<()>>;

impl ShardCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, ShardTable> {
        self.table.lock().unwrap_or_else(|x| x.into_inner())
    }

    /// The cached shard count of (e, r).
    pub fn count(&self, e: &str, r: &str) -> Option<i64> {
        self.lock().map.get(e, r, 0).and_then(|x| x.count)
    }

    /// Raise the cached shard count of (e, r) (never lowers it).
    pub fn raise(&self, e: &str, r: &str, s: i64) {
        let mut g = self.lock();
        if let Some(v) = g.map.get_mut(e, r, 0).and_then(|x| x.count.as_mut()) {
            *v = (*v).max(s);
            return;
        }
        if g.counts >= COUNT_CAP {
            g.drop_all(|_, x| x.count = None);
            g.counts = 0;
        }
        g.entry(e, r, 0).count = Some(s);
        g.counts += 1;
        g.check();
    }

    /// Forget an entity's shard counts (it was deleted).
    pub fn forget_entity(&self, e: &str) {
        let mut g = self.lock();
        let mut n = 0;
        g.drop_all(|entity, x| {
            if entity == e && x.count.take().is_some() {
                n += 1;
            }
        });
        g.counts -= n;
        g.check();
    }

    /// The item shapes decoded lately.
    pub fn shapes(&self) -> &Shapes {
        &self.shapes
    }

    /// The last image of a shard.
    pub fn get(&self, e: &str, r: &str, shard: u32) -> Option<Arc<BucketImage>> {
        self.lock()
            .map
            .get(e, r, shard)
            .and_then(|x| x.image.clone())
    }

    /// Remember a shard's image.
    pub fn put(&self, e: &str, r: &str, shard: u32, img: impl Into<Arc<BucketImage>>) {
        let img = img.into();
        let mut g = self.lock();
        if let Some(x) = g.map.get_mut(e, r, shard).and_then(|x| x.image.as_mut()) {
            *x = img;
            return;
        }
        if g.images >= CAP {
            g.drop_all(|_, x| x.image = None);
            g.images = 0;
        }
        g.entry(e, r, shard).image = Some(img);
        g.images += 1;
        g.check();
    }

    /// Forget one shard's image.
    pub fn forget(&self, e: &str, r: &str, shard: u32) {
        let mut g = self.lock();
        if g.map.len() == 0 {
            return;
        }
        if g.map
            .get_mut(e, r, shard)
            .and_then(|x| x.image.take())
            .is_some()
        {
            g.images -= 1;
            g.tidy(e, r, shard);
        }
        g.check();
    }

    /// Forget every image (administrative writes); counts and gates stay.
    pub fn clear(&self) {
        let mut g = self.lock();
        g.drop_all(|_, x| x.image = None);
        g.images = 0;
        g.check();
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
        let mut g = self.lock();
        if let Some(gate) = g.map.get(e, r, shard).and_then(|x| x.gate.as_ref()) {
            return Arc::clone(gate);
        }
        if g.gates >= CAP {
            g.drop_all(|_, x| x.gate = None);
            g.gates = 0;
        }
        let gate = Gate::default();
        g.entry(e, r, shard).gate = Some(Arc::clone(&gate));
        g.gates += 1;
        g.check();
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
        assert_eq!(m.len(), 0);
    }

    fn image(pk: &str) -> Arc<BucketImage> {
        let mut item = tollgate_core::value::Item::new();
        tollgate_core::value::Key::new(pk, "#STATE").stamp(&mut item);
        item.insert("rf".into(), tollgate_core::value::Value::N(1));
        Arc::new(BucketImage::decode(&item).expect("a bucket item"))
    }

    /// One entry holds a shard's count, image and gate, and each part keeps the rules the
    /// separate caches had: counts only rise, `clear` drops images alone, `forget` one
    /// shard's image, `forget_entity` one entity's counts, a gate is the same until dropped,
    /// and a new part past its own bound drops every one of that part and nothing else.
    #[test]
    fn one_entry_per_shard_keeps_each_part_under_its_own_rules() {
        let c = ShardCache::default();
        c.raise("e", "r", 2);
        c.raise("e", "r", 1);
        c.raise("e", "s", 4);
        assert_eq!((c.count("e", "r"), c.count("e", "s")), (Some(2), Some(4)));
        assert_eq!(c.count("e", "q"), None);
        let (a, b) = (image("a"), image("b"));
        c.put("e", "r", 0, Arc::clone(&a));
        c.put("e", "r", 1, Arc::clone(&b));
        assert!(Arc::ptr_eq(&c.get("e", "r", 0).expect("put"), &a));
        assert!(Arc::ptr_eq(&c.get("e", "r", 1).expect("put"), &b));
        assert!(c.get("e", "r", 2).is_none());
        let g = c.gate("e", "r", 0);
        assert!(Arc::ptr_eq(&g, &c.gate("e", "r", 0)), "one gate per shard");
        assert!(!Arc::ptr_eq(&g, &c.gate("e", "r", 1)));
        {
            let t = c.lock();
            // (e, r, 0): count, image, gate; (e, r, 1): image, gate; (e, s, 0): count.
            assert_eq!((t.map.len(), t.counts, t.images, t.gates), (3, 2, 2, 2));
        }
        c.forget("e", "r", 1);
        assert!(c.get("e", "r", 1).is_none());
        assert!(Arc::ptr_eq(&c.get("e", "r", 0).expect("kept"), &a));
        c.clear();
        assert!(c.get("e", "r", 0).is_none());
        assert_eq!(c.count("e", "r"), Some(2), "clear drops images only");
        assert!(Arc::ptr_eq(&g, &c.gate("e", "r", 0)), "and keeps gates");
        c.raise("f", "r", 3);
        c.forget_entity("e");
        assert_eq!((c.count("e", "r"), c.count("e", "s")), (None, None));
        assert_eq!(c.count("f", "r"), Some(3));
        {
            let t = c.lock();
            // (e, r, 0) and (e, r, 1): gates; (f, r, 0): count. (e, s, 0) had only a count.
            assert_eq!((t.map.len(), t.counts, t.images, t.gates), (3, 1, 0, 2));
        }

        // The bounds: a new image at CAP drops every image, and only images.
        let c = ShardCache::default();
        c.raise("kept", "r", 5);
        let g = c.gate("kept", "r", 0);
        for i in 0..CAP {
            c.put(&format!("e{i}"), "r", 0, image("x"));
        }
        c.put("e0", "r", 0, image("y"));
        assert_eq!(c.lock().images, CAP, "a replaced image is not a new one");
        c.put("one", "more", 0, image("z"));
        assert_eq!(
            c.lock().images,
            1,
            "a new image at the bound drops every image"
        );
        assert!(c.get("e1", "r", 0).is_none() && c.get("one", "more", 0).is_some());
        assert_eq!(c.count("kept", "r"), Some(5));
        assert!(Arc::ptr_eq(&g, &c.gate("kept", "r", 0)));
        assert_eq!(c.lock().map.len(), 2, "entries left empty are removed");
        for i in 0..CAP - 1 {
            c.gate(&format!("g{i}"), "r", 0);
        }
        assert_eq!(c.lock().gates, CAP, "the kept gate and CAP - 1 new ones");
        assert!(Arc::ptr_eq(&g, &c.gate("kept", "r", 0)));
        c.gate("new", "r", 0);
        assert_eq!(
            c.lock().gates,
            1,
            "a new gate at the bound drops every gate"
        );
        assert!(!Arc::ptr_eq(&g, &c.gate("kept", "r", 0)));
        assert!(c.get("one", "more", 0).is_some() && c.count("kept", "r") == Some(5));
        for i in 0..COUNT_CAP {
            c.raise(&format!("c{i}"), "r", 1);
        }
        assert_eq!(
            c.count("kept", "r"),
            None,
            "a new count at the bound drops every count"
        );
        assert_eq!(c.lock().counts, 1);
        assert!(c.get("one", "more", 0).is_some());
    }
}
