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
//! backend, and [`crate::Admin::purge_audit`] deletes them where the store has no native TTL.
//!
//! Config items written with a record carry its id (`audit_id`), and the next change of
//! the item is conditioned on it: the "before" of a record is exactly what the change
//! replaced, even when two administrators write the same level at once (the loser's
//! transaction is cancelled, and it retries over the winner's item).
//!
//! Recording a change (`Limiter::audited`) and the record's condition are here; the ULID
//! source is in `ids`, an audited config change in `config_change`, reading and purging
//! the log in `log`.

mod config_change;
mod log;

use std::sync::Arc;

use serde_json::Value as Json;
use tollgate_core::audit;
use tollgate_core::expr::Condition;
use tollgate_core::keys;
use tollgate_core::value::Item;
use tollgate_store::{CancelReason, PutRequest, StoreError, TransactOp};

use crate::config;
use crate::error::Result;
use crate::limiter::Limiter;

pub use log::AuditQuery;
pub use tollgate_core::audit::{Action, Page as AuditPage, Record as AuditRecord, Target};

pub use crate::recording::{
    validate_principal, DEFAULT_PRINCIPAL, DEFAULT_RETENTION, MAX_PRINCIPAL_CHARS,
};
pub(crate) use config_change::{config_image, ConfigWrite};

/// The config item attribute holding the id of the audit record that wrote it.
pub const AUDIT_ID: &str = "audit_id";

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
        Ok(Limiter::from_parts(
            self.inner().clone(),
            Arc::from(principal),
        ))
    }

    /// Whom this handle's administrative changes are recorded for.
    pub fn principal(&self) -> &str {
        self.principal_name()
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
        let keep_s =
            i64::try_from(self.inner().opts().audit_retention.as_secs()).unwrap_or(i64::MAX);
        AuditRecord {
            id: self.inner().audit_ids().next(now),
            at_ms: now,
            principal: self.principal_name().to_string(),
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
            None => self.inner().ns(),
        };
        debug_assert!(ops.len() < tollgate_store::MAX_TRANSACT_OPS);
        ops.push(TransactOp::Put(PutRequest {
            key: record.key(ns),
            item: audit::encode(ns, &record),
            condition: Some(Condition::not_exists("PK")),
        }));
        self.inner().store().transact_write(ops, None).await?;
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
