//! Rendering typed [`Condition`]s and [`Update`]s into DynamoDB expression strings.
//!
//! Every attribute name becomes an `ExpressionAttributeNames` alias (`#n0`, `#n1`, …; one
//! alias per distinct name), because limit names are embedded in attribute names and may
//! hold `-` and `.` (a bare `.` would be read as a map path). Every literal becomes an
//! `ExpressionAttributeValues` placeholder (`:v0`, `:v1`, …). Nothing from the item model is
//! ever spliced into the expression text.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use tollgate_core::expr::{Action, Condition, Operand, SetValue, Update};
use tollgate_core::value::{Value, PK};
use tollgate_store::StoreError;

use crate::codec::to_av;

/// The alias maps shared by every expression of one request.
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

/// Render a condition. An empty `And` is always true and an empty `Or` always false; both
/// are written as tautologies on `PK` because DynamoDB has no boolean literals.
pub fn condition(p: &mut Placeholders, c: &Condition) -> Result<String, StoreError> {
    Ok(match c {
        Condition::Exists(n) => format!("attribute_exists({})", p.name(n)),
        Condition::NotExists(n) => format!("attribute_not_exists({})", p.name(n)),
        Condition::Cmp(n, op, rhs) => {
            let l = p.name(n);
            let r = match rhs {
                Operand::Value(v) => p.value(n, v)?,
                Operand::Attr(a) => p.name(a),
            };
            format!("{l} {} {r}", op.symbol())
        }
        Condition::And(cs) => match cs.as_slice() {
            [] => {
                let k = p.name(PK);
                format!("(attribute_exists({k}) OR attribute_not_exists({k}))")
            }
            [one] => condition(p, one)?,
            many => join(p, many, " AND ")?,
        },
        Condition::Or(cs) => match cs.as_slice() {
            [] => {
                let k = p.name(PK);
                format!("(attribute_exists({k}) AND attribute_not_exists({k}))")
            }
            [one] => condition(p, one)?,
            many => join(p, many, " OR ")?,
        },
        Condition::Not(c) => format!("(NOT {})", condition(p, c)?),
    })
}

fn join(p: &mut Placeholders, cs: &[Condition], sep: &str) -> Result<String, StoreError> {
    let parts = cs
        .iter()
        .map(|c| condition(p, c))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(format!("({})", parts.join(sep)))
}

/// Render the right-hand side of a `SET`. DynamoDB allows one `+` or `-` between two
/// operands (a path, a literal or `if_not_exists`), no nesting.
fn set_value(
    p: &mut Placeholders,
    target: &str,
    v: &SetValue,
    top: bool,
) -> Result<String, StoreError> {
    Ok(match v {
        SetValue::Value(v) => p.value(target, v)?,
        SetValue::Path(path) => p.name(path),
        SetValue::IfNotExists(path, d) => {
            let n = p.name(path);
            let d = p.value(target, d)?;
            format!("if_not_exists({n}, {d})")
        }
        SetValue::Plus(a, b) | SetValue::Minus(a, b) => {
            if !top {
                return Err(StoreError::Validation(format!(
                    "SET {target}: DynamoDB allows one + or - per value, not nested arithmetic"
                )));
            }
            let op = if matches!(v, SetValue::Plus(..)) {
                "+"
            } else {
                "-"
            };
            let a = set_value(p, target, a, false)?;
            let b = set_value(p, target, b, false)?;
            format!("{a} {op} {b}")
        }
    })
}

