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
//! numbers are given again, to other changes, but a committed number never is
//! (`AUTOINCREMENT`), so an entry is always the change stored under its number. Changes
//! another process wrote are not here and are read from their text. At most [`CAP`] entries
//! are kept, the newest.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tollgate_core::value::{Item, Key};

/// Most entries kept (each holds one decoded item, about 2 KB for a bucket of one limit: at
/// most about 32 MB): what one aggregator pass reads at the default pass interval (1 s) up
/// to about 16,000 writes a second, above the embedded store's peak rate on the development
/// machine (8,192 held 0.8 s of it, and the rest of every pass was decoded from text again).
pub const CAP: usize = 16_384;

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
}

/// The recent committed changes of this process, in sequence order (the writer commits its
/// batches one after another, and `AUTOINCREMENT` numbers every commit's changes after
/// every earlier commit's, of any process).
#[derive(Debug, Default)]
pub struct Recent(Mutex<VecDeque<(i64, Published)>>);

impl Recent {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(i64, Published)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publish the changes of a committed batch, in sequence order (call only after its
    /// `COMMIT` succeeded).
    pub fn publish(&self, committed: Vec<(i64, Published)>) {
        let Some(first) = committed.first().map(|c| c.0) else {
            return;
        };
        let mut g = self.lock();
        if g.back().is_some_and(|b| b.0 >= first) {
            // Never expected (numbers only grow): keep the order the look-up relies on by
            // starting over. Nothing is lost but decoding work.
            debug_assert!(false, "published out of sequence order");
            g.clear();
        }
        g.extend(committed);
        let over = g.len().saturating_sub(CAP);
        g.drain(..over);
    }

    /// The published changes numbered `from` to `to` (inclusive), in order.
    pub fn range(&self, from: i64, to: i64) -> Vec<(i64, Published)> {
        let g = self.lock();
        let start = g.partition_point(|e| e.0 < from);
        g.range(start..)
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
        }
    }

    #[test]
    fn a_range_holds_what_was_published_in_it_and_the_oldest_go_past_the_cap() {
        let r = Recent::default();
        r.publish(vec![(3, change("a")), (4, change("b"))]);
        r.publish(vec![(7, change("c"))]);
        let seqs = |v: Vec<(i64, Published)>| v.into_iter().map(|e| e.0).collect::<Vec<_>>();
        assert_eq!(seqs(r.range(1, 10)), vec![3, 4, 7]);
        assert_eq!(seqs(r.range(4, 6)), vec![4]);
        assert_eq!(seqs(r.range(8, 9)), Vec::<i64>::new());
        let many: Vec<_> = (10..10 + CAP as i64).map(|s| (s, change("x"))).collect();
        r.publish(many);
        let held = r.range(0, i64::MAX);
        assert_eq!(held.len(), CAP);
        assert_eq!(held.first().map(|e| e.0), Some(10));
    }
}
