//! Committing a pass's usage — rule "a pass's usage is applied exactly once: claim, apply
//! per item at most once, finalize" (docs/rules.md).
//!
//! The checkpoint item of a consumer holds `cursor` (how far its usage is counted) and
//! `pass` (how many passes moved it). A pass that summed the changes after `cursor` = C up
//! to E commits them in one of two ways:
//!
//! - **One transaction** when its snapshot items fit beside the checkpoint (at most
//!   [`UsageOptions::commit_items`](super::UsageOptions::commit_items)): the snapshot
//!   updates and `cursor = E`, `pass + 1`, conditioned on the checkpoint still holding C and
//!   no claim.
//! - **Claim, apply, finalize** otherwise. The claim is one conditioned write on the
//!   checkpoint (still C, no claim): `pending_to = E`, `pending_pass = pass + 1`. The
//!   snapshot updates then go in transactions of at most `commit_items`, each update
//!   conditioned on the item's `pass_{consumer}` being absent or below the claimed pass and
//!   setting it to that pass — so each lands at most once per pass. The last transaction
//!   also finalizes: `cursor = E`, `pass + 1`, the claim removed, conditioned on the claim
//!   being the one applied. Updates refused by their condition were applied already (by a
//!   consumer finishing the same claim) and are dropped from a retry of their transaction.
//!
//! A claim left behind (a crash, a lost response, an error between claim and finalize) is
//! finished by the next pass of any consumer sharing the checkpoint before it reads further:
//! it re-reads the feed exactly from C to E — the feed is trimmed only after a finalize, so
//! the range reads the same changes and sums to the same figures — and applies them with
//! the same per-item conditions. Passes are numbered and a claim is never withdrawn, so an
//! item marked with the claimed pass (or a later one) has that pass's usage.

use tollgate_core::expr::{Condition, Name, ReturnValues, Update};
use tollgate_core::mutants::{off, Mutant};
use tollgate_core::value::Value;
use tollgate_store::feed::{seq_cmp, STREAM_DONE};
use tollgate_store::{
    CancelReason, FeedCursor, StoreError, TransactOp, UpdateRequest, MAX_TRANSACT_OPS,
};

use super::feed::{checkpoint_key, FeedAggregator};
use super::pending::{pass_attr, usage, Pending, Summing};
use super::PassReport;
use crate::error::Result;

const CURSOR: &str = "cursor";
const PASS: &str = "pass";
const PENDING_TO: &str = "pending_to";
const PENDING_PASS: &str = "pending_pass";

/// Consecutive empty feed reads after which a claim's range is taken as read to its end
/// (DynamoDB Streams may answer empty pages before records; memory and SQLite never do).
const EMPTY_READS: usize = 3;

/// How many times a transaction refused for a retryable reason (a conflict, a throttle) is
/// sent again before the pass fails (the claim stays, and the next pass finishes it).
const RETRIES: usize = 3;

/// A consumer's stored checkpoint.
pub(super) struct Checkpoint {
    /// The stored cursor text (the conditions compare it); `None`: nothing counted yet.
    pub text: Option<String>,
    /// The stored cursor.
    pub cursor: FeedCursor,
    /// Passes that moved the checkpoint.
    pub pass: i64,
    /// A claim not finalized yet.
    pub claim: Option<Claim>,
}

/// A claimed pass: the changes after the checkpoint's cursor up to `to`, numbered `pass`.
pub(super) struct Claim {
    /// The cursor the claimed pass read to.
    pub to: FeedCursor,
    /// Its number (the checkpoint's `pass` + 1).
    pub pass: i64,
}

/// Whether `at` has read every change up to `to`.
fn covers(at: &FeedCursor, to: &FeedCursor) -> bool {
    to.streams.iter().all(|(s, seq)| {
        at.done(s)
            || (seq != STREAM_DONE
                && at
                    .last(s)
                    .is_some_and(|l| seq_cmp(l, seq) != std::cmp::Ordering::Less))
    })
}

fn corrupt(what: &str) -> crate::Error {
    StoreError::Corrupt(format!("feed checkpoint: {what}")).into()
}

impl FeedAggregator {
    /// Most snapshot items per transaction.
    fn chunk(&self) -> usize {
        self.opts.commit_items.clamp(1, MAX_TRANSACT_OPS - 1)
    }

