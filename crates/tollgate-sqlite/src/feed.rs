//! The change feed of the SQLite store: a `changes` table written by the same statement
//! sequence, in the same transaction, as the write it records (see `ops::write_item`), so a
//! change is durable exactly when its write is, and a rolled-back write (a failed
//! transaction's savepoint, a batch whose `COMMIT` failed) leaves no change behind.
//!
//! One stream (`""`): sequence numbers are the table's row ids, each change numbered one
//! past the newest (SQLite's rowid rule). A rollback takes a number back with its row, so
//! numbers have no gaps but the ones trimming leaves — which a read from before the trim
//! point detects and refuses rather than skipping changes. A committed number is never
//! given again because the newest change is never removed: trimming removes only older
//! ones ([`trim`]), so the newest number only grows.
//!
//! (Version 2 numbered changes with `AUTOINCREMENT`, which keeps the highest number in
//! `sqlite_sequence` even when every row is gone; SQLite reads and rewrites that row on
//! every insert — about 3,000 instructions and one more page in every commit. Its
//! guarantee is now the rule above, and an upgraded file whose feed was trimmed empty keeps
//! its highest number in a [`MARKER`] row.)
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
use crate::recent::{Published, Recent};

/// The table (schema version 4). A change's old image is in `old` as its whole text, or in
/// `old_diff` as its difference from `new` (`diff.rs`), never in both; a change without an
/// old image (a creation) has neither. Version 3's table had no `old_diff` (the upgrade adds
/// it, last, as SQLite's `ADD COLUMN` does); version 2's was version 3's with
/// `AUTOINCREMENT`.
pub const CHANGES_TABLE: &str = "
CREATE TABLE IF NOT EXISTS changes (
    seq      INTEGER PRIMARY KEY,
    pk       TEXT NOT NULL,
    sk       TEXT NOT NULL,
    old      TEXT,
    new      TEXT,
    at_ms    INTEGER NOT NULL,
    old_diff TEXT
);
";

/// Its columns, as `PRAGMA table_info` lists them.
pub const CHANGES_COLUMNS: &[&str] = &["seq", "pk", "sk", "old", "new", "at_ms", "old_diff"];

/// Version 2's and 3's columns.
pub const CHANGES_COLUMNS_V3: &[&str] = &["seq", "pk", "sk", "old", "new", "at_ms"];

/// A change's old image as the writer hands it to [`record`].
#[derive(Debug, Clone, Copy)]
pub enum OldImage<'a> {
    /// No old image: the write created the item.
    None,
    /// The old image's stored text.
    Text(&'a str),
    /// The old image's stored text (to tell an unchanged item) and its difference from the
    /// new image (what is stored): see `diff.rs`.
    Diff { text: &'a str, diff: &'a str },
}

impl<'a> OldImage<'a> {
    /// The old image's stored text.
    fn text(self) -> Option<&'a str> {
        match self {
            OldImage::None => None,
            OldImage::Text(t) | OldImage::Diff { text: t, .. } => Some(t),
        }
    }
}

/// The statement that writes a marker: a row with neither image, which no write records
/// ([`record`] records nothing when the images are equal), holding a sequence number the
/// feed must not give again. Readers pass over it. The upgrade from version 2 writes one
/// when the old feed was trimmed empty (`schema.rs`).
pub const MARKER: &str =
    "INSERT INTO changes (seq, pk, sk, old, new, at_ms) VALUES (?1, '', '', NULL, NULL, 0)";

