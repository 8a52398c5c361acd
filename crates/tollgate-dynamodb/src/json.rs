//! DynamoDB's JSON protocol for the requests [`crate::wire`] sends itself: request bodies
//! written straight from the item model and the typed expressions, and response images
//! read straight into an [`Item`], without the SDK's `AttributeValue` maps in between.
//!
//! Values are written as DynamoDB's typed JSON (`{"N":"5"}`, `{"S":"x"}`, `{"BOOL":true}`,
//! `{"SS":[…]}`, `{"M":{…}}`, `{"L":[…]}`, `{"NULL":true}`), with the same rules as
//! [`crate::codec`]: numbers are `i64` decimal strings, an empty string set is refused, and a
//! returned number that is not an `i64` or a type the item model does not know is
//! [`StoreError::Corrupt`] naming the attribute. Strings are escaped by `serde_json`.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use tollgate_core::value::{Item, Key, Value, PK, SK};
use tollgate_store::StoreError;

use crate::render::AliasTable;

/// Append `s` to `buf` as a JSON string.
///
/// A request's strings are names, keys and ids that need no escape (no `"`, `\` or
/// control character): those are copied between quotes as they are, the same bytes
/// `serde_json` writes for them; any other string is escaped by `serde_json`. (Its
/// per-string escaping was ~150 instructions a string, ~45 strings an acquire's write.)
pub(crate) fn push_str(buf: &mut Vec<u8>, s: &str) {
    if is_plain(s.as_bytes()) {
        buf.reserve(s.len() + 2);
        buf.push(b'"');
        buf.extend_from_slice(s.as_bytes());
        buf.push(b'"');
    } else {
        // Writing into a `Vec` cannot fail, and a `&str` always serializes.
        let _ = serde_json::to_writer(&mut *buf, s);
    }
}

/// Whether JSON escapes none of `s`'s bytes (none is [`special`]).
fn is_plain(s: &[u8]) -> bool {
    first_special(s).is_none()
}

/// Whether JSON treats `c` specially in a string: its end, an escape, or a control
/// character (which it forbids there).
fn special(c: u8) -> bool {
    c == b'"' || c == b'\\' || c < 0x20
}

/// Where the first [`special`] byte of `s` is. Eight bytes at a time: a word's bytes below
/// 0x20, equal to `"` or to `\` are flagged by the "has a byte less than n" and "has a
/// zero byte" word tricks, whose lowest flag is always a true one (a false flag can only
/// come from a borrow out of a true one below it); the last bytes one by one.
pub(crate) fn first_special(s: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_le_bytes([1; 8]);
    const HIGH: u64 = u64::from_le_bytes([0x80; 8]);
    let less = |x: u64, n: u8| x.wrapping_sub(ONES * u64::from(n)) & !x & HIGH;
    let mut words = s.chunks_exact(8);
    let mut at = 0;
    for w in &mut words {
        let mut a = [0u8; 8];
        a.copy_from_slice(w);
        let x = u64::from_le_bytes(a);
        let flags = less(x, 0x20)
            | less(x ^ (ONES * u64::from(b'"')), 1)
            | less(x ^ (ONES * u64::from(b'\\')), 1);
        if flags != 0 {
            let i = at + (flags.trailing_zeros() / 8) as usize;
            debug_assert!(special(s[i]) && !s[at..i].iter().any(|&c| special(c)));
            return Some(i);
        }
        at += 8;
    }
    words
        .remainder()
        .iter()
        .position(|&c| special(c))
        .map(|p| at + p)
}

/// Append `"name":` to `buf`.
pub(crate) fn push_field(buf: &mut Vec<u8>, name: &str) {
    push_str(buf, name);
    buf.push(b':');
}

