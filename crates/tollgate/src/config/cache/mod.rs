//! [`ConfigCache`]: the TTL cache of config items and whole resolutions, and what a
//! resolution answers ([`Resolved`]); the resolution itself is in `resolve`.

mod resolve;

use crate::caches::Map;
use std::sync::{Arc, Mutex};

use tollgate_core::bypass::Enforcement;
use tollgate_core::merge::Merge;
use tollgate_core::value::Key;
use tollgate_core::Limit;

use super::{OnUnavailable, Source};

#[derive(Debug, Clone)]
struct Entry {
    expires_at: i64,
    limits: Vec<Limit>,
    on_unavailable: Option<OnUnavailable>,
    /// The item's explicit `cascade` (config levels and META).
    cascade: Option<bool>,
    /// The entity's parent (META only).
    parent_id: Option<String>,
    /// The level's merge flags (config levels only, ADR-143).
    merge: Merge,
    /// The level's mode (config levels only, ADR-151).
    enforcement: Option<Enforcement>,
    /// The namespace's registry status (its reverse record only): `None` when the
    /// namespace was never registered or is active.
    ns_closed: Option<String>,
}

/// Resolved limits for one call. Cheap to clone: the limits and their parameter hash are
/// shared with the cache.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The entity and resource resolved for, shared: a request made from a cached
    /// resolution copies no text.
    pub entity: Arc<str>,
    /// See `entity`.
    pub resource: Arc<str>,
    /// The limits.
    pub limits: Arc<[Limit]>,
    /// Their parameter hash ([`tollgate_core::writes::params_hash`]) with the mode
    /// ([`tollgate_core::bypass::policy_hash`]), computed once per resolution rather than
    /// per call.
    pub params_hash: Arc<str>,
    /// Where they came from.
    pub source: Source,
    /// The system-level `on_unavailable`, if stored.
    pub on_unavailable: Option<OnUnavailable>,
    /// The entity's parent, from its META (`None` without a META or a parent).
    pub parent_id: Option<String>,
    /// The (entity, resource)'s mode, from the most specific config level that sets one
    /// (`tollgate_core::bypass::scope_mode`); `None` when no level does.
    pub mode: Option<Enforcement>,
    /// The effective cascade policy for (entity, resource) (ADR-146, see
    /// [`tollgate_core::cascade::effective_policy`]).
    pub cascade: bool,
    /// Served stale because the store could not be reached (not merely throttled): the
    /// error's message. An acquire then answers by the policy at once rather than spend
    /// another deadline on a write to the same unreachable store.
    pub unreachable: Option<String>,
    /// The answer of a C3 re-read ([`ConfigCache::resolve_confirmed`]), or of a cache that
    /// keeps nothing (TTL 0): a bucket stamp that disagrees with it is the stale one and
    /// asks for no further re-read.
    pub confirmed: bool,
}

/// A whole resolution kept for its (entity, resource): valid while every level it was
/// made of is fresh, i.e. until the earliest of their expiries.
#[derive(Debug)]
struct Whole {
    /// Held in the entry (a namespace name is short): compared on every hit, a boxed name
    /// was one more cold line per look-up at thousands of entities.
    ns: compact_str::CompactString,
    expires_at: i64,
    resolved: Resolved,
}

/// The limits, parameter hashes and resource names of the resolutions made, kept once:
/// every entity under a resource's limits resolves to the same limits, and its resolution
/// shares that one copy (`Arc`) instead of holding its own. An acquire reads its
/// resolution's limits and hash, and counts references to them; one copy per entity was
/// several cold cache lines per acquire at thousands of entities (cachegrind, warm acquire
/// at 10,000 entities). Bounded: at [`SHARED_CAP`] policies or resource names it starts
/// over (resolutions already made keep their copies).
#[derive(Debug, Default)]
struct Shared {
    /// Limits by their parameter hash (with the mode); equal limits checked before sharing.
    policies: Map<Arc<str>, Arc<[Limit]>>,
    /// Resource names.
    resources: Map<Arc<str>, ()>,
}

/// The most policies, and the most resource names, [`Shared`] keeps.
const SHARED_CAP: usize = 4_096;

impl Shared {
    /// The shared copies of `limits` and their hash `hash`: those kept when equal, else
    /// these, kept from now on.
    fn policy(&mut self, hash: String, limits: Vec<Limit>) -> (Arc<str>, Arc<[Limit]>) {
        if let Some((h, l)) = self.policies.get_key_value(hash.as_str()) {
            if l[..] == limits[..] {
                return (Arc::clone(h), Arc::clone(l));
            }
            // Equal hashes of different limits: not shared (nor kept over the first).
            return (hash.into(), limits.into());
        }
        if self.policies.len() >= SHARED_CAP {
            self.policies.clear();
        }
        let (h, l): (Arc<str>, Arc<[Limit]>) = (hash.into(), limits.into());
        self.policies.insert(Arc::clone(&h), Arc::clone(&l));
        (h, l)
    }

