//! The stored text of an item: JSON, byte for byte what `serde_json::to_string(&item)`
//! writes (the format every reader decodes with `serde_json`), written without serde's
//! machinery for the values every limiter item is made of.
//!
//! Encoding each written item was the writer thread's largest cost after SQLite itself:
//! about 14,000 instructions for a bucket of one limit through `serde_json` (callgrind,
//! `benches/serve_cost.rs`), most of them spent escaping names and strings that need no
//! escape. Here a string is copied as it is unless it holds a byte JSON escapes (`"`, `\`,
//! a control character), and only such a string, and any value other than a number, a
//! string or a boolean, goes through `serde_json` — so the text is the same either way
//! (`tests` below compare the two on every kind of value).

use tollgate_core::value::{Item, Value};

/// Write `item` as JSON into `out` (appended), exactly as `serde_json::to_string` would.
pub fn write_item(item: &Item, out: &mut String) -> Result<(), serde_json::Error> {
    out.push('{');
    for (i, (name, value)) in item.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_str(name, out)?;
        out.push(':');
        write_value(value, out)?;
    }
    out.push('}');
    Ok(())
}

/// One value: `{"n":…}`, `{"s":…}`, `{"bool":…}` here, anything else by `serde_json`.
pub(crate) fn write_value(value: &Value, out: &mut String) -> Result<(), serde_json::Error> {
    match value {
        Value::N(n) => {
            out.push_str("{\"n\":");
            out.push_str(itoa::Buffer::new().format(*n));
            out.push('}');
        }
        Value::S(s) => {
            out.push_str("{\"s\":");
            write_str(s, out)?;
            out.push('}');
        }
        Value::Bool(b) => out.push_str(if *b {
            "{\"bool\":true}"
        } else {
            "{\"bool\":false}"
        }),
        other => out.push_str(&serde_json::to_string(other)?),
    }
    Ok(())
}

/// A JSON string: copied between quotes when nothing in it needs escaping
/// ([`tollgate_core::json_text::is_plain_json_string`]), else `serde_json`'s.
pub(crate) fn write_str(s: &str, out: &mut String) -> Result<(), serde_json::Error> {
    if !tollgate_core::json_text::is_plain_json_string(s) {
        out.push_str(&serde_json::to_string(s)?);
    } else {
        out.reserve(s.len() + 2);
        out.push('"');
        out.push_str(s);
        out.push('"');
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy;
    use std::collections::{BTreeMap, BTreeSet};

    fn same_as_serde(item: &Item) {
        let mut ours = String::new();
        write_item(item, &mut ours).unwrap();
        assert_eq!(ours, serde_json::to_string(item).unwrap());
        let back: Item = serde_json::from_str(&ours).unwrap();
        assert_eq!(&back, item);
    }

    #[test]
    fn every_kind_of_value_is_written_as_serde_json_writes_it() {
        let strings = [
            "",
            "plain",
            "default/BUCKET#user-1#bench#0",
            "quote \" and backslash \\",
            "tab\tnew line\ncarriage\rform\u{c}back\u{8}bell\u{7}nul\u{0}unit\u{1f}",
            "del \u{7f}, é, ✓, 😀",
        ];
        let mut item = Item::new();
        for (i, s) in strings.iter().enumerate() {
            item.insert(format!("s{i}").into(), Value::S(s.to_string()));
            // Names are escaped the same way.
            item.insert(format!("{s}{i}").into(), Value::N(i as i64));
        }
        for (i, n) in [0, 1, -1, 42, i64::MAX, i64::MIN, 1_796_524_196_588]
            .into_iter()
            .enumerate()
        {
            item.insert(format!("n{i}").into(), Value::N(n));
        }
        item.insert("t".into(), Value::Bool(true));
        item.insert("f".into(), Value::Bool(false));
        item.insert("null".into(), Value::Null);
        let set: BTreeSet<String> = ["a", "b\"", "c\n"].iter().map(|s| s.to_string()).collect();
        item.insert("ss".into(), Value::Ss(set));
        let mut m = BTreeMap::new();
        m.insert("k\"".to_string(), Value::N(1));
        m.insert(
            "l".to_string(),
            Value::L(vec![Value::S("x".into()), Value::Null]),
        );
        item.insert("m".into(), Value::M(m));
        item.insert("l".into(), Value::L(vec![]));
        same_as_serde(&item);
        same_as_serde(&Item::new());
    }

    proptest::proptest! {
        /// Any names, strings, numbers and booleans: the same text as `serde_json`'s.
        #[test]
        fn any_item_is_written_as_serde_json_writes_it(
            attrs in proptest::collection::vec(
                (".{0,12}", proptest::prop_oneof![
                    proptest::num::i64::ANY.prop_map(Value::N),
                    ".{0,20}".prop_map(Value::S),
                    proptest::bool::ANY.prop_map(Value::Bool),
                ]),
                0..24,
            )
        ) {
            let item: Item = attrs.into_iter().map(|(n, v)| (n.into(), v)).collect();
            same_as_serde(&item);
        }
    }
}
