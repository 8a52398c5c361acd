//! The aggregator: the background pass that refills, rolls and resets bucket items
//! (§4.11), doubles hot entities proactively (§4.7 Path 1) and clones shard 0 into the
//! slots a doubling opened (§4.7 Path 2, funded by moves: ADR-145).
//!
//! The store contract has no change feed yet, so the aggregator is driven per
//! (entity, resource): each call reads the shards it needs (strongly consistently) and
//! treats what it read as the stream's latest image. The consumption a record would carry
//! (`NewImage.consumed − OldImage.consumed`) is taken against the previous image this `Aggregator`
//! saw of the item (none seen: the whole `tc`).
//!
//! Rules live elsewhere, once: the refill decision in [`tollgate_core::aggregate`], the
//! proactive-doubling threshold in [`crate::should_double`], the doubling CAS in the
//! limiter's `bump`, the quota grant plan and donor conditions in `shards::plan_seeds`, and
//! the commit with its shard-0 count pin in the acquire path's `commit_slot`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tollgate_core::aggregate::{plan_refill, stored_limits, Decision};
use tollgate_core::bucket::BucketImage;
use tollgate_core::expr::ReturnValues;
use tollgate_core::ids::{validate_entity_id, validate_resource};
use tollgate_core::limit::Limit;
use tollgate_core::materialize::evaluate_wcu;
use tollgate_core::value::Key;
use tollgate_core::writes::TtlWrite;
use tollgate_store::{TransactOp, UpdateRequest};

use crate::error::{Flow, Result};
use crate::limiter::{Inner, Limiter};
use crate::request::{CountPin, Landed, Request};
use crate::shards;

mod clone;
mod report;

pub use report::AggregateReport;

/// The aggregator over a limiter's store, clock and options.
pub struct Aggregator {
    inner: Arc<Inner>,
    /// `tc` per (item key, limit) at the previous image seen: the change feed's old image.
    seen: Mutex<HashMap<(Key, String), i64>>,
}

impl std::fmt::Debug for Aggregator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aggregator")
            .field("limiter", &self.inner)
            .finish()
    }
}

fn request(entity: &str, resource: &str, limits: Vec<Limit>, ph: &str) -> Result<Request> {
    validate_entity_id(entity)?;
    validate_resource(resource)?;
    Ok(Request {
        entity: entity.into(),
        resource: resource.into(),
        amounts: Arc::from([]),
        limits: limits.into(),
        params_hash: ph.into(),
        ttl: TtlWrite::Remove,
        // The aggregator never stamps the cascade policy (ADR-146): its writes do not carry
        // `cascade`, so an item keeps what its last client write stamped.
        cascade: false,
        bypass: false,
        // Nor the mode: an aggregator pass keeps the item's stamps.
        mode: None,
        mode_confirmed: false,
    })
}

