//! Failures and exit codes: 0 ok, 1 other, 2 bad input, 3 rejected, 4 unavailable.

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
            Failure::Limiter(e) => tollgate_server::classify(e).1,
            Failure::Other(_) => "error",
        }
    }

    /// The process exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Rejected(_) => REJECTED,
            Failure::BadInput(_) => BAD_INPUT,
            Failure::Unavailable(_) => UNAVAILABLE,
            Failure::Limiter(e) => match e {
                Error::RateLimitExceeded(_) | Error::ResourceDisabled { .. } => REJECTED,
                Error::Invalid(tollgate_core::RuleError::Corrupt { .. }) => UNAVAILABLE,
                Error::Invalid(_) | Error::UnknownLimit { .. } | Error::NoLimits { .. } => {
                    BAD_INPUT
                }
                Error::Unavailable(_) | Error::Corrupt(_) => UNAVAILABLE,
                Error::EntityExists(_) | Error::EntityNotFound(_) | Error::LeaseClosed => OTHER,
                #[allow(unreachable_patterns)]
                _ => OTHER,
            },
            Failure::Other(_) => OTHER,
        }
    }
}
