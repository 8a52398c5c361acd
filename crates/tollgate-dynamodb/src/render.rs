//! Rendering typed [`Condition`]s and [`Update`]s into DynamoDB expression strings.
//!
//! Every attribute name becomes an `ExpressionAttributeNames` alias (`#n0`, `#n1`, …; one
//! alias per distinct name), because limit names are embedded in attribute names and may
//! hold `-` and `.` (a bare `.` would be read as a map path). Every literal becomes an
//! `ExpressionAttributeValues` placeholder (`:v0`, `:v1`, …). Nothing from the item model is
//! ever spliced into the expression text.
//!
//! The store renders on every write, so rendering is one pass that appends to a caller's
//! `String` ([`write_condition`], [`write_update`]) with the aliases of the request in
//! [`Aliases`]: two vectors, searched linearly (a request names a dozen attributes), turned
//! into the SDK's maps once, by move ([`Aliases::into_maps`]). [`condition`] and [`update`]
//! return owned strings over the map-based [`Placeholders`], for callers that want those.

use std::collections::HashMap;
use std::fmt::Write as _;

use aws_sdk_dynamodb::types::AttributeValue;
use tollgate_core::expr::{Action, Condition, Operand, SetValue, Update};
use tollgate_core::value::{Value, PK};
use tollgate_store::StoreError;

use crate::codec::to_av;

/// A table of aliases that the renderer writes into: it appends the alias of a name or the
/// placeholder of a literal to the expression text and remembers what it stands for.
pub trait AliasTable {
    /// Append the alias of attribute `name` to `out` (the same name, the same alias).
    fn push_name(&mut self, out: &mut String, name: &str);
    /// Append a fresh placeholder for `v` to `out`; `attr` names it in errors.
    fn push_value(&mut self, out: &mut String, attr: &str, v: &Value) -> Result<(), StoreError>;
}

/// The aliases of one request: name `i` is `#n{i}`, value `i` is `:v{i}`, in the order of
/// first use.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Aliases {
    names: Vec<String>,
    values: Vec<AttributeValue>,
}

impl Aliases {
    /// No aliases yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The attribute names, alias `#n{i}` at index `i`.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The literal values, placeholder `:v{i}` at index `i`.
    pub fn values(&self) -> &[AttributeValue] {
        &self.values
    }

    /// The two maps as the SDK wants them, each `None` when empty (DynamoDB refuses empty
    /// maps).
    #[allow(clippy::type_complexity)]
    pub fn into_maps(
        self,
    ) -> (
        Option<HashMap<String, String>>,
        Option<HashMap<String, AttributeValue>>,
    ) {
        let names = (!self.names.is_empty()).then(|| {
            self.names
                .into_iter()
                .enumerate()
                .map(|(i, n)| (alias_key(&NAME_ALIASES, "#n", i), n))
                .collect()
        });
        let values = (!self.values.is_empty()).then(|| {
            self.values
                .into_iter()
                .enumerate()
                .map(|(i, v)| (alias_key(&VALUE_ALIASES, ":v", i), v))
                .collect()
        });
        (names, values)
    }
}

/// The first name aliases, spelled out: a request's map keys are copied from here instead
/// of formatted (an acquire's write names about a dozen attributes).
const NAME_ALIASES: [&str; 32] = [
    "#n0", "#n1", "#n2", "#n3", "#n4", "#n5", "#n6", "#n7", "#n8", "#n9", "#n10", "#n11", "#n12",
    "#n13", "#n14", "#n15", "#n16", "#n17", "#n18", "#n19", "#n20", "#n21", "#n22", "#n23", "#n24",
    "#n25", "#n26", "#n27", "#n28", "#n29", "#n30", "#n31",
];

/// The first value placeholders, spelled out (see [`NAME_ALIASES`]).
const VALUE_ALIASES: [&str; 32] = [
    ":v0", ":v1", ":v2", ":v3", ":v4", ":v5", ":v6", ":v7", ":v8", ":v9", ":v10", ":v11", ":v12",
    ":v13", ":v14", ":v15", ":v16", ":v17", ":v18", ":v19", ":v20", ":v21", ":v22", ":v23", ":v24",
    ":v25", ":v26", ":v27", ":v28", ":v29", ":v30", ":v31",
];

