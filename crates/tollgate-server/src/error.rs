//! JSON errors with stable codes, and the mapping from [`tollgate::Error`].

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use tollgate::Error;
use tollgate_core::RuleError;

/// Every error code the API answers with, its status, and when (the table of
/// `docs/http-api.md`, which a test keeps in step with this one).
pub const CODES: &[(&str, u16, &str)] = &[
    ("invalid_json", 400, "the body is not JSON, or an object repeats a key"),
    ("invalid_request", 400, "well-formed JSON of the wrong shape, an unknown field, a bad query string, or a body that broke off"),
    ("invalid_identifier", 400, "a malformed entity id (also a path segment that is not UTF-8)"),
    ("invalid_name", 400, "a malformed resource or limit name"),
    ("invalid_amount", 400, "an amount or delta that is negative, not an integer, or too large"),
    ("invalid_limit", 400, "an invalid limit definition"),
    ("invalid_resource_set", 400, "a multi-resource acquire named no resource, more than 16, or one twice"),
    ("unknown_limit", 400, "an amount names a limit the resource does not have"),
    ("invalid_adjustment", 400, "a lease adjustment would refund more than the lease consumed of the limit"),
    ("invalid_usage_query", 400, "a usage query without an entity or a resource, or with a bad limit or page token"),
    ("invalid_lease", 400, "a lease token that does not verify: malformed, truncated, altered, or signed under another lease key"),
    ("bad_request", 400, "the request could not be parsed as HTTP/1.1"),
    ("unauthorized", 401, "no bearer token, or one the server does not know"),
    ("forbidden", 403, "the token's role may not use this route"),
    ("overrides_disabled", 403, "an acquire sent its own `limits`, which this server does not allow for this caller"),
    ("resource_disabled", 403, "the resource is disabled for the entity"),
    ("namespace_deleted", 403, "the server's namespace was soft-deleted (or is being purged): recover it to admit again"),
    ("not_found", 404, "no route has this path"),
    ("no_limits", 404, "no limits are configured for the entity and resource"),
    ("entity_not_found", 404, "no such entity"),
    ("namespace_not_found", 404, "no namespace of this name or id"),
    ("lease_not_found", 404, "the lease has expired (its token is no longer accepted)"),
    ("method_not_allowed", 405, "the route does not take this method"),
    ("body_timeout", 408, "the request body did not arrive within the body timeout"),
    ("entity_exists", 409, "an entity with this id exists"),
    ("parent_cycle", 409, "moving the entity under that parent would make it its own ancestor"),
    ("namespace_state", 409, "the namespace's state refuses the operation: recover or purge an active one, recover a name registered again, or one being purged"),
    ("lease_closed", 409, "the lease was committed or rolled back (on any server)"),
    ("lease_stale", 409, "a lease token older than the version this server holds: pass the latest token"),
    ("payload_too_large", 413, "the body is larger than the body limit"),
    ("uri_too_long", 414, "the request URI is longer than the server accepts"),
    ("headers_too_large", 431, "the request head is larger than the server accepts, or has too many headers"),
    ("rate_limit_exceeded", 429, "a limit refused the acquire"),
    ("contended", 429, "the entity's buckets stayed contended by concurrent writers: nothing was charged, retry shortly"),
    ("internal_error", 500, "a bug"),
    ("store_misconfigured", 500, "the store refused the request as invalid (a missing table, a schema or credentials configured wrongly): never fails open"),
    ("corrupt_data", 500, "corrupt stored data"),
    ("store_unavailable", 503, "the store cannot be reached, throttled, or the outcome is unknown"),
    ("limits_conflict", 503, "the levels' merged limits cannot be enforced (schedules in different time zones, a patch that does not fit): fix the merge flags"),
    ("too_many_leases", 503, "the server holds its maximum of open leases"),
    ("timeout", 503, "the request took longer than the request timeout"),
];

/// The code of an error answer that carries no JSON of its own (a framework's or a layer's),
/// by status.
pub fn code_for_status(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "bad_request",
        401 => "unauthorized",
        403 => "forbidden",
        404 => "not_found",
        405 => "method_not_allowed",
        408 => "body_timeout",
        413 => "payload_too_large",
        414 => "uri_too_long",
        431 => "headers_too_large",
        503 => "timeout",
        _ => "internal_error",
    }
}

