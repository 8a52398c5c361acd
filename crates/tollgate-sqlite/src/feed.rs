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
//! A row keeps only what its neighbours do not already give (schema version 5, [`Form`]):
//! an update keeps its old image's difference from the new one (`diff.rs`), and its new
//! image is the one after it — the next change's old image, or the item as the file holds
//! it. A reader rebuilds a batch newest first. Version 4 kept every new image whole, ~810
//! of a bucket change's ~1,000 bytes, which every commit wrote to the WAL, fsynced, and the
//! checkpointer copied again; this process's own reader never reads them (it takes the
//! images the writer holds, `recent.rs`), so they were written for the rare reader in
//! another process or after a restart. A version-5 update row is ~200 bytes.
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

/// The table (schema versions 4 and 5: what a row holds is [`Form`]). A change's old image
/// is in `old` as its whole text, or in `old_diff` as its difference from the new one
/// (`diff.rs`), never in both; a change without an old image (a creation) has neither.
/// Version 4 stored every new image in `new`; version 5 stores it only when the old image
/// is whole and the item not deleted. Version 3's table had no `old_diff` (the upgrade adds
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
///
/// With `omit_new`, the row leaves out a new image the change after it gives ([`Form`]);
/// the writer sets it only for a batch whose changes this process's feed reader will take
/// from memory (`recent.rs` has room for them, and no other connection has written since
/// the writer's previous batch, so this process's reader sees every change). A reader
/// elsewhere, or after a restart, rebuilds such a change from the changes after it
/// ([`read_in`]): a walk back from the end of the feed, which the rule keeps to the few
/// changes a process had not yet read when it stopped. Otherwise the row stores the new
/// image whole, and any reader reads it in one step, as version 4 did.
pub fn record(
    conn: &Connection,
    key: &Key,
    old: OldImage<'_>,
    new: Option<&str>,
    omit_new: bool,
    at_ms: i64,
) -> Result<Option<i64>, StoreError> {
    if old.text() == new {
        return Ok(None);
    }
    // What the row keeps (see [`Form`]): a deletion its old image; with `omit_new`, a
    // creation nothing and an update the difference of its old image, their new image
    // being the one after them; otherwise the new image whole, and the old one as the
    // writer has it.
    let (whole, new, diff) = match (old, new) {
        (old, None) => (old.text(), None, None),
        (OldImage::None, Some(_)) if omit_new => (None, None, None),
        (OldImage::Diff { diff, .. }, Some(_)) if omit_new => (None, None, Some(diff)),
        (OldImage::None, Some(n)) => (None, Some(n), None),
        (OldImage::Diff { diff, .. }, Some(n)) => (None, Some(n), Some(diff)),
        (OldImage::Text(t), Some(n)) => (Some(t), Some(n), None),
    };
    conn.prepare_cached(
        "INSERT INTO changes (pk, sk, old, new, at_ms, old_diff) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .and_then(|mut s| s.execute(params![key.pk, key.sk, whole, new, at_ms, diff]))
    .map_err(|e| from_sqlite("record change", e))?;
    Ok(Some(conn.last_insert_rowid()))
}

/// Decode a stored image.
fn decode(key: &Key, seq: i64, raw: &str) -> Result<Item, StoreError> {
    serde_json::from_str::<Item>(raw).map_err(|e| {
        StoreError::Corrupt(format!(
            "change {seq} of item {key}: stored image is not an item: {e}"
        ))
    })
}

/// The old image of change `seq`: `new` with the stored difference applied.
fn old_from_diff(key: &Key, seq: i64, new: &Item, diff: &str) -> Result<Item, StoreError> {
    crate::diff::apply(new, diff).map_err(|e| corrupt_diff(key, seq, e))
}

fn corrupt_diff(key: &Key, seq: i64, e: serde_json::Error) -> StoreError {
    StoreError::Corrupt(format!(
        "change {seq} of item {key}: stored old image difference is not one: {e}"
    ))
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
    window: usize,
    recent: &Recent,
) -> Result<FeedBatch, StoreError> {
    let tx = conn
        .unchecked_transaction()
        .map_err(|e| from_sqlite("begin feed read", e))?;
    let out = read_in(&tx, cursor, limit, window, recent)?;
    tx.finish().map_err(|e| from_sqlite("end feed read", e))?;
    Ok(out)
}

/// [`read`] inside the connection's open transaction.
///
/// A change this process's writer committed (held by `recent`) is taken as the writer left
/// it: its stored texts are not copied, let alone decoded. So is a change an earlier read
/// rebuilt. Otherwise the read decodes the batch's rows ([`read_rows`]) when each stores
/// its new image, as every row did before version 5 and as every row does that this
/// process's reader did not hold when it was written ([`record`]'s rule). A row that
/// leaves its new image to the change after it ([`Form`]) is rebuilt ([`rebuild`]): the
/// changes are rebuilt newest first, from the end of the feed back to the cursor, each from
/// the image its key had just after it. That read returns the first `limit` and keeps the
/// next ones, up to `window` of them ([`REBUILD_WINDOW`] by default), for the reads that
/// follow (`recent`), so a reader rebuilds each change once or a few times, not once per
/// batch.
pub fn read_in(
    tx: &Connection,
    cursor: &FeedCursor,
    limit: usize,
    window: usize,
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
    let (from, to) = (after.saturating_add(1), after.saturating_add(limit));
    let held = recent.range(from, to);
    for run in [&held, &recent.rebuilt_range(from, to)] {
        if let Some(batch) = held_batch(tx, cursor, after, limit, end, run)? {
            recent.release_through(after + i64::try_from(batch.changes.len()).unwrap_or(0));
            recent.reads().served(batch.changes.len(), 0);
            return Ok(batch);
        }
    }
    if after == end {
        return Ok(FeedBatch {
            changes: Vec::new(),
            cursor: cursor.clone(),
        });
    }
    // The feed has no gaps past the oldest change it holds: `after + 1` is held unless a
    // trim removed it.
    let first = tx
        .prepare_cached("SELECT min(seq) FROM changes WHERE seq > ?1")
        .and_then(|mut s| s.query_row(params![after], |r| r.get::<_, Option<i64>>(0)))
        .map_err(|e| from_sqlite("read feed", e))?;
    if first != Some(after + 1) {
        return Err(StoreError::Validation(format!(
            "the feed no longer holds the changes after {after} (trimmed; next held: {first:?})"
        )));
    }
    let rows = match read_rows(tx, after, limit, held)? {
        Some((rows, from_memory)) => {
            let changes = rows.iter().filter(|(_, p)| p.is_some()).count();
            recent.reads().served(from_memory, changes - from_memory);
            rows
        }
        None => {
            let window = i64::try_from(window).unwrap_or(i64::MAX);
            let keep_to = after.saturating_add(limit).saturating_add(window);
            let (mut rows, walked) = rebuild(tx, after, keep_to, recent)?;
            let rest = rows.split_off(rows.len().min(usize::try_from(limit).unwrap_or(usize::MAX)));
            recent
                .reads()
                .rebuilt(rows.iter().filter(|(_, p)| p.is_some()).count(), walked);
            recent.keep_rebuilt(
                rest.into_iter()
                    .filter_map(|(seq, p)| Some((seq, p?)))
                    .collect(),
            );
            rows
        }
    };
    debug_assert!(rows.len() <= usize::try_from(limit).unwrap_or(usize::MAX));
    let mut next = cursor.clone();
    if let Some((last, _)) = rows.last() {
        // Positions only grow along the read: the cursor moves once, to the last row read.
        next.advance(&position_of(*last));
        recent.release_through(*last);
    }
    let changes = rows
        .into_iter()
        .filter_map(|(seq, p)| {
            p.map(|p| Change {
                old: p.old,
                new: p.new,
                key: p.key,
                position: position_of(seq),
                at_ms: p.at_ms,
            })
        })
        .collect();
    Ok(FeedBatch {
        changes,
        cursor: next,
    })
}

/// A change's image, decoded (`None`: the item did not exist).
type Image = Option<Arc<Item>>;

/// A row of the feed as a read returns it: its number and its change (`None`: a marker).
type Row = (i64, Option<Published>);

/// The changes numbered `after + 1` on, at most `limit` rows, in order (`None` in a row's
/// place: a marker), when each is in `held` (what `recent` holds of them, in order) or
/// stores its new image: what version 4 read; with the number of changes taken from
/// `held`. `None` when one leaves its new image to the change after it, which then only a
/// walk from the end of the feed gives ([`rebuild`]).
fn read_rows(
    tx: &Connection,
    after: i64,
    limit: i64,
    held: Vec<(i64, Published)>,
) -> Result<Option<(Vec<Row>, usize)>, StoreError> {
    let mut held = held.into_iter().peekable();
    // How many of the changes read are taken from `held`.
    let mut from_memory = 0;
    let mut stmt = tx
        .prepare_cached(
            "SELECT seq, pk, sk, at_ms, old, new, old_diff FROM changes
             WHERE seq > ?1 ORDER BY seq LIMIT ?2", // FeedRow's columns
        )
        .map_err(|e| from_sqlite("read feed", e))?;
    let mut rows = stmt
        .query(params![after, limit])
        .map_err(|e| from_sqlite("read feed", e))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(|e| from_sqlite("read feed", e))? {
        let r = FeedRow::of(row)?;
        if r.is_marker() {
            out.push((r.seq, None));
            continue;
        }
        let (seq, at_ms, texts) = (r.seq, r.at_ms, r.texts);
        while held.next_if(|h| h.0 < seq).is_some() {}
        // Committed by this process's writer: its images are decoded already.
        if let Some((_, p)) =
            held.next_if(|h| h.0 == seq && *h.1.key.pk == *r.pk && *h.1.key.sk == *r.sk)
        {
            out.push((seq, Some(p)));
            from_memory += 1;
            continue;
        }
        let key = Key::new(r.pk, r.sk);
        if texts.form(&key, seq)?.new_follows() {
            return Ok(None);
        }
        out.push((seq, Some(change_of(key, seq, at_ms, texts, None)?)));
    }
    Ok(Some((out, from_memory)))
}

/// The most changes a read rebuilds from the rows beyond the batch it returns, kept for the
/// reads after it, by default (`SqliteConfig::feed_rebuild_window`). A rebuild walks the
/// feed from its end back to the read's cursor, so a reader `L` changes behind a stretch of
/// rows without new images rebuilds it in `L / REBUILD_WINDOW` walks of up to `L` rows
/// each. Each kept change holds one decoded image (~2 KB for a bucket of one limit): at
/// most ~32 MB.
pub const REBUILD_WINDOW: usize = 16_384;

/// The changes numbered `after + 1` to `keep_to` (or the end), in order, rebuilt from the
/// rows of one snapshot (`None`: a marker row), and the number of rows the walk read. The walk goes from the newest row down, so
/// that each change's new image, when its row leaves it out, is known: the next change's
/// old image, or the item as the file holds it for a key's newest change. A change `recent`
/// holds is taken as held, and its old image carries the walk on.
fn rebuild(
    tx: &Connection,
    after: i64,
    keep_to: i64,
    recent: &Recent,
) -> Result<(Vec<Row>, usize), StoreError> {
    let mut held: HashMap<i64, Published> = recent
        .range(after.saturating_add(1), i64::MAX)
        .into_iter()
        .collect();
    // Each key's image just after the rows walked so far (`None`: deleted).
    let mut state: HashMap<Key, Option<Arc<Item>>> = HashMap::new();
    let mut out = Vec::new();
    let mut stmt = tx
        .prepare_cached(
            "SELECT seq, pk, sk, at_ms, old, new, old_diff FROM changes
             WHERE seq > ?1 ORDER BY seq DESC", // FeedRow's columns
        )
        .map_err(|e| from_sqlite("read feed", e))?;
    let mut rows = stmt
        .query(params![after])
        .map_err(|e| from_sqlite("read feed", e))?;
    let mut walked = 0;
    while let Some(row) = rows.next().map_err(|e| from_sqlite("read feed", e))? {
        walked += 1;
        let r = FeedRow::of(row)?;
        let kept = r.seq <= keep_to;
        if r.is_marker() {
            if kept {
                out.push((r.seq, None));
            }
            continue;
        }
        let (seq, at_ms, texts) = (r.seq, r.at_ms, r.texts);
        let key = Key::new(r.pk, r.sk);
        if !kept {
            // Past the changes kept: only the key's image before this change matters, and
            // it is made from the one after it in place where it can be.
            let next = match state.remove(&key) {
                Some(img) => img,
                None => crate::ops::read_item(tx, &key)?.map(Arc::new),
            };
            let before = match held.remove(&seq).filter(|p| p.key == key) {
                Some(p) => p.old,
                None => image_before(&key, seq, texts, next)?,
            };
            state.insert(key, before);
            continue;
        }
        if let Some(p) = held.remove(&seq).filter(|p| p.key == key) {
            // Committed by this process's writer: its images are decoded already.
            state.insert(key, p.old.clone());
            out.push((seq, Some(p)));
            continue;
        }
        let next = match state.get(&key) {
            Some(img) => img.clone(),
            // The key's newest change: the image after it is the item as it is now.
            None => crate::ops::read_item(tx, &key)?.map(Arc::new),
        };
        let change = change_of(key, seq, at_ms, texts, next.as_ref())?;
        state.insert(change.key.clone(), change.old.clone());
        out.push((seq, Some(change)));
    }
    out.reverse();
    debug_assert!(out.windows(2).all(|w| w[0].0 < w[1].0));
    Ok((out, walked))
}

/// A row of `changes` as both reads select it (`seq, pk, sk, at_ms, old, new, old_diff`),
/// its texts borrowed from the row.
struct FeedRow<'r> {
    seq: i64,
    at_ms: i64,
    pk: &'r str,
    sk: &'r str,
    texts: Texts<'r>,
}

