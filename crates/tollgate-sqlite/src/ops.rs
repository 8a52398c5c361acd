//! The blocking operations. A write runs inside the writer's open `BEGIN IMMEDIATE`
//! transaction (one group commit, see `writer.rs`), after the operations queued before it:
//! its condition and update are evaluated in Rust with [`tollgate_store::eval`] between
//! reading the current row and writing the new one, so the semantics are `MemoryStore`'s by
//! construction and the read-evaluate-write is atomic across connections and processes.
//!
//! A failed condition writes nothing, so it fails its operation alone; a transaction writes
//! under a SAVEPOINT, so a failure midway takes back its own writes and nobody else's.
//!
//! The current row is usually not read at all: the writer remembers the rows it wrote
//! ([`Memo`]), and while no other connection has committed and nothing was rolled back the
//! memo is the row, byte for byte ([`Memo::begin_batch`] says when).

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension, Transaction};
use serde::Serialize;
use tollgate_core::expr::{project, ReturnValues};
use tollgate_core::expr::{Condition, Update};
use tollgate_core::value::{Item, Key};
use tollgate_store::eval::{
    apply_actions, apply_update_stored, eval_condition, key_item, plan_transact_op, validate_update,
};
use tollgate_store::{
    validate_token, validate_transaction, CancelReason, DeleteRequest, PutRequest, Query, ScanPage,
    StoreError, TransactOp, Undecodable, UpdateRequest,
};

use crate::error::from_sqlite;
use crate::feed::OldImage;
use crate::json::Layout;
use crate::recent::Published;
use crate::schema::INDEXES;

/// Decode a stored item; anything but valid JSON of an item is [`StoreError::Corrupt`]
/// (naming the attribute, when one is at fault: see [`decode_each`]).
fn decode(key: &Key, raw: ValueRef<'_>) -> Result<Item, StoreError> {
    decode_each(key, raw).map_err(|u| StoreError::Corrupt(u.to_string()))
}

/// Decode a stored item, or say why it cannot be: the item whole first (the common case,
/// one pass), and only when that fails attribute by attribute, to name the one at fault.
fn decode_each(key: &Key, raw: ValueRef<'_>) -> Result<Item, Undecodable> {
    let bad = |attribute: Option<String>, reason: String| Undecodable {
        key: key.clone(),
        attribute,
        reason,
    };
    let bytes = match raw {
        ValueRef::Text(b) | ValueRef::Blob(b) => b,
        other => {
            return Err(bad(
                None,
                format!("stored value is {:?}, not JSON text", other.data_type()),
            ))
        }
    };
    serde_json::from_slice(bytes).map_err(|whole| {
        let attrs: serde_json::Map<String, serde_json::Value> = match serde_json::from_slice(bytes)
        {
            Ok(m) => m,
            Err(_) => return bad(None, format!("undecodable JSON: {whole}")),
        };
        for (name, v) in attrs {
            if let Err(e) = serde_json::from_value::<tollgate_core::value::Value>(v) {
                return bad(Some(name), format!("undecodable value: {e}"));
            }
        }
        bad(None, format!("undecodable JSON: {whole}"))
    })
}

/// The stored text of `item` (`json.rs`); `room` is the length expected (the text it
/// replaces), so the text is written into one allocation.
fn encode(key: &Key, item: &Item, room: usize) -> Result<(String, Layout), StoreError> {
    let mut out = String::with_capacity(room.max(64) + 64);
    let mut layout = Layout::default();
    crate::json::write_item_laid_out(item, &mut out, &mut layout)
        .map_err(|e| unencodable(key, e))?;
    Ok((out, layout))
}

/// An item (or a difference of two) that JSON cannot hold.
fn unencodable(key: &Key, e: serde_json::Error) -> StoreError {
    StoreError::Validation(format!("item {key} cannot be encoded: {e}"))
}

