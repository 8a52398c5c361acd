//! The `Limiter`: acquire / lease / check_availability / administration over any Store.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value as Json;
use tollgate_core::expr::Condition;
use tollgate_core::ids::{validate_entity_id, validate_limit_name};
use tollgate_core::keys;
use tollgate_core::merge::Merge;
use tollgate_core::value::{Item, Key, Value};
use tollgate_core::{Limit, RuleError};
use tollgate_store::{DeleteRequest, PutRequest, Query, Store, StoreError, TransactOp};

use crate::audit::{self, Action, ConfigWrite, Target};
use crate::caches::{ImageCache, RejectionCache, ShardCounts};
use crate::clock::{Clock, SeededRng, ShardRng, SystemClock};
use crate::config::{self, ConfigCache, OnUnavailable, Scope};
use crate::doctor::{self, CorruptItem, Repair};
use crate::error::{Error, Result};

/// Limiter settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// Namespace prefix of every key.
    pub namespace: String,
    /// How long resolved limits are cached (0 disables the cache).
    pub config_cache_ttl: Duration,
    /// How long past its TTL a config entry is still served while the store cannot be
    /// read (rule "stale-while-error", see `config`): the limits and the system's
    /// `on_unavailable` hold through an outage up to this long (default 24 h; 0: never
    /// served stale).
    pub config_stale_max: Duration,
    /// Policy when the store cannot be reached and the system config says nothing.
    pub on_unavailable: OnUnavailable,
    /// Use the speculative fast path (one conditional write, no read).
    pub speculative: bool,
    /// TTL multiplier for buckets whose limits come from defaults (0: no TTL).
    pub ttl_multiplier: i64,
    /// How long a seen bucket may refuse requests locally (0 disables it).
    pub rejection_cache_ttl: Duration,
    /// The most shards this client doubles an entity's resource to (1 to 32).
    pub max_shard_count: i64,
    /// How long audit records are kept (their `ttl`; see the `audit` module).
    pub audit_retention: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            namespace: "default".into(),
            config_cache_ttl: Duration::from_secs(60),
            config_stale_max: Duration::from_secs(24 * 3600),
            on_unavailable: OnUnavailable::Block,
            speculative: true,
            ttl_multiplier: 7,
            rejection_cache_ttl: Duration::from_secs(1),
            max_shard_count: tollgate_core::bucket::MAX_SHARD_COUNT,
            audit_retention: crate::audit::DEFAULT_RETENTION,
        }
    }
}

/// Counters of what the limiter did (not store requests: see `tollgate_store::Counting`).
#[derive(Debug, Default)]
pub struct Stats {
    pub(crate) fast_admits: AtomicU64,
    pub(crate) slow_admits: AtomicU64,
    pub(crate) rejections: AtomicU64,
    pub(crate) local_rejections: AtomicU64,
    pub(crate) doublings: AtomicU64,
    pub(crate) fanout_writes: AtomicU64,
    pub(crate) fanout_failures: AtomicU64,
    pub(crate) degraded: AtomicU64,
}

/// A snapshot of [`Stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StatsSnapshot {
    /// Admitted by the speculative write.
    pub fast_admits: u64,
    /// Admitted by the slow path (read + rf-locked write, create or retry).
    pub slow_admits: u64,
    /// Refused.
    pub rejections: u64,
    /// Refused with no store request (rejection cache).
    pub local_rejections: u64,
    /// Shard-count doublings this process won.
    pub doublings: u64,
    /// Rollover fan-out writes that landed.
    pub fanout_writes: u64,
    /// Rollover fan-out writes refused by their condition or failed.
    pub fanout_failures: u64,
    /// Degraded (fail-open) leases.
    pub degraded: u64,
}

impl Stats {
    pub(crate) fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
    fn snapshot(&self) -> StatsSnapshot {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            fast_admits: l(&self.fast_admits),
            slow_admits: l(&self.slow_admits),
            rejections: l(&self.rejections),
            local_rejections: l(&self.local_rejections),
            doublings: l(&self.doublings),
            fanout_writes: l(&self.fanout_writes),
            fanout_failures: l(&self.fanout_failures),
            degraded: l(&self.degraded),
        }
    }
}

