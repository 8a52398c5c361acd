//! Acquire: the speculative fast path, the rf-locked slow path, create, the
//! consumption-only retry, shard probing and doubling.

mod across;
mod admin;
mod amounts;
mod commit;
mod create;
mod enforce;
mod fast;
mod many;
mod reset;
mod slow;
mod slow_mode;
mod slow_retry;
mod slow_write;
mod status;

pub use reset::{validate_op_id, BucketOpOutcome, MAX_OP_ID_CHARS};

use std::collections::BTreeMap;
use std::sync::Arc;

use tollgate_core::bucket::{attr, BucketImage, MAX_SHARD_COUNT};
use tollgate_core::bypass::Enforcement;
use tollgate_core::expr::{Condition, ReturnValues, Update};
use tollgate_core::ids::{validate_entity_id, validate_resource};
use tollgate_core::keys;
use tollgate_core::limit::Limit;
use tollgate_core::materialize::{evaluate, evaluate_wcu, valid_until, Evaluated};
use tollgate_core::plan::{PassOutcome, PassPlan, SlowPlan};
use tollgate_core::status::{limit_status, ShardView};
use tollgate_core::units::{EpochMs, ShardCount};
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

pub(crate) use crate::request::{backoff, CountPin, Landed, Request};
pub use amounts::Amounts;
pub use many::MultiLease;

/// Per-call options of an acquire.
#[derive(Debug, Clone, Default)]
pub struct AcquireOptions {
    /// Use these limits instead of the stored ones.
    pub limits: Option<Vec<Limit>>,
    /// Override the fail-open / fail-closed policy for this call.
    pub on_unavailable: Option<OnUnavailable>,
}

impl AcquireOptions {
    /// No options: the stored limits and the stored (or the builder's) policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// Use `limits` instead of the stored ones.
    pub fn limits(mut self, limits: Vec<Limit>) -> Self {
        self.limits = Some(limits);
        self
    }

    /// Answer by `policy` when the store cannot be reached, for this call.
    pub fn on_unavailable(mut self, policy: OnUnavailable) -> Self {
        self.on_unavailable = Some(policy);
        self
    }
}

// Held in place: a box cost an allocation per admitted acquire.
#[allow(clippy::large_enum_variant)]
enum Fast {
    Granted(Lease),
    /// Take the slow path on this shard, planning from this image when one is known (a
    /// failed write's old item: no read needed).
    Slow(u32, Option<Arc<BucketImage>>),
    Rejected(Box<Exceeded>),
}

/// Whether a speculative write on `img` would fail for a reason only the slow path handles
/// (its trust horizon passed, its parameters or limits changed, its TTL passed): then the
/// slow path plans from `img` at once instead of spending a write to learn it.
fn needs_materialising(img: &BucketImage, req: &Request, now: i64) -> bool {
    if img.bypass {
        // A bypassed item is written `tc`-only, trusted or not (ADR-151).
        return img.params_hash.as_deref() != Some(&*req.params_hash)
            || img.ttl.is_some_and(|t| t <= now / 1000);
    }
    !image_trusted(img, &req.limits, &req.amounts, now)
        || img.params_hash.as_deref() != Some(&*req.params_hash)
        || img.ttl.is_some_and(|t| t <= now / 1000)
        || req
            .amounts
            .iter()
            .any(|(n, _)| !img.limits.contains_key(n.as_str()))
}

impl Limiter {
    /// Acquire `amounts` (tokens per limit: `&[("rpm", 1), ("tpm", 500)]` or an
    /// [`Amounts`]) of `resource` for `entity` with the stored limits.
    pub async fn acquire(
        &self,
        entity: &str,
        resource: &str,
        amounts: impl Into<Amounts>,
    ) -> Result<Lease> {
        self.acquire_with(entity, resource, amounts, AcquireOptions::default())
            .await
    }

