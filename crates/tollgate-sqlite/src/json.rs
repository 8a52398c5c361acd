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
    write_item_laid_out(item, out, &mut Layout::default())
}

/// Where each attribute lies in an item's text, in the item's order: the byte offsets of
/// its name's opening quote, of its value, and just past its value. Known for a text this
/// module wrote ([`write_item_laid_out`], [`rewrite`]); empty when unknown (a text read
/// back from the file, or one longer than `u32` offsets reach).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layout(Vec<[u32; 3]>);

impl Layout {
    /// The spans of the attributes (empty: unknown).
    fn spans(&self) -> &[[u32; 3]] {
        &self.0
    }

    /// Whether it lays out every attribute of `item`'s text.
    pub fn covers(&self, item: &Item) -> bool {
        !self.0.is_empty() && self.0.len() == item.len()
    }

    fn push(&mut self, at: [usize; 3]) {
        match at.map(u32::try_from) {
            [Ok(a), Ok(b), Ok(c)] => self.0.push([a, b, c]),
            // Past 4 GiB (no item is): unknown from here on.
            _ => self.0.clear(),
        }
    }
}

/// [`write_item`] into `out`, which must be empty, setting `layout` to where each attribute
/// was written.
pub fn write_item_laid_out(
    item: &Item,
    out: &mut String,
    layout: &mut Layout,
) -> Result<(), serde_json::Error> {
    layout.0.clear();
    layout.0.reserve(item.len());
    let base = out.len();
    out.push('{');
    for (i, (name, value)) in item.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let name_at = out.len() - base;
        write_str(name, out)?;
        out.push(':');
        let value_at = out.len() - base;
        write_value(value, out)?;
        layout.push([name_at, value_at, out.len() - base]);
    }
    out.push('}');
    if layout.0.len() != item.len() {
        layout.0.clear();
    }
    Ok(())
}

/// The text of `new` and the difference that turns it back into `old` (`diff.rs`'s format),
/// written from `old`'s text instead of from scratch: every attribute whose value is the
/// same in both is copied from `old_text` as it stands (name, quotes and value in one run of
/// bytes with its unchanged neighbours), and only the changed values are encoded. A limiter
/// write changes about 7 of a bucket's ~30 attributes, so this writes a few numbers where
/// [`write_item`] escapes every name and formats every value, and the difference's members
/// (`"name":old value`) are copied from `old_text` too.
///
/// Only for two items with the same names in the same order ([`Item::same_names`]) and a
/// text of `old` laid out by its layout ([`Layout::covers`]). The bytes are exactly
/// [`write_item`]'s and [`crate::diff::write_diff`]'s (debug builds check every call;
/// `tests` below draw pairs). It also tells whether an attribute whose name `watched`
/// picks changed its value.
pub fn rewrite(
    old: LaidOut<'_>,
    new: &Item,
    watched: impl Fn(&str) -> bool,
) -> Result<Rewritten, serde_json::Error> {
    debug_assert!(old.item.same_names(new), "the same names");
    debug_assert!(
        old.layout.covers(old.item),
        "a laid-out text of the old item"
    );
    let old_text = old.text;
    // One allocation each: the new text is about the old one's length, and a limiter
    // write's difference (its ~7 changed members) about a hundred bytes.
    let mut out = String::with_capacity(old_text.len() + 16);
    let mut diff = String::with_capacity(256);
    let mut layout = Layout(Vec::with_capacity(new.len()));
    diff.push('{');
    // The next byte of `old_text` not yet copied, and how far the new text's bytes from
    // there on stand from the old text's (the sum of the changed values' growth).
    let mut copied = 0usize;
    let mut shift = 0isize;
    let at = |o: u32, shift: isize| (o as usize).wrapping_add_signed(shift);
    let mut watched_changed = false;
    let pairs = old.item.iter().zip(new.iter());
    for (span, ((n, a), (_, b))) in old.layout.spans().iter().zip(pairs) {
        let [name, value, end] = *span;
        if a == b {
            layout.push([at(name, shift), at(value, shift), at(end, shift)]);
            continue;
        }
        watched_changed |= watched(n.as_str());
        let (name, value, end) = (name as usize, value as usize, end as usize);
        out.push_str(&old_text[copied..value]);
        let new_value = out.len();
        write_value(b, &mut out)?;
        layout.push([name.wrapping_add_signed(shift), new_value, out.len()]);
        shift = out.len() as isize - end as isize;
        copied = end;
        if diff.len() > 1 {
            diff.push(',');
        }
        diff.push_str(&old_text[name..end]);
    }
    out.push_str(&old_text[copied..]);
    diff.push('}');
    if layout.0.len() != new.len() {
        layout.0.clear();
    }
    debug_assert_eq!(
        out.as_str(),
        {
            let mut whole = String::new();
            write_item(new, &mut whole)
                .map(|()| whole)
                .unwrap_or_default()
        },
        "a rewritten text is the item's text"
    );
    debug_assert_eq!(
        diff.as_str(),
        {
            let mut d = String::new();
            crate::diff::write_diff(old.item, new, &mut d)
                .map(|()| d)
                .unwrap_or_default()
        },
        "a rewritten difference is the difference"
    );
    Ok(Rewritten {
        text: out,
        layout,
        diff,
        watched_changed,
    })
}

