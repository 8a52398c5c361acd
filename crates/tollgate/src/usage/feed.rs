//! [`FeedAggregator`]: the pass over the change feed — usage summed per snapshot item over
//! the whole pass, committed exactly once with the checkpoint (`commit`) — and the
//! background work after it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tollgate_core::ids::validate_entity_id;
use tollgate_core::value::{Item, Key, Value};
use tollgate_store::{ChangeFeed, FeedCursor};

use super::pending::{pair_name, usage, Summing};
use super::{PassReport, UsageOptions};
use crate::aggregator::Aggregator;
use crate::error::{Error, Result};
use crate::limiter::Limiter;

/// The key of consumer `consumer`'s checkpoint.
pub fn checkpoint_key(ns: &str, consumer: &str) -> Key {
    Key::new(format!("{ns}/FEED#{consumer}"), "#CHECKPOINT")
}

/// Most claims of other passes one pass finishes before it gives up its turn.
const MAX_CLAIMS_FINISHED: usize = 8;

/// The feed-driven aggregator.
pub struct FeedAggregator {
    pub(super) limiter: Limiter,
    pub(super) feed: Arc<dyn ChangeFeed>,
    background: Aggregator,
    pub(super) opts: UsageOptions,
    /// How far this process has read past the stored checkpoint (changes that carried no
    /// usage move it without a write).
    read_ahead: std::sync::Mutex<Option<(String, FeedCursor)>>,
}

impl std::fmt::Debug for FeedAggregator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeedAggregator")
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

/// The newest image the feed showed of each consumed shard, per (entity, resource) by its
/// [`pair_name`]: what the background pass plans from (`Aggregator::background_from_feed`).
type Seen = crate::caches::Map<Box<str>, BTreeMap<u32, Arc<Item>>>;

impl FeedAggregator {
    /// An aggregator over `feed` — the same store `limiter` uses — with `opts`.
    pub fn new(limiter: &Limiter, feed: Arc<dyn ChangeFeed>, opts: UsageOptions) -> Result<Self> {
        if opts.windows.is_empty() {
            return Err(Error::InvalidUsage(
                "usage needs at least one window (hourly, daily, monthly)".into(),
            ));
        }
        if opts.retention_days <= 0 {
            return Err(Error::InvalidUsage(format!(
                "usage retention must be at least one day, not {}",
                opts.retention_days
            )));
        }
        validate_entity_id(&opts.consumer)?;
        Ok(FeedAggregator {
            limiter: limiter.clone(),
            feed,
            background: Aggregator::new(limiter),
            opts,
            read_ahead: std::sync::Mutex::new(None),
        })
    }

    /// The options.
    pub fn options(&self) -> &UsageOptions {
        &self.opts
    }

    pub(super) fn ns(&self) -> &str {
        self.limiter.inner().ns()
    }

    /// Where to read from: past what this process read without a write, when that started
    /// at the stored checkpoint.
    fn resume(&self, stored: &Option<String>, cursor: FeedCursor) -> FeedCursor {
        let g = self.read_ahead.lock().unwrap_or_else(|e| e.into_inner());
        match (&*g, stored) {
            (Some((from, ahead)), Some(s)) if from == s => ahead.clone(),
            (Some((from, ahead)), None) if from.is_empty() => ahead.clone(),
            _ => cursor,
        }
    }

    fn remember(&self, stored: &Option<String>, ahead: &FeedCursor) {
        *self.read_ahead.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((stored.clone().unwrap_or_default(), ahead.clone()));
    }

    /// Trim the feed through each of `marks` in turn (the cursors after the batches of a
    /// commit), yielding between: one batch's worth at a time, as a pass that committed per
    /// batch did, so that a memory store's lock is never held for a whole pass's changes.
    async fn trim(&self, marks: &[FeedCursor]) {
        let before = self.limiter.inner().clock().now_ms() - self.opts.feed_retention_ms;
        for m in marks {
            if let Err(e) = self.feed.trim_feed(m, before).await {
                tracing::warn!(error = %e, "aggregator: feed trim failed (kept)");
                return;
            }
            tokio::task::yield_now().await;
        }
    }

