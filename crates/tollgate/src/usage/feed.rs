//! [`FeedAggregator`]: the pass over the change feed — usage summed per snapshot item,
//! committed with the checkpoint in one transaction — and the background work after it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tollgate_core::expr::{Condition, ReturnValues, Update};
use tollgate_core::ids::validate_entity_id;
use tollgate_core::usage::{snapshot_key, snapshot_update, usage_of, Window};
use tollgate_core::value::{Item, Key, Value};
use tollgate_store::{
    ChangeFeed, FeedCursor, StoreError, TransactOp, UpdateRequest, MAX_TRANSACT_OPS,
};

use super::{PassReport, UsageOptions};
use crate::aggregator::Aggregator;
use crate::error::{Error, Result};
use crate::limiter::Limiter;

/// The key of consumer `consumer`'s checkpoint.
pub fn checkpoint_key(ns: &str, consumer: &str) -> Key {
    Key::new(format!("{ns}/FEED#{consumer}"), "#CHECKPOINT")
}

const CURSOR: &str = "cursor";

/// The feed-driven aggregator.
pub struct FeedAggregator {
    limiter: Limiter,
    feed: Arc<dyn ChangeFeed>,
    background: Aggregator,
    opts: UsageOptions,
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

/// The usage summed for one snapshot item.
struct Sum {
    entity: String,
    resource: String,
    window: Window,
    start_ms: i64,
    milli: BTreeMap<String, i64>,
    overdraw: BTreeMap<String, i64>,
    requests: i64,
}

/// Usage summed per snapshot item, and the (entity, resource) pairs that consumed.
#[derive(Default)]
struct Pending {
    snaps: BTreeMap<Key, Sum>,
    touched: BTreeSet<(String, String)>,
}

/// The newest image the feed showed of each consumed shard, per (entity, resource): what
/// the background pass plans from (`Aggregator::background_from_feed`).
type Seen = BTreeMap<(String, String), BTreeMap<u32, Arc<Item>>>;

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

    fn ns(&self) -> &str {
        self.limiter.inner().ns()
    }

