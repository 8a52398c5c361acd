//! The change-feed part of the conformance suite: every backend with a [`ChangeFeed`] must
//! pass these, each on a fresh store ([`feed_checks`], [`run_feed_all`]).
//!
//! A feed may lag its writes a little (DynamoDB Streams): each check polls until what it
//! waits for is there, for up to [`FEED_WAIT`]. Order is promised per item only, so every
//! check ends with a marker write *on each item it looks at* (a put holding `m`): once an
//! item's marker has been read, every earlier change of that item has been too, and "nothing
//! else appeared" is checked against that, not a guess.

use std::collections::BTreeSet;
use std::future::Future;
use std::time::{Duration, Instant};

use tollgate_core::expr::{Condition, ReturnValues, Update};
use tollgate_core::value::{Item, Key, Value};

use super::{attrs, ensure, ensure_eq, stored, CheckFuture, CheckResult};
use crate::feed::{Change, ChangeFeed, FeedCursor};
use crate::{DeleteRequest, PutRequest, StoreError, TransactOp, UpdateRequest};

/// How long a check waits for a change to show on the feed.
pub const FEED_WAIT: Duration = Duration::from_secs(20);

/// One named feed check.
#[derive(Clone, Copy)]
pub struct FeedCheck {
    /// The check's name.
    pub name: &'static str,
    /// Run it against a fresh, empty store.
    pub run: for<'a> fn(&'a dyn ChangeFeed) -> CheckFuture<'a>,
}

impl std::fmt::Debug for FeedCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeedCheck")
            .field("name", &self.name)
            .finish()
    }
}

