//! The conformance suite every backend must pass: DynamoDB's semantics, check by check.
//!
//! Each check is an async function taking a fresh, empty store (each still uses keys of its
//! own, so a backend may share one table between checks) and returning `Err(why)` on the
//! first deviation. [`checks`] lists them all by name; [`run_all`] / [`run_all_with`] run
//! them; [`conformance_tests!`](crate::conformance_tests) makes one `#[tokio::test]` that runs
//! every check and reports every failing name at once:
//!
//! ```ignore
//! tollgate_store::conformance_tests!(memory_store_conforms, async {
//!     tollgate_store::MemoryStore::new()
//! });
//! ```
//!
//! Table queries and batch reads ask for strong consistency; index queries (which cannot)
//! are polled for a short while, so the suite also holds against an eventually consistent
//! index.

pub mod feed;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use tollgate_core::expr::{CmpOp, Condition, Operand, ReturnValues, SetValue, Update};
use tollgate_core::value::{Item, Key, Value};

use crate::{
    CancelReason, DeleteRequest, PutRequest, Query, Store, StoreError, TransactOp, UpdateRequest,
    MAX_TRANSACT_OPS,
};

/// The outcome of one check: `Err` carries what went wrong.
pub type CheckResult = Result<(), String>;

/// The future a check returns.
pub type CheckFuture<'a> = Pin<Box<dyn Future<Output = CheckResult> + Send + 'a>>;

/// One named check of the suite.
#[derive(Clone, Copy)]
pub struct Check {
    /// The check's name (its function's name in this module).
    pub name: &'static str,
    /// Run it against a fresh, empty store.
    pub run: for<'a> fn(&'a dyn Store) -> CheckFuture<'a>,
}

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Check").field("name", &self.name).finish()
    }
}

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

fn ensure(ok: bool, what: impl Into<String>) -> CheckResult {
    if ok {
        Ok(())
    } else {
        Err(what.into())
    }
}

fn ensure_eq<T: PartialEq + std::fmt::Debug>(got: T, want: T, what: &str) -> CheckResult {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: got {got:?}, want {want:?}"))
    }
}

fn e2s(e: StoreError) -> String {
    format!("unexpected store error: {e:?}")
}

/// An item from attribute pairs (without key attributes).
fn attrs(pairs: &[(&str, Value)]) -> Item {
    pairs
        .iter()
        .map(|(n, v)| ((*n).into(), v.clone()))
        .collect()
}

/// The item as a store returns it: the attributes plus `PK` / `SK`.
fn stored(key: &Key, pairs: &[(&str, Value)]) -> Item {
    let mut i = attrs(pairs);
    key.stamp(&mut i);
    i
}

fn ss(members: &[&str]) -> Value {
    Value::Ss(Box::new(members.iter().map(|m| (*m).to_string()).collect()))
}

async fn put(s: &dyn Store, key: &Key, pairs: &[(&str, Value)]) -> CheckResult {
    s.put(PutRequest {
        key: key.clone(),
        item: attrs(pairs),
        condition: None,
    })
    .await
    .map_err(e2s)
}

async fn get(s: &dyn Store, key: &Key) -> Result<Option<Item>, String> {
    s.get(key, true).await.map_err(e2s)
}

async fn update(
    s: &dyn Store,
    key: &Key,
    update: Update,
    condition: Option<Condition>,
    returns: ReturnValues,
) -> Result<Option<Item>, StoreError> {
    s.update(UpdateRequest {
        key: key.clone(),
        update,
        condition,
        returns,
    })
    .await
}

/// Whether `cond` holds on the item at `key`, probed with a conditional update of an
/// attribute the condition does not mention.
async fn holds(s: &dyn Store, key: &Key, cond: Condition) -> Result<bool, String> {
    match update(
        s,
        key,
        Update::new().add("probe_count", 1),
        Some(cond),
        ReturnValues::None,
    )
    .await
    {
        Ok(_) => Ok(true),
        Err(StoreError::ConditionFailed { .. }) => Ok(false),
        Err(e) => Err(e2s(e)),
    }
}

/// Assert `cond` evaluates to `want` on the item at `key`.
async fn expect_holds(s: &dyn Store, key: &Key, cond: Condition, want: bool) -> CheckResult {
    let what = format!("{cond:?}");
    let got = holds(s, key, cond).await?;
    ensure(got == want, format!("condition {what} should be {want}"))
}

fn expect_validation<T: std::fmt::Debug>(r: Result<T, StoreError>, what: &str) -> CheckResult {
    match r {
        Err(StoreError::Validation(_)) => Ok(()),
        other => Err(format!("{what}: want Validation, got {other:?}")),
    }
}

fn expect_condition_failed<T: std::fmt::Debug>(
    r: Result<T, StoreError>,
    want_old: Option<&Item>,
    what: &str,
) -> CheckResult {
    match r {
        Err(StoreError::ConditionFailed { old }) => {
            ensure_eq(old.as_deref(), want_old, &format!("{what}: old item"))
        }
        other => Err(format!("{what}: want ConditionFailed, got {other:?}")),
    }
}

fn expect_canceled(r: Result<(), StoreError>, what: &str) -> Result<Vec<CancelReason>, String> {
    match r {
        Err(StoreError::TransactionCanceled { reasons }) => Ok(reasons),
        other => Err(format!("{what}: want TransactionCanceled, got {other:?}")),
    }
}

fn put_op(key: &Key, pairs: &[(&str, Value)], condition: Option<Condition>) -> TransactOp {
    TransactOp::Put(PutRequest {
        key: key.clone(),
        item: attrs(pairs),
        condition,
    })
}

fn update_op(key: &Key, update: Update, condition: Option<Condition>) -> TransactOp {
    TransactOp::Update(UpdateRequest {
        key: key.clone(),
        update,
        condition,
        returns: ReturnValues::None,
    })
}