/// Shared state behind a [`Limiter`] handle.
pub struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) rng: Arc<dyn ShardRng>,
    pub(crate) opts: Options,
    pub(crate) config: ConfigCache,
    pub(crate) shards: ShardCounts,
    pub(crate) rejections: RejectionCache,
    pub(crate) images: ImageCache,
    pub(crate) stats: Stats,
    /// Closure records of shared leases to delete later (stores without native TTL).
    pub(crate) closures: crate::lease_token::Closures,
    /// Ids of audit records.
    pub(crate) audit_ids: crate::audit::AuditIds,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("backend", &self.store.backend())
            .field("opts", &self.opts)
            .finish()
    }
}

impl Inner {
    pub(crate) fn ns(&self) -> &str {
        &self.opts.namespace
    }
}

/// What [`Limiter::delete_entity_with_repairs`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct EntityDeleted {
    /// Items deleted (0 if the entity did not exist).
    pub deleted_items: usize,
    /// The corrupt items among them.
    pub repairs: Vec<Repair>,
}

/// The rate limiter. Cheap to clone; every clone shares caches and the store.
#[derive(Debug, Clone)]
pub struct Limiter {
    pub(crate) inner: Arc<Inner>,
    /// Whom administrative changes are recorded for (see [`Limiter::acting_as`]).
    pub(crate) principal: Arc<str>,
}

/// Builds a [`Limiter`].
pub struct LimiterBuilder {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    rng: Arc<dyn ShardRng>,
    opts: Options,
    principal: String,
    audit_seed: u64,
    /// Opened from the namespace registry (see `open_namespace`).
    pub(crate) registered: bool,
}

