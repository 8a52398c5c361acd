//! Leases: what an acquire debited, reconciled afterwards (adjust → commit, or rollback).
//!
//! Rule for a lease dropped without `commit` or `rollback`: the debit made by the acquire
//! stands (admission was decided and written when the lease was granted), adjustments that
//! were never committed are discarded, and a warning is logged. Dropping a lease therefore
//! never refunds and never charges more than the estimate. (A copy of a lease exported as a
//! token is dropped without the warning: the token can still finish it.)
//!
//! A lease exported as a token (`crate::lease_token`) can be resumed by any limiter over
//! the same store; its first commit or rollback, wherever it runs, records the closure
//! before anything else is written, so it closes once. Nothing below changes for it.
//!
//! Rule "a lease's net never goes below zero": per limit, what the lease consumed (the
//! acquire's debit plus every adjustment) never drops below zero — a refund returns at most
//! what the lease took, never tokens of earlier leases ([`Error::InvalidAdjustment`]).
//!
//! Rule "usage counts at the instant it is reported": a positive adjustment is charged
//! when `commit` writes it, after the refill up to that instant — as a balance-only `ADD`
//! only while the shard's trust horizon holds (`vu` later than now, where such an `ADD` is
//! exact), otherwise by an rf-locked write that materialises the balance first — so earlier
//! refill can neither absorb it nor let it escape the ceiling. Usage the lease's shard
//! cannot cover is taken from its siblings and the rest is levelled over the entity's
//! shards as debt (`tollgate_core::spread`). A refund keeps the trust horizon
//! (`tollgate_core::writes::refund_trust`) or pulls `vu` in.

use std::collections::BTreeMap;
use std::sync::Arc;

use tollgate_core::bucket::BucketImage;
use tollgate_core::expr::Condition;
use tollgate_core::limit::{MAX_TOKENS, MILLI};
use tollgate_core::value::Key;
use tollgate_core::{Limit, LimitStatus, RuleError};
use tollgate_store::StoreError;

use crate::error::{Error, Result};
use crate::limiter::Inner;
use crate::request::Request;

mod bypassed;
mod charge;
mod materialised;
mod refund;
mod shared;

pub(crate) use shared::{Claim, Shared};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Open,
    Closed,
}

/// One shard a lease holds tokens on.
#[derive(Debug, Clone)]
pub(crate) struct Part {
    /// Shard index.
    pub shard: u32,
    /// Its bucket key.
    pub key: Key,
    /// Milli held there per limit: the debit, plus the adjustments that landed there.
    pub held: BTreeMap<String, i64>,
    /// Per quota limit: the condition under which a refund still belongs to the debit's
    /// period (see `tollgate_core::writes::refund_pin`).
    pub pins: BTreeMap<String, Condition>,
    /// The item right after the debit, when the write returned it (a refund's trust check
    /// is computed from it).
    pub image: Option<Arc<BucketImage>>,
    /// ADR-151: debited while its scope was bypassed — nothing was taken from a balance, so
    /// the lease's adjustments are recorded in `tc` only.
    pub bypassed: bool,
}

/// A granted request. Amounts are in tokens.
pub struct Lease {
    pub(crate) lim: Option<Arc<Inner>>,
    pub(crate) req: Option<Request>,
    pub(crate) entity: Arc<str>,
    pub(crate) resource: Arc<str>,
    /// The shards debited; the first is the one the acquire aimed at.
    pub(crate) parts: Vec<Part>,
    pub(crate) pending: BTreeMap<String, i64>,
    pub(crate) statuses: Vec<LimitStatus>,
    /// The parent's lease of a cascade acquire (ADR-146): adjust, commit and rollback apply
    /// to it too. A parent lease never has a parent of its own (C4).
    pub(crate) parent: Option<Box<Lease>>,
    pub(crate) state: State,
    /// Set once the lease was exported as a token (`crate::lease_token`): its id, version
    /// and expiry, and whether its closure is claimed in the store.
    pub(crate) shared: Option<Shared>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<(u32, &BTreeMap<String, i64>)> =
            self.parts.iter().map(|p| (p.shard, &p.held)).collect();
        f.debug_struct("Lease")
            .field("entity", &self.entity)
            .field("resource", &self.resource)
            .field("degraded", &self.lim.is_none())
            .field("held_milli_by_shard", &parts)
            .field("pending_milli", &self.pending)
            .field("statuses", &self.statuses)
            .field("parent", &self.parent)
            .field("closed", &(self.state == State::Closed))
            .field("shared", &self.shared)
            .finish()
    }
}

