//! The checkpointer: WAL checkpoints on a thread of their own, off the writer's path.
//!
//! SQLite checkpoints inside a commit: the `COMMIT` that takes the WAL past 1,000 pages
//! copies every page not yet in the database file into it and fsyncs the file before it
//! returns, so every caller of that group commit waits for the copy (the embedded store's
//! p99). A file store therefore also runs `PRAGMA wal_checkpoint(PASSIVE)` here, on its own
//! connection, while the writer goes on committing: a passive checkpoint takes no write lock
//! and waits for nobody; it copies what no reader still needs. When the writer's own
//! checkpoint comes due at 1,000 pages, nearly all of them are already copied: it copies the
//! few committed since, and the WAL then starts over from its beginning. (The writer keeps
//! that checkpoint on purpose: a WAL restarts only when it is wholly copied at the start of
//! a write, which a checkpointer racing a busy writer may never see.)
//!
//! # When it runs
//!
//! After [`CHECKPOINT_AFTER_WRITES`] committed operations, or [`CHECKPOINT_IDLE`] after the
//! first operation not yet checkpointed, whichever comes first; never while nothing was
//! committed. Durability is unchanged: every commit still fsyncs the WAL before anything is
//! acknowledged (a checkpoint only moves committed pages into the main file, and fsyncs it).
//!
//! A failed checkpoint (another process's checkpointer holds the checkpoint lock, a reader
//! holds an old snapshot) leaves the WAL as it is, is logged at debug level and is tried
//! again at the next round: nothing is lost, the WAL is only longer for a while. Several
//! processes on one file each run their own checkpointer; SQLite serialises them.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::Connection;

/// Committed operations (a transaction counts its items) after which a checkpoint runs:
/// a few pages each, about SQLite's own default of 1,000 pages.
pub const CHECKPOINT_AFTER_WRITES: u64 = 256;

/// How long a committed operation waits at most for its checkpoint when fewer than
/// [`CHECKPOINT_AFTER_WRITES`] follow it.
pub const CHECKPOINT_IDLE: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
struct State {
    /// Operations committed since the last checkpoint began.
    unchecked_writes: u64,
    closed: bool,
}

/// What the writer tells the checkpointer: how much it committed. Shared by the store, the
/// writer and the checkpointer thread.
#[derive(Debug, Default)]
pub struct Pacer {
    state: Mutex<State>,
    wake: Condvar,
}

impl Pacer {
    /// Every critical section is a counter update or a flag: a panic elsewhere cannot leave
    /// the state inconsistent.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The writer committed `writes` operations.
    pub fn committed(&self, writes: u64) {
        let mut st = self.lock();
        let before = st.unchecked_writes;
        st.unchecked_writes = before.saturating_add(writes);
        // Wake the checkpointer when the bound is crossed, and when the first unchecked
        // write arrives (it then waits at most `CHECKPOINT_IDLE`); not on every commit.
        if before == 0
            || (before < CHECKPOINT_AFTER_WRITES && st.unchecked_writes >= CHECKPOINT_AFTER_WRITES)
        {
            self.wake.notify_one();
        }
    }

    /// Stop the checkpointer (the store is being dropped).
    pub fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_all();
    }

    /// The checkpointer's side: wait until a checkpoint is due, then count from zero again.
    /// `false` once closed.
    fn due(&self) -> bool {
        let mut st = self.lock();
        loop {
            if st.closed {
                return false;
            }
            if st.unchecked_writes >= CHECKPOINT_AFTER_WRITES {
                break;
            }
            if st.unchecked_writes == 0 {
                st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            let (next, timeout) = self
                .wake
                .wait_timeout(st, CHECKPOINT_IDLE)
                .unwrap_or_else(|e| e.into_inner());
            st = next;
            if timeout.timed_out() && st.unchecked_writes > 0 {
                break;
            }
        }
        st.unchecked_writes = 0;
        true
    }
}

/// The checkpointer thread's loop over its own connection to the file, until the pacer
/// closes.
pub fn run(conn: Connection, pacer: &Pacer, shown: &str) {
    while pacer.due() {
        let answer = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        });
        match answer {
            Ok((busy, wal_frames, copied)) => {
                debug_assert!(copied <= wal_frames || wal_frames < 0);
                tracing::trace!(path = shown, busy, wal_frames, copied, "sqlite checkpoint");
            }
            Err(e) => {
                tracing::debug!(path = shown, error = %e, "sqlite checkpoint failed; retried later")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_checkpoint_is_due_after_the_write_bound() {
        let pacer = Pacer::default();
        pacer.committed(CHECKPOINT_AFTER_WRITES);
        let start = Instant::now();
        assert!(pacer.due());
        assert!(
            start.elapsed() < CHECKPOINT_IDLE,
            "waited out the idle bound"
        );
        assert_eq!(pacer.lock().unchecked_writes, 0);
    }

    #[test]
    fn a_few_writes_are_checkpointed_after_the_idle_bound() {
        let pacer = Pacer::default();
        pacer.committed(1);
        let start = Instant::now();
        assert!(pacer.due());
        assert!(start.elapsed() >= CHECKPOINT_IDLE);
    }

    #[test]
    fn closing_ends_a_waiting_checkpointer() {
        let pacer = Arc::new(Pacer::default());
        let waiting = {
            let p = Arc::clone(&pacer);
            std::thread::spawn(move || p.due())
        };
        pacer.close();
        assert!(!waiting.join().unwrap_or(true));
    }
}
