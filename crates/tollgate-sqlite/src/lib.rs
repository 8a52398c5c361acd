//! `SqliteStore`: the embedded durable store of tollgate, one SQLite file that several
//! processes on one machine may share (the server and the CLI, or a pre-fork app).
//!
//! It implements [`tollgate_store::Store`] with exactly [`tollgate_store::MemoryStore`]'s
//! semantics: a write reads the old row, evaluates the condition and the update in Rust with
//! [`tollgate_store::eval`], and writes the new row, inside `BEGIN IMMEDIATE` … `COMMIT`.
//! `BEGIN IMMEDIATE` takes SQLite's write lock before the read, so the read-evaluate-write is
//! atomic across connections and processes.
//!
//! # Group commit
//!
//! One writer thread per store owns the write connection. Concurrent writes are queued and
//! run together: everything queued when the writer is free (at most
//! [`SqliteConfig::max_batch_ops`] items, no wait for more) becomes one `BEGIN IMMEDIATE` …
//! `COMMIT`, one fsync, each operation keeping its own condition and result. How batches
//! form, and what a failure fails, is in `writer.rs`; [`SqliteStore::group_commit_stats`]
//! counts them. Reads run on separate read connections (WAL readers never wait for the
//! writer) and see every write acknowledged before they were issued. An in-memory database
//! has only one connection, so its reads go through the writer too.
//!
//! # Durability
//!
//! The file runs in WAL mode with `synchronous=FULL`: every commit fsyncs the WAL before any
//! of its writes is acknowledged. In WAL mode `synchronous=NORMAL` already survives a killed
//! *process* (the write is in the OS page cache), but an OS crash or power loss could then
//! roll back commits that were acknowledged; for a limiter an acknowledged debit that
//! disappears is over-admission, so `FULL` it is. The price is one fsync per commit — shared,
//! since group commit, by every write of the batch (`benches/group_commit.rs` measures it:
//! about 0.15 ms per acknowledged write at one task on the development machine's disk, a few
//! ms on a slow or busy one). The crash test
//! (`tests/crash.rs`) kills a writer with SIGKILL repeatedly and checks that every
//! acknowledged debit is in the reopened file.
//!
//! A file's WAL is copied into the database file by a checkpointer thread on its own
//! connection (`checkpoint.rs`), so a commit no longer waits for a 1,000-page checkpoint;
//! durability is the WAL's fsync at every commit, unchanged.
//!
//! # Deadlines and errors
//!
//! Every call is bounded by [`SqliteConfig::deadline`] (1 s by default): the wait for the
//! writer, for a read connection and for another connection's write lock. A call that cannot
//! get them in time fails with [`StoreError::Unavailable`]. A file this build must not use (a
//! newer or foreign schema version, another application's database, not SQLite at all) is a
//! [`SchemaError`], reported as [`StoreError::Validation`] naming the file: a configuration
//! problem, not an outage.
//!
//! # Layout
//!
//! One `items` table (a rowid table, its key `(pk, sk)` a unique index), the item stored
//! whole as JSON, with the key attributes of the indexes `GSI1` … `GSI4` copied into columns
//! for index queries; a `tokens` table of transaction idempotency tokens; a `changes` table,
//! the change feed (one row per applied write, in the write's transaction: see `feed.rs`);
//! the schema version in `PRAGMA user_version` (5; a file of version 1 to 4 is upgraded
//! on open). Why the items have a rowid since version 3 is in `schema.rs`: a limiter bucket
//! no longer spills to an overflow page, so a write rewrites one page of the table.
//!
//! A write reads its row once, or not at all when the writer remembers it and may trust
//! that memory (no other connection has committed since, nothing was rolled back: see
//! `ops::Memo::begin_batch`); an existing row whose index columns stay the same is
//! rewritten in place (`UPDATE` of the item text, no index touched). A row the writer wrote
//! itself is written again from its old text when the names stay the same: only the
//! changed values are encoded, the rest copied, and the feed's old-image difference is the
//! changed members of the old text (`json::rewrite`, the same bytes as a whole encoding).
//! The feed reader of a process takes both images of each change that process's writer
//! committed from the writer, already decoded (`recent.rs`), without copying the stored
//! texts; only other processes' changes are decoded from text, each old image shared with
//! the previous change's new one of the same key. A trim removes the oldest changes up to
//! the first still retained, walking only those.
//!
//! # Async
//!
//! rusqlite is blocking. Writes are handed to the writer thread and awaited; reads run on
//! tokio's blocking pool (`spawn_blocking`), so neither a commit's fsync nor a lock wait ever
//! stalls the async workers. Outside a tokio runtime a call blocks its thread until answered.
//! Eventually consistent reads are simply consistent here.

