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

/// The queue no longer takes requests: the store is being dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

struct State {
    pending: VecDeque<Request>,
    writer_idle: bool,
    /// When the watchdog wakes next at the latest (`None`: it is not waiting).
    watchdog_wakes: Option<Instant>,
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
                watchdog_wakes: None,
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

    /// Queue a request; [`Closed`] (the request dropped) once the queue is closed.
    pub fn push(&self, r: Request) -> Result<(), Closed> {
        let mut st = self.lock();
        if st.closed {
            return Err(Closed);
        }
        let deadline = r.deadline;
        st.pending.push_back(r);
        self.counters.submitted();
        if st.pending.len() == 1 && st.watchdog_wakes.is_some_and(|w| deadline < w) {
            // The front changed and its deadline comes before the watchdog's next wake (it
            // waits out an idle spell): it re-arms on this request's deadline (later requests
            // queue behind earlier deadlines). Under load the watchdog's wake is already
            // due sooner, and the writer's pushes wake nobody but the writer.
            st.watchdog_wakes = None;
            self.watch.notify_one();
        }
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
            st.watchdog_wakes = Some(now + wait);
            st = self
                .watch
                .wait_timeout(st, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            st.watchdog_wakes = None;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tollgate_core::value::Key;

    fn request(deadline: Instant) -> (Request, std::sync::mpsc::Receiver<Answer>) {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let r = Request {
            job: Job::Read(Read::Get(Key::new("p", "s"))),
            queued_at: Instant::now(),
            deadline,
            reply: Reply::Blocking(tx),
        };
        (r, rx)
    }

    /// With no writer taking anything (a writer stuck in a commit), the watchdog still refuses
    /// every queued request at its deadline, unapplied.
    #[test]
    fn the_watchdog_refuses_requests_a_stuck_writer_never_reaches() {
        let queue = Arc::new(Queue::new());
        let watchdog = {
            let q = Arc::clone(&queue);
            std::thread::spawn(move || q.watch(Duration::from_secs(3600)))
        };
        let deadline = Duration::from_millis(50);
        let start = Instant::now();
        let rxs: Vec<_> = (0..5)
            .map(|_| {
                let (r, rx) = request(Instant::now() + deadline);
                assert!(queue.push(r).is_ok());
                rx
            })
            .collect();
        for rx in rxs {
            match rx.recv_timeout(Duration::from_secs(10)) {
                Ok(Err(StoreError::Unavailable(m))) => assert!(m.contains("deadline"), "{m}"),
                other => panic!("expected Unavailable, got {other:?}"),
            }
        }
        assert!(start.elapsed() >= deadline, "refused before its deadline");
        let stats = queue.counters.snapshot();
        assert_eq!((stats.submitted, stats.expired, stats.batches), (5, 5, 0));
        queue.close();
        watchdog.join().unwrap();
        // A closed queue refuses a request instead of keeping it.
        let (r, _rx) = request(Instant::now() + deadline);
        assert_eq!(queue.push(r), Err(Closed));
    }

    /// A request whose deadline comes after the waiting watchdog's next wake does not wake
    /// it (the writer's pushes wake only the writer): the watchdog re-arms on it when it
    /// wakes, and still refuses it at its deadline.
    #[test]
    fn the_watchdog_refuses_at_the_deadline_without_being_woken_for_it() {
        let queue = Arc::new(Queue::new());
        let idle = Duration::from_millis(100);
        let watchdog = {
            let q = Arc::clone(&queue);
            std::thread::spawn(move || q.watch(idle))
        };
        // Let the watchdog start waiting out an idle spell.
        let start = Instant::now();
        while queue.lock().watchdog_wakes.is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the watchdog never waited"
            );
            std::thread::yield_now();
        }
        let wakes = queue.lock().watchdog_wakes;
        let deadline = Instant::now() + Duration::from_millis(250);
        assert!(wakes.is_some_and(|w| w < deadline));
        let (r, rx) = request(deadline);
        assert!(queue.push(r).is_ok());
        // Outside its lock the watchdog's wake is always set while it runs; only a push
        // that wakes it clears it.
        assert!(
            queue.lock().watchdog_wakes.is_some(),
            "the watchdog was not woken"
        );
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Err(StoreError::Unavailable(m))) => assert!(m.contains("deadline"), "{m}"),
            other => panic!("expected Unavailable, got {other:?}"),
        }
        assert!(Instant::now() >= deadline, "refused before its deadline");
        queue.close();
        watchdog.join().unwrap();
    }

    #[test]
    fn a_batch_takes_what_is_queued_up_to_the_item_bound() {
        let queue = Queue::new();
        let far = Instant::now() + Duration::from_secs(3600);
        let _rxs: Vec<_> = (0..5)
            .map(|_| {
                let (r, rx) = request(far);
                assert!(queue.push(r).is_ok());
                rx
            })
            .collect();
        let mut batch = Vec::new();
        assert!(queue.take(3, &mut batch));
        assert_eq!(batch.len(), 3);
        batch.clear();
        assert!(queue.take(3, &mut batch));
        assert_eq!(batch.len(), 2);
        batch.clear();
        queue.close();
        assert!(!queue.take(3, &mut batch));
    }
}
