//! Extractors whose rejections are this API's JSON errors (never axum's plain-text ones).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use smallvec::SmallVec;
use std::collections::HashSet;

use crate::error::ApiError;
use crate::AppState;

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
    // them anywhere in the document first — by a walk of the whole document through serde,
    // unless a scan of the bytes already shows every key distinct (`plainly_unique`). A
    // document the scan vouched for is still walked when it fails to parse, so that its
    // error is the walk's, as without the scan.
    let walk = || {
        serde_json::from_slice::<UniqueKeys>(bytes)
            .map(|_| ())
            .map_err(|e| ApiError::invalid_json(format!("the request body is not valid JSON: {e}")))
    };
    let scanned = plainly_unique(bytes);
    if !scanned {
        walk()?;
    }
    serde_json::from_slice(bytes).map_err(|e| {
        if scanned {
            if let Err(walked) = walk() {
                return walked;
            }
        }
        use serde_json::error::Category;
        match e.classify() {
            Category::Data => ApiError::invalid_request(format!("unexpected JSON shape: {e}")),
            Category::Syntax | Category::Eof | Category::Io => {
                ApiError::invalid_json(format!("the request body is not valid JSON: {e}"))
            }
        }
    })
}

/// Keys of one object the scan compares, at most; a larger object is left to the walk.
const SCAN_KEYS: usize = 32;
/// Objects and arrays open at once the scan follows, at most.
const SCAN_DEPTH: usize = 32;

/// Whether a scan of the bytes shows that no object of the document repeats a key: `true`
/// only when every key is written without an escape (so that equal keys are equal bytes),
/// no object holds more than [`SCAN_KEYS`] keys and nesting stays within [`SCAN_DEPTH`];
/// `false` means "not shown" (a repeat, an escaped key, a large or deep document, or bytes
/// that are not JSON), and the serde walk decides. Sound for a document serde_json parses:
/// a string is a key exactly when it follows `{` or an object's `,`.
fn plainly_unique(bytes: &[u8]) -> bool {
    // The open containers: (is an object, where its keys start in `keys`).
    let mut open: SmallVec<[(bool, usize); SCAN_DEPTH]> = SmallVec::new();
    // The keys of every open object, as byte ranges, innermost last.
    let mut keys: SmallVec<[(usize, usize); SCAN_KEYS]> = SmallVec::new();
    let mut key_next = false;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'{' | b'[' => {
                if open.len() == SCAN_DEPTH {
                    return false;
                }
                open.push((bytes[i] == b'{', keys.len()));
                key_next = bytes[i] == b'{';
            }
            b'}' | b']' => {
                let Some((object, start)) = open.pop() else {
                    return false;
                };
                if object != (bytes[i] == b'}') {
                    return false;
                }
                keys.truncate(start);
                key_next = false;
            }
            b',' => key_next = open.last().is_some_and(|(object, _)| *object),
            b':' => key_next = false,
            b'"' => {
                let from = i + 1;
                let mut escaped = false;
                i = from;
                loop {
                    match bytes.get(i) {
                        None => return false,
                        Some(b'"') => break,
                        Some(b'\\') => {
                            escaped = true;
                            i += 2;
                        }
                        Some(_) => i += 1,
                    }
                }
                if key_next {
                    if escaped {
                        return false;
                    }
                    let start = open.last().map_or(0, |(_, s)| *s);
                    let key = &bytes[from..i];
                    if keys.len() - start == SCAN_KEYS
                        || keys[start..].iter().any(|&(a, b)| &bytes[a..b] == key)
                    {
                        return false;
                    }
                    keys.push((from, i));
                    key_next = false;
                }
            }
            _ => {}
        }
        i += 1;
    }
    open.is_empty()
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

impl<T> FromRequest<Arc<AppState>> for JsonBody<T>
where
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        let bytes = read_body(req, state.config.body_limit).await?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// The whole body of `req`, at most `limit` bytes (more is `413 payload_too_large`, as
/// axum's `Bytes` extractor under `DefaultBodyLimit` answers): its frames are read here
/// rather than through axum's `Limited` and `Collect` layers, and a body that comes in one
/// frame (every request of a client that sends its body with its headers) is that frame's
/// bytes, not a copy.
async fn read_body(req: Request, limit: usize) -> Result<Bytes, ApiError> {
    let mut body = req.into_body();
    let mut first = Bytes::new();
    let mut joined: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| body_error(&e))?;
        let Ok(data) = frame.into_data() else {
            // Trailers: not part of the body.
            continue;
        };
        let total = first.len() + joined.len() + data.len();
        if total > limit {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "Failed to buffer the request body: length limit exceeded",
            ));
        }
        if first.is_empty() && joined.is_empty() {
            first = data;
        } else {
            if joined.is_empty() {
                joined.reserve(total);
                joined.extend_from_slice(&first);
                first = Bytes::new();
            }
            joined.extend_from_slice(&data);
        }
    }
    Ok(if joined.is_empty() {
        first
    } else {
        Bytes::from(joined)
    })
}

