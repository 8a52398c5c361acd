//! The running aggregator over the change feed, and the usage snapshots it keeps.
//!
//! [`FeedAggregator::pass`] reads the store's [`ChangeFeed`] from the consumer's checkpoint,
//! turns each bucket write into usage ([`tollgate_core::usage::usage_of`]: `tc` and `rq`
//! deltas dated by the write's `wt`, and each limit's overdraw, ADR-151), adds it to the snapshots of every configured window,
//! and — in the same transaction — moves the checkpoint, conditioned on the checkpoint it
//! started from. A batch read twice (a restarted aggregator, a second aggregator on the
//! same store) therefore lands once: the second commit's checkpoint condition fails and it
//! re-reads from the checkpoint that won. A pass that dies before its commit leaves the
//! checkpoint where it was, and the next pass reads the same changes again.
//!
//! After the usage, the pass runs the [`Aggregator`]'s background work (refill, roll and
//! reset; proactive doubling and Path-2 clones) for every (entity, resource) that consumed
//! in the batch, as the original's stream processor did.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tollgate_core::expr::{Condition, ReturnValues, Update};
use tollgate_core::ids::{validate_entity_id, validate_resource};
use tollgate_core::usage::{
    snapshot_key, snapshot_pk, snapshot_update, usage_of, Snapshot, Window,
};
use tollgate_core::value::{Key, Value};
use tollgate_store::{
    ChangeFeed, FeedCursor, Query, StoreError, TransactOp, UpdateRequest, MAX_TRANSACT_OPS,
};

use crate::aggregator::Aggregator;
use crate::error::{Error, Result};
use crate::limiter::Limiter;

/// How the aggregator keeps usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageOptions {
    /// The snapshot windows (default hourly and daily).
    pub windows: Vec<Window>,
    /// How long a snapshot is kept after its window ends (days; default 90).
    pub retention_days: i64,
    /// Changes read per feed request (default 500).
    pub batch: usize,
    /// The consumer name its checkpoint is stored under (default `aggregator`): processes
    /// with the same name share one checkpoint, so each change is counted once among them.
    pub consumer: String,
    /// Also refill, roll, reset and double the buckets that consumed (default true).
    pub background: bool,
    /// Most feed reads in one pass (`None`: until the feed has nothing more).
    pub max_batches: Option<usize>,
    /// Changes counted are trimmed from the feed (where the backend keeps it: memory,
    /// SQLite) once older than this (ms; default 24 hours, DynamoDB Streams' own), so
    /// another consumer of the same feed — another namespace's aggregator on the same file
    /// — has that long to read them.
    pub feed_retention_ms: i64,
}

impl Default for UsageOptions {
    fn default() -> Self {
        UsageOptions {
            windows: vec![Window::Hourly, Window::Daily],
            retention_days: 90,
            batch: 500,
            consumer: "aggregator".into(),
            background: true,
            max_batches: None,
            feed_retention_ms: 86_400_000,
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Changes read from the feed.
    pub changes: usize,
    /// Changes that carried usage.
    pub usage_changes: usize,
    /// Snapshot updates written (each snapshot item once per commit).
    pub snapshot_writes: usize,
    /// Transactions that moved the checkpoint.
    pub commits: usize,
    /// Commits refused because another consumer had moved the checkpoint first (their
    /// changes were re-read from the winner's checkpoint, never counted twice).
    pub lost_races: usize,
    /// Age (ms) of the oldest change read, at the start of the pass: the feed lag.
    pub lag_ms: i64,
    /// The background work's report.
    pub background: crate::AggregateReport,
}

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
        self.limiter.inner.ns()
    }

