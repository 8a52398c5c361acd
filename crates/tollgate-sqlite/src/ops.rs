//! The blocking operations, one SQLite transaction each. Conditions and updates are evaluated
//! in Rust with [`tollgate_store::eval`] between reading the old row and writing the new one,
//! inside `BEGIN IMMEDIATE`, so the semantics are `MemoryStore`'s by construction and the
//! read-evaluate-write is atomic across connections and processes.

use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};
use serde::Serialize;
use tollgate_core::expr::{project, ReturnValues};
use tollgate_core::expr::{Condition, Update};
use tollgate_core::value::{Item, Key};
use tollgate_store::eval::{
    apply_update_stored, eval_condition, key_item, plan_transact_op, validate_item, validate_update,
};
use tollgate_store::{
    validate_token, validate_transaction, CancelReason, DeleteRequest, PutRequest, Query,
    StoreError, TransactOp, UpdateRequest,
};

use crate::error::{from_commit, from_sqlite};
use crate::schema::INDEXES;

/// Most keys in one `batch_get` (DynamoDB's limit, as `MemoryStore` enforces it).
const MAX_BATCH_GET: usize = 100;

fn begin_write(conn: &mut Connection) -> Result<Transaction<'_>, StoreError> {
    conn.transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| from_sqlite("begin immediate", e))
}

/// Decode a stored item; anything but valid JSON of an item is [`StoreError::Corrupt`].
fn decode(key: &Key, raw: ValueRef<'_>) -> Result<Item, StoreError> {
    let bytes = match raw {
        ValueRef::Text(b) | ValueRef::Blob(b) => b,
        other => {
            return Err(StoreError::Corrupt(format!(
                "item {key}: stored value is {:?}, not JSON text",
                other.data_type()
            )))
        }
    };
    serde_json::from_slice(bytes)
        .map_err(|e| StoreError::Corrupt(format!("item {key}: undecodable JSON: {e}")))
}

fn encode(key: &Key, item: &Item) -> Result<String, StoreError> {
    serde_json::to_string(item)
        .map_err(|e| StoreError::Validation(format!("item {key} cannot be encoded: {e}")))
}

/// Read one item within the connection's current transaction (or autocommit).
fn read_item(conn: &Connection, key: &Key) -> Result<Option<Item>, StoreError> {
    let mut stmt = conn
        .prepare_cached("SELECT item FROM items WHERE pk = ?1 AND sk = ?2")
        .map_err(|e| from_sqlite("prepare read", e))?;
    let mut rows = stmt
        .query(params![key.pk, key.sk])
        .map_err(|e| from_sqlite("read", e))?;
    match rows.next().map_err(|e| from_sqlite("read", e))? {
        None => Ok(None),
        Some(row) => {
            let raw = row.get_ref(0).map_err(|e| from_sqlite("read", e))?;
            decode(key, raw).map(Some)
        }
    }
}

/// Write (`Some`) or delete (`None`) one item, refreshing its index columns.
fn write_item(conn: &Connection, key: &Key, item: Option<&Item>) -> Result<(), StoreError> {
    let Some(item) = item else {
        conn.prepare_cached("DELETE FROM items WHERE pk = ?1 AND sk = ?2")
            .and_then(|mut s| s.execute(params![key.pk, key.sk]))
            .map_err(|e| from_sqlite("delete", e))?;
        return Ok(());
    };
    debug_assert_eq!(
        Key::of(item).as_ref(),
        Some(key),
        "items are stamped before writing"
    );
    let json = encode(key, item)?;
    let col = |ix: &str, part: &str| {
        item.get(&format!("{ix}{part}"))
            .and_then(|v| v.as_s())
            .map(str::to_string)
    };
    let [g1, g2, g3, g4] = INDEXES;
    conn.prepare_cached(
        "INSERT OR REPLACE INTO items
            (pk, sk, item, gsi1pk, gsi1sk, gsi2pk, gsi2sk, gsi3pk, gsi3sk, gsi4pk, gsi4sk)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    )
    .and_then(|mut s| {
        s.execute(params![
            key.pk,
            key.sk,
            json,
            col(g1, "PK"),
            col(g1, "SK"),
            col(g2, "PK"),
            col(g2, "SK"),
            col(g3, "PK"),
            col(g3, "SK"),
            col(g4, "PK"),
            col(g4, "SK"),
        ])
    })
    .map_err(|e| from_sqlite("write", e))?;
    Ok(())
}

