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
    classify_fast_failure, create_item, fast_write, next_rf, normal_write, params_hash, refund_pin,
    retry_write, ttl_for, would_refill_satisfy, BucketIdentity, FastFailure, ItemStamp, TtlWrite,
};
use tollgate_core::{LimitStatus, RuleError};
use tollgate_store::{CancelReason, PutRequest, StoreError, TransactOp, UpdateRequest};

use crate::config::{OnUnavailable, Source};
use crate::error::{Error, Exceeded, Result};
use crate::lease::Lease;
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
    Slow(u32),
    Rejected(Box<Exceeded>),
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
        match r {
            Err(Error::Unavailable(e))
                if policy.unwrap_or(inner.opts.on_unavailable) == OnUnavailable::Allow =>
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
                Ok(shard) => match self.fast(req, shard, s, now).await? {
                    Fast::Granted(l) => Ok(*l),
                    Fast::Rejected(x) => Err(Error::RateLimitExceeded(x)),
                    Fast::Slow(shard) => self.slow(req, shard).await,
                },
            },
            Some(s) => {
                let shard = self.rng.draw(0, s as u32);
                self.slow(req, shard).await
            }
            None => self.slow(req, 0).await,
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
            return Err(self.exceeded(req, &views.iter().map(Some).collect::<Vec<_>>(), s, now));
        }
        Ok(open)
    }

    /// The speculative write on one shard, then probes and doubling as §4.3 says.
    async fn fast(self: &Arc<Self>, req: &Request, shard: u32, s: i64, now: i64) -> Result<Fast> {
        let mut tried = vec![shard];
        let mut images: Vec<BucketImage> = Vec::new();
        let mut cur = shard;
        loop {
            match self.fast_once(req, cur, now).await? {
                Ok(lease) => return Ok(Fast::Granted(Box::new(lease))),
                Err(None) => {
                    // Throttled: the partition is hot. Spread out if we can.
                    let new_s = self.bump(req, s).await?;
                    if new_s > s {
                        return Ok(Fast::Slow(self.rng.draw(s as u32, new_s as u32)));
                    }
                    return Ok(Fast::Slow(cur));
                }
                Err(Some((failure, img))) => match failure {
                    FastFailure::Disabled => {
                        return Err(Error::ResourceDisabled {
                            entity: req.entity.clone(),
                            resource: req.resource.clone(),
                        })
                    }
                    FastFailure::Missing
                    | FastFailure::Expired
                    | FastFailure::Boundary
                    | FastFailure::ParamsChanged
                    | FastFailure::LimitMissing => return Ok(Fast::Slow(cur)),
                    FastFailure::WcuExhausted | FastFailure::Both => {
                        let img = img.ok_or_else(|| Error::Corrupt("no image".into()))?;
                        if would_refill_satisfy(&img, &req.limits, &req.amounts, now) {
                            // Rule #480: only a write-capacity shortfall doubles, never an
                            // app-limit rejection.
                            let wcu = evaluate_wcu(img.wcu.as_ref(), img.rf, now);
                            if !shards::should_double(wcu.balance, img.shard_count) {
                                return Ok(Fast::Slow(cur));
                            }
                            let new_s = self.bump(req, img.shard_count.max(s)).await?;
                            if new_s > s {
                                return Ok(Fast::Slow(self.rng.draw(s as u32, new_s as u32)));
                            }
                            return Ok(Fast::Slow(cur));
                        }
                        images.push(img);
                    }
                    FastFailure::AppLimit => {
                        let img = img.ok_or_else(|| Error::Corrupt("no image".into()))?;
                        if would_refill_satisfy(&img, &req.limits, &req.amounts, now) {
                            return Ok(Fast::Slow(cur));
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
        let x = if s_now > 1 {
            self.entity_exceeded(req, s_now, now).await?
        } else {
            self.exceeded(
                req,
                &images.iter().map(Some).collect::<Vec<_>>(),
                s_now,
                now,
            )
        };
        Ok(Fast::Rejected(x))
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
        let (update, condition) = fast_write(&req.amounts, &req.ph, now);
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
                Stats::bump(&self.stats.fast_admits);
                let evals = self.evaluate_all(req, &img, now);
                Ok(Ok(self.lease(
                    req,
                    shard,
                    key,
                    &evals,
                    Some(&img),
                    img.shard_count,
                    now,
                )))
            }
            Err(StoreError::ConditionFailed { old }) => {
                let img = old.as_deref().map(BucketImage::decode).transpose()?;
                if let Some(i) = &img {
                    self.shards.raise(&req.entity, &req.resource, i.shard_count);
                }
                let f = classify_fast_failure(img.as_ref(), &req.amounts, &req.ph, now);
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
    fn lease(
        self: &Arc<Self>,
        req: &Request,
        shard: u32,
        key: Key,
        evals: &[Evaluated],
        landed: Option<&BucketImage>,
        s: i64,
        now: i64,
    ) -> Lease {
        let debited = landed.is_some();
        let mut ceilings = BTreeMap::new();
        let mut pins = BTreeMap::new();
        let mut statuses = Vec::new();
        for (l, e) in req.limits.iter().zip(evals) {
            ceilings.insert(l.name().to_string(), e.ceiling);
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
        Lease::granted(
            self.clone(),
            &req.entity,
            &req.resource,
            shard,
            key,
            req.limits.clone(),
            ceilings,
            pins,
            req.amounts.clone(),
            statuses,
        )
    }

    /// Statuses of a refusal from the shard images at hand.
    pub(crate) fn exceeded(
        &self,
        req: &Request,
        images: &[Option<&BucketImage>],
        s: i64,
        now: i64,
    ) -> Box<Exceeded> {
        let mut statuses = self.statuses(req, images, s, now, Some(&req.amounts));
        if !statuses.iter().any(|s| s.exceeded) {
            // The shards refused, but the view read since shows enough (a refill or refund
            // landed in between): the named limits are still the refusal's cause.
            for st in &mut statuses {
                st.exceeded = true;
                st.retry_after_ms = Some(st.retry_after_ms.unwrap_or(1).max(1));
            }
        }
        Box::new(Exceeded::new(&req.entity, &req.resource, statuses))
    }

    /// Entity-wide statuses of the limits `req` names, summed over the shard images given
    /// (index = shard). A missing shard counts as a fresh one for dripping limits, and for
    /// quotas only when no shard exists at all (a quota shard is funded by a move, not a
    /// mint). A limit is exceeded when `judged` names it and no shard covers its amount.
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
            let seeded = !l.is_quota() || none_exist;
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
                    None if seeded => Some(evaluate(l, None, now, s, now, None)),
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
            let best = evals.iter().map(|e| e.balance).max().unwrap_or(0);
            let exceeded = judged
                .and_then(|j| j.iter().find(|(n, _)| n == l.name()))
                .is_some_and(|(_, want)| best < *want);
            out.push(limit_status(l, &views, a, exceeded, now));
        }
        out
    }

    /// A one-shard refusal restated for the entity when it has several shards (#475).
    async fn speak_of_entity(
        &self,
        req: &Request,
        x: Box<Exceeded>,
        s: i64,
        now: i64,
    ) -> Result<Box<Exceeded>> {
        if s > 1 {
            self.entity_exceeded(req, s, now).await
        } else {
            Ok(x)
        }
    }

    /// A refusal that speaks of the entity: read every shard (one batch read).
    async fn entity_exceeded(&self, req: &Request, s: i64, now: i64) -> Result<Box<Exceeded>> {
        let keys: Vec<Key> = (0..s as u32).map(|i| self.bucket_key(req, i)).collect();
        let items = self.store.batch_get(&keys, false).await?;
        let images: Vec<Option<BucketImage>> = items
            .iter()
            .map(|i| i.as_ref().map(BucketImage::decode).transpose())
            .collect::<std::result::Result<_, _>>()?;
        let refs: Vec<Option<&BucketImage>> = images.iter().map(|i| i.as_ref()).collect();
        Ok(self.exceeded(req, &refs, s, now))
    }

    /// The slow path on one shard: a consistent read, then create, the rf-locked normal
    /// write, or — when the lock was lost — the consumption-only retry.
    ///
    /// Rule "contention is a refusal, not an outage" (Q11): a transaction that keeps
    /// conflicting (1 try + 3 retries) is retried once more with quota moves disabled (the
    /// slot then gets no grant from a busy donor), and if that still conflicts the request
    /// is refused with `RateLimitExceeded` — never `Unavailable`, so `on_unavailable =
    /// allow` does not admit a contended entity without limit.
    pub(crate) async fn slow(self: &Arc<Self>, req: &Request, shard: u32) -> Result<Lease> {
        let key = self.bucket_key(req, shard);
        let mut attempt = 0;
        let mut moves = true;
        loop {
            let r = self.slow_once(req, shard, &key, moves).await;
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
                    let now = self.clock.now_ms();
                    let s = self.shards.get(&req.entity, &req.resource).unwrap_or(1);
                    return Err(Error::RateLimitExceeded(
                        self.entity_exceeded(req, s.max(1), now).await?,
                    ));
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
    ) -> Result<Lease> {
        // ADR-145: a lost move re-plans once, then seeds with moves disabled.
        let mut moves = moves;
        let mut replanned = false;
        let mut rereads = 0;
        loop {
            match self.slow_attempt(req, shard, key, moves).await {
                Err(Error::Reread) if rereads < 4 => rereads += 1,
                Err(Error::Reread) => {
                    return Err(Error::Unavailable(StoreError::TransactionConflict))
                }
                Err(Error::MoveLost) if !replanned => replanned = true,
                Err(Error::MoveLost) if moves => moves = false,
                Err(Error::MoveLost) => {
                    return Err(Error::Unavailable(StoreError::TransactionConflict))
                }
                r => return r,
            }
        }
    }

    async fn slow_attempt(
        self: &Arc<Self>,
        req: &Request,
        shard: u32,
        key: &Key,
        moves: bool,
    ) -> Result<Lease> {
        let now = self.clock.now_ms();
        let item = self.store.get(key, true).await?;
        let Some(item) = item else {
            return self.create(req, shard, key, now, moves).await;
        };
        let img = BucketImage::decode(&item)?;
        if img.disabled {
            return Err(Error::ResourceDisabled {
                entity: req.entity.clone(),
                resource: req.resource.clone(),
            });
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
        let now = now.max(plan.now);
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
            let x = self.speak_of_entity(req, x.clone(), s, now).await?;
            return Err(Error::RateLimitExceeded(x));
        }
        // A refused request whose seed planned a move still commits the move, with nothing
        // consumed (the grant is the slot's either way).
        let amounts: Vec<(String, i64)> = if refusal.is_some() {
            Vec::new()
        } else {
            req.amounts.clone()
        };
        let wcu = evaluate_wcu(img.wcu.as_ref(), img.rf, now);
        let stamp = ItemStamp {
            rf: next_rf(now, Some(img.rf), &evals),
            vu: valid_until(&req.limits, &evals, now),
            ttl: req.ttl,
            ph: &req.ph,
        };
        let (update, condition) = normal_write(img.rf, &stamp, &req.limits, &evals, &wcu, &amounts);
        let write = UpdateRequest {
            key: key.clone(),
            update: update.set(attr::CASCADE, req.cascade),
            condition: Some(condition),
            returns: ReturnValues::None,
        };
        let landed = self
            .commit_slot(req, shard, TransactOp::Update(write), &plan.moves, pin)
            .await?;
        match (landed, refusal) {
            (Ok(()), Some(x)) => Err(Error::RateLimitExceeded(
                self.speak_of_entity(req, x, s, now).await?,
            )),
            (Ok(()), None) => {
                Stats::bump(&self.stats.slow_admits);
                self.rejections.forget(&req.entity, &req.resource, shard);
                for m in &plan.moves {
                    self.rejections.forget(&req.entity, &req.resource, m.shard);
                }
                self.after_materialise(req, shard, s, &evals).await;
                Ok(self.lease(req, shard, key.clone(), &evals, None, s, now))
            }
            (Err(LostLock(old)), _) => {
                // The lock is still ours (rf unchanged) but a pinned reset balance moved:
                // re-read and re-plan rather than spend the pre-reset balance.
                let lock_held = old
                    .as_deref()
                    .and_then(|i| i.get(attr::RF))
                    .and_then(tollgate_core::value::Value::as_n)
                    == Some(img_rf);
                if lock_held
                    && evals
                        .iter()
                        .any(|e| e.transition.is_set() || e.gc.is_some())
                {
                    return Err(Error::Reread);
                }
                self.retry(req, shard, key, s, now).await
            }
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
    ) -> Result<std::result::Result<(), LostLock>> {
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
                TransactOp::Update(u) => self.store.update(u).await.map(|_| ()),
                TransactOp::Put(p) => self.store.put(p).await,
                other => self.store.transact_write(vec![other], None).await,
            };
            return match r {
                Ok(()) => Ok(Ok(())),
                Err(StoreError::ConditionFailed { old }) => Ok(Err(LostLock(old))),
                Err(e) => Err(e.into()),
            };
        }
        let mut ops = vec![own];
        ops.extend(rest);
        let checked = check.is_some();
        ops.extend(check);
        match self.transact(ops).await {
            Err(Error::MoveLost) if checked && moves.is_empty() => Err(Error::Reread),
            r => r,
        }
    }

    /// Shard 0's stored count (strongly consistent); `None` if it has no item.
    async fn shard0_count(&self, req: &Request) -> Result<Option<i64>> {
        let k = self.bucket_key(req, 0);
        Ok(match self.store.get(&k, true).await? {
            Some(i) => Some(BucketImage::decode(&i)?.shard_count),
            None => None,
        })
    }

    /// Commit a transaction whose first operation is the slot's own write. `Err(LostLock)`
    /// when that write's condition failed (lost rf lock or create race); `MoveLost` when a
    /// donor's condition failed.
    async fn transact(&self, ops: Vec<TransactOp>) -> Result<std::result::Result<(), LostLock>> {
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
                    Err(Error::MoveLost)
                } else if reasons
                    .iter()
                    .any(|r| matches!(r, CancelReason::TransactionConflict))
                {
                    Err(Error::Unavailable(StoreError::TransactionConflict))
                } else if reasons.iter().any(|r| matches!(r, CancelReason::Throttled)) {
                    Err(Error::Unavailable(StoreError::Throttled(
                        "transaction".into(),
                    )))
                } else {
                    Err(Error::Unavailable(StoreError::Validation(format!(
                        "transaction cancelled: {reasons:?}"
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

    /// The consumption-only retry after a lost rf lock or create race.
    async fn retry(
        self: &Arc<Self>,
        req: &Request,
        shard: u32,
        key: &Key,
        s: i64,
        now: i64,
    ) -> Result<Lease> {
        let (update, condition) = retry_write(&req.amounts);
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
                Stats::bump(&self.stats.slow_admits);
                let evals = self.evaluate_all(req, &img, now);
                Ok(self.lease(req, shard, key.clone(), &evals, Some(&img), s, now))
            }
            Err(StoreError::ConditionFailed { old }) => {
                let img = old.as_deref().map(BucketImage::decode).transpose()?;
                Err(Error::RateLimitExceeded(self.exceeded(
                    req,
                    &[img.as_ref()],
                    s,
                    now,
                )))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Create a missing shard item (Put if absent, in one transaction with the moves that
    /// fund its quotas). Losing the race falls back to the consumption-only retry on the
    /// winner's item.
    async fn create(
        self: &Arc<Self>,
        req: &Request,
        shard: u32,
        key: &Key,
        now: i64,
        moves: bool,
    ) -> Result<Lease> {
        let cached = self.shards.get(&req.entity, &req.resource).unwrap_or(1);
        if shard != 0 {
            // A disabled entity stays disabled on the shards it grows.
            let k0 = self.bucket_key(req, 0);
            if let Some(i) = self.store.get(&k0, true).await? {
                if BucketImage::decode(&i)?.disabled {
                    return Err(Error::ResourceDisabled {
                        entity: req.entity.clone(),
                        resource: req.resource.clone(),
                    });
                }
            }
        }
        let all: Vec<&Limit> = req.limits.iter().collect();
        let plan = shards::plan_seeds(
            self,
            req,
            &all,
            shard,
            cached.max(shard as i64 + 1),
            now,
            moves,
        )
        .await?;
        let s = plan.shard_count;
        let now = plan.now;
        let evals: Vec<Evaluated> = req
            .limits
            .iter()
            .map(|l| evaluate(l, None, now, s, now, plan.seed(l.name())))
            .collect();
        let refusal = self.refuse(req, &evals, s, now);
        if let (Some(x), true) = (&refusal, plan.moves.is_empty()) {
            return Err(Error::RateLimitExceeded(x.clone()));
        }
        let amounts: Vec<(String, i64)> = if refusal.is_some() {
            Vec::new()
        } else {
            req.amounts.clone()
        };
        let stamp = ItemStamp {
            rf: next_rf(now, None, &evals),
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
            item,
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
        let landed = self
            .commit_slot(req, shard, TransactOp::Put(put), &plan.moves, pin)
            .await?;
        match (landed, refusal) {
            (Ok(()), Some(x)) => {
                self.shards.raise(&req.entity, &req.resource, s);
                Err(Error::RateLimitExceeded(x))
            }
            (Ok(()), None) => {
                Stats::bump(&self.stats.slow_admits);
                self.shards.raise(&req.entity, &req.resource, s);
                for m in &plan.moves {
                    self.rejections.forget(&req.entity, &req.resource, m.shard);
                }
                self.after_materialise(req, shard, s, &evals).await;
                Ok(self.lease(req, shard, key.clone(), &evals, None, s, now))
            }
            (Err(LostLock(_)), _) => self.retry(req, shard, key, s, now).await,
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
