//! Extractors whose rejections are this API's JSON errors (never axum's plain-text ones).

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use smallvec::SmallVec;
use std::collections::HashSet;

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
    // serde_json keeps the last of repeated keys in maps ({"t":1,"t":2} reads as 2): refuse
    // them anywhere in the document first.
    serde_json::from_slice::<UniqueKeys>(bytes)
        .map_err(|e| ApiError::invalid_json(format!("the request body is not valid JSON: {e}")))?;
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

/// A JSON document walked only to check that no object repeats a key (at any depth).
struct UniqueKeys;

/// Keys of one object compared by scanning before they go into a hash set.
const FEW_KEYS: usize = 16;

impl<'de> serde::Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueKeysVisitor)
    }
}

struct UniqueKeysVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueKeysVisitor {
    type Value = UniqueKeys;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_i64<E>(self, _: i64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_u64<E>(self, _: u64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_f64<E>(self, _: f64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_str<E>(self, _: &str) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_unit<E>(self) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<UniqueKeys, A::Error> {
        while seq.next_element::<UniqueKeys>()?.is_some() {}
        Ok(UniqueKeys)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<UniqueKeys, A::Error> {
        // A request's objects hold a handful of keys: compared on the stack; a larger one
        // moves to a hash set.
        let mut few: SmallVec<[Key<'de>; FEW_KEYS]> = SmallVec::new();
        let mut many: Option<HashSet<Key<'de>>> = None;
        while let Some(k) = map.next_key::<Key<'de>>()? {
            let repeated = match &mut many {
                Some(set) => set.contains(&k),
                None => few.contains(&k),
            };
            if repeated {
                return Err(serde::de::Error::custom(format!(
                    "duplicate key {:?}",
                    k.as_str()
                )));
            }
            match &mut many {
                Some(set) => {
                    set.insert(k);
                }
                None if few.len() < FEW_KEYS => few.push(k),
                None => many = Some(few.drain(..).chain([k]).collect()),
            }
            map.next_value::<UniqueKeys>()?;
        }
        Ok(UniqueKeys)
    }
}

/// An object key after unescaping: borrowed from the document when it holds no escape (no
/// allocation), owned otherwise. Keys compare and hash by their text, however held.
#[derive(Debug)]
enum Key<'de> {
    Borrowed(&'de str),
    Owned(Box<str>),
}

impl Key<'_> {
    fn as_str(&self) -> &str {
        match self {
            Key::Borrowed(s) => s,
            Key::Owned(s) => s,
        }
    }
}

impl PartialEq for Key<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Key<'_> {}

impl std::hash::Hash for Key<'_> {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.as_str().hash(h)
    }
}

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> serde::de::Visitor<'de> for KeyVisitor {
    type Value = Key<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an object key")
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
        Ok(Key::Borrowed(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
        Ok(Key::Owned(v.into()))
    }
}

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| body_error(&e))?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// The error of a body that could not be read: too large (`413 payload_too_large`), not sent
/// in time (`408 body_timeout`, see [`crate::ServerConfig::body_timeout`]), or broken off
/// (`400 invalid_request`).
fn body_error(e: &axum::extract::rejection::BytesRejection) -> ApiError {
    let status = e.status();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::new(status, "payload_too_large", e.body_text());
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<tower_http::timeout::TimeoutError>() {
            return ApiError::body_timeout();
        }
        source = err.source();
    }
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_request",
        format!("the request body could not be read: {}", e.body_text()),
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    fn unique(doc: &str) -> bool {
        serde_json::from_str::<UniqueKeys>(doc).is_ok()
    }

    /// A repeated key is found in a small object, in a nested one, and in an object past
    /// the keys compared on the stack (where a hash set takes over), whichever key repeats.
    #[test]
    fn repeated_keys_are_found_in_objects_of_any_size() {
        assert!(unique(r#"{"a":1,"b":{"c":[{"d":1},{"d":2}]}}"#));
        assert!(!unique(r#"{"a":1,"b":2,"a":3}"#));
        assert!(!unique(r#"{"a":1,"b":{"c":1,"c":2}}"#));
        assert!(
            !unique(r#"{"a":"x","\u0061":"y"}"#),
            "an escaped spelling is the same key"
        );
        for n in [FEW_KEYS - 1, FEW_KEYS, FEW_KEYS + 1, 3 * FEW_KEYS] {
            let keys: Vec<String> = (0..n).map(|i| format!("\"k{i}\":{i}")).collect();
            let doc = format!("{{{}}}", keys.join(","));
            assert!(unique(&doc), "{n} distinct keys");
            for repeat in [0, n / 2, n - 1] {
                let doc = format!("{{{},\"k{repeat}\":0}}", keys.join(","));
                assert!(!unique(&doc), "{n} keys, k{repeat} repeated last");
            }
        }
    }
}
