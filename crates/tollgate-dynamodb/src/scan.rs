//! The returned image of a hot-path write read by a scanner, not by serde.
//!
//! A warm acquire's `UpdateItem` returns its bucket item (`ReturnValues = ALL_NEW`): ~30
//! attributes, every one a number, a plain string, a boolean or a null, in DynamoDB's
//! compact typed JSON (`{"Attributes":{"b_rps_tk":{"N":"1000"},"PK":{"S":"…"},…}}`).
//! Read through `serde_json` into [`crate::json`]'s typed values and then into an
//! [`Item`], that body cost ~38 k instructions, a quarter of the client's own work per
//! acquire (callgrind, `benches/client_cpu.rs`); scanned here, a few thousand.
//!
//! The scanner takes only that shape: one `Attributes` or `Item` member, no whitespace,
//! values of type `N` (an `i64`), `S` (no escape), `BOOL` or `NULL` (`true`). On anything
//! else — an escape, a set, a map or list, a number that is not an `i64`, whitespace,
//! another member such as `ConsumedCapacity`, malformed JSON — it answers `None` and the
//! caller reads the body with serde as before, which decides every error. So the scanner
//! never answers differently from serde: it answers less often (tested against it).

use std::sync::{Arc, Mutex, PoisonError};

use tollgate_core::item::Listing;
use tollgate_core::value::{AttrName, Item, Value};

/// Most orders of names remembered ([`Listings`]).
const MAX_LISTINGS: usize = 8;

/// Once the table is full, one miss in this many replaces its oldest order: a source whose
/// order never repeats costs a listing's making only that often.
const RELIST_EVERY: u32 = 64;

/// The orders DynamoDB listed the returned items' names in, remembered so that an item
/// listed the same way again is placed in name order without sorting
/// ([`Item::from_listed`]). DynamoDB lists a map's attributes in an order of its own, the
/// same for the same names: a bucket comes back alike on every write.
#[derive(Debug, Default)]
pub(crate) struct Listings {
    known: Mutex<Known>,
}

#[derive(Debug, Default)]
struct Known {
    orders: Vec<Arc<Listing>>,
    /// The next to replace once full.
    oldest: usize,
    /// Misses since the table was last changed while full.
    misses: u32,
}

impl Listings {
    /// The item of `names[i]` = `values[i]`, as listed: from a remembered order when
    /// `names` are listed as one was, otherwise collected (sorted), its order remembered.
    fn item(&self, names: &[&str], values: Vec<Value>) -> Item {
        let found = {
            let known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
            known.orders.iter().find(|l| l.lists(names)).cloned()
        };
        let values = match found {
            // `lists` checked the count, so the values are one per name.
            Some(l) => match Item::from_listed(&l, values) {
                Ok(item) => return item,
                Err(values) => values,
            },
            None => values,
        };
        let item = names
            .iter()
            .zip(values)
            .map(|(n, v)| (AttrName::from(*n), v))
            .collect();
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        if known.orders.len() < MAX_LISTINGS {
            if let Some(l) = Listing::of(names.iter().copied()) {
                known.orders.push(Arc::new(l));
            }
        } else {
            known.misses += 1;
            if known.misses >= RELIST_EVERY {
                known.misses = 0;
                if let Some(l) = Listing::of(names.iter().copied()) {
                    let at = known.oldest;
                    known.orders[at] = Arc::new(l);
                    known.oldest = (at + 1) % MAX_LISTINGS;
                }
            }
        }
        item
    }
}

/// The image of a successful response's `body`: `Some(Some(item))`, `Some(None)` when it
/// holds none (`{}`, or an empty image), or `None` when the body is not of the shape this
/// module reads (the caller then reads it with serde). `listings` remembers the orders
/// names came in.
pub(crate) fn image(body: &str, listings: &Listings) -> Option<Option<Item>> {
    let mut s = Scan {
        text: body,
        b: body.as_bytes(),
        at: 0,
    };
    s.eat(b"{")?;
    if s.eat(b"}").is_some() {
        return s.end().map(|()| None);
    }
    if s.eat(b"\"Attributes\":").is_none() {
        s.eat(b"\"Item\":")?;
    }
    s.eat(b"{")?;
    let mut names = Vec::with_capacity(32);
    let mut values = Vec::with_capacity(32);
    if s.eat(b"}").is_none() {
        loop {
            names.push(s.string()?);
            s.eat(b":{\"")?;
            values.push(s.value()?);
            s.eat(b"}")?;
            if s.eat(b",").is_none() {
                s.eat(b"}")?;
                break;
            }
        }
    }
    s.eat(b"}")?;
    s.end()?;
    // Placed by a remembered order, or sorted once (a name sent twice keeps its last
    // value, as serde's reading does), not each inserted into its place.
    Some((!names.is_empty()).then(|| listings.item(&names, values)))
}

