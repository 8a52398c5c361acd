//! A write's expressions rendered once per shape and reused.
//!
//! What [`crate::render`] writes for an `UpdateItem` — its `UpdateExpression`, its
//! `ConditionExpression` and its `ExpressionAttributeNames` — depends only on the write's
//! *shape*: the structure of its condition and update, every attribute name in them, and
//! where a literal stands and of which type, but not what the literal is. An acquire's
//! writes for one limit set have a handful of shapes (the fast debit, the materialising
//! write, ...), written again on every call with new amounts and instants.
//!
//! [`Shape::of`] walks a write once, in the order the renderer walks it, writing the shape
//! as bytes (the key) and collecting the literals in placeholder order (`:v0`, `:v1`, ...).
//! [`Shapes`] maps a key to the JSON text the renderer made for it the first time; a write
//! of a known shape copies that text and writes only its literals
//! ([`Shape::push_values`]).
//!
//! The key holds every name as its bytes, so two writes share a text only when they would
//! render it identically; no pointer or hash stands in for a name. Debug builds render
//! every write afresh and compare (`DynamoDbStore::update`), so the whole test suite checks
//! that a cached text is what the renderer writes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tollgate_core::expr::{Action, CmpOp, Condition, Operand, SetValue, Update};
use tollgate_core::value::Value;
use tollgate_store::StoreError;

use crate::json::{push_field, push_value, JsonAliases};
use crate::render::push_alias;
use crate::store::{push_expression_text, render_condition, render_update};

/// Most shapes kept; a full table is emptied and fills again (a limit set's shapes are a
/// handful, so only a churn of definitions gets here).
const MAX_SHAPES: usize = 1024;

/// Typical length of a shape's text (an acquire's materialising write has ~500 bytes).
const TEXT_CAPACITY: usize = 640;

/// Typical length of a shape's key (an acquire's materialising write is ~250 bytes).
const KEY_CAPACITY: usize = 320;

/// The rendered text of every shape seen: `,"UpdateExpression":…,"ConditionExpression":…,
/// "ExpressionAttributeNames":{…}` as it follows the key in a request body.
#[derive(Default)]
pub(crate) struct Shapes {
    rendered: Mutex<HashMap<Key, Arc<[u8]>, foldhash::fast::RandomState>>,
}

/// A shape's key, as [`Shapes`] keeps it.
type Key = Box<[u8]>;

impl std::fmt::Debug for Shapes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self
            .rendered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        f.debug_struct("Shapes").field("shapes", &n).finish()
    }
}

impl Shapes {
    /// The text rendered for `shape`, if it was seen.
    pub(crate) fn get(&self, shape: &Shape<'_>) -> Option<Arc<[u8]>> {
        let map = self.rendered.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(shape.key.as_slice()).cloned()
    }

    /// Remember `text` as what `shape` renders to.
    pub(crate) fn insert(&self, shape: &Shape<'_>, text: Arc<[u8]>) {
        let mut map = self.rendered.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= MAX_SHAPES {
            map.clear();
        }
        map.insert(shape.key.as_slice().into(), text);
    }
}

/// One write's shape: its key, and its literals in placeholder order, each with the
/// attribute it is written to (which names it in errors).
pub(crate) struct Shape<'a> {
    key: Vec<u8>,
    values: Vec<(&'a str, &'a Value)>,
    /// The write it is the shape of.
    condition: Option<&'a Condition>,
    require_item: bool,
    update: &'a Update,
}

impl<'a> Shape<'a> {
    /// The shape of an `UpdateItem` with condition `c` (`attribute_exists(PK)` added when
    /// `require_item`) and update `u`, walked as `store::render_condition` and
    /// [`crate::render::write_update`] walk them: the condition first, then the update's
    /// `SET`, `ADD` and `REMOVE` actions, each clause in request order.
    pub(crate) fn of(c: Option<&'a Condition>, require_item: bool, u: &'a Update) -> Self {
        let mut s = Shape {
            key: Vec::with_capacity(KEY_CAPACITY),
            values: Vec::with_capacity(16),
            condition: c,
            require_item,
            update: u,
        };
        s.key.push(u8::from(require_item));
        match c {
            Some(c) => {
                s.key.push(b'c');
                s.condition(c);
            }
            None => s.key.push(b'-'),
        }
        // The renderer writes the SET clause's literals, then the ADD clause's (REMOVE has
        // none). One pass keys every action in request order (so two updates whose clauses
        // interleave differently do not meet) and collects the SET literals; a second
        // collects the ADD literals.
        for act in &u.actions {
            match act {
                Action::Set(n, v) => {
                    s.key.push(b'S');
                    s.name(n);
                    s.set_value(n, v);
                }
                Action::Add(n, v) => {
                    s.key.push(b'A');
                    s.name(n);
                    s.key.push(type_tag(v));
                }
                Action::Remove(n) => {
                    s.key.push(b'R');
                    s.name(n);
                }
            }
        }
        for act in &u.actions {
            if let Action::Add(n, v) = act {
                s.values.push((n, v));
            }
        }
        s
    }