/// Run `f` on the row id and stored value of one item within the connection's current
/// transaction (or autocommit); `None` when there is no row.
fn with_row<T>(
    conn: &Connection,
    key: &Key,
    f: impl FnOnce(i64, ValueRef<'_>) -> Result<T, StoreError>,
) -> Result<Option<T>, StoreError> {
    let mut stmt = conn
        .prepare_cached("SELECT id, item FROM items WHERE pk = ?1 AND sk = ?2")
        .map_err(|e| from_sqlite("prepare read", e))?;
    let mut rows = stmt
        .query(params![key.pk, key.sk])
        .map_err(|e| from_sqlite("read", e))?;
    match rows.next().map_err(|e| from_sqlite("read", e))? {
        None => Ok(None),
        Some(row) => {
            let id = row.get::<_, i64>(0).map_err(|e| from_sqlite("read", e))?;
            f(id, row.get_ref(1).map_err(|e| from_sqlite("read", e))?).map(Some)
        }
    }
}

/// Read one item within the connection's current transaction (or autocommit).
pub(crate) fn read_item(conn: &Connection, key: &Key) -> Result<Option<Item>, StoreError> {
    with_row(conn, key, |_, raw| decode(key, raw))
}

/// The row id and stored text of one item (undecoded: also an item that cannot be
/// decoded).
fn read_raw(conn: &Connection, key: &Key) -> Result<Option<(i64, String)>, StoreError> {
    conn.prepare_cached("SELECT id, item FROM items WHERE pk = ?1 AND sk = ?2")
        .and_then(|mut s| {
            s.query_row(params![key.pk, key.sk], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .map_err(|e| from_sqlite("read", e))
}

/// A row as a write found it: its stored text (the change feed's old image), the item
/// decoded from it (for the condition, the update and the index columns) and its row id
/// (where an update in place rewrites it).
struct Stored {
    raw: String,
    /// Where `raw`'s attributes lie, when the writer wrote it (empty: unknown).
    layout: Layout,
    item: Arc<Item>,
    id: i64,
    /// Taken from the [`Memo`] (trusted, or its text found stored): a write that ends up
    /// writing nothing gives it back ([`Memo::give_back`]).
    remembered: bool,
}

/// One row the writer remembers.
#[derive(Debug)]
struct Held {
    /// The row's stored text, byte for byte.
    text: String,
    /// Where its attributes lie (empty: unknown, the text was read from the file).
    layout: Layout,
    /// The item decoded from it (or encoded into it).
    item: Arc<Item>,
    /// The row's id (`items.id`).
    id: i64,
    /// [`Memo::epoch`] when the row was last known to hold `text`: written, or read and
    /// compared, inside a batch transaction.
    epoch: u64,
}

impl From<Held> for Stored {
    fn from(h: Held) -> Self {
        Stored {
            raw: h.text,
            layout: h.layout,
            item: h.item,
            id: h.id,
            remembered: true,
        }
    }
}

/// What the writer keeps from one operation to the next: the text and decoded item of the
/// rows it last wrote, and the changes committed updates publish.
///
/// A remembered row is used in one of two ways. While it is *trusted* (see
/// [`Memo::begin_batch`], the rule's one home) the memo is exact for it: a write takes its
/// old text and item from the memo without reading the row at all. Otherwise (another
/// connection committed since, or a batch or a transaction's SAVEPOINT was rolled back) the
/// write reads the row, and the memo spares only the decoding, when the row still holds the
/// very text remembered. A write of a row takes its entry out of the memo and puts back what
/// it stored, so an entry never outlives a write it does not know of.
#[derive(Debug, Default)]
pub struct Memo {
    rows: HashMap<Key, Held, foldhash::fast::RandomState>,
    /// Versions updates replaced, oldest first: once nothing else holds one (the feed
    /// reader has let go of it), a later update writes its new version into that memory
    /// instead of copying the item into a new allocation ([`Memo::spare`]).
    spares: VecDeque<Arc<Item>>,
    /// Versions updates replaced since `tidied` (see [`Memo::tidy_spares`]).
    replaced: usize,
    /// When the spares were last cut down.
    tidied: Option<std::time::Instant>,
    /// The trust generation: an entry is trusted when its [`Held::epoch`] is this. Advanced
    /// whenever the memo may no longer be exact ([`Memo::distrust`]).
    epoch: u64,
    /// `PRAGMA data_version` at the start of the current batch.
    batch_version: Option<i64>,
    /// `PRAGMA data_version` at the start of the last batch, if that batch committed (and so
    /// did every batch since the memo was last distrusted); `None` after a batch that did
    /// not commit (rolled back, failed, panicked) and before the first.
    committed_version: Option<i64>,
    /// The changes the current batch recorded whose images the writer knows decoded, with
    /// their sequence numbers: for [`crate::recent::Recent`] once the batch has committed.
    pub published: Vec<(i64, Published)>,
    /// Whether this batch's change rows may leave out the new images of the changes it
    /// publishes (`feed::record`); the writer sets it for each batch.
    pub omit_new: bool,
}

/// Most rows [`Memo`] remembers (each a decoded item, its text and its layout, about 3.4 KB
/// for a bucket of one limit): past it, it starts over.
const MEMO_ROWS: usize = 4_096;

/// Most replaced versions [`Memo`] keeps for reuse (about 2 KB each for a bucket of one
/// limit, so at most about 32 MB): the feed reader of this process holds a version until
/// its next pass (1 s apart by default) has read it, so the spares cover a pass's writes
/// up to about 16,000 a second. Like the memory store's spares, they are not given back
/// to the allocator while the writer is idle, but [`Memo::tidy_spares`] keeps no more
/// of them than the last [`SPARES_PERIOD`]'s updates replaced.
const MEMO_SPARES: usize = 16_384;

/// How often [`Memo::tidy_spares`] cuts the spares down to what was replaced meanwhile.
const SPARES_PERIOD: std::time::Duration = std::time::Duration::from_secs(2);

/// `PRAGMA data_version` of the connection: it changes between two reads on the same
/// connection exactly when another connection committed in between (never for the
/// connection's own commits).
pub fn data_version(conn: &Connection) -> Result<i64, StoreError> {
    conn.prepare_cached("PRAGMA data_version")
        .and_then(|mut s| s.query_row([], |r| r.get::<_, i64>(0)))
        .map_err(|e| from_sqlite("read data_version", e))
}

impl Memo {
    /// Start a batch, inside its `BEGIN IMMEDIATE` (the write lock held), given the
    /// connection's `PRAGMA data_version` (`None`: it could not be read).
    ///
    /// **The writer trusts its memo only while no other connection has committed** — and
    /// only while everything it remembered was committed: the memo stays trusted into this
    /// batch exactly when `data_version` is the value read at the start of the previous
    /// batch and that batch committed ([`Memo::committed`]). SQLite changes `data_version`
    /// when another connection (of this process or another) commits, not for this
    /// connection's own commits, so then every row still holds what this writer last
    /// wrote or read of it. Otherwise (another connection committed, the first batch, the
    /// previous batch rolled back, failed to commit or panicked) the memo is distrusted:
    /// every remembered row is read again before it is used. A SAVEPOINT rolled back
    /// within the batch distrusts it too ([`Memo::distrust`]).
    ///
    /// Returns whether the memo stayed trusted: no other connection committed between the
    /// previous batch, which committed, and this one.
    pub fn begin_batch(&mut self, data_version: Option<i64>) -> bool {
        let unchanged = data_version.is_some() && data_version == self.committed_version;
        if !unchanged {
            self.distrust();
        }
        self.batch_version = data_version;
        // Until this batch commits, what it remembers may be rolled back.
        self.committed_version = None;
        unchanged
    }

    /// The batch begun by [`Memo::begin_batch`] committed: what it remembered is stored.
    pub fn committed(&mut self) {
        self.committed_version = self.batch_version.take();
    }

    /// From now on no remembered row is used before it is read again and found to hold the
    /// text remembered (a rollback took back writes the memo remembers).
    pub fn distrust(&mut self) {
        self.epoch += 1;
    }

    /// A change recorded as `seq` (if one was) from `old` to `new`, for the feed reader of
    /// this process once the batch commits.
    fn publish(
        &mut self,
        written: &Written,
        key: &Key,
        old: Option<Arc<Item>>,
        new: Option<Arc<Item>>,
    ) {
        if let Some(seq) = written.seq {
            let key = key.clone();
            let at_ms = written.at_ms;
            self.published.push((
                seq,
                Published {
                    key,
                    old,
                    new,
                    at_ms,
                },
            ));
        }
    }

    /// Remember what a write stored at `key`, trusted for the rest of the batch (the
    /// writer holds the write lock) and beyond it under [`Memo::begin_batch`]'s rule.
    fn remember(&mut self, key: &Key, text: String, layout: Layout, item: Arc<Item>, id: i64) {
        if self.rows.len() >= MEMO_ROWS && !self.rows.contains_key(key) {
            self.rows.clear();
        }
        let epoch = self.epoch;
        let held = Held {
            text,
            layout,
            item,
            id,
            epoch,
        };
        self.rows.insert(key.clone(), held);
    }

    /// Keep `old`, the version an update replaced, to be written over once nothing else
    /// holds it; when [`MEMO_SPARES`] are kept already, let it go (the oldest are the
    /// first let go of by the feed reader).
    fn keep_spare(&mut self, old: Arc<Item>) {
        self.replaced += 1;
        if self.spares.len() < MEMO_SPARES {
            self.spares.push_back(old);
        }
    }

    /// Once every [`SPARES_PERIOD`] (the writer calls it before each batch): keep no more
    /// spares than the period's updates replaced, so that after a burst the memory of its
    /// copies is given back as the write rate falls.
    pub fn tidy_spares(&mut self, now: std::time::Instant) {
        match self.tidied {
            Some(t) if now.saturating_duration_since(t) < SPARES_PERIOD => {}
            _ => {
                self.spares.truncate(self.replaced);
                self.replaced = 0;
                self.tidied = Some(now);
            }
        }
    }

    /// The oldest kept version, once nothing else holds it (the feed reader lets go of
    /// versions in about the order they were written): while it is still held, none.
    fn spare(&mut self) -> Option<Arc<Item>> {
        let oldest = self.spares.front_mut()?;
        Arc::get_mut(oldest)?;
        self.spares.pop_front()
    }

    /// Put back a row [`Memo::take_trusted`] or [`read_stored`] took out of the memo, when
    /// the write that took it wrote nothing (the row still holds it); its item.
    fn give_back(&mut self, key: &Key, stored: Stored) -> Arc<Item> {
        let item = Arc::clone(&stored.item);
        if stored.remembered {
            self.remember(key, stored.raw, stored.layout, stored.item, stored.id);
        }
        item
    }

    /// Take the row at `key` out of the memo for a write of it: `Some` when the memo is
    /// trusted for it (the row is not read), `None` when it is not held or not trusted (the
    /// entry is dropped: the write reads the row).
    fn take_trusted(&mut self, conn: &Connection, key: &Key) -> Option<Stored> {
        let held = self.rows.remove(key)?;
        (held.epoch == self.epoch).then(|| trusted(conn, key, held))
    }
}

/// A trusted entry, as the row it stands for. Trust holds only inside the writer's batch
/// transaction; debug builds check it against the row on every use.
fn trusted(conn: &Connection, key: &Key, held: Held) -> Stored {
    debug_assert!(
        !conn.is_autocommit(),
        "the memo is trusted only inside the batch transaction"
    );
    debug_assert!(
        read_raw(conn, key).map_or(true, |t| t.as_ref().map(|(id, t)| (*id, t.as_str()))
            == Some((held.id, held.text.as_str()))),
        "the memo is trusted for {key}, but the row no longer holds the text remembered"
    );
    Stored::from(held)
}

/// Read one item with its stored text, in one statement (a write needs both), taking its
/// entry out of `memo`: not read at all when the memo is trusted for it, decoded only when
/// the memo does not hold that very text.
fn read_stored(
    conn: &Connection,
    key: &Key,
    memo: &mut Memo,
) -> Result<Option<Stored>, StoreError> {
    let held = match memo.rows.remove(key) {
        Some(h) if h.epoch == memo.epoch => return Ok(Some(trusted(conn, key, h))),
        other => other,
    };
    with_row(conn, key, |id, stored| {
        if let (ValueRef::Text(b), Some(h)) = (stored, held) {
            if b == h.text.as_bytes() && id == h.id {
                return Ok(Stored::from(h));
            }
        }
        let item = decode(key, stored)?;
        // It decoded, so it is JSON text: UTF-8.
        let raw = match stored {
            ValueRef::Text(b) | ValueRef::Blob(b) => String::from_utf8_lossy(b).into_owned(),
            _ => String::new(),
        };
        Ok(Stored {
            raw,
            layout: Layout::default(),
            item: Arc::new(item),
            id,
            remembered: false,
        })
    })
}

/// What a write knows of the row it replaces.
enum Prior<'a> {
    /// Nothing: the write reads the stored text itself.
    Unread,
    /// Read by the same operation in the same transaction (`None`: there is no row).
    Read(Option<&'a Stored>),
}

/// The attributes copied into the index columns, in column order (`gsi1pk` … `gsi4sk`).
const INDEX_ATTRS: [&str; 8] = [
    "GSI1PK", "GSI1SK", "GSI2PK", "GSI2SK", "GSI3PK", "GSI3SK", "GSI4PK", "GSI4SK",
];

/// An index column's value: the attribute when it is a string (DynamoDB indexes only
/// string keys), NULL otherwise.
fn index_col<'i>(item: &'i Item, attr: &str) -> Option<&'i str> {
    item.get(attr).and_then(|v| v.as_s())
}

/// The greatest of [`INDEX_ATTRS`] in `str`'s order.
const LAST_INDEX_ATTR: &str = "GSI4SK";

/// The index columns' values an item holds (its string-valued index attributes), in name
/// order: one walk over the item's first attributes, no look-up. An item's attributes come
/// in name order (`str`'s), so the walk ends at the first name past [`LAST_INDEX_ATTR`]
/// (a limiter bucket's index attributes are its first eight of about thirty).
fn index_cols(item: &Item) -> impl Iterator<Item = (&str, &str)> + '_ {
    item.iter()
        .map(|(n, v)| (n.as_str(), v))
        .take_while(|(n, _)| *n <= LAST_INDEX_ATTR)
        .filter_map(|(n, v)| {
            (n.starts_with("GSI") && INDEX_ATTRS.contains(&n))
                .then(|| v.as_s().map(|s| (n, s)))
                .flatten()
        })
}

/// Write (`Some`) or delete (`None`) one item, refreshing its index columns, and record the
/// change on the feed in the same transaction ([`crate::feed::record`]). A row that exists
/// and keeps its index columns is rewritten in place (an `UPDATE` of the item text, which
/// touches no index); any other is replaced whole.
fn write_item(
    conn: &Connection,
    key: &Key,
    item: Option<&Item>,
    prior: Prior<'_>,
    omit_new: bool,
) -> Result<Written, StoreError> {
    let (old, old_id, old_item, old_layout) = match prior {
        Prior::Unread => match read_raw(conn, key)? {
            Some((id, text)) => (Some(Cow::Owned(text)), Some(id), None, None),
            None => (None, None, None, None),
        },
        Prior::Read(p) => (
            p.map(|s| Cow::Borrowed(s.raw.as_str())),
            p.map(|s| s.id),
            p.map(|s| &*s.item),
            p.map(|s| &s.layout),
        ),
    };
    let at = now_ms();
    let Some(item) = item else {
        if old.is_none() {
            return Ok(Written::default());
        }
        conn.prepare_cached("DELETE FROM items WHERE pk = ?1 AND sk = ?2")
            .and_then(|mut s| s.execute(params![key.pk, key.sk]))
            .map_err(|e| from_sqlite("delete", e))?;
        let old = old.as_deref().map_or(OldImage::None, OldImage::Text);
        let seq = crate::feed::record(conn, key, old, None, omit_new, at)?;
        return Ok(Written {
            seq,
            at_ms: at,
            text: None,
            layout: Layout::default(),
            id: 0,
            existed: true,
        });
    };
    debug_assert_eq!(
        Key::of(item).as_ref(),
        Some(key),
        "items are stamped before writing"
    );
    // The new text and the old image's difference from it, written from the old text
    // when the writer laid that out and the two items have the same names (nearly every
    // limiter write: `json::rewrite`); otherwise encoded whole, the difference below.
    let mut diff = String::new();
    // `rewritten`: `Some(whether an index attribute changed)` when written from the old text.
    let (json, layout, rewritten) = match (old.as_deref(), old_item, old_layout) {
        (Some(text), Some(o), Some(l)) if l.covers(o) && o.same_names(item) => {
            let old = crate::json::LaidOut {
                text,
                layout: l,
                item: o,
            };
            let r = crate::json::rewrite(old, item, |n| INDEX_ATTRS.contains(&n))
                .map_err(|e| unencodable(key, e))?;
            diff = r.diff;
            let (json, layout, index_changed) = (r.text, r.layout, r.watched_changed);
            (json, layout, Some(index_changed))
        }
        _ => {
            let (json, layout) = encode(key, item, old.as_deref().map_or(0, str::len))?;
            (json, layout, None)
        }
    };
    // In place when the index columns stay: with the same names, surely when no index
    // attribute's value changed; otherwise (one did, or the text was encoded whole) the
    // columns are compared (a value may change between two that are not strings, which no
    // column holds).
    let in_place = match (old_id, old_item, rewritten) {
        (Some(id), Some(_), Some(false)) => Some(id),
        (Some(id), Some(o), _) => index_cols(o).eq(index_cols(item)).then_some(id),
        _ => None,
    };
    debug_assert!(
        in_place.is_none()
            == (old_id.is_none() || old_item.is_none_or(|o| !index_cols(o).eq(index_cols(item)))),
        "rewritten in place exactly when the index columns stay"
    );
    let id = if let Some(id) = in_place {
        // By its row id: the key index is not searched, let alone written.
        let n = conn
            .prepare_cached("UPDATE items SET item = ?2 WHERE id = ?1")
            .and_then(|mut s| s.execute(params![id, json]))
            .map_err(|e| from_sqlite("write", e))?;
        debug_assert_eq!(n, 1, "the row read in this transaction is there");
        id
    } else {
        let c = |i: usize| index_col(item, INDEX_ATTRS[i]);
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
                c(0),
                c(1),
                c(2),
                c(3),
                c(4),
                c(5),
                c(6),
                c(7),
            ])
        })
        .map_err(|e| from_sqlite("write", e))?;
        conn.last_insert_rowid()
    };
    // The old image goes on the feed as its difference from the new one when the writer
    // holds it decoded (`diff.rs`): the row then leaves the new image out (`feed::Form`).
    let existed = old.is_some();
    let old = match (old.as_deref(), old_item) {
        (None, _) => OldImage::None,
        (Some(text), Some(o)) if text != json => {
            if rewritten.is_none() {
                crate::diff::write_diff(o, item, &mut diff).map_err(|e| unencodable(key, e))?;
            }
            OldImage::Diff { text, diff: &diff }
        }
        (Some(text), _) => OldImage::Text(text),
    };
    let seq = crate::feed::record(conn, key, old, Some(&json), omit_new, at)?;
    Ok(Written {
        seq,
        at_ms: at,
        text: Some(json),
        layout,
        id,
        existed,
    })
}