    /// One pass: finish a claim left on the checkpoint, then read the feed until it has
    /// nothing more (or `max_batches`), summing usage per snapshot item over up to
    /// `max_pass_changes` changes at a time and committing each such sum exactly once
    /// (`commit`); then the background work for what consumed.
    pub async fn pass(&self) -> Result<PassReport> {
        let mut rep = PassReport::default();
        let mut touched = BTreeSet::new();
        let mut seen = Seen::default();
        let mut name = String::new();
        let mut first = true;
        let mut batches = 0usize;
        let mut claims = 0usize;
        loop {
            let cp = self.checkpoint().await?;
            if let Some(claim) = &cp.claim {
                // Bounded: a checkpoint claimed again and again by others is theirs to finish.
                claims += 1;
                if claims > MAX_CLAIMS_FINISHED {
                    break;
                }
                self.finish_claim(&cp, claim, &mut rep).await?;
                continue;
            }
            let mut cursor = self.resume(&cp.text, cp.cursor.clone());
            // The cursor after each batch, to trim the feed by after the commit.
            let mut marks = Vec::new();
            let mut p = Summing::default();
            let mut read = 0usize;
            let mut caught_up = false;
            let mut out_of_batches = false;
            while read < self.opts.max_pass_changes.max(1) {
                if self.opts.max_batches.is_some_and(|m| batches >= m) {
                    out_of_batches = true;
                    break;
                }
                batches += 1;
                // A pass is CPU work over store calls that are often ready at once (a memory
                // store): give the runtime's other tasks — the server's requests — their turn
                // between batches instead of holding a worker thread for the whole pass.
                tokio::task::yield_now().await;
                let batch = self.feed.read_feed(&cursor, self.opts.batch).await?;
                // The batch cursor also holds streams found finished (a closed DynamoDB
                // shard moves the cursor even with no changes).
                cursor = batch.cursor;
                if batch.changes.is_empty() {
                    caught_up = true;
                    break;
                }
                marks.push(cursor.clone());
                if first {
                    let oldest = batch.changes.iter().map(|c| c.at_ms).min().unwrap_or(0);
                    rep.lag_ms = (self.limiter.inner().clock().now_ms() - oldest).max(0);
                    first = false;
                }
                rep.changes += batch.changes.len();
                read += batch.changes.len();
                for c in &batch.changes {
                    let Some(d) = usage(self.ns(), c) else {
                        continue;
                    };
                    rep.usage_changes += 1;
                    if let (true, Some(new)) = (d.consumed(), &c.new) {
                        if let Some(shard) = new
                            .get(tollgate_core::bucket::attr::SHARD)
                            .and_then(Value::as_n)
                            .and_then(|n| u32::try_from(n).ok())
                        {
                            let pair = pair_name(&mut name, d.entity, d.resource);
                            let shards = match seen.get_mut(pair) {
                                Some(s) => s,
                                None => seen.entry(pair.into()).or_default(),
                            };
                            shards.insert(shard, Arc::clone(new));
                        }
                    }
                    p.add(&self.opts.windows, &d);
                }
            }
            let p = p.finish();
            if p.snaps.is_empty() {
                // Nothing to count: the read position moves without a write.
                self.remember(&cp.text, &cursor);
                if caught_up || out_of_batches {
                    break;
                }
                continue;
            }
            if self.commit_pass(&p, &cp, &cursor, &mut rep).await? {
                touched.extend(p.touched);
                self.remember(&Some(cursor.encode()), &cursor);
                self.trim(&marks).await;
                if caught_up || out_of_batches {
                    break;
                }
            } else {
                rep.lost_races += 1;
                tracing::debug!("aggregator: another consumer moved the checkpoint; re-reading");
                if out_of_batches {
                    break;
                }
            }
        }
        if self.opts.background {
            for (i, (e, r)) in touched.iter().enumerate() {
                if i % 16 == 15 {
                    tokio::task::yield_now().await;
                }
                // Planned from the feed's newest image of each shard it showed consumed
                // (no read); a pair whose images did not survive a lost race is read.
                let images: Vec<(u32, Arc<Item>)> = seen
                    .get(pair_name(&mut name, e, r))
                    .map(|m| m.iter().map(|(s, i)| (*s, Arc::clone(i))).collect())
                    .unwrap_or_default();
                let done = if images.is_empty() {
                    match self.background.refill_entity(e, r).await {
                        Ok(x) => {
                            rep.background.merge(x);
                            self.background.maybe_double(e, r).await
                        }
                        Err(err) => Err(err),
                    }
                } else {
                    self.background.background_from_feed(e, r, &images).await
                };
                match done {
                    Ok(x) => rep.background.merge(x),
                    Err(err) => {
                        tracing::warn!(entity = %e, resource = %r, error = %err, "aggregator: refill pass failed")
                    }
                }
            }
        }
        tracing::debug!(?rep, "aggregator pass");
        Ok(rep)
    }
}