    /// Render the write's expressions and alias names afresh, as JSON: the text [`Shapes`]
    /// keeps for its shape (the literals follow it, from [`Shape::push_values`]).
    pub(crate) fn text(&self) -> Result<Vec<u8>, StoreError> {
        let mut a = JsonAliases::new();
        let c = render_condition(&mut a, self.condition, self.require_item)?;
        let u = render_update(&mut a, self.update)?;
        let mut text = Vec::with_capacity(TEXT_CAPACITY);
        push_expression_text(&mut text, u.as_deref(), c.as_deref());
        a.push_names(&mut text);
        debug_assert!(
            {
                let (mut rendered, mut walked) = (Vec::new(), Vec::new());
                a.push_values(&mut rendered);
                self.push_values(&mut walked).is_ok() && rendered == walked
            },
            "the shape's literals are the renderer's, in its order"
        );
        Ok(text)
    }

    /// Append `,"ExpressionAttributeValues":{":v0":…,…}` (nothing without literals), as
    /// [`crate::json::JsonAliases`] writes it.
    pub(crate) fn push_values(&self, buf: &mut Vec<u8>) -> Result<(), StoreError> {
        if self.values.is_empty() {
            return Ok(());
        }
        buf.extend_from_slice(b",\"ExpressionAttributeValues\":{");
        let mut alias = String::with_capacity(6);
        for (i, (attr, v)) in self.values.iter().enumerate() {
            if i > 0 {
                buf.push(b',');
            }
            alias.clear();
            push_alias(&mut alias, ":v", i);
            push_field(buf, &alias);
            push_value(buf, attr, v)?;
        }
        buf.push(b'}');
        Ok(())
    }

    /// A name: its length, then its bytes (so no two sequences of names give one key).
    fn name(&mut self, n: &str) {
        self.key.extend_from_slice(&(n.len() as u32).to_le_bytes());
        self.key.extend_from_slice(n.as_bytes());
    }

    /// A literal written to `attr` (which names it in errors): its type in the key, the
    /// literal itself the next placeholder's.
    fn literal(&mut self, attr: &'a str, v: &'a Value) {
        self.key.push(b'v');
        self.key.push(type_tag(v));
        self.values.push((attr, v));
    }

    /// A count of children.
    fn count(&mut self, n: usize) {
        self.key.extend_from_slice(&(n as u32).to_le_bytes());
    }

    fn condition(&mut self, c: &'a Condition) {
        match c {
            Condition::Exists(n) => {
                self.key.push(b'E');
                self.name(n);
            }
            Condition::NotExists(n) => {
                self.key.push(b'N');
                self.name(n);
            }
            Condition::Cmp(n, op, rhs) => {
                self.key.push(b'C');
                self.key.push(op_tag(*op));
                self.name(n);
                match rhs {
                    Operand::Value(v) => self.literal(n, v),
                    Operand::Attr(x) => {
                        self.key.push(b'a');
                        self.name(x);
                    }
                }
            }
            Condition::And(cs) | Condition::Or(cs) => {
                self.key.push(if matches!(c, Condition::And(_)) {
                    b'&'
                } else {
                    b'|'
                });
                self.count(cs.len());
                for c in cs {
                    self.condition(c);
                }
            }
            Condition::Not(c) => {
                self.key.push(b'!');
                self.condition(c);
            }
        }
    }