/// What [`write_item`] did.
#[derive(Debug, Default)]
struct Written {
    /// The change's sequence number on the feed (`None`: nothing changed, nothing recorded).
    seq: Option<i64>,
    /// When the change was recorded (the feed's `at_ms`; 0 when nothing was).
    at_ms: i64,
    /// The text stored (`None`: the item was deleted, or nothing was written).
    text: Option<String>,
    /// Where its attributes lie.
    layout: Layout,
    /// The row id of the text stored.
    id: i64,
    /// Whether there was a row before the write.
    existed: bool,
}

/// A read: on a read connection (its own snapshot), or, for an in-memory database, inside
/// the writer's transaction.
#[derive(Debug)]
pub enum Read {
    /// `get`.
    Get(Key),
    /// `batch_get` (keys checked by [`tollgate_store::validate_batch_keys`]).
    BatchGet(Vec<Key>),
    /// `query`.
    Query(Query),
    /// `scan`: a page of the items whose partition key begins with `prefix`, after `after`.
    Scan {
        /// The partition-key prefix.
        prefix: String,
        /// Start after this key (`None`: from the first).
        after: Option<Key>,
        /// At most this many entries.
        limit: usize,
    },
    /// `PRAGMA integrity_check`.
    IntegrityCheck,
    /// The change feed after a cursor.
    Feed {
        /// Read after this.
        cursor: tollgate_store::FeedCursor,
        /// At most this many changes.
        limit: usize,
        /// How many rebuilt changes to keep for the next reads.
        window: usize,
        /// What this process's writer committed, decoded.
        recent: Arc<crate::recent::Recent>,
    },
}

