//! The change feed: every applied write, with its old and new image, readable in order from
//! a durable cursor.
//!
//! A backend that keeps a feed implements [`ChangeFeed`] beside [`Store`]. The contract:
//!
//! - every applied write — a put, an update, a delete, each operation of a transaction —
//!   appears exactly once, as one [`Change`] with the item before (`old`) and after (`new`)
//!   the write and the time the store applied it;
//! - a write that changed nothing (an update that left the item as it was, a delete of an
//!   absent item), a failed condition, a cancelled transaction and a resent transaction
//!   (same idempotency token) never appear;
//! - the changes of one item come in the order they were applied;
//! - [`ChangeFeed::read_feed`] returns the changes after a [`FeedCursor`] and the cursor after
//!   them; a consumer stores the cursor where it stores what it derived (the aggregator: in
//!   the same transaction as its usage snapshots), so a batch read twice is counted once.
//!
//! Positions are per *stream*: `MemoryStore` and SQLite have one stream (`""`) with a global
//! sequence; DynamoDB has one per stream shard, each with its own sequence numbers.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use tollgate_core::value::{Item, Key};

use crate::{Store, StoreError};

/// Where one change sits in the feed: its stream and its sequence number there.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FeedPosition {
    /// The stream (a DynamoDB stream shard id; `""` for a backend with one stream).
    pub stream: String,
    /// The sequence number in that stream: decimal digits, compared as numbers.
    pub seq: String,
}

/// One applied write.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// Where it sits in the feed.
    pub position: FeedPosition,
    /// The item written.
    pub key: Key,
    /// The item before the write (`None`: it did not exist). Shared: a feed that keeps its
    /// changes hands out the same image to every read instead of a copy.
    pub old: Option<Arc<Item>>,
    /// The item after the write (`None`: it was deleted). Shared, as `old`.
    pub new: Option<Arc<Item>>,
    /// When the store applied the write (epoch ms; DynamoDB Streams' approximate creation
    /// time, to the second on DynamoDB Local).
    pub at_ms: i64,
}

/// The marker a cursor holds for a stream read to its end (a closed DynamoDB shard).
pub const STREAM_DONE: &str = "done";

/// How far a consumer has read: per stream, the last sequence number it consumed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FeedCursor {
    /// Stream → last consumed sequence number (or [`STREAM_DONE`]).
    pub streams: BTreeMap<String, String>,
}

/// Compare two decimal sequence numbers as numbers (DynamoDB's are up to 40 digits).
pub fn seq_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    let a = a.trim_start_matches('0');
    let b = b.trim_start_matches('0');
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

impl FeedCursor {
    /// The beginning of the feed.
    pub fn start() -> Self {
        Self::default()
    }

    /// The last sequence number consumed on `stream`, if any.
    pub fn last(&self, stream: &str) -> Option<&str> {
        self.streams.get(stream).map(String::as_str)
    }

    /// Whether `stream` was read to its end.
    pub fn done(&self, stream: &str) -> bool {
        self.last(stream) == Some(STREAM_DONE)
    }

    /// Whether the change at `p` comes after this cursor (is still to be consumed).
    pub fn is_after(&self, p: &FeedPosition) -> bool {
        match self.last(&p.stream) {
            None => true,
            Some(STREAM_DONE) => false,
            Some(last) => seq_cmp(&p.seq, last) == std::cmp::Ordering::Greater,
        }
    }

    /// Record the change at `p` as consumed. Never moves a stream back.
    pub fn advance(&mut self, p: &FeedPosition) {
        if self.is_after(p) {
            self.streams.insert(p.stream.clone(), p.seq.clone());
        }
    }

    /// Record `stream` as read to its end.
    pub fn finish(&mut self, stream: &str) {
        self.streams
            .insert(stream.to_string(), STREAM_DONE.to_string());
    }

    /// Forget streams the feed no longer has (trimmed DynamoDB shards).
    pub fn retain(&mut self, live: impl Fn(&str) -> bool) {
        self.streams.retain(|s, _| live(s));
    }

