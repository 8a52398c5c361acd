//! [`FeedAggregator`]: the pass over the change feed — usage summed per snapshot item over
//! the whole pass, committed exactly once with the checkpoint (`commit`) — and the
//! background work after it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tollgate_core::ids::validate_entity_id;
use tollgate_core::mutants::{off, Mutant};
use tollgate_core::value::{Item, Key, Value};
use tollgate_store::{Change, ChangeFeed, FeedCursor};

use super::commit::Checkpoint;
use super::pending::{pair_name, usage, Pending, Summing};
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
    /// What an absorbing aggregator ([`UsageOptions::absorb`]) has summed and trimmed but
    /// not committed.
    held: tokio::sync::Mutex<Option<Held>>,
}

/// Usage an absorbing aggregator has read, summed and trimmed from the feed but not yet
/// committed: rule "held usage is committed from memory, never re-read". The feed no
/// longer has these changes, so the sums are committed from here — again after a failed
/// commit, and from here too when that commit left its claim on the checkpoint — and the
/// aggregator reads nothing further until they have landed.
struct Held {
    /// The stored checkpoint the sums start at (`None`: nothing counted yet).
    from: Option<String>,
    /// How far it has read (and trimmed).
    cursor: FeedCursor,
    /// The usage of the changes after `from` up to `cursor`.
    sums: Summing,
    /// The finished sums of a commit that has not landed: committed again, as they are,
    /// by the next pass.
    unlanded: Option<Pending>,
    /// The newest image of each consumed shard (for the background work after the commit).
    seen: Seen,
    /// Changes read, and those with usage, since the last pass reported them.
    changes: usize,
    usage_changes: usize,
    /// The feed lag seen by the first read since the last pass.
    lag_ms: Option<i64>,
}

