//! DynamoDB's semantics for conditions and updates, as pure functions over an item.
//!
//! Every backend that cannot push expressions to a server (MemoryStore, SqliteStore) uses
//! these, so they agree with each other and with DynamoDB by construction.

use std::cmp::Ordering;
use std::collections::BTreeSet;

use smallvec::SmallVec;

use tollgate_core::expr::{Action, CmpOp, Condition, Operand, SetValue, Update};
use tollgate_core::value::{Item, Key, Value, PK, SK};

use crate::error::{CancelReason, StoreError};
use crate::TransactOp;

/// Evaluate a condition against the item as it is (`None` = absent; every attribute is then
/// missing).
pub fn eval_condition(item: Option<&Item>, cond: &Condition) -> bool {
    let get = |n: &str| item.and_then(|i| i.get(n));
    match cond {
        Condition::Exists(n) => get(n).is_some(),
        Condition::NotExists(n) => get(n).is_none(),
        Condition::Cmp(n, op, rhs) => {
            // A missing operand makes every comparison false except `<>`, which DynamoDB
            // (as DynamoDB Local shows) evaluates to true.
            let Some(l) = get(n) else {
                return *op == CmpOp::Ne;
            };
            let r = match rhs {
                Operand::Value(v) => v,
                Operand::Attr(a) => match get(a) {
                    Some(v) => v,
                    None => return *op == CmpOp::Ne,
                },
            };
            compare(l, *op, r)
        }
        Condition::And(cs) => cs.iter().all(|c| eval_condition(item, c)),
        Condition::Or(cs) => cs.iter().any(|c| eval_condition(item, c)),
        Condition::Not(c) => !eval_condition(item, c),
    }
}

fn compare(l: &Value, op: CmpOp, r: &Value) -> bool {
    let ord = match (l, r) {
        (Value::N(a), Value::N(b)) => Some(a.cmp(b)),
        (Value::S(a), Value::S(b)) => Some(a.as_bytes().cmp(b.as_bytes())),
        _ => None,
    };
    match op {
        // Equality is defined across all types (values of different types are unequal).
        CmpOp::Eq => l == r,
        CmpOp::Ne => l != r,
        CmpOp::Lt => ord == Some(Ordering::Less),
        CmpOp::Le => matches!(ord, Some(Ordering::Less | Ordering::Equal)),
        CmpOp::Gt => ord == Some(Ordering::Greater),
        CmpOp::Ge => matches!(ord, Some(Ordering::Greater | Ordering::Equal)),
    }
}

/// Check a value may be stored: DynamoDB refuses empty sets, at any depth.
pub fn validate_value(v: &Value) -> Result<(), StoreError> {
    match v {
        Value::Ss(s) if s.is_empty() => Err(StoreError::Validation(
            "a string set may not be empty".into(),
        )),
        Value::M(m) => m.values().try_for_each(validate_value),
        Value::L(l) => l.iter().try_for_each(validate_value),
        _ => Ok(()),
    }
}

/// Check an item may be stored (no empty sets).
pub fn validate_item(item: &Item) -> Result<(), StoreError> {
    item.values().try_for_each(validate_value)
}

fn validate_set_value(v: &SetValue) -> Result<(), StoreError> {
    match v {
        SetValue::Value(v) | SetValue::IfNotExists(_, v) => validate_value(v),
        SetValue::Path(_) => Ok(()),
        SetValue::Plus(a, b) | SetValue::Minus(a, b) => {
            validate_set_value(a)?;
            validate_set_value(b)
        }
    }
}

/// Updates of at most this many actions are checked for repeated targets without a set.
const SMALL_UPDATE: usize = 64;

/// Check the update is well formed: no attribute targeted twice, keys never written, no
/// empty set literal, `ADD` only with a number or a set. These are DynamoDB's static checks:
/// they fail the request before its condition is evaluated.
pub fn validate_update(update: &Update) -> Result<(), StoreError> {
    // Small updates (every one the limiter writes) check for a repeated target by scanning
    // the fingerprints of the targets before it ([`name_print`]: equal names have equal
    // prints; only equal prints compare the names): on the stack. Large ones use a set.
    let mut seen = (update.actions.len() > SMALL_UPDATE).then(BTreeSet::new);
    let mut prints: SmallVec<[u64; SMALL_UPDATE]> = SmallVec::new();
    for (i, a) in update.actions.iter().enumerate() {
        match a {
            Action::Set(_, SetValue::Value(Value::N(_) | Value::S(_) | Value::Bool(_))) => {}
            Action::Set(_, v) => validate_set_value(v)?,
            Action::Add(_, v) => {
                if !matches!(v, Value::N(_) | Value::Ss(_)) {
                    return Err(StoreError::Validation(format!(
                        "ADD takes a number or a set, not {}",
                        v.type_name()
                    )));
                }
                validate_value(v)?;
            }
            Action::Remove(_) => {}
        }
        let t = a.target();
        if t == PK || t == SK {
            return Err(StoreError::Validation(format!(
                "cannot update key attribute {t}"
            )));
        }
        let repeated = match seen.as_mut() {
            Some(seen) => !seen.insert(t),
            None => {
                let p = name_print(t);
                let again = prints
                    .iter()
                    .zip(&update.actions[..i])
                    .any(|(q, b)| *q == p && tollgate_core::item::same_name(b.target(), t));
                prints.push(p);
                again
            }
        };
        if repeated {
            return Err(StoreError::Validation(format!(
                "two document paths overlap: {t}"
            )));
        }
    }
    Ok(())
}