/// A position in a body.
struct Scan<'a> {
    text: &'a str,
    /// `text`'s bytes.
    b: &'a [u8],
    at: usize,
}

impl<'a> Scan<'a> {
    /// Step over `lit` if the body continues with it.
    #[inline]
    fn eat(&mut self, lit: &[u8]) -> Option<()> {
        let rest = self.b.get(self.at..)?;
        if rest.starts_with(lit) {
            self.at += lit.len();
            Some(())
        } else {
            None
        }
    }

    /// The body ends here.
    fn end(&self) -> Option<()> {
        (self.at == self.b.len()).then_some(())
    }

    /// A string without escapes or control characters (which JSON forbids unescaped),
    /// opening quote included; its text.
    #[inline]
    fn string(&mut self) -> Option<&'a str> {
        self.eat(b"\"")?;
        let start = self.at;
        let rest = self.b.get(start..)?;
        let len = crate::json::first_special(rest)?;
        if rest[len] != b'"' {
            return None;
        }
        self.at = start + len + 1;
        // Both ends are next to an ASCII quote, so on character boundaries of the text.
        self.text.get(start..start + len)
    }

    /// A typed value after its opening `{"`, up to its closing brace (not eaten).
    #[inline]
    fn value(&mut self) -> Option<Value> {
        if self.eat(b"N\":").is_some() {
            // As serde's reading parses it; anything else (a fraction, an exponent, out of
            // range) is left to it, which reports the attribute.
            let n = self.string()?;
            return n.parse::<i64>().ok().map(Value::N);
        }
        if self.eat(b"S\":").is_some() {
            return self.string().map(|t| Value::S(t.to_string()));
        }
        if self.eat(b"BOOL\":").is_some() {
            if self.eat(b"true").is_some() {
                return Some(Value::Bool(true));
            }
            self.eat(b"false")?;
            return Some(Value::Bool(false));
        }
        self.eat(b"NULL\":true")?;
        Some(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::Output;
    use tollgate_core::value::{Key, PK, SK};
    use tollgate_store::StoreError;

    /// What serde's reading of `body` answers (the wire's success path).
    fn by_serde(body: &str) -> Result<Option<Item>, String> {
        let out: Output<'_> = serde_json::from_str(body).map_err(|e| e.to_string())?;
        match out.image {
            Some(i) if !i.is_empty() => i.into_item().map(Some).map_err(|e| match e {
                StoreError::Corrupt(m) => m,
                other => format!("{other:?}"),
            }),
            _ => Ok(None),
        }
    }

    /// The scanner's reading of `body`, twice: the second time from the order of names the
    /// first remembered (placed, not sorted). Both readings agree.
    fn image(body: &str) -> Option<Option<Item>> {
        let known = Listings::default();
        let first = super::image(body, &known);
        let again = super::image(body, &known);
        assert_eq!(first, again, "{body}");
        first
    }

    /// Whenever the scanner answers, serde answers the same.
    fn agrees(body: &str) -> bool {
        match image(body) {
            Some(got) => {
                assert_eq!(Ok(got), by_serde(body), "{body}");
                true
            }
            None => false,
        }
    }

    #[test]
    fn a_bucket_image_is_scanned_as_serde_reads_it() {
        let body = r##"{"Attributes":{"b_rps_tk":{"N":"999000"},"PK":{"S":"default/BUCKET#e#r#0"},"SK":{"S":"#STATE"},"bypass":{"BOOL":false},"disabled":{"BOOL":true},"gone":{"NULL":true},"neg":{"N":"-9223372036854775808"},"max":{"N":"9223372036854775807"},"é":{"S":"ü 🦀"},"empty":{"S":""}}}"##;
        assert!(agrees(body));
        let item = image(body).flatten().expect("an item");
        assert_eq!(item.get("b_rps_tk"), Some(&Value::N(999_000)));
        assert_eq!(item.get("neg"), Some(&Value::N(i64::MIN)));
        assert_eq!(item.get("é"), Some(&Value::S("ü 🦀".into())));
        assert_eq!(item.get("gone"), Some(&Value::Null));
        assert_eq!(item.len(), 10);
        // `Item` as the member's name (GetItem), a repeated name (the last value wins),
        // no image, an empty one.
        assert!(agrees(r#"{"Item":{"a":{"N":"1"},"a":{"N":"2"}}}"#));
        assert_eq!(
            image(r#"{"Item":{"a":{"N":"1"},"a":{"N":"2"}}}"#)
                .flatten()
                .and_then(|i| i.get("a").cloned()),
            Some(Value::N(2))
        );
        assert!(agrees("{}"));
        assert!(agrees(r#"{"Attributes":{}}"#));
        assert_eq!(image("{}"), Some(None));
    }

    /// Every other shape is left to serde, which decides it (and its errors) as before.
    #[test]
    fn other_shapes_are_left_to_serde() {
        for body in [
            r#"{"Attributes":{"s":{"S":"a\"b"}}}"#,
            r#"{"Attributes":{"a\u0041":{"N":"1"}}}"#,
            r#"{"Attributes":{"ss":{"SS":["a"]}}}"#,
            r#"{"Attributes":{"m":{"M":{}}}}"#,
            r#"{"Attributes":{"l":{"L":[]}}}"#,
            r#"{"Attributes":{"n":{"N":"1.5"}}}"#,
            r#"{"Attributes":{"n":{"N":"9223372036854775808"}}}"#,
            r#"{"Attributes":{"n":{"N":" 7"}}}"#,
            r#"{"Attributes":{"b":{"B":"AQ=="}}}"#,
            r#"{"Attributes":{"x":{"NULL":false}}}"#,
            r#"{"Attributes": {"n":{"N":"1"}}}"#,
            r#"{"Attributes":{"n":{"N":"1"}},"ConsumedCapacity":{"CapacityUnits":1}}"#,
            r#"{"Attributes":{"n":{"N":"1"}}} "#,
            r#"{"Attributes":{"n":{"N":"1"}}"#,
            r#"{"Attributes":{"n":{"N":"1"},}}"#,
            r#"{"Attributes":{"n":{"N":"1","S":"x"}}}"#,
            r#"{"Attributes":{"n":{}}}"#,
            r#"{"Other":{}}"#,
            "{\"Attributes\":{\"s\":{\"S\":\"tab\there\"}}}",
            "",
            "{",
            "[]",
        ] {
            assert_eq!(image(body), None, "{body}");
        }
    }

    /// Generated images (names and strings from an alphabet with quotes, backslashes and
    /// control characters, numbers across i64, every scalar type; whitespace and extra
    /// members sometimes): the scanner agrees with serde on every one it reads, and reads
    /// every plain one.
    #[test]
    fn the_scanner_agrees_with_serde_on_generated_images() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || crate::shape::tests::step(&mut x);
        const ALPHABET: &[&str] = &["a", "b", "_", "#", "/", "é", "🦀", " ", "\"", "\\", "\n"];
        let mut read = 0;
        for round in 0..3000 {
            let text = |n: &mut dyn FnMut() -> u64, plain: bool| {
                let len = n() % 12;
                (0..len)
                    .map(|_| {
                        let k = if plain { 8 } else { ALPHABET.len() as u64 };
                        ALPHABET[(n() % k) as usize]
                    })
                    .collect::<String>()
            };
            let plain = round % 3 != 0;
            let mut item = Item::new();
            for _ in 0..(next() % 40) {
                let name = text(&mut next, plain);
                let value = match next() % 6 {
                    0 => Value::N(next() as i64),
                    1 => Value::N((next() % 2000) as i64 - 1000),
                    2 => Value::S(text(&mut next, plain)),
                    3 => Value::Bool(next() % 2 == 0),
                    4 => Value::Null,
                    _ => Value::N(i64::MIN + (next() % 3) as i64),
                };
                item.insert(name.as_str().into(), value);
            }
            let key = Key::new(text(&mut next, plain), text(&mut next, plain));
            let mut buf = b"{".to_vec();
            crate::json::push_item(&mut buf, &key, &item).expect("encodes");
            buf.push(b'}');
            let mut body = String::from_utf8(buf).expect("text");
            body = body.replacen("{\"Item\":", "{\"Attributes\":", 1);
            match next() % 10 {
                0 => body = body.replacen(':', ": ", 1),
                1 => body.insert_str(body.len() - 1, ",\"ConsumedCapacity\":{}"),
                _ => {}
            }
            if agrees(&body) {
                read += 1;
                let got = image(&body).flatten().expect("an item");
                assert_eq!(got.get(PK), Some(&Value::S(key.pk.to_string())));
                assert_eq!(got.get(SK), Some(&Value::S(key.sk.to_string())));
            } else {
                // Only bodies with something to leave to serde are left to it.
                let plain_body = plain && !body.contains(": ") && !body.contains("Consumed");
                assert!(!plain_body, "a plain body was not read: {body}");
            }
        }
        assert!(read > 1500, "the scanner read {read} of 3000");
    }

    /// An order seen is remembered and used: the second item listed alike is placed from
    /// it (the same item as sorting gives), one listed otherwise is sorted and its order
    /// remembered too, a name listed twice is never remembered, and a full table takes a
    /// new order only once in `RELIST_EVERY` misses.
    #[test]
    fn orders_of_names_are_remembered_and_bounded() {
        let known = Listings::default();
        let count = |k: &Listings| k.known.lock().map(|k| k.orders.len()).unwrap_or(0);
        let a = r#"{"Attributes":{"z":{"N":"1"},"PK":{"S":"p"},"b_rps_tk":{"N":"-5"},"a":{"BOOL":true}}}"#;
        let first = super::image(a, &known).flatten().expect("an item");
        assert_eq!(count(&known), 1);
        // The same names in the same order, other values: placed from the order.
        let a2 = a.replace("\"-5\"", "\"7\"");
        let placed = super::image(&a2, &known).flatten().expect("an item");
        assert_eq!(count(&known), 1, "no new order");
        assert_eq!(Ok(Some(placed.clone())), by_serde(&a2));
        assert_eq!(placed.get("b_rps_tk"), Some(&Value::N(7)));
        assert_eq!(
            placed.keys().map(|k| k.as_str()).collect::<Vec<_>>(),
            ["PK", "a", "b_rps_tk", "z"]
        );
        assert_ne!(first, placed);
        // The same names in another order: sorted, and remembered.
        let b = r#"{"Attributes":{"a":{"BOOL":true},"z":{"N":"1"},"PK":{"S":"p"},"b_rps_tk":{"N":"-5"}}}"#;
        assert_eq!(super::image(b, &known).flatten(), Some(first));
        assert_eq!(count(&known), 2);
        // A name listed twice: read (the last value wins), not remembered.
        let twice = r#"{"Item":{"a":{"N":"1"},"a":{"N":"2"}}}"#;
        assert!(agrees(twice));
        let _ = super::image(twice, &known);
        assert_eq!(count(&known), 2);
        // Fill the table, then miss: a new order only once in RELIST_EVERY misses.
        for i in count(&known)..MAX_LISTINGS {
            let _ = super::image(&format!(r#"{{"Item":{{"n{i}":{{"N":"1"}}}}}}"#), &known);
        }
        assert_eq!(count(&known), MAX_LISTINGS);
        let fresh = |i: u32| format!(r#"{{"Item":{{"m{i}":{{"N":"1"}},"x":{{"NULL":true}}}}}}"#);
        let lists = |k: &Listings, i: u32| {
            let name = format!("m{i}");
            k.known
                .lock()
                .map(|k| k.orders.iter().any(|l| l.lists(&[&name, "x"])))
                .unwrap_or(false)
        };
        for i in 0..RELIST_EVERY - 1 {
            let _ = super::image(&fresh(i), &known);
            assert!(!lists(&known, i), "miss {i} takes no order");
        }
        let _ = super::image(&fresh(RELIST_EVERY), &known);
        assert!(
            lists(&known, RELIST_EVERY),
            "the last miss replaces the oldest order"
        );
        assert_eq!(count(&known), MAX_LISTINGS);
    }
}