impl Aggregator {
    /// An aggregator sharing `limiter`'s store, clock, options and caches.
    pub fn new(limiter: &Limiter) -> Self {
        Aggregator {
            inner: limiter.inner().clone(),
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Shard 0's image (strongly consistent), if the bucket exists.
    async fn shard0(&self, req: &Request) -> Result<Option<BucketImage>> {
        let k0 = self.inner.bucket_key(req, 0);
        Ok(match self.inner.store().get(&k0, true).await? {
            Some(i) => Some(BucketImage::decode(&i)?),
            None => None,
        })
    }

    /// Images of shards `from..to` (strongly consistent), missing ones as `None`.
    async fn shards(
        &self,
        req: &Request,
        from: u32,
        to: u32,
    ) -> Result<Vec<(u32, Option<BucketImage>)>> {
        let ids: Vec<u32> = (from..to).collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<Key> = ids.iter().map(|i| self.inner.bucket_key(req, *i)).collect();
        let items = self.inner.store().batch_get_shared(&keys, true).await?;
        ids.into_iter()
            .zip(items)
            .map(|(i, it)| Ok((i, it.as_deref().map(BucketImage::decode).transpose()?)))
            .collect()
    }

    /// Consumption per limit since the previous image of this item (the whole `tc` when
    /// none was seen), and remember this image.
    fn consumed(&self, img: &BucketImage) -> BTreeMap<String, i64> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        img.limits
            .iter()
            .map(|(n, st)| {
                let k = (img.key.clone(), n.to_string());
                let before = seen.insert(k, st.consumed).unwrap_or(0);
                (n.to_string(), st.consumed - before)
            })
            .collect()
    }

    /// The refill pass (§4.11) over every shard of (entity, resource): read the shards,
    /// decide each item's write with [`plan_refill`] at the shard count in force (shard
    /// 0's), and commit it — pinned on shard 0's count when it stamps a quota grant
    /// (`gc`). A write refused by its pins is counted as lost and left for the next pass
    /// or a client; nothing else is retried.
    pub async fn refill_entity(&self, entity: &str, resource: &str) -> Result<AggregateReport> {
        let req = request(entity, resource, Vec::new(), "")?;
        let Some(img0) = self.shard0(&req).await? else {
            return Ok(AggregateReport::default());
        };
        let s = img0.shard_count;
        let mut images = vec![(0, Some(img0))];
        images.extend(self.shards(&req, 1, s as u32).await?);
        let images: Vec<(u32, BucketImage)> = images
            .into_iter()
            .filter_map(|(i, img)| img.map(|img| (i, img)))
            .collect();
        let mut rep = self.refill_images(&req, s, &images).await?;
        rep.shards_read += images.len();
        Ok(rep)
    }

    /// The refill pass and the doubling check over the shards of (entity, resource) the
    /// change feed just showed written, planned from the feed's own newest image of each
    /// (rule "plan from what the store last said": no read). A shard the feed did not show
    /// was not drained and needs neither. A planned write is conditioned as it is after a
    /// read, so an image a later write made stale only loses its write (counted). Only a
    /// shard that looks hot is read again, by the doubling's own check.
    pub async fn background_from_feed(
        &self,
        entity: &str,
        resource: &str,
        seen: &[(u32, Arc<tollgate_core::value::Item>)],
    ) -> Result<AggregateReport> {
        let req = request(entity, resource, Vec::new(), "")?;
        let now = self.inner.clock().now_ms();
        let mut images = Vec::with_capacity(seen.len());
        for (shard, item) in seen {
            images.push((*shard, BucketImage::decode(item)?));
        }
        let s = images.iter().map(|(_, i)| i.shard_count).max().unwrap_or(1);
        let mut rep = self.refill_images(&req, s, &images).await?;
        let hot = images.iter().any(|(_, img)| {
            img.wcu.is_some()
                && shards::should_double(
                    evaluate_wcu(img.wcu.as_ref(), img.refilled_at_ms, now).balance,
                    s,
                )
        });
        if hot {
            rep.merge(self.maybe_double(entity, resource).await?);
        }
        Ok(rep)
    }

    /// Plan and commit the refill of each image (`s`: the shard count in force).
    async fn refill_images(
        &self,
        req: &Request,
        s: i64,
        images: &[(u32, BucketImage)],
    ) -> Result<AggregateReport> {
        let (entity, resource) = (&*req.entity, &*req.resource);
        let req = req.clone();
        let now = self.inner.clock().now_ms();
        let mut rep = AggregateReport::default();
        for (shard, img) in images {
            let shard = *shard;
            let s_used = s.max(img.shard_count);
            let consumed = self.consumed(img);
            match plan_refill(img, s_used, now, &consumed)? {
                Decision::Nothing => {}
                Decision::Unevaluable { limit, reason } => {
                    rep.skipped += 1;
                    tracing::warn!(
                        shard,
                        limit,
                        reason,
                        "aggregator: schedule cannot be evaluated; item skipped"
                    );
                }
                Decision::Skip { limit } => {
                    rep.skipped += 1;
                    tracing::debug!(
                        shard,
                        limit,
                        "aggregator: pending window ended; left for a client"
                    );
                }
                Decision::Write(w) => {
                    let own = TransactOp::Update(UpdateRequest {
                        key: self.inner.bucket_key(&req, shard),
                        update: w.update,
                        condition: Some(w.condition),
                        returns: ReturnValues::None,
                    });
                    let pin = w.grants.then_some(CountPin::Count(s_used));
                    rep.writes += 1;
                    match self.inner.commit_slot(&req, shard, own, &[], pin).await {
                        Ok(Landed::Wrote(_)) => {
                            rep.refilled_items += 1;
                            rep.rolled += w.rolled.len();
                            rep.reset += w.reset.len();
                            rep.refilled += w.refilled.len();
                            rep.clamped += w.clamped.len();
                            self.inner.rejections().forget(entity, resource, shard);
                        }
                        Ok(Landed::LostLock(_)) | Err(Flow::Reread) => {
                            rep.lost += 1;
                            tracing::debug!(shard, "aggregator: refill write lost its pins");
                        }
                        Err(e) => return Err(e.into_error()),
                    }
                }
            }
        }
        Ok(rep)
    }

    /// Path 1 (§4.7): when any shard's projected `wcu` balance is below 20 % of its
    /// capacity ([`crate::should_double`]), double the count on shard 0 by the same CAS a
    /// client uses, then clone shard 0 into the slots the doubling opened (Path 2).
    pub async fn maybe_double(&self, entity: &str, resource: &str) -> Result<AggregateReport> {
        let req = request(entity, resource, Vec::new(), "")?;
        let now = self.inner.clock().now_ms();
        let mut rep = AggregateReport::default();
        let Some(img0) = self.shard0(&req).await? else {
            return Ok(rep);
        };
        let s = img0.shard_count;
        let mut images = vec![img0];
        images.extend(
            self.shards(&req, 1, s as u32)
                .await?
                .into_iter()
                .filter_map(|(_, i)| i),
        );
        rep.shards_read = images.len();
        let hot = images.iter().any(|img| {
            img.wcu.is_some()
                && shards::should_double(
                    evaluate_wcu(img.wcu.as_ref(), img.refilled_at_ms, now).balance,
                    s,
                )
        });
        if !hot {
            return Ok(rep);
        }
        let doublings = || self.inner.stats().doublings.load(Ordering::Relaxed);
        let before = doublings();
        let new = self.inner.bump(&req, s).await?;
        rep.writes += if doublings() > before {
            s as usize // the CAS and s − 1 propagations
        } else {
            1
        };
        if new > s {
            rep.doubled = Some((s, new));
            let clones = self.clone_missing_shards(entity, resource, s).await?;
            rep.merge(clones);
        }
        Ok(rep)
    }

    /// Path 2 (§4.7, ADR-140/145): clone shard 0 into every missing slot in
    /// `[since, shard_count)` — one `Put attribute_not_exists(PK)` per slot, in one
    /// transaction with the moves that fund its quotas.
    ///
    /// The clone copies `ws`, `rsa`, `rf`, `vu`, `wa` (and `ttl`, `ph`) verbatim from shard
    /// 0, restarts `tc = 0`, `wtc = 0`, and holds: a full share of each dripping limit, the
    /// planned grant of each quota (moved from the covering current sibling, or a fresh
    /// share where none covers it; `gc = S`). A slot created meanwhile (a client got there
    /// first) or a donor that moved is counted as lost and left to lazy creation.
    pub async fn clone_missing_shards(
        &self,
        entity: &str,
        resource: &str,
        since: i64,
    ) -> Result<AggregateReport> {
        let probe = request(entity, resource, Vec::new(), "")?;
        let mut rep = AggregateReport::default();
        let Some(img0) = self.shard0(&probe).await? else {
            return Ok(rep);
        };
        rep.shards_read += 1;
        if img0.disabled {
            return Ok(rep);
        }
        let s = img0.shard_count;
        let limits = stored_limits(&img0)?;
        let req = request(
            entity,
            resource,
            limits,
            img0.params_hash.as_deref().unwrap_or_default(),
        )?;
        let from = since.clamp(1, s) as u32;
        let missing: Vec<u32> = self
            .shards(&req, from, s as u32)
            .await?
            .into_iter()
            .filter(|(_, i)| i.is_none())
            .map(|(j, _)| j)
            .collect();
        for slot in missing {
            rep.writes += 1;
            match self.clone_one(&req, &img0, slot, s).await {
                Ok(true) => rep.cloned.push(slot),
                Ok(false) | Err(Flow::MoveLost) | Err(Flow::Reread) => {
                    rep.lost += 1;
                    tracing::debug!(slot, "aggregator: clone not written; left to lazy creation");
                }
                Err(e) => return Err(e.into_error()),
            }
        }
        Ok(rep)
    }
}
