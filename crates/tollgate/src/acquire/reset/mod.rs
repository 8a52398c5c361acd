//! ADR-149 reset and top-up: an operator refills an entity's bucket for a resource, or adds
//! tokens above its grant, on every shard in one transaction with its audit record.
//!
//! Each operation carries an id (`op`, a ULID unless the caller brings one: a retried HTTP
//! request resends its id). The transaction stamps it on every shard it writes; an attempt
//! whose response was lost is retried from a fresh read, and a read that finds the id on a
//! shard knows the operation landed ([`tollgate_core::reset::landed`]) and stops.

use serde::Serialize;
use tollgate_core::grant::GrantShare;
use tollgate_core::reset::{reset, split_top_up, top_up};
use tollgate_core::units::{Millitokens, ShardCount};

use super::*;

mod run;

/// The longest operation id a caller may bring.
pub const MAX_OP_ID_CHARS: usize = 64;
/// How many times an operation re-reads and retries after its transaction was refused.
const ATTEMPTS: u32 = 6;

/// Which bucket operation.
#[derive(Debug, Clone)]
enum BucketOp {
    Reset,
    /// Milli per limit.
    TopUp(Vec<(String, i64)>),
}

/// What [`crate::Admin::reset`] or [`crate::Admin::top_up`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BucketOpOutcome {
    /// The operation's id (stamped `op` on every shard written).
    pub op: String,
    /// Shard items written (0: the entity has no bucket for the resource).
    pub shards: usize,
    /// The operation had already landed (a retry of the same id): nothing written now.
    pub already_applied: bool,
    /// Per limit, the millitokens the balances gained across the shards (a reset: up to
    /// full; a top-up: the amount, or less for a dripping limit with less headroom).
    pub added_milli: BTreeMap<String, i64>,
    /// The audit record written with it (`None` when nothing was written).
    pub audit_id: Option<String>,
}

/// Check a caller's operation id: 1 to 64 characters of `[A-Za-z0-9_.-]`.
pub fn validate_op_id(op: &str) -> Result<()> {
    let ok = !op.is_empty()
        && op.len() <= MAX_OP_ID_CHARS
        && op
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(RuleError::InvalidIdentifier {
            value: op.chars().take(64).collect(),
            reason: "an operation id is 1 to 64 characters of letters, digits, '_', '-', '.'",
        }))
    }
}

/// An operation's writes and its before / after balances.
struct OpPlan {
    writes: Vec<UpdateRequest>,
    before: BTreeMap<String, Vec<i64>>,
    after: BTreeMap<String, Vec<i64>>,
    added: BTreeMap<String, i64>,
}

