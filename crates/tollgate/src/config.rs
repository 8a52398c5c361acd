//! Stored limits at four levels and their resolution (entity+resource → entity default →
//! resource → system; the first level that defines limits wins whole), with a TTL cache.
//!
//! Rule "stale-while-error": a cached entry past its TTL is refreshed from the store; when
//! that read fails with an outage ([`Error::is_outage`]) and every level needed has an
//! entry at most `stale_max` (default 24 h) past its TTL, those entries are served stale,
//! so an entity keeps its limits and the system's `on_unavailable` keeps deciding through
//! a long outage. The system level's last-read policy is also kept on its own
//! ([`ConfigCache::last_policy`]) for requests the cache cannot resolve at all (an entity
//! first seen during the outage). A misconfiguration or corrupt item is never served
//! around: only an outage is.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use tollgate_core::bucket::SCHED_NONE;
use tollgate_core::error::RuleError;
use tollgate_core::keys;
use tollgate_core::merge::{self, Level, Merge};
use tollgate_core::schedule::Schedule;
use tollgate_core::value::{Item, Key, Value};
use tollgate_core::Limit;
use tollgate_store::{Store, StoreError};

use crate::error::{Error, Result};

/// Where limits are stored.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// System defaults for every entity and resource.
    System,
    /// Defaults of one resource.
    Resource(String),
    /// One entity: for one resource, or for all its resources (`None`).
    Entity(String, Option<String>),
}

impl Scope {
    /// The config item's key.
    pub fn key(&self, ns: &str) -> Key {
        match self {
            Scope::System => keys::system_config(ns),
            Scope::Resource(r) => keys::resource_config(ns, r),
            Scope::Entity(e, r) => {
                keys::entity_config(ns, e, r.as_deref().unwrap_or(keys::DEFAULT_RESOURCE))
            }
        }
    }

    /// Validate the ids in the scope.
    pub fn validate(&self) -> Result<()> {
        match self {
            Scope::System => Ok(()),
            Scope::Resource(r) => Ok(tollgate_core::ids::validate_resource(r)?),
            Scope::Entity(e, r) => {
                tollgate_core::ids::validate_entity_id(e)?;
                if let Some(r) = r {
                    tollgate_core::ids::validate_resource(r)?;
                }
                Ok(())
            }
        }
    }
}

/// The level resolved limits came from. Entity-level limits make buckets that never expire;
/// the others make buckets with a TTL (ADR-119/136).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Passed with the call.
    Override,
    /// Entity + resource.
    Entity,
    /// Entity default.
    EntityDefault,
    /// Resource default.
    Resource,
    /// System default.
    System,
}

/// What the store should do when it cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnUnavailable {
    /// Fail closed: return [`Error::Unavailable`].
    #[default]
    Block,
    /// Fail open: admit with a degraded lease that writes nothing.
    Allow,
}

impl std::str::FromStr for OnUnavailable {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "block" => Ok(OnUnavailable::Block),
            "allow" => Ok(OnUnavailable::Allow),
            _ => Err(format!("on_unavailable is 'block' or 'allow', not {s:?}")),
        }
    }
}

const ON_UNAVAILABLE: &str = "on_unavailable";

/// Encode limits into a config item. Windowed quotas go under `w_` (ADR-142), the rest
/// under `l_`.
pub fn encode(limits: &[Limit], on_unavailable: Option<OnUnavailable>) -> Item {
    let mut i = Item::new();
    for l in limits {
        let p = if l.rsa().is_some() { "w" } else { "l" };
        let n = l.name();
        i.insert(format!("{p}_{n}_cp"), Value::N(l.capacity_milli()));
        i.insert(format!("{p}_{n}_ra"), Value::N(l.ra()));
        i.insert(format!("{p}_{n}_rp"), Value::N(l.rp()));
        if let Some(rsa) = l.rsa() {
            i.insert(format!("{p}_{n}_rsa"), Value::N(rsa));
        }
        if let Some(c) = l.calendar() {
            i.insert(format!("{p}_{n}_rsched"), Value::S(c.expr().into()));
            i.insert(format!("{p}_{n}_tz"), Value::S(c.tz().into()));
        }
        if let Some(s) = l.schedule() {
            i.insert(format!("{p}_{n}_sched"), Value::S(s.encode()));
        }
        if l.is_soft() {
            // ADR-151: absent means enforced (every item written before soft limits).
            i.insert(format!("{p}_{n}_soft"), Value::N(1));
        }
    }
    if let Some(o) = on_unavailable {
        let v = match o {
            OnUnavailable::Block => "block",
            OnUnavailable::Allow => "allow",
        };
        i.insert(ON_UNAVAILABLE.into(), Value::S(v.into()));
    }
    i
}