/// Append one value as DynamoDB's typed JSON; `attr` names it in errors.
pub(crate) fn push_value(buf: &mut Vec<u8>, attr: &str, v: &Value) -> Result<(), StoreError> {
    match v {
        Value::N(n) => {
            buf.extend_from_slice(b"{\"N\":\"");
            let mut b = itoa::Buffer::new();
            buf.extend_from_slice(b.format(*n).as_bytes());
            buf.extend_from_slice(b"\"}");
        }
        Value::S(s) => {
            buf.extend_from_slice(b"{\"S\":");
            push_str(buf, s);
            buf.push(b'}');
        }
        Value::Bool(b) => buf.extend_from_slice(if *b {
            b"{\"BOOL\":true}"
        } else {
            b"{\"BOOL\":false}"
        }),
        Value::Ss(set) => {
            if set.is_empty() {
                return Err(StoreError::Validation(format!(
                    "an empty string set cannot be stored (attribute {attr})"
                )));
            }
            buf.extend_from_slice(b"{\"SS\":[");
            for (i, s) in set.iter().enumerate() {
                if i > 0 {
                    buf.push(b',');
                }
                push_str(buf, s);
            }
            buf.extend_from_slice(b"]}");
        }
        Value::M(m) => {
            buf.extend_from_slice(b"{\"M\":{");
            for (i, (k, v)) in m.iter().enumerate() {
                if i > 0 {
                    buf.push(b',');
                }
                push_field(buf, k);
                push_value(buf, &format!("{attr}.{k}"), v)?;
            }
            buf.extend_from_slice(b"}}");
        }
        Value::L(l) => {
            buf.extend_from_slice(b"{\"L\":[");
            for (i, v) in l.iter().enumerate() {
                if i > 0 {
                    buf.push(b',');
                }
                push_value(buf, &format!("{attr}[{i}]"), v)?;
            }
            buf.extend_from_slice(b"]}");
        }
        Value::Null => buf.extend_from_slice(b"{\"NULL\":true}"),
    }
    Ok(())
}

/// Append the primary key as `"Key":{"PK":{"S":…},"SK":{"S":…}}`.
pub(crate) fn push_key(buf: &mut Vec<u8>, key: &Key) {
    buf.extend_from_slice(b"\"Key\":{\"PK\":{\"S\":");
    push_str(buf, &key.pk);
    buf.extend_from_slice(b"},\"SK\":{\"S\":");
    push_str(buf, &key.sk);
    buf.extend_from_slice(b"}}");
}

/// Append `"Item":{…}`: the item with its key stamped on (the key wins over attributes of
/// the same name, as in [`crate::codec`]'s `stamped`).
pub(crate) fn push_item(buf: &mut Vec<u8>, key: &Key, item: &Item) -> Result<(), StoreError> {
    buf.extend_from_slice(b"\"Item\":{\"PK\":{\"S\":");
    push_str(buf, &key.pk);
    buf.extend_from_slice(b"},\"SK\":{\"S\":");
    push_str(buf, &key.sk);
    buf.push(b'}');
    for (k, v) in item.iter() {
        let k: &str = k;
        if k == PK || k == SK {
            continue;
        }
        buf.push(b',');
        push_field(buf, k);
        push_value(buf, k, v)?;
    }
    buf.push(b'}');
    Ok(())
}

/// The aliases of one request written as JSON as they are made: name `i` is `#n{i}`, value
/// `i` is `:v{i}` (the same numbering as [`crate::render::Aliases`]), values encoded at once.
#[derive(Debug, Default)]
pub(crate) struct JsonAliases {
    /// The names, one after the other (one buffer rather than a string each).
    text: String,
    /// Where name `i` is in `text`.
    names: Vec<std::ops::Range<usize>>,
    /// `":v0":{…},":v1":{…}` (no braces around).
    values: Vec<u8>,
    n_values: usize,
}

impl JsonAliases {
    /// No aliases yet.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Append `,"ExpressionAttributeNames":{…}` and `,"ExpressionAttributeValues":{…}` for
    /// the aliases made, each only when not empty (DynamoDB refuses empty maps).
    pub(crate) fn finish(self, buf: &mut Vec<u8>) {
        self.push_names(buf);
        self.push_values(buf);
    }

    /// Append `,"ExpressionAttributeNames":{…}` (nothing without names).
    pub(crate) fn push_names(&self, buf: &mut Vec<u8>) {
        if !self.names.is_empty() {
            buf.extend_from_slice(b",\"ExpressionAttributeNames\":{");
            let mut alias = String::with_capacity(6);
            for (i, r) in self.names.iter().enumerate() {
                if i > 0 {
                    buf.push(b',');
                }
                alias.clear();
                crate::render::push_alias(&mut alias, "#n", i);
                push_field(buf, &alias);
                push_str(buf, &self.text[r.clone()]);
            }
            buf.push(b'}');
        }
    }

    /// Append `,"ExpressionAttributeValues":{…}` (nothing without values).
    pub(crate) fn push_values(&self, buf: &mut Vec<u8>) {
        if self.n_values > 0 {
            buf.extend_from_slice(b",\"ExpressionAttributeValues\":{");
            buf.extend_from_slice(&self.values);
            buf.push(b'}');
        }
    }
}