mod checkpoint;
mod config;
mod diff;
mod error;
mod feed;
mod json;
mod ops;
mod queue;
mod readers;
mod recent;
mod schema;
mod stats;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rusqlite::{Connection, OpenFlags};
use tokio::sync::oneshot;
use tollgate_core::value::{Item, Key};
use tollgate_store::eval::{validate_item, validate_update};
use tollgate_store::{
    DeleteRequest, PutRequest, Query, ScanPage, Store, StoreError, TransactOp, UpdateRequest,
};

pub use config::{SqliteConfig, DEFAULT_BUSY_TIMEOUT, DEFAULT_DEADLINE, DEFAULT_MAX_BATCH_OPS};
pub use error::SchemaError;
pub use feed::TRIM_MAX_CHANGES;
pub use schema::SCHEMA_VERSION;
pub use stats::{FeedReadStats, GroupCommitStats, SIZE_BUCKETS};

use crate::error::from_open;
use crate::ops::{Outcome, Read, Write};
use crate::queue::{Answer, Job, Queue, Reply, Request};
use crate::readers::Readers;
use crate::recent::Recent;

/// The path that opens a private in-memory database instead of a file.
pub const IN_MEMORY: &str = ":memory:";

/// A [`Store`] over one SQLite file (or an in-memory database). Cheap to clone: clones share
/// one writer and one set of read connections. Open the same file twice (in one process or
/// several) for two independent stores; SQLite's lock serialises their commits.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