impl LimiterBuilder {
    /// Whom administrative changes are recorded for (default
    /// [`crate::audit::DEFAULT_PRINCIPAL`]; per call, [`Limiter::acting_as`]).
    pub fn principal(mut self, p: &str) -> Self {
        self.principal = p.into();
        self
    }
    /// Seed the random part of audit record ids (default: a random seed). A simulation
    /// that replays a seed exactly sets it.
    pub fn audit_seed(mut self, seed: u64) -> Self {
        self.audit_seed = seed;
        self
    }
    /// How long audit records are kept (default 90 days).
    pub fn audit_retention(mut self, d: Duration) -> Self {
        self.opts.audit_retention = d;
        self
    }
    /// Inject a clock.
    pub fn clock(mut self, c: Arc<dyn Clock>) -> Self {
        self.clock = c;
        self
    }
    /// Inject the shard-draw RNG.
    pub fn rng(mut self, r: Arc<dyn ShardRng>) -> Self {
        self.rng = r;
        self
    }
    /// Set every option.
    pub fn options(mut self, o: Options) -> Self {
        self.opts = o;
        self
    }
    /// Namespace.
    pub fn namespace(mut self, ns: &str) -> Self {
        self.opts.namespace = ns.into();
        self
    }
    /// Config cache TTL.
    pub fn config_cache_ttl(mut self, ttl: Duration) -> Self {
        self.opts.config_cache_ttl = ttl;
        self
    }
    /// Bound every store request by `d` (`tollgate_store::Deadline`): a hung store becomes
    /// an outage within `d` and the `on_unavailable` policy decides (a read that ran out is
    /// `Unavailable`, a write `Ambiguous`). For an acquire path, about 1 s.
    pub fn store_timeout(mut self, d: Duration) -> Self {
        self.store = Arc::new(tollgate_store::Deadline::new(self.store, d));
        self
    }
    /// How long past its TTL a config entry is served while the store cannot be read.
    pub fn config_stale_max(mut self, d: Duration) -> Self {
        self.opts.config_stale_max = d;
        self
    }
    /// Default fail-open / fail-closed policy.
    pub fn on_unavailable(mut self, o: OnUnavailable) -> Self {
        self.opts.on_unavailable = o;
        self
    }
    /// Enable or disable the speculative fast path.
    pub fn speculative(mut self, on: bool) -> Self {
        self.opts.speculative = on;
        self
    }
    /// Rejection cache TTL (0 disables it).
    pub fn rejection_cache_ttl(mut self, ttl: Duration) -> Self {
        self.opts.rejection_cache_ttl = ttl;
        self
    }
    /// TTL multiplier for buckets whose limits come from defaults (0: no TTL; a negative
    /// value counts as 0).
    pub fn ttl_multiplier(mut self, m: i64) -> Self {
        self.opts.ttl_multiplier = m.max(0);
        self
    }
    /// The most shards this client doubles an entity's resource to (1 to 32; a value out
    /// of range is clamped into it).
    pub fn max_shard_count(mut self, n: i64) -> Self {
        self.opts.max_shard_count = n.clamp(1, tollgate_core::bucket::MAX_SHARD_COUNT);
        self
    }
    /// The store the limiter will use.
    pub(crate) fn store_handle(&self) -> Arc<dyn Store> {
        self.store.clone()
    }
    /// Build.
    pub fn build(self) -> Result<Limiter> {
        validate_entity_id(&self.opts.namespace)?;
        crate::audit::validate_principal(&self.principal)?;
        let ttl_ms = i64::try_from(self.opts.config_cache_ttl.as_millis()).unwrap_or(i64::MAX);
        let rej_ms = i64::try_from(self.opts.rejection_cache_ttl.as_millis()).unwrap_or(i64::MAX);
        let stale_ms = i64::try_from(self.opts.config_stale_max.as_millis()).unwrap_or(i64::MAX);
        Ok(Limiter {
            inner: Arc::new(Inner {
                store: self.store,
                clock: self.clock,
                rng: self.rng,
                config: ConfigCache::new(ttl_ms)
                    .with_stale_max(stale_ms)
                    .registered(self.registered),
                shards: ShardCounts::default(),
                rejections: RejectionCache::new(rej_ms),
                images: ImageCache::default(),
                stats: Stats::default(),
                closures: Default::default(),
                audit_ids: crate::audit::AuditIds::new(self.audit_seed),
                opts: self.opts,
            }),
            principal: Arc::from(self.principal.as_str()),
        })
    }
}

/// An entity from its META item.
fn entity_of(id: &str, i: &Item) -> Result<Entity> {
    let s = |a: &str| i.get(a).and_then(Value::as_s).map(str::to_string);
    let metadata = match i.get("metadata") {
        Some(Value::M(m)) => m
            .iter()
            .filter_map(|(k, v)| v.as_s().map(|v| (k.clone(), v.to_string())))
            .collect(),
        _ => BTreeMap::new(),
    };
    Ok(Entity {
        id: id.into(),
        name: s("name").unwrap_or_else(|| id.into()),
        parent_id: s("parent_id"),
        cascade: config::decode_cascade(i)?.unwrap_or(false),
        metadata,
        created_at_ms: i.get("created_at").and_then(Value::as_n).unwrap_or(0),
    })
}

/// The "before" of an entity's deletion: its META (as the entity, `null` without one), the
/// limits stored for it per resource, and how many items were deleted.
fn entity_image(id: &str, images: &[(Key, Option<Item>)]) -> Json {
    let mut entity = Json::Null;
    let mut limits = serde_json::Map::new();
    for (k, item) in images {
        let Some(item) = item else { continue };
        if k.sk == keys::META {
            entity = match entity_of(id, item) {
                Ok(e) => serde_json::to_value(e).unwrap_or_default(),
                Err(err) => serde_json::json!({ "corrupt": err.to_string() }),
            };
        } else if let Some(r) = k.sk.strip_prefix("#CONFIG#") {
            limits.insert(r.into(), audit::config_image(Some(item)));
        }
    }
    serde_json::json!({ "entity": entity, "limits": limits, "items": images.len() })
}

fn replaced_action(cascade_dropped: bool) -> String {
    let mut a = String::from("replaced by the new limits");
    if cascade_dropped {
        a.push_str(" (its cascade policy could not be read and was not kept)");
    }
    a
}

