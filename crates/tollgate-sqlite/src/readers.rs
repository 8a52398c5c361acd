//! Read connections of a file store: WAL lets them read while the writer commits. A read
//! begins its own snapshot after every write acknowledged before it was issued had
//! committed, so it sees them all (strong consistency), from this process or any other.

use std::path::PathBuf;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};
use tollgate_store::StoreError;

use crate::error::from_open;
use crate::ops::{self, Outcome, Read};

/// At most this many read connections per store (opened on demand).
pub const MAX_READERS: usize = 4;

/// A checked-out connection; returned to the pool when dropped, even by a panic.
struct Lease<'a> {
    readers: &'a Readers,
    conn: Option<Connection>,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.readers.give_back(conn);
        }
    }
}

struct Pool {
    idle: Vec<Connection>,
    open: usize,
}

/// The store's read connections.
pub struct Readers {
    path: PathBuf,
    shown: String,
    busy_timeout: Duration,
    pool: Mutex<Pool>,
    freed: Condvar,
}

impl std::fmt::Debug for Readers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readers")
            .field("path", &self.shown)
            .finish_non_exhaustive()
    }
}

impl Readers {
    /// Readers of the (existing, schema-checked) file at `path`; each waits at most
    /// `busy_timeout` for a lock.
    pub fn new(path: PathBuf, busy_timeout: Duration) -> Self {
        Readers {
            shown: path.display().to_string(),
            path,
            busy_timeout,
            pool: Mutex::new(Pool {
                idle: Vec::new(),
                open: 0,
            }),
            freed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Run a read on a free connection, waiting for one until `deadline`.
    pub fn run(&self, deadline: Instant, r: &Read) -> Result<Outcome, StoreError> {
        let lease = Lease {
            readers: self,
            conn: Some(self.checkout(deadline)?),
        };
        debug_assert!(
            lease.conn.is_some(),
            "a lease holds its connection until dropped"
        );
        match &lease.conn {
            Some(conn) => ops::read(conn, r),
            None => Err(StoreError::Unavailable(
                "sqlite: internal: a read lease without a connection".into(),
            )),
        }
    }

    fn checkout(&self, deadline: Instant) -> Result<Connection, StoreError> {
        let mut pool = self.lock();
        loop {
            if let Some(c) = pool.idle.pop() {
                return Ok(c);
            }
            if pool.open < MAX_READERS {
                pool.open += 1;
                drop(pool);
                return self.open_one().inspect_err(|_| {
                    self.lock().open -= 1;
                    self.freed.notify_one();
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::Unavailable(format!(
                    "sqlite {}: no read connection came free within the deadline \
                     ({MAX_READERS} busy)",
                    self.shown
                )));
            }
            pool = self
                .freed
                .wait_timeout(pool, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn give_back(&self, conn: Connection) {
        // A read ends its snapshot; one that panicked midway may not have.
        if !conn.is_autocommit() {
            if let Err(e) = conn.execute_batch("ROLLBACK") {
                tracing::warn!(error = %e, "ending a read left open failed");
            }
        }
        self.lock().idle.push(conn);
        self.freed.notify_one();
    }

    fn open_one(&self) -> Result<Connection, StoreError> {
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_URI,
        )
        .map_err(|e| from_open(&self.shown, "open a read connection to", e))?;
        conn.busy_timeout(self.busy_timeout)
            .map_err(|e| from_open(&self.shown, "set busy timeout on", e))?;
        // This connection never writes.
        conn.pragma_update(None, "query_only", "ON")
            .map_err(|e| from_open(&self.shown, "set query_only on", e))?;
        Ok(conn)
    }
}
