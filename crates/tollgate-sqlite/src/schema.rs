//! The on-disk layout: one `items` table, one `tokens` table, one `changes` table (the
//! change feed, `feed.rs`), the schema version in `PRAGMA user_version`.

use rusqlite::{Connection, TransactionBehavior};
use tollgate_store::StoreError;

use crate::error::{from_open, SchemaError};

/// The schema version this build writes and understands: 5. Version 2 added the `changes`
/// table of the change feed to version 1; version 3 keeps the items in a rowid table (see
/// [`ITEMS_V3`]) and numbers the changes without `AUTOINCREMENT` (see `feed.rs`); version 4
/// adds the `old_diff` column, where a change's old image is kept as its difference from
/// the new one (`diff.rs`); version 5 leaves out a change's new image when the image after
/// it gives it (`feed::Form`: the same table, rows a version-4 reader would misread, hence
/// the new number). A file of version 1 to 4 is upgraded when opened.
pub const SCHEMA_VERSION: i64 = 5;

/// Indexes whose key attributes (`GSI{n}PK` / `GSI{n}SK`) get their own columns.
pub const INDEXES: [&str; 4] = ["GSI1", "GSI2", "GSI3", "GSI4"];

/// The tokens table (version 1 on). Tokens are kept with the operations they carried
/// (JSON), as `MemoryStore` keeps them, so a token reused for other operations is refused.
const TOKENS: &str = "
CREATE TABLE IF NOT EXISTS tokens (
    token      TEXT PRIMARY KEY,
    ops        TEXT NOT NULL,
    created_ms INTEGER NOT NULL
) WITHOUT ROWID;
";

/// Version 3's `items`. Items are stored whole as JSON (`serde_json` of the `Item`); the
/// index key attributes are copied into columns at write time so index queries use a
/// B-tree. A column holds the attribute only when it is a string (as DynamoDB and
/// `MemoryStore` index only string keys); otherwise it is NULL and the item is not in that
/// index.
///
/// Versions 1 and 2 kept the same columns in a `WITHOUT ROWID` table keyed by `(pk, sk)`.
/// Version 3 puts them behind a rowid, the key `(pk, sk)` a unique index. Why: a
/// `WITHOUT ROWID` table keeps a row whole in its B-tree page only up to about 1,000 bytes
/// (a quarter of a 4 KB page); a limiter bucket of one limit is about 1,000 bytes with its
/// index columns, so most spilled to an overflow page, and every write of one rewrote two
/// pages (plus the free-list pages its overflow chain moved through) where one would do. A
/// rowid table keeps rows up to about 4,000 bytes in the page. A write that keeps the key
/// and index columns (nearly every write) changes only the row's page; the key index is
/// read, not written.
///
/// The index entries carry `(pk, sk)` after the index's own key, so a query's order (index
/// sort key, then primary key) is the index's order and needs no sort, as before, when the
/// entries carried the primary key implicitly.
const ITEMS_V3: &str = "
CREATE TABLE items (
    id     INTEGER PRIMARY KEY,
    pk     TEXT NOT NULL,
    sk     TEXT NOT NULL,
    item   TEXT NOT NULL,
    gsi1pk TEXT, gsi1sk TEXT,
    gsi2pk TEXT, gsi2sk TEXT,
    gsi3pk TEXT, gsi3sk TEXT,
    gsi4pk TEXT, gsi4sk TEXT
);
CREATE UNIQUE INDEX items_key ON items (pk, sk);
CREATE INDEX items_gsi1 ON items (gsi1pk, gsi1sk, pk, sk) WHERE gsi1pk IS NOT NULL;
CREATE INDEX items_gsi2 ON items (gsi2pk, gsi2sk, pk, sk) WHERE gsi2pk IS NOT NULL;
CREATE INDEX items_gsi3 ON items (gsi3pk, gsi3sk, pk, sk) WHERE gsi3pk IS NOT NULL;
CREATE INDEX items_gsi4 ON items (gsi4pk, gsi4sk, pk, sk) WHERE gsi4pk IS NOT NULL;
";

/// Version 1's and 2's `items` columns, in order, as `PRAGMA table_info` lists them.
const ITEMS_V1_COLUMNS: &[&str] = &[
    "pk", "sk", "item", "gsi1pk", "gsi1sk", "gsi2pk", "gsi2sk", "gsi3pk", "gsi3sk", "gsi4pk",
    "gsi4sk",
];

/// Version 3's `items` columns.
const ITEMS_V3_COLUMNS: &[&str] = &[
    "id", "pk", "sk", "item", "gsi1pk", "gsi1sk", "gsi2pk", "gsi2sk", "gsi3pk", "gsi3sk", "gsi4pk",
    "gsi4sk",
];