fn deleted_action(cascade_lost: bool) -> String {
    let mut a = String::from("deleted");
    if cascade_lost {
        a.push_str(" (its cascade policy could not be read and was not kept)");
    }
    a
}

/// An entity (a user, key or tenant).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Entity {
    /// Id.
    pub id: String,
    /// Display name (defaults to the id).
    pub name: String,
    /// Parent entity, if any.
    pub parent_id: Option<String>,
    /// The entity's base cascade policy (META `cascade`, ADR-146): whether its acquires
    /// also debit the parent where no config level says otherwise.
    #[serde(default)]
    pub cascade: bool,
    /// Free-form metadata.
    pub metadata: BTreeMap<String, String>,
    /// Creation time (epoch ms).
    pub created_at_ms: i64,
}

/// Options of [`Limiter::create_entity_with`].
#[derive(Debug, Clone, Default)]
pub struct NewEntity<'a> {
    /// Display name (defaults to the id).
    pub name: Option<&'a str>,
    /// Parent entity, if any.
    pub parent_id: Option<&'a str>,
    /// Base cascade policy (META `cascade`, ADR-146).
    pub cascade: bool,
    /// Free-form metadata.
    pub metadata: BTreeMap<String, String>,
}

impl Limiter {
    /// Start building a limiter over `store`.
    pub fn builder(store: Arc<dyn Store>) -> LimiterBuilder {
        LimiterBuilder {
            store,
            clock: Arc::new(SystemClock),
            rng: Arc::new(SeededRng::new(rand::random())),
            opts: Options::default(),
            principal: crate::audit::DEFAULT_PRINCIPAL.into(),
            audit_seed: rand::random(),
            registered: false,
        }
    }

    /// A limiter over `store` with default options.
    pub fn new(store: Arc<dyn Store>) -> Result<Self> {
        Self::builder(store).build()
    }

    /// What the limiter did so far.
    pub fn stats(&self) -> StatsSnapshot {
        self.inner.stats.snapshot()
    }

    /// The store's backend name.
    pub fn backend(&self) -> &'static str {
        self.inner.store.backend()
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Now, by the injected clock.
    pub fn now_ms(&self) -> i64 {
        self.inner.clock.now_ms()
    }

    /// Create an entity (without cascade). Fails with [`Error::EntityExists`] if it exists.
    pub async fn create_entity(
        &self,
        id: &str,
        name: Option<&str>,
        parent_id: Option<&str>,
        metadata: BTreeMap<String, String>,
    ) -> Result<Entity> {
        self.create_entity_with(
            id,
            NewEntity {
                name,
                parent_id,
                cascade: false,
                metadata,
            },
        )
        .await
    }