/// The map key of alias `i`: copied from `table` when it is there, else `prefix` and the
/// decimal `i` (the same text either way).
fn alias_key(table: &[&str], prefix: &str, i: usize) -> String {
    match table.get(i) {
        Some(a) => (*a).to_owned(),
        None => {
            let mut s = String::with_capacity(prefix.len() + 4);
            push_alias(&mut s, prefix, i);
            s
        }
    }
}

/// Append `prefix` and the decimal `i`.
pub(crate) fn push_alias(out: &mut String, prefix: &str, i: usize) {
    out.push_str(prefix);
    if i < 10 {
        // The common case, without the formatting machinery.
        out.push(char::from(b'0' + i as u8));
    } else {
        let _ = write!(out, "{i}");
    }
}

impl AliasTable for Aliases {
    fn push_name(&mut self, out: &mut String, name: &str) {
        let i = match self.names.iter().position(|n| n == name) {
            Some(i) => i,
            None => {
                self.names.push(name.to_owned());
                self.names.len() - 1
            }
        };
        push_alias(out, "#n", i);
    }

    fn push_value(&mut self, out: &mut String, attr: &str, v: &Value) -> Result<(), StoreError> {
        self.values.push(to_av(attr, v)?);
        push_alias(out, ":v", self.values.len() - 1);
        Ok(())
    }
}

/// The alias maps shared by every expression of one request, as maps (see [`Aliases`] for
/// the cheaper table the store uses).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Placeholders {
    /// `#alias` → attribute name.
    pub names: HashMap<String, String>,
    /// `:placeholder` → value.
    pub values: HashMap<String, AttributeValue>,
    by_name: HashMap<String, String>,
}

impl Placeholders {
    /// Empty maps.
    pub fn new() -> Self {
        Self::default()
    }

    /// The alias of an attribute name (the same name always gets the same alias).
    pub fn name(&mut self, name: &str) -> String {
        if let Some(a) = self.by_name.get(name) {
            return a.clone();
        }
        let alias = format!("#n{}", self.by_name.len());
        self.by_name.insert(name.to_string(), alias.clone());
        self.names.insert(alias.clone(), name.to_string());
        alias
    }

    /// A fresh placeholder for a literal; `attr` names it in errors.
    pub fn value(&mut self, attr: &str, v: &Value) -> Result<String, StoreError> {
        let av = to_av(attr, v)?;
        let ph = format!(":v{}", self.values.len());
        self.values.insert(ph.clone(), av);
        Ok(ph)
    }

    /// The name map as the SDK wants it (`None` when empty: DynamoDB refuses empty maps).
    pub fn names_opt(&self) -> Option<HashMap<String, String>> {
        (!self.names.is_empty()).then(|| self.names.clone())
    }

    /// The value map as the SDK wants it (`None` when empty).
    pub fn values_opt(&self) -> Option<HashMap<String, AttributeValue>> {
        (!self.values.is_empty()).then(|| self.values.clone())
    }
}

impl AliasTable for Placeholders {
    fn push_name(&mut self, out: &mut String, name: &str) {
        out.push_str(&self.name(name));
    }

    fn push_value(&mut self, out: &mut String, attr: &str, v: &Value) -> Result<(), StoreError> {
        out.push_str(&self.value(attr, v)?);
        Ok(())
    }
}

/// Render a condition into a new string (see [`write_condition`]).
pub fn condition(p: &mut Placeholders, c: &Condition) -> Result<String, StoreError> {
    let mut out = String::new();
    write_condition(p, &mut out, c)?;
    Ok(out)
}