impl<'r> FeedRow<'r> {
    fn of(row: &'r rusqlite::Row<'_>) -> Result<Self, StoreError> {
        let col = |i: usize| {
            row.get::<_, i64>(i)
                .map_err(|e| from_sqlite("read feed", e))
        };
        Ok(FeedRow {
            seq: col(0)?,
            at_ms: col(3)?,
            pk: text(row, 1)?.unwrap_or(""),
            sk: text(row, 2)?.unwrap_or(""),
            texts: Texts {
                old: text(row, 4)?,
                new: text(row, 5)?,
                diff: text(row, 6)?,
            },
        })
    }

    /// Whether the row is a marker, not a change (see [`MARKER`]): readers pass over it.
    fn is_marker(&self) -> bool {
        self.pk.is_empty() && self.sk.is_empty() && self.texts.is_empty()
    }
}

/// The image columns of a change row.
#[derive(Debug, Clone, Copy)]
struct Texts<'r> {
    /// `old`: the old image whole.
    old: Option<&'r str>,
    /// `new`: the new image whole.
    new: Option<&'r str>,
    /// `old_diff`: the old image as its difference from the new one.
    diff: Option<&'r str>,
}

impl<'r> Texts<'r> {
    fn is_empty(&self) -> bool {
        self.old.is_none() && self.new.is_none() && self.diff.is_none()
    }

