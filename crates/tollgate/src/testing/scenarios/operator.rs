//! The operator's bucket operations: reset and top-up (ADR-149, spec §5.12 scenarios
//! 96–102), on every backend.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use crate::audit::AuditQuery;
use crate::testing::hook::On;
use crate::testing::intercept::LostResponses;
use crate::testing::*;
use crate::{Action, Error, Limit, Scope};
use tollgate_core::value::Value;

const E: &str = "e";
const R: &str = "llm";

fn daily() -> Limit {
    Limit::quota_calendar("daily", 10, "0 0 * * *", "UTC").unwrap()
}

fn session() -> Limit {
    Limit::quota_after("session", 10, Duration::from_secs(18_000)).unwrap()
}

async fn limits(h: &H, l: &[Limit]) {
    h.lim
        .admin()
        .set_limits(&Scope::Entity(E.into(), Some(R.into())), l)
        .await
        .unwrap();
}

/// A two-shard calendar quota of 10 (shard 1 funded by a move: 5000 each), gc [2, 2], then
/// the balances staged to `tks`.
async fn daily_two(h: &H, tks: [i64; 2]) {
    limits(h, &[daily()]).await;
    h.lim.acquire(E, R, &[("daily", 0)]).await.unwrap();
    assert_eq!(h.lim.admin().bump_shard_count(E, R, 1).await.unwrap(), 2);
    h.rng.pin(1);
    h.lim.acquire(E, R, &[("daily", 0)]).await.unwrap();
    h.rng.pin(0);
    assert_eq!(h.tks(E, R, "daily", 2), vec![5000, 5000]);
    // The donor keeps the count it was granted at (ADR-145); the spec's state has gc 2 on
    // both shards (shard 0 reset since the doubling).
    assert_eq!(
        (h.n(E, R, 0, "b_daily_gc"), h.n(E, R, 1, "b_daily_gc")),
        (Some(1), Some(2))
    );
    h.set_n(E, R, 0, "b_daily_gc", 2);
    for (s, tk) in tks.into_iter().enumerate() {
        h.set_n(E, R, s as u32, "b_daily_tk", tk);
    }
}

async fn records(h: &H, action: Action) -> Vec<crate::AuditRecord> {
    h.lim
        .audit_log(&AuditQuery {
            entity: Some(E.into()),
            ..AuditQuery::default()
        })
        .await
        .unwrap()
        .records
        .into_iter()
        .filter(|r| r.action == action)
        .collect()
}

fn op_of(h: &H, shard: u32) -> Option<String> {
    match h.item(E, R, shard).get("op") {
        Some(Value::S(s)) => Some(s.clone()),
        _ => None,
    }
}

/// Scenario 96: S = 2 calendar quota, shards [1000, 0], gc [2, 2] → reset → both 5000,
/// `vu = 0`, `op` on both, no `tu`; one transaction; one `bucket.reset` record.
pub async fn s96_reset_two_shards(b: &Backend) {
    let h = b.harness(T0).await;
    daily_two(&h, [1000, 0]).await;
    h.set_n(E, R, 1, "b_daily_tu", 2000);
    let before = h.stats();
    let lim = h.lim.acting_as("support").unwrap();
    let out = lim.admin().reset(E, R, None).await.unwrap();
    let after = h.stats();
    assert_eq!(
        after.transactions - before.transactions,
        1,
        "one transaction"
    );
    assert_eq!(after.updates - before.updates, 0, "no single-item writes");
    assert_eq!((out.shards, out.already_applied), (2, false));
    assert_eq!(out.added_milli.get("daily"), Some(&9000));
    assert_eq!(h.tks(E, R, "daily", 2), vec![5000, 5000]);
    for s in [0, 1] {
        assert_eq!(h.n(E, R, s, "vu"), Some(0));
        assert_eq!(h.n(E, R, s, "b_daily_gc"), Some(2));
        assert_eq!(h.n(E, R, s, "b_daily_tu"), None);
        assert_eq!(op_of(&h, s).as_deref(), Some(out.op.as_str()));
    }
    let rs = records(&h, Action::BucketReset).await;
    assert_eq!(rs.len(), 1);
    assert_eq!(rs[0].principal, "support");
    assert_eq!(Some(&rs[0].id), out.audit_id.as_ref());
    assert_eq!(
        rs[0].before["balances_milli"]["daily"],
        serde_json::json!([1000, 0])
    );
    assert_eq!(
        rs[0].after["balances_milli"]["daily"],
        serde_json::json!([5000, 5000])
    );
    // The reset is spendable: 10 tokens across the two shards, and no more.
    h.rng.pin(0);
    h.lim.acquire(E, R, &[("daily", 5)]).await.unwrap();
    h.rng.pin(1);
    h.lim.acquire(E, R, &[("daily", 5)]).await.unwrap();
    assert!(h.lim.acquire(E, R, &[("daily", 1)]).await.is_err());
}

