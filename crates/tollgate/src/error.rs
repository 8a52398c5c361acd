//! The one error type of the limiter.

use serde::Serialize;
use tollgate_core::{LimitStatus, RuleError};
use tollgate_store::StoreError;

/// A refused request: every limit checked, with the violations marked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Exceeded {
    /// Entity.
    pub entity: String,
    /// Resource.
    pub resource: String,
    /// Every limit the request named, exceeded or not.
    pub statuses: Vec<LimitStatus>,
    /// When a retry can succeed: the largest retry-after among the violations; `None` when
    /// the request can never fit.
    pub retry_after_ms: Option<i64>,
    /// The reset instant of the violation that decides the retry.
    pub resets_at_ms: Option<i64>,
}

impl Exceeded {
    /// Build from statuses (at least one must be exceeded).
    pub fn new(entity: &str, resource: &str, statuses: Vec<LimitStatus>) -> Self {
        let violations: Vec<&LimitStatus> = statuses.iter().filter(|s| s.exceeded).collect();
        let never = violations.iter().any(|s| s.retry_after_ms.is_none());
        let primary = violations
            .iter()
            .max_by_key(|s| s.retry_after_ms.unwrap_or(i64::MAX));
        Exceeded {
            entity: entity.into(),
            resource: resource.into(),
            retry_after_ms: if never {
                None
            } else {
                primary.and_then(|s| s.retry_after_ms)
            },
            resets_at_ms: primary.and_then(|s| s.resets_at_ms),
            statuses,
        }
    }

    /// Names of the exceeded limits.
    pub fn violations(&self) -> Vec<&str> {
        self.statuses
            .iter()
            .filter(|s| s.exceeded)
            .map(|s| s.limit.as_str())
            .collect()
    }
}

impl std::fmt::Display for Exceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rate limit exceeded for {}/{}: [{}]",
            self.entity,
            self.resource,
            self.violations().join(", ")
        )?;
        match self.retry_after_ms {
            Some(ms) => write!(f, "; retry after {:.3} s", ms as f64 / 1000.0),
            None => write!(
                f,
                "; the request exceeds the capacity and can never be admitted"
            ),
        }
    }
}

/// Errors of the limiter.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request was refused by one or more limits.
    #[error("{0}")]
    RateLimitExceeded(Box<Exceeded>),
    /// An id, name, limit or amount was malformed.
    #[error(transparent)]
    Invalid(RuleError),
    /// An amount named a limit the resource does not have.
    #[error("unknown limit {limit:?} for resource {resource:?} (known: {known})")]
    UnknownLimit {
        /// The name given.
        limit: String,
        /// The resource.
        resource: String,
        /// The limits it does have.
        known: String,
    },
    /// No limits are configured at any level for (entity, resource).
    #[error("no limits configured for entity {entity:?} and resource {resource:?}")]
    NoLimits {
        /// Entity.
        entity: String,
        /// Resource.
        resource: String,
    },
    /// The entity's use of the resource is disabled (an administrator turned it off).
    #[error("resource {resource:?} is disabled for entity {entity:?}")]
    ResourceDisabled {
        /// Entity.
        entity: String,
        /// Resource.
        resource: String,
    },
    /// The entity already exists.
    #[error("entity {0:?} already exists")]
    EntityExists(String),
    /// The entity does not exist.
    #[error("entity {0:?} not found")]
    EntityNotFound(String),
    /// Moving `entity` under `parent` would make it its own ancestor (ADR-150).
    #[error("cannot move {entity:?} under {parent:?}: {parent:?} is {entity:?} or one of its descendants")]
    ParentCycle {
        /// The entity moved.
        entity: String,
        /// The parent refused.
        parent: String,
    },
    /// The lease was already committed or rolled back.
    #[error("lease is no longer active")]
    LeaseClosed,
    /// A lease adjustment would refund more than the lease consumed of the limit (a lease's
    /// net never goes below zero: it cannot return tokens of earlier leases).
    #[error(
        "adjustment {delta} of {limit:?} would refund more than the lease consumed ({consumed})"
    )]
    InvalidAdjustment {
        /// The limit.
        limit: String,
        /// The adjustment asked for (tokens).
        delta: i64,
        /// What the lease had consumed of it, adjustments included (tokens).
        consumed: i64,
    },
    /// The entity's buckets stayed contended by concurrent writers through every retry:
    /// nothing was charged. Not a refusal (the entity may well have the tokens) and not an
    /// outage (so `on_unavailable = allow` does not admit through it): retry shortly.
    #[error(
        "the buckets of {entity:?}/{resource:?} are contended: nothing was charged, retry shortly"
    )]
    Contended {
        /// Entity.
        entity: String,
        /// Resource.
        resource: String,
    },
    /// The levels' merge flags make a set that cannot be enforced (ADR-143: schedules in
    /// different time zones, a patch that does not fit the inherited limit): the spec's
    /// RateLimiterUnavailable, never a silent pick.
    #[error("limits for entity {entity:?} and resource {resource:?} cannot be merged: {reason}")]
    LimitsConflict {
        /// The entity.
        entity: String,
        /// The resource.
        resource: String,
        /// Why.
        reason: String,
    },
    /// The limiter's namespace was soft-deleted, is being purged or was purged: nothing is
    /// admitted in it (until it is recovered, for a deleted one; spec-base-system.md §7.3).
    #[error("namespace {namespace:?} is {status}: recover it to use it again")]
    NamespaceDeleted {
        /// The namespace id.
        namespace: String,
        /// `deleted`, `purging` or `purged`.
        status: String,
    },
    /// No active namespace of this name (or id).
    #[error("namespace {0:?} not found")]
    NamespaceNotFound(String),
    /// A namespace operation that its registry state refuses (recover an active one,
    /// purge an active one, recover a name registered again).
    #[error("namespace {namespace:?}: {reason}")]
    NamespaceState {
        /// The namespace name or id.
        namespace: String,
        /// Why.
        reason: String,
    },
    /// A usage query or an aggregator option is not valid (no entity nor resource, a bad
    /// window, limit or page token, an empty window list).
    #[error("invalid usage query: {0}")]
    InvalidUsage(String),
    /// A stored item could not be decoded.
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    /// The store refused a request as invalid: a missing table, a schema that is not
    /// tollgate's, credentials or an endpoint configured wrongly, or a bug. A configuration
    /// error, not an outage: it never fails open, whatever `on_unavailable` says.
    #[error("store misconfigured: {0}")]
    Misconfigured(StoreError),
    /// The store could not be used: a real outage (unreachable, a deadline passed,
    /// throttled after retries). With `on_unavailable = allow` an acquire admits instead
    /// (only for these: [`StoreError::is_unavailable`]).
    #[error("rate limiter unavailable: {0}")]
    Unavailable(StoreError),
    /// A lease token that is not one: malformed, truncated, altered, signed under another
    /// lease key, or of another namespace (see [`crate::LeaseToken`]).
    #[error("invalid lease token: {0}")]
    InvalidLease(String),
    /// A shared lease past its expiry: its token is no longer accepted, or it was closed
    /// too long after it (nothing written; the acquire's debit stands).
    #[error("the lease has expired")]
    LeaseExpired,
}

