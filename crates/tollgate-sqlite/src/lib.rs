//! `SqliteStore`: the embedded durable store of tollgate, one SQLite file that several
//! processes on one machine may share (the server and the CLI, or a pre-fork app).
//!
//! It implements [`tollgate_store::Store`] with exactly [`tollgate_store::MemoryStore`]'s
//! semantics: every write is one `BEGIN IMMEDIATE` … `COMMIT` transaction that reads the old
//! row, evaluates the condition and the update in Rust with [`tollgate_store::eval`], and
//! writes the new row. `BEGIN IMMEDIATE` takes SQLite's write lock before the read, so the
//! read-evaluate-write is atomic across connections and processes; a waiting writer blocks up
//! to the busy timeout, then gets [`StoreError::Unavailable`].
//!
//! # Durability
//!
//! The file runs in WAL mode with `synchronous=FULL`: every commit fsyncs the WAL before the
//! call returns. In WAL mode `synchronous=NORMAL` already survives a killed *process* (the
//! write is in the OS page cache), but an OS crash or power loss could then roll back commits
//! that were acknowledged; for a limiter an acknowledged debit that disappears is
//! over-admission, so `FULL` it is. The price is one fsync per commit: p50 0.3 ms in the
//! project's store probe (`reference/ecosystem.md` §3.3), a few ms on a slow or busy disk.
//! The crash test (`tests/crash.rs`) kills a writer with SIGKILL repeatedly and checks that
//! every acknowledged debit is in the reopened file.
//!
//! # Layout
//!
//! One `items` table keyed by `(pk, sk)`, the item stored whole as JSON, with the key attributes
//! of the indexes `GSI1` … `GSI4` copied into columns for index queries; a `tokens` table of
//! transaction idempotency tokens; the schema version in `PRAGMA user_version`.
//!
//! # Async
//!
//! rusqlite is blocking. Each call locks the store's one connection and runs on tokio's
//! blocking pool (`spawn_blocking`), so a commit's fsync or a wait for another process's lock
//! never stalls the async workers. Outside a tokio runtime the call runs inline.
//! Eventually consistent reads are simply consistent here.

mod error;
mod ops;
mod schema;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OpenFlags};
use tollgate_core::value::{Item, Key};
use tollgate_store::{
    DeleteRequest, PutRequest, Query, Store, StoreError, TransactOp, UpdateRequest,
};

pub use schema::SCHEMA_VERSION;

use crate::error::from_sqlite;

/// The path that opens a private in-memory database instead of a file.
pub const IN_MEMORY: &str = ":memory:";

/// How a [`SqliteStore`] opens its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteConfig {
    /// How long a write waits for another connection's (or process's) write lock before the
    /// call fails with [`StoreError::Unavailable`].
    pub busy_timeout: Duration,
}

impl Default for SqliteConfig {
    /// A 5 s busy timeout: far above a commit's fsync, short enough to surface a stuck holder.
    fn default() -> Self {
        SqliteConfig {
            busy_timeout: Duration::from_secs(5),
        }
    }
}

/// A [`Store`] over one SQLite file (or an in-memory database). Cheap to clone: clones share
/// one connection. Open the same file twice (in one process or several) for two connections.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    path: Arc<str>,
}