    /// Acquire with per-call options.
    pub async fn acquire_with(
        &self,
        entity: &str,
        resource: &str,
        amounts: impl Into<Amounts>,
        opts: AcquireOptions,
    ) -> Result<Lease> {
        validate_entity_id(entity)?;
        validate_resource(resource)?;
        let amounts = amounts.into().into_millitokens()?;
        let inner = &self.inner();
        let mut policy = opts.on_unavailable;
        let r = async {
            let now = inner.clock().now_ms();
            let res = inner
                .config()
                .resolve(inner.store().as_ref(), inner.ns(), entity, resource, now)
                .await?;
            // Rule "a scope's mode is its most specific level's": a disabled scope is
            // refused before any write; a bypassed one is written bypass-shaped.
            if res.mode == Some(Enforcement::Disabled) {
                return Err(Error::ResourceDisabled {
                    entity: entity.into(),
                    resource: resource.into(),
                });
            }
            let (limits, ph, source) = match opts.limits {
                Some(l) => {
                    let ph = tollgate_core::bypass::policy_hash(&params_hash(&l), res.mode);
                    (Arc::<[Limit]>::from(l), Some(ph.into()), Source::Override)
                }
                None => {
                    if policy.is_none() {
                        policy = res.on_unavailable;
                    }
                    (res.limits, Some(res.params_hash), res.source)
                }
            };
            if let Some(m) = res.unreachable {
                // The config read just waited out the store: answer by the policy now.
                return Err(Error::Unavailable(StoreError::Unavailable(m)));
            }
            let req = Request {
                cascade: res.cascade,
                bypass: res.mode == Some(Enforcement::Bypass),
                mode: res.mode,
                // A cached answer, even a confirmed one, may predate a change: a stamp
                // it disagrees with is re-read before it is flipped.
                mode_confirmed: false,
                ..inner.request_hashed(
                    res.entity,
                    res.resource,
                    amounts,
                    limits,
                    ph,
                    source,
                    now,
                )?
            };
            // ADR-146: the parent is charged with its own resolved limits (resolved before
            // any write, so a parent without limits fails without debiting the child).
            let parent = match (&res.parent_id, res.cascade) {
                (Some(p), true) => Some(inner.parent_for(&req, p, now).await?),
                _ => None,
            };
            inner.acquire_cascade(&req, parent, res.confirmed).await
        }
        .await;
        // Rule "only an outage fails open": a misconfiguration, corrupt data or contention
        // never admits, whatever the policy.
        match r {
            Err(e)
                if e.is_outage()
                    && policy
                        .or_else(|| inner.config().last_policy(inner.clock().now_ms()))
                        .unwrap_or(inner.opts().on_unavailable)
                        == OnUnavailable::Allow =>
            {
                tracing::warn!(error = %e, entity, resource, "store unavailable: admitting (on_unavailable = allow)");
                Stats::bump(&inner.stats().degraded);
                Ok(Lease::degraded(entity, resource))
            }
            r => r,
        }
    }
}

/// The shards an acquire may be sent to (ADR-147).
pub(crate) enum Open {
    /// Every shard.
    All,
    /// These (at least one, not every one).
    Some(Vec<u32>),
}

/// The item a successful write returned (`ALL_NEW`), decoded (like `last`, the image the
/// write was planned from, when there is one).
fn returned_image(
    new: Option<&tollgate_core::value::Item>,
    key: &Key,
    last: Option<&BucketImage>,
) -> Result<BucketImage> {
    new.map(|i| BucketImage::decode_like(i, key.clone(), last))
        .transpose()?
        .ok_or_else(|| Error::Corrupt(format!("{key}: no item returned")))
}

impl Inner {
    pub(crate) fn request(
        &self,
        entity: &str,
        resource: &str,
        amounts: Vec<(String, i64)>,
        limits: impl Into<Arc<[Limit]>>,
        source: Source,
        now: i64,
    ) -> Result<Request> {
        self.request_hashed(entity, resource, amounts, limits.into(), None, source, now)
    }