/// A write, statically checked by the caller before it is queued (so a bad request fails
/// before its condition is read, as DynamoDB does, and never waits for the writer).
#[derive(Debug)]
pub enum Write {
    /// `put` (item checked).
    Put(PutRequest),
    /// `update` (update checked).
    Update(UpdateRequest),
    /// `delete`.
    Delete(DeleteRequest),
    /// `purge`: delete without reading the old item.
    Purge(Key),
    /// Forget the feed's changes at or before the cursor written before the instant (ms).
    TrimFeed(tollgate_store::FeedCursor, i64),
    /// `transact_write`, checked by [`check_transaction`], which computed the fingerprint
    /// stored with the token.
    Transact {
        /// The operations.
        ops: Vec<TransactOp>,
        /// The idempotency token.
        token: Option<String>,
        /// The operations' fingerprint, when there is a token.
        fingerprint: Option<String>,
    },
}

impl Write {
    /// How many items the write addresses: its weight in a group commit's bound.
    pub fn items(&self) -> usize {
        match self {
            Write::Transact { ops, .. } => ops.len(),
            Write::Put(_) | Write::Update(_) | Write::Delete(_) | Write::Purge(_) => 1,
            Write::TrimFeed(..) => 1,
        }
    }
}

/// What an operation answers.
#[derive(Debug)]
pub enum Outcome {
    /// `put` and `transact_write`.
    Done,
    /// `get`, `delete`.
    Item(Option<Item>),
    /// `update`: the item as the store holds it (also published to the feed reader).
    Shared(Option<Arc<Item>>),
    /// `batch_get`.
    Items(Vec<Option<Item>>),
    /// `query`.
    List(Vec<Item>),
    /// `scan`.
    Page(ScanPage),
    /// `integrity_check`: SQLite's lines.
    Lines(Vec<String>),
    /// `read_feed`.
    Feed(tollgate_store::FeedBatch),
}