/// The `tokens` columns (every version).
const TOKENS_COLUMNS: &[&str] = &["token", "ops", "created_ms"];

/// The tables a file of `version` must hold, with their columns.
fn tables_of(version: i64) -> Vec<(&'static str, &'static [&'static str])> {
    let mut t = vec![
        (
            "items",
            if version >= 3 {
                ITEMS_V3_COLUMNS
            } else {
                ITEMS_V1_COLUMNS
            },
        ),
        ("tokens", TOKENS_COLUMNS),
    ];
    if version >= 4 {
        t.push(("changes", crate::feed::CHANGES_COLUMNS));
    } else if version >= 2 {
        t.push(("changes", crate::feed::CHANGES_COLUMNS_V3));
    }
    t
}

/// Refuse, before anything is written (not even the journal mode), a file this build must
/// not use: see [`check`]. Reads only, from one snapshot (another process may be creating
/// the schema meanwhile: the version and the tables must be read from the same state).
pub fn precheck(conn: &Connection, path: &str) -> Result<(), StoreError> {
    let tx = conn
        .unchecked_transaction()
        .map_err(|e| from_open(path, "begin schema check of", e))?;
    check(&tx, path)?;
    tx.finish()
        .map_err(|e| from_open(path, "end schema check of", e))
}

/// The file's schema version, once it is known to be one this build can use: 0 (a new, empty
/// file), or 1 to [`SCHEMA_VERSION`] with that version's tables. A file of another version, or with
/// other tables, is a [`SchemaError`] naming `path` (so [`StoreError::Validation`], never
/// `Unavailable`).
fn check(conn: &Connection, path: &str) -> Result<i64, StoreError> {
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| from_open(path, "read schema version of", e))?;
    match version {
        0 => {
            // A tollgate file gets its version in the transaction that creates its tables, so
            // version 0 with tables is someone else's database.
            let tables = table_names(conn, path)?;
            if !tables.is_empty() {
                return Err(SchemaError::NotTollgate {
                    path: path.to_string(),
                    reason: format!(
                        "it has no schema version but holds tables ({})",
                        tables.join(", ")
                    ),
                }
                .into());
            }
        }
        1..=SCHEMA_VERSION => {
            for (table, want) in tables_of(version) {
                check_columns(conn, path, version, table, want)?;
            }
        }
        found => {
            return Err(SchemaError::Version {
                path: path.to_string(),
                found,
                expected: SCHEMA_VERSION,
            }
            .into())
        }
    }
    Ok(version)
}

/// Create the schema if the file is new, or check that it is one this build understands
/// ([`check`], again: another process may have created it since the precheck).
///
/// Runs inside `BEGIN IMMEDIATE`, so several processes opening a new file at once create the
/// schema exactly once.
pub fn ensure(conn: &mut Connection, path: &str) -> Result<(), StoreError> {
    // A store already at this version is only read: its open takes no write lock, so a
    // writer stuck elsewhere (another process holding the lock) does not stop an open —
    // the calls then meet the lock within their deadlines, and the policy decides.
    // Read from one snapshot, as the precheck does: the version and the tables read by two
    // autocommit statements could straddle another opener's schema commit and look like
    // "no version but tables" (a concurrent first open failed that way under load).
    let current = {
        let tx = conn
            .unchecked_transaction()
            .map_err(|e| from_open(path, "begin schema check of", e))?;
        let v = check(&tx, path)?;
        tx.finish()
            .map_err(|e| from_open(path, "end schema check of", e))?;
        v
    };
    if current == SCHEMA_VERSION {
        return Ok(());
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| from_open(path, "begin schema transaction on", e))?;
    let found = check(&tx, path)?;
    if found == 0 {
        // A new file: this version's tables straight away.
        tx.execute_batch(TOKENS)
            .and_then(|()| tx.execute_batch(ITEMS_V3))
            .and_then(|()| tx.execute_batch(crate::feed::CHANGES_TABLE))
            .map_err(|e| from_open(path, "create schema in", e))?;
    } else {
        if found < 2 {
            // The change feed's table (an upgrade of a version-1 file adds it; the feed
            // starts empty, at the upgrade).
            tx.execute_batch(crate::feed::CHANGES_TABLE)
                .map_err(|e| from_open(path, "create the changes table in", e))?;
        }
        if found == 2 {
            upgrade_changes_to_v3(&tx, path)?;
        }
        if found < 3 {
            upgrade_items_to_v3(&tx, path)?;
        }
        // Version 5 changes no table: every row a version-4 file holds stores its new image
        // and reads as before (`feed::Form::Whole`).
        if found == 3 {
            // Version 4: old images may be stored as differences. Every row already held
            // keeps its whole old image (`old_diff` NULL), read as before.
            tx.execute_batch("ALTER TABLE changes ADD COLUMN old_diff TEXT;")
                .map_err(|e| {
                    from_open(path, "upgrade the changes table (schema version 4) of", e)
                })?;
        }
    }
    if found < SCHEMA_VERSION {
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(|e| from_open(path, "write schema version of", e))?;
    }
    tx.commit()
        .map_err(|e| from_open(path, "commit schema of", e))
}

