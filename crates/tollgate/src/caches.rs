//! Process-local caches: each (entity, resource)'s shard count, and the reject-only cache of
//! recently seen bucket images (ADR-147).

use std::collections::HashMap;
use std::sync::Mutex;

use tollgate_core::bucket::BucketImage;

type BucketId = (String, String);
type ShardId = (String, String, u32);
type Views = HashMap<ShardId, (i64, BucketImage)>;

/// Most entries either cache keeps before it drops stale ones.
const CAP: usize = 10_000;

/// Cached shard counts, filled by every read or write that sees an item; never lowered.
#[derive(Debug, Default)]
pub struct ShardCounts(Mutex<HashMap<BucketId, i64>>);

impl ShardCounts {
    /// The cached count.
    pub fn get(&self, e: &str, r: &str) -> Option<i64> {
        let g = self.0.lock().unwrap_or_else(|x| x.into_inner());
        g.get(&(e.to_string(), r.to_string())).copied()
    }
    /// Raise the cached count (never lowers it).
    pub fn raise(&self, e: &str, r: &str, s: i64) {
        let mut g = self.0.lock().unwrap_or_else(|x| x.into_inner());
        if g.len() >= CAP * 10 {
            g.clear();
        }
        let v = g.entry((e.to_string(), r.to_string())).or_insert(s);
        *v = (*v).max(s);
    }
    /// Forget an entity's counts (it was deleted).
    pub fn forget_entity(&self, e: &str) {
        let mut g = self.0.lock().unwrap_or_else(|x| x.into_inner());
        g.retain(|(ge, _), _| ge != e);
    }
}

/// ADR-147's reject-only cache: bucket images seen by failed fast writes and slow-path
/// reads, trusted for `ttl_ms`, used only to refuse (never to admit) and to steer draws
/// away from shards known short.
#[derive(Debug, Default)]
pub struct RejectionCache {
    ttl_ms: i64,
    map: Mutex<Views>,
}

impl RejectionCache {
    /// A cache trusting entries for `ttl_ms` (0 disables it).
    pub fn new(ttl_ms: i64) -> Self {
        RejectionCache {
            ttl_ms,
            map: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Views> {
        self.map.lock().unwrap_or_else(|x| x.into_inner())
    }

    /// Remember what a shard looked like at `now`.
    pub fn record(&self, e: &str, r: &str, shard: u32, img: BucketImage, now: i64) {
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
        g.insert((e.into(), r.into(), shard), (now, img));
    }

    /// A trusted view: younger than the TTL, before its `vu`, not past its item TTL.
    pub fn view(&self, e: &str, r: &str, shard: u32, now: i64) -> Option<BucketImage> {
        let g = self.lock();
        let (at, img) = g.get(&(e.to_string(), r.to_string(), shard))?;
        let fresh = now - at < self.ttl_ms && now >= *at;
        let valid = img.vu.is_none_or(|v| v > now) && img.ttl.is_none_or(|t| t > now / 1000);
        (fresh && valid).then(|| img.clone())
    }

    /// Forget one shard (a local credit changed it).
    pub fn forget(&self, e: &str, r: &str, shard: u32) {
        self.lock().remove(&(e.to_string(), r.to_string(), shard));
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
/// whose returned image replaces it, never an over-admission.
#[derive(Debug, Default)]
pub struct ImageCache(Mutex<HashMap<ShardId, BucketImage>>);

impl ImageCache {
    /// The last image of a shard.
    pub fn get(&self, e: &str, r: &str, shard: u32) -> Option<BucketImage> {
        let g = self.0.lock().unwrap_or_else(|x| x.into_inner());
        g.get(&(e.to_string(), r.to_string(), shard)).cloned()
    }
    /// Remember a shard's image.
    pub fn put(&self, e: &str, r: &str, shard: u32, img: BucketImage) {
        let mut g = self.0.lock().unwrap_or_else(|x| x.into_inner());
        if g.len() >= CAP {
            g.clear();
        }
        g.insert((e.to_string(), r.to_string(), shard), img);
    }
    /// Forget one shard.
    pub fn forget(&self, e: &str, r: &str, shard: u32) {
        let mut g = self.0.lock().unwrap_or_else(|x| x.into_inner());
        g.remove(&(e.to_string(), r.to_string(), shard));
    }
    /// Forget everything (administrative writes).
    pub fn clear(&self) {
        self.0.lock().unwrap_or_else(|x| x.into_inner()).clear();
    }
}