/// Run a read. `batch_get` reads every key from one snapshot: the enclosing transaction's, or
/// a deferred read transaction of its own.
pub fn read(conn: &Connection, r: &Read) -> Result<Outcome, StoreError> {
    match r {
        Read::Get(key) => read_item(conn, key).map(Outcome::Item),
        Read::BatchGet(keys) => {
            if !conn.is_autocommit() {
                return batch_get(conn, keys).map(Outcome::Items);
            }
            let tx = conn
                .unchecked_transaction()
                .map_err(|e| from_sqlite("begin read", e))?;
            let out = batch_get(&tx, keys)?;
            // A read transaction has nothing to make durable; finishing it only releases the
            // snapshot.
            tx.finish().map_err(|e| from_sqlite("end read", e))?;
            Ok(Outcome::Items(out))
        }
        Read::Query(q) => query(conn, q).map(Outcome::List),
        Read::Scan {
            prefix,
            after,
            limit,
        } => scan(conn, prefix, after.as_ref(), *limit).map(Outcome::Page),
        Read::IntegrityCheck => integrity_check(conn).map(Outcome::Lines),
        Read::Feed {
            cursor,
            limit,
            window,
            recent,
        } => {
            if !conn.is_autocommit() {
                // Inside the writer's transaction (an in-memory database): its state is
                // the snapshot. Nothing rebuilt is kept past the read: the batch around it
                // has not committed yet.
                return crate::feed::read_in(conn, cursor, *limit, 0, recent).map(Outcome::Feed);
            }
            crate::feed::read(conn, cursor, *limit, *window, recent).map(Outcome::Feed)
        }
    }
}

/// The batch transaction cannot go on: a write's partial effects could not be taken back.
/// Every operation of the batch fails with this error and the transaction is rolled back.
#[derive(Debug)]
pub struct BatchBroken(pub StoreError);

/// Run a write inside the writer's open transaction. The inner result is the operation's own;
/// [`BatchBroken`] means the whole batch must be abandoned.
/// `memo` is the writer's (see [`Memo`]).
pub fn write(
    tx: &mut Transaction<'_>,
    w: Write,
    memo: &mut Memo,
) -> Result<Result<Outcome, StoreError>, BatchBroken> {
    debug_assert!(
        !tx.is_autocommit(),
        "writes run inside the batch transaction"
    );
    Ok(match w {
        Write::Put(req) => put(tx, req, memo).map(|()| Outcome::Done),
        Write::Update(req) => update(tx, req, memo).map(Outcome::Shared),
        Write::Delete(req) => delete(tx, req, memo).map(Outcome::Item),
        Write::Purge(key) => purge(tx, &key, memo).map(|()| Outcome::Done),
        Write::TrimFeed(cursor, before) => {
            crate::feed::trim(tx, &cursor, before).map(|_| Outcome::Done)
        }
        Write::Transact {
            ops,
            token,
            fingerprint,
        } => transact_write(tx, &ops, token.as_deref(), fingerprint.as_deref(), memo)?
            .map(|()| Outcome::Done),
    })
}

