//! Cascade (ADR-146, spec §4.17): a child entity whose effective policy says so spends from
//! its parent on every acquire of the same resource.
//!
//! Design: the cascade acquire is composed of two single-bucket acquires — the child's,
//! then the parent's (the parent with its own resolved limits, its own shard draw and shard
//! count, its own windows). When the parent refuses (or fails), the child's debit is rolled
//! back exactly before the parent's error is returned. Consequence: between the child's
//! debit and its refund the child's balance is transiently lower than it will end; a
//! concurrent acquire of the child may be refused in that instant (a transient hold), but
//! nothing is ever admitted that both buckets did not cover (never an over-admission).
//! When this process already knows every parent shard is short (ADR-147 rejection views),
//! the acquire is refused before the child is written.
//! The slow path therefore never commits both items in one transaction (a departure from
//! §4.17 and Q13's "Put, Put, Update, Update"): each side commits its own write or
//! transaction.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::limiter::{Inner, Stats};
use crate::request::{backoff, Request};
use tollgate_core::bucket::attr;
use tollgate_core::cascade::{correct_parent, stamp_questions_policy, ParentCorrection};
use tollgate_core::expr::{Condition, ReturnValues, Update};
use tollgate_store::{StoreError, UpdateRequest};

/// What the parent is charged: the amounts the child's request names, restricted to the
/// limits the parent has for the resource (its own resolved limits; a limit only the child
/// has is the child's alone). A parent with no limits at all for the resource is a
/// configuration error ([`Error::NoLimits`] naming the parent).
#[allow(clippy::too_many_arguments)]
pub(crate) fn parent_request(
    inner: &Inner,
    child: &Request,
    parent: &str,
    resolved: crate::config::Resolved,
    now: i64,
) -> Result<Request> {
    let crate::config::Resolved {
        limits,
        params_hash: ph,
        source,
        cascade,
        mode,
        ..
    } = resolved;
    if mode == Some(tollgate_core::bypass::Enforcement::Disabled) {
        return Err(Error::ResourceDisabled {
            entity: parent.into(),
            resource: child.resource.to_string(),
        });
    }
    let amounts = child
        .amounts
        .iter()
        .filter(|(n, _)| limits.iter().any(|l| l.name() == n))
        .cloned()
        .collect();
    let req = inner.request_hashed(
        parent,
        Arc::clone(&child.resource),
        amounts,
        limits,
        Some(ph),
        source,
        now,
    )?;
    Ok(Request {
        cascade,
        bypass: mode == Some(tollgate_core::bypass::Enforcement::Bypass),
        mode,
        mode_confirmed: false,
        ..req
    })
}

impl Inner {
    /// The parent's request for `child` (ADR-146): the parent's own resolved limits, with
    /// the amounts of the limits it shares.
    pub(crate) async fn parent_for(
        &self,
        child: &Request,
        parent: &str,
        now: i64,
    ) -> Result<Request> {
        let pres = self
            .config()
            .resolve(
                self.store().as_ref(),
                self.ns(),
                parent,
                &child.resource,
                now,
            )
            .await?;
        parent_request(self, child, parent, pres, now)
    }

    /// Acquire for the child and, when `parent` is given, for the parent: both must admit or
    /// nothing is kept. A parent refusal or failure rolls the child's debit back exactly and
    /// returns the parent's error (which names the parent). The parent's own acquire never
    /// cascades further (C4: a child lease never debits the grandparent). Between the two,
    /// rule C3 ([`Inner::corrected_parent`]) may add or drop the parent write when the
    /// child's item shows a cascade stamp the plan (`confirmed` or not) disagrees with.
    pub(crate) async fn acquire_cascade(
        self: &Arc<Self>,
        child: &Request,
        parent: Option<Request>,
        confirmed: bool,
    ) -> Result<Lease> {
        if let Some(preq) = &parent {
            self.parent_precheck(preq)?;
        }
        let lease = self.acquire(child).await?;
        if parent.is_none() && questioning_stamp(child, &lease, confirmed).is_none() {
            return Ok(lease);
        }
        // Boxed: the parent's acquire is as large as the child's; held in place, the rest
        // would double the size of every acquire's future, cascading or not.
        Box::pin(self.cascade_rest(child, lease, parent, confirmed)).await
    }

    /// What [`Inner::acquire_cascade`] does after the child's acquire, when there is a
    /// parent or the child's stamp questions the planned policy.
    async fn cascade_rest(
        self: &Arc<Self>,
        child: &Request,
        mut lease: Lease,
        parent: Option<Request>,
        confirmed: bool,
    ) -> Result<Lease> {
        let parent = match self
            .corrected_parent(child, &lease, parent, confirmed)
            .await
        {
            Ok(p) => p,
            Err(e) => {
                undo_child(&mut lease, child).await;
                return Err(e);
            }
        };
        let Some(preq) = parent else {
            return Ok(lease);
        };
        match self.acquire(&preq).await {
            Ok(p) => {
                lease.parent = Some(Box::new(p));
                Ok(lease)
            }
            Err(e) => {
                undo_child(&mut lease, child).await;
                Err(e)
            }
        }
    }

