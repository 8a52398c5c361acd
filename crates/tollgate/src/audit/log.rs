//! Reading the audit log ([`Limiter::audit_log`], a page per [`AuditQuery`]) and purging
//! the records past their retention ([`crate::Admin::purge_audit`]).

use tollgate_core::audit::{self, MAX_PAGE};
use tollgate_core::expr::Condition;
use tollgate_core::ids::{validate_entity_id, validate_resource};
use tollgate_core::keys;
use tollgate_core::RuleError;
use tollgate_store::{DeleteRequest, Query, StoreError};

use crate::error::{Error, Result};
use crate::limiter::Limiter;

use super::AuditPage;

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
impl Limiter {
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
            self.inner().ns()
        };
        let query = match &q.entity {
            Some(e) => Query::table(keys::audit_entity_pk(ns, e), Some(keys::AUDIT_SK_PREFIX)),
            None => Query::index("GSI1", keys::gsi1_audit(ns), Some(keys::GSI1_AUDIT_PREFIX)),
        };
        let items = self.inner().store().query(query).await?;
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

    /// The implementation of [`crate::Admin::purge_audit`].
    pub(crate) async fn purge_audit(&self) -> Result<usize> {
        let ns = self.inner().ns();
        let now = self.now_ms();
        let items = self
            .inner()
            .store()
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
                .inner()
                .store()
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