/// Version 3: the items move, unchanged, from version 1's `WITHOUT ROWID` table into
/// [`ITEMS_V3`] (in key order, so the new table is written front to back), inside the
/// schema transaction: a failure leaves the file as it was.
fn upgrade_items_to_v3(tx: &Connection, path: &str) -> Result<(), StoreError> {
    tx.execute_batch(
        "ALTER TABLE items RENAME TO items_v1;
         DROP INDEX IF EXISTS items_gsi1;
         DROP INDEX IF EXISTS items_gsi2;
         DROP INDEX IF EXISTS items_gsi3;
         DROP INDEX IF EXISTS items_gsi4;",
    )
    .and_then(|()| tx.execute_batch(ITEMS_V3))
    .and_then(|()| {
        tx.execute_batch(
            "INSERT INTO items
                (pk, sk, item, gsi1pk, gsi1sk, gsi2pk, gsi2sk, gsi3pk, gsi3sk, gsi4pk, gsi4sk)
             SELECT pk, sk, item, gsi1pk, gsi1sk, gsi2pk, gsi2sk, gsi3pk, gsi3sk, gsi4pk, gsi4sk
             FROM items_v1 ORDER BY pk, sk;
             DROP TABLE items_v1;",
        )
    })
    .map_err(|e| from_open(path, "upgrade the items table (schema version 3) of", e))
}

/// Version 3: the changes move, unchanged and with their numbers, into a table numbered
/// without `AUTOINCREMENT` (`feed.rs` says why; the table created is this version's, so a
/// version-2 file gets version 4's `old_diff` column here too). The highest number version
/// 2 gave stays the highest given: it is the newest row's, or, when the feed was trimmed
/// empty, a marker's.
fn upgrade_changes_to_v3(tx: &Connection, path: &str) -> Result<(), StoreError> {
    let failed = |e| from_open(path, "upgrade the changes table (schema version 3) of", e);
    tx.execute_batch("ALTER TABLE changes RENAME TO changes_v2;")
        .and_then(|()| tx.execute_batch(crate::feed::CHANGES_TABLE))
        .and_then(|()| {
            tx.execute_batch(
                "INSERT INTO changes (seq, pk, sk, old, new, at_ms)
                 SELECT seq, pk, sk, old, new, at_ms FROM changes_v2 ORDER BY seq;",
            )
        })
        .map_err(failed)?;
    let given: i64 = tx
        .query_row(
            "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'changes_v2'), 0)",
            [],
            |r| r.get(0),
        )
        .map_err(failed)?;
    let newest: i64 = tx
        .query_row("SELECT coalesce(max(seq), 0) FROM changes", [], |r| {
            r.get(0)
        })
        .map_err(failed)?;
    if given > newest {
        tx.execute(crate::feed::MARKER, [given]).map_err(failed)?;
    }
    tx.execute_batch("DROP TABLE changes_v2;").map_err(failed)
}

fn table_names(conn: &Connection, path: &str) -> Result<Vec<String>, StoreError> {
    let mut stmt = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .map_err(|e| from_open(path, "list tables of", e))?;
    let names = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(|e| from_open(path, "list tables of", e))?;
    Ok(names)
}

/// Table `table` must exist with exactly the columns `want` (those of schema `version`).
fn check_columns(
    conn: &Connection,
    path: &str,
    version: i64,
    table: &str,
    want: &[&str],
) -> Result<(), StoreError> {
    {
        let mut stmt = conn
            .prepare("SELECT name FROM pragma_table_info(?1) ORDER BY cid")
            .map_err(|e| from_open(path, "read the tables of", e))?;
        let have = stmt
            .query_map([table], |r| r.get::<_, String>(0))
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| from_open(path, "read the tables of", e))?;
        if have != want {
            let reason = if have.is_empty() {
                format!("schema version {version} but no table {table}")
            } else {
                format!(
                    "schema version {version} but table {table} has columns ({}), not ({})",
                    have.join(", "),
                    want.join(", ")
                )
            };
            return Err(SchemaError::NotTollgate {
                path: path.to_string(),
                reason,
            }
            .into());
        }
    }
    Ok(())
}
