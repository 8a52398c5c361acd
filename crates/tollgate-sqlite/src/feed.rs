//! The change feed of the SQLite store: a `changes` table written by the same statement
//! sequence, in the same transaction, as the write it records (see `ops::write_item`), so a
//! change is durable exactly when its write is, and a rolled-back write (a failed
//! transaction's savepoint, a batch whose `COMMIT` failed) leaves no change behind.
//!
//! One stream (`""`): sequence numbers are the table's `AUTOINCREMENT` keys, which a
//! rollback takes back too, so they have no gaps but the ones trimming leaves — which a read
//! from before the trim point detects and refuses rather than skipping changes.
//!
//! The consumer's cursor is not kept here: the aggregator stores it as an item of the same
//! file, in the transaction that writes what it derived, so several processes on one file
//! share one feed and one checkpoint.

use std::collections::HashMap;
use std::sync::Arc;

use rusqlite::{params, Connection, OptionalExtension};
use tollgate_core::value::{Item, Key};
use tollgate_store::{Change, FeedBatch, FeedCursor, FeedPosition, StoreError};

use crate::error::from_sqlite;
use crate::recent::Recent;

/// The table, created by schema version 2.
pub const CHANGES_TABLE: &str = "
CREATE TABLE IF NOT EXISTS changes (
    seq    INTEGER PRIMARY KEY AUTOINCREMENT,
    pk     TEXT NOT NULL,
    sk     TEXT NOT NULL,
    old    TEXT,
    new    TEXT,
    at_ms  INTEGER NOT NULL
);
";

/// Its columns, as `PRAGMA table_info` lists them.
pub const CHANGES_COLUMNS: &[&str] = &["seq", "pk", "sk", "old", "new", "at_ms"];

/// Record that the item at `key` went from `old` to `new` (stored JSON text): the change's
/// sequence number. Nothing (`None`) when the write changed nothing.
pub fn record(
    conn: &Connection,
    key: &Key,
    old: Option<&str>,
    new: Option<&str>,
    at_ms: i64,
) -> Result<Option<i64>, StoreError> {
    if old == new {
        return Ok(None);
    }
    conn.prepare_cached(
        "INSERT INTO changes (pk, sk, old, new, at_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
    )
    .and_then(|mut s| s.execute(params![key.pk, key.sk, old, new, at_ms]))
    .map_err(|e| from_sqlite("record change", e))?;
    Ok(Some(conn.last_insert_rowid()))
}

fn image(key: &Key, seq: i64, raw: Option<&str>) -> Result<Option<Item>, StoreError> {
    raw.map(|t| {
        serde_json::from_str::<Item>(t).map_err(|e| {
            StoreError::Corrupt(format!(
                "change {seq} of item {key}: stored image is not an item: {e}"
            ))
        })
    })
    .transpose()
}

/// One `changes` row: seq, pk, sk, old, new, at_ms.
type Row = (i64, String, String, Option<String>, Option<String>, i64);

/// The last sequence number ever given (0: none).
fn last_seq(conn: &Connection) -> Result<i64, StoreError> {
    conn.prepare_cached("SELECT seq FROM sqlite_sequence WHERE name = 'changes'")
        .and_then(|mut s| s.query_row([], |r| r.get::<_, i64>(0)).optional())
        .map(|v| v.unwrap_or(0))
        .map_err(|e| from_sqlite("read feed end", e))
}

/// Up to `limit` changes after `cursor`, from one snapshot (a read transaction of its own);
/// the images of the changes `recent` holds are taken from it, already decoded.
pub fn read(
    conn: &Connection,
    cursor: &FeedCursor,
    limit: usize,
    recent: &Recent,
) -> Result<FeedBatch, StoreError> {
    let tx = conn
        .unchecked_transaction()
        .map_err(|e| from_sqlite("begin feed read", e))?;
    let out = read_in(&tx, cursor, limit, recent)?;
    tx.finish().map_err(|e| from_sqlite("end feed read", e))?;
    Ok(out)
}