/// Append a condition to `out`. An empty `And` is always true and an empty `Or` always
/// false; both are written as tautologies on `PK` because DynamoDB has no boolean literals.
pub fn write_condition<A: AliasTable>(
    a: &mut A,
    out: &mut String,
    c: &Condition,
) -> Result<(), StoreError> {
    match c {
        Condition::Exists(n) => {
            out.push_str("attribute_exists(");
            a.push_name(out, n);
            out.push(')');
        }
        Condition::NotExists(n) => {
            out.push_str("attribute_not_exists(");
            a.push_name(out, n);
            out.push(')');
        }
        Condition::Cmp(n, op, rhs) => {
            a.push_name(out, n);
            out.push(' ');
            out.push_str(op.symbol());
            out.push(' ');
            match rhs {
                Operand::Value(v) => a.push_value(out, n, v)?,
                Operand::Attr(x) => a.push_name(out, x),
            }
        }
        Condition::And(cs) => match cs.as_slice() {
            [] => tautology(a, out, " OR "),
            [one] => write_condition(a, out, one)?,
            many => join(a, out, many, " AND ")?,
        },
        Condition::Or(cs) => match cs.as_slice() {
            [] => tautology(a, out, " AND "),
            [one] => write_condition(a, out, one)?,
            many => join(a, out, many, " OR ")?,
        },
        Condition::Not(c) => {
            out.push_str("(NOT ");
            write_condition(a, out, c)?;
            out.push(')');
        }
    }
    Ok(())
}

/// `(attribute_exists(PK) <sep> attribute_not_exists(PK))`: true with `OR`, false with `AND`.
fn tautology<A: AliasTable>(a: &mut A, out: &mut String, sep: &str) {
    out.push_str("(attribute_exists(");
    a.push_name(out, PK);
    out.push(')');
    out.push_str(sep);
    out.push_str("attribute_not_exists(");
    a.push_name(out, PK);
    out.push_str("))");
}

fn join<A: AliasTable>(
    a: &mut A,
    out: &mut String,
    cs: &[Condition],
    sep: &str,
) -> Result<(), StoreError> {
    out.push('(');
    for (i, c) in cs.iter().enumerate() {
        if i > 0 {
            out.push_str(sep);
        }
        write_condition(a, out, c)?;
    }
    out.push(')');
    Ok(())
}

/// Append the right-hand side of a `SET`. DynamoDB allows one `+` or `-` between two
/// operands (a path, a literal or `if_not_exists`), no nesting.
fn set_value<A: AliasTable>(
    a: &mut A,
    out: &mut String,
    target: &str,
    v: &SetValue,
    top: bool,
) -> Result<(), StoreError> {
    match v {
        SetValue::Value(v) => a.push_value(out, target, v)?,
        SetValue::Path(path) => a.push_name(out, path),
        SetValue::IfNotExists(path, d) => {
            out.push_str("if_not_exists(");
            a.push_name(out, path);
            out.push_str(", ");
            a.push_value(out, target, d)?;
            out.push(')');
        }
        SetValue::Plus(l, r) | SetValue::Minus(l, r) => {
            if !top {
                return Err(StoreError::Validation(format!(
                    "SET {target}: DynamoDB allows one + or - per value, not nested arithmetic"
                )));
            }
            set_value(a, out, target, l, false)?;
            out.push_str(if matches!(v, SetValue::Plus(..)) {
                " + "
            } else {
                " - "
            });
            set_value(a, out, target, r, false)?;
        }
    }
    Ok(())
}

/// Render an update expression into a new string (see [`write_update`]); `None` for an
/// empty update.
pub fn update(p: &mut Placeholders, u: &Update) -> Result<Option<String>, StoreError> {
    let mut out = String::new();
    Ok(write_update(p, &mut out, u)?.then_some(out))
}