    /// A `SET`'s right-hand side, its literals attributed to `target` as the renderer does.
    fn set_value(&mut self, target: &'a str, v: &'a SetValue) {
        match v {
            SetValue::Value(v) => self.literal(target, v),
            SetValue::Path(p) => {
                self.key.push(b'p');
                self.name(p);
            }
            SetValue::IfNotExists(p, d) => {
                self.key.push(b'i');
                self.name(p);
                self.literal(target, d);
            }
            SetValue::Plus(l, r) | SetValue::Minus(l, r) => {
                self.key.push(if matches!(v, SetValue::Plus(..)) {
                    b'+'
                } else {
                    b'-'
                });
                self.set_value(target, l);
                self.set_value(target, r);
            }
        }
    }
}

/// A literal's type: the renderer refuses some types in some places (`ADD` of a string), so
/// the type is part of the shape.
fn type_tag(v: &Value) -> u8 {
    match v {
        Value::N(_) => b'n',
        Value::S(_) => b's',
        Value::Bool(_) => b'b',
        Value::Ss(_) => b'e',
        Value::M(_) => b'm',
        Value::L(_) => b'l',
        Value::Null => b'0',
    }
}

fn op_tag(op: CmpOp) -> u8 {
    match op {
        CmpOp::Eq => b'=',
        CmpOp::Ne => b'!',
        CmpOp::Lt => b'<',
        CmpOp::Le => b'l',
        CmpOp::Gt => b'>',
        CmpOp::Ge => b'g',
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use tollgate_core::expr::Name;

    /// What the request body holds after the key when the write is rendered afresh, as
    /// before shapes were kept: its expressions, then the alias maps.
    fn rendered(c: Option<&Condition>, require_item: bool, u: &Update) -> Result<Vec<u8>, String> {
        let mut a = JsonAliases::new();
        let c = render_condition(&mut a, c, require_item).map_err(|e| e.to_string())?;
        let u = render_update(&mut a, u).map_err(|e| e.to_string())?;
        let mut body = Vec::new();
        push_expression_text(&mut body, u.as_deref(), c.as_deref());
        a.finish(&mut body);
        Ok(body)
    }

    /// The same part of the body from the text kept for `kept`'s shape and `w`'s literals.
    fn reused(kept: &Shape<'_>, w: &Shape<'_>) -> Result<Vec<u8>, String> {
        let mut body = kept.text().map_err(|e| e.to_string())?;
        w.push_values(&mut body).map_err(|e| e.to_string())?;
        Ok(body)
    }

    /// A small generator: `s` draws the structure, `v` the literals, so one `s` with two
    /// `v`s gives two writes of one shape.
    struct Gen {
        s: u64,
        v: u64,
    }

    /// The tests' pseudo-random numbers: one xorshift64 step (13, 7, 17), the formula
    /// `tollgate-core`'s tests draw from.
    pub(crate) fn step(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    const NAMES: &[&str] = &[
        "PK",
        "rf",
        "b_rpm_tk",
        "b_rpm-x.y_tk",
        "b_tpm_fu",
        "vu",
        "q\"t",
        "é🦀",
        "a\\b",
    ];

    impl Gen {
        fn s(&mut self, n: u64) -> u64 {
            step(&mut self.s) % n
        }
        fn v(&mut self) -> u64 {
            step(&mut self.v)
        }
        fn name(&mut self) -> Name {
            let n = NAMES[self.s(NAMES.len() as u64) as usize];
            match self.s(3) {
                0 => Name::Static(n),
                1 => Name::Shared(n.into()),
                _ => Name::Owned(n.to_string()),
            }
        }
        fn text(&mut self) -> String {
            (0..self.v() % 6)
                .map(|_| NAMES[(self.v() % NAMES.len() as u64) as usize])
                .collect()
        }
        /// A literal whose type the structure draws and whose content the literals draw;
        /// `add` leans to what `ADD` takes.
        fn value(&mut self, add: bool) -> Value {
            let t = if add && self.s(8) != 0 {
                self.s(2) * 3
            } else {
                self.s(7)
            };
            match t {
                0 => Value::N(self.v() as i64 >> (self.v() % 64)),
                1 => Value::S(self.text()),
                2 => Value::Bool(self.v().is_multiple_of(2)),
                3 => {
                    // Sometimes empty: refused by the encoder, whatever the shape.
                    let n = self.v() % 3;
                    Value::Ss(Box::new(
                        (0..n).map(|_| self.text()).collect::<BTreeSet<_>>(),
                    ))
                }
                4 => Value::L(Box::new(vec![Value::N(self.v() as i64)])),
                5 => Value::M(Box::new(
                    [("k".to_string(), Value::S(self.text()))]
                        .into_iter()
                        .collect(),
                )),
                _ => Value::Null,
            }
        }
        fn condition(&mut self, depth: u32) -> Condition {
            let leaf = depth >= 3;
            match self.s(if leaf { 4 } else { 7 }) {
                0 => Condition::Exists(self.name()),
                1 => Condition::NotExists(self.name()),
                2 => {
                    let op = CmpOp::ALL[self.s(CmpOp::ALL.len() as u64) as usize];
                    Condition::Cmp(self.name(), op, Operand::Value(self.value(false)))
                }
                3 => Condition::Cmp(self.name(), CmpOp::Le, Operand::Attr(self.name())),
                4 => Condition::And((0..self.s(4)).map(|_| self.condition(depth + 1)).collect()),
                5 => Condition::Or((0..self.s(4)).map(|_| self.condition(depth + 1)).collect()),
                _ => Condition::Not(Box::new(self.condition(depth + 1))),
            }
        }
        fn set_value(&mut self, top: bool) -> SetValue {
            // Arithmetic nests only in one write in fifty: the renderer refuses it.
            let kinds = if top || self.s(50) == 0 { 5 } else { 3 };
            match self.s(kinds) {
                0 => SetValue::Value(self.value(false)),
                1 => SetValue::Path(self.name()),
                2 => SetValue::IfNotExists(self.name(), self.value(false)),
                3 => SetValue::Plus(
                    Box::new(self.set_value(false)),
                    Box::new(self.set_value(false)),
                ),
                _ => SetValue::Minus(
                    Box::new(self.set_value(false)),
                    Box::new(self.set_value(false)),
                ),
            }
        }
        fn write(&mut self) -> (Option<Condition>, bool, Update) {
            let c = (self.s(5) != 0).then(|| self.condition(0));
            let require_item = self.s(4) == 0;
            let mut u = Update::new();
            for _ in 0..self.s(8) {
                let a = match self.s(3) {
                    0 => Action::Set(self.name(), self.set_value(true)),
                    1 => Action::Add(self.name(), self.value(true)),
                    _ => Action::Remove(self.name()),
                };
                u.actions.push(a);
            }
            (c, require_item, u)
        }
    }

    /// Generated writes (nested conditions, every operator, every literal type, names with
    /// quotes, backslashes, `-`, `.` and non-ASCII, refused writes): the text kept for a
    /// shape with another write's literals is that write rendered afresh, byte for byte;
    /// writes whose keys match render the same text; a refused write is refused either way.
    #[test]
    fn a_kept_text_with_new_literals_is_the_write_rendered_afresh() {
        let mut seen: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let (mut reused_ok, mut refused) = (0, 0);
        for round in 0..4000u64 {
            // Structures repeat (a small seed space half the time), literals never do.
            let s = if round % 2 == 0 { round % 97 } else { round } + 1;
            let mut g1 = Gen {
                s,
                v: round * 2 + 1,
            };
            let mut g2 = Gen {
                s,
                v: round * 2 + 2,
            };
            let (c1, r1, u1) = g1.write();
            let (c2, r2, u2) = g2.write();
            let (w1, w2) = (
                Shape::of(c1.as_ref(), r1, &u1),
                Shape::of(c2.as_ref(), r2, &u2),
            );
            assert_eq!(w1.key, w2.key, "one structure, one key");
            // The store keeps a text only from a write that rendered.
            let fresh = rendered(c2.as_ref(), r2, &u2);
            match w1.text() {
                Ok(_) => {
                    assert_eq!(reused(&w1, &w2), fresh, "round {round}");
                    match &fresh {
                        Ok(_) => reused_ok += 1,
                        Err(_) => refused += 1,
                    }
                }
                Err(e) => assert_eq!(
                    Err(e.to_string()),
                    rendered(c1.as_ref(), r1, &u1),
                    "round {round}"
                ),
            }
            if let Ok(text) = w2.text() {
                match seen.get(&w2.key) {
                    Some(t) => assert_eq!(t, &text, "one key, one text (round {round})"),
                    None => {
                        seen.insert(w2.key.clone(), text);
                    }
                }
            }
        }
        // The generator reaches both outcomes and repeats shapes.
        assert!(reused_ok > 2000, "{reused_ok} writes rendered");
        assert!(refused > 50, "{refused} writes refused");
        assert!(seen.len() < 3000, "{} shapes in 4000 writes", seen.len());
    }

    /// Writes that differ in anything but their literals' values get different keys.
    #[test]
    fn writes_that_render_differently_have_different_keys() {
        let n = |s: &'static str| Name::Static(s);
        let cmp = |op, v| Condition::Cmp(n("a"), op, Operand::Value(v));
        let add = |name: &'static str, v| Update {
            actions: vec![Action::Add(n(name), v)],
        };
        let empty = Update::new();
        let base = Shape::of(Some(&cmp(CmpOp::Lt, Value::N(1))), false, &empty).key;
        let differs = [
            Shape::of(Some(&cmp(CmpOp::Le, Value::N(1))), false, &empty).key,
            Shape::of(Some(&cmp(CmpOp::Lt, Value::S("1".into()))), false, &empty).key,
            Shape::of(Some(&cmp(CmpOp::Lt, Value::N(1))), true, &empty).key,
            Shape::of(None, false, &empty).key,
            Shape::of(
                Some(&Condition::Cmp(n("a"), CmpOp::Lt, Operand::Attr(n("b")))),
                false,
                &empty,
            )
            .key,
            Shape::of(
                Some(&Condition::Cmp(
                    n("ab"),
                    CmpOp::Lt,
                    Operand::Value(Value::N(1)),
                )),
                false,
                &empty,
            )
            .key,
        ];
        for (i, k) in differs.iter().enumerate() {
            assert_ne!(&base, k, "variant {i}");
        }
        assert_eq!(
            base,
            Shape::of(Some(&cmp(CmpOp::Lt, Value::N(-7))), false, &empty).key,
            "only the value changed"
        );
        // Names are length-prefixed: `ab` + `c` is not `a` + `bc`.
        let two = |x: &'static str, y: &'static str| Update {
            actions: vec![Action::Remove(n(x)), Action::Remove(n(y))],
        };
        let (u1, u2) = (two("ab", "c"), two("a", "bc"));
        assert_ne!(
            Shape::of(None, false, &u1).key,
            Shape::of(None, false, &u2).key
        );
        // Clause order: SET then ADD is not ADD then SET, though both render `SET … ADD …`
        // (the names are aliased in request order).
        let set = Action::Set(n("s"), SetValue::Value(Value::N(1)));
        let (ua, ub) = (
            Update {
                actions: vec![set.clone(), Action::Add(n("t"), Value::N(1))],
            },
            Update {
                actions: vec![Action::Add(n("t"), Value::N(1)), set],
            },
        );
        assert_ne!(
            Shape::of(None, false, &ua).key,
            Shape::of(None, false, &ub).key
        );
        assert_ne!(
            Shape::of(None, false, &add("t", Value::N(1))).key,
            Shape::of(None, false, &add("t", Value::S("x".into()))).key
        );
    }

    /// The table keeps a shape's text, and empties itself when full.
    #[test]
    fn shapes_are_kept_and_the_table_is_bounded() {
        let shapes = Shapes::default();
        let names: Vec<String> = (0..=MAX_SHAPES).map(|i| format!("n{i}")).collect();
        let updates: Vec<Update> = names
            .iter()
            .map(|x| Update {
                actions: vec![Action::Remove(Name::Owned(x.clone()))],
            })
            .collect();
        for u in &updates[..MAX_SHAPES] {
            let s = Shape::of(None, false, u);
            assert!(shapes.get(&s).is_none());
            shapes.insert(&s, s.text().expect("renders").into());
        }
        let first = Shape::of(None, false, &updates[0]);
        assert_eq!(
            shapes.get(&first).as_deref(),
            Some(&*first.text().expect("renders"))
        );
        let last = Shape::of(None, false, &updates[MAX_SHAPES]);
        shapes.insert(&last, last.text().expect("renders").into());
        assert!(shapes.get(&first).is_none(), "a full table starts again");
        assert!(shapes.get(&last).is_some());
        assert_eq!(format!("{shapes:?}"), "Shapes { shapes: 1 }");
    }
}
