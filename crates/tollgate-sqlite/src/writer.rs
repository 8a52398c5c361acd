//! The writer thread: it owns the store's write connection and turns what callers queued
//! into group commits.
//!
//! # How a batch forms
//!
//! The writer sleeps until a request is queued, then takes everything queued at that moment,
//! in order, up to [`crate::SqliteConfig::max_batch_ops`] items (a transaction counts its
//! items; a request larger than the bound goes alone). There is no wait for more: a lone
//! caller's write starts at once (at one task a batch is one request, so the cost over a
//! plain transaction is one thread hand-off), and under load the requests that arrive while
//! one batch commits form the next batch. The batch runs as one `BEGIN IMMEDIATE` …
//! `COMMIT` — one fsync of the WAL under `synchronous=FULL` — and only after `COMMIT`
//! returns does any of its callers get an answer.
//!
//! # One operation, one result
//!
//! Operations run in queue order, each on the state the ones before it left, exactly as if
//! each were its own transaction. A failed condition writes nothing and fails that operation
//! alone; a `transact_write` runs under a SAVEPOINT, so a cancelled or failed one takes back
//! its own writes only (and stays all-or-nothing). A failure that ends the whole SQLite
//! transaction (SQLite rolls back on an I/O error or a full disk) or a failed `COMMIT` fails
//! every operation of the batch with that error: nothing of it is acknowledged.
//!
//! # Deadlines
//!
//! A request whose deadline has passed when the writer reaches it is refused unapplied
//! ([`StoreError::Unavailable`]); so is one whose caller stopped waiting, silently. The lock
//! wait (`BEGIN IMMEDIATE` against another connection or process) is bounded by the busy
//! timeout, capped at what is left of the earliest deadline in the batch. Requests still
//! queued while the writer is stuck are refused at their deadline by the watchdog
//! ([`crate::queue::Queue::watch`]).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::{Connection, TransactionBehavior};
use tollgate_store::StoreError;

use crate::checkpoint::Pacer;
use crate::error::{from_commit, from_sqlite};
use crate::ops::{self, BatchBroken, Outcome};
use crate::queue::{Job, Queue, Reply, Request};
use crate::recent::Recent;

/// The writer's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Most items per batch.
    pub max_batch_items: usize,
    /// Longest lock wait of a batch (further capped by the batch's earliest deadline).
    pub busy_timeout: Duration,
}

/// Where the writer's results go besides its callers.
pub struct Sinks {
    /// The committed images, for the feed reader.
    pub recent: Arc<Recent>,
    /// The checkpointer of a file store (`checkpoint.rs`), told what each batch committed;
    /// `None` for a private database (it has no second connection to checkpoint from).
    pub pacer: Option<Arc<Pacer>>,
}

/// The writer's loop, until the queue closes.
pub fn run(mut conn: Connection, queue: Arc<Queue>, bounds: Bounds, sinks: Sinks) {
    let mut memo = ops::Memo::default();
    let mut batch = Vec::with_capacity(bounds.max_batch_items.min(256));
    while queue.take(bounds.max_batch_items, &mut batch) {
        let ran = catch_unwind(AssertUnwindSafe(|| {
            run_batch(&mut conn, &queue, &mut batch, bounds, &sinks, &mut memo)
        }));
        if ran.is_err() {
            // The callers whose replies were dropped get "writer stopped" (Unavailable); a
            // transaction left open is rolled back, so nothing of the batch was applied.
            tracing::error!("sqlite writer: a batch panicked; its operations were not applied");
            batch.clear();
            if !conn.is_autocommit() {
                if let Err(e) = conn.execute_batch("ROLLBACK") {
                    tracing::warn!(error = %e, "rolling back the panicked batch failed");
                }
            }
        }
        debug_assert!(batch.is_empty());
    }
}

fn answer_all(replies: Vec<Reply>, err: &StoreError) {
    for reply in replies {
        reply.send(Err(err.clone()));
    }
}

