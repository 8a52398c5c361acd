//! W9 (ADR-139/140, ADR-145): the sibling read of a shard create is strongly consistent.
//!
//! An eventually consistent read may lag several writes on a hot item. A sibling seen before
//! its roll looks like a shard whose grant is not current, so the slot it covers would look
//! uncovered and get a fresh share: allowance minted. MemoryStore only: DynamoDB Local never
//! serves a stale read, so the lagging replica is staged here.

use std::sync::Arc;
use std::time::Duration;

use tollgate::testing::{opts, H, T0, W};
use tollgate::{Limit, Scope};
use tollgate_store::MemoryStore;

const E: &str = "e";
const R: &str = "llm";
const T1: i64 = T0 + W + 3_600_000;

fn tk(h: &H, shard: u32) -> i64 {
    h.n(E, R, shard, "b_session_tk").expect("shard exists")
}

/// Re-put an item as it is now, after `earlier`, so a non-consistent read serves `earlier`.
fn lag(mem: &MemoryStore, h: &H, shard: u32, earlier: Option<tollgate_core::value::Item>) {
    let k = h.key(E, R, shard);
    let now = mem.raw_get(&k).expect("shard exists");
    match earlier {
        Some(i) => mem.raw_put(&k, i),
        None => mem.raw_put(&k, now.clone()),
    }
    mem.raw_put(&k, now);
}

#[tokio::test]
async fn w9_stale_sibling_view_never_mints() {
    let mem = Arc::new(MemoryStore::new());
    let h = H::new(mem.clone(), T0, opts());
    let session = Limit::quota_after("session", 10, Duration::from_secs(18_000)).expect("limit");
    h.lim
        .admin()
        .set_limits(&Scope::Entity(E.into(), Some(R.into())), &[session])
        .await
        .expect("limits");
    // Window T0: shard 0 first, then shard 1 joins by a move at S = 2 (scenario 27).
    h.lim.acquire(E, R, &[("session", 1)]).await.expect("T0");
    assert_eq!(
        h.lim.admin().bump_shard_count(E, R, 1).await.expect("bump"),
        2
    );
    h.at(T0 + 60_000);
    h.rng.pin(1);
    h.lim.acquire(E, R, &[("session", 1)]).await.expect("join");
    assert_eq!((tk(&h, 0), tk(&h, 1)), (4000, 4000));
    let shard1_in_t0 = h.item(E, R, 1);
    // Window T1, both shards at S = 2: shard 1 opens and fans out, shard 0 rolls.
    h.at(T1);
    h.slow()
        .admin()
        .bump_shard_count(E, R, 1)
        .await
        .expect("learn S");
    h.slow()
        .acquire(E, R, &[("session", 1)])
        .await
        .expect("open T1");
    h.at(T1 + 1);
    h.rng.pin(0);
    h.slow()
        .acquire(E, R, &[("session", 1)])
        .await
        .expect("roll");
    assert_eq!((tk(&h, 0), tk(&h, 1)), (4000, 4000));
    assert_eq!(
        h.n(E, R, 1, "b_session_gc"),
        Some(2),
        "shard 1 covers slots 1 and 3"
    );
    // Doubling to 4; slot 3 is still covered by shard 1's current grant.
    assert_eq!(
        h.slow()
            .admin()
            .bump_shard_count(E, R, 2)
            .await
            .expect("bump"),
        4
    );
    // A lagging replica: shard 1 as it was in window T0 (ended, not current); shard 0 fresh.
    lag(&mem, &h, 1, Some(shard1_in_t0));
    lag(&mem, &h, 0, None);
    mem.set_stale_reads(true);
    h.at(T1 + 1000); // the configs are still cached: only the sibling read is eventual
    h.rng.pin(3);
    let created = h.slow().acquire(E, R, &[("session", 1)]).await;
    mem.set_stale_reads(false);
    created.expect("slot 3 created");
    // The consistent read sees shard 1's current grant and moves a quarter share from it.
    assert_eq!(h.n(E, R, 3, "b_session_ws"), Some(T1));
    assert_eq!(h.tks(E, R, "session", 4), vec![4000, 1500, i64::MIN, 1500]);
    let admitted_in_t1 = 3;
    assert_eq!(
        admitted_in_t1 + h.spendable(E, R, "session", 4),
        10,
        "admitted + spendable in window T1 is one allowance (a stale read: 12.5)"
    );
}
