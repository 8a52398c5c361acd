//! [`Admin`]: the operator's changes to stored state — limits, modes, entities, bucket
//! resets and top-ups, shard counts, namespaces, purges and repairs — reached through
//! [`Limiter::admin`], apart from what a request calls (acquire, leases, availability,
//! reads of the stored limits).

use std::collections::BTreeMap;

use tollgate_core::bypass::Enforcement;
use tollgate_core::merge::Merge;
use tollgate_core::Limit;

use crate::acquire::{Amounts, BucketOpOutcome};
use crate::config::{OnUnavailable, Scope};
use crate::doctor::{DoctorReport, Repair};
use crate::entities::{Entity, EntityDeleted, NewEntity};
use crate::error::Result;
use crate::limiter::Limiter;
use crate::namespace::Namespace;
use crate::reparent::Moved;

/// The administrative operations of a [`Limiter`] (`limiter.admin()`). Every change is
/// recorded in the audit log for the limiter's principal ([`Limiter::acting_as`]).
#[derive(Debug, Clone, Copy)]
pub struct Admin<'a> {
    limiter: &'a Limiter,
}

impl Limiter {
    /// The administrative operations: limits, modes, entities, resets, namespaces, purges.
    pub fn admin(&self) -> Admin<'_> {
        Admin { limiter: self }
    }
}