/// Plan a reset or top-up over every shard read (the shard count is shard 0's): each limit
/// the shard carries is materialised as the slow path would, then reset or topped up
/// ([`tollgate_core::reset`]), and written by the rf-locked normal write with `vu = 0`,
/// pinned on the shard count observed.
fn plan_op(
    inner: &Inner,
    req: &Request,
    kind: &BucketOp,
    images: &[(u32, BucketImage)],
    now: i64,
) -> OpPlan {
    let s = images
        .first()
        .map(|(_, i)| i.shard_count)
        .unwrap_or(1)
        .max(1);
    // ADR-149: a top-up splits by grant; a limit's grant count on a shard is its `gc`
    // (the shard count where absent).
    let portions: BTreeMap<&str, Vec<(u32, i64)>> = match kind {
        BucketOp::Reset => BTreeMap::new(),
        BucketOp::TopUp(amounts) => amounts
            .iter()
            .map(|(n, a)| {
                let grants: Vec<(u32, i64)> = images
                    .iter()
                    .filter_map(|(i, img)| {
                        img.limits.get(n.as_str()).map(|st| {
                            (
                                *i,
                                tollgate_core::grant::infer_gc(GrantShare {
                                    grant_count: st.grant_count,
                                    balance: Millitokens(st.balance - st.topped_up.unwrap_or(0)),
                                    capacity: Millitokens(st.capacity),
                                    shard_count: ShardCount(s),
                                }),
                            )
                        })
                    })
                    .collect();
                (n.as_str(), split_top_up(*a, s, &grants))
            })
            .collect(),
    };
    let mut plan = OpPlan {
        writes: Vec::new(),
        before: BTreeMap::new(),
        after: BTreeMap::new(),
        added: BTreeMap::new(),
    };
    for (shard, img) in images {
        let limits: Vec<Limit> = req
            .limits
            .iter()
            .filter(|l| img.limits.contains_key(l.name()))
            .cloned()
            .collect();
        let evals: Vec<Evaluated> = limits
            .iter()
            .map(|l| {
                let e = evaluate(
                    l,
                    img.limits.get(l.name()),
                    img.refilled_at_ms,
                    s,
                    now,
                    None,
                );
                plan.before
                    .entry(l.name().to_string())
                    .or_default()
                    .push(e.read_balance);
                let (e, added) = match kind {
                    BucketOp::Reset => {
                        let before = e.balance;
                        let r = reset(l, e, s, now);
                        let added = r.balance - before;
                        (r, added)
                    }
                    BucketOp::TopUp(_) => {
                        let portion = portions
                            .get(l.name())
                            .and_then(|p| p.iter().find(|(i, _)| i == shard))
                            .map_or(0, |(_, p)| *p);
                        top_up(l, e, portion)
                    }
                };
                let named = match kind {
                    BucketOp::Reset => true,
                    BucketOp::TopUp(a) => a.iter().any(|(n, _)| n == l.name()),
                };
                if named {
                    *plan.added.entry(l.name().to_string()).or_default() += added;
                }
                plan.after
                    .entry(l.name().to_string())
                    .or_default()
                    .push(e.balance);
                e
            })
            .collect();
        let wcu = evaluate_wcu(img.wcu.as_ref(), img.refilled_at_ms, now);
        let stamp = ItemStamp {
            refilled_at_ms: next_rf(now, Some(img.refilled_at_ms), &evals),
            // ADR-149: vu = 0 sends the next acquire of every shard down the slow path.
            valid_until_ms: Some(0),
            ttl: req.ttl,
            params_hash: &req.params_hash,
            // An operator's write restates every stamp (rule `writes::restates` is for the
            // acquire's pass).
            read: None,
        };
        let (mut update, condition) = normal_write(
            img.refilled_at_ms,
            &stamp,
            &limits,
            &evals,
            &wcu,
            &[],
            Charging::default(),
        );
        if matches!(kind, BucketOp::Reset) {
            // A reset starts the period over: the fan-out's consumption snapshot goes too.
            for l in &limits {
                if img
                    .limits
                    .get(l.name())
                    .is_some_and(|st| st.window_consumed.is_some())
                {
                    update =
                        update.remove(keys::battr(l.name(), tollgate_core::bucket::field::WTC));
                }
            }
        }
        // Conditions pin `rf` (and the balances reset) per shard, and the shard count seen.
        let pin = Condition::eq(attr::SHARD_COUNT, img.shard_count)
            .or(Condition::not_exists(attr::SHARD_COUNT));
        plan.writes.push(UpdateRequest {
            key: inner.bucket_key(req, *shard),
            update: update.set(attr::CASCADE, req.cascade),
            condition: Some(
                condition
                    .and(pin)
                    .and(Condition::not_exists(attr::DISABLED)),
            ),
            returns: ReturnValues::None,
        });
    }
    plan
}

/// Stamp the operation's id on every shard write.
fn stamp_op(ops: Vec<TransactOp>, op: &str) -> Vec<TransactOp> {
    ops.into_iter()
        .map(|o| match o {
            TransactOp::Update(mut u) => {
                u.update = u.update.set(attr::OP, op);
                TransactOp::Update(u)
            }
            o => o,
        })
        .collect()
}
