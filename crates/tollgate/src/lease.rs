//! Leases: what an acquire debited, reconciled afterwards (adjust → commit, or rollback).
//!
//! Rule for a lease dropped without `commit` or `rollback`: the debit made by the acquire
//! stands (admission was decided and written when the lease was granted), adjustments that
//! were never committed are discarded, and a warning is logged. Dropping a lease therefore
//! never refunds and never charges more than the estimate.

use std::collections::BTreeMap;
use std::sync::Arc;

use tollgate_core::bucket::{attr, BucketImage};
use tollgate_core::expr::{Condition, ReturnValues, Update};
use tollgate_core::limit::{MAX_TOKENS, MILLI};
use tollgate_core::value::Key;
use tollgate_core::writes::adjust_write;
use tollgate_core::{Limit, LimitStatus, RuleError};
use tollgate_store::{StoreError, UpdateRequest};

use crate::error::{Error, Result};
use crate::limiter::Inner;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    Closed,
}

/// A granted request. Amounts are in tokens.
#[derive(Debug)]
pub struct Lease {
    pub(crate) lim: Option<Arc<Inner>>,
    pub(crate) entity: String,
    pub(crate) resource: String,
    pub(crate) shard: u32,
    pub(crate) key: Key,
    pub(crate) limits: Vec<Limit>,
    pub(crate) ceilings: BTreeMap<String, i64>,
    /// Per quota limit: the condition under which a refund still belongs to the debit's
    /// period (see `tollgate_core::writes::refund_pin`).
    pub(crate) pins: BTreeMap<String, Condition>,
    pub(crate) initial: Vec<(String, i64)>,
    pub(crate) pending: BTreeMap<String, i64>,
    pub(crate) statuses: Vec<LimitStatus>,
    /// The parent's lease of a cascade acquire (ADR-146): adjust, commit and rollback apply
    /// to it too. A parent lease never has a parent of its own (C4).
    pub(crate) parent: Option<Box<Lease>>,
    state: State,
}

impl Lease {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn granted(
        lim: Arc<Inner>,
        entity: &str,
        resource: &str,
        shard: u32,
        key: Key,
        limits: Vec<Limit>,
        ceilings: BTreeMap<String, i64>,
        pins: BTreeMap<String, Condition>,
        initial: Vec<(String, i64)>,
        statuses: Vec<LimitStatus>,
    ) -> Self {
        Lease {
            lim: Some(lim),
            entity: entity.into(),
            resource: resource.into(),
            shard,
            key,
            limits,
            ceilings,
            pins,
            initial,
            pending: BTreeMap::new(),
            statuses,
            parent: None,
            state: State::Open,
        }
    }

    /// A lease granted without the store (`on_unavailable = allow`): writes nothing.
    pub(crate) fn degraded(entity: &str, resource: &str) -> Self {
        Lease {
            lim: None,
            entity: entity.into(),
            resource: resource.into(),
            shard: 0,
            key: Key::new("", ""),
            limits: Vec::new(),
            ceilings: BTreeMap::new(),
            pins: BTreeMap::new(),
            initial: Vec::new(),
            pending: BTreeMap::new(),
            statuses: Vec::new(),
            parent: None,
            state: State::Open,
        }
    }

    /// Whether the store was unreachable and the request was admitted without it.
    pub fn is_degraded(&self) -> bool {
        self.lim.is_none()
    }

    /// The entity.
    pub fn entity(&self) -> &str {
        &self.entity
    }

    /// The resource.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The shard the acquire debited.
    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// Statuses of the limits the acquire named, as admitted.
    pub fn statuses(&self) -> &[LimitStatus] {
        &self.statuses
    }

    /// The parent's lease when the acquire cascaded (ADR-146): its entity, shard and
    /// statuses.
    pub fn parent(&self) -> Option<&Lease> {
        self.parent.as_deref()
    }

    /// Tokens consumed per limit: the acquire's debit plus adjustments so far (this
    /// entity's; a cascade parent's are on [`Lease::parent`]).
    pub fn consumed(&self) -> BTreeMap<String, i64> {
        let mut out: BTreeMap<String, i64> = BTreeMap::new();
        for (n, m) in &self.initial {
            *out.entry(n.clone()).or_default() += m;
        }
        for (n, m) in &self.pending {
            *out.entry(n.clone()).or_default() += m;
        }
        out.into_iter().map(|(n, m)| (n, m / MILLI)).collect()
    }

