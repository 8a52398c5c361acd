//! Request ids: every request gets one, in its extensions ([`RequestId`]) and in the
//! `x-request-id` header of its answer.
//!
//! A client's own `x-request-id` is kept when it is 1 to [`MAX_LEN`] characters of letters,
//! digits and `. _ - : / + =` (so it is safe in a log line); otherwise, or when absent, the
//! server makes one (32 hex digits).

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderName, HeaderValue};

/// `x-request-id`.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client request id kept.
pub const MAX_LEN: usize = 128;

/// A request's id (in the request's extensions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub Arc<str>);

/// A fresh id: 32 hex digits.
pub fn fresh() -> String {
    let digits = hex32(rand::random::<u128>());
    // Hex digits are ASCII.
    String::from_utf8_lossy(&digits).into_owned()
}

/// `v` as 32 lowercase hex digits (as `format!("{v:032x}")`).
fn hex32(v: u128) -> [u8; 32] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 32];
    for (i, d) in out.iter_mut().enumerate() {
        *d = HEX[((v >> (124 - 4 * i)) & 0xf) as usize];
    }
    out
}

/// Whether a client's id is kept as is.
pub fn acceptable(v: &[u8]) -> bool {
    !v.is_empty()
        && v.len() <= MAX_LEN
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:/+=".contains(b))
}

/// The id of a request with `headers`: the client's `x-request-id` when [`acceptable`], else
/// a fresh one; and the header value that answers it.
pub(crate) fn assign(headers: &HeaderMap) -> (Arc<str>, Option<HeaderValue>) {
    if let Some(v) = headers.get(&X_REQUEST_ID) {
        if acceptable(v.as_bytes()) {
            if let Ok(s) = v.to_str() {
                return (Arc::from(s), Some(v.clone()));
            }
        }
    }
    let digits = hex32(rand::random::<u128>());
    let id = std::str::from_utf8(&digits).unwrap_or_default();
    (Arc::from(id), HeaderValue::from_bytes(&digits).ok())
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
        for v in [
            0,
            1,
            0xabc,
            u128::MAX,
            0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
        ] {
            assert_eq!(hex32(v), format!("{v:032x}").as_bytes());
        }
    }
}