fn corrupt(key: &str, attribute: &str, reason: &str) -> Error {
    Error::from(RuleError::Corrupt {
        key: key.into(),
        attribute: attribute.into(),
        reason: reason.into(),
    })
}

/// Decode a config item's limits. The same name under both prefixes, a `w_` limit without
/// `rsa`, or a wrong type is corrupt (naming the attribute).
pub fn decode(item: &Item) -> Result<(Vec<Limit>, Option<OnUnavailable>)> {
    let key = Key::of(item).map(|k| k.to_string()).unwrap_or_default();
    let mut by_name: BTreeMap<(String, char), ()> = BTreeMap::new();
    for a in item.keys() {
        for p in ['l', 'w'] {
            if let Some(rest) = a.strip_prefix(&format!("{p}_")) {
                if let Some(n) = rest.strip_suffix("_cp") {
                    by_name.insert((n.to_string(), p), ());
                }
            }
        }
    }
    let mut out = Vec::new();
    for (n, p) in by_name.keys() {
        if *p == 'l' && by_name.contains_key(&(n.clone(), 'w')) {
            return Err(corrupt(
                &key,
                &format!("w_{n}_cp"),
                "limit stored under both l_ and w_",
            ));
        }
        let num = |f: &str| -> Result<Option<i64>> {
            let a = format!("{p}_{n}_{f}");
            match item.get(&a) {
                None => Ok(None),
                Some(Value::N(v)) => Ok(Some(*v)),
                Some(_) => Err(corrupt(&key, &a, "expected a number")),
            }
        };
        let text = |f: &str| -> Result<Option<String>> {
            let a = format!("{p}_{n}_{f}");
            match item.get(&a) {
                None => Ok(None),
                Some(Value::S(v)) => Ok(Some(v.clone())),
                Some(_) => Err(corrupt(&key, &a, "expected a string")),
            }
        };
        let cp = num("cp")?.unwrap_or(0);
        let ra = num("ra")?.unwrap_or(0);
        let rp = num("rp")?.unwrap_or(0);
        let rsa = num("rsa")?;
        if *p == 'w' && rsa.is_none() {
            return Err(corrupt(&key, &format!("w_{n}_rsa"), "missing"));
        }
        let cron = text("rsched")?;
        let tz = text("tz")?.unwrap_or_else(|| "UTC".into());
        let cal = cron.as_deref().map(|c| (c, tz.as_str()));
        let l = Limit::from_parts(n, cp, ra, rp, cal, rsa)
            .map_err(|e| corrupt(&key, &format!("{p}_{n}_cp"), &e.to_string()))?;
        // ADR-135: a stored schedule must decode and fit the limit, or the item is corrupt
        // naming the attribute.
        let l = match text("sched")?.filter(|s| s != SCHED_NONE) {
            None => l,
            Some(raw) => {
                let a = format!("{p}_{n}_sched");
                let sched =
                    Schedule::decode(&raw).map_err(|e| corrupt(&key, &a, &e.to_string()))?;
                l.with_schedule(sched)
                    .map_err(|e| corrupt(&key, &a, &e.to_string()))?
            }
        };
        let soft = match num("soft")? {
            None | Some(0) => false,
            Some(1) => true,
            Some(_) => return Err(corrupt(&key, &format!("{p}_{n}_soft"), "expected 0 or 1")),
        };
        out.push(l.with_soft(soft));
    }
    let on = match item.get(ON_UNAVAILABLE) {
        None => None,
        Some(Value::S(s)) => Some(
            s.parse()
                .map_err(|e: String| corrupt(&key, ON_UNAVAILABLE, &e))?,
        ),
        Some(_) => return Err(corrupt(&key, ON_UNAVAILABLE, "expected a string")),
    };
    Ok((out, on))
}