/// What the clones share. Dropping the last one stops the writer (after its current batch)
/// and closes the connections.
struct Inner {
    queue: Arc<Queue>,
    /// `None` for an in-memory database: its reads go through the writer.
    readers: Option<Arc<Readers>>,
    path: Arc<str>,
    deadline: Duration,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// What the writer committed, decoded, for the feed reader (`recent.rs`).
    recent: Arc<Recent>,
    /// [`SqliteConfig::feed_rebuild_window`].
    rebuild_window: usize,
    /// The checkpointer's pacer of a file store (`checkpoint.rs`).
    pacer: Option<Arc<checkpoint::Pacer>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.queue.close();
        if let Some(pacer) = &self.pacer {
            pacer.close();
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            if t.thread().id() != std::thread::current().id() && t.join().is_err() {
                tracing::warn!(path = %self.path, "a sqlite store thread panicked");
            }
        }
    }
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

    /// Open with explicit settings. Sets the busy timeout, refuses a file that is not a
    /// tollgate store of this schema version ([`SchemaError`], as
    /// [`StoreError::Validation`]) before writing anything to it, sets WAL journal mode and
    /// `synchronous=FULL`, creates or checks the schema, and starts the writer.
    pub fn open_with(path: impl AsRef<Path>, config: &SqliteConfig) -> Result<Self, StoreError> {
        config.validate()?;
        let path = path.as_ref();
        let shown = path.display().to_string();
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
        .map_err(|e| from_open(&shown, "open", e))?;
        conn.busy_timeout(config.busy_timeout)
            .map_err(|e| from_open(&shown, "set busy timeout on", e))?;
        schema::precheck(&conn, &shown)?;
        configure(&mut conn, &shown)?;
        schema::ensure(&mut conn, &shown)?;
        // SQLite names no file for a private (in-memory or temporary) database: a second
        // connection would open another database, so reads share the writer's.
        let private = conn.path().is_none_or(str::is_empty);
        let readers = (!private).then(|| {
            Arc::new(Readers::new(
                path.to_path_buf(),
                config.busy_timeout.min(config.deadline),
            ))
        });
        let queue = Arc::new(Queue::new());
        let bounds = writer::Bounds {
            max_batch_items: config.max_batch_ops,
            busy_timeout: config.busy_timeout,
        };
        let spawn_failed = |e: std::io::Error| {
            StoreError::Unavailable(format!("sqlite {shown}: cannot start a thread: {e}"))
        };
        let recent = Arc::new(Recent::default());
        // A file's checkpoints run on their own thread and connection (`checkpoint.rs`), so
        // no commit waits for one; a private database has no second connection.
        let checkpointer = match private {
            true => None,
            false => {
                let c = Connection::open_with_flags(
                    path,
                    OpenFlags::SQLITE_OPEN_READ_WRITE
                        | OpenFlags::SQLITE_OPEN_NO_MUTEX
                        | OpenFlags::SQLITE_OPEN_URI,
                )
                .map_err(|e| from_open(&shown, "open the checkpointer's connection to", e))?;
                Some((c, Arc::new(checkpoint::Pacer::default())))
            }
        };
        let pacer = checkpointer.as_ref().map(|(_, p)| Arc::clone(p));
        let writer = {
            let queue = Arc::clone(&queue);
            let sinks = writer::Sinks {
                recent: Arc::clone(&recent),
                pacer: pacer.clone(),
            };
            std::thread::Builder::new()
                .name("tollgate-sqlite-writer".into())
                .spawn(move || writer::run(conn, queue, bounds, sinks))
                .map_err(spawn_failed)?
        };
        let inner = Inner {
            queue: Arc::clone(&queue),
            readers,
            path: Arc::from(shown.as_str()),
            deadline: config.deadline,
            recent,
            rebuild_window: config.feed_rebuild_window,
            pacer,
            threads: Mutex::new(vec![writer]),
        };
        // From here `inner` stops the writer if anything fails.
        let deadline = config.deadline;
        let watchdog = std::thread::Builder::new()
            .name("tollgate-sqlite-watchdog".into())
            .spawn(move || queue.watch(deadline))
            .map_err(spawn_failed)?;
        inner
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(watchdog);
        if let Some((c, pacer)) = checkpointer {
            let shown = shown.clone();
            let t = std::thread::Builder::new()
                .name("tollgate-sqlite-checkpoint".into())
                .spawn(move || checkpoint::run(c, &pacer, &shown))
                .map_err(spawn_failed)?;
            inner
                .threads
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(t);
        }
        Ok(SqliteStore {
            inner: Arc::new(inner),
        })
    }

    /// Open an existing database for the read-only commands: never creates the file. The
    /// file is first checked through a read-only connection (it exists, and it is a
    /// tollgate database of this schema version — otherwise [`StoreError::Unavailable`]
    /// naming the file), then opened as usual; an existing tollgate file already has its
    /// journal mode and schema, so opening it changes nothing.
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_read_only_with(path, &SqliteConfig::default())
    }

    /// [`SqliteStore::open_read_only`] with explicit settings.
    pub fn open_read_only_with(
        path: impl AsRef<Path>,
        config: &SqliteConfig,
    ) -> Result<Self, StoreError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        {
            let conn = Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_ONLY
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX
                    | OpenFlags::SQLITE_OPEN_URI,
            )
            .map_err(|e| StoreError::Unavailable(format!("sqlite open {shown}: {e}")))?;
            conn.busy_timeout(SqliteConfig::default().busy_timeout)
                .map_err(|e| from_open(&shown, "set busy timeout on", e))?;
            let version: i64 = conn
                .query_row("PRAGMA user_version", [], |r| r.get(0))
                .map_err(|e| StoreError::Unavailable(format!("sqlite {shown}: {e}")))?;
            if (1..SCHEMA_VERSION).contains(&version) {
                // Read-only: no upgrade here (another, older process may still use it).
                return Err(StoreError::Unavailable(format!(
                    "{shown} has schema version {version}, from an older tollgate; this build \
                     reads {SCHEMA_VERSION}, and a command that writes (`tollgate serve`, \
                     `tollgate limits set`) upgrades the file when it opens it"
                )));
            }
            if version != SCHEMA_VERSION {
                return Err(StoreError::Unavailable(format!(
                    "{shown} has schema version {version}; this build reads {SCHEMA_VERSION}"
                )));
            }
        }
        Self::open_with(path, config)
    }

    /// The path this store was opened with.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(&*self.inner.path)
    }

    /// The per-call deadline this store was opened with.
    pub fn deadline(&self) -> Duration {
        self.inner.deadline
    }

    /// How the group commits formed so far.
    pub fn group_commit_stats(&self) -> GroupCommitStats {
        self.inner.queue.counters.snapshot()
    }

    /// How this store's change-feed reads were served so far.
    pub fn feed_read_stats(&self) -> FeedReadStats {
        self.inner.recent.reads().snapshot()
    }

    /// Run SQLite's `PRAGMA integrity_check`: `Ok` when the file is sound, otherwise
    /// [`StoreError::Corrupt`] with SQLite's findings. Blocks the calling thread.
    pub fn integrity_check(&self) -> Result<(), StoreError> {
        let deadline = Instant::now() + self.inner.deadline;
        let answer = match &self.inner.readers {
            Some(readers) => readers.run(deadline, &Read::IntegrityCheck),
            None => {
                let (tx, rx) = std::sync::mpsc::sync_channel(1);
                self.submit(
                    Job::Read(Read::IntegrityCheck),
                    deadline,
                    Reply::Blocking(tx),
                )?;
                rx.recv().unwrap_or_else(|_| Err(writer_stopped()))
            }
        };
        match answer? {
            Outcome::Lines(lines) if lines == ["ok"] => Ok(()),
            Outcome::Lines(lines) => Err(StoreError::Corrupt(format!(
                "{}: integrity check: {}",
                self.inner.path,
                lines.join("; ")
            ))),
            other => Err(mismatch("integrity_check", &other)),
        }
    }

    fn submit(&self, job: Job, deadline: Instant, reply: Reply) -> Result<(), StoreError> {
        let request = Request {
            job,
            queued_at: Instant::now(),
            deadline,
            reply,
        };
        self.inner.queue.push(request).map_err(|_| {
            StoreError::Unavailable(format!(
                "sqlite {}: the writer has stopped",
                self.inner.path
            ))
        })
    }

    /// Queue a job for the writer and wait for its answer.
    async fn call_writer(&self, job: Job) -> Answer {
        let deadline = Instant::now() + self.inner.deadline;
        if tokio::runtime::Handle::try_current().is_ok() {
            let (tx, rx) = oneshot::channel();
            self.submit(job, deadline, Reply::Async(tx))?;
            rx.await.unwrap_or_else(|_| Err(writer_stopped()))
        } else {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            self.submit(job, deadline, Reply::Blocking(tx))?;
            rx.recv().unwrap_or_else(|_| Err(writer_stopped()))
        }
    }

    async fn write(&self, w: Write) -> Answer {
        self.call_writer(Job::Write(w)).await
    }

    /// Run a read on a read connection, off the async workers (or through the writer for an
    /// in-memory database).
    async fn read(&self, r: Read) -> Answer {
        let Some(readers) = &self.inner.readers else {
            return self.call_writer(Job::Read(r)).await;
        };
        let deadline = Instant::now() + self.inner.deadline;
        let readers = Arc::clone(readers);
        let job = move || readers.run(deadline, &r);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => handle.spawn_blocking(job).await.unwrap_or_else(|e| {
                Err(StoreError::Unavailable(format!("sqlite read failed: {e}")))
            }),
            Err(_) => job(),
        }
    }
}