    /// Rule C3 executed (`tollgate_core::cascade::stamp_questions_policy`): when the child's
    /// written item carries a cascade stamp that disagrees with the planned policy, re-read
    /// the config once (consistently; the cache keeps the answer, marked confirmed) and let
    /// that answer decide the parent write: add it (the parent's limits resolved, its
    /// trusted views consulted) or drop it. The shard's stamp is then set to the answer,
    /// so that the other processes' stale caches are questioned in turn. A re-read that
    /// fails leaves the plan as it was (the cache's policy, as without C3).
    async fn corrected_parent(
        &self,
        child: &Request,
        lease: &Lease,
        parent: Option<Request>,
        confirmed: bool,
    ) -> Result<Option<Request>> {
        let Some((part, stamp)) = questioning_stamp(child, lease, confirmed) else {
            return Ok(parent);
        };
        let now = self.clock().now_ms();
        let res = match self
            .config()
            .resolve_confirmed(
                self.store().as_ref(),
                self.ns(),
                &child.entity,
                &child.resource,
                now,
            )
            .await
        {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, entity = %child.entity, resource = %child.resource,
                    "cascade: the config re-read a disagreeing stamp asked for failed; the cached policy stands");
                return Ok(parent);
            }
        };
        if stamp != Some(res.cascade) {
            self.restamp(&part.key, stamp, res.cascade).await;
        }
        match correct_parent(parent.is_some(), res.cascade) {
            ParentCorrection::AsPlanned => Ok(parent),
            ParentCorrection::Drop => Ok(None),
            ParentCorrection::Add => match &res.parent_id {
                Some(p) => {
                    let preq = self.parent_for(child, p, now).await?;
                    self.parent_precheck(&preq)?;
                    Ok(Some(preq))
                }
                None => Ok(None),
            },
        }
    }

    /// Set a shard's cascade stamp to the policy a C3 re-read answered, if it still holds
    /// the stamp that was questioned (a concurrent stamping write wins). Best effort: a
    /// failure leaves the stale stamp, which questions a cache at most once more.
    async fn restamp(&self, key: &tollgate_core::value::Key, old: Option<bool>, new: bool) {
        let Some(old) = old else {
            return;
        };
        let r = self
            .store()
            .update(UpdateRequest {
                key: key.clone(),
                update: Update::new().set(attr::CASCADE, new),
                condition: Some(Condition::eq(attr::CASCADE, old)),
                returns: ReturnValues::None,
            })
            .await;
        if let Err(e) = r {
            tracing::debug!(error = %e, %key, "cascade: the stamp was not corrected");
        }
    }
}

/// Roll the child's debit back after the parent refused (ADR-146: both admit or nothing is
/// kept). A refusal that certainly did not apply (throttled, transaction conflict) is
/// retried a few times with backoff; an ambiguous outcome is never resent (the refund is an
/// ADD: resending could credit twice). What cannot be undone stays debited — capacity lost,
/// never admitted — and is logged.
async fn undo_child(lease: &mut Lease, child: &Request) {
    const ATTEMPTS: u32 = 4;
    for attempt in 0..ATTEMPTS {
        match lease.rollback().await {
            Ok(()) => {
                // The acquire was refused as a whole: take back the request it counted.
                lease.uncount_request().await;
                return;
            }
            Err(Error::Unavailable(StoreError::Throttled(_) | StoreError::TransactionConflict))
                if attempt + 1 < ATTEMPTS =>
            {
                tokio::time::sleep(backoff(attempt)).await;
            }
            Err(undo) => {
                tracing::warn!(
                    error = %undo,
                    resource = %child.resource,
                    "cascade: the child's debit could not be rolled back after the parent refused"
                );
                return;
            }
        }
    }
}

impl Inner {
    /// ADR-147 applied to the parent before the child is written: when this process's
    /// trusted views say every parent shard is short, refuse with no store request (the
    /// child is never debited, so there is nothing to roll back). The cache only refuses;
    /// it never admits.
    fn parent_precheck(&self, preq: &Request) -> Result<()> {
        let Some(s) = self.shards().count(&preq.entity, &preq.resource) else {
            return Ok(());
        };
        if !self.opts().speculative {
            return Ok(());
        }
        match self.open_shards(preq, s, self.clock().now_ms()) {
            Ok(_) => Ok(()),
            Err(x) => {
                Stats::bump(&self.stats().local_rejections);
                Stats::bump(&self.stats().rejections);
                Err(Error::RateLimitExceeded(x))
            }
        }
    }
}

/// The child's written shard and its cascade stamp, when that stamp questions the planned
/// policy (rule C3, `tollgate_core::cascade::stamp_questions_policy`): only then is the
/// config re-read after the child's acquire.
fn questioning_stamp<'a>(
    child: &Request,
    lease: &'a Lease,
    confirmed: bool,
) -> Option<(&'a crate::lease::Part, Option<bool>)> {
    let part = lease.parts.first()?;
    let stamp = part.image.as_ref().and_then(|i| i.cascade);
    stamp_questions_policy(child.cascade, stamp, confirmed).then_some((part, stamp))
}

#[cfg(test)]
mod tests {
    use tollgate_core::cascade::effective_policy;

    /// C3: the walk's first explicit flag wins; META is the fallback; no parent, no cascade.
    #[test]
    fn policy_walk() {
        let p = Some("org");
        assert!(!effective_policy([None, None, None], None, p));
        assert!(effective_policy([None, None, None], Some(true), p));
        assert!(!effective_policy([None, None, Some(false)], Some(true), p)); // scenario 115
        assert!(effective_policy([None, Some(true), Some(false)], None, p));
        assert!(!effective_policy(
            [Some(false), Some(true), None],
            Some(true),
            p
        ));
        assert!(effective_policy(
            [Some(true), None, Some(false)],
            Some(false),
            p
        ));
        assert!(!effective_policy(
            [Some(true), Some(true), Some(true)],
            Some(true),
            None
        ));
    }
}