/// `get`.
pub fn get(conn: &mut Connection, key: &Key) -> Result<Option<Item>, StoreError> {
    read_item(conn, key)
}

/// `batch_get`: every key read from one snapshot (one deferred read transaction).
pub fn batch_get(conn: &mut Connection, keys: &[Key]) -> Result<Vec<Option<Item>>, StoreError> {
    if keys.len() > MAX_BATCH_GET {
        return Err(StoreError::Validation(format!(
            "a batch read holds at most {MAX_BATCH_GET} keys"
        )));
    }
    let mut seen = std::collections::BTreeSet::new();
    if let Some(dup) = keys.iter().find(|k| !seen.insert(*k)) {
        return Err(StoreError::Validation(format!(
            "provided list of item keys contains duplicates: {dup}"
        )));
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Deferred)
        .map_err(|e| from_sqlite("begin read", e))?;
    let out = keys
        .iter()
        .map(|k| read_item(&tx, k))
        .collect::<Result<Vec<_>, _>>()?;
    // A read transaction has nothing to make durable; finishing it only releases the snapshot.
    tx.finish().map_err(|e| from_sqlite("end read", e))?;
    Ok(out)
}

fn condition_failed(old: Option<Item>) -> StoreError {
    StoreError::ConditionFailed {
        old: old.map(Box::new),
    }
}

/// `put`.
pub fn put(conn: &mut Connection, req: PutRequest) -> Result<(), StoreError> {
    validate_item(&req.item)?;
    let tx = begin_write(conn)?;
    let cur = read_item(&tx, &req.key)?;
    if let Some(c) = &req.condition {
        if !eval_condition(cur.as_ref(), c) {
            return Err(condition_failed(cur));
        }
    }
    let mut item = req.item;
    req.key.stamp(&mut item);
    write_item(&tx, &req.key, Some(&item))?;
    tx.commit().map_err(from_commit)
}

/// `update`. Static checks fail the request before its condition is read (as DynamoDB
/// does); a remove-only update of an absent item creates nothing.
pub fn update(conn: &mut Connection, req: UpdateRequest) -> Result<Option<Item>, StoreError> {
    validate_update(&req.update)?;
    let tx = begin_write(conn)?;
    let cur = read_item(&tx, &req.key)?;
    if let Some(c) = &req.condition {
        if !eval_condition(cur.as_ref(), c) {
            return Err(condition_failed(cur));
        }
    }
    let new = apply_update_stored(cur.as_ref(), &key_item(&req.key), &req.update)?;
    match &new {
        Some(new) => {
            write_item(&tx, &req.key, Some(new))?;
            tx.commit().map_err(from_commit)?;
        }
        // Absent before and after: nothing to write, nothing to sync.
        None => tx.finish().map_err(|e| from_sqlite("end write", e))?,
    }
    Ok(match req.returns {
        ReturnValues::None => None,
        ReturnValues::AllNew => new,
        ReturnValues::AllOld => cur,
        ReturnValues::UpdatedNew => new.as_ref().and_then(|new| {
            let names: Vec<String> = req
                .update
                .actions
                .iter()
                .map(|a| a.target().to_string())
                .collect();
            // DynamoDB omits `Attributes` when nothing it wrote remains.
            Some(project(new, &names)).filter(|p| !p.is_empty())
        }),
    })
}

/// `delete`.
pub fn delete(conn: &mut Connection, req: DeleteRequest) -> Result<Option<Item>, StoreError> {
    let tx = begin_write(conn)?;
    let cur = read_item(&tx, &req.key)?;
    if let Some(c) = &req.condition {
        if !eval_condition(cur.as_ref(), c) {
            return Err(condition_failed(cur));
        }
    }
    if cur.is_none() {
        // Nothing to delete: end the (empty) write transaction without a commit to sync.
        tx.finish().map_err(|e| from_sqlite("end write", e))?;
        return Ok(None);
    }
    write_item(&tx, &req.key, None)?;
    tx.commit().map_err(from_commit)?;
    Ok(cur)
}