/// Render an update expression: `SET … ADD … REMOVE …`, each clause once, actions in
/// request order within a clause. `None` for an empty update.
pub fn update(p: &mut Placeholders, u: &Update) -> Result<Option<String>, StoreError> {
    let (mut set, mut add, mut remove) = (Vec::new(), Vec::new(), Vec::new());
    for a in &u.actions {
        match a {
            Action::Set(n, v) => {
                let l = p.name(n);
                let r = set_value(p, n, v, true)?;
                set.push(format!("{l} = {r}"));
            }
            Action::Add(n, v) => {
                if !matches!(v, Value::N(_) | Value::Ss(_)) {
                    return Err(StoreError::Validation(format!(
                        "ADD takes a number or a set, not {} (attribute {n})",
                        v.type_name()
                    )));
                }
                let l = p.name(n);
                let r = p.value(n, v)?;
                add.push(format!("{l} {r}"));
            }
            Action::Remove(n) => remove.push(p.name(n)),
        }
    }
    let mut clauses = Vec::new();
    if !set.is_empty() {
        clauses.push(format!("SET {}", set.join(", ")));
    }
    if !add.is_empty() {
        clauses.push(format!("ADD {}", add.join(", ")));
    }
    if !remove.is_empty() {
        clauses.push(format!("REMOVE {}", remove.join(", ")));
    }
    Ok((!clauses.is_empty()).then(|| clauses.join(" ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::expr::CmpOp;

    #[test]
    fn names_with_dash_and_dot_are_aliased() {
        let mut p = Placeholders::new();
        let c = Condition::exists("PK").and(Condition::ge("b_gpt-4.1_tk", 1000));
        let s = condition(&mut p, &c).expect("renders");
        assert_eq!(s, "(attribute_exists(#n0) AND #n1 >= :v0)");
        assert_eq!(p.names["#n1"], "b_gpt-4.1_tk");
        assert_eq!(p.values[":v0"], AttributeValue::N("1000".into()));
        assert!(!s.contains('-') && !s.contains('.'));
    }

    #[test]
    fn the_same_name_gets_one_alias() {
        let mut p = Placeholders::new();
        let c = Condition::cmp("rf", CmpOp::Eq, 5).or(Condition::not_exists("rf"));
        let s = condition(&mut p, &c).expect("renders");
        assert_eq!(s, "(#n0 = :v0 OR attribute_not_exists(#n0))");
        assert_eq!(p.names.len(), 1);
    }

    #[test]
    fn attribute_operand_and_not() {
        let mut p = Placeholders::new();
        let c = Condition::Not(Box::new(Condition::Cmp(
            "a.b".into(),
            CmpOp::Lt,
            Operand::Attr("c-d".into()),
        )));
        assert_eq!(condition(&mut p, &c).expect("renders"), "(NOT #n0 < #n1)");
        assert_eq!(p.names["#n0"], "a.b");
        assert_eq!(p.names["#n1"], "c-d");
    }

    #[test]
    fn empty_and_or_are_tautologies() {
        let mut p = Placeholders::new();
        assert_eq!(
            condition(&mut p, &Condition::And(vec![])).expect("renders"),
            "(attribute_exists(#n0) OR attribute_not_exists(#n0))"
        );
        assert_eq!(
            condition(&mut p, &Condition::Or(vec![])).expect("renders"),
            "(attribute_exists(#n0) AND attribute_not_exists(#n0))"
        );
        assert_eq!(p.names["#n0"], "PK");
    }

    #[test]
    fn update_groups_clauses() {
        let mut p = Placeholders::new();
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
        let s = update(&mut p, &u).expect("renders").expect("non-empty");
        assert_eq!(
            s,
            "SET #n1 = :v1, #n3 = if_not_exists(#n3, :v2) + :v3, #n4 = #n0 \
             ADD #n0 :v0, #n5 :v4 REMOVE #n2"
        );
        assert_eq!(p.names["#n0"], "b_rpm-1.x_tk");
        assert_eq!(p.names["#n2"], "old.attr");
        assert_eq!(p.values[":v0"], AttributeValue::N("-500".into()));
        assert!(!s.contains('.') && !s.contains('-'));
    }

    #[test]
    fn empty_update_renders_nothing() {
        let mut p = Placeholders::new();
        assert_eq!(update(&mut p, &Update::new()).expect("renders"), None);
        assert!(p.names_opt().is_none() && p.values_opt().is_none());
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