    /// The stored checkpoint: its text (for the commit's condition) and cursor.
    async fn checkpoint(&self) -> Result<(Option<String>, FeedCursor)> {
        let k = checkpoint_key(self.ns(), &self.opts.consumer);
        let item = self.limiter.inner.store.get(&k, true).await?;
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
                .set("updated_ms", self.limiter.inner.clock.now_ms()),
            condition: Some(cond),
            returns: ReturnValues::None,
        }));
        let checkpoint_at = ops.len() - 1;
        match self.limiter.inner.store.transact_write(ops, None).await {
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
                rep.lag_ms = (self.limiter.inner.clock.now_ms() - oldest).max(0);
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
                let before = self.limiter.inner.clock.now_ms() - self.opts.feed_retention_ms;
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
                match self.background.refill_entity(e, r).await {
                    Ok(x) => rep.background.merge(x),
                    Err(err) => {
                        tracing::warn!(entity = %e, resource = %r, error = %err, "aggregator: refill pass failed")
                    }
                }
                match self.background.maybe_double(e, r).await {
                    Ok(x) => rep.background.merge(x),
                    Err(err) => {
                        tracing::warn!(entity = %e, resource = %r, error = %err, "aggregator: doubling check failed")
                    }
                }
            }
        }
        tracing::debug!(?rep, "aggregator pass");
        Ok(rep)
    }
}

/// A usage query: an entity's snapshots (optionally of one resource), or a resource's over
/// every entity; one window or all; a time range of window starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageQuery {
    /// The entity.
    pub entity: Option<String>,
    /// The resource.
    pub resource: Option<String>,
    /// One window (all when `None`).
    pub window: Option<Window>,
    /// Window starts at or after this (ms).
    pub from_ms: Option<i64>,
    /// Window starts before this (ms).
    pub to_ms: Option<i64>,
    /// Most snapshots in a page (default 100, at most 1000).
    pub limit: Option<usize>,
    /// Continue after this page token.
    pub after: Option<String>,
}

/// One page of snapshots.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsagePage {
    /// The snapshots, oldest window first.
    pub snapshots: Vec<Snapshot>,
    /// The token of the next page, when there is one.
    pub next: Option<String>,
}

fn page_token(s: &Snapshot) -> String {
    format!(
        "{}|{}|{}|{}",
        s.start_ms,
        s.window.name(),
        s.entity,
        s.resource
    )
}

impl Limiter {
    /// Usage snapshots matching `q`, oldest window first, paginated.
    pub async fn usage(&self, q: &UsageQuery) -> Result<UsagePage> {
        let invalid = Error::InvalidUsage;
        if let Some(e) = &q.entity {
            validate_entity_id(e)?;
        }
        if let Some(r) = &q.resource {
            validate_resource(r)?;
        }
        let limit = q.limit.unwrap_or(100);
        if !(1..=1000).contains(&limit) {
            return Err(invalid(format!("limit must be 1 to 1000, not {limit}")));
        }
        let ns = self.inner.ns();
        let items = match (&q.entity, &q.resource) {
            (Some(e), r) => {
                let prefix = r.as_ref().map(|r| format!("{r}#"));
                self.inner
                    .store
                    .query(Query {
                        consistent: true,
                        ..Query::table(snapshot_pk(ns, e), prefix.as_deref())
                    })
                    .await?
            }
            (None, Some(r)) => {
                self.inner
                    .store
                    .query(Query::index(
                        "GSI2",
                        tollgate_core::keys::gsi2_resource(ns, r),
                        Some("USAGE#"),
                    ))
                    .await?
            }
            (None, None) => {
                return Err(invalid(
                    "a usage query names an entity or a resource".into(),
                ))
            }
        };
        let mut snaps: Vec<Snapshot> = items
            .iter()
            .filter_map(Snapshot::decode)
            .filter(|s| q.window.is_none_or(|w| s.window == w))
            .filter(|s| q.from_ms.is_none_or(|f| s.start_ms >= f))
            .filter(|s| q.to_ms.is_none_or(|t| s.start_ms < t))
            .collect();
        snaps.sort_by(|a, b| {
            (a.start_ms, a.window, &a.entity, &a.resource).cmp(&(
                b.start_ms,
                b.window,
                &b.entity,
                &b.resource,
            ))
        });
        if let Some(after) = &q.after {
            let pos = snaps.iter().position(|s| page_token(s) == *after);
            match pos {
                Some(i) => {
                    snaps.drain(..=i);
                }
                None => return Err(invalid(format!("unknown page token {after:?}"))),
            }
        }
        let next = (snaps.len() > limit).then(|| page_token(&snaps[limit - 1]));
        snaps.truncate(limit);
        Ok(UsagePage {
            snapshots: snaps,
            next,
        })
    }
}