/// Poll an index query until it returns `want` items (indexes may be eventually consistent).
async fn query_index_until(s: &dyn Store, q: Query, want: usize) -> Result<Vec<Item>, String> {
    let mut last = Vec::new();
    for _ in 0..40 {
        last = s.query(q.clone()).await.map_err(e2s)?;
        if last.len() == want {
            return Ok(last);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(last)
}

/// Drive several futures concurrently on the current task (no `'static` bound needed).
async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in futs.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *slot = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

// ---------------------------------------------------------------------------------------
// Conditional puts and condition failures
// ---------------------------------------------------------------------------------------

/// `put` with `attribute_not_exists(PK)` creates once; the second fails with the old item.
pub async fn put_if_absent(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/put_if_absent", "#STATE");
    let first = s
        .put(PutRequest {
            key: k.clone(),
            item: attrs(&[("n", Value::N(5))]),
            condition: Some(Condition::not_exists("PK")),
        })
        .await;
    ensure(first.is_ok(), format!("first put: {first:?}"))?;
    let again = s
        .put(PutRequest {
            key: k.clone(),
            item: attrs(&[("n", Value::N(6))]),
            condition: Some(Condition::not_exists("PK")),
        })
        .await;
    let want = stored(&k, &[("n", Value::N(5))]);
    expect_condition_failed(again, Some(&want), "second put")?;
    ensure_eq(get(s, &k).await?, Some(want), "item after failed put")
}

/// A failed condition on an absent item reports `old: None` and creates nothing.
pub async fn condition_failed_on_absent_item(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/cond_absent", "#STATE");
    let r = update(
        s,
        &k,
        Update::new().set("a", 1),
        Some(Condition::exists("PK")),
        ReturnValues::AllNew,
    )
    .await;
    expect_condition_failed(r, None, "update on absent item")?;
    let r = s
        .put(PutRequest {
            key: k.clone(),
            item: attrs(&[("a", Value::N(1))]),
            condition: Some(Condition::eq("a", 1)),
        })
        .await;
    expect_condition_failed(r, None, "put on absent item")?;
    let r = s
        .delete(DeleteRequest {
            key: k.clone(),
            condition: Some(Condition::exists("PK")),
        })
        .await;
    expect_condition_failed(r, None, "delete on absent item")?;
    ensure_eq(get(s, &k).await?, None, "nothing created")
}

/// A put replaces the whole item and stamps the key attributes.
pub async fn put_replaces_whole_item(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/put_replaces", "#STATE");
    put(s, &k, &[("a", Value::N(1)), ("b", Value::N(2))]).await?;
    put(s, &k, &[("c", Value::N(3))]).await?;
    ensure_eq(
        get(s, &k).await?,
        Some(stored(&k, &[("c", Value::N(3))])),
        "item after second put",
    )
}

// ---------------------------------------------------------------------------------------
// Condition evaluation
// ---------------------------------------------------------------------------------------

/// Every comparison with a missing attribute is false except `<>`, which is true (as
/// DynamoDB Local evaluates it); `NOT` of one is its negation.
pub async fn missing_attribute_compares_false(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/missing_cmp", "#STATE");
    put(s, &k, &[("present", Value::N(1))]).await?;
    for op in CmpOp::ALL {
        let holds = op == CmpOp::Ne;
        expect_holds(s, &k, Condition::cmp("absent", op, 1), holds).await?;
        expect_holds(
            s,
            &k,
            Condition::Not(Box::new(Condition::cmp("absent", op, 1))),
            !holds,
        )
        .await?;
    }
    // A missing right-hand attribute behaves the same.
    expect_holds(
        s,
        &k,
        Condition::Cmp("present".into(), CmpOp::Lt, Operand::Attr("absent".into())),
        false,
    )
    .await?;
    expect_holds(
        s,
        &k,
        Condition::Cmp("present".into(), CmpOp::Ne, Operand::Attr("absent".into())),
        true,
    )
    .await?;
    expect_holds(s, &k, Condition::exists("absent"), false).await?;
    expect_holds(s, &k, Condition::not_exists("absent"), true).await?;
    expect_holds(s, &k, Condition::exists("present"), true).await
}

/// Comparisons across types: `=` false, `<>` true, ordering false.
pub async fn cross_type_compares(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/cross_type", "#STATE");
    put(s, &k, &[("n", Value::N(5)), ("s", Value::S("5".into()))]).await?;
    expect_holds(s, &k, Condition::eq("n", "5"), false).await?;
    expect_holds(s, &k, Condition::cmp("n", CmpOp::Ne, "5"), true).await?;
    expect_holds(s, &k, Condition::eq("s", 5), false).await?;
    expect_holds(s, &k, Condition::cmp("s", CmpOp::Ne, 5), true).await?;
    for op in [CmpOp::Lt, CmpOp::Le, CmpOp::Gt, CmpOp::Ge] {
        expect_holds(s, &k, Condition::cmp("n", op, "5"), false).await?;
        expect_holds(s, &k, Condition::cmp("s", op, 5), false).await?;
    }
    expect_holds(
        s,
        &k,
        Condition::Not(Box::new(Condition::lt("n", "9"))),
        true,
    )
    .await?;
    // Same-type equality still works.
    expect_holds(s, &k, Condition::eq("n", 5), true).await?;
    expect_holds(s, &k, Condition::eq("s", "5"), true).await
}

/// Strings order by their UTF-8 bytes.
pub async fn string_ordering(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/string_order", "#STATE");
    put(s, &k, &[("s", Value::S("b".into()))]).await?;
    expect_holds(s, &k, Condition::gt("s", "a"), true).await?;
    expect_holds(s, &k, Condition::lt("s", "ba"), true).await?;
    expect_holds(s, &k, Condition::gt("s", "B"), true).await?;
    expect_holds(s, &k, Condition::lt("s", "c"), true).await?;
    expect_holds(s, &k, Condition::le("s", "b"), true).await?;
    expect_holds(s, &k, Condition::ge("s", "b"), true).await?;
    expect_holds(s, &k, Condition::lt("s", "b"), false).await?;
    put(s, &k, &[("s", Value::S("10".into()))]).await?;
    expect_holds(s, &k, Condition::lt("s", "9"), true).await?;
    put(s, &k, &[("s", Value::S("é".into()))]).await?;
    expect_holds(s, &k, Condition::gt("s", "z"), true).await
}

/// Numbers order numerically, negatives included.
pub async fn number_ordering(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/number_order", "#STATE");
    put(s, &k, &[("n", Value::N(-5))]).await?;
    expect_holds(s, &k, Condition::lt("n", 3), true).await?;
    expect_holds(s, &k, Condition::gt("n", -10), true).await?;
    expect_holds(s, &k, Condition::ge("n", -5), true).await?;
    expect_holds(s, &k, Condition::gt("n", -5), false).await?;
    put(s, &k, &[("n", Value::N(10))]).await?;
    expect_holds(s, &k, Condition::gt("n", 9), true).await?;
    expect_holds(s, &k, Condition::le("n", 9), false).await
}

/// `AND` / `OR` / `NOT`, including an empty `AND` (true) and an empty `OR` (false).
pub async fn boolean_logic(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/logic", "#STATE");
    put(s, &k, &[("a", Value::N(1)), ("b", Value::N(2))]).await?;
    let t = || Condition::eq("a", 1);
    let f = || Condition::eq("a", 2);
    expect_holds(s, &k, Condition::And(vec![]), true).await?;
    expect_holds(s, &k, Condition::Or(vec![]), false).await?;
    expect_holds(s, &k, t().and(Condition::eq("b", 2)), true).await?;
    expect_holds(s, &k, t().and(f()), false).await?;
    expect_holds(s, &k, f().or(t()), true).await?;
    expect_holds(s, &k, f().or(f()), false).await?;
    expect_holds(s, &k, Condition::Not(Box::new(f())), true).await?;
    expect_holds(
        s,
        &k,
        Condition::Not(Box::new(Condition::Or(vec![f(), t().and(f())]))),
        true,
    )
    .await
}

/// A comparison whose right-hand side is another attribute of the item.
pub async fn attribute_operand(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/attr_operand", "#STATE");
    put(s, &k, &[("a", Value::N(1)), ("b", Value::N(2))]).await?;
    let c = |op| Condition::Cmp("a".into(), op, Operand::Attr("b".into()));
    expect_holds(s, &k, c(CmpOp::Lt), true).await?;
    expect_holds(s, &k, c(CmpOp::Eq), false).await?;
    expect_holds(s, &k, c(CmpOp::Ne), true).await?;
    expect_holds(s, &k, c(CmpOp::Ge), false).await
}

// ---------------------------------------------------------------------------------------
// Updates
// ---------------------------------------------------------------------------------------

/// `SET a = value` and `SET b = a`; every right-hand side reads the old item.
pub async fn set_value_and_path(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/set_path", "#STATE");
    put(s, &k, &[("a", Value::N(1))]).await?;
    let new = update(
        s,
        &k,
        Update::new()
            .set("a", 9)
            .set_expr("b", SetValue::Path("a".into())),
        None,
        ReturnValues::AllNew,
    )
    .await
    .map_err(e2s)?;
    ensure_eq(
        new,
        Some(stored(&k, &[("a", Value::N(9)), ("b", Value::N(1))])),
        "SET a = 9, b = a reads the old a",
    )
}

/// `SET b = a` with `a` missing is a validation error and writes nothing.
pub async fn set_missing_path_is_validation(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/set_missing_path", "#STATE");
    put(s, &k, &[("x", Value::N(1))]).await?;
    let r = update(
        s,
        &k,
        Update::new()
            .set("y", 2)
            .set_expr("b", SetValue::Path("a".into())),
        None,
        ReturnValues::None,
    )
    .await;
    expect_validation(r, "SET b = missing")?;
    let r = update(
        s,
        &k,
        Update::new().set_expr(
            "b",
            SetValue::Plus(
                Box::new(SetValue::Path("a".into())),
                Box::new(SetValue::Value(Value::N(1))),
            ),
        ),
        None,
        ReturnValues::None,
    )
    .await;
    expect_validation(r, "SET b = missing + 1")?;
    ensure_eq(
        get(s, &k).await?,
        Some(stored(&k, &[("x", Value::N(1))])),
        "item unchanged",
    )
}

/// `if_not_exists(path, default)` keeps an existing value and defaults a missing one.
pub async fn set_if_not_exists(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/if_not_exists", "#STATE");
    put(s, &k, &[("a", Value::N(1))]).await?;
    let new = update(
        s,
        &k,
        Update::new()
            .set_expr("a", SetValue::IfNotExists("a".into(), Value::N(100)))
            .set_expr("b", SetValue::IfNotExists("b".into(), Value::N(200)))
            .set_expr("c", SetValue::IfNotExists("a".into(), Value::N(300))),
        None,
        ReturnValues::AllNew,
    )
    .await
    .map_err(e2s)?;
    ensure_eq(
        new,
        Some(stored(
            &k,
            &[("a", Value::N(1)), ("b", Value::N(200)), ("c", Value::N(1))],
        )),
        "if_not_exists",
    )
}

/// `SET x = x + v`, `SET y = if_not_exists(y, 0) - v`; arithmetic on a string is invalid.
pub async fn set_plus_minus(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/plus_minus", "#STATE");
    put(s, &k, &[("x", Value::N(10)), ("t", Value::S("s".into()))]).await?;
    let p = |n: &str| Box::new(SetValue::Path(n.to_string().into()));
    let v = |n: i64| Box::new(SetValue::Value(Value::N(n)));
    let new = update(
        s,
        &k,
        Update::new()
            .set_expr("x", SetValue::Plus(p("x"), v(5)))
            .set_expr(
                "y",
                SetValue::Minus(
                    Box::new(SetValue::IfNotExists("y".into(), Value::N(0))),
                    v(3),
                ),
            )
            .set_expr("z", SetValue::Minus(p("x"), p("x"))),
        None,
        ReturnValues::UpdatedNew,
    )
    .await
    .map_err(e2s)?;
    ensure_eq(
        new,
        Some(attrs(&[
            ("x", Value::N(15)),
            ("y", Value::N(-3)),
            ("z", Value::N(0)),
        ])),
        "plus/minus",
    )?;
    let r = update(
        s,
        &k,
        Update::new().set_expr("u", SetValue::Plus(p("t"), v(1))),
        None,
        ReturnValues::None,
    )
    .await;
    expect_validation(r, "string + number")
}

/// `ADD n v` on a missing number starts from 0; on a present one it adds.
pub async fn add_number_starts_at_zero(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/add_number", "#STATE");
    put(s, &k, &[("n", Value::N(5))]).await?;
    let new = update(
        s,
        &k,
        Update::new().add("n", -2).add("m", 7),
        Some(Condition::ge("n", 2)),
        ReturnValues::AllNew,
    )
    .await
    .map_err(e2s)?;
    ensure_eq(
        new,
        Some(stored(&k, &[("n", Value::N(3)), ("m", Value::N(7))])),
        "ADD",
    )
}

/// `ADD s {..}` unions string sets and creates a missing one.
pub async fn add_string_set_union(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/add_set", "#STATE");
    put(s, &k, &[("tags", ss(&["a", "b"]))]).await?;
    let mut up = Update::new();
    up.actions.push(tollgate_core::expr::Action::Add(
        "tags".into(),
        ss(&["b", "c"]),
    ));
    up.actions
        .push(tollgate_core::expr::Action::Add("fresh".into(), ss(&["x"])));
    let new = update(s, &k, up, None, ReturnValues::AllNew)
        .await
        .map_err(e2s)?;
    ensure_eq(
        new,
        Some(stored(
            &k,
            &[("tags", ss(&["a", "b", "c"])), ("fresh", ss(&["x"]))],
        )),
        "ADD set union",
    )
}

/// `ADD` of a number to a string (or a set to a number) is a validation error.
pub async fn add_type_mismatch_is_validation(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/add_mismatch", "#STATE");
    let before = [("s", Value::S("x".into())), ("n", Value::N(1))];
    put(s, &k, &before).await?;
    let r = update(s, &k, Update::new().add("s", 1), None, ReturnValues::None).await;
    expect_validation(r, "ADD number to string")?;
    let mut up = Update::new();
    up.actions
        .push(tollgate_core::expr::Action::Add("n".into(), ss(&["a"])));
    let r = update(s, &k, up, None, ReturnValues::None).await;
    expect_validation(r, "ADD set to number")?;
    ensure_eq(
        get(s, &k).await?,
        Some(stored(&k, &before)),
        "item unchanged",
    )
}

/// `REMOVE a` drops the attribute; removing a missing one is fine.
pub async fn remove_attribute(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/remove", "#STATE");
    put(s, &k, &[("a", Value::N(1)), ("b", Value::N(2))]).await?;
    let new = update(
        s,
        &k,
        Update::new().remove("a").remove("never"),
        None,
        ReturnValues::AllNew,
    )
    .await
    .map_err(e2s)?;
    ensure_eq(new, Some(stored(&k, &[("b", Value::N(2))])), "after REMOVE")
}

/// An update made only of `REMOVE` actions does not create an absent item.
pub async fn remove_only_update_does_not_create(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/remove_only", "#STATE");
    let r = update(s, &k, Update::new().remove("a"), None, ReturnValues::AllNew)
        .await
        .map_err(e2s)?;
    ensure_eq(r, None, "AllNew of a remove-only update on an absent item")?;
    ensure_eq(get(s, &k).await?, None, "nothing created")
}

/// Two actions on one attribute are a validation error, and nothing is written.
pub async fn two_actions_one_attribute_is_validation(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/two_actions", "#STATE");
    let r = update(
        s,
        &k,
        Update::new().set("a", 1).add("a", 2),
        None,
        ReturnValues::None,
    )
    .await;
    expect_validation(r, "SET a, ADD a")?;
    ensure_eq(get(s, &k).await?, None, "nothing created")?;
    put(s, &k, &[("a", Value::N(1))]).await?;
    let r = update(
        s,
        &k,
        Update::new().set("b", 1).remove("a").set("a", 3),
        None,
        ReturnValues::None,
    )
    .await;
    expect_validation(r, "REMOVE a, SET a")?;
    ensure_eq(
        get(s, &k).await?,
        Some(stored(&k, &[("a", Value::N(1))])),
        "item unchanged",
    )
}

/// Updating `PK` or `SK` is a validation error.
pub async fn key_attribute_update_is_validation(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/key_update", "#STATE");
    put(s, &k, &[("a", Value::N(1))]).await?;
    let r = update(
        s,
        &k,
        Update::new().set("PK", "other"),
        None,
        ReturnValues::None,
    )
    .await;
    expect_validation(r, "SET PK")?;
    let r = update(s, &k, Update::new().remove("SK"), None, ReturnValues::None).await;
    expect_validation(r, "REMOVE SK")?;
    ensure_eq(
        get(s, &k).await?,
        Some(stored(&k, &[("a", Value::N(1))])),
        "item unchanged",
    )
}

/// An unconditional update of an absent item creates it, with its key attributes.
pub async fn update_creates_missing_item(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/update_creates", "#STATE");
    let r = update(
        s,
        &k,
        Update::new().set("a", 1).add("n", 3),
        None,
        ReturnValues::None,
    )
    .await
    .map_err(e2s)?;
    ensure_eq(r, None, "ReturnValues::None")?;
    ensure_eq(
        get(s, &k).await?,
        Some(stored(&k, &[("a", Value::N(1)), ("n", Value::N(3))])),
        "created item",
    )
}

/// `ReturnValues` `None`, `AllNew`, `AllOld` and `UpdatedNew` (only the written attributes).
pub async fn return_values(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/return_values", "#STATE");
    // AllOld of a created item: nothing.
    let r = update(
        s,
        &k,
        Update::new().set("a", 1).set("b", 2),
        None,
        ReturnValues::AllOld,
    )
    .await
    .map_err(e2s)?;
    ensure_eq(r, None, "AllOld on create")?;
    let r = update(s, &k, Update::new().add("a", 1), None, ReturnValues::AllOld)
        .await
        .map_err(e2s)?;
    ensure_eq(
        r,
        Some(stored(&k, &[("a", Value::N(1)), ("b", Value::N(2))])),
        "AllOld",
    )?;
    let r = update(s, &k, Update::new().add("a", 1), None, ReturnValues::AllNew)
        .await
        .map_err(e2s)?;
    ensure_eq(
        r,
        Some(stored(&k, &[("a", Value::N(3)), ("b", Value::N(2))])),
        "AllNew",
    )?;
    let r = update(
        s,
        &k,
        Update::new().add("a", 1).set("c", "x").remove("b"),
        None,
        ReturnValues::UpdatedNew,
    )
    .await
    .map_err(e2s)?;
    ensure_eq(
        r,
        Some(attrs(&[("a", Value::N(4)), ("c", Value::S("x".into()))])),
        "UpdatedNew",
    )?;
    let r = update(s, &k, Update::new().add("a", 1), None, ReturnValues::None)
        .await
        .map_err(e2s)?;
    ensure_eq(r, None, "None")
}

/// A failed update condition returns the old item and applies nothing.
pub async fn update_condition_failed_returns_old(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/update_cond_old", "#STATE");
    let before = [("n", Value::N(1)), ("rf", Value::N(1_800_000_000_000))];
    put(s, &k, &before).await?;
    let r = update(
        s,
        &k,
        Update::new().add("n", -5),
        Some(Condition::ge("n", 5).and(Condition::eq("rf", 1_800_000_000_000))),
        ReturnValues::AllNew,
    )
    .await;
    let want = stored(&k, &before);
    expect_condition_failed(r, Some(&want), "update")?;
    ensure_eq(get(s, &k).await?, Some(want), "item unchanged")
}

/// Static validation errors win over a failing condition.
pub async fn validation_before_condition(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/validation_first", "#STATE");
    let r = update(
        s,
        &k,
        Update::new().set("a", 1).set("a", 2),
        Some(Condition::exists("PK")),
        ReturnValues::None,
    )
    .await;
    expect_validation(r, "overlapping paths with a false condition")
}

// ---------------------------------------------------------------------------------------
// Deletes
// ---------------------------------------------------------------------------------------

/// Delete returns the old item (`None` when absent).
pub async fn delete_returns_old(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/delete", "#STATE");
    put(s, &k, &[("a", Value::N(1))]).await?;
    let old = s
        .delete(DeleteRequest {
            key: k.clone(),
            condition: Some(Condition::exists("PK")),
        })
        .await
        .map_err(e2s)?;
    ensure_eq(old, Some(stored(&k, &[("a", Value::N(1))])), "deleted item")?;
    ensure_eq(get(s, &k).await?, None, "gone")?;
    let again = s
        .delete(DeleteRequest {
            key: k.clone(),
            condition: None,
        })
        .await
        .map_err(e2s)?;
    ensure_eq(again, None, "delete of an absent item")
}

/// A failed delete condition returns the old item and keeps it.
pub async fn conditional_delete_failure_returns_old(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/delete_cond", "#STATE");
    put(s, &k, &[("a", Value::N(1))]).await?;
    let want = stored(&k, &[("a", Value::N(1))]);
    let r = s
        .delete(DeleteRequest {
            key: k.clone(),
            condition: Some(Condition::eq("a", 2)),
        })
        .await;
    expect_condition_failed(r, Some(&want), "delete")?;
    ensure_eq(get(s, &k).await?, Some(want), "kept")
}

// ---------------------------------------------------------------------------------------
// Transactions
// ---------------------------------------------------------------------------------------

/// One failed condition cancels every operation; reasons come in request order.
pub async fn transaction_all_or_nothing(s: &dyn Store) -> CheckResult {
    let (a, b, c) = (
        Key::new("conf/tx_aon", "A"),
        Key::new("conf/tx_aon", "B"),
        Key::new("conf/tx_aon", "C"),
    );
    put(s, &b, &[("n", Value::N(1))]).await?;
    let ops = vec![
        put_op(&a, &[("x", Value::N(1))], Some(Condition::not_exists("PK"))),
        update_op(&b, Update::new().add("n", -1), Some(Condition::ge("n", 2))),
        update_op(&c, Update::new().add("n", 1), None),
    ];
    let reasons = expect_canceled(s.transact_write(ops, None).await, "transaction")?;
    ensure_eq(
        reasons,
        vec![
            CancelReason::None,
            CancelReason::ConditionFailed {
                old: Some(stored(&b, &[("n", Value::N(1))])),
            },
            CancelReason::None,
        ],
        "cancellation reasons",
    )?;
    ensure_eq(get(s, &a).await?, None, "A not written")?;
    ensure_eq(
        get(s, &b).await?,
        Some(stored(&b, &[("n", Value::N(1))])),
        "B unchanged",
    )?;
    ensure_eq(get(s, &c).await?, None, "C not written")?;
    // The same transaction with a passing condition applies everything.
    let ops = vec![
        put_op(&a, &[("x", Value::N(1))], Some(Condition::not_exists("PK"))),
        update_op(&b, Update::new().add("n", -1), Some(Condition::ge("n", 1))),
        TransactOp::Delete(DeleteRequest {
            key: c.clone(),
            condition: None,
        }),
    ];
    s.transact_write(ops, None).await.map_err(e2s)?;
    ensure_eq(
        get(s, &a).await?,
        Some(stored(&a, &[("x", Value::N(1))])),
        "A written",
    )?;
    ensure_eq(
        get(s, &b).await?,
        Some(stored(&b, &[("n", Value::N(0))])),
        "B written",
    )
}

/// `Check` operations gate a transaction without writing their item.
pub async fn transaction_check_ops(s: &dyn Store) -> CheckResult {
    let (g, w) = (
        Key::new("conf/tx_check", "G"),
        Key::new("conf/tx_check", "W"),
    );
    let ops = |cond: Condition| {
        vec![
            TransactOp::Check {
                key: g.clone(),
                condition: cond,
            },
            update_op(&w, Update::new().add("n", 1), None),
        ]
    };
    let reasons = expect_canceled(
        s.transact_write(ops(Condition::exists("PK")), None).await,
        "check on absent item",
    )?;
    ensure_eq(
        reasons,
        vec![
            CancelReason::ConditionFailed { old: None },
            CancelReason::None,
        ],
        "reasons",
    )?;
    ensure_eq(get(s, &w).await?, None, "W not written")?;
    put(s, &g, &[("open", Value::Bool(true))]).await?;
    s.transact_write(ops(Condition::eq("open", true)), None)
        .await
        .map_err(e2s)?;
    ensure_eq(
        get(s, &w).await?,
        Some(stored(&w, &[("n", Value::N(1))])),
        "W written",
    )?;
    ensure_eq(
        get(s, &g).await?,
        Some(stored(&g, &[("open", Value::Bool(true))])),
        "G untouched",
    )
}

/// One key twice in a transaction is a validation error.
pub async fn transaction_same_key_twice_is_validation(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/tx_twice", "#STATE");
    let ops = vec![
        update_op(&k, Update::new().add("n", 1), None),
        TransactOp::Check {
            key: k.clone(),
            condition: Condition::not_exists("PK"),
        },
    ];
    expect_validation(s.transact_write(ops, None).await, "same key twice")?;
    ensure_eq(get(s, &k).await?, None, "nothing written")
}

/// A transaction holds 1 to 100 operations.
pub async fn transaction_size_limits(s: &dyn Store) -> CheckResult {
    let ops = |n: usize| -> Vec<TransactOp> {
        (0..n)
            .map(|i| {
                update_op(
                    &Key::new("conf/tx_size", format!("ITEM#{i:03}")),
                    Update::new().add("n", 1),
                    None,
                )
            })
            .collect()
    };
    expect_validation(
        s.transact_write(ops(MAX_TRANSACT_OPS + 1), None).await,
        "101 operations",
    )?;
    expect_validation(s.transact_write(vec![], None).await, "0 operations")?;
    let first = Key::new("conf/tx_size", "ITEM#000");
    ensure_eq(get(s, &first).await?, None, "nothing written")?;
    s.transact_write(ops(MAX_TRANSACT_OPS), None)
        .await
        .map_err(e2s)?;
    let last = Key::new("conf/tx_size", format!("ITEM#{:03}", MAX_TRANSACT_OPS - 1));
    ensure_eq(
        get(s, &last).await?,
        Some(stored(&last, &[("n", Value::N(1))])),
        "100 operations applied",
    )
}

/// A resent transaction with the same token succeeds without applying twice.
pub async fn transaction_idempotency_token(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/tx_token", "#STATE");
    let ops = || vec![update_op(&k, Update::new().add("n", 1), None)];
    // Unique per run: DynamoDB remembers tokens for 10 minutes across tables.
    let token = format!("conf-token-{:016x}", rand::random::<u64>());
    s.transact_write(ops(), Some(token.clone()))
        .await
        .map_err(e2s)?;
    s.transact_write(ops(), Some(token.clone()))
        .await
        .map_err(e2s)?;
    ensure_eq(
        get(s, &k).await?,
        Some(stored(&k, &[("n", Value::N(1))])),
        "applied once",
    )?;
    s.transact_write(ops(), None).await.map_err(e2s)?;
    ensure_eq(
        get(s, &k).await?,
        Some(stored(&k, &[("n", Value::N(2))])),
        "no token: applied again",
    )
}

/// An update in a transaction creates an absent item with its key attributes.
pub async fn transaction_update_creates_item(s: &dyn Store) -> CheckResult {
    let (a, b) = (
        Key::new("conf/tx_create", "A"),
        Key::new("conf/tx_create", "B"),
    );
    let ops = vec![
        update_op(
            &a,
            Update::new()
                .set("v", "x")
                .set_expr("n", SetValue::IfNotExists("n".into(), Value::N(7))),
            Some(Condition::not_exists("PK")),
        ),
        update_op(&b, Update::new().add("n", 2), None),
    ];
    s.transact_write(ops, None).await.map_err(e2s)?;
    ensure_eq(
        get(s, &a).await?,
        Some(stored(
            &a,
            &[("v", Value::S("x".into())), ("n", Value::N(7))],
        )),
        "A created",
    )?;
    ensure_eq(
        get(s, &b).await?,
        Some(stored(&b, &[("n", Value::N(2))])),
        "B created",
    )
}

/// An update that cannot be evaluated on its item fails the whole transaction: either a
/// cancellation with a validation reason at its position, or (as DynamoDB Local answers) a
/// plain validation error. Nothing is written either way.
pub async fn transaction_validation_reason(s: &dyn Store) -> CheckResult {
    let (a, b) = (
        Key::new("conf/tx_valid", "A"),
        Key::new("conf/tx_valid", "B"),
    );
    put(s, &b, &[("x", Value::N(1))]).await?;
    let ops = vec![
        update_op(&a, Update::new().add("n", 1), None),
        update_op(
            &b,
            Update::new().set_expr("y", SetValue::Path("missing".into())),
            None,
        ),
    ];
    match s.transact_write(ops, None).await {
        Err(StoreError::Validation(_)) => {}
        r => {
            let reasons = expect_canceled(r, "transaction")?;
            ensure(
                reasons.len() == 2
                    && reasons[0] == CancelReason::None
                    && matches!(reasons[1], CancelReason::Validation(_)),
                format!("reasons: {reasons:?}"),
            )?;
        }
    }
    ensure_eq(get(s, &a).await?, None, "A not written")
}

// ---------------------------------------------------------------------------------------
// Reads
// ---------------------------------------------------------------------------------------

/// Keys `C`, `A`, `MISSING`, `B` of partition `pk`, in that order, each but `MISSING`
/// stored with `i` = its position in the list.
async fn batch_fixture(s: &dyn Store, pk: &str) -> Result<Vec<Key>, String> {
    let keys: Vec<Key> = ["C", "A", "MISSING", "B"]
        .iter()
        .map(|sk| Key::new(pk, *sk))
        .collect();
    for (i, k) in keys.iter().enumerate() {
        if &*k.sk != "MISSING" {
            put(s, k, &[("i", Value::N(i as i64))]).await?;
        }
    }
    Ok(keys)
}

/// `batch_get` answers in key order, `None` for absent items.
pub async fn batch_get_in_key_order(s: &dyn Store) -> CheckResult {
    let keys = batch_fixture(s, "conf/batch").await?;
    let got = s.batch_get(&keys, true).await.map_err(e2s)?;
    let want: Vec<Option<Item>> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (&*k.sk != "MISSING").then(|| stored(k, &[("i", Value::N(i as i64))])))
        .collect();
    ensure_eq(got, want, "batch_get")?;
    let none = s.batch_get(&[], true).await.map_err(e2s)?;
    ensure_eq(none, vec![], "empty batch_get")
}

/// `batch_get` with a key twice is a validation error.
pub async fn batch_get_duplicate_keys_is_validation(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/batch_dup", "A");
    put(s, &k, &[("a", Value::N(1))]).await?;
    expect_validation(
        s.batch_get(&[k.clone(), k.clone()], true).await,
        "duplicate keys",
    )
}

/// `batch_get_shared` is `batch_get` — the same one request, the same items in key order,
/// the same validation of the keys (a key twice, among a few keys or among many) — and an
/// item it handed out stays as read when the store then writes that item.
pub async fn batch_get_shared_answers_as_batch_get(s: &dyn Store) -> CheckResult {
    let keys = batch_fixture(s, "conf/batch_shared").await?;
    let owned = s.batch_get(&keys, true).await.map_err(e2s)?;
    let shared = s.batch_get_shared(&keys, true).await.map_err(e2s)?;
    let seen: Vec<Option<Item>> = shared.iter().map(|i| i.as_deref().cloned()).collect();
    ensure_eq(seen, owned.clone(), "batch_get_shared vs batch_get")?;
    ensure_eq(
        owned[1].clone(),
        Some(stored(&keys[1], &[("i", Value::N(1))])),
        "batch_get_shared's item",
    )?;
    update(
        s,
        &keys[1],
        Update::new().add("i", 10),
        None,
        ReturnValues::None,
    )
    .await
    .map_err(e2s)?;
    ensure_eq(
        shared[1].as_deref().cloned(),
        owned[1].clone(),
        "an item read shared, after the store wrote it again",
    )?;
    ensure_eq(
        get(s, &keys[1]).await?,
        Some(stored(&keys[1], &[("i", Value::N(11))])),
        "the item written after the shared read",
    )?;
    let none = s.batch_get_shared(&[], true).await.map_err(e2s)?;
    ensure(none.is_empty(), "empty batch_get_shared")?;
    let twice = [keys[0].clone(), keys[0].clone()];
    expect_validation(
        s.batch_get_shared(&twice, true).await,
        "duplicate keys (shared)",
    )?;
    let mut many: Vec<Key> = (0..40)
        .map(|i| Key::new("conf/batch_shared_many", format!("K{i:02}")))
        .collect();
    many.push(many[7].clone());
    expect_validation(s.batch_get(&many, true).await, "a duplicate among 41 keys")?;
    expect_validation(
        s.batch_get_shared(&many, true).await,
        "a duplicate among 41 keys (shared)",
    )
}

/// A table query returns one partition, filtered by sort-key prefix, in sort-key
/// (byte) order.
pub async fn query_table_prefix_in_order(s: &dyn Store) -> CheckResult {
    let pk = "conf/query";
    for sk in ["#LIMIT#b", "#LIMIT#10", "#LIMIT#9", "#STATE", "#LIMIT#a"] {
        put(s, &Key::new(pk, sk), &[("v", Value::S(sk.into()))]).await?;
    }
    put(s, &Key::new("conf/query-other", "#LIMIT#a"), &[]).await?;
    put(s, &Key::new("conf/quer", "#LIMIT#a"), &[]).await?;
    let mut q = Query::table(pk, Some("#LIMIT#"));
    q.consistent = true;
    let got: Vec<String> = s
        .query(q)
        .await
        .map_err(e2s)?
        .iter()
        .filter_map(|i| Key::of(i).map(|k| format!("{}|{}", k.pk, k.sk)))
        .collect();
    let want: Vec<String> = ["#LIMIT#10", "#LIMIT#9", "#LIMIT#a", "#LIMIT#b"]
        .iter()
        .map(|sk| format!("{pk}|{sk}"))
        .collect();
    ensure_eq(got, want, "query with prefix")?;
    let mut q = Query::table(pk, None);
    q.consistent = true;
    let all = s.query(q).await.map_err(e2s)?;
    ensure_eq(all.len(), 5, "query without prefix")?;
    let mut q = Query::table("conf/query-nobody", None);
    q.consistent = true;
    ensure_eq(s.query(q).await.map_err(e2s)?, vec![], "empty partition")
}

/// Every item under `prefix`, page by page (`limit` per page), as `pk|sk` strings, sorted;
/// an undecodable entry or a page loop that does not end is an error.
async fn scan_all(s: &dyn Store, prefix: &str, limit: usize) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut after = None;
    for _ in 0..100 {
        let page = s.scan(prefix, after, limit).await.map_err(e2s)?;
        ensure(
            page.items.len() <= limit,
            format!("page of {} > {limit}", page.items.len()),
        )?;
        for e in page.items {
            let i = e.map_err(|u| format!("undecodable entry {u}"))?;
            let k = Key::of(&i).ok_or("scanned item without PK/SK")?;
            out.push(format!("{}|{}", k.pk, k.sk));
        }
        match page.next {
            Some(k) => after = Some(k),
            None => {
                out.sort();
                return Ok(out);
            }
        }
    }
    Err(format!("scan of {prefix:?} did not end in 100 pages"))
}

