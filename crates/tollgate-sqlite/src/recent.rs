//! The changes this process's writer committed, decoded, by sequence number: the feed
//! reader of the same process takes their images from here instead of decoding the stored
//! JSON again (decoding the feed was the embedded store's largest cost after the writer's
//! own work). The writer does not decode either: it remembers the text and item of the rows
//! it wrote (`ops::Memo`).
//!
//! Only committed changes are published: a rolled-back batch's sequence numbers are given
//! again, to other changes, but a committed number never is (`AUTOINCREMENT`), so an entry is
//! always the change stored under its number. Changes another process wrote are not here and
//! are read from their text. At most [`CAP`] entries are kept, the newest.

use std::collections::BTreeMap;
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
    /// The item before the write.
    pub old: Option<Arc<Item>>,
    /// The item after it.
    pub new: Arc<Item>,
}

/// The recent committed changes of this process.
#[derive(Debug, Default)]
pub struct Recent(Mutex<BTreeMap<i64, Published>>);

impl Recent {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<i64, Published>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publish the changes of a committed batch (call only after its `COMMIT` succeeded).
    pub fn publish(&self, committed: Vec<(i64, Published)>) {
        if committed.is_empty() {
            return;
        }
        let mut g = self.lock();
        g.extend(committed);
        while g.len() > CAP {
            g.pop_first();
        }
    }

    /// The published changes among `seqs` (`None` where a change is not held).
    pub fn lookup(&self, seqs: impl Iterator<Item = i64>) -> Vec<Option<Published>> {
        let g = self.lock();
        seqs.map(|s| g.get(&s).cloned()).collect()
    }
}