impl Error {
    /// Whether this is a real outage of the store, the only error `on_unavailable = allow`
    /// admits through (rule "only an outage fails open").
    pub fn is_outage(&self) -> bool {
        matches!(self, Error::Unavailable(e) if e.is_unavailable())
    }

    /// The refusal, if this is one.
    pub fn exceeded(&self) -> Option<&Exceeded> {
        match self {
            Error::RateLimitExceeded(e) => Some(e),
            _ => None,
        }
    }
}

impl From<RuleError> for Error {
    fn from(e: RuleError) -> Self {
        match e {
            RuleError::Corrupt { .. } => Error::Corrupt(e.to_string()),
            e => Error::Invalid(e),
        }
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Corrupt(m) => Error::Corrupt(m),
            e @ StoreError::Validation(_) => Error::Misconfigured(e),
            e => Error::Unavailable(e),
        }
    }
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The outcome of one pass of a write path: a public error, or an internal signal that the
/// pass must be planned again (never returned to a caller of the limiter).
#[derive(Debug)]
pub(crate) enum Flow {
    /// A public error.
    Fail(Error),
    /// A planned quota move lost its donor race: re-plan (with moves, then without).
    MoveLost,
    /// The pass's write lost to a concurrent change of what it pinned (a reset balance, a
    /// shard count, the item's existence): read (or take the returned image) and plan again.
    Reread,
}

impl Flow {
    /// The public error a signal becomes once its caller stops re-planning: the writes kept
    /// losing to concurrent writers (a conflict; the slow path reports it as `Contended`).
    pub(crate) fn into_error(self) -> Error {
        match self {
            Flow::Fail(e) => e,
            Flow::MoveLost | Flow::Reread => Error::Unavailable(StoreError::TransactionConflict),
        }
    }
}

impl From<Error> for Flow {
    fn from(e: Error) -> Self {
        Flow::Fail(e)
    }
}

impl From<StoreError> for Flow {
    fn from(e: StoreError) -> Self {
        Flow::Fail(e.into())
    }
}

impl From<RuleError> for Flow {
    fn from(e: RuleError) -> Self {
        Flow::Fail(e.into())
    }
}

/// Result of one pass of a write path.
pub(crate) type Pass<T> = std::result::Result<T, Flow>;
