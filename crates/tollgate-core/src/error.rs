//! Errors of the pure rules: bad input and corrupt stored items.

/// An input or a stored item that the rules refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// An identifier (entity, parent) breaks the naming rules.
    #[error("invalid identifier {value:?}: {reason}")]
    InvalidIdentifier {
        /// The value (cut to 64 chars).
        value: String,
        /// Why.
        reason: &'static str,
    },
    /// A limit or resource name breaks the naming rules.
    #[error("invalid name {value:?}: {reason}")]
    InvalidName {
        /// The value (cut to 64 chars).
        value: String,
        /// Why.
        reason: &'static str,
    },
    /// A limit definition is not valid.
    #[error("invalid limit {name:?}: {reason}")]
    InvalidLimit {
        /// Limit name.
        name: String,
        /// Why.
        reason: String,
    },
    /// An amount is negative or too large.
    #[error("invalid amount for {limit:?}: {reason}")]
    InvalidAmount {
        /// Limit name.
        limit: String,
        /// Why.
        reason: &'static str,
    },
    /// A stored item has an attribute of the wrong type or is missing one of a pair.
    #[error("corrupt item {key}: attribute {attribute}: {reason}")]
    Corrupt {
        /// The item's key.
        key: String,
        /// The attribute at fault.
        attribute: String,
        /// What is wrong.
        reason: String,
    },
    /// A multi-resource acquire named no resource, more than 16, or one twice (ADR-148).
    #[error("invalid resource set ({count} resources): {reason}")]
    InvalidResourceSet {
        /// How many resources were named.
        count: usize,
        /// Why.
        reason: String,
    },
}

pub(crate) fn cut(s: &str) -> String {
    s.chars().take(64).collect()
}