/// The writer dropped a reply unanswered: it panicked in the batch (rolled back).
fn writer_stopped() -> StoreError {
    StoreError::Unavailable(
        "sqlite: the writer stopped before answering; nothing of its batch was applied".into(),
    )
}

/// An answer of the wrong kind: a bug in this crate, reported rather than panicking.
fn mismatch(call: &str, got: &Outcome) -> StoreError {
    debug_assert!(false, "sqlite {call} answered {got:?}");
    StoreError::Unavailable(format!("sqlite: internal: {call} answered {got:?}"))
}

fn configure(conn: &mut Connection, path: &str) -> Result<(), StoreError> {
    // WAL: readers never block the writer and a commit appends to one file. The mode is stored
    // in the file; an in-memory database answers "memory", which is fine.
    // The switch needs the file's exclusive lock, and SQLite answers BUSY at once rather
    // than wait in the busy handler when another connection is opening the same new file
    // (a lock it could deadlock on): retry it, briefly and boundedly.
    let mut attempt = 0u32;
    let mode: String = loop {
        match conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)) {
            Ok(m) => break m,
            Err(rusqlite::Error::SqliteFailure(f, _))
                if attempt < 50
                    && matches!(
                        f.code,
                        rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                    ) =>
            {
                attempt += 1;
                std::thread::sleep(std::time::Duration::from_millis(
                    5 * u64::from(attempt.min(8)),
                ));
            }
            Err(e) => return Err(from_open(path, "set journal_mode of", e)),
        }
    };
    if !mode.eq_ignore_ascii_case("wal") && !mode.eq_ignore_ascii_case("memory") {
        return Err(StoreError::Unavailable(format!(
            "sqlite {path}: refused WAL journal mode (got {mode})"
        )));
    }
    // FULL: fsync the WAL at every commit (see the crate docs for why not NORMAL).
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(|e| from_open(path, "set synchronous on", e))?;
    conn.pragma_update(None, "foreign_keys", "OFF")
        .map_err(|e| from_open(path, "set foreign_keys on", e))?;
    Ok(())
}