/// Scenario 97: the transaction lands but its response is lost; the retry re-reads, finds
/// `op` on a shard and stops — the top-up is applied once. A second call with the same id
/// writes nothing.
pub async fn s97_retry_lands_once(b: &Backend) {
    let h = b.harness(T0).await;
    daily_two(&h, [5000, 5000]).await;
    let lossy = Arc::new(LostResponses::new(h.raw.clone(), 1));
    let lim = crate::Limiter::builder(lossy)
        .clock(h.clock.clone())
        .rng(h.rng.clone())
        .options(opts())
        .build()
        .unwrap();
    let out = lim
        .admin()
        .top_up(E, R, &[("daily", 10)], Some("op-97"))
        .await
        .unwrap();
    assert_eq!((out.op.as_str(), out.already_applied), ("op-97", false));
    assert_eq!(out.added_milli.get("daily"), Some(&10_000));
    assert_eq!(
        h.tks(E, R, "daily", 2),
        vec![10_000, 10_000],
        "applied once"
    );
    assert_eq!(h.n(E, R, 0, "b_daily_tu"), Some(5000));
    let again = h
        .lim
        .admin()
        .top_up(E, R, &[("daily", 10)], Some("op-97"))
        .await
        .unwrap();
    assert!(again.already_applied);
    assert_eq!(again.audit_id, None);
    assert_eq!(h.tks(E, R, "daily", 2), vec![10_000, 10_000]);
    assert_eq!(records(&h, Action::BucketTopUp).await.len(), 1);
    // Same for a reset.
    h.set_n(E, R, 0, "b_daily_tk", 0);
    let r = h.lim.admin().reset(E, R, Some("op-97r")).await.unwrap();
    assert!(!r.already_applied);
    h.set_n(E, R, 0, "b_daily_tk", 0);
    let r2 = h.lim.admin().reset(E, R, Some("op-97r")).await.unwrap();
    assert!(r2.already_applied);
    assert_eq!(h.tks(E, R, "daily", 2), vec![0, 5000], "not reset twice");
}

/// Scenario 98: top-up 10 on S = 2 with gc [2, 2] → +5000 each, `tu = 5000`, ceiling
/// 5000 + 5000; gc [1, 2] → weights 2 : 1, the odd milli to shard 0.
pub async fn s98_top_up_splits_by_grant(b: &Backend) {
    let h = b.harness(T0).await;
    daily_two(&h, [5000, 5000]).await;
    h.lim
        .admin()
        .top_up(E, R, &[("daily", 10)], None)
        .await
        .unwrap();
    assert_eq!(h.tks(E, R, "daily", 2), vec![10_000, 10_000]);
    assert_eq!(
        (h.n(E, R, 0, "b_daily_tu"), h.n(E, R, 1, "b_daily_tu")),
        (Some(5000), Some(5000))
    );
    // The ceiling is 5000 + 5000: a slow pass keeps the balance (no clamp to the grant).
    h.at(T0 + 1000);
    h.rng.pin(0);
    h.slow().acquire(E, R, &[("daily", 1)]).await.unwrap();
    assert_eq!(h.n(E, R, 0, "b_daily_tk"), Some(9000));
    assert_eq!(h.n(E, R, 0, "b_daily_tu"), Some(5000));
    // Weights 2 : 1: gc 1 on shard 0.
    let h = b.harness(T0).await;
    daily_two(&h, [0, 0]).await;
    h.set_n(E, R, 0, "b_daily_gc", 1);
    let out = h
        .lim
        .admin()
        .top_up(E, R, &[("daily", 1)], None)
        .await
        .unwrap();
    assert_eq!(out.added_milli.get("daily"), Some(&1000));
    assert_eq!(h.tks(E, R, "daily", 2), vec![667, 333]);
    assert_eq!(h.n(E, R, 0, "b_daily_tu"), Some(667));
}