fn batch_get(conn: &Connection, keys: &[Key]) -> Result<Vec<Option<Item>>, StoreError> {
    keys.iter().map(|k| read_item(conn, k)).collect()
}

fn integrity_check(conn: &Connection) -> Result<Vec<String>, StoreError> {
    let mut stmt = conn
        .prepare("PRAGMA integrity_check")
        .map_err(|e| from_sqlite("integrity check", e))?;
    let lines = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(|e| from_sqlite("integrity check", e))?;
    Ok(lines)
}

fn condition_failed(old: Option<Item>) -> StoreError {
    StoreError::ConditionFailed {
        old: old.map(Box::new),
    }
}

/// `put` (the item was checked by the caller). Without a condition the old item is not
/// read: the put replaces it whatever it holds, also an item that cannot be decoded. A row
/// the memo is trusted for is not read at all.
fn put(conn: &Connection, req: PutRequest, memo: &mut Memo) -> Result<(), StoreError> {
    let held = memo.take_trusted(conn, &req.key);
    if let Some(c) = &req.condition {
        match held {
            Some(h) if !eval_condition(Some(&h.item), c) => {
                let old = memo.give_back(&req.key, h);
                return Err(condition_failed(Some(Arc::unwrap_or_clone(old))));
            }
            Some(_) => {}
            None => {
                let cur = read_item(conn, &req.key)?;
                if !eval_condition(cur.as_ref(), c) {
                    return Err(condition_failed(cur));
                }
            }
        }
    }
    let mut item = req.item;
    req.key.stamp(&mut item);
    let prior = match &held {
        Some(h) => Prior::Read(Some(h)),
        None => Prior::Unread,
    };
    let w = write_item(conn, &req.key, Some(&item), prior, memo.omit_new)?;
    let item = Arc::new(item);
    // Published only when the old image is known decoded (the memo held it, or there was
    // none): a put does not decode the item it replaces.
    match held {
        Some(h) => memo.publish(&w, &req.key, Some(h.item), Some(Arc::clone(&item))),
        None if !w.existed => memo.publish(&w, &req.key, None, Some(Arc::clone(&item))),
        None => {}
    }
    if let Some(text) = w.text {
        memo.remember(&req.key, text, w.layout, item, w.id);
    }
    Ok(())
}

/// `purge`: delete without reading (or decoding) the old item, unless the memo is trusted
/// for it.
fn purge(conn: &Connection, key: &Key, memo: &mut Memo) -> Result<(), StoreError> {
    let held = memo.take_trusted(conn, key);
    let prior = match &held {
        Some(h) => Prior::Read(Some(h)),
        None => Prior::Unread,
    };
    let w = write_item(conn, key, None, prior, memo.omit_new)?;
    if let Some(h) = held {
        memo.publish(&w, key, Some(h.item), None);
    }
    Ok(())
}

/// `update`. Static checks failed the request before it was queued; a remove-only update of
/// an absent item creates nothing.
fn update(
    conn: &Connection,
    req: UpdateRequest,
    memo: &mut Memo,
) -> Result<Option<Arc<Item>>, StoreError> {
    let prior = read_stored(conn, &req.key, memo)?;
    let cur = prior.as_ref().map(|s| &*s.item);
    if let Some(c) = &req.condition {
        if !eval_condition(cur, c) {
            // Nothing written: what was taken out of the memo is still the row.
            let old = prior.map(|p| Arc::unwrap_or_clone(memo.give_back(&req.key, p)));
            return Err(condition_failed(old));
        }
    }
    let new = match updated(cur, &req, memo) {
        Ok(new) => new,
        Err(e) => {
            if let Some(p) = prior {
                memo.give_back(&req.key, p);
            }
            return Err(e);
        }
    };
    // An update of an item that exists always writes it.
    debug_assert!(prior.is_none() || new.is_some());
    if let Some(new) = &new {
        let w = write_item(
            conn,
            &req.key,
            Some(new),
            Prior::Read(prior.as_ref()),
            memo.omit_new,
        )?;
        // Decoded already: the feed reader of this process takes both images from here.
        let old = prior.as_ref().map(|s| Arc::clone(&s.item));
        if let Some(o) = &old {
            memo.keep_spare(Arc::clone(o));
        }
        memo.publish(&w, &req.key, old, Some(Arc::clone(new)));
        if let Some(text) = w.text {
            memo.remember(&req.key, text, w.layout, Arc::clone(new), w.id);
        }
    }
    // Absent before and after: nothing written.
    Ok(match req.returns {
        ReturnValues::None => None,
        ReturnValues::AllNew => new,
        ReturnValues::AllOld => prior.map(|s| s.item),
        ReturnValues::UpdatedNew => new.as_ref().and_then(|new| {
            let names: Vec<String> = req
                .update
                .actions
                .iter()
                .map(|a| a.target().to_string())
                .collect();
            // DynamoDB omits `Attributes` when nothing it wrote remains.
            Some(project(new, &names))
                .filter(|p| !p.is_empty())
                .map(Arc::new)
        }),
    })
}

/// The item `req` makes of `cur` ([`apply_update_stored`]'s result): an existing item's
/// new version is written into a replaced version's memory when the memo has one nothing
/// else holds ([`Memo::spare`]), as a copy of `cur` and then the actions — what
/// `apply_update_stored` does in a new allocation.
fn updated(
    cur: Option<&Item>,
    req: &UpdateRequest,
    memo: &mut Memo,
) -> Result<Option<Arc<Item>>, StoreError> {
    let mut spare = cur.and_then(|_| memo.spare());
    match (cur, spare.as_mut().and_then(Arc::get_mut)) {
        (Some(cur), Some(new)) => {
            validate_update(&req.update)?;
            new.clone_from_item(cur);
            apply_actions(new, cur, &req.update)?;
            Ok(spare)
        }
        _ => Ok(apply_update_stored(cur, &key_item(&req.key), &req.update)?.map(Arc::new)),
    }
}

