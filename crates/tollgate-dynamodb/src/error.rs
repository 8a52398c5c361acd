//! Mapping SDK failures onto [`StoreError`], and this crate's own setup errors.
//!
//! Two questions decide every mapping: *is this an outage or a misconfiguration?* and, for an
//! outage, *could the request have been applied?* Only an outage may let the limiter's
//! `on_unavailable` policy admit; a misconfiguration is [`StoreError::Validation`], which never
//! fails open, and its message names the table.
//!
//! | SDK outcome | write | read |
//! |---|---|---|
//! | `ConditionalCheckFailedException` | `ConditionFailed` (mapped by the caller, with the old item) | — |
//! | `TransactionConflictException`, `ReplicatedWriteConflictException` | `TransactionConflict` | `TransactionConflict` |
//! | `ProvisionedThroughputExceeded`, `Throttling`, `RequestLimitExceeded`, HTTP 429 | `Throttled` | `Throttled` |
//! | `ValidationException` (bad expression, key-schema mismatch, missing index) | `Validation` | `Validation` |
//! | `ResourceNotFoundException` (no such table) | `Validation` | `Validation` |
//! | access denied, bad or expired signature, unknown access key | `Validation` | `Validation` |
//! | no credentials found, no endpoint (region), request not built, other 4xx | `Validation` | `Validation` |
//! | refused / unresolvable connection, connect timeout, credentials provider failed or timed out | `Unavailable` | `Unavailable` |
//! | deadline passed, I/O after connecting, unparseable response, 5xx, `TransactionInProgress` | `Ambiguous` | `Unavailable` |
//!
//! A read has no effect to be unsure about, so what would be `Ambiguous` for a write is
//! `Unavailable` for a read. `StoreError` has no dedicated "misconfigured" variant (it belongs
//! to `tollgate-store`); `Validation` is the one that never fails open.

use std::error::Error as StdError;

use aws_credential_types::provider::error::CredentialsError;
use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_smithy_runtime_api::client::endpoint::error::ResolveEndpointError;
use tollgate_store::StoreError;

/// Whether the failed request could have changed the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effect {
    /// A read: never ambiguous.
    Read,
    /// A write: an unknown outcome is [`StoreError::Ambiguous`].
    Write,
}

/// What to do about missing credentials, in every message that reports them.
pub const CREDENTIALS_HINT: &str =
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE \
     (a profile in ~/.aws/config), or run with an instance or task role";

/// Errors of building a store, creating or checking its table (not of store operations).
#[derive(Debug, thiserror::Error)]
pub enum DynamoDbError {
    /// The table name, the deadline or the region is unusable or missing.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// No credentials provider found credentials (environment, profile, instance role …).
    #[error("no AWS credentials found: {CREDENTIALS_HINT} ({0})")]
    NoCredentials(String),
    /// A control-plane call (CreateTable, DescribeTable, …) failed.
    #[error("{op} failed: {source}")]
    Api {
        /// The operation.
        op: &'static str,
        /// What the SDK reported, mapped like a data-plane error.
        source: StoreError,
    },
    /// The table does not exist.
    #[error("table {table} does not exist (create it with `tollgate table create {table}`)")]
    TableMissing {
        /// The table.
        table: String,
    },
    /// The table exists but its keys or indexes are not tollgate's layout.
    #[error("table {table} does not have tollgate's layout: {}", problems.join("; "))]
    TableMismatch {
        /// The table.
        table: String,
        /// Every difference found, one sentence each.
        problems: Vec<String>,
    },
    /// The table exists but cannot serve requests (being created, deleted, archived …).
    #[error("table {table} is {status}, not ACTIVE")]
    TableNotReady {
        /// The table.
        table: String,
        /// Its status as DynamoDB reports it.
        status: String,
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

impl DynamoDbError {
    /// Whether the error is an outage (the store could not be reached or answered with a
    /// server error) rather than a configuration problem. A caller may retry an outage; a
    /// configuration problem needs an operator.
    pub fn is_unavailable(&self) -> bool {
        match self {
            DynamoDbError::Api { source, .. } => source.is_unavailable(),
            _ => false,
        }
    }
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

/// The first error of type `T` in the source chain of `e` (`e` included).
fn find<'a, T: StdError + 'static>(e: &'a (dyn StdError + 'static)) -> Option<&'a T> {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(t) = c.downcast_ref::<T>() {
            return Some(t);
        }
        cur = c.source();
    }
    None
}