    /// The cursor as text, to store (JSON of the stream map).
    pub fn encode(&self) -> String {
        // A map of strings always serialises.
        serde_json::to_string(&self.streams).unwrap_or_else(|_| "{}".to_string())
    }

    /// A cursor stored by [`FeedCursor::encode`].
    pub fn decode(s: &str) -> Result<Self, StoreError> {
        serde_json::from_str(s)
            .map(|streams| FeedCursor { streams })
            .map_err(|e| StoreError::Validation(format!("stored feed cursor {s:?}: {e}")))
    }

    /// The single-stream cursor's sequence as a number (`MemoryStore`, SQLite): 0 at the start.
    pub fn single_seq(&self) -> Result<i64, StoreError> {
        match self.last("") {
            None => Ok(0),
            Some(s) => s.parse().map_err(|_| {
                StoreError::Validation(format!(
                    "feed cursor {s:?} is not a sequence number of this backend"
                ))
            }),
        }
    }
}

/// What one [`ChangeFeed::read_feed`] returned.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FeedBatch {
    /// The changes, in order per item (and per stream).
    pub changes: Vec<Change>,
    /// The cursor after every change of the batch (and after streams found finished).
    pub cursor: FeedCursor,
}

/// The change-feed capability of a store.
#[async_trait]
pub trait ChangeFeed: Store {
    /// Up to `limit` changes after `cursor` (possibly fewer, even none, with more to come),
    /// and the cursor after them.
    async fn read_feed(&self, cursor: &FeedCursor, limit: usize) -> Result<FeedBatch, StoreError>;

    /// Let the backend forget the changes at or before `cursor` that were written before
    /// `before_ms` (epoch ms): a consumer trims what it has counted, past a retention that
    /// leaves other consumers (another namespace's aggregator on the same file) time to
    /// read. A hint: a backend that trims on its own (DynamoDB Streams keeps 24 hours)
    /// ignores it.
    async fn trim_feed(&self, cursor: &FeedCursor, before_ms: i64) -> Result<(), StoreError> {
        let _ = (cursor, before_ms);
        Ok(())
    }
}

#[async_trait]
impl<S: ChangeFeed + ?Sized> ChangeFeed for std::sync::Arc<S> {
    async fn read_feed(&self, cursor: &FeedCursor, limit: usize) -> Result<FeedBatch, StoreError> {
        (**self).read_feed(cursor, limit).await
    }
    async fn trim_feed(&self, cursor: &FeedCursor, before_ms: i64) -> Result<(), StoreError> {
        (**self).trim_feed(cursor, before_ms).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(stream: &str, seq: &str) -> FeedPosition {
        FeedPosition {
            stream: stream.into(),
            seq: seq.into(),
        }
    }

    #[test]
    fn sequence_numbers_compare_as_numbers() {
        use std::cmp::Ordering::*;
        assert_eq!(seq_cmp("9", "10"), Less);
        assert_eq!(seq_cmp("0010", "10"), Equal);
        assert_eq!(
            seq_cmp(
                "4000000000000000000000000000000000000001",
                "399999999999999999999999999999999999999"
            ),
            Greater
        );
    }

    #[test]
    fn cursor_advances_per_stream_and_never_back() {
        let mut c = FeedCursor::start();
        assert!(c.is_after(&pos("a", "1")));
        c.advance(&pos("a", "12"));
        c.advance(&pos("a", "9"));
        assert_eq!(c.last("a"), Some("12"));
        assert!(!c.is_after(&pos("a", "12")));
        assert!(c.is_after(&pos("a", "13")));
        assert!(c.is_after(&pos("b", "1")));
        c.finish("a");
        assert!(!c.is_after(&pos("a", "99")));
        let back = FeedCursor::decode(&c.encode()).expect("round trip");
        assert_eq!(back, c);
        assert!(FeedCursor::decode("[1]").is_err());
    }
}
