//! Errors a store reports.

use tollgate_core::value::Item;

/// Why one operation of a cancelled transaction did not apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelReason {
    /// This operation was fine; the transaction failed elsewhere.
    None,
    /// Its condition failed; `old` is the item as it was (DynamoDB's
    /// `ReturnValuesOnConditionCheckFailure = ALL_OLD`), `None` if absent.
    ConditionFailed {
        /// The item before the transaction.
        old: Option<Item>,
    },
    /// Another transaction was writing the same item.
    TransactionConflict,
    /// The item's partition was throttled.
    Throttled,
    /// The request was invalid for this item.
    Validation(String),
}

/// Errors of store operations.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    /// A single-item write's condition failed; `old` is the item before the write
    /// (`None` if it did not exist).
    #[error("conditional check failed")]
    ConditionFailed {
        /// The item as it was.
        old: Option<Box<Item>>,
    },
    /// A transaction was cancelled; one reason per operation, in request order.
    #[error("transaction cancelled: {reasons:?}")]
    TransactionCanceled {
        /// Per-operation reasons.
        reasons: Vec<CancelReason>,
    },
    /// A conflicting transaction was in flight on a single-item write.
    #[error("transaction conflict")]
    TransactionConflict,
    /// The store refused for capacity reasons (retryable).
    #[error("throttled: {0}")]
    Throttled(String),
    /// The request itself is invalid (bad expression, overlapping paths, wrong type).
    #[error("invalid request: {0}")]
    Validation(String),
    /// The outcome is unknown: the request may or may not have been applied
    /// (a timeout or a lost response).
    #[error("outcome unknown: {0}")]
    Ambiguous(String),
    /// The store cannot be reached or failed.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A stored item could not be decoded.
    #[error("corrupt stored item: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// Whether the error says nothing was applied and the same request may simply be resent.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StoreError::TransactionConflict | StoreError::Throttled(_)
        )
    }
    /// Whether the store could not be used at all (the `on_unavailable` policy applies).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable(_) | StoreError::Ambiguous(_) | StoreError::Throttled(_)
        )
    }
}