impl SqliteStore {
    /// Open (creating if missing) the database at `path`, or a private in-memory database for
    /// [`IN_MEMORY`], with the default [`SqliteConfig`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path, &SqliteConfig::default())
    }

    /// A private in-memory database (for tests; nothing is durable).
    pub fn open_in_memory() -> Result<Self, StoreError> {
        Self::open(IN_MEMORY)
    }

    /// Open with explicit settings. Sets the busy timeout, WAL journal mode,
    /// `synchronous=FULL`, and creates or checks the schema.
    pub fn open_with(path: impl AsRef<Path>, config: &SqliteConfig) -> Result<Self, StoreError> {
        let path = path.as_ref();
        let mut conn = if path == Path::new(IN_MEMORY) {
            Connection::open_in_memory()
        } else {
            Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_WRITE
                    | OpenFlags::SQLITE_OPEN_CREATE
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX
                    | OpenFlags::SQLITE_OPEN_URI,
            )
        }
        .map_err(|e| StoreError::Unavailable(format!("sqlite open {}: {e}", path.display())))?;
        configure(&mut conn, config)?;
        schema::ensure(&mut conn)?;
        Ok(SqliteStore {
            conn: Arc::new(Mutex::new(conn)),
            path: Arc::from(path.display().to_string()),
        })
    }

    /// Open an existing database read-only: never creates the file or changes it (no journal
    /// mode or schema setup); every write fails. A missing file, or a file that is not a
    /// tollgate database of this schema version, is [`StoreError::Unavailable`].
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref();
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_URI,
        )
        .map_err(|e| StoreError::Unavailable(format!("sqlite open {}: {e}", path.display())))?;
        conn.busy_timeout(SqliteConfig::default().busy_timeout)
            .map_err(|e| from_sqlite("set busy timeout", e))?;
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| from_sqlite("read schema version", e))?;
        if version != SCHEMA_VERSION {
            return Err(StoreError::Unavailable(format!(
                "{} has schema version {version}; this build reads {SCHEMA_VERSION}",
                path.display()
            )));
        }
        Ok(SqliteStore {
            conn: Arc::new(Mutex::new(conn)),
            path: Arc::from(path.display().to_string()),
        })
    }

    /// The path this store was opened with.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(&*self.path)
    }

    /// Run SQLite's `PRAGMA integrity_check`: `Ok` when the file is sound, otherwise
    /// [`StoreError::Corrupt`] with SQLite's findings.
    pub fn integrity_check(&self) -> Result<(), StoreError> {
        let conn = self.lock();
        let mut stmt = conn
            .prepare("PRAGMA integrity_check")
            .map_err(|e| from_sqlite("integrity check", e))?;
        let lines = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| from_sqlite("integrity check", e))?;
        if lines == ["ok"] {
            Ok(())
        } else {
            Err(StoreError::Corrupt(format!(
                "{}: integrity check: {}",
                self.path,
                lines.join("; ")
            )))
        }
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        lock_conn(&self.conn)
    }

    /// Run one blocking operation on the connection, off the async workers.
    async fn run<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let conn = Arc::clone(&self.conn);
        let job = move || f(&mut lock_conn(&conn));
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => handle
                .spawn_blocking(job)
                .await
                .map_err(|e| StoreError::Unavailable(format!("sqlite worker failed: {e}")))?,
            Err(_) => job(),
        }
    }
}

/// Lock the connection. A panic while it was held cannot have committed half a write (every
/// write is one SQLite transaction), but it may have left a transaction open: roll it back.
fn lock_conn(conn: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    let guard = conn.lock().unwrap_or_else(|e| e.into_inner());
    if !guard.is_autocommit() {
        if let Err(e) = guard.execute_batch("ROLLBACK") {
            tracing::warn!(error = %e, "rolling back a transaction left open failed");
        }
    }
    guard
}

fn configure(conn: &mut Connection, config: &SqliteConfig) -> Result<(), StoreError> {
    conn.busy_timeout(config.busy_timeout)
        .map_err(|e| from_sqlite("set busy timeout", e))?;
    // WAL: readers never block the writer and a commit appends to one file. The mode is stored
    // in the file; an in-memory database answers "memory", which is fine.
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(|e| from_sqlite("set journal_mode", e))?;
    if !mode.eq_ignore_ascii_case("wal") && !mode.eq_ignore_ascii_case("memory") {
        return Err(StoreError::Unavailable(format!(
            "sqlite refused WAL journal mode (got {mode})"
        )));
    }
    // FULL: fsync the WAL at every commit (see the crate docs for why not NORMAL).
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(|e| from_sqlite("set synchronous", e))?;
    conn.pragma_update(None, "foreign_keys", "OFF")
        .map_err(|e| from_sqlite("set foreign_keys", e))?;
    Ok(())
}

#[async_trait]
impl Store for SqliteStore {
    async fn get(&self, key: &Key, _consistent: bool) -> Result<Option<Item>, StoreError> {
        let key = key.clone();
        self.run(move |c| ops::get(c, &key)).await
    }

    async fn batch_get(
        &self,
        keys: &[Key],
        _consistent: bool,
    ) -> Result<Vec<Option<Item>>, StoreError> {
        let keys = keys.to_vec();
        self.run(move |c| ops::batch_get(c, &keys)).await
    }

    async fn put(&self, req: PutRequest) -> Result<(), StoreError> {
        self.run(move |c| ops::put(c, req)).await
    }

    async fn update(&self, req: UpdateRequest) -> Result<Option<Item>, StoreError> {
        self.run(move |c| ops::update(c, req)).await
    }

    async fn delete(&self, req: DeleteRequest) -> Result<Option<Item>, StoreError> {
        self.run(move |c| ops::delete(c, req)).await
    }

    async fn transact_write(
        &self,
        ops: Vec<TransactOp>,
        token: Option<String>,
    ) -> Result<(), StoreError> {
        self.run(move |c| ops::transact_write(c, &ops, token.as_deref()))
            .await
    }

    async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError> {
        self.run(move |c| ops::query(c, &q)).await
    }

    fn backend(&self) -> &'static str {
        "sqlite"
    }
}