    /// Create an entity with every option. Fails with [`Error::EntityExists`] if it exists.
    /// The parent's existence is not checked.
    pub async fn create_entity_with(&self, id: &str, new: NewEntity<'_>) -> Result<Entity> {
        let NewEntity {
            name,
            parent_id,
            cascade,
            metadata,
        } = new;
        validate_entity_id(id)?;
        if let Some(p) = parent_id {
            validate_entity_id(p)?;
            if p == id {
                return Err(Error::Invalid(RuleError::InvalidIdentifier {
                    value: p.into(),
                    reason: "an entity cannot be its own parent",
                }));
            }
        }
        let ns = self.inner.ns();
        let e = Entity {
            id: id.into(),
            name: name.unwrap_or(id).into(),
            parent_id: parent_id.map(str::to_string),
            cascade,
            metadata,
            created_at_ms: self.now_ms(),
        };
        let mut item = Item::new();
        item.insert("entity_id".into(), e.id.clone().into());
        item.insert("name".into(), e.name.clone().into());
        item.insert("created_at".into(), Value::N(e.created_at_ms));
        item.insert(config::CASCADE.into(), Value::Bool(e.cascade));
        item.insert(
            "metadata".into(),
            Value::M(
                e.metadata
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::S(v.clone())))
                    .collect(),
            ),
        );
        match &e.parent_id {
            Some(p) => {
                item.insert("parent_id".into(), p.clone().into());
                item.insert("GSI1PK".into(), keys::gsi1_parent(ns, p).into());
                item.insert("GSI1SK".into(), format!("CHILD#{id}").into());
            }
            None => {
                item.insert("parent_id".into(), Value::Null);
            }
        }
        let target = Target::Entity {
            entity: id.into(),
            resource: None,
        };
        let after = serde_json::to_value(&e).unwrap_or_default();
        let record = self.audit_record(Action::EntityCreate, &target, Json::Null, after);
        item.insert(audit::AUDIT_ID.into(), Value::S(record.id.clone()));
        let put = TransactOp::Put(PutRequest {
            key: keys::entity_meta(ns, id),
            item,
            condition: Some(Condition::not_exists("PK")),
        });
        match self.audited(vec![put], record).await {
            Ok(_) => {
                // The META is cached with the config (parent and cascade policy).
                self.inner.config.evict(&keys::entity_meta(ns, id));
                Ok(e)
            }
            Err(err) if audit::moved(&err, 0).is_some() => Err(Error::EntityExists(id.into())),
            Err(err) => Err(err.into()),
        }
    }

    /// Read an entity (`None` if absent).
    pub async fn get_entity(&self, id: &str) -> Result<Option<Entity>> {
        validate_entity_id(id)?;
        let key = keys::entity_meta(self.inner.ns(), id);
        let Some(i) = self.inner.store.get(&key, true).await? else {
            return Ok(None);
        };
        entity_of(id, &i).map(Some)
    }

    /// Children of an entity.
    pub async fn children(&self, id: &str) -> Result<Vec<String>> {
        validate_entity_id(id)?;
        let items = self
            .inner
            .store
            .query(Query::index(
                "GSI1",
                keys::gsi1_parent(self.inner.ns(), id),
                Some("CHILD#"),
            ))
            .await?;
        Ok(items
            .iter()
            .filter_map(|i| i.get("entity_id").and_then(Value::as_s).map(str::to_string))
            .collect())
    }

    /// Delete an entity: its META, its stored limits and every bucket. Returns how many
    /// items were deleted (0 if it did not exist). Corrupt items are deleted too (see
    /// [`Limiter::delete_entity_with_repairs`]).
    pub async fn delete_entity(&self, id: &str) -> Result<usize> {
        Ok(self.delete_entity_with_repairs(id).await?.deleted_items)
    }

    /// [`Limiter::delete_entity`], reporting the corrupt items it deleted. The entity's
    /// items are found by a query of its partition and of its buckets' index; when an item
    /// there cannot be decoded, by a scan of the same keys (on DynamoDB a scan of the whole
    /// table). An item the store cannot return is deleted with [`Store::purge`].
    pub async fn delete_entity_with_repairs(&self, id: &str) -> Result<EntityDeleted> {
        validate_entity_id(id)?;
        let ns = self.inner.ns();
        let store = &self.inner.store;
        let entity_pk = keys::entity_pk(ns, id);
        // Each key with its item when the query returned one (an index query returns keys).
        let mut images: Vec<(Key, Option<Item>)> =
            match store.query(Query::table(entity_pk.clone(), None)).await {
                Ok(items) => items
                    .into_iter()
                    .filter_map(|i| Some((Key::of(&i)?, Some(i))))
                    .collect(),
                Err(StoreError::Corrupt(_)) => doctor::scan_all(store.as_ref(), &entity_pk)
                    .await?
                    .iter()
                    .filter_map(doctor::scanned_key)
                    .filter(|k| k.pk == entity_pk)
                    .map(|k| (k, None))
                    .collect(),
                Err(e) => return Err(e.into()),
            };
        match store
            .query(Query::index(
                "GSI3",
                keys::gsi3_entity(ns, id),
                Some("BUCKET#"),
            ))
            .await
        {
            Ok(items) => images.extend(items.iter().filter_map(Key::of).map(|k| (k, None))),
            Err(StoreError::Corrupt(_)) => {
                // `{ns}/BUCKET#{id}#`: ids hold no `#`, so this entity's buckets only.
                let prefix = format!("{ns}/BUCKET#{id}#");
                images.extend(
                    doctor::scan_all(store.as_ref(), &prefix)
                        .await?
                        .iter()
                        .filter_map(doctor::scanned_key)
                        .map(|k| (k, None)),
                );
            }
            Err(e) => return Err(e.into()),
        }
        if images.is_empty() {
            return Ok(EntityDeleted::default());
        }
        // The record lands with the first delete — the META's, or another item the query
        // returned — so a deletion that starts landing is recorded even if a later delete
        // fails. Without any item image (keys from the index, or a scan after a corrupt
        // item), the record is written first, on its own: never a deletion without one.
        let anchor = images
            .iter()
            .position(|(k, i)| k.sk == keys::META && i.is_some())
            .or_else(|| images.iter().position(|(_, i)| i.is_some()));
        let target = Target::Entity {
            entity: id.into(),
            resource: None,
        };
        let record = self.audit_record(
            Action::EntityDelete,
            &target,
            entity_image(id, &images),
            Json::Null,
        );
        let mut repairs = Vec::new();
        let mut anchor_key = None;
        match anchor.map(|a| images[a].clone()) {
            Some((k, old)) => {
                let delete = TransactOp::Delete(DeleteRequest {
                    key: k.clone(),
                    condition: None,
                });
                self.audited(vec![delete], record).await?;
                if let Some(c) = old.and_then(|old| doctor::check_item(ns, &k, &old)) {
                    repairs.push(Repair::logged(c, format!("deleted with entity {id}")));
                }
                anchor_key = Some(k);
            }
            None => {
                self.audited(Vec::new(), record).await?;
            }
        }
        let keys_to_delete: Vec<Key> = images.into_iter().map(|(k, _)| k).collect();
        for k in keys_to_delete
            .iter()
            .filter(|k| Some(*k) != anchor_key.as_ref())
        {
            let req = DeleteRequest {
                key: k.clone(),
                condition: None,
            };
            let corrupt = match store.delete(req).await {
                Ok(old) => old.and_then(|old| doctor::check_item(ns, k, &old)),
                // The store cannot return the old item: delete it without.
                Err(StoreError::Corrupt(m)) => {
                    store.purge(k).await?;
                    Some(CorruptItem::from_message(ns, k, &m))
                }
                Err(e) => return Err(e.into()),
            };
            if let Some(c) = corrupt {
                repairs.push(Repair::logged(c, format!("deleted with entity {id}")));
            }
        }
        self.inner.shards.forget_entity(id);
        self.forget_cached();
        Ok(EntityDeleted {
            deleted_items: keys_to_delete.len(),
            repairs,
        })
    }

    /// Forget every cached config item, refusal and bucket image.
    pub(crate) fn forget_cached(&self) {
        self.inner.config.clear();
        self.inner.rejections.clear();
        self.inner.images.clear();
    }

    /// Store limits at a scope (replacing what was there). Existing buckets pick the new
    /// parameters up on their next acquire (the parameter hash on each bucket sends the fast
    /// path to the slow path, which re-materialises): at once in this process, within the
    /// config cache TTL elsewhere. A corrupt item at the scope is replaced (see
    /// [`Limiter::set_limits_with_repairs`]).
    pub async fn set_limits(
        &self,
        scope: &Scope,
        limits: &[Limit],
        on_unavailable: Option<OnUnavailable>,
    ) -> Result<()> {
        self.set_limits_with_repairs(scope, limits, on_unavailable)
            .await
            .map(drop)
    }

    /// [`Limiter::set_limits`], reporting the corrupt item it replaced (empty when the
    /// scope's item was sound or absent). The write replaces the scope's config item whole,
    /// in one transaction with its audit record, conditioned on the item being what was
    /// read (retried over a concurrent change; see [`crate::audit`]); the level's cascade
    /// policy is kept when it can be read, and dropped (reported) when it is the corrupt
    /// part or the store cannot decode the item at all.
    pub async fn set_limits_with_repairs(
        &self,
        scope: &Scope,
        limits: &[Limit],
        on_unavailable: Option<OnUnavailable>,
    ) -> Result<Vec<Repair>> {
        self.set_merged_limits(scope, limits, &Merge::default(), on_unavailable)
            .await
    }

    /// Store limits at a scope with merge flags (ADR-143): with `merge.inherit` the level
    /// takes, by name, the limits of the levels beneath it that it does not define itself,
    /// minus `merge.exclude`, with `merge.patch` replacing only the schedule of an
    /// inherited limit. The system level cannot carry flags, and excluding or patching
    /// without inheriting is refused ([`Merge::validate`]). Otherwise as
    /// [`Limiter::set_limits_with_repairs`] (the write replaces the item whole, flags
    /// included). A change at any level reaches exactly the buckets whose merged set
    /// includes it: their parameter hash changes, and their next acquire syncs them
    /// (ADR-144).
    pub async fn set_merged_limits(
        &self,
        scope: &Scope,
        limits: &[Limit],
        merge: &Merge,
        on_unavailable: Option<OnUnavailable>,
    ) -> Result<Vec<Repair>> {
        scope.validate()?;
        merge.validate(*scope == Scope::System)?;
        let mut names = std::collections::BTreeSet::new();
        for l in limits {
            validate_limit_name(l.name())?;
            if !names.insert(l.name()) {
                return Err(Error::Invalid(RuleError::InvalidLimit {
                    name: l.name().into(),
                    reason: "named twice".into(),
                }));
            }
        }
        if on_unavailable.is_some() && *scope != Scope::System {
            return Err(Error::Invalid(RuleError::InvalidLimit {
                name: "on_unavailable".into(),
                reason: "on_unavailable is stored at the system level only".into(),
            }));
        }
        let ns = self.inner.ns();
        let key = scope.key(ns);
        let read = doctor::read_for_repair(self.inner.store.as_ref(), ns, &key).await?;
        let first = match &read {
            Ok(old) => Ok(old.clone()),
            Err(c) => Err(c.to_string()),
        };
        let (old, _) = self
            .audited_config_change(scope, Action::LimitsSet, first, |old| {
                let mut item = config::encode(limits, on_unavailable);
                config::encode_merge(&mut item, merge);
                // The level's cascade policy (ADR-146) is not a limit: replacing limits keeps it.
                if let Some(c) = old.and_then(|o| config::decode_cascade(o).ok().flatten()) {
                    item.insert(config::CASCADE.into(), Value::Bool(c));
                }
                Some(ConfigWrite::Put(item))
            })
            .await?;
        let mut repairs = Vec::new();
        match read {
            Err(c) => repairs.push(Repair::logged(c, replaced_action(true))),
            Ok(_) => {
                if let Some(c) = old.and_then(|old| doctor::check_item(ns, &key, &old)) {
                    let dropped = c.attribute.as_deref() == Some(config::CASCADE);
                    repairs.push(Repair::logged(c, replaced_action(dropped)));
                }
            }
        }
        self.forget_cached();
        Ok(repairs)
    }

    /// Limits stored at a scope (empty if none).
    pub async fn get_limits(&self, scope: &Scope) -> Result<(Vec<Limit>, Option<OnUnavailable>)> {
        scope.validate()?;
        match self
            .inner
            .store
            .get(&scope.key(self.inner.ns()), true)
            .await?
        {
            Some(i) => config::decode(&i),
            None => Ok((Vec::new(), None)),
        }
    }

    /// The merge flags stored at a scope (none if the level has no item).
    pub async fn get_merge(&self, scope: &Scope) -> Result<Merge> {
        scope.validate()?;
        match self
            .inner
            .store
            .get(&scope.key(self.inner.ns()), true)
            .await?
        {
            Some(i) => config::decode_merge(&i),
            None => Ok(Merge::default()),
        }
    }

    /// Delete the limits stored at a scope (their merge flags with them); `true` if there
    /// were any. The level's cascade
    /// policy, if set, stays (see [`Limiter::set_cascade`]). A corrupt item is deleted (see
    /// [`Limiter::delete_limits_with_repairs`]).
    pub async fn delete_limits(&self, scope: &Scope) -> Result<bool> {
        Ok(self.delete_limits_with_repairs(scope).await?.0)
    }

    /// [`Limiter::delete_limits`], reporting the corrupt item it deleted. The cascade policy
    /// is kept when it can be read, and lost (reported) when it is the corrupt part or the
    /// store cannot decode the item.
    pub async fn delete_limits_with_repairs(&self, scope: &Scope) -> Result<(bool, Vec<Repair>)> {
        scope.validate()?;
        let ns = self.inner.ns();
        let key = scope.key(ns);
        let read = doctor::read_for_repair(self.inner.store.as_ref(), ns, &key).await?;
        let first = match &read {
            Ok(old) => Ok(old.clone()),
            Err(c) => Err(c.to_string()),
        };
        let undecodable = read.is_err();
        let (old, record) = self
            .audited_config_change(scope, Action::LimitsDelete, first, |old| {
                // The level's cascade policy, if set, stays (the item keeps only it).
                match old.map(|o| config::decode_cascade(o).ok().flatten()) {
                    None if !undecodable => None,
                    Some(Some(c)) => {
                        let mut item = Item::new();
                        item.insert(config::CASCADE.into(), Value::Bool(c));
                        Some(ConfigWrite::Put(item))
                    }
                    _ => Some(ConfigWrite::Delete),
                }
            })
            .await?;
        let mut repairs = Vec::new();
        match read {
            Err(c) => repairs.push(Repair::logged(c, deleted_action(true))),
            Ok(_) => {
                if let Some(c) = old.and_then(|old| doctor::check_item(ns, &key, &old)) {
                    let lost = c.attribute.as_deref() == Some(config::CASCADE);
                    repairs.push(Repair::logged(c, deleted_action(lost)));
                }
            }
        }
        self.forget_cached();
        Ok((record.is_some(), repairs))
    }

    /// Set (`Some`) or unset (`None`) the cascade policy at a resource or entity scope
    /// (ADR-146: tri-state, resolved along entity×resource → entity `_default_` → resource,
    /// then the entity META's flag). Buckets take the new policy on their next acquire in
    /// this process, within the config cache TTL elsewhere; the stamp on each bucket item
    /// follows on its next slow-path write. The system level has no cascade policy.
    pub async fn set_cascade(&self, scope: &Scope, cascade: Option<bool>) -> Result<()> {
        scope.validate()?;
        if *scope == Scope::System {
            return Err(Error::Invalid(RuleError::InvalidLimit {
                name: config::CASCADE.into(),
                reason: "cascade is set on resource and entity scopes only".into(),
            }));
        }
        let key = scope.key(self.inner.ns());
        let first = self.inner.store.get(&key, true).await?;
        self.audited_config_change(scope, Action::CascadeSet, Ok(first), |old| {
            let mut item = old.cloned().unwrap_or_default();
            item.remove("PK");
            item.remove("SK");
            match cascade {
                Some(c) => item.insert(config::CASCADE.into(), Value::Bool(c)),
                None => item.remove(config::CASCADE),
            };
            Some(ConfigWrite::Put(item))
        })
        .await?;
        self.inner.config.clear();
        self.inner.rejections.clear();
        self.inner.images.clear();
        Ok(())
    }

    /// Resolve the limits that apply to (entity, resource).
    pub async fn resolve_limits(&self, entity: &str, resource: &str) -> Result<Vec<Limit>> {
        validate_entity_id(entity)?;
        tollgate_core::ids::validate_resource(resource)?;
        let now = self.now_ms();
        Ok(self
            .inner
            .config
            .resolve(
                self.inner.store.as_ref(),
                self.inner.ns(),
                entity,
                resource,
                now,
            )
            .await?
            .limits
            .to_vec())
    }
}