    /// The row's [`Form`]; a row that is none of them is corrupt.
    fn form(&self, key: &Key, seq: i64) -> Result<Form<'r>, StoreError> {
        match (self.old, self.new, self.diff) {
            (Some(_), _, Some(_)) => Err(StoreError::Corrupt(format!(
                "change {seq} of item {key}: both a whole old image and a difference"
            ))),
            (old, Some(new), diff) => Ok(Form::Whole { new, old, diff }),
            (Some(old), None, None) => Ok(Form::Deletion { old }),
            (None, None, None) => Ok(Form::Creation),
            (None, None, Some(diff)) => Ok(Form::Update { diff }),
        }
    }
}

/// What a change row holds (schema version 5; a row written by version 4 is always
/// [`Form::Whole`]), from its image columns:
///
/// | `old` | `new` | `old_diff` | the change |
/// |---|---|---|---|
/// | any | text | any but with `old` | [`Form::Whole`]: its new image stored |
/// | text | NULL | NULL | [`Form::Deletion`] |
/// | NULL | NULL | NULL | [`Form::Creation`], its new image the one after it |
/// | NULL | NULL | text | [`Form::Update`], its new image the one after it |
///
/// The writer leaves a new image out only under [`record`]'s rule.
///
/// "The one after it" is the image its item had just after the change: the old image of
/// the key's next change on the feed, or, when there is none, the item as the file holds
/// it. Every write of an item records its change in the same transaction (`ops.rs`), so the
/// two agree; a trim removes the oldest changes first, so every change after a held one is
/// held too.
#[derive(Debug, Clone, Copy)]
enum Form<'a> {
    /// The new image is stored whole; the old one whole, as a difference from it, or none.
    Whole {
        new: &'a str,
        old: Option<&'a str>,
        diff: Option<&'a str>,
    },
    /// The item was deleted: its old image stored whole.
    Deletion { old: &'a str },
    /// The item was created; its image follows.
    Creation,
    /// The item was changed: its old image stored as a difference from the new one, which
    /// follows.
    Update { diff: &'a str },
}

impl Form<'_> {
    /// Whether the change's new image is the one after it (not stored).
    fn new_follows(&self) -> bool {
        matches!(self, Form::Creation | Form::Update { .. })
    }
}