/// Scenario 99: the next reset after a top-up removes `tu` and sets the share — by the
/// operator, and by the calendar edge.
pub async fn s99_reset_after_a_top_up(b: &Backend) {
    let h = b.harness(T0).await;
    daily_two(&h, [2000, 3000]).await;
    h.lim
        .admin()
        .top_up(E, R, &[("daily", 4)], None)
        .await
        .unwrap();
    assert_eq!(h.tks(E, R, "daily", 2), vec![4000, 5000]);
    h.lim.admin().reset(E, R, None).await.unwrap();
    assert_eq!(h.tks(E, R, "daily", 2), vec![5000, 5000]);
    assert_eq!(h.n(E, R, 0, "b_daily_tu"), None);
    // A top-up, then the calendar edge: the share again, `tu` gone.
    h.lim
        .admin()
        .top_up(E, R, &[("daily", 4)], None)
        .await
        .unwrap();
    assert_eq!(h.n(E, R, 0, "b_daily_tu"), Some(2000));
    let midnight = 1_757_030_400_000;
    h.at(midnight + 1000);
    h.rng.pin(0);
    h.slow().acquire(E, R, &[("daily", 1)]).await.unwrap();
    assert_eq!(h.n(E, R, 0, "b_daily_tk"), Some(4000));
    assert_eq!(h.n(E, R, 0, "b_daily_tu"), None);
}

/// Scenario 100 (as fixed here, docs/decisions.md ADR-149): a session reset at R opens a
/// full window at R on every shard (`ws = wa = R`; upstream moves `ws` back to R − 5 h).
/// The next acquire at R + 1 spends from a full share, and the window ends at R + 5 h.
pub async fn s100_session_reset(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[session()]).await;
    h.lim.acquire(E, R, &[("session", 10)]).await.unwrap();
    assert!(h.lim.acquire(E, R, &[("session", 1)]).await.is_err());
    let r_at = T0 + 3_600_000;
    h.at(r_at);
    h.lim.admin().reset(E, R, None).await.unwrap();
    assert_eq!(h.n(E, R, 0, "b_session_ws"), Some(r_at));
    assert_eq!(h.n(E, R, 0, "b_session_wa"), Some(r_at));
    assert_eq!(h.n(E, R, 0, "b_session_tk"), Some(10_000));
    assert_eq!(h.n(E, R, 0, "b_session_wtc"), None);
    h.at(r_at + 1);
    let l = h.lim.acquire(E, R, &[("session", 4)]).await.unwrap();
    let st = l
        .statuses()
        .iter()
        .find(|s| s.limit == "session")
        .unwrap()
        .clone();
    assert_eq!(st.available, 6);
    assert_eq!(st.resets_at_ms, Some(r_at + W));
    assert_eq!(h.n(E, R, 0, "b_session_tk"), Some(6000));
}

/// Scenario 101: a top-up of a session quota with no live window opens one at now (D4); a
/// top-up of an entity without a bucket creates shard 0 with share + N, `tu = N` (D5).
pub async fn s101_top_up_opens_and_creates(b: &Backend) {
    let h = b.harness(T0).await;
    limits(&h, &[session()]).await;
    h.lim.acquire(E, R, &[("session", 10)]).await.unwrap();
    let now = T0 + W + 5;
    h.at(now);
    h.lim
        .admin()
        .top_up(E, R, &[("session", 3)], None)
        .await
        .unwrap();
    assert_eq!(h.n(E, R, 0, "b_session_ws"), Some(now));
    assert_eq!(h.n(E, R, 0, "b_session_tk"), Some(13_000));
    assert_eq!(h.n(E, R, 0, "b_session_tu"), Some(3000));
    // D5: no bucket yet.
    let h = b.harness(T0).await;
    limits(&h, &[session()]).await;
    let out = h
        .lim
        .admin()
        .top_up(E, R, &[("session", 5)], None)
        .await
        .unwrap();
    assert_eq!(out.shards, 1);
    assert_eq!(h.n(E, R, 0, "b_session_tk"), Some(15_000));
    assert_eq!(h.n(E, R, 0, "b_session_tu"), Some(5000));
    assert_eq!(h.n(E, R, 0, "b_session_ws"), Some(T0));
    h.lim.acquire(E, R, &[("session", 15)]).await.unwrap();
    assert!(h.lim.acquire(E, R, &[("session", 1)]).await.is_err());
}

