//! How SQLite's errors become [`StoreError`]s, and [`SchemaError`]: a file this build must not
//! use (a configuration problem, never an outage).

use rusqlite::ErrorCode;
use tollgate_store::StoreError;

/// A file that is not a tollgate store this build can use. Not an outage: retrying cannot
/// help, and a limiter must not fail open on it. It becomes [`StoreError::Validation`] (with
/// the file named), so `is_unavailable()` is false.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// `PRAGMA user_version` holds a version this build does not write: a newer tollgate's
    /// file, or another application's.
    #[error(
        "{path}: schema version {found} is not one this build understands (it reads and writes \
         version {expected}); a newer tollgate wrote it, or it is not a tollgate store"
    )]
    Version {
        /// The file.
        path: String,
        /// Its `user_version`.
        found: i64,
        /// [`crate::SCHEMA_VERSION`].
        expected: i64,
    },
    /// The file is not a tollgate store (not SQLite at all, or SQLite with other tables).
    #[error("{path}: not a tollgate store: {reason}")]
    NotTollgate {
        /// The file.
        path: String,
        /// What gave it away.
        reason: String,
    },
}

impl From<SchemaError> for StoreError {
    fn from(e: SchemaError) -> Self {
        StoreError::Validation(e.to_string())
    }
}

/// Whether SQLite gave up waiting for a lock (after the busy timeout).
fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// An error before or while reading or writing, with nothing committed: the store could not be
/// used. Lock contention beyond the busy timeout says so in the message.
pub fn from_sqlite(context: &str, e: rusqlite::Error) -> StoreError {
    if is_busy(&e) {
        StoreError::Unavailable(format!(
            "sqlite {context}: database busy beyond the busy timeout: {e}"
        ))
    } else {
        StoreError::Unavailable(format!("sqlite {context}: {e}"))
    }
}

/// An error while opening or checking the file at `path`: SQLite's "not a database" is a
/// [`SchemaError::NotTollgate`]; anything else is [`from_sqlite`]'s.
pub fn from_open(path: &str, context: &str, e: rusqlite::Error) -> StoreError {
    if e.sqlite_error_code() == Some(ErrorCode::NotADatabase) {
        SchemaError::NotTollgate {
            path: path.to_string(),
            reason: format!("SQLite cannot read it as a database ({e})"),
        }
        .into()
    } else {
        from_sqlite(&format!("{context} {path}"), e)
    }
}

/// An error of `COMMIT`. A busy commit is rolled back (nothing applied); any other failure
/// (an I/O error, a full disk, a failed fsync) may have left the write durable or not, so the
/// outcome is [`StoreError::Ambiguous`].
pub fn from_commit(e: rusqlite::Error) -> StoreError {
    if is_busy(&e) {
        from_sqlite("commit", e)
    } else {
        StoreError::Ambiguous(format!("sqlite commit failed: {e}"))
    }
}
