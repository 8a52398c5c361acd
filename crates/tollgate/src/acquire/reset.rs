//! ADR-149 reset and top-up: an operator refills an entity's bucket for a resource, or adds
//! tokens above its grant, on every shard in one transaction with its audit record.
//!
//! Each operation carries an id (`op`, a ULID unless the caller brings one: a retried HTTP
//! request resends its id). The transaction stamps it on every shard it writes; an attempt
//! whose response was lost is retried from a fresh read, and a read that finds the id on a
//! shard knows the operation landed ([`tollgate_core::reset::landed`]) and stops.

use serde::Serialize;
use serde_json::json;
use tollgate_core::reset::{landed, reset, split_top_up, top_up};

use super::*;
use crate::audit::{Action, Target};

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

/// What [`Limiter::reset`] or [`Limiter::top_up`] did.
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

impl Limiter {
    /// ADR-149: reset every limit of `entity`'s bucket for `resource` to full on every
    /// shard — a dripping limit to its ceiling, a quota to its share with a fresh grant, a
    /// `reset_after` quota in a new window opened now — in one transaction with a
    /// `bucket.reset` audit record. `op` identifies the operation: a retry with the same id
    /// lands once. An entity with no bucket for the resource has nothing to reset (0 shards,
    /// no record).
    pub async fn reset(
        &self,
        entity: &str,
        resource: &str,
        op: Option<&str>,
    ) -> Result<BucketOpOutcome> {
        self.bucket_op(entity, resource, BucketOp::Reset, op).await
    }

    /// ADR-149: add `amounts` (tokens per limit) above the current grant of `entity`'s
    /// bucket for `resource`, split across the shards by grant, in one transaction with a
    /// `bucket.top_up` audit record. A quota's ceiling rises with it until its next reset
    /// (`tu`); a dripping limit gains at most its headroom. An entity without a bucket gets
    /// one first (a zero acquire: shard 0 at its share), then the top-up. `op` as for
    /// [`Limiter::reset`].
    pub async fn top_up(
        &self,
        entity: &str,
        resource: &str,
        amounts: &[(&str, i64)],
        op: Option<&str>,
    ) -> Result<BucketOpOutcome> {
        let amounts = validate_amounts(amounts)?;
        if amounts.is_empty() || amounts.iter().all(|(_, a)| *a == 0) {
            return Err(Error::Invalid(RuleError::InvalidAmount {
                limit: "*".into(),
                reason: "a top-up names at least one limit with a positive amount",
            }));
        }
        self.bucket_op(entity, resource, BucketOp::TopUp(amounts), op)
            .await
    }