/// [`read`] inside the connection's open transaction.
pub fn read_in(
    tx: &Connection,
    cursor: &FeedCursor,
    limit: usize,
    recent: &Recent,
) -> Result<FeedBatch, StoreError> {
    let after = cursor.single_seq()?;
    let end = last_seq(tx)?;
    if after > end {
        return Err(StoreError::Validation(format!(
            "feed cursor at {after} is past the end of this file's feed ({end})"
        )));
    }
    let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
    let rows: Vec<Row> = tx
        .prepare_cached(
            "SELECT seq, pk, sk, old, new, at_ms FROM changes WHERE seq > ?1 ORDER BY seq LIMIT ?2",
        )
        .and_then(|mut s| {
            s.query_map(params![after, limit], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        })
        .map_err(|e| from_sqlite("read feed", e))?;
    let first = rows.first().map(|r| r.0);
    if after < end && first != Some(after + 1) {
        return Err(StoreError::Validation(format!(
            "the feed no longer holds the changes after {after} (trimmed; next held: {first:?})"
        )));
    }
    let mut next = cursor.clone();
    let mut changes = Vec::with_capacity(rows.len());
    // The image each key was last left with in this batch, as stored and decoded: a
    // change's old image is, byte for byte, the previous change's new one, so it is shared
    // rather than decoded again (half the decoding of a batch that writes a key repeatedly).
    let mut last: HashMap<Key, (String, Arc<Item>)> = HashMap::new();
    let held = recent.lookup(rows.iter().map(|r| r.0));
    debug_assert_eq!(held.len(), rows.len());
    for ((seq, pk, sk, old, new, at_ms), held) in rows.into_iter().zip(held) {
        let key = Key::new(pk, sk);
        let position = FeedPosition {
            stream: String::new(),
            seq: seq.to_string(),
        };
        next.advance(&position);
        // Committed by this process's writer: its images are decoded already.
        let (held_old, held_new) = held
            .filter(|p| p.key == key)
            .map(|p| (p.old, p.new))
            .unzip();
        let old = match old {
            None => None,
            Some(text) => match (held_old.flatten(), last.get(&key)) {
                (Some(img), _) => Some(img),
                (None, Some((seen, img))) if *seen == text => Some(Arc::clone(img)),
                (None, _) => image(&key, seq, Some(&text))?.map(Arc::new),
            },
        };
        let new = match new {
            None => {
                last.remove(&key);
                None
            }
            Some(text) => {
                let img = match held_new {
                    Some(img) => Some(img),
                    None => image(&key, seq, Some(&text))?.map(Arc::new),
                };
                if let Some(img) = &img {
                    last.insert(key.clone(), (text, Arc::clone(img)));
                }
                img
            }
        };
        changes.push(Change {
            old,
            new,
            key,
            position,
            at_ms,
        });
    }
    Ok(FeedBatch {
        changes,
        cursor: next,
    })
}

/// Forget the changes at or before `cursor` written before `before_ms`: the oldest ones, up
/// to the first that is still retained (as `MemoryStore` trims its log). A change written
/// before `before_ms` but after a retained one (another process's clock behind) stays until
/// a later trim; nothing after `cursor` is ever removed.
///
/// The cost is the rows removed, plus one: the boundary is found by walking the primary key
/// from its start, where every row passed is one being removed. (A `DELETE … WHERE seq <= ?
/// AND at_ms < ?` walked every retained row up to the cursor on every trim — a day of
/// changes under the default retention — and made the writer thread's trims the embedded
/// store's main cost under load.)
pub fn trim(conn: &Connection, cursor: &FeedCursor, before_ms: i64) -> Result<usize, StoreError> {
    let through = cursor.single_seq()?;
    // The first change at or before the cursor still retained; none: every one is removed.
    let kept = conn
        .prepare_cached(
            "SELECT seq FROM changes WHERE seq <= ?1 AND at_ms >= ?2 ORDER BY seq LIMIT 1",
        )
        .and_then(|mut s| {
            s.query_row(params![through, before_ms], |r| r.get::<_, i64>(0))
                .optional()
        })
        .map_err(|e| from_sqlite("trim feed", e))?;
    let end = kept.unwrap_or(through.saturating_add(1));
    // One bound on the primary key: the walk stops at `end`.
    conn.prepare_cached("DELETE FROM changes WHERE seq < ?1")
        .and_then(|mut s| s.execute(params![end]))
        .map_err(|e| from_sqlite("trim feed", e))
}
