//! The server's log writer: the lines of many requests gathered in memory and written out
//! together by a thread of their own, at most every [`Pacing::interval`].
//!
//! `serve` logs one line per request (the access log). Written directly, that is one
//! `write(2)` per request on the thread that served it; handed line by line to a writer
//! thread over a channel (`tracing-appender`'s non-blocking writer), it is one wake-up of
//! that thread per line under load, which cost the server more than the write it saved.
//! Here a logger appends its line to a shared buffer under a mutex and wakes the writer
//! only when the buffer was empty (the writer then waits out the interval) or when it
//! passes [`Pacing::early_bytes`]; the writer swaps the buffer for an empty one and writes
//! it in one call. So under load there are at most about `1 / interval` writes and wake-ups
//! per second whatever the request rate, and an idle server's writer sleeps.
//!
//! Nothing is dropped: a sink that does not keep up makes the loggers wait once
//! [`Pacing::max_bytes`] are pending, as a direct write would; the [`Flush`] guard writes
//! what is left when it is dropped (when `main` returns). A process killed outright loses
//! at most the last interval's lines.

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;

/// When the writer writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pacing {
    /// The longest a line waits in the buffer while the writer is free.
    pub interval: Duration,
    /// Pending bytes that wake the writer before its interval is over.
    pub early_bytes: usize,
    /// Pending bytes at which loggers wait for the writer.
    pub max_bytes: usize,
}

