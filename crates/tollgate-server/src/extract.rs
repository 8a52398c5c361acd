//! Extractors whose rejections are this API's JSON errors (never axum's plain-text ones).

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// A JSON body. Accepted whatever the `Content-Type` (clients such as `curl -d` send
/// form types); a syntax error is `invalid_json`, well-formed JSON of the wrong shape is
/// `invalid_request`, a body over the limit is `payload_too_large`.
#[derive(Debug, Clone)]
pub struct JsonBody<T>(pub T);

/// Parse `bytes` as JSON into `T` with this API's error codes.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(ApiError::invalid_json(
            "the request body is empty; JSON expected",
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            Category::Data => ApiError::invalid_request(format!("unexpected JSON shape: {e}")),
            Category::Syntax | Category::Eof | Category::Io => {
                ApiError::invalid_json(format!("the request body is not valid JSON: {e}"))
            }
        }
    })
}

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            let status = e.status();
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(status, "payload_too_large", e.body_text())
            } else {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e.body_text())
            }
        })?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// Path parameters; a segment that cannot be decoded (bad percent-encoding, not UTF-8) is
/// `invalid_identifier`.
#[derive(Debug, Clone)]
pub struct PathParams<T>(pub T);

impl<S, T> FromRequestParts<S> for PathParams<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(v)| PathParams(v))
            .map_err(|e| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_identifier",
                    format!("bad path parameter: {}", e.body_text()),
                )
            })
    }
}

/// The raw query string as ordered `(key, value)` pairs (repeated keys kept);
/// an undecodable query is `invalid_request`.
#[derive(Debug, Clone, Default)]
pub struct QueryPairs(pub Vec<(String, String)>);

impl<S: Send + Sync> FromRequestParts<S> for QueryPairs {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let q = parts.uri.query().unwrap_or("");
        serde_urlencoded::from_str::<Vec<(String, String)>>(q)
            .map(QueryPairs)
            .map_err(|e| ApiError::invalid_request(format!("bad query string: {e}")))
    }
}
