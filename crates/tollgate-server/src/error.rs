//! JSON errors with stable codes, and the mapping from [`tollgate::Error`].

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use tollgate::Error;
use tollgate_core::RuleError;
use tollgate_store::StoreError;

/// The body of every error response: `{"error": code, "message": text}`.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorBody {
    /// A stable, machine-readable code (see [`ApiError::code`]).
    pub error: &'static str,
    /// A human-readable explanation (may change between versions).
    pub message: String,
}

/// An error response of the API (everything but a `429`, which the acquire handler renders
/// itself because it carries statuses and headers).
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable code.
    pub code: &'static str,
    /// Explanation.
    pub message: String,
}

impl ApiError {
    /// Build an error.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    /// `400 invalid_json`: the body is not JSON (syntax error, truncated, empty).
    pub fn invalid_json(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_json", message)
    }

    /// `400 invalid_request`: well-formed JSON of the wrong shape (missing or mistyped field).
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// `400 invalid_amount`.
    pub fn invalid_amount(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_amount", message)
    }

    /// `404 lease_not_found`.
    pub fn lease_not_found(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "lease_not_found",
            format!("no lease {id:?} (unknown, or expired and swept)"),
        )
    }
}

/// The HTTP status and stable code of a limiter error.
///
/// | error | status | code |
/// |---|---|---|
/// | rate limit exceeded | 429 | `rate_limit_exceeded` |
/// | malformed id | 400 | `invalid_identifier` |
/// | malformed limit or resource name | 400 | `invalid_name` |
/// | invalid limit definition | 400 | `invalid_limit` |
/// | negative / too large / repeated amount | 400 | `invalid_amount` |
/// | amount names a limit the resource lacks | 400 | `unknown_limit` |
/// | no limits configured | 404 | `no_limits` |
/// | entity exists / not found | 409 / 404 | `entity_exists` / `entity_not_found` |
/// | lease committed or rolled back | 409 | `lease_closed` |
/// | resource disabled for the entity | 403 | `resource_disabled` |
/// | store unreachable, throttled, outcome unknown | 503 | `store_unavailable` |
/// | store refused a request as invalid | 500 | `internal_error` |
/// | corrupt stored data | 500 | `corrupt_data` |
pub fn classify(e: &Error) -> (StatusCode, &'static str) {
    match e {
        Error::RateLimitExceeded(_) => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_exceeded"),
        Error::Invalid(r) => match r {
            RuleError::InvalidIdentifier { .. } => (StatusCode::BAD_REQUEST, "invalid_identifier"),
            RuleError::InvalidName { .. } => (StatusCode::BAD_REQUEST, "invalid_name"),
            RuleError::InvalidLimit { .. } => (StatusCode::BAD_REQUEST, "invalid_limit"),
            RuleError::InvalidAmount { .. } => (StatusCode::BAD_REQUEST, "invalid_amount"),
            RuleError::Corrupt { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "corrupt_data"),
        },
        Error::UnknownLimit { .. } => (StatusCode::BAD_REQUEST, "unknown_limit"),
        Error::NoLimits { .. } => (StatusCode::NOT_FOUND, "no_limits"),
        Error::EntityExists(_) => (StatusCode::CONFLICT, "entity_exists"),
        Error::EntityNotFound(_) => (StatusCode::NOT_FOUND, "entity_not_found"),
        Error::LeaseClosed => (StatusCode::CONFLICT, "lease_closed"),
        Error::ResourceDisabled { .. } => (StatusCode::FORBIDDEN, "resource_disabled"),
        Error::Corrupt(_) => (StatusCode::INTERNAL_SERVER_ERROR, "corrupt_data"),
        Error::Unavailable(StoreError::Validation(_)) => {
            (StatusCode::INTERNAL_SERVER_ERROR, "internal_error")
        }
        Error::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"),
        // Internal variants (never expected to escape the limiter) and future ones.
        #[allow(unreachable_patterns)]
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let (status, code) = classify(&e);
        if status.is_server_error() {
            tracing::warn!(error = %e, code, "request failed");
        }
        ApiError::new(status, code, e.to_string())
    }
}

impl From<RuleError> for ApiError {
    fn from(e: RuleError) -> Self {
        Error::from(e).into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut headers = HeaderMap::new();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        (
            self.status,
            headers,
            Json(ErrorBody {
                error: self.code,
                message: self.message,
            }),
        )
            .into_response()
    }
}