/// The stored cascade flag of a config or META item: `Some` when explicit, `None` when
/// unset; anything but a BOOL is corrupt (naming the attribute).
pub fn decode_cascade(item: &Item) -> Result<Option<bool>> {
    match item.get(CASCADE) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => {
            let key = Key::of(item).map(|k| k.to_string()).unwrap_or_default();
            Err(corrupt(&key, CASCADE, "expected a boolean"))
        }
    }
}

/// The config item attribute holding the tri-state cascade policy (ADR-146).
pub const CASCADE: &str = "cascade";

/// Config item attribute: merge the limits of the levels beneath (ADR-143).
pub const INHERIT: &str = "inherit_limits";
/// Config item attribute: inherited limit names to drop (a string set, ADR-143).
pub const EXCLUDE: &str = "exclude_limits";
/// Config item attribute: the names whose inherited schedule is patched (a string set,
/// ADR-143); each patch's schedule is stored under `p_{name}_sched`.
pub const PATCH: &str = "patch_limits";

/// Add a level's merge flags to its config item (nothing for the default "replace").
pub fn encode_merge(item: &mut Item, m: &Merge) {
    if m.inherit {
        item.insert(INHERIT.into(), Value::Bool(true));
    }
    if !m.exclude.is_empty() {
        item.insert(EXCLUDE.into(), Value::Ss(m.exclude.clone()));
    }
    if !m.patch.is_empty() {
        item.insert(PATCH.into(), Value::Ss(m.patch.keys().cloned().collect()));
        for (n, s) in &m.patch {
            item.insert(format!("p_{n}_sched"), Value::S(s.encode()));
        }
    }
}

/// A config item's merge flags; a wrong type, or a patched name without a decodable
/// `p_{name}_sched`, is corrupt (naming the attribute).
pub fn decode_merge(item: &Item) -> Result<Merge> {
    let key = Key::of(item).map(|k| k.to_string()).unwrap_or_default();
    let set = |a: &str| -> Result<std::collections::BTreeSet<String>> {
        match item.get(a) {
            None | Some(Value::Null) => Ok(Default::default()),
            Some(Value::Ss(s)) => Ok(s.clone()),
            Some(_) => Err(corrupt(&key, a, "expected a string set")),
        }
    };
    let inherit = match item.get(INHERIT) {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(corrupt(&key, INHERIT, "expected a boolean")),
    };
    let exclude = set(EXCLUDE)?;
    let mut patch = BTreeMap::new();
    for n in set(PATCH)? {
        let a = format!("p_{n}_sched");
        let raw = match item.get(&a) {
            Some(Value::S(v)) => v,
            None => return Err(corrupt(&key, &a, "missing")),
            Some(_) => return Err(corrupt(&key, &a, "expected a string")),
        };
        let s = Schedule::decode(raw).map_err(|e| corrupt(&key, &a, &e.to_string()))?;
        patch.insert(n, s);
    }
    Ok(Merge {
        inherit,
        exclude,
        patch,
    })
}

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
    /// The namespace's registry status (its reverse record only): `None` when the
    /// namespace was never registered or is active.
    ns_closed: Option<String>,
}

/// Resolved limits for one call. Cheap to clone: the limits and their parameter hash are
/// shared with the cache.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The limits.
    pub limits: Arc<[Limit]>,
    /// Their parameter hash ([`tollgate_core::writes::params_hash`]), computed once per
    /// resolution rather than per call.
    pub ph: Arc<str>,
    /// Where they came from.
    pub source: Source,
    /// The system-level `on_unavailable`, if stored.
    pub on_unavailable: Option<OnUnavailable>,
    /// The entity's parent, from its META (`None` without a META or a parent).
    pub parent_id: Option<String>,
    /// The effective cascade policy for (entity, resource) (ADR-146, see
    /// [`crate::cascade::effective_policy`]).
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
    ns: String,
    expires_at: i64,
    resolved: Resolved,
}

