//! The on-disk layout: one `items` table, one `tokens` table, the schema version in
//! `PRAGMA user_version`.

use rusqlite::{Connection, TransactionBehavior};
use tollgate_store::StoreError;

use crate::error::from_sqlite;

/// The schema version this build writes and understands.
pub const SCHEMA_VERSION: i64 = 1;

/// Indexes whose key attributes (`GSI{n}PK` / `GSI{n}SK`) get their own columns.
pub const INDEXES: [&str; 4] = ["GSI1", "GSI2", "GSI3", "GSI4"];

/// Version 1. Tokens are kept with the operations they carried (JSON), as `MemoryStore`
/// keeps them, so a token reused for other operations is refused. Items are stored whole as JSON (`serde_json` of the `Item`); the index key
/// attributes are copied into columns at write time so index queries use a B-tree. A
/// column holds the attribute only when it is a string (as DynamoDB and `MemoryStore`
/// index only string keys); otherwise it is NULL and the item is not in that index.
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

/// Create the schema if the file is new, or check that it is one this build understands.
///
/// Runs inside `BEGIN IMMEDIATE`, so several processes opening a new file at once create the
/// schema exactly once.
pub fn ensure(conn: &mut Connection) -> Result<(), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| from_sqlite("begin schema transaction", e))?;
    let version: i64 = tx
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| from_sqlite("read schema version", e))?;
    match version {
        0 => {
            tx.execute_batch(SCHEMA_V1)
                .map_err(|e| from_sqlite("create schema", e))?;
            tx.pragma_update(None, "user_version", SCHEMA_VERSION)
                .map_err(|e| from_sqlite("write schema version", e))?;
        }
        SCHEMA_VERSION => {}
        v => {
            return Err(StoreError::Unavailable(format!(
                "the file has schema version {v}; this build understands {SCHEMA_VERSION}"
            )))
        }
    }
    tx.commit().map_err(|e| from_sqlite("commit schema", e))
}