/// `delete`.
fn delete(
    conn: &Connection,
    req: DeleteRequest,
    memo: &mut Memo,
) -> Result<Option<Item>, StoreError> {
    // The entry is taken out: once deleted, the row is not remembered.
    let prior = read_stored(conn, &req.key, memo)?;
    if let Some(c) = &req.condition {
        if !eval_condition(prior.as_ref().map(|s| &*s.item), c) {
            let old = prior.map(|p| Arc::unwrap_or_clone(memo.give_back(&req.key, p)));
            return Err(condition_failed(old));
        }
    }
    if let Some(p) = &prior {
        let w = write_item(conn, &req.key, None, Prior::Read(Some(p)), memo.omit_new)?;
        memo.publish(&w, &req.key, Some(Arc::clone(&p.item)), None);
    }
    Ok(prior.map(|s| Arc::unwrap_or_clone(s.item)))
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

/// The static checks of `transact_write`, before anything is read; returns the fingerprint
/// to store with the token (when there is one).
pub fn check_transaction(
    ops: &[TransactOp],
    token: Option<&str>,
) -> Result<Option<String>, StoreError> {
    validate_transaction(ops)?;
    validate_token(token)?;
    match token {
        Some(_) => fingerprint(ops).map(Some),
        None => Ok(None),
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// `transact_write`, under a SAVEPOINT of the batch transaction: check the token, plan every
/// operation against the state before it, and either write all of them (and the token) or
/// nothing. A failure midway rolls back to the savepoint, undoing this transaction's writes
/// only; if even that fails the error says the batch cannot go on (see `writer.rs`). A
/// rollback to the savepoint distrusts the memo (it may remember rows written under it).
fn transact_write(
    tx: &mut Transaction<'_>,
    ops: &[TransactOp],
    token: Option<&str>,
    fingerprint: Option<&str>,
    memo: &mut Memo,
) -> Result<Result<(), StoreError>, BatchBroken> {
    debug_assert_eq!(token.is_some(), fingerprint.is_some());
    let mut sp = match tx.savepoint() {
        Ok(sp) => sp,
        Err(e) => return Ok(Err(from_sqlite("begin savepoint", e))),
    };
    let published = memo.published.len();
    match transact_body(&sp, ops, token, fingerprint, memo) {
        Ok(()) => sp
            .commit()
            .map(Ok)
            .map_err(|e| BatchBroken(from_sqlite("release savepoint", e))),
        Err(e) => {
            // Take back whatever this transaction wrote, then drop the savepoint; its changes'
            // numbers will be given again.
            memo.distrust();
            memo.published.truncate(published);
            sp.rollback().and_then(|()| sp.commit()).map_err(|re| {
                BatchBroken(StoreError::Unavailable(format!(
                    "sqlite rollback to savepoint failed ({re}) after: {e}"
                )))
            })?;
            Ok(Err(e))
        }
    }
}

/// What a transaction's operation found of its row: the memo's entry (trusted), or the item
/// read.
enum Found {
    Held(Stored),
    Read(Option<Arc<Item>>),
}

impl Found {
    fn item(&self) -> Option<&Item> {
        match self {
            Found::Held(s) => Some(&s.item),
            Found::Read(i) => i.as_deref(),
        }
    }

    /// The item, shared (for the change's old image).
    fn shared(&self) -> Option<Arc<Item>> {
        match self {
            Found::Held(s) => Some(Arc::clone(&s.item)),
            Found::Read(i) => i.clone(),
        }
    }
}

fn transact_body(
    conn: &Connection,
    ops: &[TransactOp],
    token: Option<&str>,
    fingerprint: Option<&str>,
    memo: &mut Memo,
) -> Result<(), StoreError> {
    if let (Some(t), Some(fp)) = (token, fingerprint) {
        let seen: Option<String> = conn
            .prepare_cached("SELECT ops FROM tokens WHERE token = ?1")
            .and_then(|mut s| s.query_row(params![t], |r| r.get(0)).optional())
            .map_err(|e| from_sqlite("read token", e))?;
        if let Some(seen) = seen {
            // DynamoDB: the same token with other parameters is refused
            // (IdempotentParameterMismatch); with the same ones it succeeds, unapplied.
            return if seen == fp {
                Ok(())
            } else {
                Err(StoreError::Validation(format!(
                    "idempotent parameter mismatch: token {t} was used for another transaction"
                )))
            };
        }
    }
    // Read everything first: the keys are distinct (validated), so this is the state before
    // the transaction for every operation. Each key's entry is taken out of the memo (the
    // ones trusted stand for their rows); on any failure the caller distrusts the memo.
    let found = ops
        .iter()
        .map(|op| match memo.take_trusted(conn, op.key()) {
            Some(s) => Ok(Found::Held(s)),
            None => read_item(conn, op.key()).map(|i| Found::Read(i.map(Arc::new))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut planned = Vec::with_capacity(ops.len());
    let mut reasons = Vec::with_capacity(ops.len());
    let mut failed = false;
    for (op, old) in ops.iter().zip(&found) {
        match plan_transact_op(op, old.item()) {
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
        // Nothing was written yet.
        return Err(StoreError::TransactionCanceled { reasons });
    }
    for ((op, p), old) in ops.iter().zip(planned).zip(found) {
        let key = op.key();
        let Some(new) = p else {
            // Nothing to write (a check): the entry taken is still the row.
            if let Found::Held(s) = old {
                memo.give_back(key, s);
            }
            continue;
        };
        let prior = match &old {
            Found::Held(s) => Prior::Read(Some(s)),
            Found::Read(_) => Prior::Unread,
        };
        let w = write_item(conn, key, new.as_ref(), prior, memo.omit_new)?;
        let new = new.map(Arc::new);
        memo.publish(&w, key, old.shared(), new.clone());
        if let (Some(text), Some(new)) = (w.text, new) {
            memo.remember(key, text, w.layout, new, w.id);
        }
    }
    if let (Some(t), Some(fp)) = (token, fingerprint) {
        conn.prepare_cached("INSERT INTO tokens (token, ops, created_ms) VALUES (?1, ?2, ?3)")
            .and_then(|mut s| s.execute(params![t, fp, now_ms()]))
            .map_err(|e| from_sqlite("write token", e))?;
    }
    Ok(())
}

/// `query`: one partition of the table or of an index, in sort-key order (byte order; SQLite's
/// BINARY collation compares UTF-8 with `memcmp`, as `MemoryStore` compares bytes). Items with
/// equal index sort keys come in primary-key order, as in `MemoryStore`.
fn query(conn: &Connection, q: &Query) -> Result<Vec<Item>, StoreError> {
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

/// `scan`: primary-key order from the first key with the prefix (or after `after`); the
/// keys with a prefix are contiguous in that order, so the first without it ends the scan.
fn scan(
    conn: &Connection,
    prefix: &str,
    after: Option<&Key>,
    limit: usize,
) -> Result<ScanPage, StoreError> {
    let limit = limit.max(1);
    let (from_pk, from_sk) = match after {
        Some(k) => (&*k.pk, Some(&*k.sk)),
        None => (prefix, None),
    };
    let mut stmt = conn
        .prepare_cached(
            "SELECT pk, sk, item FROM items
             WHERE pk >= ?1 AND (?2 IS NULL OR pk > ?1 OR sk > ?2)
             ORDER BY pk, sk LIMIT ?3",
        )
        .map_err(|e| from_sqlite("prepare scan", e))?;
    // One more than the page: whether there is a next one.
    let fetch = i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1);
    let mut rows = stmt
        .query(params![from_pk, from_sk, fetch])
        .map_err(|e| from_sqlite("scan", e))?;
    let mut page = ScanPage::default();
    let mut last = None;
    while let Some(row) = rows.next().map_err(|e| from_sqlite("scan", e))? {
        let key = Key::new(
            row.get::<_, String>(0)
                .map_err(|e| from_sqlite("scan", e))?,
            row.get::<_, String>(1)
                .map_err(|e| from_sqlite("scan", e))?,
        );
        if !key.pk.starts_with(prefix) {
            break;
        }
        if page.items.len() == limit {
            page.next = last;
            break;
        }
        let raw = row.get_ref(2).map_err(|e| from_sqlite("scan", e))?;
        page.items.push(decode_each(&key, raw));
        last = Some(key);
    }
    Ok(page)
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
        if item.get(pk_attr.as_str()).and_then(|v| v.as_s()) != Some(pk) {
            continue;
        }
        let Some(sort) = item.get(sk_attr.as_str()).and_then(|v| v.as_s()) else {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};
    use tollgate_core::value::Value;

    /// The walk for the index columns stops past [`LAST_INDEX_ATTR`], which is the greatest
    /// index attribute: it finds every string-valued one, wherever the other names sort.
    #[test]
    fn index_columns_are_found_before_the_walk_stops() {
        assert!(INDEX_ATTRS.contains(&LAST_INDEX_ATTR));
        assert!(INDEX_ATTRS.iter().all(|a| *a <= LAST_INDEX_ATTR));
        let mut item = Item::new();
        for (i, n) in [
            "A", "GSI", "GSI1", "GSI4SJ", "GSI4SKX", "PK", "SK", "b_x", "zz",
        ]
        .into_iter()
        .enumerate()
        {
            item.insert(n.into(), Value::N(i as i64));
        }
        for (i, a) in INDEX_ATTRS.iter().enumerate() {
            let v = if i == 3 {
                Value::N(3)
            } else {
                Value::S(format!("v{i}"))
            };
            item.insert((*a).into(), v);
        }
        let found: Vec<(&str, &str)> = index_cols(&item).collect();
        let want: Vec<(&str, String)> = INDEX_ATTRS
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 3)
            .map(|(i, a)| (*a, format!("v{i}")))
            .collect();
        assert_eq!(
            found,
            want.iter()
                .map(|(a, v)| (*a, v.as_str()))
                .collect::<Vec<_>>()
        );
    }

    /// A replaced version is handed out again only once nothing else holds it, oldest
    /// first; and every [`SPARES_PERIOD`] the spares are cut to what the period replaced.
    #[test]
    fn spares_come_free_in_order_and_shrink_with_the_write_rate() {
        let mut memo = Memo::default();
        let t0 = Instant::now();
        memo.tidy_spares(t0);
        let a = Arc::new(Item::new());
        let b = Arc::new(Item::new());
        memo.keep_spare(Arc::clone(&a));
        memo.keep_spare(Arc::clone(&b));
        // Both still held (by the feed, say): none.
        assert!(memo.spare().is_none());
        // The newer one comes free first: still none, the oldest is held.
        drop(b);
        assert!(memo.spare().is_none());
        drop(a);
        assert!(memo.spare().is_some());
        assert!(memo.spare().is_some());
        assert!(memo.spare().is_none());
        // Three replaced within the period; then a period in which one was.
        for _ in 0..3 {
            memo.keep_spare(Arc::new(Item::new()));
        }
        memo.tidy_spares(t0 + SPARES_PERIOD / 2);
        assert_eq!(memo.spares.len(), 3, "not yet a period");
        memo.tidy_spares(t0 + SPARES_PERIOD);
        assert_eq!(memo.spares.len(), 3, "a period's worth is kept");
        memo.keep_spare(Arc::new(Item::new()));
        memo.tidy_spares(t0 + SPARES_PERIOD * 2 + Duration::from_millis(1));
        assert_eq!(memo.spares.len(), 1, "cut to what the last period replaced");
        memo.tidy_spares(t0 + SPARES_PERIOD * 4);
        assert!(memo.spares.is_empty(), "an idle period keeps none");
    }
}
