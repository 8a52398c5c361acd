//! The audit log (ADR-008, ADR-106): every administrative change writes one record — a
//! ULID, the time, the principal, the action, and what was stored before and after — in
//! the same store transaction as the change, so a change that lands always has its record
//! and a refused one (a condition failure, a store error) has none.
//!
//! [`Limiter::audited`] is the one way an administrative write reaches the store: it
//! appends the record's put to the change's operations and sends them as one
//! transaction. Limits set / delete at every level, cascade set, entity create / delete
//! and disable / enable use it; a later operation (reset, top-up, move, a limits-file
//! apply) passes its own [`Action`] and images.
//!
//! Records carry `ttl` = now + the retention ([`Options::audit_retention`], 90 days by
//! default). DynamoDB's TTL deletes them; every read leaves an expired record out on every
//! backend, and [`Limiter::purge_audit`] deletes them where the store has no native TTL.
//!
//! Config items written with a record carry its id (`audit_id`), and the next change of
//! the item is conditioned on it: the "before" of a record is exactly what the change
//! replaced, even when two administrators write the same level at once (the loser's
//! transaction is cancelled, and it retries over the winner's item).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value as Json};
use tollgate_core::audit::{self, MAX_PAGE};
use tollgate_core::expr::Condition;
use tollgate_core::ids::{validate_entity_id, validate_resource};
use tollgate_core::keys;
use tollgate_core::value::{Item, Value};
use tollgate_core::{LimitSpec, RuleError};
use tollgate_store::{CancelReason, DeleteRequest, PutRequest, Query, StoreError, TransactOp};

use crate::config;
use crate::error::{Error, Result};
use crate::limiter::Limiter;

pub use tollgate_core::audit::{Action, Page as AuditPage, Record as AuditRecord, Target};

/// The principal of a limiter nobody named one for.
pub const DEFAULT_PRINCIPAL: &str = "library";
/// How long records are kept by default (90 days, as upstream).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(90 * 24 * 3600);
/// The longest principal name.
pub const MAX_PRINCIPAL_CHARS: usize = 256;
/// The config item attribute holding the id of the audit record that wrote it.
pub const AUDIT_ID: &str = "audit_id";
/// How often a change whose "before" moved under it is retried.
const ATTEMPTS: u32 = 5;

/// Check a principal name: 1 to [`MAX_PRINCIPAL_CHARS`] characters, no control characters.
pub fn validate_principal(p: &str) -> Result<()> {
    let n = p.chars().count();
    if n == 0 || n > MAX_PRINCIPAL_CHARS || p.chars().any(char::is_control) {
        return Err(Error::Invalid(RuleError::InvalidIdentifier {
            value: p.chars().take(64).collect(),
            reason: "a principal is 1 to 256 characters, none of them control characters",
        }));
    }
    Ok(())
}

/// ULIDs from the limiter's clock and a seeded source: unique, and increasing within one
/// limiter even within one millisecond (the random part counts up, as the ULID spec's
/// monotonic generator does).
#[derive(Debug)]
pub(crate) struct AuditIds {
    state: Mutex<(StdRng, u64, u128)>,
}

impl AuditIds {
    pub(crate) fn new(seed: u64) -> Self {
        AuditIds {
            state: Mutex::new((StdRng::seed_from_u64(seed), 0, 0)),
        }
    }

    pub(crate) fn next(&self, now_ms: i64) -> String {
        const RANDOM_BITS: u128 = (1 << 80) - 1;
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (rng, last_ms, last_rand) = &mut *g;
        let ms = u64::try_from(now_ms).unwrap_or(0).max(*last_ms);
        let rand = if ms == *last_ms && *last_rand < RANDOM_BITS {
            *last_rand + 1
        } else {
            // Half the range: room to count up within a millisecond.
            rng.gen::<u128>() & (RANDOM_BITS >> 1)
        };
        debug_assert!(ms > *last_ms || rand > *last_rand, "ids increase");
        *last_ms = ms;
        *last_rand = rand;
        ulid::Ulid::from_parts(ms, rand).to_string()
    }
}