/// A fingerprint of an attribute name: its length and its first and last eight bytes
/// (overlapping for short names). Equal names have equal prints.
#[inline]
fn name_print(name: &str) -> u64 {
    let b = name.as_bytes();
    let (head, tail) = match (b.first_chunk::<8>(), b.last_chunk::<8>()) {
        (Some(h), Some(t)) => (u64::from_le_bytes(*h), u64::from_le_bytes(*t)),
        _ => {
            let w = b.iter().fold(0u64, |w, x| (w << 8) | u64::from(*x));
            (w, w)
        }
    };
    head ^ tail.rotate_left(29) ^ (b.len() as u64).rotate_left(58)
}

fn eval_set(old: &Item, v: &SetValue) -> Result<Value, StoreError> {
    match v {
        SetValue::Value(v) => Ok(v.clone()),
        SetValue::Path(p) => old.get(p.as_str()).cloned().ok_or_else(|| {
            StoreError::Validation(format!(
                "the provided expression refers to an attribute that does not exist: {p}"
            ))
        }),
        SetValue::IfNotExists(p, d) => {
            Ok(old.get(p.as_str()).cloned().unwrap_or_else(|| d.clone()))
        }
        SetValue::Plus(a, b) | SetValue::Minus(a, b) => {
            let (a, b) = (eval_set(old, a)?, eval_set(old, b)?);
            let (Value::N(a), Value::N(b)) = (&a, &b) else {
                return Err(StoreError::Validation(format!(
                    "incorrect operand type for arithmetic: {} and {}",
                    a.type_name(),
                    b.type_name()
                )));
            };
            let r = if matches!(v, SetValue::Plus(..)) {
                a.checked_add(*b)
            } else {
                a.checked_sub(*b)
            };
            r.map(Value::N)
                .ok_or_else(|| StoreError::Validation("number overflow".into()))
        }
    }
}

/// Apply an update the way DynamoDB stores its result: like [`apply_update`], except that an
/// update made only of `REMOVE` actions on an absent item does not create it (`Ok(None)`).
pub fn apply_update_stored(
    old: Option<&Item>,
    key_item: &Item,
    update: &Update,
) -> Result<Option<Item>, StoreError> {
    let only_removes = !update.actions.is_empty()
        && update
            .actions
            .iter()
            .all(|a| matches!(a, Action::Remove(_)));
    if old.is_none() && only_removes {
        validate_update(update)?;
        return Ok(None);
    }
    apply_update(old, key_item, update).map(Some)
}

/// Apply an update to the old item (`None` = absent: the update creates it under `key_item`,
/// which holds the key attributes). Every right-hand side reads the old item.
///
/// This always returns an item; backends should store the result of
/// [`apply_update_stored`], which knows that a remove-only update creates nothing.
pub fn apply_update(
    old: Option<&Item>,
    key_item: &Item,
    update: &Update,
) -> Result<Item, StoreError> {
    validate_update(update)?;
    let empty = Item::new();
    let old_ref = old.unwrap_or(&empty);
    let mut new = old.cloned().unwrap_or_else(|| key_item.clone());
    apply_actions(&mut new, old_ref, update)?;
    Ok(new)
}

/// What one action does to its attribute, computed from the item before the write.
enum Effect {
    /// Nothing (a plain value SET to what the attribute already holds: a string SET again
    /// on every write, the parameter hash, is then not copied).
    Keep,
    /// Write this value.
    Put(Value),
    /// Remove the attribute.
    Remove,
}

