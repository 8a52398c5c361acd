//! Scenarios that had no test yet. Q11: transaction conflicts on a quota move.
#![allow(missing_docs)]

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use tollgate_core::value::{Item, Key};
use tollgate_store::{
    CancelReason, DeleteRequest, PutRequest, Query, Store, StoreError, TransactOp, UpdateRequest,
};

use crate::testing::*;
use crate::{Error, Limit, Limiter, OnUnavailable, Options, Scope};

const E: &str = "e";
const R: &str = "llm";

fn rpd() -> Limit {
    Limit::quota_calendar("rpd", 1000, "0 0 * * *", "UTC").unwrap()
}

async fn limits(h: &H, l: &[Limit]) {
    h.lim
        .set_limits(&Scope::Entity(E.into(), Some(R.into())), l, None)
        .await
        .unwrap();
}

/// Make a client learn the entity's shard count (a CAS that loses adopts the stored count).
async fn warm(l: &Limiter) {
    l.bump_shard_count(E, R, 1).await.unwrap();
}

/// A store that answers a transaction carrying a quota move (an update beside the slot's
/// own write) with `TransactionConflict` on the moved item, `left` times; everything else
/// passes through.
struct Conflicts {
    inner: Arc<dyn TestStore>,
    left: AtomicI64,
    seen: AtomicI64,
}

#[async_trait]
impl Store for Conflicts {
    async fn get(&self, k: &Key, c: bool) -> Result<Option<Item>, StoreError> {
        self.inner.get(k, c).await
    }
    async fn batch_get(&self, k: &[Key], c: bool) -> Result<Vec<Option<Item>>, StoreError> {
        self.inner.batch_get(k, c).await
    }
    async fn put(&self, r: PutRequest) -> Result<(), StoreError> {
        self.inner.put(r).await
    }
    async fn update(&self, r: UpdateRequest) -> Result<Option<Item>, StoreError> {
        self.inner.update(r).await
    }
    async fn delete(&self, r: DeleteRequest) -> Result<Option<Item>, StoreError> {
        self.inner.delete(r).await
    }
    async fn transact_write(
        &self,
        o: Vec<TransactOp>,
        t: Option<String>,
    ) -> Result<(), StoreError> {
        let is_move = |op: &TransactOp| matches!(op, TransactOp::Update(_));
        if o.iter().skip(1).any(is_move) && self.left.load(Ordering::SeqCst) > 0 {
            self.left.fetch_sub(1, Ordering::SeqCst);
            self.seen.fetch_add(1, Ordering::SeqCst);
            let reasons = o
                .iter()
                .enumerate()
                .map(|(i, op)| {
                    if i > 0 && is_move(op) {
                        CancelReason::TransactionConflict
                    } else {
                        CancelReason::None
                    }
                })
                .collect();
            return Err(StoreError::TransactionCanceled { reasons });
        }
        self.inner.transact_write(o, t).await
    }
    async fn query(&self, q: Query) -> Result<Vec<Item>, StoreError> {
        self.inner.query(q).await
    }
    fn backend(&self) -> &'static str {
        "conflicts"
    }
}

/// A slow-path client over `h`'s store whose move transactions conflict `n` times.
async fn conflicting(h: &H, n: i64, policy: OnUnavailable) -> (Limiter, Arc<Conflicts>) {
    let c = Arc::new(Conflicts {
        inner: h.raw.clone(),
        left: AtomicI64::new(n),
        seen: AtomicI64::new(0),
    });
    let lim = Limiter::builder(c.clone())
        .clock(h.clock.clone())
        .rng(h.rng.clone())
        .options(Options {
            speculative: false,
            on_unavailable: policy,
            ..opts()
        })
        .build()
        .unwrap();
    warm(&lim).await;
    (lim, c)
}

/// Q11: transaction conflicts on the create-with-move. One conflict → retried as-is, lands
/// [500, 499]. Persistent conflicts → 1 try + 3 retries with moves, then once more without
/// moves (the slot would get no grant) → the acquire of 1 is refused with
/// RateLimitExceeded — not unavailable, under both `block` and `allow` — and nothing is
/// written; a following acquire(0) creates shard 1 empty with gc = 2: [1000, 0].
pub async fn q11_transaction_conflicts(b: &Backend) {
    let setup = |h: H| async move {
        limits(&h, &[rpd()]).await;
        h.lim.acquire(E, R, &[("rpd", 0)]).await.unwrap();
        h.lim.bump_shard_count(E, R, 1).await.unwrap();
        h.rng.pin(1);
        h
    };
    let h = setup(b.harness(T0).await).await;
    let (lim, c) = conflicting(&h, 1, OnUnavailable::Block).await;
    lim.acquire(E, R, &[("rpd", 1)]).await.unwrap();
    assert_eq!(c.seen.load(Ordering::SeqCst), 1);
    assert_eq!(h.tks(E, R, "rpd", 2), vec![500_000, 499_000]);

    for policy in [OnUnavailable::Block, OnUnavailable::Allow] {
        let h = setup(b.harness(T0).await).await;
        let (lim, c) = conflicting(&h, i64::MAX, policy).await;
        let r = lim.acquire(E, R, &[("rpd", 1)]).await;
        assert!(
            matches!(r, Err(Error::RateLimitExceeded(_))),
            "{policy:?}: {r:?}"
        );
        assert_eq!(c.seen.load(Ordering::SeqCst), 4, "1 try + 3 retries");
        assert!(h.raw.raw_get(&h.key(E, R, 1)).is_none(), "nothing written");
        assert_eq!(h.n(E, R, 0, "b_rpd_tk"), Some(1_000_000));
        lim.acquire(E, R, &[("rpd", 0)]).await.unwrap();
        assert_eq!(h.tks(E, R, "rpd", 2), vec![1_000_000, 0]);
        assert_eq!(h.n(E, R, 1, "b_rpd_gc"), Some(2));
        assert_eq!(
            h.n(E, R, 0, "b_rpd_gc"),
            Some(1),
            "shard 0 still covers slot 1"
        );
    }
}