/// A transaction's operations as stored with its token, to tell a resend (same operations)
/// from a reuse of the token for other ones. JSON of a mirror of [`TransactOp`]; maps and sets
/// are ordered, so equal operations give equal text.
#[derive(Serialize)]
enum OpFingerprint<'a> {
    Put(&'a Key, &'a Item, Option<&'a Condition>),
    Update(&'a Key, &'a Update, Option<&'a Condition>, ReturnValues),
    Delete(&'a Key, Option<&'a Condition>),
    Check(&'a Key, &'a Condition),
}

fn fingerprint(ops: &[TransactOp]) -> Result<String, StoreError> {
    let mirror: Vec<OpFingerprint<'_>> = ops
        .iter()
        .map(|op| match op {
            TransactOp::Put(p) => OpFingerprint::Put(&p.key, &p.item, p.condition.as_ref()),
            TransactOp::Update(u) => {
                OpFingerprint::Update(&u.key, &u.update, u.condition.as_ref(), u.returns)
            }
            TransactOp::Delete(d) => OpFingerprint::Delete(&d.key, d.condition.as_ref()),
            TransactOp::Check { key, condition } => OpFingerprint::Check(key, condition),
        })
        .collect();
    serde_json::to_string(&mirror)
        .map_err(|e| StoreError::Validation(format!("transaction cannot be encoded: {e}")))
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// `transact_write`: validate, then in one `BEGIN IMMEDIATE` transaction check the token,
/// plan every operation against the state before the transaction, and either write all of
/// them (and the token) or nothing.
pub fn transact_write(
    conn: &mut Connection,
    ops: &[TransactOp],
    token: Option<&str>,
) -> Result<(), StoreError> {
    validate_transaction(ops)?;
    validate_token(token)?;
    let fingerprint = match token {
        Some(_) => Some(fingerprint(ops)?),
        None => None,
    };
    let tx = begin_write(conn)?;
    if let (Some(t), Some(fp)) = (token, &fingerprint) {
        let seen: Option<String> = tx
            .prepare_cached("SELECT ops FROM tokens WHERE token = ?1")
            .and_then(|mut s| s.query_row(params![t], |r| r.get(0)).optional())
            .map_err(|e| from_sqlite("read token", e))?;
        if let Some(seen) = seen {
            tx.finish().map_err(|e| from_sqlite("end write", e))?;
            // DynamoDB: the same token with other parameters is refused
            // (IdempotentParameterMismatch); with the same ones it succeeds, unapplied.
            return if seen == *fp {
                Ok(())
            } else {
                Err(StoreError::Validation(format!(
                    "idempotent parameter mismatch: token {t} was used for another transaction"
                )))
            };
        }
    }
    // Read everything first: the keys are distinct (validated), so this is the state before
    // the transaction for every operation.
    let olds = ops
        .iter()
        .map(|op| read_item(&tx, op.key()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut planned = Vec::with_capacity(ops.len());
    let mut reasons = Vec::with_capacity(ops.len());
    let mut failed = false;
    for (op, old) in ops.iter().zip(&olds) {
        match plan_transact_op(op, old.as_ref()) {
            Ok(p) => {
                planned.push(p);
                reasons.push(CancelReason::None);
            }
            Err(r) => {
                failed = true;
                planned.push(None);
                reasons.push(r);
            }
        }
    }
    if failed {
        // Dropping the transaction rolls it back; nothing was written yet anyway.
        return Err(StoreError::TransactionCanceled { reasons });
    }
    for (op, p) in ops.iter().zip(&planned) {
        if let Some(new) = p {
            write_item(&tx, op.key(), new.as_ref())?;
        }
    }
    if let (Some(t), Some(fp)) = (token, &fingerprint) {
        tx.prepare_cached("INSERT INTO tokens (token, ops, created_ms) VALUES (?1, ?2, ?3)")
            .and_then(|mut s| s.execute(params![t, fp, now_ms()]))
            .map_err(|e| from_sqlite("write token", e))?;
    }
    tx.commit().map_err(from_commit)
}

/// `query`: one partition of the table or of an index, in sort-key order (byte order; SQLite's
/// BINARY collation compares UTF-8 with `memcmp`, as `MemoryStore` compares bytes). Items with
/// equal index sort keys come in primary-key order, as in `MemoryStore`.
pub fn query(conn: &mut Connection, q: &Query) -> Result<Vec<Item>, StoreError> {
    let prefix = q.sk_prefix.as_deref().unwrap_or("");
    let sql = match q.index.as_deref() {
        None => "SELECT pk, sk, sk, item FROM items WHERE pk = ?1 AND sk >= ?2 ORDER BY sk",
        Some(ix) => match INDEXES.iter().position(|i| *i == ix) {
            Some(0) => "SELECT pk, sk, gsi1sk, item FROM items WHERE gsi1pk = ?1 AND gsi1sk >= ?2 ORDER BY gsi1sk, pk, sk",
            Some(1) => "SELECT pk, sk, gsi2sk, item FROM items WHERE gsi2pk = ?1 AND gsi2sk >= ?2 ORDER BY gsi2sk, pk, sk",
            Some(2) => "SELECT pk, sk, gsi3sk, item FROM items WHERE gsi3pk = ?1 AND gsi3sk >= ?2 ORDER BY gsi3sk, pk, sk",
            Some(3) => "SELECT pk, sk, gsi4sk, item FROM items WHERE gsi4pk = ?1 AND gsi4sk >= ?2 ORDER BY gsi4sk, pk, sk",
            _ => return scan_index(conn, ix, &q.pk, prefix),
        },
    };
    let mut stmt = conn
        .prepare_cached(sql)
        .map_err(|e| from_sqlite("prepare query", e))?;
    let mut rows = stmt
        .query(params![q.pk, prefix])
        .map_err(|e| from_sqlite("query", e))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(|e| from_sqlite("query", e))? {
        let sort: String = row.get(2).map_err(|e| from_sqlite("query", e))?;
        // Every string with the prefix sorts at or after it, contiguously: stop at the first
        // that lacks it.
        if !sort.starts_with(prefix) {
            break;
        }
        let key = Key::new(
            row.get::<_, String>(0)
                .map_err(|e| from_sqlite("query", e))?,
            row.get::<_, String>(1)
                .map_err(|e| from_sqlite("query", e))?,
        );
        let raw = row.get_ref(3).map_err(|e| from_sqlite("query", e))?;
        out.push(decode(&key, raw)?);
    }
    Ok(out)
}

/// An index without columns of its own: read every item and filter as `MemoryStore` does.
/// Slow (a full scan), but exact; the limiter uses only the indexed GSIs.
fn scan_index(
    conn: &Connection,
    ix: &str,
    pk: &str,
    prefix: &str,
) -> Result<Vec<Item>, StoreError> {
    tracing::warn!(index = ix, "query on an index without columns: full scan");
    let (pk_attr, sk_attr) = (format!("{ix}PK"), format!("{ix}SK"));
    let mut stmt = conn
        .prepare_cached("SELECT pk, sk, item FROM items ORDER BY pk, sk")
        .map_err(|e| from_sqlite("prepare scan", e))?;
    let mut rows = stmt.query([]).map_err(|e| from_sqlite("scan", e))?;
    let mut out: Vec<(String, Item)> = Vec::new();
    while let Some(row) = rows.next().map_err(|e| from_sqlite("scan", e))? {
        let key = Key::new(
            row.get::<_, String>(0)
                .map_err(|e| from_sqlite("scan", e))?,
            row.get::<_, String>(1)
                .map_err(|e| from_sqlite("scan", e))?,
        );
        let item = decode(&key, row.get_ref(2).map_err(|e| from_sqlite("scan", e))?)?;
        if item.get(&pk_attr).and_then(|v| v.as_s()) != Some(pk) {
            continue;
        }
        let Some(sort) = item.get(&sk_attr).and_then(|v| v.as_s()) else {
            continue;
        };
        if sort.starts_with(prefix) {
            out.push((sort.to_string(), item));
        }
    }
    // Stable: equal sort keys stay in primary-key order.
    out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    Ok(out.into_iter().map(|(_, i)| i).collect())
}
