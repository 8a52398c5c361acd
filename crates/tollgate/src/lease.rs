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

use tollgate_core::bucket::{attr, BucketImage};
use tollgate_core::expr::{Condition, ReturnValues, Update};
use tollgate_core::limit::{MAX_TOKENS, MILLI};
use tollgate_core::mutants::{self, Mutant};
use tollgate_core::value::Key;
use tollgate_core::writes::{adjust_write, refund_trust, refund_untrust, trusted, Charging};
use tollgate_core::{Limit, LimitStatus, RuleError};
use tollgate_store::{CancelReason, StoreError, TransactOp, UpdateRequest};

use crate::acquire::Request;
use crate::error::{Error, Flow, Result};
use crate::limiter::Inner;

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
    pub image: Option<BucketImage>,
}

/// A granted request. Amounts are in tokens.
pub struct Lease {
    pub(crate) lim: Option<Arc<Inner>>,
    pub(crate) req: Option<Request>,
    pub(crate) entity: String,
    pub(crate) resource: String,
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
    pub(crate) shared: Option<crate::lease_token::Shared>,
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

    /// The parent's lease when the acquire cascaded (ADR-146): its entity, shard and
    /// statuses.
    pub fn parent(&self) -> Option<&Lease> {
        self.parent.as_deref()
    }

