//! The on-disk layout: one `items` table, one `tokens` table, the schema version in
//! `PRAGMA user_version`.

use rusqlite::{Connection, TransactionBehavior};
use tollgate_store::StoreError;

use crate::error::{from_open, SchemaError};

/// The schema version this build writes and understands: 2 (version 1 and the `changes`
/// table of the change feed). A version-1 file is upgraded when opened.
pub const SCHEMA_VERSION: i64 = 2;

/// Indexes whose key attributes (`GSI{n}PK` / `GSI{n}SK`) get their own columns.
pub const INDEXES: [&str; 4] = ["GSI1", "GSI2", "GSI3", "GSI4"];

/// Version 1. Tokens are kept with the operations they carried (JSON), as `MemoryStore`
/// keeps them, so a token reused for other operations is refused. Items are stored whole as
/// JSON (`serde_json` of the `Item`); the index key attributes are copied into columns at
/// write time so index queries use a B-tree. A column holds the attribute only when it is a
/// string (as DynamoDB and `MemoryStore` index only string keys); otherwise it is NULL and the
/// item is not in that index.
const SCHEMA_V1: &str = "
CREATE TABLE IF NOT EXISTS items (
    pk     TEXT NOT NULL,
    sk     TEXT NOT NULL,
    item   TEXT NOT NULL,
    gsi1pk TEXT, gsi1sk TEXT,
    gsi2pk TEXT, gsi2sk TEXT,
    gsi3pk TEXT, gsi3sk TEXT,
    gsi4pk TEXT, gsi4sk TEXT,
    PRIMARY KEY (pk, sk)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS items_gsi1 ON items (gsi1pk, gsi1sk) WHERE gsi1pk IS NOT NULL;
CREATE INDEX IF NOT EXISTS items_gsi2 ON items (gsi2pk, gsi2sk) WHERE gsi2pk IS NOT NULL;
CREATE INDEX IF NOT EXISTS items_gsi3 ON items (gsi3pk, gsi3sk) WHERE gsi3pk IS NOT NULL;
CREATE INDEX IF NOT EXISTS items_gsi4 ON items (gsi4pk, gsi4sk) WHERE gsi4pk IS NOT NULL;
CREATE TABLE IF NOT EXISTS tokens (
    token      TEXT PRIMARY KEY,
    ops        TEXT NOT NULL,
    created_ms INTEGER NOT NULL
) WITHOUT ROWID;
";

/// The columns of version 1's tables, in order, as `PRAGMA table_info` lists them.
const V1_TABLES: [(&str, &[&str]); 2] = [
    (
        "items",
        &[
            "pk", "sk", "item", "gsi1pk", "gsi1sk", "gsi2pk", "gsi2sk", "gsi3pk", "gsi3sk",
            "gsi4pk", "gsi4sk",
        ],
    ),
    ("tokens", &["token", "ops", "created_ms"]),
];

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
/// file) or [`SCHEMA_VERSION`] with version 1's tables. A file of another version, or with
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
        1 => check_v1_tables(conn, path)?,
        SCHEMA_VERSION => {
            check_v1_tables(conn, path)?;
            check_columns(conn, path, "changes", crate::feed::CHANGES_COLUMNS)?;
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
        tx.execute_batch(SCHEMA_V1)
            .map_err(|e| from_open(path, "create schema in", e))?;
    }
    if found < SCHEMA_VERSION {
        // Version 2: the change feed's table (an upgrade of a version-1 file adds it; the
        // feed starts empty, at the upgrade).
        tx.execute_batch(crate::feed::CHANGES_TABLE)
            .map_err(|e| from_open(path, "create the changes table in", e))?;
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(|e| from_open(path, "write schema version of", e))?;
    }
    tx.commit()
        .map_err(|e| from_open(path, "commit schema of", e))
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

/// A file that says version 1 must have version 1's tables with their columns.
fn check_v1_tables(conn: &Connection, path: &str) -> Result<(), StoreError> {
    for (table, want) in V1_TABLES {
        check_columns(conn, path, table, want)?;
    }
    Ok(())
}

/// Table `table` must exist with exactly the columns `want`.
fn check_columns(
    conn: &Connection,
    path: &str,
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
                format!("schema version {SCHEMA_VERSION} but no table {table}")
            } else {
                format!(
                    "schema version {SCHEMA_VERSION} but table {table} has columns ({}), not ({})",
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