/// Scenario 102: a concurrent writer moves `rf` on one shard between the read and the
/// transaction; the transaction is cancelled and the operation retries from a fresh read.
pub async fn s102_condition_pins(b: &Backend) {
    let h = b.harness(T0).await;
    daily_two(&h, [1000, 0]).await;
    let (lim, hk) = h.hooked(false);
    let k1 = h.key(E, R, 1);
    hk.stage(On::Transact, None, move |m| {
        let mut i = m.raw_get(&k1).unwrap();
        let rf = match i.get("rf") {
            Some(Value::N(n)) => *n,
            _ => 0,
        };
        i.insert("rf".into(), Value::N(rf + 7));
        i.insert("b_daily_tk".into(), Value::N(2500));
        m.raw_put(&k1, i);
    });
    let before = h.stats();
    let out = lim.admin().reset(E, R, None).await.unwrap();
    assert_eq!(
        out.added_milli.get("daily"),
        Some(&6500),
        "planned from the fresh read"
    );
    assert_eq!(h.tks(E, R, "daily", 2), vec![5000, 5000]);
    assert_eq!(records(&h, Action::BucketReset).await.len(), 1);
    // The hooked limiter writes around the counted store: nothing counted on `h.store`.
    assert_eq!(h.stats().transactions, before.transactions);
}

/// A dripping limit resets to its ceiling; a top-up gains only its headroom; bad input is
/// a typed error; a disabled resource is refused; nothing to reset is 0 shards.
pub async fn reset_and_top_up_edges(b: &Backend) {
    let h = b.harness(T0).await;
    let rpm = Limit::per_minute("rpm", 10).unwrap();
    limits(&h, &[rpm, daily()]).await;
    let none = h.lim.admin().reset(E, R, None).await.unwrap();
    assert_eq!((none.shards, none.audit_id), (0, None));
    assert!(records(&h, Action::BucketReset).await.is_empty());
    h.lim
        .acquire(E, R, &[("rpm", 7), ("daily", 7)])
        .await
        .unwrap();
    let out = h
        .lim
        .admin()
        .top_up(E, R, &[("rpm", 5)], None)
        .await
        .unwrap();
    assert_eq!(out.added_milli.get("rpm"), Some(&5000));
    assert_eq!(h.n(E, R, 0, "b_rpm_tk"), Some(8000));
    let out = h
        .lim
        .admin()
        .top_up(E, R, &[("rpm", 5)], None)
        .await
        .unwrap();
    assert_eq!(
        out.added_milli.get("rpm"),
        Some(&2000),
        "bounded by the headroom"
    );
    assert_eq!(h.n(E, R, 0, "b_rpm_tu"), None);
    h.lim.acquire(E, R, &[("rpm", 9)]).await.unwrap();
    h.lim.admin().reset(E, R, None).await.unwrap();
    assert_eq!(h.n(E, R, 0, "b_rpm_tk"), Some(10_000));
    assert_eq!(h.n(E, R, 0, "b_daily_tk"), Some(10_000));
    // Bad input.
    assert!(matches!(
        h.lim.admin().top_up(E, R, &[("nope", 1)], None).await,
        Err(Error::UnknownLimit { .. })
    ));
    assert!(matches!(
        h.lim.admin().top_up(E, R, &[("rpm", -1)], None).await,
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        h.lim.admin().top_up(E, R, &[], None).await,
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        h.lim.admin().reset(E, R, Some("bad id!")).await,
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        h.lim.admin().reset("bad entity!", R, None).await,
        Err(Error::Invalid(_))
    ));
    h.lim.admin().set_disabled(E, R, true).await.unwrap();
    assert!(matches!(
        h.lim.admin().reset(E, R, None).await,
        Err(Error::ResourceDisabled { .. })
    ));
}

