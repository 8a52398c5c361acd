//! Multi-resource acquire (ADR-148): several resources of one entity, all or none.
//!
//! Every resource is acquired through the single-resource path at once (polled together on
//! the caller's task, so a warm call costs one write per resource and the latency of the
//! slowest). When every one is admitted the call returns one [`MultiLease`]; when any
//! fails, the leases that were granted are rolled back — an exact refund of what each
//! debited (`Lease::rollback`) — before the call reports the decisive failure
//! (`tollgate_core::multi::decisive`: `ResourceDisabled` outranks `RateLimitExceeded`).
//! Rule "all or none": once a refused call returns, no resource it named is charged.

use futures_util::future::join_all;
use tollgate_core::multi::{decisive, validate_resource_set, Outcome};
use tollgate_core::mutants::{self, Mutant};

use super::*;

/// The leases of a multi-resource acquire, one per resource in the order asked. Adjust,
/// commit and roll back per resource, or all at once.
#[derive(Debug)]
pub struct MultiLease {
    leases: Vec<Lease>,
}

impl MultiLease {
    /// The resources, in the order asked.
    pub fn resources(&self) -> Vec<&str> {
        self.leases.iter().map(Lease::resource).collect()
    }

    /// The lease of one resource.
    pub fn lease(&self, resource: &str) -> Option<&Lease> {
        self.leases.iter().find(|l| l.resource() == resource)
    }

    /// The lease of one resource, to adjust or finish on its own.
    pub fn lease_mut(&mut self, resource: &str) -> Option<&mut Lease> {
        self.leases.iter_mut().find(|l| l.resource() == resource)
    }

    /// Every lease, in the order asked.
    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }

    /// The leases, to hold or export separately.
    pub fn into_leases(self) -> Vec<Lease> {
        self.leases
    }

    /// Whether any resource was admitted without the store (`on_unavailable = allow`).
    pub fn is_degraded(&self) -> bool {
        self.leases.iter().any(Lease::is_degraded)
    }

    /// Record that `delta` more tokens (negative: fewer) of `limit` were used on `resource`
    /// (see [`Lease::adjust`]).
    pub fn adjust(&mut self, resource: &str, limit: &str, delta: i64) -> Result<()> {
        match self.lease_mut(resource) {
            Some(l) => l.adjust(limit, delta),
            None => Err(Error::Invalid(RuleError::InvalidResourceSet {
                count: self.leases.len(),
                reason: format!("resource {resource:?} is not part of this lease"),
            })),
        }
    }

    /// Commit every open lease (each writes its own adjustments). Every lease is tried; the
    /// first failure is returned.
    pub async fn commit(&mut self) -> Result<()> {
        self.finish(false).await
    }

    /// Roll back every open lease: an exact refund of every resource's debit.
    pub async fn rollback(&mut self) -> Result<()> {
        self.finish(true).await
    }

    async fn finish(&mut self, rollback: bool) -> Result<()> {
        let open: Vec<&mut Lease> = self.leases.iter_mut().filter(|l| !l.is_closed()).collect();
        if open.is_empty() {
            return Err(Error::LeaseClosed);
        }
        let results = join_all(open.into_iter().map(|l| async move {
            if rollback {
                l.rollback().await
            } else {
                l.commit().await
            }
        }))
        .await;
        results.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
    }
}

/// How an acquire's result ranks when several resources fail (ADR-148).
fn outcome(r: &Result<Lease>) -> Outcome {
    match r {
        Ok(_) => Outcome::Admitted,
        Err(Error::ResourceDisabled { .. }) => Outcome::Disabled,
        Err(Error::RateLimitExceeded(_)) => Outcome::Exceeded,
        Err(Error::Unavailable(_) | Error::Contended { .. }) => Outcome::Transient,
        Err(_) => Outcome::Invalid,
    }
}

impl Limiter {
    /// Acquire several resources of `entity` all or none (ADR-148): `wants` pairs each
    /// resource (1 to 16, distinct) with its amounts in tokens. On success one
    /// [`MultiLease`] holds a lease per resource; on failure nothing stays charged (the
    /// resources already debited are refunded exactly) and the decisive failure is returned
    /// — `ResourceDisabled` before `RateLimitExceeded`. A refund that fails is returned
    /// instead (the store could not be told; the debit it could not undo is logged).
    pub async fn acquire_many<A: Clone + Into<Amounts>>(
        &self,
        entity: &str,
        wants: &[(&str, A)],
    ) -> Result<MultiLease> {
        self.acquire_many_with(entity, wants, AcquireOptions::default())
            .await
    }

    /// [`Limiter::acquire_many`] with per-call options (`limits`, when given, apply to
    /// every resource).
    pub async fn acquire_many_with<A: Clone + Into<Amounts>>(
        &self,
        entity: &str,
        wants: &[(&str, A)],
        opts: AcquireOptions,
    ) -> Result<MultiLease> {
        validate_entity_id(entity)?;
        let names: Vec<&str> = wants.iter().map(|(r, _)| *r).collect();
        validate_resource_set(&names)?;
        let mut asked = Vec::with_capacity(wants.len());
        for (r, amounts) in wants {
            validate_resource(r)?;
            let a: Amounts = amounts.clone().into();
            a.clone().into_millitokens()?;
            asked.push((*r, a));
        }
        let results = join_all(
            asked
                .into_iter()
                .map(|(r, amounts)| self.acquire_with(entity, r, amounts, opts.clone())),
        )
        .await;
        let outcomes: Vec<Outcome> = results.iter().map(outcome).collect();
        let Some(at) = decisive(&outcomes) else {
            let leases: Vec<Lease> = results.into_iter().collect::<Result<_>>()?;
            debug_assert_eq!(leases.len(), wants.len(), "one lease per resource");
            return Ok(MultiLease { leases });
        };
        let mut failure = None;
        let mut granted = Vec::new();
        for (i, r) in results.into_iter().enumerate() {
            match r {
                Ok(l) => granted.push(l),
                Err(e) if i == at => failure = Some(e),
                Err(e) => {
                    tracing::debug!(entity, error = %e, "multi-resource acquire: another resource failed too")
                }
            }
        }
        // Rule "all or none": refund exactly what the admitted resources debited.
        let undo = join_all(granted.iter_mut().enumerate().map(|(i, l)| async move {
            if mutants::off(Mutant::MultiRefund) && i == 0 {
                // Mutant: the first landed resource keeps its debit.
                return Ok(());
            }
            l.rollback().await
        }))
        .await;
        for (l, r) in granted.iter().zip(&undo) {
            if let Err(e) = r {
                tracing::error!(entity, resource = l.resource(), error = %e, "multi-resource acquire refused, but a landed debit could not be refunded");
            }
        }
        if let Some(Err(e)) = undo.into_iter().find(Result::is_err) {
            return Err(e);
        }
        match failure {
            Some(e) => Err(e),
            None => Err(Error::Corrupt(
                "multi-resource acquire: decisive failure lost".into(),
            )),
        }
    }
}