    /// [`Inner::request`] with the limits' parameter hash when it is already known (the
    /// config cache computes it once per resolution).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn request_hashed(
        &self,
        entity: impl Into<Arc<str>> + AsRef<str>,
        resource: impl Into<Arc<str>> + AsRef<str>,
        amounts: Vec<(String, i64)>,
        limits: Arc<[Limit]>,
        ph: Option<Arc<str>>,
        source: Source,
        now: i64,
    ) -> Result<Request> {
        if limits.is_empty() {
            return Err(Error::NoLimits {
                entity: entity.as_ref().into(),
                resource: resource.as_ref().into(),
            });
        }
        for (n, _) in &amounts {
            if !limits.iter().any(|l| l.name() == n) {
                return Err(Error::UnknownLimit {
                    limit: n.clone(),
                    resource: resource.as_ref().into(),
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
            _ => match ttl_for(&limits, now, self.opts().ttl_multiplier) {
                Some(t) => TtlWrite::Set(t),
                None => TtlWrite::Remove,
            },
        };
        Ok(Request {
            entity: entity.into(),
            resource: resource.into(),
            params_hash: ph.unwrap_or_else(|| params_hash(&limits).into()),
            amounts: amounts.into(),
            limits,
            ttl,
            cascade: false,
            bypass: false,
            mode: None,
            mode_confirmed: false,
        })
    }

    pub(crate) fn bucket_key(&self, req: &Request, shard: u32) -> Key {
        keys::bucket(self.ns(), &req.entity, &req.resource, shard)
    }

    /// The key of `shard`'s item: the one `known` (an image of that shard) holds, shared
    /// rather than formatted again, else built.
    pub(crate) fn shard_key(&self, req: &Request, shard: u32, known: Option<&BucketImage>) -> Key {
        let key = match known {
            Some(img) => img.key.clone(),
            None => self.bucket_key(req, shard),
        };
        debug_assert!(
            keys::is_bucket(&key, self.ns(), &req.entity, &req.resource, shard),
            "the image is the shard's"
        );
        key
    }

    pub(crate) async fn acquire(self: &Arc<Self>, req: &Request) -> Result<Lease> {
        let now = self.clock().now_ms();
        let cached = self.shards().count(&req.entity, &req.resource);
        // The slow path is awaited in one place, after the fast path's answer has been
        // taken apart: no answer is held across it, which keeps this future small.
        let next = match cached {
            Some(s) if self.opts().speculative => match self.local_decision(req, s, now) {
                Err(x) => {
                    Stats::bump(&self.stats().local_rejections);
                    Fast::Rejected(x)
                }
                Ok(shard) => {
                    // Rule "plan from what the store last said": a shard this process last
                    // saw past its trust horizon is materialised from that image, in one
                    // write, rather than refused by a speculative write first.
                    match self.images().get(&req.entity, &req.resource, shard) {
                        Some(img) if img.disabled => self.fast(req, shard, s, now, None).await?,
                        // Past its horizon at `now`, so at every later instant too.
                        Some(img) if needs_materialising(&img, req, now) => {
                            Fast::Slow(shard, Some(img))
                        }
                        // Trusted at `now`, read before the image: judged again at the
                        // instant the speculative write will carry, so a horizon passed in
                        // between (a write that landed meanwhile may have left it) sends
                        // the one materialising write, not a refused speculative one first.
                        Some(img) => {
                            let at = self.clock().now_ms();
                            if needs_materialising(&img, req, at) {
                                Fast::Slow(shard, Some(img))
                            } else {
                                self.fast(req, shard, s, now, Some(at)).await?
                            }
                        }
                        None => self.fast(req, shard, s, now, None).await?,
                    }
                }
            },
            Some(s) => Fast::Slow(self.rng().draw(0, s as u32), None),
            None => Fast::Slow(0, None),
        };
        let r = match next {
            Fast::Granted(l) => Ok(l),
            Fast::Rejected(x) => Err(Error::RateLimitExceeded(x)),
            Fast::Slow(shard, img) => self.slow(req, shard, img).await,
        };
        if let Err(Error::RateLimitExceeded(_)) = &r {
            Stats::bump(&self.stats().rejections);
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
        match self.open_shards(req, s, now)? {
            Open::All => Ok(self.rng().draw(0, s as u32)),
            Open::Some(open) => Ok(open[self.rng().draw(0, open.len() as u32) as usize]),
        }
    }

    /// ADR-147: the shards not known (from this process's trusted rejection views) to be
    /// short for `req`; the refusal when every one of the `s` shards is.
    pub(crate) fn open_shards(
        &self,
        req: &Request,
        s: i64,
        now: i64,
    ) -> std::result::Result<Open, Box<Exceeded>> {
        let short = |shard: u32| {
            self.rejections()
                .view(&req.entity, &req.resource, shard, now)
                .filter(|img| !would_refill_satisfy(img, &req.limits, &req.amounts, now))
        };
        // The common case, nothing known short, allocates nothing.
        let Some(first) = (0..s as u32).find(|&i| short(i).is_some()) else {
            return Ok(Open::All);
        };
        let mut open = Vec::with_capacity(s as usize);
        let mut views = Vec::new();
        open.extend(0..first);
        for shard in first..s as u32 {
            match short(shard) {
                Some(img) => views.push(img),
                None => open.push(shard),
            }
        }
        if open.is_empty() {
            let images: Vec<Option<&BucketImage>> = views.iter().map(|i| Some(&**i)).collect();
            if let Some(x) = self.exceeded(req, &images, s, now) {
                return Err(x);
            }
            // Every shard is short on its own but together they cover it: draw any (the
            // store decides, across shards if need be).
            return Ok(Open::All);
        }
        Ok(Open::Some(open))
    }
}