/// `scan` returns every item whose partition key begins with the prefix, each once, over
/// pages of at most `limit`; `purge` deletes one unconditionally (an absent one is no error).
pub async fn scan_prefix_in_pages_and_purge(s: &dyn Store) -> CheckResult {
    let mut want = Vec::new();
    for (pk, sk) in [
        ("conf/scan/a", "#META"),
        ("conf/scan/a", "#CONFIG#x"),
        ("conf/scan/a", "#CONFIG#y"),
        ("conf/scan/b", "#STATE"),
        ("conf/scan/c", "#STATE"),
    ] {
        put(s, &Key::new(pk, sk), &[("v", Value::N(1))]).await?;
        want.push(format!("{pk}|{sk}"));
    }
    put(s, &Key::new("conf/scanx", "#STATE"), &[]).await?;
    put(s, &Key::new("conf/sca", "#STATE"), &[]).await?;
    want.sort();
    ensure_eq(
        scan_all(s, "conf/scan/", 2).await?,
        want.clone(),
        "scan in pages of 2",
    )?;
    ensure_eq(
        scan_all(s, "conf/scan/", 100).await?,
        want.clone(),
        "scan in one page",
    )?;
    ensure_eq(
        scan_all(s, "conf/scan/a", 100).await?,
        want[..3].to_vec(),
        "scan of one partition",
    )?;
    ensure_eq(
        scan_all(s, "conf/scan-nobody", 10).await?,
        vec![],
        "empty scan",
    )?;
    s.purge(&Key::new("conf/scan/a", "#CONFIG#x"))
        .await
        .map_err(e2s)?;
    s.purge(&Key::new("conf/scan/z", "#STATE"))
        .await
        .map_err(|e| format!("purge of an absent item: {e:?}"))?;
    ensure_eq(
        get(s, &Key::new("conf/scan/a", "#CONFIG#x")).await?,
        None,
        "purged item",
    )?;
    want.retain(|k| k != "conf/scan/a|#CONFIG#x");
    ensure_eq(
        scan_all(s, "conf/scan/", 3).await?,
        want,
        "scan after a purge",
    )
}