/// An error answer that is not JSON (from a layer such as the request timeout, or the
/// framework) gets the JSON body of its status's code; others are returned as they are.
/// Headers stay.
pub fn ensure_json(resp: Response) -> Response {
    let status = resp.status();
    if status.as_u16() < 400 {
        return resp;
    }
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return resp;
    }
    let code = code_for_status(status);
    let message = match code {
        "timeout" => "the request took longer than the server's request timeout".to_string(),
        _ => status
            .canonical_reason()
            .unwrap_or("error")
            .to_ascii_lowercase(),
    };
    let (mut parts, _) = resp.into_parts();
    let body = serde_json::json!({ "error": code, "message": message }).to_string();
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body))
}

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

    /// `408 body_timeout`: the body did not arrive within the body timeout. The connection
    /// is closed after the answer (its unread body cannot be skipped).
    pub fn body_timeout() -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            "the request body did not arrive in time",
        )
    }

    /// `404 lease_not_found`: the lease has expired.
    pub fn lease_not_found(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "lease_not_found",
            format!("lease {id:?} has expired"),
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
/// | lease committed or rolled back (on any server) | 409 | `lease_closed` |
/// | lease token malformed, altered or of another key | 400 | `invalid_lease` |
/// | lease expired | 404 | `lease_not_found` |
/// | adjustment refunds more than the lease consumed | 400 | `invalid_adjustment` |
/// | buckets contended through every retry (nothing charged) | 429 | `contended` |
/// | resource disabled for the entity | 403 | `resource_disabled` |
/// | store unreachable, throttled, outcome unknown | 503 | `store_unavailable` |
/// | store refused a request as invalid | 500 | `internal_error` |
/// | corrupt stored data | 500 | `corrupt_data` |
/// | merged limits conflict (time zones, a patch that does not fit) | 503 | `limits_conflict` |
/// | the namespace is soft-deleted or being purged | 403 | `namespace_deleted` |
/// | no such namespace | 404 | `namespace_not_found` |
/// | the namespace's state refuses the operation | 409 | `namespace_state` |
pub fn classify(e: &Error) -> (StatusCode, &'static str) {
    match e {
        Error::RateLimitExceeded(_) => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_exceeded"),
        Error::Invalid(r) => match r {
            RuleError::InvalidIdentifier { .. } => (StatusCode::BAD_REQUEST, "invalid_identifier"),
            RuleError::InvalidName { .. } => (StatusCode::BAD_REQUEST, "invalid_name"),
            RuleError::InvalidLimit { .. } => (StatusCode::BAD_REQUEST, "invalid_limit"),
            RuleError::InvalidAmount { .. } => (StatusCode::BAD_REQUEST, "invalid_amount"),
            RuleError::Corrupt { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "corrupt_data"),
            RuleError::InvalidResourceSet { .. } => {
                (StatusCode::BAD_REQUEST, "invalid_resource_set")
            }
        },
        Error::UnknownLimit { .. } => (StatusCode::BAD_REQUEST, "unknown_limit"),
        Error::NoLimits { .. } => (StatusCode::NOT_FOUND, "no_limits"),
        Error::EntityExists(_) => (StatusCode::CONFLICT, "entity_exists"),
        Error::EntityNotFound(_) => (StatusCode::NOT_FOUND, "entity_not_found"),
        Error::ParentCycle { .. } => (StatusCode::CONFLICT, "parent_cycle"),
        Error::LeaseClosed => (StatusCode::CONFLICT, "lease_closed"),
        Error::InvalidLease(_) => (StatusCode::BAD_REQUEST, "invalid_lease"),
        Error::LeaseExpired => (StatusCode::NOT_FOUND, "lease_not_found"),
        Error::InvalidAdjustment { .. } => (StatusCode::BAD_REQUEST, "invalid_adjustment"),
        Error::Contended { .. } => (StatusCode::TOO_MANY_REQUESTS, "contended"),
        Error::InvalidUsage(_) => (StatusCode::BAD_REQUEST, "invalid_usage_query"),
        Error::ResourceDisabled { .. } => (StatusCode::FORBIDDEN, "resource_disabled"),
        Error::Corrupt(_) => (StatusCode::INTERNAL_SERVER_ERROR, "corrupt_data"),
        Error::Misconfigured(_) => (StatusCode::INTERNAL_SERVER_ERROR, "store_misconfigured"),
        Error::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"),
        Error::LimitsConflict { .. } => (StatusCode::SERVICE_UNAVAILABLE, "limits_conflict"),
        Error::NamespaceDeleted { .. } => (StatusCode::FORBIDDEN, "namespace_deleted"),
        Error::NamespaceNotFound(_) => (StatusCode::NOT_FOUND, "namespace_not_found"),
        Error::NamespaceState { .. } => (StatusCode::CONFLICT, "namespace_state"),
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
        debug_assert!(
            CODES
                .iter()
                .any(|(c, s, _)| *c == self.code && *s == self.status.as_u16()),
            "undocumented error code {} {}",
            self.status,
            self.code
        );
        let mut headers = HeaderMap::new();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if self.status == StatusCode::REQUEST_TIMEOUT {
            // The body was not read: the connection cannot carry another request.
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
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