impl Admin<'_> {
    /// Store limits at a scope (replacing what was there). Existing buckets pick the new
    /// parameters up on their next acquire (the parameter hash on each bucket sends the fast
    /// path to the slow path, which re-materialises): at once in this process, within the
    /// config cache TTL elsewhere. A corrupt item at the scope is replaced (see
    /// [`Admin::set_limits_with_repairs`]). At the system level this replaces the
    /// fail-open policy too (none is kept): [`Admin::set_system_limits`] sets both.
    pub async fn set_limits(&self, scope: &Scope, limits: &[Limit]) -> Result<()> {
        self.set_limits_with_repairs(scope, limits).await.map(drop)
    }

    /// [`Admin::set_limits`], reporting the corrupt item it replaced (empty when the
    /// scope's item was sound or absent). The write replaces the scope's config item whole,
    /// in one transaction with its audit record, conditioned on the item being what was
    /// read (retried over a concurrent change; see [`crate::audit`]); the level's cascade
    /// policy is kept when it can be read, and dropped (reported) when it is the corrupt
    /// part or the store cannot decode the item at all.
    pub async fn set_limits_with_repairs(
        &self,
        scope: &Scope,
        limits: &[Limit],
    ) -> Result<Vec<Repair>> {
        self.limiter
            .set_merged_limits(scope, limits, &Merge::default(), None)
            .await
    }

    /// Store limits at a scope with merge flags (ADR-143): with `merge.inherit` the level
    /// takes, by name, the limits of the levels beneath it that it does not define itself,
    /// minus `merge.exclude`, with `merge.patch` replacing only the schedule of an
    /// inherited limit. The system level cannot carry flags, and excluding or patching
    /// without inheriting is refused ([`Merge::validate`]). Otherwise as
    /// [`Admin::set_limits_with_repairs`] (the write replaces the item whole, flags
    /// included). A change at any level reaches exactly the buckets whose merged set
    /// includes it: their parameter hash changes, and their next acquire syncs them
    /// (ADR-144).
    pub async fn set_merged_limits(
        &self,
        scope: &Scope,
        limits: &[Limit],
        merge: &Merge,
    ) -> Result<Vec<Repair>> {
        self.limiter
            .set_merged_limits(scope, limits, merge, None)
            .await
    }

    /// Replace a level's item whole with what a limits file or an HTTP body sets at it:
    /// its limits, its merge flags and — at the system level only, refused elsewhere — its
    /// fail-open policy, in one transaction with one audit record. Otherwise as
    /// [`Admin::set_merged_limits`].
    pub async fn set_level(
        &self,
        scope: &Scope,
        limits: &[Limit],
        merge: &Merge,
        on_unavailable: Option<OnUnavailable>,
    ) -> Result<Vec<Repair>> {
        self.limiter
            .set_merged_limits(scope, limits, merge, on_unavailable)
            .await
    }

    /// Store the system level's limits and its fail-open policy (`on_unavailable`: what
    /// an acquire answers when the store cannot be reached; `None` leaves the builder's
    /// default in force), replacing the level's item whole, in one transaction with its
    /// audit record. Otherwise as [`Admin::set_limits_with_repairs`].
    pub async fn set_system_limits(
        &self,
        limits: &[Limit],
        on_unavailable: Option<OnUnavailable>,
    ) -> Result<Vec<Repair>> {
        self.limiter
            .set_merged_limits(&Scope::System, limits, &Merge::default(), on_unavailable)
            .await
    }

    /// Delete the limits stored at a scope (their merge flags with them); `true` if there
    /// were any. The level's cascade
    /// policy and mode, if set, stay (see [`Admin::set_cascade`]). A corrupt item is deleted (see
    /// [`Admin::delete_limits_with_repairs`]).
    pub async fn delete_limits(&self, scope: &Scope) -> Result<bool> {
        self.limiter.delete_limits(scope).await
    }

    /// [`Admin::delete_limits`], reporting the corrupt item it deleted. The cascade policy
    /// and the mode are kept when they can be read, and lost (reported) when one is the
    /// corrupt part or the store cannot decode the item.
    pub async fn delete_limits_with_repairs(&self, scope: &Scope) -> Result<(bool, Vec<Repair>)> {
        self.limiter.delete_limits_with_repairs(scope).await
    }

    /// Set (`Some`) or unset (`None`) the cascade policy at a resource or entity scope
    /// (ADR-146: tri-state, resolved along entity×resource → entity `_default_` → resource,
    /// then the entity META's flag). Buckets take the new policy on their next acquire in
    /// this process, within the config cache TTL elsewhere; the stamp on each bucket item
    /// follows on its next slow-path write. The system level has no cascade policy.
    pub async fn set_cascade(&self, scope: &Scope, cascade: Option<bool>) -> Result<()> {
        self.limiter.set_cascade(scope, cascade).await
    }

    /// ADR-151: put an entity's use of a resource in `mode` — enforce (limits refuse what
    /// they cannot cover), disabled (every acquire refused, as [`Admin::set_disabled`]),
    /// or bypass (every acquire admitted and recorded in `tc`, `rq` and usage, no balance
    /// debited but the write-capacity meter `wcu`; no window opened or rolled, no quota
    /// reset). The pair's config level stores the mode (it outranks every broader level)
    /// and every shard of the bucket is stamped, in one transaction with the audit record;
    /// shards created later take shard 0's stamp. An entity without a bucket for the
    /// resource set to bypass gets its shard 0 created first (funded, no window opened) so
    /// its first request is bypassed too. Returns how many shard items were stamped.
    ///
    /// A process that last saw the other stamp writes once in the old shape, fails its
    /// condition and writes again in the item's (see `tollgate_core::bypass`): the stamp
    /// takes effect at once everywhere. Leases granted under one mode finish in it.
    pub async fn set_enforcement(
        &self,
        entity: &str,
        resource: &str,
        mode: Enforcement,
    ) -> Result<usize> {
        self.limiter.set_enforcement(entity, resource, mode).await
    }

    /// Disable (or re-enable) an entity's use of a resource: the pair's mode set to
    /// `disabled`, or cleared (the pair then follows its broader levels, enforced when
    /// none sets a mode; see [`Admin::set_scope_enforcement`]). Disabled, every
    /// acquire is refused with [`Error::ResourceDisabled`]: the fast path's condition and
    /// the slow path refuse on the stamp, and a process whose config holds the mode refuses
    /// before any write. Returns how many shard items were stamped.
    pub async fn set_disabled(
        &self,
        entity: &str,
        resource: &str,
        disabled: bool,
    ) -> Result<usize> {
        self.limiter.set_disabled(entity, resource, disabled).await
    }

    /// Set (`Some`) or clear (`None`) the mode stored at a config level (rule "a scope's
    /// mode is its most specific level's"). At the pair's level (entity + resource) the
    /// bucket's shards are stamped at once (as [`Admin::set_enforcement`]; cleared, they
    /// take the broader levels' mode). At a broader level (entity default, resource,
    /// system) the mode is stored with its audit record and every bucket it reaches follows
    /// on its next acquire — at once in this process, within the config cache TTL
    /// elsewhere: the mode is part of the parameter hash, so that acquire takes the slow
    /// path, which flips the item's stamp after confirming the mode with a consistent read.
    /// A disabled scope is refused before any write. Returns how many shard items were
    /// stamped now (0 at a broader level).
    pub async fn set_scope_enforcement(
        &self,
        scope: &Scope,
        mode: Option<Enforcement>,
    ) -> Result<usize> {
        self.limiter.set_scope_enforcement(scope, mode).await
    }

    /// ADR-149: reset every limit of `entity`'s bucket for `resource` to full on every
    /// shard — a dripping limit to its ceiling, a quota to its share with a fresh grant, a
    /// `reset_after` quota in a new window opened now — in one transaction with a
    /// `bucket.reset` audit record. `op` identifies the operation: a retry with the same id
    /// lands once. An entity with no bucket for the resource has nothing to reset (0 shards,
    /// no record).
    pub async fn reset(
        &self,
        entity: &str,
        resource: &str,
        op: Option<&str>,
    ) -> Result<BucketOpOutcome> {
        self.limiter.reset(entity, resource, op).await
    }

    /// ADR-149: add `amounts` (tokens per limit) above the current grant of `entity`'s
    /// bucket for `resource`, split across the shards by grant, in one transaction with a
    /// `bucket.top_up` audit record. A quota's ceiling rises with it until its next reset
    /// (`tu`); a dripping limit gains at most its headroom. An entity without a bucket gets
    /// one first (a zero acquire: shard 0 at its share), then the top-up. `op` as for
    /// [`Admin::reset`].
    pub async fn top_up(
        &self,
        entity: &str,
        resource: &str,
        amounts: impl Into<Amounts>,
        op: Option<&str>,
    ) -> Result<BucketOpOutcome> {
        self.limiter.top_up(entity, resource, amounts, op).await
    }

    /// Double the shard count of (entity, resource) from `old` by compare-and-set on shard
    /// 0 (refused at 32; a loser adopts the winner's count). Returns the count now in force.
    /// Acquires do this by themselves when a shard runs out of write capacity (see
    /// [`crate::should_double`]); with the `testing` feature only, for tests that need an
    /// entity spread over several shards now.
    #[cfg(feature = "testing")]
    pub async fn bump_shard_count(&self, entity: &str, resource: &str, old: i64) -> Result<i64> {
        self.limiter.bump_shard_count(entity, resource, old).await
    }

    /// Create an entity (without cascade). Fails with [`Error::EntityExists`] if it exists.
    pub async fn create_entity(
        &self,
        id: &str,
        name: Option<&str>,
        parent_id: Option<&str>,
        metadata: BTreeMap<String, String>,
    ) -> Result<Entity> {
        self.limiter
            .create_entity(id, name, parent_id, metadata)
            .await
    }

    /// Create an entity with every option. Fails with [`Error::EntityExists`] if it exists.
    /// The parent's existence is not checked.
    pub async fn create_entity_with(&self, id: &str, new: NewEntity<'_>) -> Result<Entity> {
        self.limiter.create_entity_with(id, new).await
    }

    /// Delete an entity: its META, its stored limits and every bucket. Returns how many
    /// items were deleted (0 if it did not exist). Corrupt items are deleted too (see
    /// [`Admin::delete_entity_with_repairs`]).
    pub async fn delete_entity(&self, id: &str) -> Result<usize> {
        self.limiter.delete_entity(id).await
    }

    /// [`Admin::delete_entity`], reporting the corrupt items it deleted. The entity's
    /// items are found by a query of its partition and of its buckets' index; when an item
    /// there cannot be decoded, by a scan of the same keys (on DynamoDB a scan of the whole
    /// table). An item the store cannot return is deleted with [`Store::purge`].
    pub async fn delete_entity_with_repairs(&self, id: &str) -> Result<EntityDeleted> {
        self.limiter.delete_entity_with_repairs(id).await
    }

    /// ADR-150: move `entity` under `parent` (`None`: make it a root). Refused with
    /// [`Error::ParentCycle`] when `parent` is the entity or one of its descendants (the
    /// parent's ancestry is walked, at most 32 levels), [`Error::EntityNotFound`] when the
    /// entity or the new parent does not exist. The META is updated (parent, children index,
    /// `pgen + 1`, pinned on the generation read) with an `entity.move` audit record in one
    /// transaction. Moving to the parent it already has writes nothing.
    pub async fn set_parent(&self, entity: &str, parent: Option<&str>) -> Result<Moved> {
        self.limiter.set_parent(entity, parent).await
    }

    /// Register `name` and return it (idempotent: an active name is returned as it is,
    /// without a write or a record). One transaction puts the forward and reverse records,
    /// each on condition it does not exist, with the audit record.
    pub async fn register_namespace(&self, name: &str) -> Result<Namespace> {
        self.limiter.register_namespace(name).await
    }

    /// Soft-delete the namespace `name`: its forward record goes and its reverse record
    /// says `deleted`, in one transaction with the audit record. Its data stays; acquires
    /// in it are refused ([`Error::NamespaceDeleted`]). `None` when no active namespace
    /// has the name (nothing written).
    pub async fn delete_namespace(&self, name: &str) -> Result<Option<Namespace>> {
        self.limiter.delete_namespace(name).await
    }

    /// Recover the soft-deleted namespace `id` and return it: the forward record is put
    /// back (on condition the name was not registered again meanwhile) and the reverse
    /// record says `active`, with the audit record. [`Error::NamespaceNotFound`] for an
    /// unknown id, [`Error::NamespaceState`] when it is active or being purged, or its
    /// name is taken.
    pub async fn recover_namespace(&self, id: &str) -> Result<Namespace> {
        self.limiter.recover_namespace(id).await
    }

    /// Purge the soft-deleted namespace `id`: mark it `purging` (with the audit record),
    /// delete every item under its prefix, then its reverse record. Returns the items
    /// deleted (0 for an unknown id: nothing to do). [`Error::NamespaceState`] when it is
    /// active. A purge that stopped half way (an outage) is finished by running it again.
    ///
    /// [`Error::NamespaceState`]: crate::Error::NamespaceState
    pub async fn purge_namespace(&self, id: &str) -> Result<usize> {
        self.limiter.purge_namespace(id).await
    }

    /// Delete the audit records past their retention (on DynamoDB its TTL does this too):
    /// each with a condition that its `ttl` has passed. Returns how many were deleted.
    pub async fn purge_audit(&self) -> Result<usize> {
        self.limiter.purge_audit().await
    }

    /// Delete the closure records this limiter wrote whose `ttl` has passed, on a store
    /// without native TTL (on DynamoDB the table's TTL does it; nothing is remembered).
    /// Returns how many were deleted; on a store error the rest are kept for the next call.
    pub async fn purge_lease_closures(&self) -> Result<usize> {
        self.limiter.purge_lease_closures().await
    }

    /// Scan the namespace and list every item the engine cannot read, naming the
    /// attribute (see the module docs for what is checked). With `repair`, delete every
    /// bucket item of each (entity, resource) that has a corrupt one: the next acquire
    /// creates them afresh (at full capacity: what the entity spent in the current window is
    /// forgotten). Corrupt limits and entities are left for `limits set` / `limits delete`
    /// / `entity delete`, which replace or delete them. On DynamoDB this reads the whole
    /// table.
    pub async fn doctor(&self, repair: bool) -> Result<DoctorReport> {
        self.limiter.doctor(repair).await
    }
}
