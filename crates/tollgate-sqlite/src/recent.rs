//! The changes this process's writer committed, decoded, by sequence number: the feed
//! reader of the same process takes their images from here instead of decoding the stored
//! JSON again (decoding the feed was the embedded store's largest cost after the writer's
//! own work). The writer does not decode either: it remembers the text and item of the rows
//! it wrote (`ops::Memo`).
//!
//! Every kind of write publishes its change when the writer knows both images decoded (an
//! update, a delete, a transaction's operations, a put or purge of a row the memo holds):
//! the aggregator's own snapshot and checkpoint writes among them, which its next pass
//! reads only to skip.
//!
//! Only committed changes are published: a rolled-back batch's (or transaction's) sequence
//! numbers are given again, to other changes, but a committed number never is (the
//! newest change is never trimmed: `feed.rs`), so an entry is always the change stored
//! under its number. Changes another process wrote are not here and are read from their
//! rows. Nothing is kept until the process first reads the feed (a store whose feed nobody
//! here reads holds no images); an entry is let go once a read has returned it (the next
//! pass reads after it), and at most [`CAP`] entries are kept, the oldest: past it, a
//! change is not kept, and the writer stores its row's new image whole
//! ([`Recent::has_room`], `feed::record`).
//!
//! It also keeps the changes a feed read rebuilt beyond the batch it returned, for the
//! reads after it (`feed::read_in`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::stats::FeedReadCounters;

use tollgate_core::value::{Item, Key};

/// Most entries kept (each holds one decoded item, about 2 KB for a bucket of one limit: at
/// most about 64 MB): what an aggregator reads in one pass — the changes of its pause (1 s
/// by default) and of the pass before — up to about 20,000 writes a second, above the
/// embedded store's peak rate on the development machine. At 16,384 a pass at ~18,000
/// writes a second (the pass itself takes about half a second) found only the newest half
/// held and decoded the rest from text again. Entries a read returned are let go at once,
/// so a server whose aggregator keeps up holds only what it has not read yet. A reader
/// further behind finds the oldest held and reads the newer ones from their rows, which
/// then store their new images whole.
pub const CAP: usize = 32_768;

/// One committed change's images, decoded (the old one is, as a rule, the previous
/// change's new one of the same key, shared: an entry costs one item).
#[derive(Debug, Clone)]
pub struct Published {
    /// The item written.
    pub key: Key,
    /// The item before the write (`None`: it did not exist).
    pub old: Option<Arc<Item>>,
    /// The item after it (`None`: it was deleted).
    pub new: Option<Arc<Item>>,
    /// When it was recorded (the row's `at_ms`).
    pub at_ms: i64,
}

/// The recent committed changes of this process, in sequence order (the writer commits its
/// batches one after another, and `AUTOINCREMENT` numbers every commit's changes after
/// every earlier commit's, of any process).
#[derive(Debug, Default)]
pub struct Recent(Mutex<Held>, FeedReadCounters);

#[derive(Debug, Default)]
struct Held {
    entries: VecDeque<(i64, Published)>,
    /// The changes a feed read rebuilt from the rows beyond the batch it returned, in
    /// sequence order, for the reads after it (`feed::rebuild`).
    rebuilt: Vec<(i64, Published)>,
    /// Whether this process has read the feed: until it does, nothing is kept.
    read: bool,
}

impl Recent {
    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How this process's feed reads were served.
    pub fn reads(&self) -> &FeedReadCounters {
        &self.1
    }

    /// Publish the changes of a committed batch, in sequence order (call only after its
    /// `COMMIT` succeeded).
    pub fn publish(&self, committed: Vec<(i64, Published)>) {
        let Some(first) = committed.first().map(|c| c.0) else {
            return;
        };
        let mut g = self.lock();
        if !g.read {
            return;
        }
        let held = &mut g.entries;
        if held.back().is_some_and(|b| b.0 >= first) {
            // Never expected (numbers only grow): keep the order the look-up relies on by
            // starting over. Nothing is lost but decoding work.
            debug_assert!(false, "published out of sequence order");
            held.clear();
        }
        // Past the cap the newest are not kept (the reader needs the oldest first, and the
        // writer omits a row's new image only for changes kept: [`Recent::has_room`]).
        let room = CAP.saturating_sub(held.len());
        held.extend(committed.into_iter().take(room));
    }

