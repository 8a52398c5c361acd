//! Mapping SDK failures onto [`StoreError`], and this crate's own setup errors.
//!
//! The line that matters is *could the request have been applied?*
//!
//! | SDK outcome | write | read |
//! |---|---|---|
//! | `ConditionalCheckFailedException` | `ConditionFailed` (mapped by the caller, with the old item) | — |
//! | `TransactionConflictException` | `TransactionConflict` | `TransactionConflict` |
//! | `ProvisionedThroughputExceeded`, `Throttling`, `RequestLimitExceeded` | `Throttled` | `Throttled` |
//! | `ValidationException`, `IdempotentParameterMismatch` | `Validation` | `Validation` |
//! | `ResourceNotFoundException`, auth failures | `Unavailable` | `Unavailable` |
//! | refused / unresolvable connection, connect timeout, request not built | `Unavailable` | `Unavailable` |
//! | timeout, I/O after connecting, unparseable response, 5xx, `TransactionInProgress` | `Ambiguous` | `Unavailable` |
//!
//! A read has no effect to be unsure about, so what would be `Ambiguous` for a write is
//! `Unavailable` for a read.

use std::error::Error as StdError;

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use tollgate_store::StoreError;

/// Whether the failed request could have changed the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effect {
    /// A read: never ambiguous.
    Read,
    /// A write: an unknown outcome is [`StoreError::Ambiguous`].
    Write,
}

/// Errors of building a store or creating its table (not of store operations).
#[derive(Debug, thiserror::Error)]
pub enum DynamoDbError {
    /// The table name is empty or otherwise unusable.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A control-plane call (CreateTable, DescribeTable, …) failed.
    #[error("{op} failed: {source}")]
    Api {
        /// The operation.
        op: &'static str,
        /// What the SDK reported, mapped like a data-plane error.
        source: StoreError,
    },
    /// The table did not become `ACTIVE` in time.
    #[error("table {table} not ACTIVE after {secs} s (status {status})")]
    NotActive {
        /// The table.
        table: String,
        /// How long we waited.
        secs: u64,
        /// The last status seen.
        status: String,
    },
}

/// The whole source chain of an error, for messages.
pub(crate) fn chain(e: &(dyn StdError + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

/// Whether a dispatch failure happened while connecting (nothing was sent).
fn failed_before_sending(e: &(dyn StdError + 'static)) -> bool {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(io.kind(), ConnectionRefused | AddrNotAvailable | NotFound) {
                return true;
            }
        }
        let m = c.to_string().to_ascii_lowercase();
        // hyper-util's connect-phase error, smithy's connect timeout, DNS resolution.
        if m.contains("client error (connect)")
            || m.contains("connect timeout")
            || m.contains("dns error")
            || m.contains("failed to lookup address")
        {
            return true;
        }
        cur = c.source();
    }
    false
}

/// Map a service error code (the `__type` of the response) onto a store error.
fn from_code(code: &str, msg: String, status: Option<u16>, effect: Effect) -> StoreError {
    let unknown = |m: String| match effect {
        Effect::Write => StoreError::Ambiguous(m),
        Effect::Read => StoreError::Unavailable(m),
    };
    match code {
        "TransactionConflictException" => StoreError::TransactionConflict,
        "ProvisionedThroughputExceededException"
        | "ThrottlingException"
        | "RequestLimitExceeded"
        | "LimitExceededException" => StoreError::Throttled(format!("{code}: {msg}")),
        "ValidationException"
        | "SerializationException"
        | "IdempotentParameterMismatchException"
        | "ItemCollectionSizeLimitExceededException" => {
            StoreError::Validation(format!("{code}: {msg}"))
        }
        "ResourceNotFoundException"
        | "UnrecognizedClientException"
        | "AccessDeniedException"
        | "MissingAuthenticationTokenException"
        | "InvalidSignatureException"
        | "ExpiredTokenException"
        | "IncompleteSignatureException" => StoreError::Unavailable(format!("{code}: {msg}")),
        // The transaction with this token is still running: it may yet apply.
        "TransactionInProgressException" => unknown(format!("{code}: {msg}")),
        _ => match status {
            Some(s) if s >= 500 => unknown(format!("{code} (HTTP {s}): {msg}")),
            Some(s) if (400..500).contains(&s) => {
                // A 4xx DynamoDB did not apply; unknown codes are treated as unusable.
                StoreError::Unavailable(format!("{code} (HTTP {s}): {msg}"))
            }
            _ => unknown(format!("{code}: {msg}")),
        },
    }
}

/// Map any SDK failure. Operation-specific errors that carry data (the old item of a
/// conditional check, transaction cancellation reasons) are matched by the caller first.
pub(crate) fn map_sdk<E>(err: SdkError<E, HttpResponse>, effect: Effect) -> StoreError
where
    E: ProvideErrorMetadata + StdError + 'static,
{
    let unknown = |m: String| match effect {
        Effect::Write => StoreError::Ambiguous(m),
        Effect::Read => StoreError::Unavailable(m),
    };
    match err {
        SdkError::ConstructionFailure(_) => {
            StoreError::Unavailable(format!("request not built: {}", chain(&err)))
        }
        SdkError::TimeoutError(_) => unknown(format!("timed out: {}", chain(&err))),
        SdkError::DispatchFailure(ref d) => {
            let msg = chain(&err);
            if d.is_user() || failed_before_sending(&err) {
                StoreError::Unavailable(format!("not sent: {msg}"))
            } else {
                unknown(format!("dispatch failed: {msg}"))
            }
        }
        SdkError::ResponseError(_) => unknown(format!("unreadable response: {}", chain(&err))),
        SdkError::ServiceError(ref se) => {
            let status = Some(se.raw().status().as_u16());
            let e = se.err();
            let code = e.code().unwrap_or("Unknown").to_string();
            let msg = e.message().unwrap_or_default().to_string();
            from_code(&code, msg, status, effect)
        }
        _ => unknown(format!("unclassified SDK error: {}", chain(&err))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_by_effect() {
        let m = |c: &str, s, e| from_code(c, "m".into(), s, e);
        assert_eq!(
            m("TransactionConflictException", Some(400), Effect::Write),
            StoreError::TransactionConflict
        );
        assert!(matches!(
            m(
                "ProvisionedThroughputExceededException",
                Some(400),
                Effect::Write
            ),
            StoreError::Throttled(_)
        ));
        assert!(matches!(
            m("ThrottlingException", Some(400), Effect::Read),
            StoreError::Throttled(_)
        ));
        assert!(matches!(
            m("ValidationException", Some(400), Effect::Write),
            StoreError::Validation(_)
        ));
        assert!(matches!(
            m("ResourceNotFoundException", Some(400), Effect::Write),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(
            m("InternalServerError", Some(500), Effect::Write),
            StoreError::Ambiguous(_)
        ));
        assert!(matches!(
            m("InternalServerError", Some(500), Effect::Read),
            StoreError::Unavailable(_)
        ));
    }

    #[test]
    fn connection_refused_is_before_sending() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert!(failed_before_sending(&io));
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(!failed_before_sending(&io));
    }
}
