//! Request ids: every request gets one, in its extensions and in the `x-request-id` header of
//! its answer.
//!
//! A client's own `x-request-id` is kept when it is 1 to [`MAX_LEN`] characters of letters,
//! digits and `. _ - : / + =` (so it is safe in a log line); otherwise, or when absent, the
//! server makes one (32 hex digits).

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;

/// `x-request-id`.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client request id kept.
pub const MAX_LEN: usize = 128;

/// A request's id (in the request's and the response's extensions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub Arc<str>);

/// A fresh id: 32 hex digits.
pub fn fresh() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Whether a client's id is kept as is.
pub fn acceptable(v: &[u8]) -> bool {
    !v.is_empty()
        && v.len() <= MAX_LEN
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:/+=".contains(b))
}

/// Middleware: assign the id, answer with it.
pub async fn assign(mut req: Request, next: Next) -> Response {
    let id: Arc<str> = match req.headers().get(&X_REQUEST_ID) {
        Some(v) if acceptable(v.as_bytes()) => Arc::from(v.to_str().unwrap_or_default()),
        _ => Arc::from(fresh()),
    };
    req.extensions_mut().insert(RequestId(id.clone()));
    let mut resp = next.run(req).await;
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert(X_REQUEST_ID.clone(), v);
    }
    resp.extensions_mut().insert(RequestId(id));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_ids_are_kept() {
        assert!(acceptable(b"abc-123"));
        assert!(acceptable(b"trace:9f/a+b="));
        assert!(!acceptable(b""));
        assert!(!acceptable(b"has space"));
        assert!(!acceptable(b"quote\""));
        assert!(!acceptable(&[b'a'; MAX_LEN + 1]));
        assert_eq!(fresh().len(), 32);
    }
}
