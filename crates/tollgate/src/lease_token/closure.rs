//! Closure records: a shared lease closes once (the rule is in `super`).

use tollgate_core::bucket::attr;
use tollgate_core::expr::Condition;
use tollgate_core::keys;
use tollgate_core::value::{Item, Value};
use tollgate_store::{PutRequest, StoreError};

use crate::error::{Error, Result};
use crate::lease::{retrying, Lease, State};

use super::*;

/// Attributes of a closure record.
mod rec {
    pub const LEASE_ID: &str = "lease_id";
    pub const CLOSER: &str = "closer";
    pub const CLOSED_BY: &str = "closed_by";
    pub const CLOSED_AT: &str = "closed_at";
}

/// The expiry of a closure record (epoch s): past the lease's, with the margin.
pub(super) fn closure_ttl_s(expires_at_ms: i64) -> i64 {
    expires_at_ms
        .div_euclid(1000)
        .saturating_add(1 + CLOSURE_MARGIN_S)
}

impl Lease {
    /// The id of a shared lease (32 hex digits; `None` until it is exported).
    pub fn token_id(&self) -> Option<&str> {
        self.shared.as_ref().map(|s| s.id.as_str())
    }

    /// The version of a shared lease: 0 when exported, one more per adjustment (0 for a
    /// lease never exported).
    pub fn version(&self) -> u64 {
        self.shared.as_ref().map_or(0, |s| s.version)
    }

    /// When a shared lease expires (epoch ms; `None` until it is exported).
    pub fn expires_at_ms(&self) -> Option<i64> {
        self.shared.as_ref().map(|s| s.expires_at_ms)
    }

    /// Whether this copy of a shared lease began to close: its closure record was sent (a
    /// copy that holds it is the only one that can finish the close).
    pub fn is_closing(&self) -> bool {
        self.shared.as_ref().is_some_and(|s| s.claim != Claim::None)
    }

    /// Close this copy without writing anything (it cannot be closed: elsewhere, or late).
    pub(super) fn close_unwritten(&mut self) {
        self.state = State::Closed;
        self.pending.clear();
        if let Some(p) = self.parent.as_deref_mut() {
            p.close_unwritten();
        }
    }

    /// Rule "a shared lease closes once": record the closure before the first write of a
    /// commit or rollback (nothing for a lease never exported, or degraded).
    pub(crate) async fn claim_closure(&mut self, rollback: bool) -> Result<()> {
        let Some(lim) = self.lim.clone() else {
            return Ok(());
        };
        let Some(sh) = self.shared.as_mut() else {
            return Ok(());
        };
        let nonce = match &sh.claim {
            Claim::Held => return Ok(()),
            Claim::Sent(n) => n.clone(),
            Claim::None => format!("{:016x}", rand::random::<u64>()),
        };
        let now = lim.clock().now_ms();
        if now > sh.expires_at_ms.saturating_add(LATE_CLOSE_MS) {
            tracing::warn!(
                lease = %sh.id,
                entity = %self.entity,
                resource = %self.resource,
                "shared lease closed too long after its expiry: nothing written (the acquire's debit stands)"
            );
            self.close_unwritten();
            return Err(Error::LeaseExpired);
        }
        sh.claim = Claim::Sent(nonce.clone());
        let id = sh.id.clone();
        let ttl_s = closure_ttl_s(sh.expires_at_ms);
        let key = keys::lease_closure(lim.ns(), &id);
        let mut item = Item::new();
        item.insert(rec::LEASE_ID.into(), Value::S(id.clone()));
        item.insert(rec::CLOSER.into(), Value::S(nonce.clone()));
        item.insert(
            rec::CLOSED_BY.into(),
            Value::S(if rollback { "rollback" } else { "commit" }.into()),
        );
        item.insert(rec::CLOSED_AT.into(), Value::N(now));
        item.insert(attr::TTL.into(), Value::N(ttl_s));
        let condition =
            Condition::not_exists("PK").or(Condition::le(attr::TTL, now.div_euclid(1000)));
        let r = retrying(|| {
            let req = PutRequest {
                key: key.clone(),
                item: item.clone(),
                condition: Some(condition.clone()),
            };
            let store = lim.store().clone();
            async move { store.put(req).await }
        })
        .await;
        match r {
            Ok(()) => {}
            // Our own record: an earlier send whose outcome was unknown landed.
            Err(StoreError::ConditionFailed { old: Some(old) })
                if old.get(rec::CLOSER).and_then(Value::as_s) == Some(nonce.as_str()) => {}
            Err(StoreError::ConditionFailed { .. }) => {
                tracing::debug!(lease = %id, "shared lease already closed elsewhere");
                self.close_unwritten();
                return Err(Error::LeaseClosed);
            }
            // Unknown outcome or unreachable: the claim stays `Sent`, resent with the same
            // nonce by the next commit or rollback of this copy.
            Err(e) => return Err(e.into()),
        }
        if let Some(sh) = self.shared.as_mut() {
            sh.claim = Claim::Held;
        }
        if lim.store().backend() != "dynamodb" {
            lim.closures().remember(ttl_s, id);
        }
        Ok(())
    }
}