/// Whole resolutions by entity, then resource: nested so a lookup by `&str` allocates
/// nothing.
type Wholes = HashMap<String, HashMap<String, Whole>>;

/// Most entities the whole-resolution cache keeps before it is emptied.
const WHOLE_CAP: usize = 100_000;

/// A TTL cache of config items (negative entries included), keyed by item key.
#[derive(Debug, Default)]
pub struct ConfigCache {
    ttl_ms: i64,
    stale_max_ms: i64,
    entries: Mutex<HashMap<Key, Entry>>,
    /// The hit path: a resolution whose levels are all fresh, served without building a
    /// key or copying an entry. Emptied whenever an entry is evicted.
    wholes: Mutex<Wholes>,
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
            entries: Mutex::new(HashMap::new()),
            wholes: Mutex::new(HashMap::new()),
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wholes(&self) -> std::sync::MutexGuard<'_, Wholes> {
        self.wholes.lock().unwrap_or_else(|e| e.into_inner())
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
        *self.last_policy.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Resolve limits for (entity, resource), with the entity's parent and cascade policy:
    /// one eventually consistent batch read of the levels (and the entity's META) not cached.
    pub async fn resolve(
        &self,
        store: &dyn Store,
        ns: &str,
        entity: &str,
        resource: &str,
        now: i64,
    ) -> Result<Resolved> {
        self.resolve_with(store, ns, entity, resource, now, false)
            .await
    }

    /// Rule C3 (ADR-146): resolve (entity, resource) again from the store, every level and
    /// the META read consistently whatever the cache holds; the cache is refreshed with the
    /// answer, which is marked [`Resolved::confirmed`]. Used once when a bucket's cascade
    /// stamp disagrees with the cached policy. Never served stale: an outage is an error.
    pub async fn resolve_confirmed(
        &self,
        store: &dyn Store,
        ns: &str,
        entity: &str,
        resource: &str,
        now: i64,
    ) -> Result<Resolved> {
        self.resolve_with(store, ns, entity, resource, now, true)
            .await
    }