fn e2s(e: StoreError) -> String {
    format!("unexpected store error: {e:?}")
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Read the feed from `cursor` until the marker of every key in `keys` has been read,
/// keeping the changes of `keys` before their markers (markers left out). Returns them and
/// the cursor after.
async fn read_until(
    s: &dyn ChangeFeed,
    mut cursor: FeedCursor,
    keys: &[&Key],
    page: usize,
) -> Result<(Vec<Change>, FeedCursor), String> {
    let mut waiting: BTreeSet<&Key> = keys.iter().copied().collect();
    let mut got = Vec::new();
    let until = Instant::now() + FEED_WAIT;
    while !waiting.is_empty() {
        let b = s.read_feed(&cursor, page).await.map_err(e2s)?;
        let empty = b.changes.is_empty();
        for c in b.changes {
            ensure(
                cursor.is_after(&c.position),
                format!(
                    "change {:?} at or before the cursor it was read after",
                    c.position
                ),
            )?;
            cursor.advance(&c.position);
            if !waiting.contains(&c.key) {
                continue;
            }
            if is_marker(&c) {
                waiting.remove(&c.key);
            } else {
                got.push(c);
            }
        }
        // The batch cursor may also hold finished streams.
        cursor = merge(cursor, b.cursor);
        if waiting.is_empty() {
            break;
        }
        if Instant::now() > until {
            return Err(format!(
                "the marker writes of {waiting:?} did not appear on the feed within {} s ({} changes read)",
                FEED_WAIT.as_secs(),
                got.len()
            ));
        }
        if empty {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok((got, cursor))
}

/// The later of two cursors, stream by stream.
fn merge(mut a: FeedCursor, b: FeedCursor) -> FeedCursor {
    for (stream, seq) in b.streams {
        if b_is_later(&a, &stream, &seq) {
            a.streams.insert(stream, seq);
        }
    }
    a
}

fn b_is_later(a: &FeedCursor, stream: &str, seq: &str) -> bool {
    if seq == crate::feed::STREAM_DONE {
        return true;
    }
    a.is_after(&crate::feed::FeedPosition {
        stream: stream.to_string(),
        seq: seq.to_string(),
    })
}

const MARK: &str = "feed_marker";

fn is_marker(c: &Change) -> bool {
    c.new.as_ref().is_some_and(|n| n.contains_key(MARK))
}

/// Write a marker on each of `keys` (a put: the item is replaced).
async fn markers(s: &dyn ChangeFeed, keys: &[&Key]) -> CheckResult {
    for k in keys {
        s.put(PutRequest {
            key: (*k).clone(),
            item: attrs(&[(MARK, Value::N(now_ms()))]),
            condition: None,
        })
        .await
        .map_err(e2s)?;
    }
    Ok(())
}

fn shape(c: &Change) -> (Key, Option<Item>, Option<Item>) {
    (
        c.key.clone(),
        c.old.as_deref().cloned(),
        c.new.as_deref().cloned(),
    )
}

/// A put, an update and a delete of one item appear once each, in order, with their old and
/// new images and a write time near the writer's clock.
pub async fn feed_records_each_write(s: &dyn ChangeFeed) -> CheckResult {
    let k = Key::new("feed#each", "#ITEM");
    let before = now_ms();
    s.put(PutRequest {
        key: k.clone(),
        item: attrs(&[("n", Value::N(1)), ("s", Value::S("a".into()))]),
        condition: Some(Condition::not_exists("PK")),
    })
    .await
    .map_err(e2s)?;
    s.update(UpdateRequest {
        key: k.clone(),
        update: Update::new().add("n", 4).remove("s"),
        condition: Some(Condition::exists("PK")),
        returns: ReturnValues::None,
    })
    .await
    .map_err(e2s)?;
    s.delete(DeleteRequest {
        key: k.clone(),
        condition: None,
    })
    .await
    .map_err(e2s)?;
    markers(s, &[&k]).await?;
    let (got, _) = read_until(s, FeedCursor::start(), &[&k], 100).await?;
    let v1 = stored(&k, &[("n", Value::N(1)), ("s", Value::S("a".into()))]);
    let v2 = stored(&k, &[("n", Value::N(5))]);
    let want = vec![
        (k.clone(), None, Some(v1.clone())),
        (k.clone(), Some(v1), Some(v2.clone())),
        (k.clone(), Some(v2), None),
    ];
    let shapes: Vec<_> = got.iter().filter(|c| c.key == k).map(shape).collect();
    ensure_eq(shapes, want, "put, update, delete on the feed")?;
    let after = now_ms();
    for c in &got {
        // DynamoDB dates to the second (rounded down) and its clock is not ours: a minute.
        ensure(
            c.at_ms >= before - 60_000 && c.at_ms <= after + 60_000,
            format!("write time {} outside [{before}, {after}] ± 60 s", c.at_ms),
        )?;
    }
    Ok(())
}

/// Failed conditions, cancelled transactions, deletes of absent items and updates that change
/// nothing never appear.
pub async fn feed_skips_what_was_not_applied(s: &dyn ChangeFeed) -> CheckResult {
    let k = Key::new("feed#skip", "#ITEM");
    let other = Key::new("feed#skip", "#OTHER");
    s.put(PutRequest {
        key: k.clone(),
        item: attrs(&[("n", Value::N(1))]),
        condition: None,
    })
    .await
    .map_err(e2s)?;
    let r = s
        .put(PutRequest {
            key: k.clone(),
            item: attrs(&[("n", Value::N(2))]),
            condition: Some(Condition::not_exists("PK")),
        })
        .await;
    ensure(
        matches!(r, Err(StoreError::ConditionFailed { .. })),
        format!("conditional put on an existing item: {r:?}"),
    )?;
    let r = s
        .update(UpdateRequest {
            key: k.clone(),
            update: Update::new().add("n", 1),
            condition: Some(Condition::not_exists("PK")),
            returns: ReturnValues::None,
        })
        .await;
    ensure(
        matches!(r, Err(StoreError::ConditionFailed { .. })),
        format!("conditional update: {r:?}"),
    )?;
    // Applied, but it changes nothing: no record (as DynamoDB Streams writes none).
    s.update(UpdateRequest {
        key: k.clone(),
        update: Update::new().set("n", Value::N(1)).remove("gone"),
        condition: None,
        returns: ReturnValues::None,
    })
    .await
    .map_err(e2s)?;
    let r = s
        .transact_write(
            vec![
                TransactOp::Put(PutRequest {
                    key: other.clone(),
                    item: attrs(&[("n", Value::N(9))]),
                    condition: None,
                }),
                TransactOp::Check {
                    key: k.clone(),
                    condition: Condition::not_exists("PK"),
                },
            ],
            None,
        )
        .await;
    ensure(
        matches!(r, Err(StoreError::TransactionCanceled { .. })),
        format!("cancelled transaction: {r:?}"),
    )?;
    s.delete(DeleteRequest {
        key: Key::new("feed#skip", "#ABSENT"),
        condition: None,
    })
    .await
    .map_err(e2s)?;
    let absent = Key::new("feed#skip", "#ABSENT");
    markers(s, &[&k, &other, &absent]).await?;
    let (got, _) = read_until(s, FeedCursor::start(), &[&k, &other, &absent], 100).await?;
    let shapes: Vec<_> = got.iter().map(shape).collect();
    ensure_eq(
        shapes,
        vec![(k.clone(), None, Some(stored(&k, &[("n", Value::N(1))])))],
        "changes besides the one applied put",
    )
}

/// Each operation of a transaction appears once (a condition check does not); a resent
/// transaction (same token) adds nothing.
pub async fn feed_records_transaction_ops(s: &dyn ChangeFeed) -> CheckResult {
    let a = Key::new("feed#tx", "#A");
    let b = Key::new("feed#tx", "#B");
    let c = Key::new("feed#tx", "#C");
    let d = Key::new("feed#tx", "#D");
    for k in [&b, &c, &d] {
        s.put(PutRequest {
            key: k.clone(),
            item: attrs(&[("n", Value::N(1))]),
            condition: None,
        })
        .await
        .map_err(e2s)?;
    }
    let ops = vec![
        TransactOp::Put(PutRequest {
            key: a.clone(),
            item: attrs(&[("n", Value::N(7))]),
            condition: Some(Condition::not_exists("PK")),
        }),
        TransactOp::Update(UpdateRequest {
            key: b.clone(),
            update: Update::new().add("n", 2),
            condition: None,
            returns: ReturnValues::None,
        }),
        TransactOp::Delete(DeleteRequest {
            key: c.clone(),
            condition: Some(Condition::exists("PK")),
        }),
        TransactOp::Check {
            key: d.clone(),
            condition: Condition::exists("PK"),
        },
    ];
    // A fresh token: DynamoDB (Local too) remembers tokens across tables for minutes.
    let token = format!("feed-tx-{}", now_ms());
    s.transact_write(ops.clone(), Some(token.clone()))
        .await
        .map_err(e2s)?;
    s.transact_write(ops, Some(token)).await.map_err(e2s)?;
    markers(s, &[&a, &b, &c, &d]).await?;
    let (got, _) = read_until(s, FeedCursor::start(), &[&a, &b, &c, &d], 100).await?;
    let mut shapes: Vec<_> = got.iter().map(shape).collect();
    // Stable: each item's changes stay in their order.
    shapes.sort_by(|x, y| x.0.cmp(&y.0));
    let one = |k: &Key| Some(stored(k, &[("n", Value::N(1))]));
    let want = vec![
        (a.clone(), None, Some(stored(&a, &[("n", Value::N(7))]))),
        (b.clone(), None, one(&b)),
        (b.clone(), one(&b), Some(stored(&b, &[("n", Value::N(3))]))),
        (c.clone(), None, one(&c)),
        (c.clone(), one(&c), None),
        (d.clone(), None, one(&d)),
    ];
    ensure_eq(shapes, want, "the transaction's operations on the feed")
}

/// Read one change at a time from the returned cursors: every change exactly once, in
/// order per item (each old image is the previous new image); a read from an earlier cursor
/// returns the same changes again (the feed is durable until trimmed).
pub async fn feed_cursor_resumes_in_order(s: &dyn ChangeFeed) -> CheckResult {
    let x = Key::new("feed#order", "#X");
    let y = Key::new("feed#order", "#Y");
    for i in 0..6 {
        let k = if i % 2 == 0 { &x } else { &y };
        s.update(UpdateRequest {
            key: k.clone(),
            update: Update::new().add("n", 1),
            condition: None,
            returns: ReturnValues::None,
        })
        .await
        .map_err(e2s)?;
    }
    markers(s, &[&x, &y]).await?;
    let (all, _) = read_until(s, FeedCursor::start(), &[&x, &y], 1).await?;
    let n = |i: &Option<std::sync::Arc<Item>>| {
        i.as_deref().and_then(|i| i.get("n")).and_then(Value::as_n)
    };
    for k in [&x, &y] {
        let seq: Vec<(Option<i64>, Option<i64>)> = all
            .iter()
            .filter(|c| &c.key == k)
            .map(|c| (n(&c.old), n(&c.new)))
            .collect();
        ensure_eq(
            seq,
            vec![(None, Some(1)), (Some(1), Some(2)), (Some(2), Some(3))],
            &format!("changes of {k} read one at a time"),
        )?;
    }
    // Again from the start, in big pages: the same changes.
    let (again, _) = read_until(s, FeedCursor::start(), &[&x, &y], 100).await?;
    let per_key = |v: &[Change]| {
        let mut v: Vec<_> = v.iter().map(shape).collect();
        v.sort_by(|p, q| p.0.cmp(&q.0));
        v
    };
    ensure_eq(
        per_key(&again),
        per_key(&all),
        "a second read from the start",
    )
}

macro_rules! feed_checks {
    ($($name:ident),* $(,)?) => {
        /// Every feed check, by name.
        pub fn feed_checks() -> Vec<FeedCheck> {
            vec![$(
                FeedCheck {
                    name: stringify!($name),
                    run: {
                        fn run(s: &dyn ChangeFeed) -> CheckFuture<'_> {
                            Box::pin($name(s))
                        }
                        run
                    },
                }
            ),*]
        }
    };
}

feed_checks!(
    feed_records_each_write,
    feed_skips_what_was_not_applied,
    feed_records_transaction_ops,
    feed_cursor_resumes_in_order,
);

/// Every feed check, each on a fresh store from an async factory.
pub async fn run_feed_all<F, Fut>(mut make: F) -> Vec<(&'static str, CheckResult)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Box<dyn ChangeFeed>>,
{
    let mut out = Vec::new();
    for c in feed_checks() {
        let store = make().await;
        out.push((c.name, (c.run)(store.as_ref()).await));
    }
    out
}
