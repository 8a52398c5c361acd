//! Committing a pass: the slot's own write with the moves that fund it and the shard-count
//! pin, as one write or one transaction, and what a cancelled transaction means.

use super::*;

impl Inner {
    /// Commit the slot's own write (`own`: its update or create) with the moves that fund
    /// it and — when the pass granted, reset or rolled a quota (`count_pin = Some(S)`) — a
    /// pin on shard 0's count: rule "a grant is sized at the live shard count" (ADR-145 R5,
    /// Q14/Q15). A doubling that lands between the read and the write fails the pin, and
    /// the pass is re-planned at the new count. One write when nothing else is needed, one
    /// transaction otherwise.
    pub(crate) async fn commit_slot(
        &self,
        req: &Request,
        shard: u32,
        own: TransactOp,
        moves: &[shards::Move],
        count_pin: Option<CountPin>,
    ) -> Pass<Landed> {
        let count = count_pin.map(CountPin::condition);
        let with = |op: TransactOp, c: &Condition| -> TransactOp {
            match op {
                TransactOp::Update(mut u) => {
                    u.condition = Some(match u.condition.take() {
                        Some(x) => x.and(c.clone()),
                        None => c.clone(),
                    });
                    TransactOp::Update(u)
                }
                TransactOp::Put(mut p) => {
                    p.condition = Some(match p.condition.take() {
                        Some(x) => x.and(c.clone()),
                        None => c.clone(),
                    });
                    TransactOp::Put(p)
                }
                other => other,
            }
        };
        let mut own = own;
        let mut rest = shards::move_ops(self, req, moves);
        let mut check = None;
        if let Some(c) = &count {
            let k0 = self.bucket_key(req, 0);
            if shard == 0 {
                own = with(own, c);
            } else if let Some(i) = rest.iter().position(|op| *op.key() == k0) {
                let op = rest.remove(i);
                rest.insert(i, with(op, c));
            } else {
                check = Some(TransactOp::Check {
                    key: k0,
                    condition: c.clone(),
                });
            }
        }
        if rest.is_empty() && check.is_none() {
            let r = match own {
                TransactOp::Update(u) => self.store().update_shared(u).await,
                TransactOp::Put(p) => self.store().put(p).await.map(|()| None),
                other => self
                    .store()
                    .transact_write(vec![other], None)
                    .await
                    .map(|()| None),
            };
            return match r {
                Ok(n) => Ok(Landed::Wrote(n)),
                Err(StoreError::ConditionFailed { old }) => Ok(Landed::LostLock(old)),
                Err(e) => Err(e.into()),
            };
        }
        let mut ops = vec![own];
        ops.extend(rest);
        let checked = check.is_some();
        ops.extend(check);
        match self.transact(ops).await {
            Err(Flow::MoveLost) if checked && moves.is_empty() => Err(Flow::Reread),
            r => r,
        }
    }

    /// Shard 0's stored count (strongly consistent); `None` if it has no item.
    pub(crate) async fn shard0_count(&self, req: &Request) -> Result<Option<i64>> {
        let k = self.bucket_key(req, 0);
        Ok(match self.store().get(&k, true).await? {
            Some(i) => Some(BucketImage::decode(&i)?.shard_count),
            None => None,
        })
    }

    /// Commit a transaction whose first operation is the slot's own write.
    /// [`Landed::LostLock`] when that write's condition failed (lost rf lock or create
    /// race); `Flow::MoveLost` when a donor's condition failed.
    pub(super) async fn transact(&self, ops: Vec<TransactOp>) -> Pass<Landed> {
        match self.store().transact_write(ops, None).await {
            Ok(()) => Ok(Landed::Wrote(None)),
            Err(StoreError::TransactionCanceled { reasons }) => {
                let failed = |r: &CancelReason| matches!(r, CancelReason::ConditionFailed { .. });
                if reasons.first().is_some_and(failed) {
                    let old = match reasons.into_iter().next() {
                        Some(CancelReason::ConditionFailed { old }) => old.map(Box::new),
                        _ => None,
                    };
                    Ok(Landed::LostLock(old))
                } else if reasons.iter().skip(1).any(failed) {
                    Err(Flow::MoveLost)
                } else if reasons
                    .iter()
                    .any(|r| matches!(r, CancelReason::TransactionConflict))
                {
                    Err(Flow::Fail(Error::Unavailable(
                        StoreError::TransactionConflict,
                    )))
                } else if reasons.iter().any(|r| matches!(r, CancelReason::Throttled)) {
                    Err(Flow::Fail(Error::Unavailable(StoreError::Throttled(
                        "transaction".into(),
                    ))))
                } else {
                    Err(Flow::Fail(Error::Misconfigured(StoreError::Validation(
                        format!("transaction cancelled: {reasons:?}"),
                    ))))
                }
            }
            Err(e) => Err(e.into()),
        }
    }
}