// ---------------------------------------------------------------------------------------
// ADR-150: moving an entity to a new parent (spec §5.13, scenarios 103–106).

fn meta(h: &H, id: &str) -> tollgate_core::value::Item {
    let ns = crate::Options::default().namespace;
    h.raw
        .raw_get(&tollgate_core::keys::entity_meta(&ns, id))
        .expect("META")
}

fn s_attr(i: &tollgate_core::value::Item, a: &str) -> Option<String> {
    i.get(a).and_then(Value::as_s).map(str::to_string)
}

/// Parents A and B and a cascading child under A, with `rpm` 10/min on the resource.
async fn family(h: &H) {
    h.lim
        .admin()
        .set_limits(
            &Scope::Resource(R.into()),
            &[Limit::per_minute("rpm", 10).unwrap()],
        )
        .await
        .unwrap();
    for p in ["A", "B"] {
        h.lim
            .admin()
            .create_entity(p, None, None, Default::default())
            .await
            .unwrap();
    }
    let new = crate::NewEntity {
        name: None,
        parent_id: Some("A"),
        cascade: true,
        metadata: Default::default(),
    };
    h.lim
        .admin()
        .create_entity_with("child", new)
        .await
        .unwrap();
}

/// Scenario 103: `set_parent(child, B)` → META `parent_id = B`, the children index moved,
/// `pgen` 1; the child's next acquire charges B, not A. One `entity.move` record.
pub async fn s103_move_to_a_new_parent(b: &Backend) {
    let h = b.harness(T0).await;
    family(&h).await;
    h.lim.acquire("child", R, &[("rpm", 1)]).await.unwrap();
    assert_eq!(h.n("A", R, 0, "b_rpm_tk"), Some(9000));
    let lim = h.lim.acting_as("support").unwrap();
    let m = lim.admin().set_parent("child", Some("B")).await.unwrap();
    assert_eq!(
        (m.old_parent.as_deref(), m.parent_id.as_deref(), m.pgen),
        (Some("A"), Some("B"), 1)
    );
    let i = meta(&h, "child");
    assert_eq!(s_attr(&i, "parent_id").as_deref(), Some("B"));
    assert_eq!(s_attr(&i, "GSI1PK").as_deref(), Some("default/PARENT#B"));
    assert_eq!(i.get("pgen").and_then(Value::as_n), Some(1));
    assert_eq!(h.lim.children("A").await.unwrap(), Vec::<String>::new());
    assert_eq!(
        h.lim.children("B").await.unwrap(),
        vec!["child".to_string()]
    );
    h.lim.acquire("child", R, &[("rpm", 2)]).await.unwrap();
    assert_eq!(
        h.n("A", R, 0, "b_rpm_tk"),
        Some(9000),
        "A no longer charged"
    );
    assert_eq!(h.n("B", R, 0, "b_rpm_tk"), Some(8000));
    assert_eq!(h.n("child", R, 0, "b_rpm_tk"), Some(7000));
    let rs: Vec<_> = h
        .lim
        .audit_log(&AuditQuery {
            entity: Some("child".into()),
            ..AuditQuery::default()
        })
        .await
        .unwrap()
        .records
        .into_iter()
        .filter(|r| r.action == Action::EntityMove)
        .collect();
    assert_eq!(rs.len(), 1);
    assert_eq!(rs[0].principal, "support");
    assert_eq!(rs[0].before["parent_id"], "A");
    assert_eq!(rs[0].after["parent_id"], "B");
    // The same parent again writes nothing.
    let again = h.lim.admin().set_parent("child", Some("B")).await.unwrap();
    assert_eq!((again.pgen, again.audit_id), (1, None));
}

/// Scenario 104: a move is pinned on the generation it read — a concurrent move landing
/// between the read and the write makes it re-read, and it writes over the winner (pgen 6
/// after the winner's 5), its record's "before" naming the winner's parent.
pub async fn s104_moves_pin_the_generation(b: &Backend) {
    let h = b.harness(T0).await;
    family(&h).await;
    let (lim, hk) = h.hooked(false);
    let k = tollgate_core::keys::entity_meta(&crate::Options::default().namespace, "child");
    hk.stage(On::Transact, None, move |m| {
        let mut i = m.raw_get(&k).unwrap();
        i.insert("pgen".into(), Value::N(5));
        i.insert("parent_id".into(), Value::S("A".into()));
        m.raw_put(&k, i);
    });
    let m = lim.admin().set_parent("child", None).await.unwrap();
    assert_eq!(m.pgen, 6);
    let i = meta(&h, "child");
    assert_eq!(i.get("parent_id"), Some(&Value::Null));
    assert_eq!(i.get("pgen").and_then(Value::as_n), Some(6));
}