#[async_trait]
impl Store for SqliteStore {
    async fn get(&self, key: &Key, _consistent: bool) -> Result<Option<Item>, StoreError> {
        match self.read(Read::Get(key.clone())).await? {
            Outcome::Item(item) => Ok(item),
            other => Err(mismatch("get", &other)),
        }
    }

    async fn batch_get(
        &self,
        keys: &[Key],
        _consistent: bool,
    ) -> Result<Vec<Option<Item>>, StoreError> {
        tollgate_store::validate_batch_keys(keys)?;
        match self.read(Read::BatchGet(keys.to_vec())).await? {
            Outcome::Items(items) => Ok(items),
            other => Err(mismatch("batch_get", &other)),
        }
    }

    async fn put(&self, req: PutRequest) -> Result<(), StoreError> {
        validate_item(&req.item)?;
        match self.write(Write::Put(req)).await? {
            Outcome::Done => Ok(()),
            other => Err(mismatch("put", &other)),
        }
    }

    async fn update(&self, req: UpdateRequest) -> Result<Option<Item>, StoreError> {
        Ok(self.update_shared(req).await?.map(Arc::unwrap_or_clone))
    }

    async fn update_shared(&self, req: UpdateRequest) -> Result<Option<Arc<Item>>, StoreError> {
        validate_update(&req.update)?;
        match self.write(Write::Update(req)).await? {
            Outcome::Shared(item) => Ok(item),
            other => Err(mismatch("update", &other)),
        }
    }

    async fn delete(&self, req: DeleteRequest) -> Result<Option<Item>, StoreError> {
        match self.write(Write::Delete(req)).await? {
            Outcome::Item(item) => Ok(item),
            other => Err(mismatch("delete", &other)),
        }
    }

    async fn transact_write(
        &self,
        ops: Vec<TransactOp>,
        token: Option<String>,
    ) -> Result<(), StoreError> {
        let fingerprint = ops::check_transaction(&ops, token.as_deref())?;
        let w = Write::Transact {
            ops,
            token,
            fingerprint,
        };
        match self.write(w).await? {
            Outcome::Done => Ok(()),
            other => Err(mismatch("transact_write", &other)),
        }
    }

    async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError> {
        match self.read(Read::Query(q)).await? {
            Outcome::List(items) => Ok(items),
            other => Err(mismatch("query", &other)),
        }
    }

    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn scan(
        &self,
        pk_prefix: &str,
        after: Option<Key>,
        limit: usize,
    ) -> Result<ScanPage, StoreError> {
        let r = Read::Scan {
            prefix: pk_prefix.to_string(),
            after,
            limit,
        };
        match self.read(r).await? {
            Outcome::Page(page) => Ok(page),
            other => Err(mismatch("scan", &other)),
        }
    }

    async fn purge(&self, key: &Key) -> Result<(), StoreError> {
        match self.write(Write::Purge(key.clone())).await? {
            Outcome::Done => Ok(()),
            other => Err(mismatch("purge", &other)),
        }
    }
}

/// The change feed: the `changes` table, read from a snapshot of a read connection.
#[async_trait]
impl tollgate_store::ChangeFeed for SqliteStore {
    async fn read_feed(
        &self,
        cursor: &tollgate_store::FeedCursor,
        limit: usize,
    ) -> Result<tollgate_store::FeedBatch, StoreError> {
        let r = Read::Feed {
            cursor: cursor.clone(),
            limit,
            window: self.inner.rebuild_window,
            recent: Arc::clone(&self.inner.recent),
        };
        match self.read(r).await? {
            Outcome::Feed(batch) => Ok(batch),
            other => Err(mismatch("read_feed", &other)),
        }
    }

    async fn trim_feed(
        &self,
        cursor: &tollgate_store::FeedCursor,
        before_ms: i64,
    ) -> Result<(), StoreError> {
        cursor.single_seq()?;
        match self
            .write(Write::TrimFeed(cursor.clone(), before_ms))
            .await?
        {
            Outcome::Done => Ok(()),
            other => Err(mismatch("trim_feed", &other)),
        }
    }
}
