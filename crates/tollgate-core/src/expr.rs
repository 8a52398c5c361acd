//! Typed writes: conditions and update actions, as data (the store contract).
//!
//! Every backend evaluates these with DynamoDB's semantics: a condition reads the item as it
//! is before the write; a comparison with a missing attribute or a value of another type is
//! false; `ADD` on a missing number starts from 0; every right-hand side reads the old item.

use serde::{Deserialize, Serialize};

pub use crate::name::Name;
use crate::value::{Item, Value};

/// Comparison operators of a condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CmpOp {
    /// `=`
    Eq,
    /// `<>`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

impl CmpOp {
    /// Every operator, in declaration order (for checks that try each one).
    pub const ALL: [CmpOp; 6] = [
        CmpOp::Eq,
        CmpOp::Ne,
        CmpOp::Lt,
        CmpOp::Le,
        CmpOp::Gt,
        CmpOp::Ge,
    ];

    /// The operator as DynamoDB writes it.
    pub fn symbol(self) -> &'static str {
        match self {
            CmpOp::Eq => "=",
            CmpOp::Ne => "<>",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }
}

/// The right-hand side of a comparison.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Operand {
    /// A literal value.
    Value(Value),
    /// Another attribute of the same item.
    Attr(Name),
}

/// A condition on the item as it is before the write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Condition {
    /// `attribute_exists(name)`
    Exists(Name),
    /// `attribute_not_exists(name)`
    NotExists(Name),
    /// `name OP operand`
    Cmp(Name, CmpOp, Operand),
    /// All must hold (an empty `And` holds).
    And(Vec<Condition>),
    /// One must hold (an empty `Or` does not hold).
    Or(Vec<Condition>),
    /// Negation.
    Not(Box<Condition>),
}

impl Condition {
    /// `attribute_exists(name)`
    pub fn exists(name: impl Into<Name>) -> Self {
        Condition::Exists(name.into())
    }
    /// `attribute_not_exists(name)`
    pub fn not_exists(name: impl Into<Name>) -> Self {
        Condition::NotExists(name.into())
    }
    /// `name OP value`
    pub fn cmp(name: impl Into<Name>, op: CmpOp, v: impl Into<Value>) -> Self {
        Condition::Cmp(name.into(), op, Operand::Value(v.into()))
    }
    /// `name = value`
    pub fn eq(name: impl Into<Name>, v: impl Into<Value>) -> Self {
        Self::cmp(name, CmpOp::Eq, v)
    }
    /// `name >= value`
    pub fn ge(name: impl Into<Name>, v: impl Into<Value>) -> Self {
        Self::cmp(name, CmpOp::Ge, v)
    }
    /// `name > value`
    pub fn gt(name: impl Into<Name>, v: impl Into<Value>) -> Self {
        Self::cmp(name, CmpOp::Gt, v)
    }
    /// `name < value`
    pub fn lt(name: impl Into<Name>, v: impl Into<Value>) -> Self {
        Self::cmp(name, CmpOp::Lt, v)
    }
    /// `name <= value`
    pub fn le(name: impl Into<Name>, v: impl Into<Value>) -> Self {
        Self::cmp(name, CmpOp::Le, v)
    }
    /// Conjunction of two conditions, flattening nested `And`s.
    pub fn and(self, other: Condition) -> Self {
        match (self, other) {
            (Condition::And(mut a), Condition::And(b)) => {
                a.extend(b);
                Condition::And(a)
            }
            (Condition::And(mut a), c) => {
                a.push(c);
                Condition::And(a)
            }
            (c, Condition::And(mut b)) => {
                b.insert(0, c);
                Condition::And(b)
            }
            (a, b) => Condition::And(vec![a, b]),
        }
    }
    /// The conjunction of `parts`, in order, nested `And`s flattened: what folding them
    /// with [`Condition::and`] gives, built in one allocation (a single part is itself).
    pub fn all(parts: Vec<Condition>) -> Self {
        if parts.len() == 1 {
            if let Some(c) = parts.into_iter().next() {
                return c;
            }
            return Condition::And(Vec::new());
        }
        let n = parts
            .iter()
            .map(|c| match c {
                Condition::And(v) => v.len(),
                _ => 1,
            })
            .sum();
        let mut out = Vec::with_capacity(n);
        for c in parts {
            match c {
                Condition::And(v) => out.extend(v),
                c => out.push(c),
            }
        }
        Condition::And(out)
    }
    /// Disjunction.
    pub fn or(self, other: Condition) -> Self {
        Condition::Or(vec![self, other])
    }
    /// Every attribute name the condition mentions (for alias rendering).
    pub fn names(&self, out: &mut Vec<String>) {
        match self {
            Condition::Exists(n) | Condition::NotExists(n) => out.push(n.to_string()),
            Condition::Cmp(n, _, o) => {
                out.push(n.to_string());
                if let Operand::Attr(a) = o {
                    out.push(a.to_string());
                }
            }
            Condition::And(cs) | Condition::Or(cs) => cs.iter().for_each(|c| c.names(out)),
            Condition::Not(c) => c.names(out),
        }
    }
}