    /// The stored checkpoint.
    pub(super) async fn checkpoint(&self) -> Result<Checkpoint> {
        let k = checkpoint_key(self.ns(), &self.opts.consumer);
        let item = self.limiter.inner().store().get(&k, true).await?;
        let s = |a: &str| item.as_ref().and_then(|i| i.get(a));
        let text = s(CURSOR)
            .map(|v| v.as_s().map(str::to_string).ok_or_else(|| corrupt(CURSOR)))
            .transpose()?;
        let cursor = match &text {
            Some(t) => FeedCursor::decode(t)?,
            None => FeedCursor::start(),
        };
        let claim = match (s(PENDING_TO), s(PENDING_PASS)) {
            (None, None) => None,
            (Some(Value::S(t)), Some(Value::N(p))) => Some(Claim {
                to: FeedCursor::decode(t)?,
                pass: *p,
            }),
            _ => return Err(corrupt("a claim without its cursor or pass")),
        };
        Ok(Checkpoint {
            text,
            cursor,
            pass: s(PASS).and_then(Value::as_n).unwrap_or(0),
            claim,
        })
    }

    /// The condition that the checkpoint is still `cp` and carries no claim (the
    /// `UsageCheckpoint` mutant: always true).
    fn unclaimed(cp: &Checkpoint) -> Condition {
        if off(Mutant::UsageCheckpoint) {
            return Condition::exists("PK").or(Condition::not_exists("PK"));
        }
        let at = match &cp.text {
            None => Condition::not_exists(CURSOR),
            Some(s) => Condition::eq(CURSOR, s.as_str()),
        };
        at.and(Condition::not_exists(PENDING_TO))
    }

    fn checkpoint_write(&self, update: Update, condition: Condition) -> UpdateRequest {
        UpdateRequest {
            key: checkpoint_key(self.ns(), &self.opts.consumer),
            update: update.set("updated_ms", self.limiter.inner().clock().now_ms()),
            condition: Some(condition),
            returns: ReturnValues::None,
        }
    }

