//! [`GroupCommitStats`]: how the writer's batches formed, counted as they commit; and
//! [`FeedReadStats`]: how the feed reads of this process were served.

use std::sync::atomic::{AtomicU64, Ordering};

/// Batch sizes are counted in powers of two: 1, 2–3, 4–7, …, 128–255, 256 and above.
pub const SIZE_BUCKETS: usize = 9;

/// How the group commits of one [`crate::SqliteStore`] formed since it opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupCommitStats {
    /// Batches the writer ran (each one `BEGIN IMMEDIATE` … `COMMIT`).
    pub batches: u64,
    /// Requests they carried (a transaction is one request).
    pub requests: u64,
    /// Items they addressed (a transaction counts its items): the bound's unit.
    pub items: u64,
    /// The largest batch, in requests.
    pub max_batch_requests: u64,
    /// Batches by size in requests: `[1, 2–3, 4–7, 8–15, 16–31, 32–63, 64–127, 128–255, 256+]`.
    pub batches_by_size: [u64; SIZE_BUCKETS],
    /// Requests refused unapplied because their deadline passed while they were queued.
    pub expired: u64,
    /// Requests dropped unapplied because their caller had stopped waiting (the future was
    /// dropped) before the writer reached them.
    pub abandoned: u64,
    /// Requests queued so far (answered or not).
    pub submitted: u64,
}

impl GroupCommitStats {
    /// Mean requests per batch (0 before the first batch).
    pub fn mean_batch_requests(&self) -> f64 {
        if self.batches == 0 {
            0.0
        } else {
            self.requests as f64 / self.batches as f64
        }
    }
}

/// The live counters behind [`GroupCommitStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    batches: AtomicU64,
    requests: AtomicU64,
    items: AtomicU64,
    max_batch_requests: AtomicU64,
    by_size: [AtomicU64; SIZE_BUCKETS],
    expired: AtomicU64,
    abandoned: AtomicU64,
    submitted: AtomicU64,
}

impl Counters {
    pub fn batch(&self, requests: usize, items: usize) {
        debug_assert!(requests >= 1 && items >= requests);
        let (r, i) = (requests as u64, items as u64);
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(r, Ordering::Relaxed);
        self.items.fetch_add(i, Ordering::Relaxed);
        self.max_batch_requests.fetch_max(r, Ordering::Relaxed);
        let bucket = (r.ilog2() as usize).min(SIZE_BUCKETS - 1);
        self.by_size[bucket].fetch_add(1, Ordering::Relaxed);
    }

    pub fn expired(&self) {
        self.expired.fetch_add(1, Ordering::Relaxed);
    }

    pub fn abandoned(&self) {
        self.abandoned.fetch_add(1, Ordering::Relaxed);
    }

    pub fn submitted(&self) {
        self.submitted.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> GroupCommitStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        GroupCommitStats {
            batches: get(&self.batches),
            requests: get(&self.requests),
            items: get(&self.items),
            max_batch_requests: get(&self.max_batch_requests),
            batches_by_size: std::array::from_fn(|i| get(&self.by_size[i])),
            expired: get(&self.expired),
            abandoned: get(&self.abandoned),
            submitted: get(&self.submitted),
        }
    }
}

/// How the change-feed reads of one [`crate::SqliteStore`] were served since it opened
/// (`feed::read_in`): from this process's memory, from rows that store their images, or
/// rebuilt by a walk of the feed (schema version 5's rows that leave a new image out).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FeedReadStats {
    /// Changes returned as this process's writer left them (or as an earlier read rebuilt
    /// them and kept them): no row decoded.
    pub held_changes: u64,
    /// Changes returned decoded from rows that store their images.
    pub decoded_changes: u64,
    /// Changes returned by reads that rebuilt their batch.
    pub rebuilt_changes: u64,
    /// Reads that rebuilt their batch: each walked the feed from its end back to the read's
    /// cursor in one snapshot.
    pub rebuilds: u64,
    /// Rows those walks read.
    pub rebuild_rows: u64,
}

/// The live counters behind [`FeedReadStats`].
#[derive(Debug, Default)]
pub(crate) struct FeedReadCounters {
    held: AtomicU64,
    decoded: AtomicU64,
    rebuilt: AtomicU64,
    rebuilds: AtomicU64,
    rebuild_rows: AtomicU64,
}

impl FeedReadCounters {
    /// A read returned `held` changes from memory and `decoded` from their rows.
    pub fn served(&self, held: usize, decoded: usize) {
        self.held.fetch_add(held as u64, Ordering::Relaxed);
        self.decoded.fetch_add(decoded as u64, Ordering::Relaxed);
    }

    /// A read rebuilt its batch of `changes`, walking `rows` rows.
    pub fn rebuilt(&self, changes: usize, rows: usize) {
        self.rebuilt.fetch_add(changes as u64, Ordering::Relaxed);
        self.rebuilds.fetch_add(1, Ordering::Relaxed);
        self.rebuild_rows.fetch_add(rows as u64, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> FeedReadStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FeedReadStats {
            held_changes: get(&self.held),
            decoded_changes: get(&self.decoded),
            rebuilt_changes: get(&self.rebuilt),
            rebuilds: get(&self.rebuilds),
            rebuild_rows: get(&self.rebuild_rows),
        }
    }
}