/// The error of a body that could not be read: not sent in time (`408 body_timeout`, see
/// [`crate::ServerConfig::body_timeout`]), or broken off (`400 invalid_request`).
fn body_error(e: &axum::Error) -> ApiError {
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
        format!("the request body could not be read: Failed to buffer the request body: {e}"),
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

    /// Whether serde_json parses `doc` (the scan need only be right about those: a document
    /// that does not parse is walked anyway).
    fn json(doc: &str) -> bool {
        serde_json::from_str::<serde::de::IgnoredAny>(doc).is_ok()
    }

    /// The scan vouches only for documents the walk accepts: over hand-picked near-misses
    /// and every document built from a small grammar (nested objects and arrays, keys from a
    /// small alphabet so that repeats are frequent, escaped keys, strings holding braces,
    /// quotes and commas), `plainly_unique` ⇒ the walk finds no repeat; and it does vouch for
    /// the common acquire body.
    #[test]
    fn the_scan_vouches_only_for_what_the_walk_accepts() {
        let body = br#"{"entity":"u1","resource":"bench","amounts":{"rps":1},"commit":true}"#;
        assert!(plainly_unique(body));
        for doc in [
            r#"{"a":1,"a":2}"#,
            r#"{"a":{"b":1},"c":{"b":2,"b":3}}"#,
            r#"{"a":"x","\u0061":"y"}"#,
            r#"{"a":"x\"","a":1}"#,
            r#"{"a":"{\"a\":1}","a":2}"#,
            r#"[{"a":1},{"a":2},{"b":1,"b":1}]"#,
            r#"{"a":1"#,
            r#"{"a":[1,2}"#,
            r#""#,
        ] {
            assert!(
                !plainly_unique(doc.as_bytes()) || unique(doc) || !json(doc),
                "{doc}"
            );
        }
        assert!(plainly_unique(
            br#"{"a":"}","b":[{"a":1},{"a":2}],"c":"\"a\""}"#
        ));
        assert!(!plainly_unique(br#"{"a":1,"b":{"c":2},"a":3}"#));
        let mut state: u64 = 7;
        let mut next = |m: u64| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) % m
        };
        fn value(next: &mut dyn FnMut(u64) -> u64, depth: u32, out: &mut String) {
            match if depth > 4 { next(3) } else { next(6) } {
                0 => out.push_str(["1", "true", "null", "-2.5e3"][next(4) as usize]),
                1 => out
                    .push_str([r#""x""#, r#""{\"a\":1,""#, r#""a\\""#, r#""}""#][next(4) as usize]),
                2 => out.push_str("[]"),
                3 | 4 => {
                    out.push('{');
                    for k in 0..next(5) {
                        if k > 0 {
                            out.push(',');
                        }
                        out.push_str(
                            [r#""a""#, r#""b""#, r#""c""#, r#""\u0061""#, r#""a\"""#]
                                [next(5) as usize],
                        );
                        out.push(':');
                        value(next, depth + 1, out);
                    }
                    out.push('}');
                }
                _ => {
                    out.push('[');
                    for k in 0..next(4) {
                        if k > 0 {
                            out.push(',');
                        }
                        value(next, depth + 1, out);
                    }
                    out.push(']');
                }
            }
        }
        let (mut vouched, mut repeats) = (0, 0);
        for _ in 0..20_000 {
            let mut doc = String::new();
            value(&mut next, 0, &mut doc);
            let walked = unique(&doc);
            repeats += usize::from(!walked);
            if plainly_unique(doc.as_bytes()) {
                vouched += 1;
                assert!(walked || !json(&doc), "vouched for a repeat: {doc}");
            }
        }
        assert!(
            vouched > 5_000 && repeats > 1_000,
            "{vouched} vouched, {repeats} repeats"
        );
    }

    /// A document the scan vouches for and that does not parse gets the walk's error, as
    /// without the scan: `invalid_json` for broken syntax even where the typed parse would
    /// have failed first on the shape.
    #[test]
    fn a_vouched_document_that_fails_gets_the_walks_error() {
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Body {
            a: i64,
        }
        let doc = br#"{"b":1,"c":[1,}"#;
        let e = parse_json::<Body>(doc).expect_err("broken");
        assert_eq!(e.code, "invalid_json", "{e:?}");
        let e = parse_json::<Body>(br#"{"b":1}"#).expect_err("unknown field");
        assert_eq!(e.code, "invalid_request", "{e:?}");
        let e = parse_json::<Body>(br#"{"a":1,"a":2}"#).expect_err("repeat");
        assert_eq!(e.code, "invalid_json", "{e:?}");
        assert_eq!(parse_json::<Body>(br#"{"a":7}"#).expect("parses").a, 7);
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