/// What [`Limiter::audit_log`] lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditQuery {
    /// Only this entity's records (one query of its partition); `None`: every record.
    pub entity: Option<String>,
    /// Only records concerning this resource (its defaults, an entity's limits for it, its
    /// disabling).
    pub resource: Option<String>,
    /// At most this many (1 to 1000; 0 means 100).
    pub limit: usize,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// List the namespace registry's records (register, delete, recover, purge of every
    /// namespace) instead of this namespace's.
    pub registry: bool,
}

/// The JSON image of a config item: its limits, `on_unavailable` and cascade policy
/// (`null` when absent; `{"corrupt": …}` when it cannot be decoded).
pub(crate) fn config_image(item: Option<&Item>) -> Json {
    let Some(item) = item else {
        return Json::Null;
    };
    let merge = match config::decode_merge(item) {
        Ok(m) => m,
        Err(e) => return json!({ "corrupt": e.to_string() }),
    };
    match (config::decode(item), config::decode_cascade(item)) {
        (Ok((limits, on)), Ok(cascade)) => {
            let mut image = json!({
                "limits": limits.iter().map(LimitSpec::from).collect::<Vec<_>>(),
                "on_unavailable": on,
                "cascade": cascade,
            });
            // The merge flags (ADR-143), only where a level sets them.
            if let (Some(o), Ok(Json::Object(m))) = (
                image.as_object_mut(),
                serde_json::to_value(tollgate_core::merge::MergeSpec::from(&merge)),
            ) {
                o.extend(m);
            }
            image
        }
        (Err(e), _) | (_, Err(e)) => json!({ "corrupt": e.to_string() }),
    }
}

/// The condition that the item is still what `old` was (read or returned by a failed
/// condition): absent, or carrying the same `audit_id` (none: still none).
pub(crate) fn unchanged(old: Option<&Item>) -> Condition {
    match old {
        None => Condition::not_exists("PK"),
        Some(i) => match i.get(AUDIT_ID) {
            Some(v) => Condition::eq(AUDIT_ID, v.clone()),
            None => Condition::exists("PK").and(Condition::not_exists(AUDIT_ID)),
        },
    }
}

/// A change that was refused because its item moved since it was read: the item as it is
/// now. `None` for any other failure.
pub(crate) fn moved(e: &StoreError, op: usize) -> Option<Option<Item>> {
    match e {
        StoreError::TransactionCanceled { reasons } => match reasons.get(op) {
            Some(CancelReason::ConditionFailed { old }) => Some(old.clone()),
            _ => None,
        },
        _ => None,
    }
}

impl Limiter {
    /// This limiter acting for `principal`: a handle sharing the store and the caches whose
    /// administrative changes are recorded under that name. The CLI passes the OS user, the
    /// server the authenticated token's name.
    pub fn acting_as(&self, principal: &str) -> Result<Limiter> {
        validate_principal(principal)?;
        Ok(Limiter {
            inner: self.inner.clone(),
            principal: Arc::from(principal),
        })
    }

    /// Whom this handle's administrative changes are recorded for.
    pub fn principal(&self) -> &str {
        &self.principal
    }

    /// A record of `action` on `target` at the limiter's `now`, by this handle's principal.
    pub(crate) fn audit_record(
        &self,
        action: Action,
        target: &Target,
        before: Json,
        after: Json,
    ) -> AuditRecord {
        let now = self.now_ms();
        let keep_s = i64::try_from(self.inner.opts.audit_retention.as_secs()).unwrap_or(i64::MAX);
        AuditRecord {
            id: self.inner.audit_ids.next(now),
            at_ms: now,
            principal: self.principal.to_string(),
            action,
            level: target.level(),
            entity: target.entity().map(str::to_string),
            resource: target.resource().map(str::to_string),
            namespace: match target {
                Target::Namespace(n) => Some(n.clone()),
                _ => None,
            },
            before,
            after,
            expires_at_s: now.div_euclid(1000).saturating_add(keep_s),
        }
    }