    async fn resolve_with(
        &self,
        store: &dyn Store,
        ns: &str,
        entity: &str,
        resource: &str,
        now: i64,
        confirm: bool,
    ) -> Result<Resolved> {
        if !confirm {
            let g = self.wholes();
            if let Some(w) = g.get(entity).and_then(|m| m.get(resource)) {
                if w.expires_at > now && w.ns == ns {
                    return Ok(w.resolved.clone());
                }
            }
        }
        let levels = [
            (keys::entity_config(ns, entity, resource), Source::Entity),
            (
                keys::entity_config(ns, entity, keys::DEFAULT_RESOURCE),
                Source::EntityDefault,
            ),
            (keys::resource_config(ns, resource), Source::Resource),
            (keys::system_config(ns), Source::System),
        ];
        let meta = keys::entity_meta(ns, entity);
        // The namespace's registry record rides in the same batch read: a soft-deleted
        // namespace refuses acquires without a request of its own.
        let registry = keys::namespace_reverse(ns);
        let wanted: Vec<&Key> = levels
            .iter()
            .map(|(k, _)| k)
            .chain([&meta, &registry])
            .collect();
        // Fresh entries, and the expired ones still within the stale bound.
        let (mut found, stale): (Vec<Option<Entry>>, Vec<Option<Entry>>) = {
            let g = self.lock();
            wanted
                .iter()
                .map(|k| match g.get(*k) {
                    _ if confirm => (None, None),
                    Some(e) if e.expires_at > now => (Some(e.clone()), None),
                    Some(e) if now - e.expires_at <= self.stale_max_ms => (None, Some(e.clone())),
                    _ => (None, None),
                })
                .unzip()
        };
        let missing: Vec<Key> = wanted
            .iter()
            .zip(&found)
            .filter(|(_, f)| f.is_none())
            .map(|(k, _)| (*k).clone())
            .collect();
        let mut unreachable = None;
        let read = if missing.is_empty() {
            None
        } else {
            match store
                .batch_get(&missing, confirm)
                .await
                .map_err(Error::from)
            {
                Ok(items) => Some(items),
                Err(e) => {
                    let covered = found
                        .iter()
                        .zip(&stale)
                        .all(|(f, s)| f.is_some() || s.is_some());
                    if !(e.is_outage() && covered) {
                        return Err(e);
                    }
                    tracing::warn!(error = %e, entity, resource, "store unavailable: serving cached limits past their TTL (stale-while-error)");
                    if let Error::Unavailable(StoreError::Unavailable(m)) = &e {
                        unreachable = Some(m.clone());
                    }
                    for (f, s) in found.iter_mut().zip(stale) {
                        if f.is_none() {
                            *f = s;
                        }
                    }
                    None
                }
            }
        };
        if let Some(items) = read {
            let mut g = self.lock();
            for (k, item) in missing.iter().zip(items) {
                let empty = Entry {
                    expires_at: now + self.ttl_ms,
                    limits: Vec::new(),
                    on_unavailable: None,
                    cascade: None,
                    parent_id: None,
                    merge: Merge::default(),
                    ns_closed: None,
                };
                let e = match item {
                    Some(i) if *k == registry => Entry {
                        ns_closed: i
                            .get("status")
                            .and_then(Value::as_s)
                            .filter(|s| *s != "active")
                            .map(str::to_string),
                        ..empty
                    },
                    Some(i) if *k == meta => Entry {
                        cascade: decode_cascade(&i)?,
                        parent_id: i.get("parent_id").and_then(Value::as_s).map(str::to_string),
                        ..empty
                    },
                    Some(i) => {
                        let (limits, on) = decode(&i)?;
                        Entry {
                            limits,
                            on_unavailable: on,
                            cascade: decode_cascade(&i)?,
                            merge: decode_merge(&i)?,
                            ..empty
                        }
                    }
                    None if *k == registry && self.registered => Entry {
                        ns_closed: Some("purged".into()),
                        ..empty
                    },
                    None => empty,
                };
                if *k == levels[3].0 {
                    *self.last_policy.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some((e.on_unavailable, now));
                }
                if self.ttl_ms > 0 || self.stale_max_ms > 0 {
                    g.insert(k.clone(), e.clone());
                }
                if let Some(pos) = wanted.iter().position(|w| *w == k) {
                    found[pos] = Some(e);
                }
            }
        }
        debug_assert!(found.iter().all(Option::is_some), "every level resolved");
        if let Some(status) = found[5].as_ref().and_then(|e| e.ns_closed.clone()) {
            return Err(Error::NamespaceDeleted {
                namespace: ns.into(),
                status,
            });
        }
        let on_unavailable = found[3].as_ref().and_then(|e| e.on_unavailable);
        let meta = found[4].take();
        let parent_id = meta.as_ref().and_then(|e| e.parent_id.clone());
        let walk = [0, 1, 2].map(|i| found[i].as_ref().and_then(|e| e.cascade));
        let cascade = crate::cascade::effective_policy(
            walk,
            meta.as_ref().and_then(|e| e.cascade),
            parent_id.as_deref(),
        );
        // The earliest expiry of the levels used: the whole resolution is valid until then.
        // Served stale, it is not kept.
        let expires_at = found
            .iter()
            .flatten()
            .map(|e| e.expires_at)
            .chain(meta.as_ref().map(|e| e.expires_at))
            .min()
            .unwrap_or(now);
        let fresh = unreachable.is_none() && expires_at > now && self.ttl_ms > 0;
        // ADR-143: the levels merged (by default the first that defines limits wins whole).
        let merged = merge::merge_levels(&[0, 1, 2, 3].map(|i| {
            found[i].as_ref().map(|e| Level {
                limits: &e.limits,
                merge: &e.merge,
            })
        }))
        .map_err(|e| Error::LimitsConflict {
            entity: entity.into(),
            resource: resource.into(),
            reason: e.to_string(),
        })?;
        let source = merged
            .source
            .and_then(|i| levels.get(i))
            .map_or(Source::System, |(_, s)| *s);
        let limits = merged.limits;
        let resolved = Resolved {
            ph: tollgate_core::writes::params_hash(&limits).into(),
            limits: limits.into(),
            source,
            on_unavailable,
            parent_id,
            cascade,
            unreachable,
            // A cache that keeps nothing serves no stale policy: every resolution is fresh.
            confirmed: confirm || self.ttl_ms == 0,
        };
        if fresh {
            let mut g = self.wholes();
            if g.len() >= WHOLE_CAP {
                g.clear();
            }
            g.entry(entity.to_string()).or_default().insert(
                resource.to_string(),
                Whole {
                    ns: ns.to_string(),
                    expires_at,
                    resolved: resolved.clone(),
                },
            );
        }
        Ok(resolved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// ADR-135: a schedule round-trips through a config item; a stored schedule that cannot
    /// be evaluated, or that sets a rate on a quota, is corrupt naming the attribute.
    #[test]
    fn schedule_round_trip_and_corruption() {
        use tollgate_core::schedule::Schedule;
        let night = || Schedule::new(&["* 22:00-06:00 10/10"], "Europe/Berlin").unwrap();
        let limits = vec![
            Limit::per_minute("rpm", 100)
                .unwrap()
                .with_schedule(night())
                .unwrap(),
            Limit::quota_after("session", 10, Duration::from_secs(18_000))
                .unwrap()
                .with_schedule(Schedule::new(&["sat,sun 00:00-24:00 5"], "UTC").unwrap())
                .unwrap(),
        ];
        let item = encode(&limits, None);
        assert_eq!(
            item.get("l_rpm_sched"),
            Some(&Value::S("1|Europe/Berlin|* 22:00-06:00 10/10".into()))
        );
        assert!(item.contains_key("w_session_sched"));
        let (mut back, _) = decode(&item).unwrap();
        back.sort_by(|a, b| a.name().cmp(b.name()));
        assert_eq!(back, limits);
        for (attr, bad) in [
            ("l_rpm_sched", Value::S("1|UTC|* 25:00-06:00 10".into())),
            ("l_rpm_sched", Value::S("9|UTC|* 22:00-06:00 10".into())),
            ("l_rpm_sched", Value::N(3)),
            (
                "w_session_sched",
                Value::S("1|UTC|* 22:00-06:00 5/5".into()),
            ),
        ] {
            let mut i = item.clone();
            i.insert(attr.into(), bad);
            let e = decode(&i).unwrap_err().to_string();
            assert!(e.contains(attr), "{e}");
        }
        // The "no schedule" marker reads as none.
        let mut i = item.clone();
        i.insert("l_rpm_sched".into(), Value::S("-".into()));
        let (back, _) = decode(&i).unwrap();
        assert!(back
            .iter()
            .any(|l| l.name() == "rpm" && l.schedule().is_none()));
    }

    #[test]
    fn round_trip_and_corruption() {
        let limits = vec![
            Limit::per_minute("rpm", 100).unwrap(),
            Limit::quota_calendar("rpd", 1000, "0 0 * * *", "Europe/Berlin").unwrap(),
            Limit::quota_after("session", 10, Duration::from_secs(18_000)).unwrap(),
        ];
        let mut item = encode(&limits, Some(OnUnavailable::Allow));
        assert!(item.contains_key("w_session_rsa"));
        let (mut back, on) = decode(&item).unwrap();
        back.sort_by(|a, b| a.name().cmp(b.name()));
        let mut want = limits.clone();
        want.sort_by(|a, b| a.name().cmp(b.name()));
        assert_eq!(back, want);
        assert_eq!(on, Some(OnUnavailable::Allow));
        item.insert("l_session_cp".into(), Value::N(5));
        let e = decode(&item).unwrap_err().to_string();
        assert!(e.contains("w_session_cp"), "{e}");
        let mut item = encode(&limits, None);
        item.remove("w_session_rsa");
        assert!(decode(&item)
            .unwrap_err()
            .to_string()
            .contains("w_session_rsa"));
        let mut item = encode(&limits, None);
        item.insert("l_rpm_ra".into(), Value::S("x".into()));
        assert!(decode(&item).unwrap_err().to_string().contains("l_rpm_ra"));
    }
}