    /// The shared copy of the resource name `r`.
    fn resource(&mut self, r: &str) -> Arc<str> {
        if let Some((k, ())) = self.resources.get_key_value(r) {
            return Arc::clone(k);
        }
        if self.resources.len() >= SHARED_CAP {
            self.resources.clear();
        }
        let k: Arc<str> = r.into();
        self.resources.insert(Arc::clone(&k), ());
        k
    }
}

/// Whole resolutions by (entity, resource): shard 0 of a flat table (one hash, one probe; a
/// lookup by `&str` allocates nothing).
type Wholes = crate::caches::ByShard<Whole>;

/// Most (entity, resource) pairs the whole-resolution cache keeps before it is emptied.
const WHOLE_CAP: usize = 100_000;

/// A TTL cache of config items (negative entries included), keyed by item key.
#[derive(Debug, Default)]
pub struct ConfigCache {
    ttl_ms: i64,
    stale_max_ms: i64,
    entries: Mutex<Map<Key, Entry>>,
    /// The hit path: a resolution whose levels are all fresh, served without building a
    /// key or copying an entry. Emptied whenever an entry is evicted.
    wholes: Mutex<Wholes>,
    /// The texts resolutions share (see [`Shared`]).
    shared: Mutex<Shared>,
    /// The system level's `on_unavailable` as last read, and when (ms).
    last_policy: Mutex<Option<(Option<OnUnavailable>, i64)>>,
    /// The namespace was resolved from the registry: a missing registry record means it
    /// was purged (a namespace never registered, the library's plain prefix, has none).
    registered: bool,
}

impl ConfigCache {
    /// Treat a missing registry record of the namespace as purged (see
    /// [`crate::LimiterBuilder::open_namespace`]).
    pub fn registered(mut self, on: bool) -> Self {
        self.registered = on;
        self
    }

    /// A cache whose entries live `ttl_ms` (0 disables caching; entries are still kept
    /// to be served stale during an outage, see [`ConfigCache::with_stale_max`]).
    pub fn new(ttl_ms: i64) -> Self {
        ConfigCache {
            ttl_ms,
            stale_max_ms: 0,
            entries: Mutex::new(Map::default()),
            wholes: Mutex::new(Wholes::default()),
            shared: Mutex::new(Shared::default()),
            last_policy: Mutex::new(None),
            registered: false,
        }
    }

    /// Serve entries up to `ms` past their TTL while the store cannot be read.
    pub fn with_stale_max(mut self, ms: i64) -> Self {
        self.stale_max_ms = ms.max(0);
        self
    }

    /// The system level's `on_unavailable` as last read from the store, if that read is at
    /// most `stale_max` old at `now`: the policy for a request whose config could not be
    /// resolved because the store is down.
    pub fn last_policy(&self, now: i64) -> Option<OnUnavailable> {
        let g = self.last_policy.lock().unwrap_or_else(|e| e.into_inner());
        g.and_then(|(p, at)| {
            (now.saturating_sub(at) <= self.ttl_ms.saturating_add(self.stale_max_ms))
                .then_some(p)
                .flatten()
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Map<Key, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wholes(&self) -> std::sync::MutexGuard<'_, Wholes> {
        self.wholes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forget one config item (and every whole resolution, which may have used it).
    pub fn evict(&self, key: &Key) {
        self.lock().remove(key);
        self.wholes().clear();
    }

    /// Forget everything (the last-read system policy included).
    pub fn clear(&self) {
        self.lock().clear();
        self.wholes().clear();
        *self.shared() = Shared::default();
        *self.last_policy.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(rate: i64) -> Vec<Limit> {
        vec![Limit::per_second("rps", rate).expect("a valid limit")]
    }

    #[test]
    fn equal_policies_share_one_copy_and_unequal_ones_do_not() {
        let mut s = Shared::default();
        let (h1, l1) = s.policy("h".into(), limits(10));
        let (h2, l2) = s.policy("h".into(), limits(10));
        assert!(Arc::ptr_eq(&h1, &h2) && Arc::ptr_eq(&l1, &l2));
        // The same hash over other limits (a collision): its own copy, the first kept.
        let (h3, l3) = s.policy("h".into(), limits(20));
        assert!(!Arc::ptr_eq(&l1, &l3) && !Arc::ptr_eq(&h1, &h3));
        assert_eq!(l3[..], limits(20)[..]);
        let (_, l4) = s.policy("h".into(), limits(10));
        assert!(Arc::ptr_eq(&l1, &l4));
        let (a, b) = (s.resource("api"), s.resource("api"));
        assert!(Arc::ptr_eq(&a, &b) && &*a == "api");
    }

    #[test]
    fn the_shared_copies_are_bounded() {
        let mut s = Shared::default();
        for i in 0..SHARED_CAP + 10 {
            s.policy(format!("h{i}"), limits(10));
            s.resource(&format!("r{i}"));
        }
        assert!(s.policies.len() <= SHARED_CAP && s.resources.len() <= SHARED_CAP);
    }
}