/// An item's text as this module wrote it, with its layout.
#[derive(Debug, Clone, Copy)]
pub struct LaidOut<'a> {
    /// The text.
    pub text: &'a str,
    /// Where its attributes lie.
    pub layout: &'a Layout,
    /// The item it is the text of.
    pub item: &'a Item,
}

/// What [`rewrite`] wrote.
#[derive(Debug)]
pub struct Rewritten {
    /// The new item's text.
    pub text: String,
    /// Where its attributes lie.
    pub layout: Layout,
    /// The difference that turns the new item back into the old (`diff.rs`).
    pub diff: String,
    /// Whether an attribute `watched` picks changed its value.
    pub watched_changed: bool,
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
        item.insert("ss".into(), Value::Ss(Box::new(set)));
        let mut m = BTreeMap::new();
        m.insert("k\"".to_string(), Value::N(1));
        m.insert(
            "l".to_string(),
            Value::L(Box::new(vec![Value::S("x".into()), Value::Null])),
        );
        item.insert("m".into(), Value::M(Box::new(m)));
        item.insert("l".into(), Value::L(Box::default()));
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

        /// An item rewritten from another's laid-out text — the same names, any values
        /// changed, to longer or shorter or escaped texts — is the text `write_item` writes,
        /// its layout the one `write_item_laid_out` records, and its difference the one
        /// `diff::write_diff` writes; and it can be rewritten again from there.
        #[test]
        fn a_rewritten_item_is_the_item_written_whole(
            attrs in proptest::collection::vec(
                (".{0,12}", value(), proptest::option::of(value()), proptest::option::of(value())),
                0..24,
            )
        ) {
            let first: Item = attrs.iter().map(|(n, v, _, _)| (n.as_str().into(), v.clone())).collect();
            // The same names (an attribute drawn twice is held once, with its last value).
            let then = |pick: fn(&Drawn) -> Option<&Value>| {
                let mut next = first.clone();
                for a in &attrs {
                    if let Some(v) = pick(a) {
                        next.insert(a.0.as_str().into(), v.clone());
                    }
                }
                next
            };
            let second = then(|a| a.2.as_ref());
            let third = then(|a| a.3.as_ref());
            let (mut text, mut layout) = (String::new(), Layout::default());
            write_item_laid_out(&first, &mut text, &mut layout).unwrap();
            proptest::prop_assert!(layout.covers(&first) || first.is_empty());
            let mut prev = (first, text, layout);
            for next in [second, third] {
                proptest::prop_assert!(prev.0.same_names(&next));
                let (mut out, mut out_layout) = (String::new(), Layout::default());
                if prev.2.covers(&prev.0) {
                    let watched = |n: &str| n.starts_with('a');
                    let old = LaidOut { text: &prev.1, layout: &prev.2, item: &prev.0 };
                    let r = rewrite(old, &next, watched).unwrap();
                    proptest::prop_assert_eq!(
                        r.watched_changed,
                        prev.0.iter().zip(next.iter()).any(|((n, a), (_, b))| watched(n.as_str()) && a != b)
                    );
                    let diff = r.diff;
                    (out, out_layout) = (r.text, r.layout);
                    let (mut whole, mut whole_layout) = (String::new(), Layout::default());
                    write_item_laid_out(&next, &mut whole, &mut whole_layout).unwrap();
                    proptest::prop_assert_eq!(&out, &whole);
                    proptest::prop_assert_eq!(&out_layout, &whole_layout);
                    let mut d = String::new();
                    crate::diff::write_diff(&prev.0, &next, &mut d).unwrap();
                    proptest::prop_assert_eq!(&diff, &d);
                    proptest::prop_assert_eq!(crate::diff::apply(&next, &diff).unwrap(), prev.0.clone());
                } else {
                    write_item_laid_out(&next, &mut out, &mut out_layout).unwrap();
                }
                prev = (next, out, out_layout);
            }
        }
    }

    /// A drawn attribute: its name, its first value, and its values in two later versions
    /// (`None`: unchanged).
    type Drawn = (String, Value, Option<Value>, Option<Value>);

    fn value() -> impl proptest::strategy::Strategy<Value = Value> {
        proptest::prop_oneof![
            proptest::num::i64::ANY.prop_map(Value::N),
            (0i64..1000).prop_map(Value::N),
            ".{0,20}".prop_map(Value::S),
            "[a-z\"\\\n]{0,6}".prop_map(Value::S),
            proptest::bool::ANY.prop_map(Value::Bool),
            proptest::strategy::Just(Value::Null),
        ]
    }
}