    async fn bucket_op(
        &self,
        entity: &str,
        resource: &str,
        kind: BucketOp,
        op: Option<&str>,
    ) -> Result<BucketOpOutcome> {
        validate_entity_id(entity)?;
        validate_resource(resource)?;
        if let Some(op) = op {
            validate_op_id(op)?;
        }
        let inner = &self.inner;
        let op: String = match op {
            Some(o) => o.to_string(),
            None => inner.audit_ids.next(inner.clock.now_ms()),
        };
        // Administrative writes read the config fresh (ADR-147: and clear the caches).
        inner.config.clear();
        inner.rejections.clear();
        inner.images.clear();
        let now = inner.clock.now_ms();
        let res = inner
            .config
            .resolve(inner.store.as_ref(), inner.ns(), entity, resource, now)
            .await?;
        if let Some(m) = res.unreachable {
            return Err(Error::Unavailable(StoreError::Unavailable(m)));
        }
        let amounts = match &kind {
            BucketOp::Reset => Vec::new(),
            BucketOp::TopUp(a) => a.clone(),
        };
        let req = Request {
            cascade: res.cascade,
            ..inner.request_hashed(
                entity,
                resource,
                amounts,
                res.limits.clone(),
                Some(res.ph.clone()),
                res.source,
                now,
            )?
        };
        let (action, target) = (
            match kind {
                BucketOp::Reset => Action::BucketReset,
                BucketOp::TopUp(_) => Action::BucketTopUp,
            },
            Target::Entity {
                entity: entity.into(),
                resource: Some(resource.into()),
            },
        );
        let mut created = false;
        // The last attempt whose outcome was lost (its added amounts, shards, record id):
        // when a re-read finds the id, that attempt is the one that landed.
        let mut lost: Option<(BTreeMap<String, i64>, usize, String)> = None;
        for attempt in 0..ATTEMPTS {
            let images = self.read_shards(&req).await?;
            if images.is_empty() {
                match kind {
                    BucketOp::Reset => {
                        return Ok(BucketOpOutcome {
                            op,
                            shards: 0,
                            already_applied: false,
                            added_milli: BTreeMap::new(),
                            audit_id: None,
                        })
                    }
                    // ADR-149 D5: an entity without a bucket gets shard 0 at its share
                    // first (the anchor any zero acquire writes), then the top-up.
                    BucketOp::TopUp(_) if !created => {
                        created = true;
                        let anchor = Request {
                            amounts: Vec::new(),
                            ..req.clone()
                        };
                        inner.acquire(&anchor).await?;
                        continue;
                    }
                    BucketOp::TopUp(_) => {
                        return Err(Error::Contended {
                            entity: entity.into(),
                            resource: resource.into(),
                        })
                    }
                }
            }
            if landed(images.iter().map(|(_, i)| i), &op) {
                inner.rejections.clear();
                inner.images.clear();
                if let Some((added, shards, id)) = lost {
                    tracing::info!(%op, entity, resource, "bucket operation landed (response lost)");
                    return Ok(BucketOpOutcome {
                        op,
                        shards,
                        already_applied: false,
                        added_milli: added,
                        audit_id: Some(id),
                    });
                }
                tracing::info!(%op, entity, resource, "bucket operation already landed");
                return Ok(BucketOpOutcome {
                    op,
                    shards: images.len(),
                    already_applied: true,
                    added_milli: BTreeMap::new(),
                    audit_id: None,
                });
            }
            if images.iter().any(|(_, i)| i.disabled) {
                return Err(Error::ResourceDisabled {
                    entity: entity.into(),
                    resource: resource.into(),
                });
            }
            let now = inner.clock.now_ms();
            let plan = plan_op(inner, &req, &kind, &images, now);
            let ops: Vec<TransactOp> = plan
                .writes
                .iter()
                .map(|w| TransactOp::Update(w.clone()))
                .collect();
            let record = self.audit_record(
                action,
                &target,
                json!({ "balances_milli": plan.before }),
                json!({
                    "op": op,
                    "balances_milli": plan.after,
                    "added_milli": plan.added,
                }),
            );
            let ops = stamp_op(ops, &op);
            let record_id = record.id.clone();
            match self.audited(ops, record).await {
                Ok(r) => {
                    inner.rejections.clear();
                    inner.images.clear();
                    return Ok(BucketOpOutcome {
                        op,
                        shards: plan.writes.len(),
                        already_applied: false,
                        added_milli: plan.added,
                        audit_id: Some(r.id),
                    });
                }
                // Lost on the way back: re-read; the next pass sees the operation's id
                // if it landed.
                Err(e @ StoreError::Ambiguous(_)) => {
                    tracing::debug!(%op, attempt, error = %e, "bucket operation outcome unknown");
                    lost = Some((plan.added, plan.writes.len(), record_id));
                }
                // Refused (an `rf`, balance or count pin moved): re-read and re-plan.
                Err(e @ StoreError::TransactionCanceled { .. })
                | Err(e @ StoreError::TransactionConflict)
                | Err(e @ StoreError::Throttled(_)) => {
                    tracing::debug!(%op, attempt, error = %e, "bucket operation retried");
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Contended {
            entity: entity.into(),
            resource: resource.into(),
        })
    }

    /// Every shard of (entity, resource) as it is, strongly consistent: shard 0 (the source
    /// of the shard count), then the others. Shards not created yet are left out.
    async fn read_shards(&self, req: &Request) -> Result<Vec<(u32, BucketImage)>> {
        let inner = &self.inner;
        let k0 = inner.bucket_key(req, 0);
        let Some(i0) = inner.store.get(&k0, true).await? else {
            return Ok(Vec::new());
        };
        let img0 = BucketImage::decode(&i0)?;
        let s = img0.shard_count.clamp(1, MAX_SHARD_COUNT);
        let mut out = vec![(0, img0)];
        if s > 1 {
            let keys: Vec<Key> = (1..s as u32).map(|i| inner.bucket_key(req, i)).collect();
            let items = inner.store.batch_get(&keys, true).await?;
            for (i, item) in (1..s as u32).zip(items) {
                if let Some(item) = item {
                    out.push((i, BucketImage::decode(&item)?));
                }
            }
        }
        inner.shards.raise(&req.entity, &req.resource, s);
        Ok(out)
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
                        img.limits.get(n).map(|st| {
                            (
                                *i,
                                tollgate_core::grant::infer_gc(
                                    st.gc,
                                    st.tk - st.tu.unwrap_or(0),
                                    st.cp,
                                    s,
                                ),
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
                let e = evaluate(l, img.limits.get(l.name()), img.rf, s, now, None);
                plan.before
                    .entry(l.name().to_string())
                    .or_default()
                    .push(e.read_tk);
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
        let wcu = evaluate_wcu(img.wcu.as_ref(), img.rf, now);
        let stamp = ItemStamp {
            rf: next_rf(now, Some(img.rf), &evals),
            // ADR-149: vu = 0 sends the next acquire of every shard down the slow path.
            vu: Some(0),
            ttl: req.ttl,
            ph: &req.ph,
        };
        let (mut update, condition) = normal_write(
            img.rf,
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
                if img.limits.get(l.name()).is_some_and(|st| st.wtc.is_some()) {
                    update = update.remove(keys::battr(l.name(), "wtc"));
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