    /// Whether `n` more changes would be kept: the feed has been read, and they fit under
    /// [`CAP`]. Only the writer adds changes, so the answer holds until it publishes.
    pub fn has_room(&self, n: usize) -> bool {
        let g = self.lock();
        g.read && g.entries.len().saturating_add(n) <= CAP
    }

    /// The published changes numbered `from` to `to` (inclusive), in order. From the first
    /// call on, committed changes are kept.
    pub fn range(&self, from: i64, to: i64) -> Vec<(i64, Published)> {
        let mut g = self.lock();
        g.read = true;
        let held = &g.entries;
        let start = held.partition_point(|e| e.0 < from);
        held.range(start..)
            .take_while(|e| e.0 <= to)
            .cloned()
            .collect()
    }

    /// Let go of the changes numbered `seq` or lower: a read returned them.
    pub fn release_through(&self, seq: i64) {
        let mut g = self.lock();
        let through = g.entries.partition_point(|e| e.0 <= seq);
        g.entries.drain(..through);
        let through = g.rebuilt.partition_point(|e| e.0 <= seq);
        g.rebuilt.drain(..through);
    }

    /// Keep `rebuilt` (in sequence order), in place of what an earlier read kept.
    pub fn keep_rebuilt(&self, rebuilt: Vec<(i64, Published)>) {
        debug_assert!(rebuilt.windows(2).all(|w| w[0].0 < w[1].0));
        self.lock().rebuilt = rebuilt;
    }

    /// The rebuilt changes numbered `from` to `to` (inclusive), in order.
    pub fn rebuilt_range(&self, from: i64, to: i64) -> Vec<(i64, Published)> {
        let g = self.lock();
        let start = g.rebuilt.partition_point(|e| e.0 < from);
        g.rebuilt[start..]
            .iter()
            .take_while(|e| e.0 <= to)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(sk: &str) -> Published {
        Published {
            key: Key::new("p", sk),
            old: None,
            new: Some(Arc::new(Item::new())),
            at_ms: 0,
        }
    }

    #[test]
    fn a_range_holds_what_was_published_in_it_and_the_newest_go_past_the_cap() {
        let r = Recent::default();
        // Nothing is kept before the feed is first read.
        r.publish(vec![(1, change("z"))]);
        assert!(r.range(0, 10).is_empty());
        r.publish(vec![(3, change("a")), (4, change("b"))]);
        r.publish(vec![(7, change("c"))]);
        let seqs = |v: Vec<(i64, Published)>| v.into_iter().map(|e| e.0).collect::<Vec<_>>();
        assert_eq!(seqs(r.range(1, 10)), vec![3, 4, 7]);
        assert_eq!(seqs(r.range(4, 6)), vec![4]);
        assert_eq!(seqs(r.range(8, 9)), Vec::<i64>::new());
        let many: Vec<_> = (10..10 + CAP as i64).map(|s| (s, change("x"))).collect();
        r.publish(many);
        // Past the cap the newest are not kept, and there is no room for more.
        let held = r.range(0, i64::MAX);
        assert_eq!(held.len(), CAP);
        assert_eq!(held.first().map(|e| e.0), Some(3));
        assert_eq!(held.last().map(|e| e.0), Some(10 + CAP as i64 - 4));
        assert!(!r.has_room(1));
        // What a read returned is let go, which makes room.
        r.release_through(15);
        assert_eq!(r.range(0, i64::MAX).first().map(|e| e.0), Some(16));
        assert_eq!(r.range(0, i64::MAX).len(), CAP - 9);
        assert!(r.has_room(9));
        assert!(!r.has_room(10));
    }
}