/// Plan `action` against `old` (the item before the write). `current` is the action's own
/// attribute as the item being written holds it — which is as `old` holds it: a validated
/// update names each attribute once, so no earlier action changed it. It decides whether
/// a plain SET changes anything and is what an ADD adds to.
fn plan_action(action: &Action, old: &Item, current: Option<&Value>) -> Result<Effect, StoreError> {
    Ok(match action {
        Action::Set(_, SetValue::Value(v)) if current == Some(v) => Effect::Keep,
        Action::Set(_, v) => Effect::Put(eval_set(old, v)?),
        Action::Remove(_) => Effect::Remove,
        Action::Add(_, v) => Effect::Put(match (current, v) {
            (None, Value::N(d)) => Value::N(*d),
            (Some(Value::N(a)), Value::N(d)) => Value::N(
                a.checked_add(*d)
                    .ok_or_else(|| StoreError::Validation("number overflow".into()))?,
            ),
            (None, Value::Ss(s)) => Value::Ss(s.clone()),
            (Some(Value::Ss(a)), Value::Ss(s)) => {
                Value::Ss(Box::new(a.union(s).cloned().collect()))
            }
            (Some(o), v) => {
                return Err(StoreError::Validation(format!(
                    "an operand in the update expression has an incorrect data type: ADD {} to {}",
                    v.type_name(),
                    o.type_name()
                )))
            }
            (None, v) => {
                return Err(StoreError::Validation(format!(
                    "ADD takes a number or a set, not {}",
                    v.type_name()
                )))
            }
        }),
    })
}

/// Carry out a planned action on `new`, whose attribute `action.target()` is at `pos`
/// (`Item::position`, taken on `new` as it is now); whether it changed the attribute. A
/// value written over an existing attribute goes in place (no search, no shift).
fn carry_out(new: &mut Item, pos: Result<usize, usize>, action: &Action, effect: Effect) -> bool {
    match (effect, pos) {
        (Effect::Keep, _) => false,
        (Effect::Put(v), Ok(i)) => {
            let slot = new.value_at_mut(i);
            if *slot == v {
                false
            } else {
                *slot = v;
                true
            }
        }
        (Effect::Put(v), Err(_)) => {
            new.insert(action.target().into(), v);
            true
        }
        (Effect::Remove, Ok(_)) => new.remove(action.target()).is_some(),
        (Effect::Remove, Err(_)) => false,
    }
}

/// Apply a validated update's actions to `new`, every right-hand side reading `old` (the
/// item before the write; `new` starts as a copy of it, or as the key attributes when it
/// is absent). On an error `new` is partly written: the caller discards it or restores it.
/// An attribute that already exists is overwritten in place (no new name allocated).
///
/// Answers whether the update changed the item, when `new` started as a copy of `old`: a
/// validated update names each attribute once (no two paths overlap), so each action finds
/// its attribute as `old` holds it, and the item changed exactly when one action wrote a
/// value other than the one it found — decided as the values are written, without a
/// second look-up per attribute.
pub fn apply_actions(new: &mut Item, old: &Item, update: &Update) -> Result<bool, StoreError> {
    let mut changed = false;
    for a in &update.actions {
        // Each action's attribute is found once, in the item being written as it is now
        // (an insert or a remove before it moved the places after it).
        let pos = new.position(a.target());
        let current = pos.ok().map(|i| new.at(i).1);
        let planned = plan_action(a, old, current)?;
        changed |= carry_out(new, pos, a, planned);
    }
    Ok(changed)
}

/// Apply a validated update to `item` itself, without a copy of it: every action is
/// planned first, reading the item as it is before the write (what [`apply_actions`] reads
/// from its copy), then carried out: values over existing attributes in place first (no
/// place moves), then inserts and removes by name. On an error nothing is written.
pub fn apply_in_place(item: &mut Item, update: &Update) -> Result<(), StoreError> {
    let mut planned: SmallVec<[(Result<usize, usize>, Effect); 32]> =
        SmallVec::with_capacity(update.actions.len());
    for a in &update.actions {
        let pos = item.position(a.target());
        let current = pos.ok().map(|i| item.at(i).1);
        planned.push((pos, plan_action(a, item, current)?));
    }
    let mut moves: SmallVec<[(usize, Effect); 4]> = SmallVec::new();
    for (i, (pos, effect)) in planned.into_iter().enumerate() {
        match (pos, effect) {
            (Ok(at), Effect::Put(v)) => *item.value_at_mut(at) = v,
            (_, Effect::Keep) => {}
            (_, effect) => moves.push((i, effect)),
        }
    }
    for (i, effect) in moves {
        let a = &update.actions[i];
        let pos = item.position(a.target());
        carry_out(item, pos, a, effect);
    }
    Ok(())
}

/// What one transaction operation writes: `None` = nothing (a check, or a remove-only
/// update of an absent item), `Some(None)` = delete, `Some(Some(item))` = the new item.
pub type Planned = Option<Option<Item>>;