impl Held {
    fn at(cp: &Checkpoint) -> Self {
        Held {
            from: cp.text.clone(),
            cursor: cp.cursor.clone(),
            sums: Summing::default(),
            unlanded: None,
            seen: Seen::default(),
            changes: 0,
            usage_changes: 0,
            lag_ms: None,
        }
    }
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
            held: tokio::sync::Mutex::new(None),
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
        self.trim_before(marks, before).await;
    }

    /// [`FeedAggregator::trim`] of the changes written before `before` (epoch ms).
    async fn trim_before(&self, marks: &[FeedCursor], before: i64) {
        for m in marks {
            if let Err(e) = self.feed.trim_feed(m, before).await {
                tracing::warn!(error = %e, "aggregator: feed trim failed (kept)");
                return;
            }
            tokio::task::yield_now().await;
        }
    }

    /// Sum the usage of `changes` into `sums`, keeping in `seen` the newest image of each
    /// shard that consumed; the number of changes with usage.
    fn sum_batch(
        &self,
        changes: &[Change],
        sums: &mut Summing,
        seen: &mut Seen,
        name: &mut String,
    ) -> usize {
        let mut with_usage = 0;
        for c in changes {
            let Some(d) = usage(self.ns(), c, &mut sums.layouts) else {
                continue;
            };
            with_usage += 1;
            if let (true, Some(new)) = (d.consumed(), &c.new) {
                if let Some(shard) = new
                    .get(tollgate_core::bucket::attr::SHARD)
                    .and_then(Value::as_n)
                    .and_then(|n| u32::try_from(n).ok())
                {
                    let pair = pair_name(name, d.entity, d.resource);
                    let shards = match seen.get_mut(pair) {
                        Some(s) => s,
                        None => seen.entry(pair.into()).or_default(),
                    };
                    shards.insert(shard, Arc::clone(new));
                }
            }
            sums.add(&self.opts.windows, &d);
        }
        with_usage
    }

    /// The feed lag of a batch: the age of its oldest change.
    fn lag_of(&self, changes: &[Change]) -> i64 {
        let oldest = changes.iter().map(|c| c.at_ms).min().unwrap_or(0);
        (self.limiter.inner().clock().now_ms() - oldest).max(0)
    }

    /// One pass: finish a claim left on the checkpoint, then read the feed until it has
    /// nothing more (or `max_batches`), summing usage per snapshot item over up to
    /// `max_pass_changes` changes at a time and committing each such sum exactly once
    /// (`commit`); then the background work for what consumed. An absorbing aggregator
    /// ([`UsageOptions::absorb`]) reads the rest of the feed into what it holds and commits
    /// that.
    pub async fn pass(&self) -> Result<PassReport> {
        if self.opts.absorb {
            return self.pass_held().await;
        }
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
                    rep.lag_ms = self.lag_of(&batch.changes);
                    first = false;
                }
                rep.changes += batch.changes.len();
                read += batch.changes.len();
                rep.usage_changes += self.sum_batch(&batch.changes, &mut p, &mut seen, &mut name);
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
        self.background_for(&touched, &seen, &mut rep).await;
        tracing::debug!(?rep, "aggregator pass");
        Ok(rep)
    }

    /// The background work (refill, roll, reset, doubling, clones) for every pair in
    /// `touched`, planned from the feed's newest images of its shards in `seen`.
    async fn background_for(
        &self,
        touched: &BTreeSet<(String, String)>,
        seen: &Seen,
        rep: &mut PassReport,
    ) {
        if !self.opts.background {
            return;
        }
        let mut name = String::new();
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

    /// An absorbing aggregator ([`UsageOptions::absorb`]) between passes: read the feed to
    /// its end (at most `max_pass_changes` changes), sum it into what this aggregator holds
    /// and trim what it read from the feed at once — nothing is read while a commit of
    /// held sums has not landed. The number of changes read; an aggregator that does not
    /// absorb reads none.
    pub async fn absorb(&self) -> Result<usize> {
        if !self.opts.absorb {
            return Ok(0);
        }
        let mut held = self.held.lock().await;
        let mut rep = PassReport::default();
        self.absorb_into(&mut held, &mut rep).await
    }

    /// [`FeedAggregator::absorb`] into `held`: the number of changes read.
    async fn absorb_into(&self, held: &mut Option<Held>, rep: &mut PassReport) -> Result<usize> {
        if held.is_none() {
            // A claim on the checkpoint is another consumer's (this one commits what it
            // holds from memory): finished from the feed first, as a pass finishes it.
            let mut claims = 0usize;
            let cp = loop {
                let cp = self.checkpoint().await?;
                match &cp.claim {
                    Some(claim) if claims < MAX_CLAIMS_FINISHED => {
                        claims += 1;
                        self.finish_claim(&cp, claim, rep).await?;
                    }
                    Some(_) => return Ok(0),
                    None => break cp,
                }
            };
            *held = Some(Held::at(&cp));
        }
        let Some(h) = held.as_mut() else {
            return Ok(0);
        };
        if h.unlanded.is_some() {
            return Ok(0);
        }
        let mut name = String::new();
        let mut read = 0usize;
        let mut batches = 0usize;
        while read < self.opts.max_pass_changes.max(1) {
            if self.opts.max_batches.is_some_and(|m| batches >= m) {
                break;
            }
            batches += 1;
            tokio::task::yield_now().await;
            let batch = self.feed.read_feed(&h.cursor, self.opts.batch).await?;
            h.cursor = batch.cursor;
            if batch.changes.is_empty() {
                break;
            }
            if h.lag_ms.is_none() {
                h.lag_ms = Some(self.lag_of(&batch.changes));
            }
            h.changes += batch.changes.len();
            read += batch.changes.len();
            h.usage_changes += self.sum_batch(&batch.changes, &mut h.sums, &mut h.seen, &mut name);
            // Held now: the feed need not keep them for a re-read, and no other consumer
            // reads it (the option's premise), so no retention applies.
            self.trim_before(std::slice::from_ref(&h.cursor), i64::MAX)
                .await;
        }
        Ok(read)
    }

    /// The pass of an absorbing aggregator: the rest of the feed read into what it holds,
    /// then the held sums committed from memory (rule "held usage is committed from
    /// memory, never re-read"), then the background work for what consumed.
    async fn pass_held(&self) -> Result<PassReport> {
        let mut rep = PassReport::default();
        let mut held = self.held.lock().await;
        self.absorb_into(&mut held, &mut rep).await?;
        let Some(h) = held.as_mut() else {
            return Ok(rep);
        };
        rep.changes += std::mem::take(&mut h.changes);
        rep.usage_changes += std::mem::take(&mut h.usage_changes);
        rep.lag_ms = h.lag_ms.take().unwrap_or(0);
        let p = match h.unlanded.take() {
            Some(p) => p,
            None => std::mem::take(&mut h.sums).finish(),
        };
        if p.snaps.is_empty() {
            // Nothing to count: the read position stays held, with no write.
            return Ok(rep);
        }
        match self.commit_held(h, &p, &mut rep).await {
            Ok(true) => {}
            Ok(false) => {
                let consumer = &self.opts.consumer;
                *held = None;
                return Err(Error::InvalidUsage(format!(
                    "another consumer moved checkpoint {consumer:?} while this absorbing \
                     aggregator held usage it had trimmed from the feed (that usage is \
                     dropped): absorb is only for the feed's sole consumer"
                )));
            }
            Err(e) => {
                if off(Mutant::HeldCommit) {
                    *held = None;
                } else {
                    h.unlanded = Some(p);
                }
                return Err(e);
            }
        }
        let seen = std::mem::take(&mut h.seen);
        drop(held);
        self.background_for(&p.touched, &seen, &mut rep).await;
        tracing::debug!(?rep, "aggregator pass");
        Ok(rep)
    }

    /// Commit `p`, held from `h.from` to `h.cursor`, exactly once: with the checkpoint still
    /// at `h.from`, as a pass commits (`commit_pass`); its own claim left there by a commit
    /// that failed after claiming, applied from `p`; the checkpoint already at `h.cursor`
    /// (a commit whose answer was lost) taken as landed. `Ok(false)`: another consumer
    /// moved the checkpoint.
    async fn commit_held(&self, h: &mut Held, p: &Pending, rep: &mut PassReport) -> Result<bool> {
        let to = h.cursor.encode();
        debug_assert!(
            h.from.as_deref() != Some(to.as_str()),
            "held usage comes from changes after the checkpoint"
        );
        // A conditional write lost to no one but a lost answer of its own is seen again.
        for _ in 0..3 {
            let cp = self.checkpoint().await?;
            let landed = match &cp.claim {
                Some(claim) if cp.text == h.from && claim.to == h.cursor => {
                    self.apply(p, &cp, claim, rep).await?;
                    true
                }
                Some(_) => return Ok(false),
                None if cp.text == h.from => self.commit_pass(p, &cp, &h.cursor, rep).await?,
                None if cp.text.as_deref() == Some(to.as_str()) => {
                    // Counted here: the pass that sent it saw an error.
                    rep.commits += 1;
                    true
                }
                None => return Ok(false),
            };
            if landed {
                h.from = Some(to);
                return Ok(true);
            }
        }
        Ok(false)
    }
}