    /// Commit `p`, summed from the changes after `cp` up to `to`. `Ok(false)`: another
    /// consumer moved or claimed the checkpoint first (nothing of `p` was written).
    pub(super) async fn commit_pass(
        &self,
        p: &Pending,
        cp: &Checkpoint,
        to: &FeedCursor,
        rep: &mut PassReport,
    ) -> Result<bool> {
        let retention_s = self.opts.retention_days * 86_400;
        let ns = self.ns();
        if p.snaps.len() <= self.chunk() {
            let mut ops: Vec<TransactOp> = p
                .snaps
                .keys()
                .filter_map(|k| p.op(ns, k, retention_s, None))
                .collect();
            let moved = Update::new()
                .set(CURSOR, to.encode().as_str())
                .set(PASS, cp.pass + 1);
            ops.push(TransactOp::Update(
                self.checkpoint_write(moved, Self::unclaimed(cp)),
            ));
            let at = ops.len() - 1;
            return match self.limiter.inner().store().transact_write(ops, None).await {
                Ok(()) => {
                    rep.commits += 1;
                    rep.snapshot_writes += p.snaps.len();
                    Ok(true)
                }
                Err(StoreError::TransactionCanceled { reasons })
                    if matches!(reasons.get(at), Some(CancelReason::ConditionFailed { .. })) =>
                {
                    Ok(false)
                }
                Err(e) => Err(e.into()),
            };
        }
        let claim = Claim {
            to: to.clone(),
            pass: cp.pass + 1,
        };
        let req = self.checkpoint_write(
            Update::new()
                .set(PENDING_TO, to.encode().as_str())
                .set(PENDING_PASS, claim.pass),
            Self::unclaimed(cp),
        );
        match self.limiter.inner().store().update(req).await {
            Ok(_) => {}
            Err(StoreError::ConditionFailed { .. }) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        self.apply(p, cp, &claim, rep).await?;
        Ok(true)
    }

    /// Finish the claim `claim` left on `cp`: re-read its range, sum it, apply it.
    pub(super) async fn finish_claim(
        &self,
        cp: &Checkpoint,
        claim: &Claim,
        rep: &mut PassReport,
    ) -> Result<()> {
        let mut p = Summing::default();
        let mut at = cp.cursor.clone();
        let mut empty = 0;
        while !covers(&at, &claim.to) {
            tokio::task::yield_now().await;
            let batch = self.feed.read_feed(&at, self.opts.batch).await?;
            at = batch.cursor;
            if batch.changes.is_empty() {
                empty += 1;
                if empty >= EMPTY_READS {
                    tracing::warn!(
                        "aggregator: a claimed pass's changes are no longer all in the feed"
                    );
                    break;
                }
                continue;
            }
            empty = 0;
            rep.changes += batch.changes.len();
            for c in &batch.changes {
                if claim.to.is_after(&c.position) {
                    continue;
                }
                if let Some(d) = usage(self.ns(), c, &mut p.layouts) {
                    p.add(&self.opts.windows, &d);
                }
            }
        }
        rep.claims_finished += 1;
        tracing::debug!(pass = claim.pass, "aggregator: finishing a claimed pass");
        self.apply(&p.finish(), cp, claim, rep).await
    }

    /// Apply `p` for `claim` in transactions of at most `commit_items` snapshot updates, each
    /// at most once for the claimed pass; the last one finalizes the checkpoint.
    pub(super) async fn apply(
        &self,
        p: &Pending,
        cp: &Checkpoint,
        claim: &Claim,
        rep: &mut PassReport,
    ) -> Result<()> {
        let ns = self.ns();
        let retention_s = self.opts.retention_days * 86_400;
        let attr = Name::from(std::sync::Arc::<str>::from(pass_attr(&self.opts.consumer)));
        let keys: Vec<_> = p.snaps.keys().collect();
        let mut chunks: Vec<&[&tollgate_core::value::Key]> = keys.chunks(self.chunk()).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            // Other tasks (the server's requests) get their turn between transactions.
            tokio::task::yield_now().await;
            let mut left: Vec<_> = chunk.to_vec();
            let mut retries = 0;
            loop {
                let mut ops: Vec<TransactOp> = left
                    .iter()
                    .filter_map(|k| p.op(ns, k, retention_s, Some((&attr, claim.pass))))
                    .collect();
                if i == last {
                    ops.push(self.finalize(cp, claim));
                } else if ops.is_empty() {
                    break;
                }
                match self.limiter.inner().store().transact_write(ops, None).await {
                    Ok(()) => {
                        rep.snapshot_writes += left.len();
                        if i == last {
                            rep.commits += 1;
                        }
                        break;
                    }
                    Err(StoreError::TransactionCanceled { reasons }) => {
                        if i == last
                            && matches!(
                                reasons.get(left.len()),
                                Some(CancelReason::ConditionFailed { .. })
                            )
                        {
                            // Another consumer finalized the claim: every update landed.
                            return Ok(());
                        }
                        let applied = |j: usize| {
                            matches!(reasons.get(j), Some(CancelReason::ConditionFailed { .. }))
                        };
                        if (0..left.len()).any(applied) {
                            let mut j = 0;
                            left.retain(|_| {
                                j += 1;
                                !applied(j - 1)
                            });
                            continue;
                        }
                        let retryable = reasons.iter().all(|r| {
                            matches!(
                                r,
                                CancelReason::None
                                    | CancelReason::TransactionConflict
                                    | CancelReason::Throttled
                            )
                        });
                        if !retryable || retries >= RETRIES {
                            return Err(StoreError::TransactionCanceled { reasons }.into());
                        }
                        retries += 1;
                    }
                    Err(e) if e.is_retryable() && retries < RETRIES => retries += 1,
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    /// The write that ends `claim`: the cursor moved to its end, its pass counted, the claim
    /// removed — conditioned on the claim still being there (the mutant: always).
    fn finalize(&self, cp: &Checkpoint, claim: &Claim) -> TransactOp {
        let cond = if off(Mutant::UsageCheckpoint) {
            Condition::exists("PK").or(Condition::not_exists("PK"))
        } else {
            let at = match &cp.text {
                None => Condition::not_exists(CURSOR),
                Some(s) => Condition::eq(CURSOR, s.as_str()),
            };
            Condition::eq(PENDING_PASS, claim.pass).and(at)
        };
        let u = Update::new()
            .set(CURSOR, claim.to.encode().as_str())
            .set(PASS, claim.pass)
            .remove(PENDING_TO)
            .remove(PENDING_PASS);
        TransactOp::Update(self.checkpoint_write(u, cond))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_store::FeedPosition;

    fn at(pairs: &[(&str, &str)]) -> FeedCursor {
        let mut c = FeedCursor::start();
        for (s, q) in pairs {
            c.advance(&FeedPosition {
                stream: (*s).into(),
                seq: (*q).into(),
            });
        }
        c
    }

    #[test]
    fn a_cursor_covers_a_claim_once_past_every_stream_of_it() {
        let to = at(&[("", "17")]);
        assert!(!covers(&FeedCursor::start(), &to));
        assert!(!covers(&at(&[("", "9")]), &to));
        assert!(covers(&at(&[("", "17")]), &to));
        assert!(covers(&at(&[("", "100")]), &to));
        let mut two = at(&[("a", "5"), ("b", "7")]);
        assert!(!covers(&at(&[("a", "5")]), &two));
        assert!(covers(&at(&[("a", "6"), ("b", "7")]), &two));
        two.finish("a");
        assert!(!covers(&at(&[("a", "99"), ("b", "7")]), &two));
        let mut done = at(&[("b", "7")]);
        done.finish("a");
        assert!(covers(&done, &two));
        assert!(covers(&FeedCursor::start(), &FeedCursor::start()));
    }
}