/// Scenario 105: moving A under its grandchild is refused (a cycle), as is moving an entity
/// under itself or under an entity that does not exist; `set_parent(e, None)` makes a root,
/// the children index keys removed.
pub async fn s105_cycles_refused_and_roots(b: &Backend) {
    let h = b.harness(T0).await;
    family(&h).await;
    h.lim
        .admin()
        .create_entity("grandchild", None, Some("child"), Default::default())
        .await
        .unwrap();
    for (e, p) in [("A", "grandchild"), ("A", "child"), ("child", "child")] {
        assert!(
            matches!(
                h.lim.admin().set_parent(e, Some(p)).await,
                Err(Error::ParentCycle { .. })
            ),
            "{e} under {p}"
        );
    }
    assert!(matches!(
        h.lim.admin().set_parent("child", Some("nobody")).await,
        Err(Error::EntityNotFound(_))
    ));
    assert!(matches!(
        h.lim.admin().set_parent("nobody", Some("A")).await,
        Err(Error::EntityNotFound(_))
    ));
    assert!(matches!(
        h.lim.admin().set_parent("bad id!", None).await,
        Err(Error::Invalid(_))
    ));
    assert_eq!(meta(&h, "A").get("pgen"), None, "refusals write nothing");
    let m = h.lim.admin().set_parent("child", None).await.unwrap();
    assert_eq!(m.parent_id, None);
    let i = meta(&h, "child");
    assert_eq!(i.get("parent_id"), Some(&Value::Null));
    assert_eq!(i.get("GSI1PK"), None);
    assert_eq!(i.get("GSI1SK"), None);
    assert_eq!(h.lim.children("A").await.unwrap(), Vec::<String>::new());
    // A root with cascade on charges no parent.
    h.lim.acquire("child", R, &[("rpm", 1)]).await.unwrap();
    assert!(
        h.raw.raw_get(&h.key("A", R, 0)).is_none(),
        "A never charged"
    );
    // And A may now move under the former grandchild's line.
    h.lim
        .admin()
        .set_parent("A", Some("grandchild"))
        .await
        .unwrap();
}

/// Scenario 106: a lease debited under A, the child moved to B, then `adjust(+2)` and the
/// commit: the debit lands on A's bucket (the parent it debited), B's is untouched.
pub async fn s106_leases_settle_with_the_parent_they_debited(b: &Backend) {
    let h = b.harness(T0).await;
    family(&h).await;
    let mut lease = h.lim.acquire("child", R, &[("rpm", 1)]).await.unwrap();
    assert_eq!(h.n("A", R, 0, "b_rpm_tk"), Some(9000));
    h.lim.admin().set_parent("child", Some("B")).await.unwrap();
    lease.adjust("rpm", 2).unwrap();
    lease.commit().await.unwrap();
    assert_eq!(h.n("A", R, 0, "b_rpm_tk"), Some(7000));
    assert_eq!(h.n("A", R, 0, "b_rpm_tc"), Some(3000));
    assert_eq!(h.n("child", R, 0, "b_rpm_tk"), Some(7000));
    assert!(
        h.raw.raw_get(&h.key("B", R, 0)).is_none(),
        "B never charged"
    );
    // A rollback of a lease from before the move refunds A too.
    h.lim.admin().set_parent("child", Some("A")).await.unwrap();
    let mut lease = h.lim.acquire("child", R, &[("rpm", 1)]).await.unwrap();
    h.lim.admin().set_parent("child", Some("B")).await.unwrap();
    lease.rollback().await.unwrap();
    assert_eq!(h.n("A", R, 0, "b_rpm_tk"), Some(7000));
    assert!(h.raw.raw_get(&h.key("B", R, 0)).is_none());
}