    /// The stored checkpoint: its text (for the commit's condition) and cursor.
    async fn checkpoint(&self) -> Result<(Option<String>, FeedCursor)> {
        let k = checkpoint_key(self.ns(), &self.opts.consumer);
        let item = self.limiter.inner().store().get(&k, true).await?;
        match item
            .as_ref()
            .and_then(|i| i.get(CURSOR))
            .and_then(Value::as_s)
        {
            None => Ok((None, FeedCursor::start())),
            Some(t) => Ok((Some(t.to_string()), FeedCursor::decode(t)?)),
        }
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

    /// Add one change's usage to `p`.
    fn add(&self, p: &mut Pending, d: tollgate_core::usage::UsageDelta) {
        for w in &self.opts.windows {
            let start = w.start_ms(d.at_ms);
            let k = snapshot_key(&d.ns, &d.entity, &d.resource, *w, start);
            let e = p.snaps.entry(k).or_insert_with(|| Sum {
                entity: d.entity.clone(),
                resource: d.resource.clone(),
                window: *w,
                start_ms: start,
                milli: BTreeMap::new(),
                overdraw: BTreeMap::new(),
                requests: 0,
            });
            for (l, m) in &d.milli {
                *e.milli.entry(l.clone()).or_default() += m;
            }
            for (l, m) in &d.overdraw {
                *e.overdraw.entry(l.clone()).or_default() += m;
            }
            e.requests += d.requests;
        }
        if d.milli.values().any(|m| *m > 0) {
            p.touched.insert((d.entity, d.resource));
        }
    }

    /// Write `p`'s snapshot updates and move the checkpoint from `stored` to `to`, in one
    /// transaction. `Ok(false)`: another consumer moved the checkpoint first.
    async fn commit(&self, p: &Pending, stored: &Option<String>, to: &FeedCursor) -> Result<bool> {
        debug_assert!(p.snaps.len() < MAX_TRANSACT_OPS);
        let ns = self.ns().to_string();
        let retention_s = self.opts.retention_days * 86_400;
        let mut ops: Vec<TransactOp> = p
            .snaps
            .iter()
            .map(|(k, x)| {
                TransactOp::Update(UpdateRequest {
                    key: k.clone(),
                    update: snapshot_update(
                        &ns,
                        &x.entity,
                        &x.resource,
                        x.window,
                        x.start_ms,
                        &x.milli,
                        &x.overdraw,
                        x.requests,
                        retention_s,
                    ),
                    condition: None,
                    returns: ReturnValues::None,
                })
            })
            .collect();
        let text = to.encode();
        let cond = match stored {
            _ if tollgate_core::mutants::off(tollgate_core::mutants::Mutant::UsageCheckpoint) => {
                Condition::exists("PK").or(Condition::not_exists("PK"))
            }
            None => Condition::not_exists("PK"),
            Some(s) => Condition::eq(CURSOR, s.as_str()),
        };
        ops.push(TransactOp::Update(UpdateRequest {
            key: checkpoint_key(&ns, &self.opts.consumer),
            update: Update::new()
                .set(CURSOR, text.as_str())
                .set("updated_ms", self.limiter.inner().clock().now_ms()),
            condition: Some(cond),
            returns: ReturnValues::None,
        }));
        let checkpoint_at = ops.len() - 1;
        match self.limiter.inner().store().transact_write(ops, None).await {
            Ok(()) => Ok(true),
            Err(StoreError::TransactionCanceled { reasons })
                if matches!(
                    reasons.get(checkpoint_at),
                    Some(tollgate_store::CancelReason::ConditionFailed { .. })
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// One pass: read the feed until it has nothing more, committing usage and checkpoint
    /// together, then the background work for what consumed.
    pub async fn pass(&self) -> Result<PassReport> {
        let mut rep = PassReport::default();
        let (mut stored, from) = self.checkpoint().await?;
        let mut cursor = self.resume(&stored, from);
        let mut touched = BTreeSet::new();
        let mut seen: Seen = BTreeMap::new();
        let mut first = true;
        let mut batches = 0usize;
        loop {
            if self.opts.max_batches.is_some_and(|m| batches >= m) {
                break;
            }
            batches += 1;
            // A pass is CPU work over store calls that are often ready at once (a memory
            // store): give the runtime's other tasks — the server's requests — their turn
            // between batches instead of holding a worker thread for the whole pass.
            tokio::task::yield_now().await;
            let batch = self.feed.read_feed(&cursor, self.opts.batch).await?;
            if batch.changes.is_empty() {
                // Finished streams (a closed DynamoDB shard) still move the cursor.
                cursor = batch.cursor;
                self.remember(&stored, &cursor);
                break;
            }
            if first {
                let oldest = batch.changes.iter().map(|c| c.at_ms).min().unwrap_or(0);
                rep.lag_ms = (self.limiter.inner().clock().now_ms() - oldest).max(0);
                first = false;
            }
            rep.changes += batch.changes.len();
            let mut p = Pending::default();
            let mut at = cursor.clone();
            let mut lost = false;
            for c in &batch.changes {
                if let Some(d) = usage_of(&c.key, c.old.as_deref(), c.new.as_deref(), c.at_ms)
                    .filter(|d| d.ns == self.ns())
                {
                    let new_keys = self
                        .opts
                        .windows
                        .iter()
                        .filter(|w| {
                            let k = snapshot_key(
                                &d.ns,
                                &d.entity,
                                &d.resource,
                                **w,
                                w.start_ms(d.at_ms),
                            );
                            !p.snaps.contains_key(&k)
                        })
                        .count();
                    if p.snaps.len() + new_keys >= MAX_TRANSACT_OPS {
                        // A full transaction: commit what came before this change.
                        if !self.commit(&p, &stored, &at).await? {
                            lost = true;
                            break;
                        }
                        rep.commits += 1;
                        rep.snapshot_writes += p.snaps.len();
                        touched.extend(std::mem::take(&mut p.touched));
                        p = Pending::default();
                        stored = Some(at.encode());
                    }
                    rep.usage_changes += 1;
                    if let Some(new) = &c.new {
                        let shard = new
                            .get(tollgate_core::bucket::attr::SHARD)
                            .and_then(Value::as_n);
                        if let (true, Some(shard)) = (
                            d.milli.values().any(|m| *m > 0),
                            shard.and_then(|n| u32::try_from(n).ok()),
                        ) {
                            seen.entry((d.entity.clone(), d.resource.clone()))
                                .or_default()
                                .insert(shard, Arc::clone(new));
                        }
                    }
                    self.add(&mut p, d);
                }
                at.advance(&c.position);
            }
            if lost {
                rep.lost_races += 1;
                let (s, c) = self.checkpoint().await?;
                stored = s;
                cursor = c;
                continue;
            }
            // The batch cursor also holds streams found finished.
            let end = batch.cursor;
            if p.snaps.is_empty() {
                cursor = end;
                self.remember(&stored, &cursor);
                continue;
            }
            if self.commit(&p, &stored, &end).await? {
                rep.commits += 1;
                rep.snapshot_writes += p.snaps.len();
                touched.extend(p.touched);
                stored = Some(end.encode());
                cursor = end;
                self.remember(&stored, &cursor);
                let before = self.limiter.inner().clock().now_ms() - self.opts.feed_retention_ms;
                if let Err(e) = self.feed.trim_feed(&cursor, before).await {
                    tracing::warn!(error = %e, "aggregator: feed trim failed (kept)");
                }
            } else {
                rep.lost_races += 1;
                tracing::debug!("aggregator: another consumer moved the checkpoint; re-reading");
                let (s, c) = self.checkpoint().await?;
                stored = s;
                cursor = c;
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
                    .get(&(e.clone(), r.clone()))
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