/// An index query (`GSI1`: `GSI1PK` / `GSI1SK`) returns the items that carry both index
/// attributes, in index sort-key order; others are not in the index.
pub async fn query_index(s: &dyn Store) -> CheckResult {
    let gpk = "conf/gsi-parent";
    let items = [
        ("conf/gsi/e1", Some(gpk), Some("CHILD#b")),
        ("conf/gsi/e2", Some(gpk), Some("CHILD#a")),
        ("conf/gsi/e3", Some(gpk), Some("OTHER#c")),
        ("conf/gsi/e4", Some(gpk), None),
        ("conf/gsi/e5", None, Some("CHILD#c")),
        ("conf/gsi/e6", Some("conf/gsi-elsewhere"), Some("CHILD#d")),
    ];
    for (pk, g1pk, g1sk) in items {
        let mut pairs = vec![("x", Value::N(1))];
        if let Some(v) = g1pk {
            pairs.push(("GSI1PK", Value::S(v.into())));
        }
        if let Some(v) = g1sk {
            pairs.push(("GSI1SK", Value::S(v.into())));
        }
        put(s, &Key::new(pk, "#STATE"), &pairs).await?;
    }
    let pks = |items: &[Item]| -> Vec<String> {
        items
            .iter()
            .filter_map(|i| Key::of(i).map(|k| k.pk.to_string()))
            .collect()
    };
    let got = query_index_until(s, Query::index("GSI1", gpk, Some("CHILD#")), 2).await?;
    ensure_eq(
        pks(&got),
        vec!["conf/gsi/e2".to_string(), "conf/gsi/e1".to_string()],
        "index query with prefix",
    )?;
    ensure(
        got.first().and_then(|i| i.get("x")) == Some(&Value::N(1)),
        "index query returns whole items",
    )?;
    let all = query_index_until(s, Query::index("GSI1", gpk, None), 3).await?;
    ensure_eq(
        pks(&all),
        vec![
            "conf/gsi/e2".to_string(),
            "conf/gsi/e1".to_string(),
            "conf/gsi/e3".to_string(),
        ],
        "index query without prefix",
    )
}

