//! How SQLite's errors become [`StoreError`]s.

use rusqlite::ErrorCode;
use tollgate_store::StoreError;

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