    /// Write an administrative change and its audit record in one transaction: `ops` (at
    /// most 99) and the record's put, all or nothing. Returns the record written.
    pub(crate) async fn audited(
        &self,
        mut ops: Vec<TransactOp>,
        record: AuditRecord,
    ) -> std::result::Result<AuditRecord, StoreError> {
        // Registry changes are recorded in the registry namespace (a purge keeps them).
        let ns = match record.namespace {
            Some(_) => keys::REGISTRY_NS,
            None => self.inner.ns(),
        };
        debug_assert!(ops.len() < tollgate_store::MAX_TRANSACT_OPS);
        ops.push(TransactOp::Put(PutRequest {
            key: record.key(ns),
            item: audit::encode(ns, &record),
            condition: Some(Condition::not_exists("PK")),
        }));
        self.inner.store.transact_write(ops, None).await?;
        tracing::info!(
            target: "tollgate::audit",
            id = %record.id,
            principal = %record.principal,
            action = %record.action,
            entity = record.entity.as_deref(),
            resource = record.resource.as_deref(),
            "administrative change recorded"
        );
        Ok(record)
    }

    /// A change of the config item at `scope`: `change` maps the item as it is (`None`:
    /// absent) to the write that replaces it (`None`: nothing to do), stamped with the
    /// record's id and conditioned on the item being unchanged; retried over the item as it
    /// became when another change landed first. `first` is the item as read, or the
    /// store's message when it cannot decode it (then the write is unconditional and
    /// `change` sees `None`). Returns the item the change replaced and the record (`None`
    /// when nothing was written).
    pub(crate) async fn audited_config_change(
        &self,
        scope: &config::Scope,
        action: Action,
        first: std::result::Result<Option<Item>, String>,
        change: impl Fn(Option<&Item>) -> Option<ConfigWrite>,
    ) -> Result<(Option<Item>, Option<AuditRecord>)> {
        let key = scope.key(self.inner.ns());
        let target = target_of(scope);
        let (mut old, undecodable) = match first {
            Ok(o) => (o, None),
            Err(m) => (None, Some(m)),
        };
        let mut purged = false;
        for _ in 0..ATTEMPTS {
            let Some(w) = change(old.as_ref()) else {
                return Ok((old, None));
            };
            let after = match &w {
                ConfigWrite::Put(i) => config_image(Some(i)),
                ConfigWrite::Delete => Json::Null,
            };
            let (before, condition) = match &undecodable {
                Some(m) => (json!({ "corrupt": m }), None),
                None => (config_image(old.as_ref()), Some(unchanged(old.as_ref()))),
            };
            let record = self.audit_record(action, &target, before, after);
            let op = match w {
                ConfigWrite::Put(mut item) => {
                    item.insert(AUDIT_ID.into(), Value::S(record.id.clone()));
                    TransactOp::Put(PutRequest {
                        key: key.clone(),
                        item,
                        condition,
                    })
                }
                ConfigWrite::Delete => TransactOp::Delete(DeleteRequest {
                    key: key.clone(),
                    condition,
                }),
            };
            match self.audited(vec![op], record.clone()).await {
                Ok(r) => return Ok((old, Some(r))),
                // The store cannot write over the item in a transaction without decoding
                // it: purge it, and write again over nothing (the record with the write).
                Err(StoreError::Corrupt(_)) if undecodable.is_some() && !purged => {
                    self.inner.store.purge(&key).await?;
                    purged = true;
                }
                Err(e) => match moved(&e, 0) {
                    Some(now) if undecodable.is_none() => old = now,
                    _ => return Err(e.into()),
                },
            }
        }
        Err(Error::Contended {
            entity: target.entity().unwrap_or("-").into(),
            resource: target.resource().unwrap_or("-").into(),
        })
    }

