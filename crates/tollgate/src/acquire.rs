//! Acquire: the speculative fast path, the rf-locked slow path, create, the
//! consumption-only retry, shard probing and doubling.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::bucket::{attr, BucketImage, MAX_SHARD_COUNT};
use tollgate_core::expr::{Condition, ReturnValues, Update};
use tollgate_core::ids::{validate_entity_id, validate_limit_name, validate_resource};
use tollgate_core::keys;
use tollgate_core::limit::{Limit, MAX_TOKENS, MILLI};
use tollgate_core::materialize::{evaluate, evaluate_wcu, valid_until, Evaluated};
use tollgate_core::status::{limit_status, ShardView};
use tollgate_core::value::Key;
use tollgate_core::writes::{
    classify_fast_failure, create_item, fast_write, image_trusted, next_rf, normal_write,
    params_hash, refund_pin, retry_write, ttl_for, would_refill_satisfy, BucketIdentity, Charging,
    FastFailure, ItemStamp, TtlWrite,
};
use tollgate_core::{LimitStatus, RuleError};
use tollgate_store::{CancelReason, PutRequest, StoreError, TransactOp, UpdateRequest};

use crate::config::{OnUnavailable, Source};
use crate::error::{Error, Exceeded, Flow, Pass, Result};
use crate::lease::{Lease, Part};
use crate::limiter::{Inner, Limiter, Stats};
use crate::shards;

/// Per-call options of an acquire.
#[derive(Debug, Clone, Default)]
pub struct AcquireOptions {
    /// Use these limits instead of the stored ones.
    pub limits: Option<Vec<Limit>>,
    /// Override the fail-open / fail-closed policy for this call.
    pub on_unavailable: Option<OnUnavailable>,
}

/// A validated request.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub entity: String,
    pub resource: String,
    /// Named amounts in millitokens.
    pub amounts: Vec<(String, i64)>,
    pub limits: Vec<Limit>,
    pub ph: String,
    pub ttl: TtlWrite,
    /// The effective cascade policy, stamped on the items the slow path writes (ADR-146);
    /// `request` leaves it off, the caller sets it from the resolved config.
    pub cascade: bool,
}

/// Validate names and amounts (tokens → millitokens): negative, huge or duplicate amounts
/// and malformed names are refused before anything is read.
pub(crate) fn validate_amounts(amounts: &[(&str, i64)]) -> Result<Vec<(String, i64)>> {
    let mut out: Vec<(String, i64)> = Vec::with_capacity(amounts.len());
    for (n, a) in amounts {
        validate_limit_name(n)?;
        if *a < 0 {
            return Err(Error::Invalid(RuleError::InvalidAmount {
                limit: n.to_string(),
                reason: "amounts must not be negative (use a lease adjustment to refund)",
            }));
        }
        if *a > MAX_TOKENS {
            return Err(Error::Invalid(RuleError::InvalidAmount {
                limit: n.to_string(),
                reason: "amount too large",
            }));
        }
        if out.iter().any(|(x, _)| x == n) {
            return Err(Error::Invalid(RuleError::InvalidAmount {
                limit: n.to_string(),
                reason: "named twice",
            }));
        }
        out.push((n.to_string(), a * MILLI));
    }
    Ok(out)
}

/// What a quota grant pins on shard 0: the count it was sized at, or its absence.
#[derive(Debug, Clone, Copy)]
pub(crate) enum CountPin {
    Count(i64),
    Absent,
}

/// The slot's own conditional write failed (rf lock lost, create race lost, or a pinned
/// balance moved); the item as it was when it failed, if known.
pub(crate) struct LostLock(pub(crate) Option<Box<tollgate_core::value::Item>>);

enum Fast {
    Granted(Box<Lease>),
    /// Take the slow path on this shard, planning from this image when one is known (a
    /// failed write's old item: no read needed).
    Slow(u32, Option<Box<BucketImage>>),
    Rejected(Box<Exceeded>),
}

/// Whether a speculative write on `img` would fail for a reason only the slow path handles
/// (its trust horizon passed, its parameters or limits changed, its TTL passed): then the
/// slow path plans from `img` at once instead of spending a write to learn it.
fn needs_materialising(img: &BucketImage, req: &Request, now: i64) -> bool {
    !image_trusted(img, &req.limits, &req.amounts, now)
        || img.ph.as_deref() != Some(req.ph.as_str())
        || img.ttl.is_some_and(|t| t <= now / 1000)
        || req.amounts.iter().any(|(n, _)| !img.limits.contains_key(n))
}

impl Limiter {
    /// Acquire `amounts` (tokens per limit) of `resource` for `entity` with the stored limits.
    pub async fn acquire(
        &self,
        entity: &str,
        resource: &str,
        amounts: &[(&str, i64)],
    ) -> Result<Lease> {
        self.acquire_with(entity, resource, amounts, AcquireOptions::default())
            .await
    }

    /// Acquire with per-call options.
    pub async fn acquire_with(
        &self,
        entity: &str,
        resource: &str,
        amounts: &[(&str, i64)],
        opts: AcquireOptions,
    ) -> Result<Lease> {
        validate_entity_id(entity)?;
        validate_resource(resource)?;
        let amounts = validate_amounts(amounts)?;
        let inner = &self.inner;
        let mut policy = opts.on_unavailable;
        let r = async {
            let now = inner.clock.now_ms();
            let res = inner
                .config
                .resolve(inner.store.as_ref(), inner.ns(), entity, resource, now)
                .await?;
            let (limits, source) = match opts.limits {
                Some(l) => (l, Source::Override),
                None => {
                    if policy.is_none() {
                        policy = res.on_unavailable;
                    }
                    (res.limits, res.source)
                }
            };
            if let Some(m) = res.unreachable {
                // The config read just waited out the store: answer by the policy now.
                return Err(Error::Unavailable(StoreError::Unavailable(m)));
            }
            let req = Request {
                cascade: res.cascade,
                ..inner.request(entity, resource, amounts, limits, source, now)?
            };
            // ADR-146: the parent is charged with its own resolved limits (resolved before
            // any write, so a parent without limits fails without debiting the child).
            let parent = match (&res.parent_id, res.cascade) {
                (Some(p), true) => {
                    let pres = inner
                        .config
                        .resolve(inner.store.as_ref(), inner.ns(), p, resource, now)
                        .await?;
                    Some(crate::cascade::parent_request(
                        inner,
                        &req,
                        p,
                        pres.limits,
                        pres.source,
                        pres.cascade,
                        now,
                    )?)
                }
                _ => None,
            };
            inner.acquire_cascade(&req, parent.as_ref()).await
        }
        .await;
        // Rule "only an outage fails open": a misconfiguration, corrupt data or contention
        // never admits, whatever the policy.
        match r {
            Err(e)
                if e.is_outage()
                    && policy
                        .or_else(|| inner.config.last_policy(inner.clock.now_ms()))
                        .unwrap_or(inner.opts.on_unavailable)
                        == OnUnavailable::Allow =>
            {
                tracing::warn!(error = %e, entity, resource, "store unavailable: admitting (on_unavailable = allow)");
                Stats::bump(&inner.stats.degraded);
                Ok(Lease::degraded(entity, resource))
            }
            r => r,
        }
    }
}