/// Append an update expression to `out`: `SET … ADD … REMOVE …`, each clause once, actions
/// in request order within a clause, aliases numbered in that order. Returns whether
/// anything was written (an empty update writes nothing).
pub fn write_update<A: AliasTable>(
    a: &mut A,
    out: &mut String,
    u: &Update,
) -> Result<bool, StoreError> {
    let start = out.len();
    // One pass per clause, straight into `out`.
    let mut first = true;
    for act in &u.actions {
        if let Action::Set(n, v) = act {
            out.push_str(if first { "SET " } else { ", " });
            first = false;
            a.push_name(out, n);
            out.push_str(" = ");
            set_value(a, out, n, v, true)?;
        }
    }
    let mut first = true;
    for act in &u.actions {
        if let Action::Add(n, v) = act {
            if !matches!(v, Value::N(_) | Value::Ss(_)) {
                return Err(StoreError::Validation(format!(
                    "ADD takes a number or a set, not {} (attribute {n})",
                    v.type_name()
                )));
            }
            out.push_str(match (first, out.len() == start) {
                (false, _) => ", ",
                (true, true) => "ADD ",
                (true, false) => " ADD ",
            });
            first = false;
            a.push_name(out, n);
            out.push(' ');
            a.push_value(out, n, v)?;
        }
    }
    let mut first = true;
    for act in &u.actions {
        if let Action::Remove(n) = act {
            out.push_str(match (first, out.len() == start) {
                (false, _) => ", ",
                (true, true) => "REMOVE ",
                (true, false) => " REMOVE ",
            });
            first = false;
            a.push_name(out, n);
        }
    }
    Ok(out.len() > start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::expr::CmpOp;

    fn render_condition(c: &Condition) -> (String, Aliases) {
        let (mut a, mut s) = (Aliases::new(), String::new());
        write_condition(&mut a, &mut s, c).expect("renders");
        (s, a)
    }

    #[test]
    fn names_with_dash_and_dot_are_aliased() {
        let c = Condition::exists("PK").and(Condition::ge("b_gpt-4.1_tk", 1000));
        let (s, a) = render_condition(&c);
        assert_eq!(s, "(attribute_exists(#n0) AND #n1 >= :v0)");
        assert_eq!(a.names(), ["PK", "b_gpt-4.1_tk"]);
        assert_eq!(a.values(), [AttributeValue::N("1000".into())]);
        assert!(!s.contains('-') && !s.contains('.'));
        let (names, values) = a.into_maps();
        let (names, values) = (names.expect("names"), values.expect("values"));
        assert_eq!(names["#n1"], "b_gpt-4.1_tk");
        assert_eq!(values[":v0"], AttributeValue::N("1000".into()));
    }

    #[test]
    fn the_same_name_gets_one_alias() {
        let c = Condition::cmp("rf", CmpOp::Eq, 5).or(Condition::not_exists("rf"));
        let (s, a) = render_condition(&c);
        assert_eq!(s, "(#n0 = :v0 OR attribute_not_exists(#n0))");
        assert_eq!(a.names().len(), 1);
    }

    #[test]
    fn aliases_past_ten_and_the_map_table_agree() {
        // Twelve names: aliases #n10 and #n11 take the formatting path.
        let c = Condition::And((0..12).map(|i| Condition::ge(format!("a{i}"), i)).collect());
        let (s, a) = render_condition(&c);
        assert!(s.ends_with("#n10 >= :v10 AND #n11 >= :v11)"), "{s}");
        let mut p = Placeholders::new();
        assert_eq!(condition(&mut p, &c).expect("renders"), s);
        let (names, values) = a.into_maps();
        assert_eq!(names, p.names_opt());
        assert_eq!(values, p.values_opt());
    }

    #[test]
    fn spelled_out_alias_keys_match_the_rendered_ones() {
        for i in 0..40 {
            let (mut n, mut v) = (String::new(), String::new());
            push_alias(&mut n, "#n", i);
            push_alias(&mut v, ":v", i);
            assert_eq!(alias_key(&NAME_ALIASES, "#n", i), n);
            assert_eq!(alias_key(&VALUE_ALIASES, ":v", i), v);
        }
    }

    #[test]
    fn attribute_operand_and_not() {
        let c = Condition::Not(Box::new(Condition::Cmp(
            "a.b".into(),
            CmpOp::Lt,
            Operand::Attr("c-d".into()),
        )));
        let (s, a) = render_condition(&c);
        assert_eq!(s, "(NOT #n0 < #n1)");
        assert_eq!(a.names(), ["a.b", "c-d"]);
    }

    #[test]
    fn empty_and_or_are_tautologies() {
        let (s, a) = render_condition(&Condition::And(vec![]));
        assert_eq!(s, "(attribute_exists(#n0) OR attribute_not_exists(#n0))");
        assert_eq!(a.names(), ["PK"]);
        let (s, _) = render_condition(&Condition::Or(vec![]));
        assert_eq!(s, "(attribute_exists(#n0) AND attribute_not_exists(#n0))");
    }

    #[test]
    fn update_groups_clauses() {
        let u = Update::new()
            .add("b_rpm-1.x_tk", -500)
            .set("rf", 17)
            .remove("old.attr")
            .set_expr(
                "b_tpm_tc",
                SetValue::Plus(
                    Box::new(SetValue::IfNotExists("b_tpm_tc".into(), Value::N(0))),
                    Box::new(SetValue::Value(Value::N(3))),
                ),
            )
            .set_expr("copy", SetValue::Path("b_rpm-1.x_tk".into()))
            .add("tags", 0);
        let (mut a, mut s) = (Aliases::new(), String::new());
        assert!(write_update(&mut a, &mut s, &u).expect("renders"));
        assert_eq!(
            s,
            "SET #n0 = :v0, #n1 = if_not_exists(#n1, :v1) + :v2, #n2 = #n3 \
             ADD #n3 :v3, #n4 :v4 REMOVE #n5"
        );
        assert_eq!(
            a.names(),
            ["rf", "b_tpm_tc", "copy", "b_rpm-1.x_tk", "tags", "old.attr"]
        );
        assert_eq!(a.values()[3], AttributeValue::N("-500".into()));
        assert!(!s.contains('.') && !s.contains('-'));
        // The map-based table renders the same text.
        let mut p = Placeholders::new();
        assert_eq!(update(&mut p, &u).expect("renders"), Some(s));
        assert_eq!(p.names["#n5"], "old.attr");
    }

    #[test]
    fn clauses_without_set_start_cleanly() {
        let (mut a, mut s) = (Aliases::new(), String::new());
        let u = Update::new().remove("x").add("n", 1);
        assert!(write_update(&mut a, &mut s, &u).expect("renders"));
        assert_eq!(s, "ADD #n0 :v0 REMOVE #n1");
        let (mut a, mut s) = (Aliases::new(), String::new());
        assert!(write_update(&mut a, &mut s, &Update::new().remove("x")).expect("renders"));
        assert_eq!(s, "REMOVE #n0");
    }

    #[test]
    fn update_after_a_condition_shares_the_aliases() {
        let (mut a, mut c, mut u) = (Aliases::new(), String::new(), String::new());
        write_condition(&mut a, &mut c, &Condition::ge("n", 1)).expect("renders");
        write_update(&mut a, &mut u, &Update::new().add("n", -1)).expect("renders");
        assert_eq!((c.as_str(), u.as_str()), ("#n0 >= :v0", "ADD #n0 :v1"));
    }

    #[test]
    fn empty_update_renders_nothing() {
        let mut p = Placeholders::new();
        assert_eq!(update(&mut p, &Update::new()).expect("renders"), None);
        assert!(p.names_opt().is_none() && p.values_opt().is_none());
        let (mut a, mut s) = (Aliases::new(), String::new());
        assert!(!write_update(&mut a, &mut s, &Update::new()).expect("renders"));
        assert_eq!(a.into_maps(), (None, None));
    }

    #[test]
    fn nested_arithmetic_is_refused() {
        let mut p = Placeholders::new();
        let v = SetValue::Plus(
            Box::new(SetValue::Minus(
                Box::new(SetValue::Path("a".into())),
                Box::new(SetValue::Value(Value::N(1))),
            )),
            Box::new(SetValue::Value(Value::N(2))),
        );
        assert!(matches!(
            update(&mut p, &Update::new().set_expr("a", v)),
            Err(StoreError::Validation(_))
        ));
    }

    #[test]
    fn add_of_a_string_is_refused() {
        let mut p = Placeholders::new();
        let u = Update {
            actions: vec![Action::Add("s".into(), Value::S("x".into()))],
        };
        assert!(matches!(update(&mut p, &u), Err(StoreError::Validation(_))));
    }
}