/// Record that the item at `key` went from `old` to `new` (stored JSON text): the change's
/// sequence number. Nothing (`None`) when the write changed nothing.
pub fn record(
    conn: &Connection,
    key: &Key,
    old: OldImage<'_>,
    new: Option<&str>,
    at_ms: i64,
) -> Result<Option<i64>, StoreError> {
    if old.text() == new {
        return Ok(None);
    }
    let (whole, diff) = match old {
        OldImage::None => (None, None),
        OldImage::Text(t) => (Some(t), None),
        OldImage::Diff { diff, .. } => {
            debug_assert!(new.is_some(), "a difference is from a new image");
            (None, Some(diff))
        }
    };
    conn.prepare_cached(
        "INSERT INTO changes (pk, sk, old, new, at_ms, old_diff) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .and_then(|mut s| s.execute(params![key.pk, key.sk, whole, new, at_ms, diff]))
    .map_err(|e| from_sqlite("record change", e))?;
    Ok(Some(conn.last_insert_rowid()))
}

/// Decode a stored image (`None`: the column is NULL).
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

/// The old image of change `seq`: `new` with the stored difference applied.
fn old_from_diff(key: &Key, seq: i64, new: &Item, diff: &str) -> Result<Item, StoreError> {
    crate::diff::apply(new, diff).map_err(|e| {
        StoreError::Corrupt(format!(
            "change {seq} of item {key}: stored old image difference is not one: {e}"
        ))
    })
}

/// A text column borrowed from the row (`None`: NULL).
fn text<'r>(row: &'r rusqlite::Row<'_>, i: usize) -> Result<Option<&'r str>, StoreError> {
    row.get_ref(i)
        .and_then(|v| v.as_str_or_null().map_err(Into::into))
        .map_err(|e| from_sqlite("read feed", e))
}

/// The last sequence number ever given (0: none): the newest change's (never trimmed).
fn last_seq(conn: &Connection) -> Result<i64, StoreError> {
    conn.prepare_cached("SELECT max(seq) FROM changes")
        .and_then(|mut s| s.query_row([], |r| r.get::<_, Option<i64>>(0)))
        .map(|v| v.unwrap_or(0))
        .map_err(|e| from_sqlite("read feed end", e))
}

/// The number of the oldest change held (0: none).
fn first_seq(conn: &Connection) -> Result<i64, StoreError> {
    conn.prepare_cached("SELECT min(seq) FROM changes")
        .and_then(|mut s| s.query_row([], |r| r.get::<_, Option<i64>>(0)))
        .map(|v| v.unwrap_or(0))
        .map_err(|e| from_sqlite("read feed start", e))
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
///
/// A change this process's writer committed (held by `recent`) is taken as the writer left
/// it: its stored texts are not copied, let alone decoded. Another process's change is
/// decoded from the row, its old image shared with the previous change's new one of the
/// same key when the two texts are the same (they are, unless a change between them is
/// missing). The held changes are looked up once per read, for the sequence numbers the
/// read can return (`after + 1` to `after + limit`: the feed has no gaps past `after`; a
/// change past that range, were there one, would only be decoded).
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
    let held = recent.range(after.saturating_add(1), after.saturating_add(limit));
    if let Some(batch) = held_batch(tx, cursor, after, limit, end, &held)? {
        recent.release_through(after + i64::try_from(batch.changes.len()).unwrap_or(0));
        return Ok(batch);
    }
    let mut held = held.into_iter().peekable();
    let mut stmt = tx
        .prepare_cached(
            "SELECT seq, pk, sk, at_ms, old, new, old_diff FROM changes
             WHERE seq > ?1 ORDER BY seq LIMIT ?2",
        )
        .map_err(|e| from_sqlite("read feed", e))?;
    let mut rows = stmt
        .query(params![after, limit])
        .map_err(|e| from_sqlite("read feed", e))?;
    let mut next = cursor.clone();
    let mut changes = Vec::new();
    // The image each key was last left with in this batch by a change decoded from text, as
    // stored and decoded: a change's old image is, byte for byte, the previous change's new
    // one, so it is shared rather than decoded again (half the decoding of a batch that
    // writes a key repeatedly).
    let mut last: HashMap<Key, (String, Arc<Item>)> = HashMap::new();
    // Whether a row (a change or a marker) was read, and the last one's position.
    let mut read_any = false;
    let mut last_position: Option<(i64, FeedPosition)> = None;
    while let Some(row) = rows.next().map_err(|e| from_sqlite("read feed", e))? {
        let col = |i: usize| {
            row.get::<_, i64>(i)
                .map_err(|e| from_sqlite("read feed", e))
        };
        let (seq, at_ms) = (col(0)?, col(3)?);
        let first = !read_any;
        read_any = true;
        if first && after < end && seq != after + 1 {
            return Err(StoreError::Validation(format!(
                "the feed no longer holds the changes after {after} (trimmed; next held: {:?})",
                Some(seq)
            )));
        }
        let position = position_of(seq);
        let (pk, sk) = (text(row, 1)?.unwrap_or(""), text(row, 2)?.unwrap_or(""));
        // The images' texts are taken (and SQLite copies them out) only for a change
        // decoded from them, and to tell a marker (empty key, no image) from a change.
        if pk.is_empty()
            && sk.is_empty()
            && text(row, 4)?.is_none()
            && text(row, 5)?.is_none()
            && text(row, 6)?.is_none()
        {
            // A marker, not a change (see [`MARKER`]): read past.
            last_position = Some((seq, position));
            continue;
        }
        while held.next_if(|h| h.0 < seq).is_some() {}
        // Committed by this process's writer: its images are decoded already.
        let mine = held
            .next_if(|h| h.0 == seq && *h.1.key.pk == *pk && *h.1.key.sk == *sk)
            .map(|h| h.1);
        let (key, old, new) = match mine {
            Some(p) => {
                // A later change decoded from text cannot share this one's image.
                last.remove(&p.key);
                (p.key, p.old, p.new)
            }
            None => {
                let key = Key::new(pk, sk);
                let old = match text(row, 4)? {
                    None => None,
                    Some(t) => match last.get(&key) {
                        Some((seen, img)) if seen == t => Some(Arc::clone(img)),
                        _ => image(&key, seq, Some(t))?.map(Arc::new),
                    },
                };
                let new = match text(row, 5)? {
                    None => {
                        last.remove(&key);
                        None
                    }
                    Some(t) => {
                        let img = image(&key, seq, Some(t))?.map(Arc::new);
                        if let Some(img) = &img {
                            last.insert(key.clone(), (t.to_string(), Arc::clone(img)));
                        }
                        img
                    }
                };
                let old = match (old, text(row, 6)?, &new) {
                    (None, Some(d), Some(n)) => Some(Arc::new(old_from_diff(&key, seq, n, d)?)),
                    (None, Some(_), None) => {
                        return Err(StoreError::Corrupt(format!(
                            "change {seq} of item {key}: an old image stored as a difference \
                             from no new image"
                        )))
                    }
                    (Some(_), Some(_), _) => {
                        return Err(StoreError::Corrupt(format!(
                            "change {seq} of item {key}: both a whole old image and a \
                             difference"
                        )))
                    }
                    (old, None, _) => old,
                };
                (key, old, new)
            }
        };
        last_position = Some((seq, position.clone()));
        changes.push(Change {
            old,
            new,
            key,
            position,
            at_ms,
        });
    }
    // Positions only grow along the read: the cursor moves once, to the last.
    if let Some((seq, p)) = &last_position {
        next.advance(p);
        recent.release_through(*seq);
    }
    if !read_any && after < end {
        return Err(StoreError::Validation(format!(
            "the feed no longer holds the changes after {after} (trimmed; next held: None)"
        )));
    }
    Ok(FeedBatch {
        changes,
        cursor: next,
    })
}

/// The feed position of change `seq` (one stream).
fn position_of(seq: i64) -> FeedPosition {
    FeedPosition {
        stream: String::new(),
        seq: seq.to_string(),
    }
}

/// The batch [`read_in`] would read, when `recent` holds every change of it: the changes
/// numbered `after + 1` to `min(after + limit, end)`, each committed by this process's
/// writer (held), one after another with no number missing (another process's change or a
/// marker row would be missing from `recent`), and the first of them still in the file (a
/// trim removes the oldest changes first, so the later ones are there too). No row is read
/// for it beyond that one look-up by number. `None`: read the rows.
fn held_batch(
    tx: &Connection,
    cursor: &FeedCursor,
    after: i64,
    limit: i64,
    end: i64,
    held: &[(i64, Published)],
) -> Result<Option<FeedBatch>, StoreError> {
    let want = end.saturating_sub(after).min(limit);
    // `held` is in number order from `after + 1` on: its `want`-th entry is numbered
    // `after + want` exactly when none is missing before it.
    let run = usize::try_from(want)
        .ok()
        .filter(|n| *n > 0)
        .and_then(|n| held.get(..n))
        .filter(|run| run.last().is_some_and(|h| h.0 == after + want));
    let Some(run) = run else {
        return Ok(None);
    };
    debug_assert!(run.first().is_some_and(|h| h.0 == after + 1));
    let first_there = tx
        .prepare_cached("SELECT 1 FROM changes WHERE seq = ?1")
        .and_then(|mut s| s.exists(params![after + 1]))
        .map_err(|e| from_sqlite("read feed", e))?;
    if !first_there {
        return Ok(None);
    }
    let mut next = cursor.clone();
    let changes: Vec<Change> = run
        .iter()
        .map(|(seq, p)| Change {
            old: p.old.clone(),
            new: p.new.clone(),
            key: p.key.clone(),
            position: position_of(*seq),
            at_ms: p.at_ms,
        })
        .collect();
    if let Some(last) = changes.last() {
        next.advance(&last.position);
    }
    Ok(Some(FeedBatch {
        changes,
        cursor: next,
    }))
}

/// The most changes one trim removes. A trim runs on the writer thread inside a batch of
/// requests, which wait for it: removing a whole retention's backlog at once (the first
/// trim after the retention elapses under load: hundreds of thousands of rows, ~1 KB each)
/// held every request behind it for ~100 ms. The aggregator trims once per batch of
/// changes it counts (500 by default), so bounded trims still remove changes twice as fast
/// as they are read; a backlog left by an idle feed goes over the next passes.
pub const TRIM_MAX_CHANGES: i64 = 1024;

/// Forget the changes at or before `cursor` written before `before_ms`: the oldest ones, up
/// to the first that is still retained (as `MemoryStore` trims its log), at most
/// [`TRIM_MAX_CHANGES`] of them. A change written
/// before `before_ms` but after a retained one (another process's clock behind) stays until
/// a later trim; nothing after `cursor` is ever removed, and neither is the newest change
/// (it holds the highest sequence number given: see the module docs).
///
/// The cost is the rows removed, plus one: the boundary is found by walking the primary key
/// from its start, where every row passed is one being removed. (A `DELETE … WHERE seq <= ?
/// AND at_ms < ?` walked every retained row up to the cursor on every trim — a day of
/// changes under the default retention — and made the writer thread's trims the embedded
/// store's main cost under load.)
pub fn trim(conn: &Connection, cursor: &FeedCursor, before_ms: i64) -> Result<usize, StoreError> {
    let through = cursor.single_seq()?;
    // The changes this trim may remove: at or before the cursor, and at most
    // TRIM_MAX_CHANGES numbers from the oldest held.
    let last_candidate = through.min(first_seq(conn)?.saturating_add(TRIM_MAX_CHANGES - 1));
    // The first of them still retained; none: every one is removed.
    let kept = conn
        .prepare_cached(
            "SELECT seq FROM changes WHERE seq <= ?1 AND at_ms >= ?2 ORDER BY seq LIMIT 1",
        )
        .and_then(|mut s| {
            s.query_row(params![last_candidate, before_ms], |r| r.get::<_, i64>(0))
                .optional()
        })
        .map_err(|e| from_sqlite("trim feed", e))?;
    // Never the newest change: its number is the highest ever given (see the module docs).
    let end = kept
        .unwrap_or(last_candidate.saturating_add(1))
        .min(last_seq(conn)?);
    // One bound on the primary key: the walk stops at `end`.
    conn.prepare_cached("DELETE FROM changes WHERE seq < ?1")
        .and_then(|mut s| s.execute(params![end]))
        .map_err(|e| from_sqlite("trim feed", e))
}
