//! Failures and exit codes.
//!
//! | code | when |
//! |---|---|
//! | 0 | ok |
//! | 1 | anything else: the entity exists / does not exist, a lease closed, I/O |
//! | 2 | bad input: a usage error, a malformed id, name, amount, limit or duration, an amount for a limit the resource lacks, no limits configured, an invalid table name, a non-loopback `--listen` without authentication |
//! | 3 | refused: a limit rejected the acquire, or the resource is disabled for the entity |
//! | 4 | the store: no such store (a read-only command on a missing file), the store cannot be opened or reached, no AWS credentials or region, corrupt data |
//! | 5 | `tollgate doctor`: corrupt items found (and not all repaired) |

use tollgate::{Error, Exceeded};

/// Exit code: success.
pub const OK: u8 = 0;
/// Exit code: anything else (not found, exists, I/O …).
pub const OTHER: u8 = 1;
/// Exit code: bad input (also clap's usage errors).
pub const BAD_INPUT: u8 = 2;
/// Exit code: rejected by a limit.
pub const REJECTED: u8 = 3;
/// Exit code: store unavailable or store error.
pub const UNAVAILABLE: u8 = 4;
/// Exit code: `tollgate doctor` found corrupt items that remain.
pub const CORRUPT_FOUND: u8 = 5;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// Refused by a limit.
    #[error("{0}")]
    Rejected(Box<Exceeded>),
    /// Bad input.
    #[error("{0}")]
    BadInput(String),
    /// The store could not be used.
    #[error("{0}")]
    Unavailable(String),
    /// A command that only reads (or must not create a store) named a store that does not
    /// exist.
    #[error("{0}")]
    NoSuchStore(String),
    /// No AWS credentials or region could be found for a DynamoDB store.
    #[cfg_attr(not(feature = "dynamodb"), allow(dead_code))]
    #[error("{0}")]
    Credentials(String),
    /// `tollgate doctor` found corrupt items that remain (its report is already printed).
    #[error("{0}")]
    CorruptFound(String),
    /// A limiter error (classified by [`tollgate_server::classify`]).
    #[error("{0}")]
    Limiter(Error),
    /// Anything else.
    #[error("{0:#}")]
    Other(#[from] anyhow::Error),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        match e {
            Error::RateLimitExceeded(x) => Failure::Rejected(x),
            e => Failure::Limiter(e),
        }
    }
}

impl Failure {
    /// The stable code (as in the HTTP API).
    pub fn code(&self) -> &'static str {
        match self {
            Failure::Rejected(_) => "rate_limit_exceeded",
            Failure::BadInput(_) => "invalid_input",
            Failure::Unavailable(_) => "store_unavailable",
            Failure::NoSuchStore(_) => "no_such_store",
            Failure::Credentials(_) => "no_credentials",
            Failure::CorruptFound(_) => "corrupt_items",
            Failure::Limiter(e) => tollgate_server::classify(e).1,
            Failure::Other(_) => "error",
        }
    }

    /// The process exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Rejected(_) => REJECTED,
            Failure::BadInput(_) => BAD_INPUT,
            Failure::CorruptFound(_) => CORRUPT_FOUND,
            Failure::Unavailable(_) | Failure::NoSuchStore(_) | Failure::Credentials(_) => {
                UNAVAILABLE
            }
            Failure::Limiter(e) => match e {
                Error::RateLimitExceeded(_) | Error::ResourceDisabled { .. } => REJECTED,
                Error::Invalid(tollgate_core::RuleError::Corrupt { .. }) => UNAVAILABLE,
                Error::Invalid(_)
                | Error::UnknownLimit { .. }
                | Error::NoLimits { .. }
                | Error::InvalidAdjustment { .. }
                | Error::InvalidUsage(_) => BAD_INPUT,
                Error::Contended { .. } => REJECTED,
                Error::Unavailable(_)
                | Error::Misconfigured(_)
                | Error::Corrupt(_)
                | Error::LimitsConflict { .. } => UNAVAILABLE,
                Error::NamespaceDeleted { .. } => REJECTED,
                Error::EntityExists(_) | Error::EntityNotFound(_) | Error::LeaseClosed => OTHER,
                #[allow(unreachable_patterns)]
                _ => OTHER,
            },
            Failure::Other(_) => OTHER,
        }
    }
}