/// The old image alone of change `seq` of `key` ([`images_of`]), given `next` by value: an
/// update's difference is applied to it in place when nothing else holds it.
fn image_before(
    key: &Key,
    seq: i64,
    texts: Texts<'_>,
    next: Option<Arc<Item>>,
) -> Result<Image, StoreError> {
    match texts.form(key, seq)? {
        Form::Update { diff } => {
            let Some(mut img) = next else {
                return images_of(key, seq, texts, None).map(|(old, _)| old);
            };
            crate::diff::apply_in_place(Arc::make_mut(&mut img), diff)
                .map_err(|e| corrupt_diff(key, seq, e))?;
            Ok(Some(img))
        }
        _ => images_of(key, seq, texts, next.as_ref()).map(|(old, _)| old),
    }
}

/// Change `seq` of `key`, recorded at `at_ms`, as a read returns it: its images decoded
/// from `texts` and `next` ([`images_of`]).
fn change_of(
    key: Key,
    seq: i64,
    at_ms: i64,
    texts: Texts<'_>,
    next: Option<&Arc<Item>>,
) -> Result<Published, StoreError> {
    let (old, new) = images_of(&key, seq, texts, next)?;
    Ok(Published {
        key,
        old,
        new,
        at_ms,
    })
}

/// The images (old, new) of change `seq` of `key`, stored as `texts`, given `next`: the
/// image its item had just after it (the next change's old image, or the item as it is
/// now; `None`: none, the item was deleted). A change whose new image follows it needs
/// `next`; one without it, or with a stored image or difference that is not one, is corrupt.
fn images_of(
    key: &Key,
    seq: i64,
    texts: Texts<'_>,
    next: Option<&Arc<Item>>,
) -> Result<(Image, Image), StoreError> {
    let follows = || {
        next.cloned().ok_or_else(|| {
            StoreError::Corrupt(format!(
                "change {seq} of item {key}: its new image is the one after it, and the item \
                 has none after it (deleted, or changed without a change recorded)"
            ))
        })
    };
    Ok(match texts.form(key, seq)? {
        Form::Whole { new, old, diff } => {
            let new = Arc::new(decode(key, seq, new)?);
            let old = match (old, diff) {
                (Some(t), _) => Some(Arc::new(decode(key, seq, t)?)),
                (None, Some(d)) => Some(Arc::new(old_from_diff(key, seq, &new, d)?)),
                (None, None) => None,
            };
            (old, Some(new))
        }
        Form::Deletion { old } => (Some(Arc::new(decode(key, seq, old)?)), None),
        Form::Creation => (None, Some(follows()?)),
        Form::Update { diff } => {
            let new = follows()?;
            let old = old_from_diff(key, seq, &new, diff)?;
            (Some(Arc::new(old)), Some(new))
        }
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
