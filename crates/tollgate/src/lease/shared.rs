//! What makes a lease shared (exported as a token, or resumed from one) and whether its
//! closure is recorded: the state a lease carries for the `lease_token` module's rule.

/// Whether a shared lease's closure is recorded in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Not attempted.
    None,
    /// Sent with this nonce, outcome unknown (resent with the same nonce).
    Sent(String),
    /// This copy holds the record: it alone may write the close.
    Held,
}

/// What makes a lease shared: set by its first export, or by a resume.
#[derive(Debug, Clone)]
pub(crate) struct Shared {
    pub id: String,
    pub version: u64,
    pub issued_at_ms: i64,
    pub expires_at_ms: i64,
    pub claim: Claim,
}