/// An item holding only the key attributes (what an update of an absent item starts from).
pub fn key_item(key: &Key) -> Item {
    let mut i = Item::new();
    key.stamp(&mut i);
    i
}

/// Plan one transaction operation against the item as it was before the transaction
/// (`cur`). `Err` is the reason the transaction is cancelled at this operation. Shared by
/// every backend that evaluates transactions itself.
pub fn plan_transact_op(op: &TransactOp, cur: Option<&Item>) -> Result<Planned, CancelReason> {
    let cond = match op {
        TransactOp::Put(p) => p.condition.as_ref(),
        TransactOp::Update(u) => u.condition.as_ref(),
        TransactOp::Delete(d) => d.condition.as_ref(),
        TransactOp::Check { condition, .. } => Some(condition),
    };
    if let Some(c) = cond {
        if !eval_condition(cur, c) {
            return Err(CancelReason::ConditionFailed { old: cur.cloned() });
        }
    }
    match op {
        TransactOp::Put(p) => {
            let mut item = p.item.clone();
            p.key.stamp(&mut item);
            Ok(Some(Some(item)))
        }
        TransactOp::Update(u) => match apply_update_stored(cur, &key_item(&u.key), &u.update) {
            // A remove-only update of an absent item writes nothing.
            Ok(None) if cur.is_none() => Ok(None),
            Ok(new) => Ok(Some(new)),
            Err(e) => Err(CancelReason::Validation(e.to_string())),
        },
        TransactOp::Delete(_) => Ok(Some(None)),
        TransactOp::Check { .. } => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::value::Key;

    fn key_item() -> Item {
        let mut i = Item::new();
        Key::new("p", "s").stamp(&mut i);
        i
    }

    #[test]
    fn remove_only_update_creates_nothing_but_an_empty_update_does() {
        let k = key_item();
        let r = apply_update_stored(None, &k, &Update::new().remove("a"));
        assert_eq!(r, Ok(None));
        let r = apply_update_stored(None, &k, &Update::new());
        assert_eq!(r, Ok(Some(k.clone())));
        let mut old = k.clone();
        old.insert("a".into(), Value::N(1));
        let r = apply_update_stored(Some(&old), &k, &Update::new().remove("a"));
        assert_eq!(r, Ok(Some(k)));
    }

    #[test]
    fn static_checks() {
        let empty = Value::Ss(Box::default());
        assert!(validate_value(&empty).is_err());
        assert!(validate_value(&Value::L(Box::new(vec![Value::M(Box::new(
            [("x".to_string(), empty.clone())].into_iter().collect()
        ))])))
        .is_err());
        assert!(validate_update(&Update::new().set("a", empty)).is_err());
        let mut up = Update::new();
        up.actions
            .push(Action::Add("a".into(), Value::S("x".into())));
        assert!(validate_update(&up).is_err());
        assert!(validate_update(&Update::new().set("a", 1).remove("a")).is_err());
        assert!(validate_update(&Update::new().add("SK", 1)).is_err());
        assert!(validate_update(&Update::new().set("a", 1).add("b", 1)).is_ok());
        // Names whose fingerprints agree (same length, same first and last eight bytes) are
        // still told apart; a repeat among many is still found.
        let (x, y) = ("abcdefgh_x_abcdefgh", "abcdefgh_y_abcdefgh");
        assert_eq!(name_print(x), name_print(y));
        assert!(validate_update(&Update::new().set(x, 1).set(y, 2)).is_ok());
        assert!(validate_update(&Update::new().set(x, 1).set(y, 2).add(x, 1)).is_err());
        let many = (0..20).fold(Update::new(), |u, i| u.add(format!("b_l{i}_tk"), 1));
        assert!(validate_update(&many).is_ok());
        assert!(validate_update(&many.clone().add("b_l7_tk", 1)).is_err());
    }

    #[test]
    fn comparisons() {
        let mut i = key_item();
        i.insert("n".into(), Value::N(3));
        i.insert("s".into(), Value::S("b".into()));
        let t = |c: Condition| eval_condition(Some(&i), &c);
        assert!(t(Condition::lt("n", 4)));
        assert!(!t(Condition::lt("n", "4")));
        assert!(t(Condition::cmp("n", CmpOp::Ne, "3")));
        assert!(t(Condition::cmp("missing", CmpOp::Ne, 3)));
        assert!(t(Condition::Not(Box::new(Condition::eq("missing", 3)))));
        assert!(t(Condition::gt("s", "a")) && t(Condition::lt("s", "ba")));
        assert!(t(Condition::And(vec![])) && !t(Condition::Or(vec![])));
        assert!(!eval_condition(None, &Condition::exists("PK")));
    }
}