impl Default for Pacing {
    /// 10 ms, 256 KiB, 8 MiB.
    fn default() -> Self {
        Pacing {
            interval: Duration::from_millis(10),
            early_bytes: 256 * 1024,
            max_bytes: 8 * 1024 * 1024,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    pending: Vec<u8>,
    closed: bool,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Wakes the writer: the first line of an empty buffer, the early bound, the close.
    due: Condvar,
    /// Wakes loggers waiting at the bound: the writer took the buffer.
    drained: Condvar,
    pacing: Pacing,
}

impl Shared {
    /// Every critical section is an append, a swap or a flag: a panic elsewhere cannot
    /// leave the buffer inconsistent.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The [`MakeWriter`] of the subscriber: each event's line goes to the shared buffer.
#[derive(Debug, Clone)]
pub struct Batched {
    shared: Arc<Shared>,
}

/// Stops the writer thread when dropped, after it has written everything pending.
#[derive(Debug)]
pub struct Flush {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Start the writer thread over `sink`.
pub fn batched<W: Write + Send + 'static>(
    sink: W,
    pacing: Pacing,
    thread_name: &str,
) -> io::Result<(Batched, Flush)> {
    debug_assert!(pacing.early_bytes <= pacing.max_bytes && pacing.max_bytes > 0);
    let shared = Arc::new(Shared {
        state: Mutex::new(State::default()),
        due: Condvar::new(),
        drained: Condvar::new(),
        pacing,
    });
    let thread = {
        let shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name(thread_name.into())
            .spawn(move || write_out(&shared, sink))?
    };
    Ok((
        Batched {
            shared: Arc::clone(&shared),
        },
        Flush {
            shared,
            thread: Some(thread),
        },
    ))
}

/// The writer thread's loop: wait for a first line, let more gather for the interval, write
/// them all in one call; until closed and drained.
fn write_out<W: Write>(shared: &Shared, mut sink: W) {
    let mut taken = Vec::new();
    let mut st = shared.lock();
    loop {
        while st.pending.is_empty() && !st.closed {
            st = shared.due.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        if st.pending.is_empty() {
            debug_assert!(st.closed);
            return;
        }
        if !st.closed && st.pending.len() < shared.pacing.early_bytes {
            st = shared
                .due
                .wait_timeout(st, shared.pacing.interval)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        std::mem::swap(&mut st.pending, &mut taken);
        drop(st);
        shared.drained.notify_all();
        // A log sink that fails has nowhere to report it: the lines are dropped, the
        // server goes on (as a direct write to a closed standard error would).
        let _ = sink.write_all(&taken).and_then(|()| sink.flush());
        taken.clear();
        st = shared.lock();
    }
}

impl Drop for Flush {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.due.notify_all();
        self.shared.drained.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One event's writer.
#[derive(Debug)]
pub struct Line<'a> {
    shared: &'a Shared,
}

impl Write for Line<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let shared = self.shared;
        let mut st = shared.lock();
        if st.closed {
            // After the guard: nobody writes the buffer any more.
            drop(st);
            return io::stderr().write(buf);
        }
        while st.pending.len() >= shared.pacing.max_bytes && !st.closed {
            st = shared.drained.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        let before = st.pending.len();
        st.pending.extend_from_slice(buf);
        let early = shared.pacing.early_bytes;
        if before == 0 || (before < early && st.pending.len() >= early) {
            shared.due.notify_one();
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        // The writer flushes; a line is complete in the buffer once written.
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Batched {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        Line {
            shared: &self.shared,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts the writes it receives and keeps the bytes.
    #[derive(Clone, Default)]
    struct Counting(Arc<Mutex<(usize, Vec<u8>)>>);

    impl Write for Counting {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let mut g = self.0.lock().unwrap();
            g.0 += 1;
            g.1.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn lines(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("line {i}\n")).collect()
    }

    #[test]
    fn many_lines_reach_the_sink_in_order_in_one_write() {
        let sink = Counting::default();
        let pacing = Pacing {
            interval: Duration::from_secs(3600),
            ..Pacing::default()
        };
        let (w, flush) = batched(sink.clone(), pacing, "log-test").unwrap();
        let want = lines(1_000);
        for l in &want {
            w.make_writer().write_all(l.as_bytes()).unwrap();
        }
        // The writer is waiting out its (long) interval: nothing written yet.
        assert_eq!(sink.0.lock().unwrap().0, 0);
        drop(flush);
        let g = sink.0.lock().unwrap();
        assert_eq!(g.0, 1, "one write for a thousand lines");
        assert_eq!(String::from_utf8_lossy(&g.1), want.concat());
    }

    #[test]
    fn the_early_bound_writes_before_the_interval() {
        let sink = Counting::default();
        let pacing = Pacing {
            interval: Duration::from_secs(3600),
            early_bytes: 64,
            max_bytes: 1 << 20,
        };
        let (w, flush) = batched(sink.clone(), pacing, "log-test").unwrap();
        let want = lines(20);
        for l in &want {
            w.make_writer().write_all(l.as_bytes()).unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while sink.0.lock().unwrap().0 == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            sink.0.lock().unwrap().0 >= 1,
            "the early bound did not wake the writer"
        );
        drop(flush);
        assert_eq!(
            String::from_utf8_lossy(&sink.0.lock().unwrap().1),
            want.concat()
        );
    }

    /// A sink that blocks makes loggers wait at the bound, and loses nothing.
    #[test]
    fn a_slow_sink_holds_loggers_back_without_losing_lines() {
        /// Takes a millisecond per write.
        struct Slow(Arc<Mutex<Vec<u8>>>);
        impl Write for Slow {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                std::thread::sleep(Duration::from_millis(1));
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let out = Arc::new(Mutex::new(Vec::new()));
        let pacing = Pacing {
            interval: Duration::from_millis(1),
            early_bytes: 16,
            max_bytes: 32,
        };
        let (w, flush) = batched(Slow(Arc::clone(&out)), pacing, "log-test").unwrap();
        let want = lines(500);
        let writers: Vec<_> = (0..2)
            .map(|t| {
                let w = w.clone();
                let mine: Vec<String> = want.iter().skip(t).step_by(2).cloned().collect();
                std::thread::spawn(move || {
                    for l in mine {
                        w.make_writer().write_all(l.as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        for t in writers {
            t.join().unwrap();
        }
        drop(flush);
        let got = String::from_utf8_lossy(&out.lock().unwrap()).into_owned();
        let mut got: Vec<&str> = got.lines().collect();
        let mut expected: Vec<&str> = want.iter().map(|l| l.trim_end()).collect();
        got.sort_unstable();
        expected.sort_unstable();
        assert_eq!(got, expected);
    }
}