    /// One page of the audit log, newest first (rule "audit page",
    /// [`tollgate_core::audit::page`]): an entity's records with one query of its
    /// partition, or every record with one query of the index that holds them all. Records
    /// past their retention are left out. A record the store holds but cannot decode fails
    /// the call as [`Error::Corrupt`], naming it.
    pub async fn audit_log(&self, q: &AuditQuery) -> Result<AuditPage> {
        if let Some(e) = &q.entity {
            validate_entity_id(e)?;
        }
        if let Some(r) = &q.resource {
            validate_resource(r)?;
        }
        if let Some(c) = &q.cursor {
            if ulid::Ulid::from_string(c).is_err() {
                return Err(Error::Invalid(RuleError::InvalidIdentifier {
                    value: c.chars().take(64).collect(),
                    reason: "a cursor is the id of an audit record (a ULID)",
                }));
            }
        }
        let limit = if q.limit == 0 { 100 } else { q.limit };
        if limit > MAX_PAGE {
            return Err(Error::Invalid(RuleError::InvalidAmount {
                limit: "limit".into(),
                reason: "a page holds 1 to 1000 records",
            }));
        }
        let ns = if q.registry {
            keys::REGISTRY_NS
        } else {
            self.inner.ns()
        };
        let query = match &q.entity {
            Some(e) => Query::table(keys::audit_entity_pk(ns, e), Some(keys::AUDIT_SK_PREFIX)),
            None => Query::index("GSI1", keys::gsi1_audit(ns), Some(keys::GSI1_AUDIT_PREFIX)),
        };
        let items = self.inner.store.query(query).await?;
        let records = items
            .iter()
            .map(audit::decode)
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(audit::page(
            records,
            q.resource.as_deref(),
            q.cursor.as_deref(),
            limit,
            self.now_ms(),
        ))
    }

    /// Delete the audit records past their retention (on DynamoDB its TTL does this too):
    /// each with a condition that its `ttl` has passed. Returns how many were deleted.
    pub async fn purge_audit(&self) -> Result<usize> {
        let ns = self.inner.ns();
        let now = self.now_ms();
        let items = self
            .inner
            .store
            .query(Query::index(
                "GSI1",
                keys::gsi1_audit(ns),
                Some(keys::GSI1_AUDIT_PREFIX),
            ))
            .await?;
        let mut deleted = 0;
        for item in &items {
            let r = audit::decode(item)?;
            if !r.expired(now) {
                continue;
            }
            let res = self
                .inner
                .store
                .delete(DeleteRequest {
                    key: r.key(ns),
                    condition: Some(Condition::le("ttl", now.div_euclid(1000))),
                })
                .await;
            match res {
                Ok(Some(_)) => deleted += 1,
                Ok(None) | Err(StoreError::ConditionFailed { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(deleted)
    }
}

/// What a config change writes.
pub(crate) enum ConfigWrite {
    /// Replace the item with this one.
    Put(Item),
    /// Delete it.
    Delete,
}

/// The audit target of a config scope.
pub(crate) fn target_of(scope: &config::Scope) -> Target {
    match scope {
        config::Scope::System => Target::System,
        config::Scope::Resource(r) => Target::Resource(r.clone()),
        config::Scope::Entity(e, r) => Target::Entity {
            entity: e.clone(),
            resource: r.clone(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_increase_within_a_millisecond_and_across() {
        let g = AuditIds::new(7);
        let a = g.next(1_000);
        let b = g.next(1_000);
        let c = g.next(999); // a clock that stepped back keeps the order
        let d = g.next(2_000);
        assert!(a < b && b < c && c < d, "{a} {b} {c} {d}");
        assert_eq!(a.len(), 26);
        let t = |s: &str| ulid::Ulid::from_string(s).unwrap().timestamp_ms();
        assert_eq!((t(&a), t(&c), t(&d)), (1_000, 1_000, 2_000));
    }

    #[test]
    fn principals_are_checked() {
        assert!(validate_principal("alice").is_ok());
        assert!(validate_principal("").is_err());
        assert!(validate_principal("a\nb").is_err());
        assert!(validate_principal(&"x".repeat(257)).is_err());
    }
}
