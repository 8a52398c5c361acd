//! The conformance suite every backend must pass. Each check takes a fresh, empty store.
//!
//! Backends run it with [`run_all`] from an async test.

use tollgate_core::expr::{Condition, ReturnValues, Update};
use tollgate_core::value::{Item, Key, Value};

use crate::{PutRequest, Store, StoreError, UpdateRequest};

fn check(ok: bool, what: &str) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what.to_string())
    }
}

/// Conditional put and ADD on a missing attribute.
pub async fn put_and_add(s: &dyn Store) -> Result<(), String> {
    let k = Key::new("conf/put", "#STATE");
    let mut item = Item::new();
    item.insert("n".into(), Value::N(5));
    s.put(PutRequest {
        key: k.clone(),
        item: item.clone(),
        condition: Some(Condition::not_exists("PK")),
    })
    .await
    .map_err(|e| e.to_string())?;
    let again = s
        .put(PutRequest {
            key: k.clone(),
            item,
            condition: Some(Condition::not_exists("PK")),
        })
        .await;
    check(
        matches!(again, Err(StoreError::ConditionFailed { old: Some(_) })),
        "second put must fail with the old item",
    )?;
    let new = s
        .update(UpdateRequest {
            key: k.clone(),
            update: Update::new().add("n", -2).add("m", 7),
            condition: Some(Condition::ge("n", 2)),
            returns: ReturnValues::AllNew,
        })
        .await
        .map_err(|e| e.to_string())?
        .ok_or("AllNew returned nothing")?;
    check(new.get("n") == Some(&Value::N(3)), "n = 3 after ADD -2")?;
    check(new.get("m") == Some(&Value::N(7)), "ADD on missing starts at 0")
}

/// Every check, by name.
pub async fn run_all(make: &dyn Fn() -> Box<dyn Store>) -> Vec<(&'static str, Result<(), String>)> {
    let mut out = Vec::new();
    out.push(("put_and_add", put_and_add(make().as_ref()).await));
    out
}