impl Lease {
    pub(crate) fn granted(
        lim: Arc<Inner>,
        req: &Request,
        parts: Vec<Part>,
        statuses: Vec<LimitStatus>,
    ) -> Self {
        debug_assert!(
            !parts.is_empty(),
            "a granted lease holds at least one shard"
        );
        Lease {
            lim: Some(lim),
            req: Some(req.clone()),
            entity: req.entity.clone(),
            resource: req.resource.clone(),
            parts,
            pending: BTreeMap::new(),
            statuses,
            parent: None,
            state: State::Open,
            shared: None,
        }
    }

    /// A lease granted without the store (`on_unavailable = allow`): writes nothing.
    pub(crate) fn degraded(entity: &str, resource: &str) -> Self {
        Lease {
            lim: None,
            req: None,
            entity: entity.into(),
            resource: resource.into(),
            parts: Vec::new(),
            pending: BTreeMap::new(),
            statuses: Vec::new(),
            parent: None,
            state: State::Open,
            shared: None,
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

    /// The shard the acquire debited (the first, when it debited several).
    pub fn shard(&self) -> u32 {
        self.parts.first().map_or(0, |p| p.shard)
    }

    /// Every shard the lease holds tokens on.
    pub fn shards(&self) -> Vec<u32> {
        self.parts.iter().map(|p| p.shard).collect()
    }

    /// Statuses of the limits the acquire named, as admitted.
    pub fn statuses(&self) -> &[LimitStatus] {
        &self.statuses
    }

    /// The limits the acquire was judged by (the resolved ones, or the call's overrides),
    /// shared; `None` for a degraded lease (no store answered).
    pub fn judged_by(&self) -> Option<Arc<[Limit]>> {
        self.req.as_ref().map(|r| Arc::clone(&r.limits))
    }

    /// The parent's lease when the acquire cascaded (ADR-146): its entity, shard and
    /// statuses.
    pub fn parent(&self) -> Option<&Lease> {
        self.parent.as_deref()
    }

    fn limits(&self) -> &[Limit] {
        self.req.as_ref().map_or(&[], |r| &r.limits[..])
    }

    /// Milli held per limit over every shard (debit and landed adjustments).
    fn held(&self) -> BTreeMap<String, i64> {
        let mut out: BTreeMap<String, i64> = BTreeMap::new();
        for p in &self.parts {
            for (n, m) in &p.held {
                *out.entry(n.clone()).or_default() += m;
            }
        }
        out
    }

    /// Tokens consumed per limit: the acquire's debit plus adjustments so far (this
    /// entity's; a cascade parent's are on [`Lease::parent`]).
    pub fn consumed(&self) -> BTreeMap<String, i64> {
        let mut out = self.held();
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
    /// balance (debt is allowed); refused with [`Error::InvalidAdjustment`] when it would
    /// return more than the lease consumed of `limit`. Written by [`Lease::commit`].
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
        if !self.limits().iter().any(|l| l.name() == limit) {
            return Err(Error::UnknownLimit {
                limit: limit.into(),
                resource: self.resource.to_string(),
                known: self
                    .limits()
                    .iter()
                    .map(|l| l.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let held = self.held().get(limit).copied().unwrap_or(0);
        let pending = self.pending.get(limit).copied().unwrap_or(0);
        let next =
            tollgate_core::lease::adjust_pending(held, pending, delta).map_err(|consumed| {
                Error::InvalidAdjustment {
                    limit: limit.into(),
                    delta,
                    consumed,
                }
            })?;
        // ADR-146: a cascade lease adjusts the parent as well, on the limits it shares
        // (checked first, so a refusal there leaves both sides as they were).
        if let Some(p) = self.parent.as_deref_mut() {
            if p.limits().iter().any(|l| l.name() == limit) {
                p.adjust(limit, delta)?;
            }
        }
        if next == 0 {
            self.pending.remove(limit);
        } else {
            self.pending.insert(limit.to_string(), next);
        }
        // A shared lease's token changes with every adjustment (see `crate::lease_token`).
        if let Some(s) = self.shared.as_mut() {
            s.version += 1;
        }
        Ok(())
    }

    /// Write the adjustments: refunds on the shards that hold the tokens, usage on the
    /// shard debited (see the module rules); with cascade, then the parent's. After an
    /// ambiguous store failure a side is closed: resending could charge twice. A side that
    /// failed otherwise stays open, and a second call writes only what is still open.
    pub async fn commit(&mut self) -> Result<()> {
        self.finish(false).await
    }

    /// Refund everything the lease holds (exactly: the debit and any adjustment that
    /// landed), discarding pending adjustments; with cascade, the parent's too.
    pub async fn rollback(&mut self) -> Result<()> {
        self.finish(true).await
    }

    async fn finish(&mut self, rollback: bool) -> Result<()> {
        let parent_open = self.parent.as_deref().is_some_and(|p| !p.is_closed());
        if self.state == State::Closed && !parent_open {
            return Err(Error::LeaseClosed);
        }
        // A lease exported as a token closes once, wherever it is finished: its closure is
        // recorded in the store before anything is written (see `crate::lease_token`).
        self.claim_closure(rollback).await?;
        let mut r = Ok(());
        if self.state == State::Open {
            r = if !self.parts.is_empty() && self.parts.iter().all(|p| p.bypassed) {
                self.finish_bypassed(rollback).await
            } else if rollback {
                self.pending.clear();
                // Boxed, as `write_pending` below: each is as large as the rest of this
                // future, and a commit with nothing pending (an acquire committed at once)
                // needs neither.
                Box::pin(self.refund_all()).await
            } else if self.pending.is_empty() {
                // What `write_pending` does with nothing pending: nothing.
                Ok(())
            } else {
                Box::pin(self.write_pending()).await
            };
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

    /// Take back the admitted request this lease's acquire counted on its first part
    /// (`rq`, see `tollgate_core::usage`): for a cascade whose parent refused, after the
    /// child's debit was rolled back. One write on that refusal path only; a failure leaves
    /// the request counted and is logged (never resent: it is an ADD).
    pub(crate) async fn uncount_request(&self) {
        let (Some(lim), Some(p)) = (self.lim.as_ref(), self.parts.first()) else {
            return;
        };
        let u = tollgate_store::UpdateRequest {
            key: p.key.clone(),
            update: tollgate_core::usage::uncount_request(tollgate_core::expr::Update::new()),
            condition: Some(Condition::exists("PK")),
            returns: tollgate_core::expr::ReturnValues::None,
        };
        if let Err(e) = lim.store().update(u).await {
            tracing::warn!(error = %e, "cascade: the refused request stays counted in usage");
        }
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
}

/// A lease write retried, with back-off, while the store says nothing was applied and the
/// same request may be resent (throttled, conflicting): a commit that stopped half-way would
/// leave a lease half-reconciled. Three retries, then the error.
pub(crate) async fn retrying<T, F, Fut>(mut f: F) -> std::result::Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, StoreError>>,
{
    let mut attempt = 0;
    loop {
        match f().await {
            Err(e) if e.is_retryable() && attempt < 3 => {
                tokio::time::sleep(crate::request::backoff(attempt)).await;
                attempt += 1;
            }
            r => return r,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // A copy of a shared lease is not the lease: its token can still finish it.
        if self.state == State::Open && !self.pending.is_empty() && self.shared.is_none() {
            tracing::warn!(
                entity = %self.entity,
                resource = %self.resource,
                "lease dropped without commit or rollback: the acquire's debit stands, {} uncommitted adjustment(s) discarded",
                self.pending.len()
            );
        }
    }
}
