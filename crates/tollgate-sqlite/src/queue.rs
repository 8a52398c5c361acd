//! The writer's queue: callers push requests, the writer takes them in batches, the watchdog
//! refuses those whose deadline passes while they wait.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tollgate_store::StoreError;

use crate::ops::{Outcome, Read, Write};
use crate::stats::Counters;

/// What the writer runs: a write, or (for an in-memory database, which has no second
/// connection) a read.
#[derive(Debug)]
pub enum Job {
    /// A write.
    Write(Write),
    /// A read inside the batch transaction.
    Read(Read),
}

impl Job {
    /// How many items the job addresses: its weight in a batch's bound.
    pub fn items(&self) -> usize {
        match self {
            Job::Write(w) => w.items(),
            Job::Read(_) => 1,
        }
    }
}

/// What an operation answers.
pub type Answer = Result<Outcome, StoreError>;

/// Where the answer goes: an async caller awaits a oneshot; a blocking one (no tokio runtime,
/// or a synchronous method) waits on a std channel.
#[derive(Debug)]
pub enum Reply {
    /// Awaited.
    Async(oneshot::Sender<Answer>),
    /// Waited for by a blocked thread.
    Blocking(std::sync::mpsc::SyncSender<Answer>),
}

impl Reply {
    /// Send the answer; a caller that stopped waiting needs none.
    pub fn send(self, answer: Answer) {
        match self {
            Reply::Async(tx) => {
                let _ = tx.send(answer);
            }
            Reply::Blocking(tx) => {
                let _ = tx.send(answer);
            }
        }
    }

    /// Whether the caller stopped waiting (an async caller's future was dropped).
    pub fn is_closed(&self) -> bool {
        match self {
            Reply::Async(tx) => tx.is_closed(),
            // A blocked thread waits until it is answered.
            Reply::Blocking(_) => false,
        }
    }
}

/// One queued call.
#[derive(Debug)]
pub struct Request {
    /// What to run.
    pub job: Job,
    /// When the call was queued.
    pub queued_at: Instant,
    /// After this instant the request is refused unapplied if it has not started.
    pub deadline: Instant,
    /// The caller's end.
    pub reply: Reply,
}

impl Request {
    /// Refuse the request unapplied: its deadline passed before the writer reached it.
    pub fn expire(self, now: Instant, counters: &Counters) {
        counters.expired();
        let waited = now.saturating_duration_since(self.queued_at);
        self.reply.send(Err(StoreError::Unavailable(format!(
            "sqlite: the writer did not reach the request within its deadline \
             (queued {} ms; another connection may hold the write lock, or a commit is stuck)",
            waited.as_millis()
        ))));
    }
}

struct State {
    pending: VecDeque<Request>,
    writer_idle: bool,
    closed: bool,
}

/// The queue, shared by the store's handles, the writer thread and the watchdog thread.
pub struct Queue {
    state: Mutex<State>,
    /// Wakes the writer when a request arrives while it is idle.
    work: Condvar,
    /// Wakes the watchdog at close.
    watch: Condvar,
    /// The batch counters.
    pub counters: Counters,
}

impl Queue {
    pub fn new() -> Self {
        Queue {
            state: Mutex::new(State {
                pending: VecDeque::new(),
                writer_idle: false,
                closed: false,
            }),
            work: Condvar::new(),
            watch: Condvar::new(),
            counters: Counters::default(),
        }
    }

    /// A panic elsewhere while the lock was held cannot leave the queue inconsistent (every
    /// critical section is a push, pops or a flag): go on with it.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue a request; hands it back if the queue is closed.
    pub fn push(&self, r: Request) -> Result<(), Request> {
        let mut st = self.lock();
        if st.closed {
            return Err(r);
        }
        st.pending.push_back(r);
        self.counters.submitted();
        if st.writer_idle {
            st.writer_idle = false;
            self.work.notify_one();
        }
        Ok(())
    }

    /// The writer's side: wait until something is queued, then move into `batch` what is
    /// queued now, in order, up to `max_items` items (always at least one request, so a
    /// transaction larger than the bound goes alone). No wait for more: while one batch
    /// commits, the next one gathers. `false` once the queue is closed.
    pub fn take(&self, max_items: usize, batch: &mut Vec<Request>) -> bool {
        debug_assert!(batch.is_empty() && max_items >= 1);
        let mut st = self.lock();
        loop {
            if st.closed {
                return false;
            }
            if !st.pending.is_empty() {
                break;
            }
            st.writer_idle = true;
            st = self.work.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.writer_idle = false;
        let mut items = 0;
        while let Some(front) = st.pending.front() {
            let w = front.job.items();
            if !batch.is_empty() && items + w > max_items {
                break;
            }
            items += w;
            if let Some(r) = st.pending.pop_front() {
                batch.push(r);
            }
        }
        true
    }

    /// The watchdog's side: refuse every request whose deadline has passed while it was
    /// queued (the writer may be stuck in a lock wait or a commit), until the queue closes.
    /// Sleeps until the oldest request's deadline, or `idle` when nothing is queued.
    pub fn watch(&self, idle: Duration) {
        let mut st = self.lock();
        loop {
            if st.closed {
                return;
            }
            let now = Instant::now();
            // Requests are queued in deadline order (one deadline per store), so the expired
            // ones are at the front.
            while st.pending.front().is_some_and(|r| r.deadline <= now) {
                if let Some(r) = st.pending.pop_front() {
                    r.expire(now, &self.counters);
                }
            }
            let wait = st
                .pending
                .front()
                .map_or(idle, |r| r.deadline.saturating_duration_since(now));
            st = self
                .watch
                .wait_timeout(st, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Close the queue: the writer and the watchdog return; what is still queued was
    /// abandoned by its callers (a waiting caller keeps the store open) and is dropped.
    pub fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        st.pending.clear();
        self.work.notify_all();
        self.watch.notify_all();
    }
}