/// Whether a dispatch failure happened while connecting (nothing was sent).
pub(crate) fn failed_before_sending(e: &(dyn StdError + 'static)) -> bool {
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

/// A credentials-provider failure found in an SDK error's chain: missing or misconfigured
/// credentials are configuration (`Validation`); a provider that failed or timed out (STS or
/// the instance metadata service unreachable) is an outage. Either way nothing was sent.
pub(crate) fn credentials_error(e: &CredentialsError, msg: &str, table: &str) -> StoreError {
    match e {
        CredentialsError::CredentialsNotLoaded(_) | CredentialsError::InvalidConfiguration(_) => {
            StoreError::Validation(format!(
                "table {table}: no AWS credentials found: {CREDENTIALS_HINT} ({msg})"
            ))
        }
        _ => StoreError::Unavailable(format!(
            "table {table}: AWS credentials could not be loaded ({msg})"
        )),
    }
}

/// Map a service error code (the `__type` of the response) onto a store error.
pub(crate) fn from_code(
    code: &str,
    msg: &str,
    status: Option<u16>,
    effect: Effect,
    table: &str,
) -> StoreError {
    let unknown = |m: String| match effect {
        Effect::Write => StoreError::Ambiguous(m),
        Effect::Read => StoreError::Unavailable(m),
    };
    match code {
        "TransactionConflictException" | "ReplicatedWriteConflictException" => {
            StoreError::TransactionConflict
        }
        "ProvisionedThroughputExceededException"
        | "ThrottlingException"
        | "RequestLimitExceeded"
        | "LimitExceededException" => {
            StoreError::Throttled(format!("table {table}: {code}: {msg}"))
        }
        "ValidationException"
        | "SerializationException"
        | "IdempotentParameterMismatchException"
        | "ItemCollectionSizeLimitExceededException" => {
            StoreError::Validation(format!("table {table}: {code}: {msg}"))
        }
        "ResourceNotFoundException" => {
            StoreError::Validation(format!("table {table} not found ({code}: {msg})"))
        }
        "UnrecognizedClientException"
        | "AccessDeniedException"
        | "MissingAuthenticationTokenException"
        | "InvalidSignatureException"
        | "ExpiredTokenException"
        | "IncompleteSignatureException"
        | "InvalidClientTokenId"
        | "SignatureDoesNotMatch" => StoreError::Validation(format!(
            "access to table {table} denied ({code}: {msg}): check the AWS credentials and \
             the IAM policy"
        )),
        // The transaction with this token is still running: it may yet apply.
        "TransactionInProgressException" => unknown(format!("table {table}: {code}: {msg}")),
        _ => match status {
            Some(s) if s >= 500 => unknown(format!("table {table}: {code} (HTTP {s}): {msg}")),
            Some(429) => StoreError::Throttled(format!("table {table}: {code} (HTTP 429): {msg}")),
            // A request timeout reported by a proxy or the service: it may have been applied.
            Some(408) => unknown(format!("table {table}: {code} (HTTP 408): {msg}")),
            // Any other 4xx: DynamoDB refused the request itself, nothing was applied and
            // resending will not help.
            Some(s) if (400..500).contains(&s) => {
                StoreError::Validation(format!("table {table}: {code} (HTTP {s}): {msg}"))
            }
            _ => unknown(format!("table {table}: {code}: {msg}")),
        },
    }
}

/// Map any SDK failure of a request on `table`. Operation-specific errors that carry data
/// (the old item of a conditional check, transaction cancellation reasons) are matched by
/// the caller first.
pub(crate) fn map_sdk<E>(err: SdkError<E, HttpResponse>, effect: Effect, table: &str) -> StoreError
where
    E: ProvideErrorMetadata + StdError + 'static,
{
    let unknown = |m: String| match effect {
        Effect::Write => StoreError::Ambiguous(m),
        Effect::Read => StoreError::Unavailable(m),
    };
    // Failures before anything was sent that say "configured wrongly" wherever they surface
    // (the SDK reports identity and endpoint resolution as dispatch failures).
    if !matches!(err, SdkError::ServiceError(_)) {
        if let Some(c) = find::<CredentialsError>(&err) {
            return credentials_error(c, &chain(&err), table);
        }
        if find::<ResolveEndpointError>(&err).is_some() {
            return StoreError::Validation(format!(
                "table {table}: no DynamoDB endpoint (is AWS_REGION set?): {}",
                chain(&err)
            ));
        }
    }
    match err {
        SdkError::ConstructionFailure(_) => {
            StoreError::Validation(format!("table {table}: request not built: {}", chain(&err)))
        }
        SdkError::TimeoutError(_) => {
            unknown(format!("table {table}: deadline passed: {}", chain(&err)))
        }
        SdkError::DispatchFailure(ref d) => {
            let msg = chain(&err);
            if d.is_user() || failed_before_sending(&err) {
                StoreError::Unavailable(format!("table {table}: not sent: {msg}"))
            } else {
                unknown(format!("table {table}: dispatch failed: {msg}"))
            }
        }
        SdkError::ResponseError(_) => unknown(format!(
            "table {table}: unreadable response: {}",
            chain(&err)
        )),
        SdkError::ServiceError(ref se) => {
            let status = Some(se.raw().status().as_u16());
            let e = se.err();
            from_code(
                e.code().unwrap_or("Unknown"),
                e.message().unwrap_or_default(),
                status,
                effect,
                table,
            )
        }
        _ => unknown(format!(
            "table {table}: unclassified SDK error: {}",
            chain(&err)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_credential_types::provider::error::CredentialsError;

    fn m(c: &str, s: Option<u16>, e: Effect) -> StoreError {
        from_code(c, "m", s, e, "tbl")
    }

    #[test]
    fn codes_map_by_effect() {
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
            m("Whatever", Some(429), Effect::Write),
            StoreError::Throttled(_)
        ));
        assert!(matches!(
            m("InternalServerError", Some(500), Effect::Write),
            StoreError::Ambiguous(_)
        ));
        assert!(matches!(
            m("InternalServerError", Some(500), Effect::Read),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(
            m("TransactionInProgressException", Some(400), Effect::Write),
            StoreError::Ambiguous(_)
        ));
    }

    #[test]
    fn misconfiguration_is_validation_naming_the_table() {
        for code in [
            "ValidationException",
            "ResourceNotFoundException",
            "AccessDeniedException",
            "UnrecognizedClientException",
            "InvalidSignatureException",
            "ExpiredTokenException",
            "SomethingNew",
        ] {
            for effect in [Effect::Read, Effect::Write] {
                match m(code, Some(400), effect) {
                    StoreError::Validation(msg) => {
                        assert!(msg.contains("table tbl"), "{code}: {msg}");
                        assert!(msg.contains(code), "{code}: {msg}");
                    }
                    other => panic!("{code} {effect:?}: expected Validation, got {other:?}"),
                }
            }
        }
        match m("ResourceNotFoundException", Some(400), Effect::Read) {
            StoreError::Validation(msg) => assert!(msg.contains("not found"), "{msg}"),
            other => panic!("expected Validation, got {other:?}"),
        }
    }

    #[test]
    fn missing_credentials_are_validation_a_failed_provider_unavailable() {
        let missing = CredentialsError::not_loaded("no providers in chain provided credentials");
        match credentials_error(&missing, "chain", "tbl") {
            StoreError::Validation(msg) => {
                assert!(msg.contains("no AWS credentials found"), "{msg}");
                assert!(msg.contains("AWS_ACCESS_KEY_ID"), "{msg}");
                assert!(msg.contains("table tbl"), "{msg}");
            }
            other => panic!("expected Validation, got {other:?}"),
        }
        let timed_out = CredentialsError::provider_timed_out(std::time::Duration::from_secs(5));
        assert!(matches!(
            credentials_error(&timed_out, "chain", "tbl"),
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

    #[test]
    fn only_api_outages_are_unavailable() {
        let outage = DynamoDbError::Api {
            op: "DescribeTable",
            source: StoreError::Unavailable("x".into()),
        };
        assert!(outage.is_unavailable());
        let denied = DynamoDbError::Api {
            op: "DescribeTable",
            source: StoreError::Validation("x".into()),
        };
        assert!(!denied.is_unavailable());
        assert!(!DynamoDbError::TableMissing { table: "t".into() }.is_unavailable());
    }
}