    /// Whether commit or rollback already ran.
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Record that `delta` more tokens (negative: fewer) were used of `limit` — any limit of
    /// the resource, including one the acquire did not name. Never refused for lack of
    /// balance (debt is allowed); written by [`Lease::commit`].
    pub fn adjust(&mut self, limit: &str, delta: i64) -> Result<()> {
        if self.state == State::Closed {
            return Err(Error::LeaseClosed);
        }
        if delta.abs() > MAX_TOKENS {
            return Err(Error::Invalid(RuleError::InvalidAmount {
                limit: limit.into(),
                reason: "adjustment out of range",
            }));
        }
        if self.lim.is_none() {
            return Ok(());
        }
        if !self.limits.iter().any(|l| l.name() == limit) {
            return Err(Error::UnknownLimit {
                limit: limit.into(),
                resource: self.resource.clone(),
                known: self
                    .limits
                    .iter()
                    .map(|l| l.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let e = self.pending.entry(limit.to_string()).or_default();
        *e = e.saturating_add(delta * MILLI);
        if *e == 0 {
            self.pending.remove(limit);
        }
        // ADR-146: a cascade lease adjusts the parent as well, on the limits it shares.
        if let Some(p) = self.parent.as_deref_mut() {
            if p.limits.iter().any(|l| l.name() == limit) {
                p.adjust(limit, delta)?;
            }
        }
        Ok(())
    }

    /// Write the adjustments (one unconditional ADD on the debited shard; with cascade,
    /// then one on the parent's). After an ambiguous store failure a side is closed:
    /// resending could charge twice. A side that failed otherwise stays open, and a second
    /// call writes only what is still open.
    pub async fn commit(&mut self) -> Result<()> {
        self.finish(false).await
    }

    /// Refund everything the acquire debited (exactly), discarding adjustments; with
    /// cascade, the parent's debit too.
    pub async fn rollback(&mut self) -> Result<()> {
        self.finish(true).await
    }

    async fn finish(&mut self, rollback: bool) -> Result<()> {
        let parent_open = self.parent.as_deref().is_some_and(|p| !p.is_closed());
        if self.state == State::Closed && !parent_open {
            return Err(Error::LeaseClosed);
        }
        let mut r = Ok(());
        if self.state == State::Open {
            let deltas: Vec<(String, i64)> = if rollback {
                self.initial.iter().map(|(k, v)| (k.clone(), -v)).collect()
            } else {
                self.pending.iter().map(|(k, v)| (k.clone(), *v)).collect()
            };
            r = self.write(&deltas).await;
            self.close_after(&r);
        }
        if let Some(p) = self.parent.as_deref_mut().filter(|p| !p.is_closed()) {
            let pr = if rollback {
                Box::pin(p.rollback()).await
            } else {
                Box::pin(p.commit()).await
            };
            if r.is_ok() {
                r = pr;
            }
        }
        r
    }

    fn close_after(&mut self, r: &Result<()>) {
        match r {
            Ok(()) | Err(Error::Unavailable(StoreError::Ambiguous(_))) => {
                self.state = State::Closed;
                self.pending.clear();
            }
            Err(_) => {}
        }
    }

    async fn write(&self, deltas: &[(String, i64)]) -> Result<()> {
        let Some(lim) = &self.lim else {
            return Ok(());
        };
        if deltas.iter().all(|(_, d)| *d == 0) {
            return Ok(());
        }
        lim.rejections
            .forget(&self.entity, &self.resource, self.shard);
        // Refunds of quota debits credit the balance only while the shard is still in the
        // debit's period; past it they are recorded in `tc` alone.
        let mut tc_only: Vec<String> = Vec::new();
        let mut attempt = 0;
        let new = loop {
            let mut condition = Condition::exists("PK");
            for (n, d) in deltas {
                if *d < 0 && !tc_only.contains(n) {
                    if let Some(p) = self.pins.get(n) {
                        condition = condition.and(p.clone());
                    }
                }
            }
            let req = UpdateRequest {
                key: self.key.clone(),
                update: adjust_write(deltas, &tc_only),
                condition: Some(condition),
                returns: ReturnValues::AllNew,
            };
            match lim.store.update(req).await {
                Ok(n) => break n,
                Err(StoreError::ConditionFailed { old: None }) => {
                    tracing::warn!(key = %self.key, "lease target bucket is gone; adjustment dropped");
                    return Ok(());
                }
                Err(StoreError::ConditionFailed { old: Some(old) }) if attempt < 3 => {
                    attempt += 1;
                    for (n, d) in deltas {
                        let ended = self
                            .pins
                            .get(n)
                            .is_some_and(|p| !tollgate_store::eval::eval_condition(Some(&old), p));
                        if *d < 0 && ended && !tc_only.contains(n) {
                            tc_only.push(n.clone());
                        }
                    }
                }
                Err(StoreError::ConditionFailed { .. }) => {
                    return Err(Error::Unavailable(StoreError::TransactionConflict))
                }
                Err(e) => return Err(e.into()),
            }
        };
        lim.rejections
            .forget(&self.entity, &self.resource, self.shard);
        // A refund that leaves a balance above its ceiling (e.g. after a reset) forces the
        // next acquire onto the slow path, which clamps it (scenario 8).
        if let Some(img) = new.as_ref().and_then(|i| BucketImage::decode(i).ok()) {
            let above = img
                .limits
                .iter()
                .any(|(n, s)| self.ceilings.get(n).is_some_and(|c| s.tk > *c));
            if above {
                let req = UpdateRequest {
                    key: self.key.clone(),
                    update: Update::new().set(attr::VU, 0),
                    condition: Some(Condition::exists("PK")),
                    returns: ReturnValues::None,
                };
                if let Err(e) = lim.store.update(req).await {
                    tracing::debug!(error = %e, "could not force the slow path after a refund");
                }
            }
        }
        Ok(())
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.state == State::Open && !self.pending.is_empty() {
            tracing::warn!(
                entity = %self.entity,
                resource = %self.resource,
                "lease dropped without commit or rollback: the acquire's debit stands, {} uncommitted adjustment(s) discarded",
                self.pending.len()
            );
        }
    }
}