impl AliasTable for JsonAliases {
    fn push_name(&mut self, out: &mut String, name: &str) {
        let i = match self
            .names
            .iter()
            .position(|r| &self.text[r.clone()] == name)
        {
            Some(i) => i,
            None => {
                let start = self.text.len();
                self.text.push_str(name);
                self.names.push(start..self.text.len());
                self.names.len() - 1
            }
        };
        crate::render::push_alias(out, "#n", i);
    }

    fn push_value(&mut self, out: &mut String, attr: &str, v: &Value) -> Result<(), StoreError> {
        let i = self.n_values;
        if i > 0 {
            self.values.push(b',');
        }
        let start = out.len();
        crate::render::push_alias(out, ":v", i);
        push_field(&mut self.values, &out[start..]);
        push_value(&mut self.values, attr, v)?;
        self.n_values += 1;
        Ok(())
    }
}

/// A string of a response, borrowed from the body unless it had escapes.
#[derive(Deserialize)]
struct Str<'a>(#[serde(borrow)] Cow<'a, str>);

/// One returned value, as DynamoDB's typed JSON.
#[derive(Deserialize)]
enum Av<'a> {
    #[serde(rename = "N", borrow)]
    N(Cow<'a, str>),
    #[serde(rename = "S", borrow)]
    S(Cow<'a, str>),
    #[serde(rename = "BOOL")]
    Bool(bool),
    #[serde(rename = "NULL")]
    Null(IgnoredAny),
    #[serde(rename = "SS")]
    Ss(Vec<String>),
    #[serde(rename = "M", borrow)]
    M(Image<'a>),
    #[serde(rename = "L", borrow)]
    L(Vec<Av<'a>>),
    #[serde(rename = "B")]
    B(IgnoredAny),
    #[serde(rename = "BS")]
    Bs(IgnoredAny),
    #[serde(rename = "NS")]
    Ns(IgnoredAny),
}

/// A returned item or map, attributes in the order of the response.
pub(crate) struct Image<'a>(Vec<(Cow<'a, str>, Av<'a>)>);

impl<'de: 'a, 'a> Deserialize<'de> for Image<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Image<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of DynamoDB attribute values")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<Image<'a>, M::Error> {
                let mut out = Vec::with_capacity(m.size_hint().unwrap_or(16));
                while let Some(Str(k)) = m.next_key::<Str<'de>>()? {
                    out.push((k, m.next_value::<Av<'de>>()?));
                }
                Ok(Image(out))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

impl Image<'_> {
    /// Whether the image has no attribute (DynamoDB returns `{}` for "no item").
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The item, or [`StoreError::Corrupt`] naming the first attribute that does not decode.
    pub(crate) fn into_item(self) -> Result<Item, StoreError> {
        let mut item = Item::with_capacity(self.0.len());
        for (k, v) in self.0 {
            let v = decode(&k, v)?;
            // From the borrowed text: a short name is stored inline, without a heap copy.
            item.insert(k.as_ref().into(), v);
        }
        Ok(item)
    }
}

/// Decode one value; `attr` names it in a [`StoreError::Corrupt`].
fn decode(attr: &str, av: Av<'_>) -> Result<Value, StoreError> {
    Ok(match av {
        Av::N(n) => Value::N(n.trim().parse::<i64>().map_err(|e| {
            StoreError::Corrupt(format!(
                "attribute {attr}: number {n:?} is not an i64 ({e})"
            ))
        })?),
        Av::S(s) => Value::S(s.into_owned()),
        Av::Bool(b) => Value::Bool(b),
        Av::Null(_) => Value::Null,
        Av::Ss(ss) => Value::Ss(Box::new(ss.into_iter().collect())),
        Av::M(m) => Value::M(Box::new(
            m.0.into_iter()
                .map(|(k, v)| {
                    let v = decode(&format!("{attr}.{k}"), v)?;
                    Ok((k.into_owned(), v))
                })
                .collect::<Result<_, StoreError>>()?,
        )),
        Av::L(l) => Value::L(Box::new(
            l.into_iter()
                .enumerate()
                .map(|(i, v)| decode(&format!("{attr}[{i}]"), v))
                .collect::<Result<_, _>>()?,
        )),
        Av::B(_) | Av::Bs(_) | Av::Ns(_) => {
            let t = match av {
                Av::B(_) => "B",
                Av::Bs(_) => "BS",
                _ => "NS",
            };
            return Err(StoreError::Corrupt(format!(
                "attribute {attr}: unsupported DynamoDB type {t}"
            )));
        }
    })
}

/// A successful response of a single-item operation: `Attributes` (UpdateItem, DeleteItem)
/// or `Item` (GetItem); anything else (consumed capacity …) is skipped.
#[derive(Deserialize)]
pub(crate) struct Output<'a> {
    #[serde(rename = "Attributes", alias = "Item", borrow, default)]
    pub(crate) image: Option<Image<'a>>,
}

/// A failed request's body: `__type` (`namespace#Code`), the message, and for a failed
/// condition the old item (`ReturnValuesOnConditionCheckFailure = ALL_OLD`).
#[derive(Deserialize)]
pub(crate) struct ErrorBody<'a> {
    #[serde(rename = "__type", borrow, default)]
    ty: Option<Str<'a>>,
    #[serde(rename = "message", alias = "Message", borrow, default)]
    message: Option<Str<'a>>,
    #[serde(rename = "Item", borrow, default)]
    pub(crate) item: Option<Image<'a>>,
}

impl<'a> ErrorBody<'a> {
    /// The error code: `__type` after its last `#`.
    pub(crate) fn code(&self) -> Option<&str> {
        self.ty
            .as_ref()
            .map(|t| t.0.rsplit_once('#').map_or(&*t.0, |(_, c)| c))
    }

    /// The message, empty when there is none.
    pub(crate) fn message(&self) -> &str {
        self.message.as_ref().map_or("", |m| &m.0)
    }
}

/// The error code in an `x-amzn-ErrorType` header: `Code`, written `Code:http://…` or
/// `namespace#Code` too.
pub(crate) fn header_code(h: &str) -> &str {
    let h = h.split(':').next().unwrap_or(h);
    h.rsplit_once('#').map_or(h, |(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{item_from_av, item_to_av};
    use crate::render::{write_condition, write_update, Aliases};
    use std::collections::{BTreeMap, BTreeSet};
    use tollgate_core::expr::{Condition, Update};

    fn every_type() -> Item {
        let mut item = Item::new();
        item.insert("n".into(), Value::N(-42));
        item.insert("big".into(), Value::N(i64::MAX));
        item.insert("s".into(), Value::S("x \"quoted\" \\ é \u{1}".into()));
        item.insert("b".into(), Value::Bool(true));
        item.insert(
            "ss".into(),
            Value::Ss(Box::new(BTreeSet::from(["a".to_string(), "b".to_string()]))),
        );
        item.insert(
            "m".into(),
            Value::M(Box::new(BTreeMap::from([
                ("k".to_string(), Value::N(1)),
                ("l".to_string(), Value::L(Box::new(vec![Value::Null]))),
            ]))),
        );
        item.insert(
            "l".into(),
            Value::L(Box::new(vec![Value::N(1), Value::S("y".into())])),
        );
        item.insert("z".into(), Value::Null);
        item
    }

    #[test]
    fn values_round_trip_through_the_json() {
        let item = every_type();
        let key = Key::new("p\"1", "s/1");
        let mut buf = b"{".to_vec();
        push_item(&mut buf, &key, &item).expect("encodes");
        buf.push(b'}');
        #[derive(Deserialize)]
        struct Put<'a> {
            #[serde(rename = "Item", borrow)]
            item: Image<'a>,
        }
        let put: Put<'_> = serde_json::from_slice(&buf).expect("valid JSON");
        let mut back = put.item.into_item().expect("decodes");
        assert_eq!(back.remove(PK), Some(Value::S("p\"1".into())));
        assert_eq!(back.remove(SK), Some(Value::S("s/1".into())));
        assert_eq!(back, item);
        // The SDK's codec agrees on every value.
        assert_eq!(
            item_from_av(&item_to_av(&item).expect("encodes")).expect("decodes"),
            back
        );
    }

    #[test]
    fn aliases_match_the_sdk_renderer() {
        let c = Condition::exists("PK")
            .and(Condition::ge("b_gpt-4.1_tk", 1000))
            .and(Condition::not_exists("b_gpt-4.1_tk"));
        let u = Update::new().add("b_gpt-4.1_tk", -5).set("rf", "x");
        let (mut a, mut c1, mut u1) = (Aliases::new(), String::new(), String::new());
        write_condition(&mut a, &mut c1, &c).expect("renders");
        write_update(&mut a, &mut u1, &u).expect("renders");
        let (mut j, mut c2, mut u2) = (JsonAliases::new(), String::new(), String::new());
        write_condition(&mut j, &mut c2, &c).expect("renders");
        write_update(&mut j, &mut u2, &u).expect("renders");
        assert_eq!((c1, u1), (c2, u2));
        let mut buf = b"{\"x\":1".to_vec();
        j.finish(&mut buf);
        buf.push(b'}');
        let v: serde_json::Value = serde_json::from_slice(&buf).expect("valid JSON");
        let (names, values) = a.into_maps();
        let names = names.expect("names");
        let got_names = v["ExpressionAttributeNames"]
            .as_object()
            .expect("names map");
        assert_eq!(got_names.len(), names.len());
        for (alias, name) in names {
            assert_eq!(got_names[&alias], name.as_str());
        }
        let values = values.expect("values");
        let got = v["ExpressionAttributeValues"]
            .as_object()
            .expect("values map");
        assert_eq!(got.len(), values.len());
        assert_eq!(got[":v0"], serde_json::json!({"N": "1000"}));
        // SET is written before ADD.
        assert_eq!(got[":v1"], serde_json::json!({"S": "x"}));
        assert_eq!(got[":v2"], serde_json::json!({"N": "-5"}));
    }

    #[test]
    fn no_aliases_write_no_maps() {
        let mut buf = Vec::new();
        JsonAliases::new().finish(&mut buf);
        assert!(buf.is_empty());
    }

    /// A value the item model cannot hold names the first such attribute (nested ones by
    /// their path) while the rest of the body is still read; JSON that is not DynamoDB's
    /// typed values (no type, two types, an unknown one) fails to parse, as before.
    #[test]
    fn decoding_failures_name_the_first_attribute_and_malformed_values_do_not_parse() {
        for (body, needle) in [
            (
                r#"{"Item":{"a":{"N":"1.5"},"b":{"B":"AQ=="},"c":{"S":"ok"}}}"#,
                "attribute a: number",
            ),
            (
                r#"{"Item":{"c":{"S":"ok"},"l":{"L":[{"N":"1"},{"NS":["1"]}]},"z":{"N":"x"}}}"#,
                "attribute l[1]: unsupported DynamoDB type NS",
            ),
            (
                r#"{"Item":{"m":{"M":{"k":{"L":[{"N":"9223372036854775808"}]}}}}}"#,
                "attribute m.k[0]: number",
            ),
        ] {
            let out: Output<'_> = serde_json::from_str(body).expect("parses");
            let image = out.image.expect("image");
            assert!(!image.is_empty());
            match image.into_item() {
                Err(StoreError::Corrupt(m)) => assert!(m.contains(needle), "{m}"),
                other => panic!("expected Corrupt, got {other:?}"),
            }
        }
        for body in [
            r#"{"Item":{"a":{}}}"#,
            r#"{"Item":{"a":{"N":"1","S":"x"}}}"#,
            r#"{"Item":{"a":{"X":"1"}}}"#,
            r#"{"Item":{"a":{"N":1}}}"#,
            r#"{"Item":{"a":"1"}}"#,
        ] {
            assert!(serde_json::from_str::<Output<'_>>(body).is_err(), "{body}");
        }
    }

    /// `push_str` writes the bytes `serde_json` writes, for strings copied as they are and
    /// for strings that need escapes.
    #[test]
    fn strings_are_written_as_serde_json_writes_them() {
        for s in [
            "",
            "plain",
            "default/BUCKET#cpu-0#cpu#0",
            "a\"b",
            "back\\slash",
            "\u{1}control",
            "tab\tand\nnewline",
            "\u{1f}",
            " ",
            "\u{7f}",
            "é ü 🦀",
            "/ < > &",
        ] {
            let mut buf = Vec::new();
            push_str(&mut buf, s);
            assert_eq!(
                buf,
                serde_json::to_vec(s).expect("a str serializes"),
                "{s:?}"
            );
        }
    }

    /// The word test and the word search answer as byte-by-byte ones, for every byte
    /// value at every place of strings of 1 to 20 bytes, alone and before a later quote.
    #[test]
    fn the_word_tests_are_the_byte_tests() {
        let plain = |s: &[u8]| s.iter().all(|&b| b >= 0x20 && b != b'"' && b != b'\\');
        let by_byte = |s: &[u8]| s.iter().position(|&c| special(c));
        for len in 1..=20 {
            for at in 0..len {
                for b in 0..=255u8 {
                    let mut s = vec![b'a'; len];
                    s[at] = b;
                    assert_eq!(is_plain(&s), plain(&s), "{s:?}");
                    assert_eq!(first_special(&s), by_byte(&s), "{s:?}");
                    if at + 1 < len {
                        s[at + 1] = b'"';
                        assert_eq!(first_special(&s), by_byte(&s), "{s:?}");
                    }
                }
            }
        }
        assert!(is_plain(b""));
        assert_eq!(first_special(b""), None);
    }

    /// An image's attributes, in whatever order DynamoDB sends them, make the item that
    /// inserting them one by one makes; a name sent twice keeps its last value.
    #[test]
    fn returned_attributes_in_any_order_make_one_item() {
        let body = r#"{"Attributes":{"zz":{"N":"1"},"b_rps_tk":{"N":"2"},"a":{"S":"x"},"b_rps_tc":{"N":"3"},"a":{"S":"y"},"PK":{"S":"p"}}}"#;
        let out: Output<'_> = serde_json::from_str(body).expect("parses");
        let item = out.image.expect("image").into_item().expect("decodes");
        let mut one_by_one = Item::new();
        for (k, v) in [
            ("zz", Value::N(1)),
            ("b_rps_tk", Value::N(2)),
            ("a", Value::S("x".into())),
            ("b_rps_tc", Value::N(3)),
            ("a", Value::S("y".into())),
            ("PK", Value::S("p".into())),
        ] {
            one_by_one.insert(k.into(), v);
        }
        assert_eq!(item, one_by_one);
        assert_eq!(item.get("a"), Some(&Value::S("y".into())));
        let names: Vec<&str> = item.keys().map(|k| &**k).collect();
        let inserted: Vec<&str> = one_by_one.keys().map(|k| &**k).collect();
        assert_eq!(names, inserted);
    }

    #[test]
    fn returned_images_decode_and_bad_ones_name_the_attribute() {
        let body = br#"{"Attributes":{"PK":{"S":"p"},"n":{"N":"7"},"e":{"S":"a\"b"}},"ConsumedCapacity":{"x":1}}"#;
        let out: Output<'_> = serde_json::from_slice(body).expect("parses");
        let item = out.image.expect("image").into_item().expect("decodes");
        assert_eq!(item.get("n"), Some(&Value::N(7)));
        assert_eq!(item.get("e"), Some(&Value::S("a\"b".into())));
        let out: Output<'_> =
            serde_json::from_slice(br#"{"Item":{"a":{"BOOL":false}}}"#).expect("parses");
        assert_eq!(
            out.image
                .expect("image")
                .into_item()
                .expect("decodes")
                .get("a"),
            Some(&Value::Bool(false))
        );
        let out: Output<'_> = serde_json::from_slice(b"{}").expect("parses");
        assert!(out.image.is_none());
        for (body, needle) in [
            (&br#"{"Item":{"m":{"M":{"k":{"N":"1.5"}}}}}"#[..], "m.k"),
            (
                &br#"{"Item":{"b":{"B":"AQ=="}}}"#[..],
                "unsupported DynamoDB type B",
            ),
        ] {
            let out: Output<'_> = serde_json::from_slice(body).expect("parses");
            match out.image.expect("image").into_item() {
                Err(StoreError::Corrupt(m)) => assert!(m.contains(needle), "{m}"),
                other => panic!("expected Corrupt, got {other:?}"),
            }
        }
    }

    #[test]
    fn error_bodies_give_code_message_and_old_item() {
        let body = br#"{"__type":"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException","message":"The conditional request failed","Item":{"n":{"N":"1"}}}"#;
        let e: ErrorBody<'_> = serde_json::from_slice(body).expect("parses");
        assert_eq!(e.code(), Some("ConditionalCheckFailedException"));
        assert_eq!(e.message(), "The conditional request failed");
        assert_eq!(
            e.item.expect("item").into_item().expect("decodes").get("n"),
            Some(&Value::N(1))
        );
        let e: ErrorBody<'_> =
            serde_json::from_slice(br#"{"__type":"ThrottlingException","Message":"slow"}"#)
                .expect("parses");
        assert_eq!(
            (e.code(), e.message()),
            (Some("ThrottlingException"), "slow")
        );
        assert_eq!(
            header_code("ValidationException:http://internal"),
            "ValidationException"
        );
        assert_eq!(
            header_code("aws.dynamodb#ThrottlingException"),
            "ThrottlingException"
        );
    }

    #[test]
    fn an_empty_set_is_refused() {
        let mut buf = Vec::new();
        assert!(matches!(
            push_value(&mut buf, "tags", &Value::Ss(Box::default())),
            Err(StoreError::Validation(_))
        ));
    }
}