    fn limits(&self) -> &[Limit] {
        self.req.as_ref().map_or(&[], |r| r.limits.as_slice())
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
                resource: self.resource.clone(),
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
        let net = held
            .saturating_add(pending)
            .saturating_add(delta.saturating_mul(MILLI));
        if net < 0 && !mutants::off(Mutant::LeaseNet) {
            return Err(Error::InvalidAdjustment {
                limit: limit.into(),
                delta,
                consumed: (held + pending) / MILLI,
            });
        }
        // ADR-146: a cascade lease adjusts the parent as well, on the limits it shares
        // (checked first, so a refusal there leaves both sides as they were).
        if let Some(p) = self.parent.as_deref_mut() {
            if p.limits().iter().any(|l| l.name() == limit) {
                p.adjust(limit, delta)?;
            }
        }
        let e = self.pending.entry(limit.to_string()).or_default();
        *e = e.saturating_add(delta * MILLI);
        if *e == 0 {
            self.pending.remove(limit);
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
            r = if rollback {
                self.pending.clear();
                self.refund_all().await
            } else {
                self.write_pending().await
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

    fn close_after(&mut self, r: &Result<()>) {
        match r {
            Ok(()) | Err(Error::Unavailable(StoreError::Ambiguous(_))) => {
                self.state = State::Closed;
                self.pending.clear();
            }
            Err(_) => {}
        }
    }

    /// Take back the admitted request this lease's acquire counted on its first part
    /// (`rq`, see `tollgate_core::usage`): for a cascade whose parent refused, after the
    /// child's debit was rolled back. One write on that refusal path only; a failure leaves
    /// the request counted and is logged (never resent: it is an ADD).
    pub(crate) async fn uncount_request(&self) {
        let (Some(lim), Some(p)) = (self.lim.as_ref(), self.parts.first()) else {
            return;
        };
        let u = UpdateRequest {
            key: p.key.clone(),
            update: tollgate_core::usage::uncount_request(Update::new()),
            condition: Some(Condition::exists("PK")),
            returns: ReturnValues::None,
        };
        if let Err(e) = lim.store.update(u).await {
            tracing::warn!(error = %e, "cascade: the refused request stays counted in usage");
        }
    }

    /// Rollback: every part refunds what it holds (one transaction when several do).
    async fn refund_all(&mut self) -> Result<()> {
        let plan: Vec<(usize, Vec<(String, i64)>)> = (0..self.parts.len())
            .map(|i| {
                let r: Vec<(String, i64)> = self.parts[i]
                    .held
                    .iter()
                    .filter(|(_, m)| **m > 0)
                    .map(|(n, m)| (n.clone(), *m))
                    .collect();
                (i, r)
            })
            .filter(|(_, r)| !r.is_empty())
            .collect();
        self.refund_parts(plan).await
    }

    /// Commit: refunds first (on the parts holding the limit, in order, all in one write or
    /// transaction), then usage on the first part; each step leaves `pending` and `held`
    /// as far as it landed.
    async fn write_pending(&mut self) -> Result<()> {
        let mut plan: BTreeMap<usize, Vec<(String, i64)>> = BTreeMap::new();
        for (n, d) in self.pending.iter().filter(|(_, d)| **d < 0) {
            let mut rest = -d;
            for (i, p) in self.parts.iter().enumerate() {
                let take = p.held.get(n).copied().unwrap_or(0).min(rest);
                if take > 0 {
                    plan.entry(i).or_default().push((n.clone(), take));
                    rest -= take;
                }
                if rest == 0 {
                    break;
                }
            }
            if rest > 0 {
                // Only without the lease-net rule (its mutant): the original refunded the
                // whole amount on the shard debited, whatever the lease held.
                debug_assert!(
                    mutants::off(Mutant::LeaseNet),
                    "refunds stay within what is held"
                );
                let on_first = plan.entry(0).or_default();
                match on_first.iter_mut().find(|(m, _)| m == n) {
                    Some((_, t)) => *t += rest,
                    None => on_first.push((n.clone(), rest)),
                }
            }
        }
        let usage: Vec<(String, i64)> = self
            .pending
            .iter()
            .filter(|(_, d)| **d > 0)
            .map(|(n, d)| (n.clone(), *d))
            .collect();
        if usage.is_empty() {
            if !plan.is_empty() {
                self.refund_parts(plan.into_iter().collect()).await?;
            }
            self.pending.clear();
            return Ok(());
        }
        // Usage lands on the first part together with that part's refunds, in one write. A
        // lease holding refunds on other shards too (it was debited across several) writes
        // them all in one transaction with the usage, charged across the entity.
        let first = plan.remove(&0).unwrap_or_default();
        if !plan.is_empty() {
            let (Some(lim), Some(req)) = (self.lim.clone(), self.req.clone()) else {
                return Ok(());
            };
            let mut ride: Vec<crate::entity::RideAlong<'_>> = plan
                .iter()
                .map(|(i, r)| crate::entity::RideAlong {
                    shard: self.parts[*i].shard,
                    refunds: r.clone(),
                    pins: &self.parts[*i].pins,
                    spread: false,
                })
                .collect();
            if !first.is_empty() {
                ride.push(crate::entity::RideAlong {
                    shard: self.parts[0].shard,
                    refunds: first.clone(),
                    pins: &self.parts[0].pins,
                    spread: false,
                });
            }
            let s = lim
                .shards
                .get(&req.entity, &req.resource)
                .unwrap_or(1)
                .max(2);
            let landed = lim
                .entity_charge(&req, s, self.parts[0].shard, &usage, &ride)
                .await?;
            drop(ride);
            self.land_all(landed);
            self.pending.clear();
            return Ok(());
        }
        let mut deltas = usage;
        deltas.extend(first.into_iter().map(|(n, t)| (n, -t)));
        self.charge_first(&deltas).await?;
        self.pending.clear();
        Ok(())
    }

    /// Refund (positive milli per limit) on several parts at once — one write, or one
    /// transaction when several parts take part (all or none). Per part: a balance-only
    /// `ADD` that keeps the trust horizon where it can, else pulls `vu` in with the same
    /// write; a quota refund whose period ended is recorded in `tc` only.
    async fn refund_parts(&mut self, plan: Vec<(usize, Vec<(String, i64)>)>) -> Result<()> {
        let (Some(lim), Some(req)) = (self.lim.clone(), self.req.clone()) else {
            return Ok(());
        };
        let plan: Vec<(usize, Vec<(String, i64)>)> = plan
            .into_iter()
            .filter(|(_, r)| r.iter().any(|(_, m)| *m != 0))
            .collect();
        if plan.is_empty() {
            return Ok(());
        }
        let s = lim
            .shards
            .get(&req.entity, &req.resource)
            .unwrap_or(1)
            .max(1);
        struct One {
            part: usize,
            refunds: Vec<(String, i64)>,
            deltas: Vec<(String, i64)>,
            tc_only: Vec<String>,
            trust: Option<Condition>,
            /// Some refunded limit drips: its trust horizon must be kept or pulled in.
            drips: bool,
        }
        let mut ones: Vec<One> = plan
            .into_iter()
            .map(|(i, refunds)| {
                let drips = refunds
                    .iter()
                    .any(|(n, _)| req.limits.iter().any(|l| l.name() == n && !l.is_quota()));
                let trust = self.parts[i]
                    .image
                    .as_ref()
                    .filter(|_| drips)
                    .and_then(|img| refund_trust(img, &req.limits, &refunds, s));
                One {
                    part: i,
                    deltas: refunds.iter().map(|(n, r)| (n.clone(), -r)).collect(),
                    refunds,
                    tc_only: Vec::new(),
                    trust,
                    drips,
                }
            })
            .collect();
        for o in &ones {
            lim.rejections
                .forget(&req.entity, &req.resource, self.parts[o.part].shard);
        }
        // Rule "a refund repays the entity's debt": on a sharded entity a dripping refund
        // lands on its shard only while that shard is not in debt; otherwise it is spread
        // over the entity from the bottom up (`tollgate_core::spread::plan_refund`).
        // The shard count this limiter knows may be stale (the lease may date from before
        // a doubling), so every dripping refund carries the "not in debt" condition; a
        // failure shows the item, whose shard count then decides: spread over the
        // entity's shards, or — one shard — repay that shard's own debt (`debt_ok`).
        let guarded = !mutants::off(Mutant::EntityDebit);
        let mut debt_ok = false;
        let drip = |n: &str| req.limits.iter().any(|l| l.name() == n && !l.is_quota());
        let build = |o: &One, parts: &[Part], debt_ok: bool| -> UpdateRequest {
            let mut condition = Condition::exists("PK");
            if guarded && !debt_ok {
                for (n, _) in o.refunds.iter().filter(|(n, _)| drip(n)) {
                    condition =
                        condition.and(Condition::ge(tollgate_core::keys::battr(n, "tk"), 0));
                }
            }
            for (n, _) in &o.refunds {
                if !o.tc_only.contains(n) {
                    if let Some(p) = parts[o.part].pins.get(n) {
                        condition = condition.and(p.clone());
                    }
                }
            }
            let mut update = adjust_write(&o.deltas, &o.tc_only, lim.clock.now_ms());
            match (&o.trust, o.drips) {
                (Some(t), _) => condition = condition.and(t.clone()),
                // Nothing known to keep: pull the trust horizon in (the next acquire
                // materialises and clamps).
                (None, true) => update = refund_untrust(update, &req.limits, &o.refunds),
                (None, false) => {}
            }
            UpdateRequest {
                key: parts[o.part].key.clone(),
                update,
                condition: Some(condition),
                returns: ReturnValues::AllNew,
            }
        };
        let mut attempt = 0;
        let news: Vec<Option<tollgate_core::value::Item>> = loop {
            // Per part: the old item when its condition failed (`Some(None)`: gone).
            let failed: Vec<(usize, Option<tollgate_core::value::Item>)> = if ones.len() == 1 {
                let u = build(&ones[0], &self.parts, debt_ok);
                match retrying(|| lim.store.update(u.clone())).await {
                    Ok(n) => break vec![n],
                    Err(StoreError::ConditionFailed { old }) => vec![(0, old.map(|b| *b))],
                    Err(e) => return Err(e.into()),
                }
            } else {
                let ops: Vec<TransactOp> = ones
                    .iter()
                    .map(|o| TransactOp::Update(build(o, &self.parts, debt_ok)))
                    .collect();
                match retrying(|| lim.store.transact_write(ops.clone(), None)).await {
                    Ok(()) => break ones.iter().map(|_| None).collect(),
                    Err(StoreError::TransactionCanceled { reasons }) => {
                        let f: Vec<(usize, Option<tollgate_core::value::Item>)> = reasons
                            .into_iter()
                            .enumerate()
                            .filter_map(|(i, r)| match r {
                                CancelReason::ConditionFailed { old } => Some((i, old)),
                                _ => None,
                            })
                            .collect();
                        if f.is_empty() {
                            return Err(Error::Unavailable(StoreError::TransactionConflict));
                        }
                        f
                    }
                    Err(e) => return Err(e.into()),
                }
            };
            if attempt >= 3 {
                return Err(Error::Unavailable(StoreError::TransactionConflict));
            }
            attempt += 1;
            let seen_s = failed
                .iter()
                .filter_map(|(_, old)| old.as_ref())
                .filter_map(|old| {
                    old.get(attr::SHARD_COUNT)
                        .and_then(tollgate_core::value::Value::as_n)
                })
                .fold(s, i64::max);
            if seen_s > s {
                lim.shards.raise(&req.entity, &req.resource, seen_s);
            }
            let in_debt = guarded
                && failed.iter().any(|(j, old)| {
                    old.as_ref().is_some_and(|old| {
                        ones[*j].refunds.iter().any(|(n, _)| {
                            drip(n)
                                && old
                                    .get(&tollgate_core::keys::battr(n, "tk"))
                                    .and_then(tollgate_core::value::Value::as_n)
                                    .is_some_and(|tk| tk < 0)
                        })
                    })
                });
            if in_debt && seen_s <= 1 {
                // One shard: the refund repays its own debt.
                debt_ok = true;
                continue;
            }
            if in_debt {
                let ride: Vec<crate::entity::RideAlong<'_>> = ones
                    .iter()
                    .map(|o| crate::entity::RideAlong {
                        shard: self.parts[o.part].shard,
                        refunds: o.refunds.clone(),
                        pins: &self.parts[o.part].pins,
                        spread: true,
                    })
                    .collect();
                let first = self.parts[ones[0].part].shard;
                let landed = lim.entity_charge(&req, seen_s, first, &[], &ride).await?;
                drop(ride);
                // The refunds were taken off what each part holds; where they landed is
                // the entity's.
                for o in &ones {
                    let deltas = o.deltas.clone();
                    self.land(o.part, &deltas);
                }
                for l in &landed {
                    lim.rejections.forget(&req.entity, &req.resource, l.shard);
                    lim.images.forget(&req.entity, &req.resource, l.shard);
                }
                return Ok(());
            }
            let mut gone = Vec::new();
            for (j, old) in failed {
                let Some(old) = old else {
                    gone.push(j);
                    continue;
                };
                let o = &mut ones[j];
                for (n, _) in &o.refunds {
                    let ended = self.parts[o.part]
                        .pins
                        .get(n)
                        .is_some_and(|p| !tollgate_store::eval::eval_condition(Some(&old), p));
                    if ended && !o.tc_only.contains(n) {
                        o.tc_only.push(n.clone());
                    }
                }
                // The item moved on since the lease saw it: its horizon cannot be kept
                // without knowing it, so the refund pulls `vu` in.
                if o.trust
                    .as_ref()
                    .is_some_and(|t| !tollgate_store::eval::eval_condition(Some(&old), t))
                {
                    o.trust = None;
                }
            }
            for j in gone.into_iter().rev() {
                let o = ones.remove(j);
                tracing::warn!(key = %self.parts[o.part].key, "lease target bucket is gone; refund dropped");
                let deltas = o.deltas.clone();
                self.land(o.part, &deltas);
            }
            if ones.is_empty() {
                return Ok(());
            }
        };
        for (o, new) in ones.iter().zip(news) {
            let deltas = o.deltas.clone();
            self.land(o.part, &deltas);
            let shard = self.parts[o.part].shard;
            let key = self.parts[o.part].key.clone();
            lim.rejections.forget(&req.entity, &req.resource, shard);
            let img = new.as_ref().and_then(|i| BucketImage::decode(i).ok());
            match &img {
                Some(img) => lim
                    .images
                    .put(&req.entity, &req.resource, shard, img.clone()),
                None => lim.images.forget(&req.entity, &req.resource, shard),
            }
            // A refund that leaves a quota balance above its ceiling (e.g. after a reset)
            // forces the next acquire onto the slow path, which clamps it (scenario 8).
            if let Some(img) = img.filter(|img| img.vu.is_none_or(|v| v > 0)) {
                let above = img.limits.iter().any(|(n, st)| {
                    req.limits.iter().find(|l| l.name() == n).is_some_and(|l| {
                        let e = tollgate_core::materialize::evaluate(
                            l,
                            Some(st),
                            img.rf,
                            s,
                            img.rf,
                            None,
                        );
                        st.tk > e.ceiling
                    })
                });
                if above {
                    let r = lim
                        .store
                        .update(UpdateRequest {
                            key: key.clone(),
                            update: Update::new().set(attr::VU, 0),
                            condition: Some(Condition::exists("PK")),
                            returns: ReturnValues::None,
                        })
                        .await;
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "could not force the slow path after a refund");
                    }
                    lim.images.forget(&req.entity, &req.resource, shard);
                }
            }
        }
        Ok(())
    }

    /// Record on part `i` that `deltas` (milli, positive = usage) landed there.
    fn land(&mut self, i: usize, deltas: &[(String, i64)]) {
        for (n, d) in deltas {
            *self.parts[i].held.entry(n.clone()).or_default() += d;
        }
    }

    /// Write `deltas` (milli; positive: reported usage, negative: refunds of what this
    /// part holds) on the first part at the instant they are reported: one balance-only
    /// `ADD` while the shard is trusted and covers the usage (the refunds keeping its trust
    /// horizon or pulling `vu` in); otherwise one rf-locked write that materialises the
    /// balance first — spread over the entity's shards when this one cannot cover the usage
    /// (see the module rules).
    async fn charge_first(&mut self, deltas: &[(String, i64)]) -> Result<()> {
        let (Some(lim), Some(req)) = (self.lim.clone(), self.req.clone()) else {
            return Ok(());
        };
        let (key, shard) = (self.parts[0].key.clone(), self.parts[0].shard);
        lim.rejections.forget(&req.entity, &req.resource, shard);
        let s = lim
            .shards
            .get(&req.entity, &req.resource)
            .unwrap_or(1)
            .max(1);
        let refunds: Vec<(String, i64)> = deltas
            .iter()
            .filter(|(_, d)| *d < 0)
            .map(|(n, d)| (n.clone(), -d))
            .collect();
        let drip_refund = refunds
            .iter()
            .any(|(n, _)| req.limits.iter().any(|l| l.name() == n && !l.is_quota()));
        let usage: Vec<(String, i64)> = deltas.iter().filter(|(_, d)| *d > 0).cloned().collect();
        let mut condition = Condition::exists("PK");
        if s > 1 && !mutants::off(Mutant::EntityDebit) {
            // A dripping refund lands here only while this shard is not in debt (see
            // `refund_parts`).
            for (n, _) in refunds
                .iter()
                .filter(|(n, _)| req.limits.iter().any(|l| l.name() == n && !l.is_quota()))
            {
                condition = condition.and(Condition::ge(tollgate_core::keys::battr(n, "tk"), 0));
            }
        }
        for (n, d) in deltas {
            if *d > 0 {
                condition = condition.and(Condition::ge(tollgate_core::keys::battr(n, "tk"), *d));
            } else if let Some(p) = self.parts[0].pins.get(n) {
                condition = condition.and(p.clone());
            }
        }
        let mut update = adjust_write(deltas, &[], lim.clock.now_ms());
        if drip_refund {
            match self.parts[0]
                .image
                .as_ref()
                .and_then(|img| refund_trust(img, &req.limits, &refunds, s))
            {
                Some(t) => condition = condition.and(t),
                None => update = refund_untrust(update, &req.limits, &refunds),
            }
        }
        // Each attempt carries a fresh clock reading: the trust check is only as good as
        // the `now` it compares (a resent request with an old one could pass it late).
        let r = retrying(|| {
            let u = UpdateRequest {
                key: key.clone(),
                update: update.clone(),
                condition: Some(condition.clone().and(trusted(
                    &req.limits,
                    &usage,
                    lim.clock.now_ms(),
                ))),
                returns: ReturnValues::AllNew,
            };
            let store = lim.store.clone();
            async move { store.update(u).await }
        })
        .await;
        let old = match r {
            Ok(new) => {
                self.land(0, deltas);
                lim.remember(&req, shard, new.as_ref())?;
                return Ok(());
            }
            Err(StoreError::ConditionFailed { old: None }) => {
                tracing::warn!(key = %key, "lease target bucket is gone; adjustment dropped");
                self.land(0, deltas);
                return Ok(());
            }
            Err(StoreError::ConditionFailed { old: Some(old) }) => old,
            Err(e) => return Err(e.into()),
        };
        // A quota refund whose period ended is recorded in `tc` only.
        let tc_only: Vec<String> = refunds
            .iter()
            .filter(|(n, _)| {
                self.parts[0]
                    .pins
                    .get(n)
                    .is_some_and(|p| !tollgate_store::eval::eval_condition(Some(&old), p))
            })
            .map(|(n, _)| n.clone())
            .collect();
        let part = self.parts[0].clone();
        let landed = lim
            .charge_materialised(&req, &part, *old, deltas, &tc_only)
            .await?;
        self.land_all(landed);
        Ok(())
    }

    /// Record what an entity-wide charge landed, shard by shard (new shards become parts).
    fn land_all(&mut self, landed: Vec<crate::entity::Landing>) {
        for crate::entity::Landing {
            shard: sh,
            key: k,
            charged: takes,
        } in landed
        {
            let i = match self.parts.iter().position(|p| p.shard == sh) {
                Some(i) => i,
                None => {
                    self.parts.push(Part {
                        shard: sh,
                        key: k,
                        held: BTreeMap::new(),
                        pins: BTreeMap::new(),
                        image: None,
                    });
                    self.parts.len() - 1
                }
            };
            self.land(i, &takes);
        }
    }
}

impl Inner {
    /// Write `deltas` (debt allowed; negative: refunds, `tc_only` ones in `tc` alone) on
    /// `shard`, materialised from `img`: one rf-locked write when the shard covers the usage
    /// (or is the entity's only one); else one transaction that takes the usage across the
    /// entity's shards with this shard's refunds. Returns where it landed: (shard, key, milli
    /// per limit).
    pub(crate) async fn charge_materialised(
        self: &Arc<Self>,
        req: &Request,
        part: &Part,
        item: tollgate_core::value::Item,
        deltas: &[(String, i64)],
        tc_only: &[String],
    ) -> Result<Vec<crate::entity::Landing>> {
        let (shard, key, pins) = (part.shard, &part.key, &part.pins);
        let mut item = item;
        let deltas = deltas.to_vec();
        let mut retries = 0;
        for _ in 0..6 {
            let img = BucketImage::decode(&item)?;
            let now = self.clock.now_ms();
            let mut s = self
                .shards
                .get(&req.entity, &req.resource)
                .unwrap_or(1)
                .max(img.shard_count);
            let at = |s: i64| -> Vec<tollgate_core::materialize::Evaluated> {
                req.limits
                    .iter()
                    .map(|l| {
                        tollgate_core::materialize::evaluate(
                            l,
                            img.limits.get(l.name()),
                            img.rf,
                            s,
                            now,
                            None,
                        )
                    })
                    .collect()
            };
            let mut evals = at(s);
            // Rule "a grant is sized at the live shard count" (see `Inner::commit_slot`): a
            // quota this write resets or rolls is sized at shard 0's count, pinned.
            let mut pin = None;
            if evals.iter().any(|e| e.gc.is_some()) {
                let s0 = if shard == 0 {
                    Some(img.shard_count)
                } else {
                    self.shard0_count(req).await?
                };
                if s0.unwrap_or(1) > s {
                    s = s0.unwrap_or(1);
                    evals = at(s);
                }
                pin = Some(s0.map_or(crate::acquire::CountPin::Absent, |c| {
                    crate::acquire::CountPin::Count(c.max(s))
                }));
            }
            let covers = deltas.iter().filter(|(_, d)| *d > 0).all(|(n, d)| {
                evals
                    .iter()
                    .find(|e| e.name == *n)
                    .is_some_and(|e| e.balance >= *d)
            });
            // A dripping refund on a shard in debt repays the entity from the bottom up.
            let in_debt = deltas.iter().any(|(n, d)| {
                *d < 0
                    && req.limits.iter().any(|l| l.name() == n && !l.is_quota())
                    && evals.iter().any(|e| e.name == *n && e.balance < 0)
            });
            if (!covers || in_debt) && s > 1 && !mutants::off(Mutant::EntityDebit) {
                // The usage is taken across the entity; this shard's refunds ride in the
                // same transaction.
                let usage: Vec<(String, i64)> =
                    deltas.iter().filter(|(_, d)| *d > 0).cloned().collect();
                let refunds: Vec<(String, i64)> = deltas
                    .iter()
                    .filter(|(_, d)| *d < 0)
                    .map(|(n, d)| (n.clone(), -d))
                    .collect();
                let ride = [crate::entity::RideAlong {
                    shard,
                    refunds,
                    pins,
                    spread: in_debt,
                }];
                return self.entity_charge(req, s, shard, &usage, &ride).await;
            }
            // Rule "a refund stays in its period", on the item this write is planned from: a
            // refund whose period ended (its pin fails here) or that this very write resets
            // is recorded in `tc` only.
            let tc_only: Vec<String> = deltas
                .iter()
                .filter(|(_, d)| *d < 0)
                .map(|(n, _)| n.clone())
                .filter(|n| {
                    tc_only.contains(n)
                        || pins
                            .get(n)
                            .is_some_and(|p| !tollgate_store::eval::eval_condition(Some(&item), p))
                        || evals.iter().any(|e| e.name == *n && e.transition.is_set())
                })
                .collect();
            let (write, _) = self.materialising_write(
                req,
                key,
                &img,
                &evals,
                &deltas,
                Charging {
                    debt: true,
                    tc_only: &tc_only,
                },
                now,
            );
            let landed = if pin.is_some() {
                match self
                    .commit_slot(
                        req,
                        shard,
                        tollgate_store::TransactOp::Update(write),
                        &[],
                        pin,
                    )
                    .await
                {
                    Ok(Ok(new)) => Ok(new.map(|b| *b)),
                    Ok(Err(crate::acquire::LostLock(old))) => {
                        Err(StoreError::ConditionFailed { old })
                    }
                    // Shard 0's count moved (a doubling): plan again.
                    Err(Flow::Reread) | Err(Flow::MoveLost) => continue,
                    Err(Flow::Fail(Error::Unavailable(e))) => Err(e),
                    Err(Flow::Fail(e)) => return Err(e),
                }
            } else {
                self.store.update(write).await
            };
            // Throttled or conflicting: nothing applied; planned again with a fresh clock
            // reading after a back-off (a resent write would carry the old one).
            if let Err(e) = &landed {
                if e.is_retryable() && retries < 3 {
                    tokio::time::sleep(crate::acquire::backoff(retries)).await;
                    retries += 1;
                    continue;
                }
            }
            match landed {
                Ok(new) => {
                    self.remember(req, shard, new.as_ref())?;
                    crate::shards::fan_out(self, req, shard, s, &evals).await;
                    return Ok(vec![crate::entity::Landing {
                        shard,
                        key: key.clone(),
                        charged: deltas,
                    }]);
                }
                Err(StoreError::ConditionFailed { old: Some(old) }) => {
                    item = *old;
                }
                Err(StoreError::ConditionFailed { old: None }) => {
                    tracing::warn!(key = %key, "lease target bucket is gone; adjustment dropped");
                    return Ok(vec![crate::entity::Landing {
                        shard,
                        key: key.clone(),
                        charged: deltas,
                    }]);
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Unavailable(StoreError::TransactionConflict))
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
                tokio::time::sleep(crate::acquire::backoff(attempt)).await;
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