impl Limiter {
    /// Disable (or re-enable) an entity's use of a resource: every shard of its bucket is
    /// stamped `disabled`, which the fast path's condition and the slow path both refuse
    /// with [`Error::ResourceDisabled`]. Shards created later are disabled too (they read
    /// the stamp off shard 0). Returns how many shard items were written.
    pub async fn set_disabled(
        &self,
        entity: &str,
        resource: &str,
        disabled: bool,
    ) -> Result<usize> {
        validate_entity_id(entity)?;
        validate_resource(resource)?;
        let inner = &self.inner;
        let k0 = keys::bucket(inner.ns(), entity, resource, 0);
        let s = match inner.store.get(&k0, true).await? {
            Some(i) => BucketImage::decode(&i)?.shard_count,
            None => 0,
        };
        let mut written = 0;
        for shard in 0..s as u32 {
            let update = if disabled {
                Update::new().set(attr::DISABLED, true)
            } else {
                Update::new().remove(attr::DISABLED)
            };
            let r = inner
                .store
                .update(UpdateRequest {
                    key: keys::bucket(inner.ns(), entity, resource, shard),
                    update,
                    condition: Some(Condition::exists("PK")),
                    returns: ReturnValues::None,
                })
                .await;
            match r {
                Ok(_) => written += 1,
                Err(StoreError::ConditionFailed { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        inner.rejections.clear();
        inner.images.clear();
        Ok(written)
    }

    /// Double the shard count of (entity, resource) from `old` by compare-and-set on shard
    /// 0 (refused at 32; a loser adopts the winner's count). Returns the count now in force.
    /// Acquires do this by themselves when a shard runs out of write capacity; operators and
    /// tests may do it ahead of a known hot spot.
    pub async fn bump_shard_count(&self, entity: &str, resource: &str, old: i64) -> Result<i64> {
        validate_entity_id(entity)?;
        validate_resource(resource)?;
        let req = Request {
            entity: entity.into(),
            resource: resource.into(),
            amounts: Vec::new(),
            limits: Vec::new(),
            ph: String::new(),
            ttl: TtlWrite::Remove,
            cascade: false,
        };
        self.inner.bump(&req, old).await
    }
}

/// The item a successful write returned (`ALL_NEW`), decoded.
fn returned_image(new: Option<&tollgate_core::value::Item>, key: &Key) -> Result<BucketImage> {
    new.map(BucketImage::decode)
        .transpose()?
        .ok_or_else(|| Error::Corrupt(format!("{key}: no item returned")))
}

pub(crate) fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(25u64 << attempt.min(3))
}

impl Inner {
    pub(crate) fn request(
        &self,
        entity: &str,
        resource: &str,
        amounts: Vec<(String, i64)>,
        limits: Vec<Limit>,
        source: Source,
        now: i64,
    ) -> Result<Request> {
        if limits.is_empty() {
            return Err(Error::NoLimits {
                entity: entity.into(),
                resource: resource.into(),
            });
        }
        for (n, _) in &amounts {
            if !limits.iter().any(|l| l.name() == n) {
                return Err(Error::UnknownLimit {
                    limit: n.clone(),
                    resource: resource.into(),
                    known: limits
                        .iter()
                        .map(|l| l.name())
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
        }
        let ttl = match source {
            Source::Entity => TtlWrite::Remove,
            _ => match ttl_for(&limits, now, self.opts.ttl_multiplier) {
                Some(t) => TtlWrite::Set(t),
                None => TtlWrite::Remove,
            },
        };
        Ok(Request {
            entity: entity.into(),
            resource: resource.into(),
            ph: params_hash(&limits),
            amounts,
            limits,
            ttl,
            cascade: false,
        })
    }

    pub(crate) fn bucket_key(&self, req: &Request, shard: u32) -> Key {
        keys::bucket(self.ns(), &req.entity, &req.resource, shard)
    }

    pub(crate) async fn acquire(self: &Arc<Self>, req: &Request) -> Result<Lease> {
        let now = self.clock.now_ms();
        let cached = self.shards.get(&req.entity, &req.resource);
        let r = match cached {
            Some(s) if self.opts.speculative => match self.local_decision(req, s, now) {
                Err(x) => {
                    Stats::bump(&self.stats.local_rejections);
                    Err(Error::RateLimitExceeded(x))
                }
                Ok(shard) => {
                    // Rule "plan from what the store last said": a shard this process last
                    // saw past its trust horizon is materialised from that image, in one
                    // write, rather than refused by a speculative write first.
                    let known = self
                        .images
                        .get(&req.entity, &req.resource, shard)
                        .filter(|img| needs_materialising(img, req, now) && !img.disabled);
                    match known {
                        Some(img) => self.slow(req, shard, Some(img)).await,
                        None => match self.fast(req, shard, s, now).await? {
                            Fast::Granted(l) => Ok(*l),
                            Fast::Rejected(x) => Err(Error::RateLimitExceeded(x)),
                            Fast::Slow(shard, img) => self.slow(req, shard, img.map(|b| *b)).await,
                        },
                    }
                }
            },
            Some(s) => {
                let shard = self.rng.draw(0, s as u32);
                self.slow(req, shard, None).await
            }
            None => self.slow(req, 0, None).await,
        };
        if let Err(Error::RateLimitExceeded(_)) = &r {
            Stats::bump(&self.stats.rejections);
        }
        r
    }

    /// ADR-147: refuse with no store request when every shard's trusted view is short;
    /// otherwise draw a shard not known to be short.
    fn local_decision(
        &self,
        req: &Request,
        s: i64,
        now: i64,
    ) -> std::result::Result<u32, Box<Exceeded>> {
        let open = self.open_shards(req, s, now)?;
        Ok(open[self.rng.draw(0, open.len() as u32) as usize])
    }

    /// ADR-147: the shards not known (from this process's trusted rejection views) to be
    /// short for `req`; the refusal when every one of the `s` shards is.
    pub(crate) fn open_shards(
        &self,
        req: &Request,
        s: i64,
        now: i64,
    ) -> std::result::Result<Vec<u32>, Box<Exceeded>> {
        let mut open = Vec::new();
        let mut views = Vec::new();
        for shard in 0..s as u32 {
            match self.rejections.view(&req.entity, &req.resource, shard, now) {
                Some(img) if !would_refill_satisfy(&img, &req.limits, &req.amounts, now) => {
                    views.push(img)
                }
                _ => open.push(shard),
            }
        }
        if open.is_empty() {
            if let Some(x) = self.exceeded(req, &views.iter().map(Some).collect::<Vec<_>>(), s, now)
            {
                return Err(x);
            }
            // Every shard is short on its own but together they cover it: draw any (the
            // store decides, across shards if need be).
            return Ok((0..s as u32).collect());
        }
        Ok(open)
    }

    /// The speculative write on one shard, then probes and doubling as §4.3 says.
    async fn fast(self: &Arc<Self>, req: &Request, shard: u32, s: i64, now: i64) -> Result<Fast> {
        let mut tried = vec![shard];
        let mut images: Vec<BucketImage> = Vec::new();
        let mut cur = shard;
        loop {
            // Each speculative write carries a fresh clock reading: its trust check is only
            // as good as the `now` it compares.
            let now = self.clock.now_ms();
            match self.fast_once(req, cur, now).await? {
                Ok(lease) => return Ok(Fast::Granted(Box::new(lease))),
                Err(None) => {
                    // Throttled: the partition is hot. Spread out if we can.
                    let new_s = self.bump(req, s).await?;
                    if new_s > s {
                        return Ok(Fast::Slow(self.rng.draw(s as u32, new_s as u32), None));
                    }
                    return Ok(Fast::Slow(cur, None));
                }
                Err(Some((failure, img))) => match failure {
                    FastFailure::Disabled => {
                        return Err(Error::ResourceDisabled {
                            entity: req.entity.clone(),
                            resource: req.resource.clone(),
                        })
                    }
                    FastFailure::Missing => return Ok(Fast::Slow(cur, None)),
                    FastFailure::Expired
                    | FastFailure::Boundary
                    | FastFailure::ParamsChanged
                    | FastFailure::LimitMissing => return Ok(Fast::Slow(cur, img.map(Box::new))),
                    FastFailure::WcuExhausted | FastFailure::Both => {
                        let img = img.ok_or_else(|| Error::Corrupt("no image".into()))?;
                        if would_refill_satisfy(&img, &req.limits, &req.amounts, now) {
                            // Rule #480: only a write-capacity shortfall doubles, never an
                            // app-limit rejection.
                            let wcu = evaluate_wcu(img.wcu.as_ref(), img.rf, now);
                            if !shards::should_double(wcu.balance, img.shard_count) {
                                return Ok(Fast::Slow(cur, Some(Box::new(img))));
                            }
                            let new_s = self.bump(req, img.shard_count.max(s)).await?;
                            if new_s > s {
                                return Ok(Fast::Slow(self.rng.draw(s as u32, new_s as u32), None));
                            }
                            return Ok(Fast::Slow(cur, Some(Box::new(img))));
                        }
                        images.push(img);
                    }
                    FastFailure::AppLimit => {
                        let img = img.ok_or_else(|| Error::Corrupt("no image".into()))?;
                        if would_refill_satisfy(&img, &req.limits, &req.amounts, now) {
                            return Ok(Fast::Slow(cur, Some(Box::new(img))));
                        }
                        self.rejections
                            .record(&req.entity, &req.resource, cur, img.clone(), now);
                        images.push(img);
                    }
                },
            }
            // Probe up to 2 untried shards before refusing (ADR-134).
            let s_now = self
                .shards
                .get(&req.entity, &req.resource)
                .unwrap_or(s)
                .max(s);
            if s_now <= 1 || tried.len() >= 3 || tried.len() as i64 >= s_now {
                break;
            }
            let untried: Vec<u32> = (0..s_now as u32).filter(|x| !tried.contains(x)).collect();
            cur = untried[self.rng.draw(0, untried.len() as u32) as usize];
            tried.push(cur);
        }
        let s_now = self
            .shards
            .get(&req.entity, &req.resource)
            .unwrap_or(s)
            .max(s);
        if s_now > 1 {
            // Rule "a debit belongs to the entity": the shards probed cannot pay, the
            // entity may (read them all; admit across several, or refuse honestly).
            return match self.entity_acquire(req, s_now, shard, now).await {
                Ok(lease) => Ok(Fast::Granted(Box::new(lease))),
                Err(Error::RateLimitExceeded(x)) => Ok(Fast::Rejected(x)),
                Err(e) => Err(e),
            };
        }
        match self.exceeded(
            req,
            &images.iter().map(Some).collect::<Vec<_>>(),
            s_now,
            now,
        ) {
            Some(x) => Ok(Fast::Rejected(x)),
            // The image shows enough (a refill the stored balance did not carry yet): the
            // slow path materialises it.
            None => Ok(Fast::Slow(cur, images.pop().map(Box::new))),
        }
    }

    /// One speculative write. `Ok(Ok(lease))` admitted; `Ok(Err(Some(..)))` refused with the
    /// classified old image; `Ok(Err(None))` throttled.
    #[allow(clippy::type_complexity)]
    async fn fast_once(
        self: &Arc<Self>,
        req: &Request,
        shard: u32,
        now: i64,
    ) -> Result<std::result::Result<Lease, Option<(FastFailure, Option<BucketImage>)>>> {
        let key = self.bucket_key(req, shard);
        let (update, condition) = fast_write(&req.amounts, &req.limits, &req.ph, now);
        let r = self
            .store
            .update(UpdateRequest {
                key: key.clone(),
                update,
                condition: Some(condition),
                returns: ReturnValues::AllNew,
            })
            .await;
        match r {
            Ok(new) => {
                let img = returned_image(new.as_ref(), &key)?;
                self.shards
                    .raise(&req.entity, &req.resource, img.shard_count);
                self.images
                    .put(&req.entity, &req.resource, shard, img.clone());
                Stats::bump(&self.stats.fast_admits);
                let evals = self.evaluate_all(req, &img, now);
                Ok(Ok(self.lease(
                    req,
                    shard,
                    key,
                    &evals,
                    Some(&img),
                    Some(img.clone()),
                    img.shard_count,
                    now,
                )))
            }
            Err(StoreError::ConditionFailed { old }) => {
                let img = old.as_deref().map(BucketImage::decode).transpose()?;
                match &img {
                    Some(i) => {
                        self.shards.raise(&req.entity, &req.resource, i.shard_count);
                        self.images
                            .put(&req.entity, &req.resource, shard, i.clone());
                    }
                    None => self.images.forget(&req.entity, &req.resource, shard),
                }
                let f =
                    classify_fast_failure(img.as_ref(), &req.amounts, &req.limits, &req.ph, now);
                Ok(Err(Some((f, img))))
            }
            Err(StoreError::Throttled(_)) => Ok(Err(None)),
            Err(e) => Err(e.into()),
        }
    }

    pub(crate) fn evaluate_all(
        &self,
        req: &Request,
        img: &BucketImage,
        now: i64,
    ) -> Vec<Evaluated> {
        req.limits
            .iter()
            .map(|l| {
                evaluate(
                    l,
                    img.limits.get(l.name()),
                    img.rf,
                    img.shard_count,
                    now,
                    None,
                )
            })
            .collect()
    }

    /// A granted lease. `landed` is the item a write that applied no transition returned
    /// (fast path, consumption-only retry): `evals` were materialised from it and already
    /// reflect the debit, and the debit belongs to its stored period and window, whatever a
    /// materialisation at `now` projects. `None`: `evals` are what the write stored, before
    /// the debit (slow path, create). Statuses always report the balance after the debit.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lease(
        self: &Arc<Self>,
        req: &Request,
        shard: u32,
        key: Key,
        evals: &[Evaluated],
        landed: Option<&BucketImage>,
        after: Option<BucketImage>,
        s: i64,
        now: i64,
    ) -> Lease {
        let debited = landed.is_some();
        let mut pins = BTreeMap::new();
        let mut statuses = Vec::new();
        for (l, e) in req.limits.iter().zip(evals) {
            let (ws, pe, rf) = match landed {
                Some(img) => {
                    let st = img.limits.get(l.name());
                    (st.and_then(|st| st.ws), st.and_then(|st| st.pe), img.rf)
                }
                None => (e.ws, e.pe, now),
            };
            if let Some(p) = refund_pin(l, ws, pe, rf) {
                pins.insert(l.name().to_string(), p);
            }
            if let Some((_, a)) = req.amounts.iter().find(|(n, _)| n == l.name()) {
                // The write landed: a window this pass opened is in force now.
                let after = Evaluated {
                    balance: if debited { e.balance } else { e.balance - a },
                    opened: false,
                    ..e.clone()
                };
                let view = ShardView {
                    eval: &after,
                    shard_count: s,
                    carry: e.carry.unwrap_or(0),
                };
                statuses.push(limit_status(l, &[view], *a, false, now));
            }
        }
        let part = Part {
            shard,
            key,
            held: req.amounts.iter().cloned().collect(),
            pins,
            image: after,
        };
        Lease::granted(self.clone(), req, vec![part], statuses)
    }

    /// The refusal the shard images at hand support: `None` when, by them, the entity
    /// covers every named limit (a refill or refund the failed write did not see) — the
    /// caller then materialises instead of refusing (rule "a refusal never says
    /// available").
    pub(crate) fn exceeded(
        &self,
        req: &Request,
        images: &[Option<&BucketImage>],
        s: i64,
        now: i64,
    ) -> Option<Box<Exceeded>> {
        let statuses = self.statuses(req, images, s, now, Some(&req.amounts));
        statuses
            .iter()
            .any(|s| s.exceeded)
            .then(|| Box::new(Exceeded::new(&req.entity, &req.resource, statuses)))
    }

    /// Entity-wide statuses of the limits `req` names, summed over the shard images given
    /// (index = shard). A missing shard counts for nothing while any shard exists (a new
    /// shard is funded from its siblings: a move for quotas, a split for dripping limits),
    /// and as a fresh one when none does. A limit is exceeded when `judged` names it and the
    /// entity's balance (every shard's, debt counted) does not cover its amount.
    pub(crate) fn statuses(
        &self,
        req: &Request,
        images: &[Option<&BucketImage>],
        s: i64,
        now: i64,
        judged: Option<&[(String, i64)]>,
    ) -> Vec<LimitStatus> {
        let none_exist = images.iter().all(|i| i.is_none());
        let mut out = Vec::new();
        for (l, a) in req.limits.iter().filter_map(|l| {
            req.amounts
                .iter()
                .find(|(n, _)| n == l.name())
                .map(|(_, a)| (l, *a))
        }) {
            let evals: Vec<Evaluated> = images
                .iter()
                .filter_map(|img| match img {
                    Some(img) => Some(evaluate(
                        l,
                        img.limits.get(l.name()),
                        img.rf,
                        s.max(img.shard_count),
                        now,
                        None,
                    )),
                    None if none_exist => Some(evaluate(l, None, now, s, now, None)),
                    None => None,
                })
                .collect();
            let views: Vec<ShardView<'_>> = evals
                .iter()
                .map(|e| ShardView {
                    eval: e,
                    shard_count: s,
                    carry: e.carry.unwrap_or(0),
                })
                .collect();
            let total: i64 = evals.iter().map(|e| e.balance).sum();
            let exceeded = judged
                .and_then(|j| j.iter().find(|(n, _)| n == l.name()))
                .is_some_and(|(_, want)| total < *want);
            out.push(limit_status(l, &views, a, exceeded, now));
        }
        out
    }

    /// The slow path on one shard: a consistent read (unless the image is known: the last
    /// one this process saw, or a failed write's old item), then create, the rf-locked
    /// normal write, or — when the lock was lost to a writer that left the item trusted —
    /// the consumption-only retry.
    ///
    /// Rule "contention is not an outage" (Q11): a transaction that keeps conflicting
    /// (1 try + 3 retries) is retried once more with quota moves disabled (the slot then
    /// gets no grant from a busy donor), and if that still conflicts the request fails with
    /// [`Error::Contended`] — never `Unavailable`, so `on_unavailable = allow` does not
    /// admit a contended entity without limit, and never a refusal that would claim the
    /// entity cannot pay.
    pub(crate) async fn slow(
        self: &Arc<Self>,
        req: &Request,
        shard: u32,
        known: Option<BucketImage>,
    ) -> Result<Lease> {
        let key = self.bucket_key(req, shard);
        let mut attempt = 0;
        let mut moves = true;
        let mut known = known;
        loop {
            let r = self.slow_once(req, shard, &key, moves, known.take()).await;
            match r {
                Err(Error::Unavailable(e)) if e.is_retryable() && attempt < 3 => {
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                }
                Err(Error::Unavailable(StoreError::TransactionConflict)) if moves => {
                    tracing::debug!("transaction keeps conflicting: retrying without quota moves");
                    moves = false;
                    attempt = 0;
                }
                Err(Error::Unavailable(StoreError::TransactionConflict)) => {
                    return Err(Error::Contended {
                        entity: req.entity.clone(),
                        resource: req.resource.clone(),
                    });
                }
                r => return r,
            }
        }
    }

    async fn slow_once(
        self: &Arc<Self>,
        req: &Request,
        shard: u32,
        key: &Key,
        moves: bool,
        known: Option<BucketImage>,
    ) -> Result<Lease> {
        // ADR-145: a lost move re-plans once, then seeds with moves disabled.
        let mut moves = moves;
        let mut replanned = false;
        let mut rereads = 0;
        let mut known = known;
        loop {
            match self.slow_attempt(req, shard, key, moves, &mut known).await {
                Err(Flow::Reread) if rereads < 6 => rereads += 1,
                Err(Flow::MoveLost) if !replanned => replanned = true,
                Err(Flow::MoveLost) if moves => moves = false,
                r => return r.map_err(Flow::into_error),
            }
        }
    }

    /// One slow-path pass. `known`: the image to plan from instead of reading (taken); a
    /// pass that must be re-planned leaves the image its failed write returned there.
    async fn slow_attempt(
        self: &Arc<Self>,
        req: &Request,
        shard: u32,
        key: &Key,
        moves: bool,
        known: &mut Option<BucketImage>,
    ) -> Pass<Lease> {
        let img = match known.take() {
            Some(img) => img,
            None => match self.store.get(key, true).await? {
                None => {
                    let now = self.clock.now_ms();
                    return self.create(req, shard, key, now, moves, known).await;
                }
                Some(item) => BucketImage::decode(&item)?,
            },
        };
        // The clock is read after the item: a write is only as fresh as the `now` it
        // carries (its refill, its trust horizon).
        let now = self.clock.now_ms();
        if img.disabled {
            return Err(Flow::Fail(Error::ResourceDisabled {
                entity: req.entity.clone(),
                resource: req.resource.clone(),
            }));
        }
        let img_rf = img.rf;
        let cached = self.shards.get(&req.entity, &req.resource).unwrap_or(1);
        let missing: Vec<&Limit> = req
            .limits
            .iter()
            .filter(|l| !img.limits.contains_key(l.name()))
            .collect();
        let plan = if missing.is_empty() {
            shards::SeedPlan::default()
        } else {
            shards::plan_seeds(
                self,
                req,
                &missing,
                shard,
                cached.max(img.shard_count),
                now,
                moves,
            )
            .await?
        };
        let now = if missing.is_empty() {
            now
        } else {
            // The seed plan read the siblings: the clock again, after that read.
            plan.now.max(self.clock.now_ms())
        };
        let mut s = cached.max(img.shard_count).max(plan.shard_count);
        let eval_all = |s: i64| -> Vec<Evaluated> {
            req.limits
                .iter()
                .map(|l| {
                    let st = img.limits.get(l.name());
                    evaluate(l, st, img.rf, s, now, plan.seed(l.name()))
                })
                .collect()
        };
        let mut evals = eval_all(s);
        // A quota granted, reset or rolled on this pass is sized at the entity's shard count,
        // and shard 0 holds it: read it (consistently) on any other shard.
        let grants = evals.iter().any(|e| e.gc.is_some());
        let mut pin = grants.then_some(CountPin::Count(s));
        if grants && shard != 0 {
            let s0 = match plan.shard0 {
                Some(s0) => s0,
                None => self.shard0_count(req).await?,
            };
            pin = Some(s0.map_or(CountPin::Absent, CountPin::Count));
            if s0.unwrap_or(1) > s {
                s = s0.unwrap_or(1);
                evals = eval_all(s);
            }
        }
        self.shards.raise(&req.entity, &req.resource, s);
        let refusal = self.refuse(req, &evals, s, now);
        if let (Some(x), true) = (&refusal, plan.moves.is_empty()) {
            self.rejections
                .record(&req.entity, &req.resource, shard, img, now);
            if s > 1 {
                return self
                    .entity_acquire(req, s, shard, now)
                    .await
                    .map_err(Flow::from);
            }
            return Err(Flow::Fail(Error::RateLimitExceeded(x.clone())));
        }
        // A refused request whose seed planned a move still commits the move, with nothing
        // consumed (the grant is the slot's either way).
        let amounts: Vec<(String, i64)> = if refusal.is_some() {
            Vec::new()
        } else {
            req.amounts.clone()
        };
        let (write, rf_written) =
            self.materialising_write(req, key, &img, &evals, &amounts, Charging::default(), now);
        let landed = self
            .commit_slot(req, shard, TransactOp::Update(write), &plan.moves, pin)
            .await?;
        match (landed, refusal) {
            (Ok(_), Some(x)) => {
                self.images.forget(&req.entity, &req.resource, shard);
                if s > 1 {
                    return self
                        .entity_acquire(req, s, shard, now)
                        .await
                        .map_err(Flow::from);
                }
                Err(Flow::Fail(Error::RateLimitExceeded(x)))
            }
            (Ok(new), None) => {
                Stats::bump(&self.stats.slow_admits);
                self.rejections.forget(&req.entity, &req.resource, shard);
                for m in &plan.moves {
                    self.rejections.forget(&req.entity, &req.resource, m.shard);
                }
                let new = self.remember(req, shard, new.as_deref())?;
                debug_assert!(new.as_ref().is_none_or(|n| n.rf == rf_written));
                self.after_materialise(req, shard, s, &evals).await;
                Ok(self.lease(req, shard, key.clone(), &evals, None, new, s, now))
            }
            (Err(LostLock(old)), _) => {
                let old = old.as_deref().map(BucketImage::decode).transpose()?;
                self.after_lost_lock(req, shard, key, s, img_rf, &evals, old, now, known)
                    .await
            }
        }
    }

    /// The rf-locked write that materialises `evals` on the item `img` and charges
    /// `amounts` (the normal write, §4.4), returning its new image; never onto a disabled
    /// item. Also returns the `rf` it stamps.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn materialising_write(
        &self,
        req: &Request,
        key: &Key,
        img: &BucketImage,
        evals: &[Evaluated],
        amounts: &[(String, i64)],
        charging: Charging<'_>,
        now: i64,
    ) -> (UpdateRequest, i64) {
        let wcu = evaluate_wcu(img.wcu.as_ref(), img.rf, now);
        let rf = next_rf(now, Some(img.rf), evals);
        let stamp = ItemStamp {
            rf,
            vu: valid_until(&req.limits, evals, now),
            ttl: req.ttl,
            ph: &req.ph,
        };
        let (update, condition) =
            normal_write(img.rf, &stamp, &req.limits, evals, &wcu, amounts, charging);
        (
            UpdateRequest {
                key: key.clone(),
                update: update.set(attr::CASCADE, req.cascade),
                condition: Some(condition.and(Condition::not_exists(attr::DISABLED))),
                returns: ReturnValues::AllNew,
            },
            rf,
        )
    }

    /// Remember the image a write returned (`ALL_NEW`) for the next plan; `None` when the
    /// write returned nothing (a transaction): the shard's entry is dropped.
    pub(crate) fn remember(
        &self,
        req: &Request,
        shard: u32,
        new: Option<&tollgate_core::value::Item>,
    ) -> Result<Option<BucketImage>> {
        match new {
            Some(i) => {
                let img = BucketImage::decode(i)?;
                self.images
                    .put(&req.entity, &req.resource, shard, img.clone());
                Ok(Some(img))
            }
            None => {
                self.images.forget(&req.entity, &req.resource, shard);
                Ok(None)
            }
        }
    }

    /// The slot's own conditional write failed (the rf lock lost to another writer, a
    /// pinned balance moved, a create race lost): decide from the item it returned. A
    /// writer that left the item trusted (`vu` later than now) lets the consumption-only
    /// retry compose with it; otherwise the pass is re-planned from that image (no read).
    #[allow(clippy::too_many_arguments)]
    async fn after_lost_lock(
        self: &Arc<Self>,
        req: &Request,
        shard: u32,
        key: &Key,
        s: i64,
        read_rf: i64,
        evals: &[Evaluated],
        old: Option<BucketImage>,
        now: i64,
        known: &mut Option<BucketImage>,
    ) -> Pass<Lease> {
        let Some(old) = old else {
            // The item is gone: read again (and create it).
            return Err(Flow::Reread);
        };
        if old.disabled {
            return Err(Flow::Fail(Error::ResourceDisabled {
                entity: req.entity.clone(),
                resource: req.resource.clone(),
            }));
        }
        self.shards
            .raise(&req.entity, &req.resource, old.shard_count);
        self.images
            .put(&req.entity, &req.resource, shard, old.clone());
        // The lock is still ours (rf unchanged) but a pinned balance moved: re-plan rather
        // than spend the pre-reset balance.
        let lock_held = old.rf == read_rf;
        let trusted = image_trusted(&old, &req.limits, &req.amounts, now);
        if (lock_held
            && evals
                .iter()
                .any(|e| e.transition.is_set() || e.gc.is_some()))
            || !trusted
            || needs_materialising(&old, req, now)
        {
            *known = Some(old);
            return Err(Flow::Reread);
        }
        match self.retry(req, shard, key, s, now).await? {
            Ok(lease) => Ok(lease),
            Err(Some(img)) => {
                *known = Some(img);
                Err(Flow::Reread)
            }
            Err(None) => Err(Flow::Reread),
        }
    }

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
    ) -> Pass<std::result::Result<Option<Box<tollgate_core::value::Item>>, LostLock>> {
        let count = count_pin.map(|p| match p {
            CountPin::Count(s) if s <= 1 => Condition::exists("PK").and(
                Condition::not_exists(attr::SHARD_COUNT).or(Condition::eq(attr::SHARD_COUNT, 1)),
            ),
            CountPin::Count(s) => Condition::exists("PK").and(Condition::eq(attr::SHARD_COUNT, s)),
            CountPin::Absent => Condition::not_exists("PK"),
        });
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
                TransactOp::Update(u) => self.store.update(u).await.map(|n| n.map(Box::new)),
                TransactOp::Put(p) => self.store.put(p).await.map(|()| None),
                other => self
                    .store
                    .transact_write(vec![other], None)
                    .await
                    .map(|()| None),
            };
            return match r {
                Ok(n) => Ok(Ok(n)),
                Err(StoreError::ConditionFailed { old }) => Ok(Err(LostLock(old))),
                Err(e) => Err(e.into()),
            };
        }
        let mut ops = vec![own];
        ops.extend(rest);
        let checked = check.is_some();
        ops.extend(check);
        match self.transact(ops).await {
            Err(Flow::MoveLost) if checked && moves.is_empty() => Err(Flow::Reread),
            r => r.map(|x| x.map(|()| None)),
        }
    }

    /// Shard 0's stored count (strongly consistent); `None` if it has no item.
    pub(crate) async fn shard0_count(&self, req: &Request) -> Result<Option<i64>> {
        let k = self.bucket_key(req, 0);
        Ok(match self.store.get(&k, true).await? {
            Some(i) => Some(BucketImage::decode(&i)?.shard_count),
            None => None,
        })
    }

    /// Commit a transaction whose first operation is the slot's own write. `Err(LostLock)`
    /// when that write's condition failed (lost rf lock or create race); `Flow::MoveLost` when a
    /// donor's condition failed.
    async fn transact(&self, ops: Vec<TransactOp>) -> Pass<std::result::Result<(), LostLock>> {
        match self.store.transact_write(ops, None).await {
            Ok(()) => Ok(Ok(())),
            Err(StoreError::TransactionCanceled { reasons }) => {
                let failed = |r: &CancelReason| matches!(r, CancelReason::ConditionFailed { .. });
                if reasons.first().is_some_and(failed) {
                    let old = match reasons.into_iter().next() {
                        Some(CancelReason::ConditionFailed { old }) => old.map(Box::new),
                        _ => None,
                    };
                    Ok(Err(LostLock(old)))
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

    /// Refuse when a named limit's materialised balance does not cover its amount.
    fn refuse(
        &self,
        req: &Request,
        evals: &[Evaluated],
        s: i64,
        now: i64,
    ) -> Option<Box<Exceeded>> {
        let short = req.limits.iter().zip(evals).any(|(l, e)| {
            req.amounts
                .iter()
                .any(|(n, a)| n == l.name() && e.balance < *a)
        });
        if !short {
            return None;
        }
        let mut statuses = Vec::new();
        for (l, e) in req.limits.iter().zip(evals) {
            if let Some((_, a)) = req.amounts.iter().find(|(n, _)| n == l.name()) {
                let view = ShardView {
                    eval: e,
                    shard_count: s,
                    carry: e.carry.unwrap_or(0),
                };
                statuses.push(limit_status(l, &[view], *a, e.balance < *a, now));
            }
        }
        Some(Box::new(Exceeded::new(
            &req.entity,
            &req.resource,
            statuses,
        )))
    }

    /// The consumption-only retry after a lost rf lock or create race, on an item whose
    /// writer left it trusted. `Ok(Err(image))`: the item is no longer trusted (or changed
    /// shape): re-plan from the image it returned.
    async fn retry(
        self: &Arc<Self>,
        req: &Request,
        shard: u32,
        key: &Key,
        s: i64,
        now: i64,
    ) -> Result<std::result::Result<Lease, Option<BucketImage>>> {
        let now = self.clock.now_ms().max(now);
        let (update, condition) = retry_write(&req.amounts, &req.limits, now);
        let r = self
            .store
            .update(UpdateRequest {
                key: key.clone(),
                update,
                condition: Some(condition),
                returns: ReturnValues::AllNew,
            })
            .await;
        match r {
            Ok(new) => {
                let img = returned_image(new.as_ref(), key)?;
                self.images
                    .put(&req.entity, &req.resource, shard, img.clone());
                Stats::bump(&self.stats.slow_admits);
                let evals = self.evaluate_all(req, &img, now);
                Ok(Ok(self.lease(
                    req,
                    shard,
                    key.clone(),
                    &evals,
                    Some(&img),
                    Some(img.clone()),
                    s,
                    now,
                )))
            }
            Err(StoreError::ConditionFailed { old }) => {
                let Some(img) = old.as_deref().map(BucketImage::decode).transpose()? else {
                    return Ok(Err(None));
                };
                self.images
                    .put(&req.entity, &req.resource, shard, img.clone());
                if img.disabled {
                    return Err(Error::ResourceDisabled {
                        entity: req.entity.clone(),
                        resource: req.resource.clone(),
                    });
                }
                if needs_materialising(&img, req, now) {
                    return Ok(Err(Some(img)));
                }
                if s > 1 {
                    return self.entity_acquire(req, s, shard, now).await.map(Ok);
                }
                match self.exceeded(req, &[Some(&img)], s, now) {
                    Some(x) => Err(Error::RateLimitExceeded(x)),
                    None => Ok(Err(Some(img))),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Create a missing shard item (Put if absent, in one transaction with the moves that
    /// fund its quotas and the split that funds its dripping limits). Losing the race
    /// continues on the winner's item.
    async fn create(
        self: &Arc<Self>,
        req: &Request,
        shard: u32,
        key: &Key,
        now: i64,
        moves: bool,
        known: &mut Option<BucketImage>,
    ) -> Pass<Lease> {
        let cached = self.shards.get(&req.entity, &req.resource).unwrap_or(1);
        if shard != 0 {
            // A disabled entity stays disabled on the shards it grows.
            let k0 = self.bucket_key(req, 0);
            if let Some(i) = self.store.get(&k0, true).await? {
                if BucketImage::decode(&i)?.disabled {
                    return Err(Flow::Fail(Error::ResourceDisabled {
                        entity: req.entity.clone(),
                        resource: req.resource.clone(),
                    }));
                }
            }
        }
        let all: Vec<&Limit> = req.limits.iter().collect();
        let plan = shards::plan_seeds_of(
            self,
            req,
            &all,
            shard,
            cached.max(shard as i64 + 1),
            now,
            moves,
            true,
        )
        .await?;
        if let Some(first) = plan.split_first {
            // The family splits one level at a time: create the covering sibling's buddy
            // (nothing charged there), then plan this slot again.
            Box::pin(self.create_empty(req, first, moves)).await?;
            return Err(Flow::Reread);
        }
        let s = plan.shard_count;
        let now = plan.now.max(self.clock.now_ms());
        let evals: Vec<Evaluated> = req
            .limits
            .iter()
            .map(|l| evaluate(l, None, now, s, now, plan.seed(l.name())))
            .collect();
        let refusal = self.refuse(req, &evals, s, now);
        if let (Some(x), true) = (&refusal, plan.moves.is_empty() && plan.splits.is_empty()) {
            if s > 1 {
                return self
                    .entity_acquire(req, s, shard, now)
                    .await
                    .map_err(Flow::from);
            }
            return Err(Flow::Fail(Error::RateLimitExceeded(x.clone())));
        }
        let amounts: Vec<(String, i64)> = if refusal.is_some() {
            Vec::new()
        } else {
            req.amounts.clone()
        };
        let rf = next_rf(now, None, &evals);
        let stamp = ItemStamp {
            rf,
            vu: valid_until(&req.limits, &evals, now),
            ttl: req.ttl,
            ph: &req.ph,
        };
        let id = BucketIdentity {
            ns: self.ns(),
            entity: &req.entity,
            resource: &req.resource,
            shard,
            shard_count: s,
        };
        let mut item = create_item(&id, &stamp, &req.limits, &evals, &amounts);
        // ADR-146: the effective cascade policy is stamped on every item the slow path writes.
        item.insert(attr::CASCADE.into(), req.cascade.into());
        let put = PutRequest {
            key: key.clone(),
            item: item.clone(),
            condition: Some(Condition::not_exists("PK")),
        };
        // A create on shard 0 is pinned by its own `attribute_not_exists(PK)`; any other
        // shard that grants a quota pins shard 0's count as read.
        let pin = match plan.shard0 {
            Some(s0) if evals.iter().any(|e| e.gc.is_some()) => {
                Some(s0.map_or(CountPin::Absent, CountPin::Count))
            }
            _ => None,
        };
        let mut moves_ops = plan.moves.clone();
        moves_ops.extend(plan.splits.iter().cloned());
        let landed = self
            .commit_slot(req, shard, TransactOp::Put(put), &moves_ops, pin)
            .await?;
        match (landed, refusal) {
            (Ok(_), Some(x)) => {
                self.shards.raise(&req.entity, &req.resource, s);
                self.images.forget(&req.entity, &req.resource, shard);
                if s > 1 {
                    return self
                        .entity_acquire(req, s, shard, now)
                        .await
                        .map_err(Flow::from);
                }
                Err(Flow::Fail(Error::RateLimitExceeded(x)))
            }
            (Ok(_), None) => {
                Stats::bump(&self.stats.slow_admits);
                self.shards.raise(&req.entity, &req.resource, s);
                for m in &moves_ops {
                    self.rejections.forget(&req.entity, &req.resource, m.shard);
                    self.images.forget(&req.entity, &req.resource, m.shard);
                }
                let mut full = item;
                full.insert("PK".into(), key.pk.clone().into());
                full.insert("SK".into(), key.sk.clone().into());
                let new = self.remember(req, shard, Some(&full))?;
                self.after_materialise(req, shard, s, &evals).await;
                Ok(self.lease(req, shard, key.clone(), &evals, None, new, s, now))
            }
            (Err(LostLock(old)), _) => {
                let old = old.as_deref().map(BucketImage::decode).transpose()?;
                self.after_lost_lock(req, shard, key, s, i64::MIN, &evals, old, now, known)
                    .await
            }
        }
    }

    /// Create shard `shard` charging nothing (an intermediate level of a dripping split);
    /// losing the race to another creator is fine.
    async fn create_empty(self: &Arc<Self>, req: &Request, shard: u32, moves: bool) -> Result<()> {
        let empty = Request {
            amounts: Vec::new(),
            ..req.clone()
        };
        let key = self.bucket_key(req, shard);
        match self.slow_once(&empty, shard, &key, moves, None).await {
            Ok(_) | Err(Error::RateLimitExceeded(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Work that follows a landed materialising write: propagate opened windows.
    async fn after_materialise(&self, req: &Request, shard: u32, s: i64, evals: &[Evaluated]) {
        shards::fan_out(self, req, shard, s, evals).await;
    }

    /// Rule "shard doubling": double the count on shard 0 by compare-and-set (never above
    /// 32, never lowered; a loser adopts the winner's count), then propagate it to the
    /// other shards (best effort, monotone). Every shard written is sent to the slow path
    /// once (`vu = 0`) so its dripping limits shrink to the new share.
    pub(crate) async fn bump(&self, req: &Request, old: i64) -> Result<i64> {
        if old >= MAX_SHARD_COUNT.min(self.opts.max_shard_count) {
            return Ok(old);
        }
        let new = old * 2;
        let key = self.bucket_key(req, 0);
        let cond = Condition::exists("PK").and(if old == 1 {
            Condition::not_exists(attr::SHARD_COUNT).or(Condition::eq(attr::SHARD_COUNT, 1))
        } else {
            Condition::eq(attr::SHARD_COUNT, old)
        });
        let r = self
            .store
            .update(UpdateRequest {
                key,
                // vu = 0: the next write on this shard takes the slow path and re-materialises
                // its dripping limits at the new share (a stale full balance would otherwise
                // be spent on top of the new shards' shares).
                update: Update::new().set(attr::SHARD_COUNT, new).set(attr::VU, 0),
                condition: Some(cond),
                returns: ReturnValues::None,
            })
            .await;
        let got = match r {
            Ok(_) => {
                Stats::bump(&self.stats.doublings);
                tracing::info!(old, new, "shard count doubled");
                for s in 1..old as u32 {
                    let r = self
                        .store
                        .update(UpdateRequest {
                            key: self.bucket_key(req, s),
                            update: Update::new().set(attr::SHARD_COUNT, new).set(attr::VU, 0),
                            condition: Some(
                                Condition::exists("PK").and(Condition::lt(attr::SHARD_COUNT, new)),
                            ),
                            returns: ReturnValues::None,
                        })
                        .await;
                    if let Err(e) = r {
                        tracing::debug!(error = %e, shard = s, "shard count propagation skipped");
                    }
                }
                new
            }
            Err(StoreError::ConditionFailed { old: item }) => match item {
                Some(i) => BucketImage::decode(&i)?.shard_count.max(old),
                None => old,
            },
            Err(e) => return Err(e.into()),
        };
        self.shards.raise(&req.entity, &req.resource, got);
        Ok(got)
    }
}