/// The value side of a `SET` action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetValue {
    /// A literal.
    Value(Value),
    /// The old value of another attribute (must exist).
    Path(Name),
    /// `if_not_exists(path, default)`
    IfNotExists(Name, Value),
    /// `a + b` (numbers).
    Plus(Box<SetValue>, Box<SetValue>),
    /// `a - b` (numbers).
    Minus(Box<SetValue>, Box<SetValue>),
}

/// One update action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    /// `SET name = value`
    Set(Name, SetValue),
    /// `ADD name value` (numbers add, starting from 0; string sets union).
    Add(Name, Value),
    /// `REMOVE name`
    Remove(Name),
}

impl Action {
    /// The attribute the action writes.
    pub fn target(&self) -> &str {
        match self {
            Action::Set(n, _) | Action::Add(n, _) | Action::Remove(n) => n,
        }
    }
}

/// An update: a list of actions applied together to the old item.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Update {
    /// The actions; no attribute may be the target of two of them.
    pub actions: Vec<Action>,
}

impl Update {
    /// An empty update.
    pub fn new() -> Self {
        Update::default()
    }
    /// An empty update with room for `n` actions.
    pub fn with_capacity(n: usize) -> Self {
        Update {
            actions: Vec::with_capacity(n),
        }
    }
    /// `SET name = value`
    pub fn set(mut self, name: impl Into<Name>, v: impl Into<Value>) -> Self {
        self.actions
            .push(Action::Set(name.into(), SetValue::Value(v.into())));
        self
    }
    /// `SET name = <expression>`
    pub fn set_expr(mut self, name: impl Into<Name>, v: SetValue) -> Self {
        self.actions.push(Action::Set(name.into(), v));
        self
    }
    /// `ADD name n`
    pub fn add(mut self, name: impl Into<Name>, n: i64) -> Self {
        self.actions.push(Action::Add(name.into(), Value::N(n)));
        self
    }
    /// `REMOVE name`
    pub fn remove(mut self, name: impl Into<Name>) -> Self {
        self.actions.push(Action::Remove(name.into()));
        self
    }
    /// Whether the update writes nothing.
    pub fn is_empty(&self) -> bool {
        self.actions.is_empty()
    }
    /// Every attribute name the update mentions.
    pub fn names(&self, out: &mut Vec<String>) {
        fn walk(v: &SetValue, out: &mut Vec<String>) {
            match v {
                SetValue::Value(_) => {}
                SetValue::Path(p) | SetValue::IfNotExists(p, _) => out.push(p.to_string()),
                SetValue::Plus(a, b) | SetValue::Minus(a, b) => {
                    walk(a, out);
                    walk(b, out);
                }
            }
        }
        for a in &self.actions {
            out.push(a.target().to_string());
            if let Action::Set(_, v) = a {
                walk(v, out);
            }
        }
    }
}

/// What an update returns on success.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum ReturnValues {
    /// Nothing.
    #[default]
    None,
    /// The whole item after the write.
    AllNew,
    /// The whole item before the write.
    AllOld,
    /// Only the attributes the update wrote, as they are after it.
    UpdatedNew,
}

/// Attributes of `item` named by `names`, for `UpdatedNew`.
pub fn project(item: &Item, names: &[String]) -> Item {
    names
        .iter()
        .filter_map(|n| item.get(n.as_str()).map(|v| (n.as_str().into(), v.clone())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_the_fold_of_and() {
        let a = || Condition::exists("a");
        let b = || Condition::not_exists("b").or(Condition::eq("c", 1));
        let d = || Condition::exists("d").and(Condition::gt("e", 2));
        let parts = vec![a(), d(), b(), d()];
        let folded = a().and(d()).and(b()).and(d());
        assert_eq!(Condition::all(parts), folded);
        assert_eq!(Condition::all(vec![d(), a()]), d().and(a()));
        assert_eq!(Condition::all(vec![b()]), b());
    }
}