fn run_batch(
    conn: &mut Connection,
    queue: &Queue,
    batch: &mut Vec<Request>,
    bounds: Bounds,
    sinks: &Sinks,
    memo: &mut ops::Memo,
) {
    // Nothing of a batch that did not commit is published.
    memo.published.clear();
    let now = Instant::now();
    memo.tidy_spares(now);
    let mut jobs = Vec::with_capacity(batch.len());
    let mut replies = Vec::with_capacity(batch.len());
    let mut items = 0;
    let mut earliest = None::<Instant>;
    for r in batch.drain(..) {
        if r.reply.is_closed() {
            queue.counters.abandoned();
            continue;
        }
        if r.deadline <= now {
            r.expire(now, &queue.counters);
            continue;
        }
        earliest = Some(earliest.map_or(r.deadline, |e| e.min(r.deadline)));
        items += r.job.items();
        jobs.push(r.job);
        replies.push(r.reply);
    }
    let Some(earliest) = earliest else { return };
    queue.counters.batch(jobs.len(), items);
    let lock_wait = bounds
        .busy_timeout
        .min(earliest.saturating_duration_since(now));
    if let Err(e) = conn.busy_timeout(lock_wait) {
        return answer_all(replies, &from_sqlite("set busy timeout", e));
    }
    let mut tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => return answer_all(replies, &from_sqlite("begin immediate", e)),
    };
    let locked = Instant::now();
    let ops = jobs.len();
    // With the write lock held: whether another connection committed since the last batch
    // (the memo's trust, see `ops::Memo::begin_batch`). Unreadable, the memo is distrusted
    // and every write reads its row, as it would anyway.
    let version = ops::data_version(&tx)
        .inspect_err(|e| tracing::warn!(error = %e, "sqlite writer: data_version unreadable"))
        .ok();
    let solo = memo.begin_batch(version);
    // A change row leaves its new image out only when this process's feed reader will take
    // the change from memory (`feed.rs`: the rule and why).
    memo.omit_new = solo && sinks.recent.has_room(items);
    let mut results: Vec<Result<Outcome, StoreError>> = Vec::with_capacity(jobs.len());
    for job in jobs {
        let result = match job {
            Job::Write(w) => ops::write(&mut tx, w, memo),
            Job::Read(r) => Ok(ops::read(&tx, &r)),
        };
        let result = match result {
            Ok(r) => r,
            // Dropping `tx` rolls the batch back.
            Err(BatchBroken(e)) => return answer_all(replies, &e),
        };
        if tx.is_autocommit() {
            // SQLite ended the transaction itself (it does on an I/O error, a full disk, an
            // out-of-memory): the whole batch is rolled back, nothing of it applied.
            let cause = match &result {
                Err(e) => e.to_string(),
                Ok(_) => "an operation".to_string(),
            };
            return answer_all(
                replies,
                &StoreError::Unavailable(format!(
                    "sqlite rolled back the batch transaction after: {cause}"
                )),
            );
        }
        results.push(result);
    }
    let applied = Instant::now();
    let committed = tx.commit();
    report_slow(ops, items, now, locked, applied);
    match committed {
        Ok(()) => {
            debug_assert_eq!(results.len(), replies.len());
            // Every path that does not reach here (a rollback, a failed commit, a panic)
            // leaves the memo distrusted for the next batch.
            memo.committed();
            // Committed: the feed reader may take these images (never before the commit:
            // a rolled-back batch's sequence numbers are given again).
            sinks.recent.publish(std::mem::take(&mut memo.published));
            if let Some(pacer) = &sinks.pacer {
                pacer.committed(items as u64);
            }
            for (reply, result) in replies.into_iter().zip(results) {
                reply.send(result);
            }
        }
        Err(e) => answer_all(replies, &from_commit(e)),
    }
}

/// A batch slower than this is logged with where its time went.
pub const SLOW_BATCH: Duration = Duration::from_millis(50);

/// Log a batch that took longer than [`SLOW_BATCH`] from its start to the end of its
/// `COMMIT`: every caller in it waited that long. The parts: the wait for the write lock
/// (another connection's transaction), the operations, and the commit (the WAL's fsync and,
/// when the WAL has passed 1,000 pages, the writer's own checkpoint: `checkpoint.rs`).
fn report_slow(ops: usize, items: usize, start: Instant, locked: Instant, applied: Instant) {
    let done = Instant::now();
    if done.duration_since(start) < SLOW_BATCH {
        return;
    }
    let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1e3;
    tracing::info!(
        ops,
        items,
        lock_ms = ms(start, locked),
        ops_ms = ms(locked, applied),
        commit_ms = ms(applied, done),
        "sqlite batch slow"
    );
}