/// Updates move an item into an index, along it and out of it; an update that leaves the
/// index attributes alone keeps the item where it is, with its new attributes.
pub async fn update_moves_item_in_index(s: &dyn Store) -> CheckResult {
    let gpk = "conf/gsi-moves";
    let (a, b) = (
        Key::new("conf/gsi-moves/a", "#STATE"),
        Key::new("conf/gsi-moves/b", "#STATE"),
    );
    put(s, &a, &[("x", Value::N(1))]).await?;
    put(
        s,
        &b,
        &[
            ("x", Value::N(1)),
            ("GSI1PK", Value::S(gpk.into())),
            ("GSI1SK", Value::S("m".into())),
        ],
    )
    .await?;
    let pks = |items: &[Item]| -> Vec<String> {
        items
            .iter()
            .filter_map(|i| Key::of(i).map(|k| k.pk.to_string()))
            .collect()
    };
    let q = || Query::index("GSI1", gpk, None);
    ensure_eq(
        pks(&query_index_until(s, q(), 1).await?),
        vec![b.pk.to_string()],
        "only b is in the index",
    )?;
    // Into the index, before b.
    update(
        s,
        &a,
        Update::new().set("GSI1PK", gpk).set("GSI1SK", "a"),
        None,
        ReturnValues::None,
    )
    .await
    .map_err(e2s)?;
    ensure_eq(
        pks(&query_index_until(s, q(), 2).await?),
        vec![a.pk.to_string(), b.pk.to_string()],
        "an update that sets the index attributes puts the item in the index",
    )?;
    // Along it: a's sort key now after b's.
    update(
        s,
        &a,
        Update::new().set("GSI1SK", "z"),
        None,
        ReturnValues::None,
    )
    .await
    .map_err(e2s)?;
    // Not the index attributes: b stays, with its new x.
    update(s, &b, Update::new().add("x", 41), None, ReturnValues::None)
        .await
        .map_err(e2s)?;
    let mut got = Vec::new();
    for _ in 0..40 {
        got = query_index_until(s, q(), 2).await?;
        let b_x = got
            .iter()
            .find(|i| Key::of(i).as_ref() == Some(&b))
            .and_then(|i| i.get("x"));
        if pks(&got) == vec![b.pk.to_string(), a.pk.to_string()] && b_x == Some(&Value::N(42)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure_eq(
        pks(&got),
        vec![b.pk.to_string(), a.pk.to_string()],
        "an update of the sort key moves the item along the index",
    )?;
    ensure(
        got.iter()
            .find(|i| Key::of(i).as_ref() == Some(&b))
            .and_then(|i| i.get("x"))
            == Some(&Value::N(42)),
        "an update of other attributes keeps the item in the index, updated",
    )?;
    // Out of it.
    update(
        s,
        &a,
        Update::new().remove("GSI1PK"),
        None,
        ReturnValues::None,
    )
    .await
    .map_err(e2s)?;
    ensure_eq(
        pks(&query_index_until(s, q(), 1).await?),
        vec![b.pk.to_string()],
        "an update that removes an index attribute takes the item out of the index",
    )
}

/// A consistent read sees the latest write, every time.
pub async fn consistent_get_sees_latest(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/consistent", "#STATE");
    for i in 0..10 {
        update(s, &k, Update::new().add("n", 1), None, ReturnValues::None)
            .await
            .map_err(e2s)?;
        let got = s.get(&k, true).await.map_err(e2s)?;
        ensure_eq(
            got.and_then(|i| i.get("n").cloned()),
            Some(Value::N(i + 1)),
            "consistent get",
        )?;
    }
    s.delete(DeleteRequest {
        key: k.clone(),
        condition: None,
    })
    .await
    .map_err(e2s)?;
    ensure_eq(s.get(&k, true).await.map_err(e2s)?, None, "after delete")
}

// ---------------------------------------------------------------------------------------
// Values and names
// ---------------------------------------------------------------------------------------

/// Large and negative `i64` values round-trip through puts, updates and conditions.
pub async fn large_numbers_round_trip(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/large", "#STATE");
    let vals = [
        ("ms", Value::N(1_800_000_000_000)),
        ("neg", Value::N(-1_800_000_000_123)),
        ("max", Value::N(i64::MAX)),
        ("min", Value::N(i64::MIN)),
        ("zero", Value::N(0)),
        ("milli", Value::N(9_007_199_254_740_993)),
    ];
    put(s, &k, &vals).await?;
    ensure_eq(get(s, &k).await?, Some(stored(&k, &vals)), "put round trip")?;
    expect_holds(s, &k, Condition::eq("milli", 9_007_199_254_740_993), true).await?;
    expect_holds(s, &k, Condition::gt("milli", 9_007_199_254_740_992), true).await?;
    expect_holds(s, &k, Condition::lt("neg", -1_800_000_000_122), true).await?;
    let new = update(
        s,
        &k,
        Update::new()
            .add("ms", 1)
            .add("neg", -1)
            .set("max2", i64::MAX - 1),
        Some(Condition::eq("ms", 1_800_000_000_000)),
        ReturnValues::UpdatedNew,
    )
    .await
    .map_err(e2s)?;
    ensure_eq(
        new,
        Some(attrs(&[
            ("ms", Value::N(1_800_000_000_001)),
            ("neg", Value::N(-1_800_000_000_124)),
            ("max2", Value::N(i64::MAX - 1)),
        ])),
        "update round trip",
    )
}

/// Attribute names with `-`, `.`, `#` and `:` are names, not paths or placeholders.
pub async fn odd_attribute_names(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/names", "#STATE");
    let tk = "b_gpt-4.o_tk";
    put(
        s,
        &k,
        &[(tk, Value::N(10)), ("gpt-4.o", Value::S("x".into()))],
    )
    .await?;
    expect_holds(s, &k, Condition::ge(tk, 10), true).await?;
    expect_holds(s, &k, Condition::exists("gpt-4.o"), true).await?;
    expect_holds(s, &k, Condition::exists("gpt-4"), false).await?;
    let new = update(
        s,
        &k,
        Update::new()
            .add(tk, -3)
            .set("rf.limit-1", 5)
            .set("a#b:c", "odd")
            .remove("gpt-4.o"),
        Some(Condition::gt(tk, 3).and(Condition::eq("gpt-4.o", "x"))),
        ReturnValues::AllNew,
    )
    .await
    .map_err(e2s)?
    .map(|mut i| {
        i.remove("probe_count");
        i
    });
    ensure_eq(
        new,
        Some(stored(
            &k,
            &[
                (tk, Value::N(7)),
                ("rf.limit-1", Value::N(5)),
                ("a#b:c", Value::S("odd".into())),
            ],
        )),
        "update with odd names",
    )
}

/// Maps, lists, booleans, `NULL` and string sets round-trip.
pub async fn map_list_null_round_trip(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/docs", "#STATE");
    let mut m = BTreeMap::new();
    m.insert("name".to_string(), Value::S("x".into()));
    m.insert("n".to_string(), Value::N(-3));
    m.insert(
        "inner".to_string(),
        Value::L(Box::new(vec![Value::Null, Value::Bool(false)])),
    );
    let vals = [
        ("m", Value::M(Box::new(m.clone()))),
        (
            "l",
            Value::L(Box::new(vec![
                Value::N(1),
                Value::S("two".into()),
                Value::M(Box::new(m)),
            ])),
        ),
        ("null", Value::Null),
        ("t", Value::Bool(true)),
        ("empty_s", Value::S(String::new())),
        ("empty_m", Value::M(Box::default())),
        ("empty_l", Value::L(Box::default())),
        ("set", ss(&["a", "b"])),
    ];
    put(s, &k, &vals).await?;
    ensure_eq(get(s, &k).await?, Some(stored(&k, &vals)), "put round trip")?;
    expect_holds(s, &k, Condition::eq("null", Value::Null), true).await?;
    expect_holds(s, &k, Condition::eq("t", true), true).await?;
    let new = update(
        s,
        &k,
        Update::new()
            .set("m2", Value::M(Box::default()))
            .set("null", Value::L(Box::new(vec![Value::Null]))),
        None,
        ReturnValues::UpdatedNew,
    )
    .await
    .map_err(e2s)?;
    ensure_eq(
        new,
        Some(attrs(&[
            ("m2", Value::M(Box::default())),
            ("null", Value::L(Box::new(vec![Value::Null]))),
        ])),
        "update with documents",
    )
}

/// Empty string sets cannot be stored (put, `SET`, `ADD`).
pub async fn empty_set_is_validation(s: &dyn Store) -> CheckResult {
    let k = Key::new("conf/empty_set", "#STATE");
    let empty = Value::Ss(Box::default());
    expect_validation(
        s.put(PutRequest {
            key: k.clone(),
            item: attrs(&[("s", empty.clone())]),
            condition: None,
        })
        .await,
        "put with an empty set",
    )?;
    expect_validation(
        update(
            s,
            &k,
            Update::new().set("s", empty.clone()),
            None,
            ReturnValues::None,
        )
        .await,
        "SET an empty set",
    )?;
    let mut up = Update::new();
    up.actions
        .push(tollgate_core::expr::Action::Add("s".into(), empty));
    expect_validation(
        update(s, &k, up, None, ReturnValues::None).await,
        "ADD an empty set",
    )?;
    ensure_eq(get(s, &k).await?, None, "nothing written")
}

// ---------------------------------------------------------------------------------------
// Concurrency
// ---------------------------------------------------------------------------------------

/// 20 concurrent workers × 60 conditional `ADD n -1 IF n >= 1` on `n = 1000`: exactly 1000
/// succeed and `n` ends at 0. Every refusal carries an old item with `n = 0`. Retryable
/// errors (conflict, throttling) are retried.
pub async fn concurrent_conditional_add(s: &dyn Store) -> CheckResult {
    const WORKERS: usize = 20;
    const ATTEMPTS: usize = 60;
    const START: i64 = 1000;
    let k = Key::new("conf/concurrent", "#STATE");
    put(s, &k, &[("n", Value::N(START))]).await?;
    let worker = |_w: usize| {
        let k = k.clone();
        async move {
            let mut ok = 0i64;
            for _ in 0..ATTEMPTS {
                let mut tries = 0;
                loop {
                    tokio::task::yield_now().await;
                    let r = update(
                        s,
                        &k,
                        Update::new().add("n", -1),
                        Some(Condition::ge("n", 1)),
                        ReturnValues::None,
                    )
                    .await;
                    match r {
                        Ok(_) => {
                            ok += 1;
                            break;
                        }
                        Err(StoreError::ConditionFailed { old }) => {
                            let n = old.as_ref().and_then(|i| i.get("n")).cloned();
                            if n != Some(Value::N(0)) {
                                return Err(format!("refused with n = {n:?}"));
                            }
                            break;
                        }
                        Err(e) if e.is_retryable() && tries < 100 => {
                            tries += 1;
                            tokio::time::sleep(Duration::from_millis(2)).await;
                        }
                        Err(e) => return Err(e2s(e)),
                    }
                }
            }
            Ok::<i64, String>(ok)
        }
    };
    let results = join_all((0..WORKERS).map(worker).collect()).await;
    let mut total = 0;
    for r in results {
        total += r?;
    }
    ensure_eq(total, START, "successful decrements")?;
    ensure_eq(
        get(s, &k).await?.and_then(|i| i.get("n").cloned()),
        Some(Value::N(0)),
        "final n",
    )
}

// ---------------------------------------------------------------------------------------
// Registry and runners
// ---------------------------------------------------------------------------------------

macro_rules! registry {
    ($($name:ident),* $(,)?) => {
        /// Every check of the suite, in a stable order.
        pub fn checks() -> Vec<Check> {
            vec![$(
                Check {
                    name: stringify!($name),
                    run: {
                        fn run(s: &dyn Store) -> CheckFuture<'_> {
                            Box::pin($name(s))
                        }
                        run
                    },
                }
            ),*]
        }
    };
}

registry![
    put_if_absent,
    condition_failed_on_absent_item,
    put_replaces_whole_item,
    missing_attribute_compares_false,
    cross_type_compares,
    string_ordering,
    number_ordering,
    boolean_logic,
    attribute_operand,
    set_value_and_path,
    set_missing_path_is_validation,
    set_if_not_exists,
    set_plus_minus,
    add_number_starts_at_zero,
    add_string_set_union,
    add_type_mismatch_is_validation,
    remove_attribute,
    remove_only_update_does_not_create,
    two_actions_one_attribute_is_validation,
    key_attribute_update_is_validation,
    update_creates_missing_item,
    return_values,
    update_condition_failed_returns_old,
    validation_before_condition,
    delete_returns_old,
    conditional_delete_failure_returns_old,
    transaction_all_or_nothing,
    transaction_check_ops,
    transaction_same_key_twice_is_validation,
    transaction_size_limits,
    transaction_idempotency_token,
    transaction_update_creates_item,
    transaction_validation_reason,
    batch_get_in_key_order,
    batch_get_duplicate_keys_is_validation,
    batch_get_shared_answers_as_batch_get,
    query_table_prefix_in_order,
    query_index,
    update_moves_item_in_index,
    scan_prefix_in_pages_and_purge,
    consistent_get_sees_latest,
    large_numbers_round_trip,
    odd_attribute_names,
    map_list_null_round_trip,
    empty_set_is_validation,
    concurrent_conditional_add,
];

/// Every check, by name, each on a fresh store from `make`.
pub async fn run_all(make: &dyn Fn() -> Box<dyn Store>) -> Vec<(&'static str, CheckResult)> {
    let mut out = Vec::new();
    for c in checks() {
        let store = make();
        out.push((c.name, (c.run)(store.as_ref()).await));
    }
    out
}

/// Every check, by name, each on a fresh store from an async factory (a backend that
/// creates a table per store, say).
pub async fn run_all_with<F, Fut>(mut make: F) -> Vec<(&'static str, CheckResult)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Box<dyn Store>>,
{
    let mut out = Vec::new();
    for c in checks() {
        let store = make().await;
        out.push((c.name, (c.run)(store.as_ref()).await));
    }
    out
}

/// `Ok` when every check passed; otherwise one line per failing check (`name: why`).
pub fn report(results: &[(&'static str, CheckResult)]) -> Result<(), String> {
    let failed: Vec<String> = results
        .iter()
        .filter_map(|(n, r)| r.as_ref().err().map(|e| format!("  {n}: {e}")))
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} of {} conformance checks failed:\n{}",
            failed.len(),
            results.len(),
            failed.join("\n")
        ))
    }
}

/// One `#[tokio::test]` named `$name` that runs every conformance check, each on a fresh
/// store from the `async` block `$make` (evaluated once per check), and fails listing every
/// failing check. The calling crate needs `tokio` (with `macros` and `rt-multi-thread`) as a
/// dev-dependency.
///
/// ```ignore
/// tollgate_store::conformance_tests!(memory_store_conforms, async {
///     tollgate_store::MemoryStore::new()
/// });
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($name:ident, $make:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let results = $crate::conformance::run_all_with(|| async {
                let store: ::std::boxed::Box<dyn $crate::Store> =
                    ::std::boxed::Box::new($make.await);
                store
            })
            .await;
            if let ::std::result::Result::Err(msg) = $crate::conformance::report(&results) {
                panic!("{msg}");
            }
        }
    };
}
