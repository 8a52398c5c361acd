//! The speculative fast path: one conditional write on the drawn shard, probes of the
//! other open shards, doubling when they are all busy.

use smallvec::SmallVec;

use super::*;
use tollgate_core::writes::{route_fast_failure, FastRoute};

/// What one speculative write came to.
pub(super) enum FastOnce {
    /// Written: the lease.
    Admitted(Lease),
    /// Its condition failed: why, with the item as it was (when there was one).
    Refused(FastFailure, Option<BucketImage>),
    /// The store throttled it: the partition is hot.
    Throttled,
}

impl Inner {
    /// ADR-151: whether the next write on `shard` is shaped for bypass — the stamp on the
    /// image this process last saw there when it agrees with the configured mode, the
    /// configured mode otherwise (a stamp that disagrees goes to the slow path, which
    /// confirms the mode and flips the stamp).
    pub(crate) fn guess_bypass(&self, req: &Request, shard: u32) -> bool {
        self.images()
            .get(&req.entity, &req.resource, shard)
            .filter(|img| tollgate_core::bypass::flip(img, req.mode).is_none())
            .map_or(req.bypass, |img| img.bypass)
    }

    /// The speculative write on one shard, then probes and doubling as §4.3 says.
    pub(super) async fn fast(
        self: &Arc<Self>,
        req: &Request,
        shard: u32,
        s: i64,
        now: i64,
        first_at: Option<i64>,
    ) -> Result<Fast> {
        // At most 3 shards are tried: on the stack.
        let mut tried: SmallVec<[u32; 4]> = smallvec::smallvec![shard];
        let mut images: Vec<BucketImage> = Vec::new();
        let mut cur = shard;
        let mut reshaped = false;
        let mut first_at = first_at;
        loop {
            // Each speculative write carries a fresh clock reading: its trust check is only
            // as good as the `now` it compares. The first may carry the one its caller
            // judged the image at, read just before this call.
            let now = first_at.take().unwrap_or_else(|| self.clock().now_ms());
            // ADR-151: shaped by the stamp this process last saw on the shard.
            let guess = self.guess_bypass(req, cur);
            let shaped;
            let req = if guess == req.bypass {
                req
            } else {
                shaped = Request {
                    bypass: guess,
                    ..req.clone()
                };
                &shaped
            };
            let (failure, img) = match self.fast_once(req, cur, now).await? {
                FastOnce::Admitted(lease) => return Ok(Fast::Granted(lease)),
                FastOnce::Throttled => {
                    // Throttled: the partition is hot. Spread out if we can.
                    // Boxed (both bumps): a throttle is rare, and the answer it arrives with
                    // held beside the bump's future would size every fast attempt.
                    let new_s = Box::pin(self.bump(req, s)).await?;
                    if new_s > s {
                        return Ok(Fast::Slow(self.rng().draw(s as u32, new_s as u32), None));
                    }
                    return Ok(Fast::Slow(cur, None));
                }
                FastOnce::Refused(failure, img) => (failure, img),
            };
            match route_fast_failure(failure, img.as_ref(), &req.limits, &req.amounts, now) {
                FastRoute::Disabled => {
                    return Err(Error::ResourceDisabled {
                        entity: req.entity.to_string(),
                        resource: req.resource.to_string(),
                    })
                }
                FastRoute::Slow { with_image } => {
                    return Ok(Fast::Slow(cur, img.filter(|_| with_image).map(Arc::new)))
                }
                FastRoute::Reshape
                    if !reshaped
                        && img.as_ref().is_some_and(|i| {
                            !needs_materialising(i, req, now)
                                && tollgate_core::bypass::flip(i, req.mode).is_none()
                        }) =>
                {
                    // The item's stamp (now cached) decides the shape of the second write.
                    reshaped = true;
                    continue;
                }
                FastRoute::Reshape => return Ok(Fast::Slow(cur, img.map(Arc::new))),
                FastRoute::Double => {
                    let img = img.ok_or_else(|| Error::Corrupt("no image".into()))?;
                    let new_s = Box::pin(self.bump(req, img.shard_count.max(s))).await?;
                    if new_s > s {
                        return Ok(Fast::Slow(self.rng().draw(s as u32, new_s as u32), None));
                    }
                    return Ok(Fast::Slow(cur, Some(Arc::new(img))));
                }
                FastRoute::Probe { remember } => {
                    let img = img.ok_or_else(|| Error::Corrupt("no image".into()))?;
                    if remember {
                        self.rejections()
                            .record(&req.entity, &req.resource, cur, img.clone(), now);
                    }
                    images.push(img);
                }
            }
            // Probe up to 2 untried shards before refusing (ADR-134).
            let s_now = self
                .shards()
                .count(&req.entity, &req.resource)
                .unwrap_or(s)
                .max(s);
            if s_now <= 1 || tried.len() >= 3 || tried.len() as i64 >= s_now {
                break;
            }
            let untried: Vec<u32> = (0..s_now as u32).filter(|x| !tried.contains(x)).collect();
            cur = untried[self.rng().draw(0, untried.len() as u32) as usize];
            tried.push(cur);
        }
        let s_now = self
            .shards()
            .count(&req.entity, &req.resource)
            .unwrap_or(s)
            .max(s);
        if s_now > 1 {
            // Rule "a debit belongs to the entity": the shards probed cannot pay, the
            // entity may (read them all; admit across several, or refuse honestly).
            return match self.entity_acquire(req, s_now, shard, now).await {
                Ok(lease) => Ok(Fast::Granted(lease)),
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
            None => Ok(Fast::Slow(cur, images.pop().map(Arc::new))),
        }
    }

    /// One speculative write on `shard`.
    pub(super) async fn fast_once(
        self: &Arc<Self>,
        req: &Request,
        shard: u32,
        now: i64,
    ) -> Result<FastOnce> {
        // The image this process last saw there names the item (its key is shared) and has
        // its shape (the returned item is decoded like it).
        let last = self.images().get(&req.entity, &req.resource, shard);
        let key = self.shard_key(req, shard, last.as_deref());
        let (update, condition) = if req.bypass {
            tollgate_core::bypass::fast_write(&req.amounts, &req.params_hash, now)
        } else {
            fast_write(&req.amounts, &req.limits, &req.params_hash, now)
        };
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
                let img = Arc::new(returned_image(new.as_deref(), &key, last.as_deref())?);
                self.shards()
                    .raise(&req.entity, &req.resource, img.shard_count);
                self.images()
                    .put(&req.entity, &req.resource, shard, Arc::clone(&img));
                Stats::bump(&self.stats().fast_admits);
                let evals = self.evaluate_all(req, &img, now);
                Ok(FastOnce::Admitted(self.lease(
                    req,
                    shard,
                    key,
                    &evals,
                    Some(&img),
                    Some(Arc::clone(&img)),
                    img.shard_count,
                    now,
                )))
            }
            Err(StoreError::ConditionFailed { old }) => {
                let img = old
                    .as_deref()
                    .map(|i| BucketImage::decode_like(i, key.clone(), last.as_deref()))
                    .transpose()?;
                match &img {
                    Some(i) => {
                        self.shards()
                            .raise(&req.entity, &req.resource, i.shard_count);
                        self.images()
                            .put(&req.entity, &req.resource, shard, i.clone());
                    }
                    None => self.images().forget(&req.entity, &req.resource, shard),
                }
                let f = match &img {
                    Some(i) if req.bypass => {
                        tollgate_core::bypass::classify(i, &req.params_hash, now)
                    }
                    _ => classify_fast_failure(
                        img.as_ref(),
                        &req.amounts,
                        &req.limits,
                        &req.params_hash,
                        now,
                    ),
                };
                Ok(FastOnce::Refused(f, img))
            }
            Err(StoreError::Throttled(_)) => Ok(FastOnce::Throttled),
            Err(e) => Err(e.into()),
        }
    }
}
