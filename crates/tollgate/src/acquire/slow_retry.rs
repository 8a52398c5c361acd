//! After the slow path's own write lost its rf lock: the decision from the returned item,
//! and the consumption-only retry.

use super::*;

impl Inner {
    /// The slot's own conditional write failed (the rf lock lost to another writer, a
    /// pinned balance moved, a create race lost): decide from the item it returned. A
    /// writer that left the item trusted (`vu` later than now) lets the consumption-only
    /// retry compose with it; otherwise the pass is re-planned from that image (no read).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn after_lost_lock(
        self: &Arc<Self>,
        req: &Request,
        shard: u32,
        key: &Key,
        s: i64,
        read_rf: i64,
        evals: &[Evaluated],
        old: Option<BucketImage>,
        now: i64,
        known: &mut Option<Arc<BucketImage>>,
    ) -> Pass<Lease> {
        let Some(old) = old else {
            // The item is gone: read again (and create it).
            return Err(Flow::Reread);
        };
        if old.disabled {
            return Err(Flow::Fail(Error::ResourceDisabled {
                entity: req.entity.to_string(),
                resource: req.resource.to_string(),
            }));
        }
        self.shards()
            .raise(&req.entity, &req.resource, old.shard_count);
        let old = Arc::new(old);
        self.images()
            .put(&req.entity, &req.resource, shard, Arc::clone(&old));
        if old.bypass || req.bypass {
            // ADR-151: a bypassed item (or one no longer bypassed) is planned again in the
            // shape its stamp says.
            *known = Some(old);
            return Err(Flow::Reread);
        }
        // The lock is still ours (rf unchanged) but a pinned balance moved: re-plan rather
        // than spend the pre-reset balance.
        let lock_held = old.refilled_at_ms == read_rf;
        let trusted = image_trusted(&old, &req.limits, &req.amounts, now);
        if (lock_held
            && evals
                .iter()
                .any(|e| e.transition.is_set() || e.grant_count.is_some()))
            || !trusted
            || needs_materialising(&old, req, now)
        {
            *known = Some(old);
            return Err(Flow::Reread);
        }
        match self.retry(req, shard, key, s, now).await? {
            Retried::Granted(lease) => Ok(lease),
            Retried::Replan(Some(img)) => {
                *known = Some(Arc::new(img));
                Err(Flow::Reread)
            }
            Retried::Replan(None) => Err(Flow::Reread),
        }
    }

    /// The consumption-only retry after a lost rf lock or create race, on an item whose
    /// writer left it trusted. [`Retried::Replan`]: the item is no longer trusted (or
    /// changed shape): re-plan from the image it returned.
    pub(super) async fn retry(
        self: &Arc<Self>,
        req: &Request,
        shard: u32,
        key: &Key,
        s: i64,
        now: i64,
    ) -> Result<Retried> {
        let now = self.clock().now_ms().max(now);
        let (update, condition) = retry_write(&req.amounts, &req.limits, now);
        let r = self
            .store()
            .update_shared(UpdateRequest {
                key: key.clone(),
                update,
                condition: Some(condition),
                returns: ReturnValues::AllNew,
            })
            .await;
        match r {
            Ok(new) => {
                let last = self.images().get(&req.entity, &req.resource, shard);
                let img = Arc::new(returned_image(new.as_deref(), key, last.as_deref())?);
                self.images()
                    .put(&req.entity, &req.resource, shard, Arc::clone(&img));
                Stats::bump(&self.stats().slow_admits);
                let evals = self.evaluate_all(req, &img, now);
                Ok(Retried::Granted(self.lease(
                    req,
                    shard,
                    key.clone(),
                    &evals,
                    Some(&img),
                    Some(Arc::clone(&img)),
                    s,
                    now,
                )))
            }
            Err(StoreError::ConditionFailed { old }) => {
                let Some(img) = old.as_deref().map(BucketImage::decode).transpose()? else {
                    return Ok(Retried::Replan(None));
                };
                self.images()
                    .put(&req.entity, &req.resource, shard, img.clone());
                if img.disabled {
                    return Err(Error::ResourceDisabled {
                        entity: req.entity.to_string(),
                        resource: req.resource.to_string(),
                    });
                }
                if img.bypass || needs_materialising(&img, req, now) {
                    return Ok(Retried::Replan(Some(img)));
                }
                if s > 1 {
                    return self
                        .entity_acquire(req, s, shard, now)
                        .await
                        .map(Retried::Granted);
                }
                match self.exceeded(req, &[Some(&img)], s, now) {
                    Some(x) => Err(Error::RateLimitExceeded(x)),
                    None => Ok(Retried::Replan(Some(img))),
                }
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// How the consumption-only retry ended.
pub(super) enum Retried {
    /// The debit landed: the lease.
    Granted(Lease),
    /// The item is no longer trusted, or changed shape: plan again, from this image when
    /// the failed write returned one.
    Replan(Option<BucketImage>),
}
