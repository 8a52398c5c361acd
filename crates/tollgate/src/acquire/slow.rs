//! The rf-locked slow path: read (or take a known image), plan, write; after a lost lock,
//! the consumption-only retry or a re-plan. One bounded loop of passes.

use super::*;

impl Inner {
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
    ///
    /// Rule "one rf-locked writer per shard in a process" ([`ShardCache::gate`]): the pass
    /// runs holding the shard's gate; one that waited for it plans from the image the write
    /// before it left, not from the one it came with (one that came with none reads, after
    /// its wait).
    ///
    /// [`ShardCache::gate`]: crate::caches::ShardCache::gate
    pub(crate) async fn slow(
        self: &Arc<Self>,
        req: &Request,
        shard: u32,
        known: Option<Arc<BucketImage>>,
    ) -> Result<Lease> {
        let gate = self.images().gate(&req.entity, &req.resource, shard);
        let (_turn, known) = match gate.try_lock() {
            // A gated write may have landed between this pass's look at the cache and its
            // turn, taken at once: the image it left is planned from when it is the newer.
            Ok(turn) => (Some(turn), known.map(|k| self.newer_image(req, shard, k))),
            Err(_) => match tokio::time::timeout(self.gate_wait(), gate.lock()).await {
                // The image the write ahead left replaces the one brought; a pass that
                // would have read (none brought) reads after its wait.
                Ok(turn) => (
                    Some(turn),
                    known.map(|k| {
                        self.images()
                            .get(&req.entity, &req.resource, shard)
                            .unwrap_or(k)
                    }),
                ),
                // The writer ahead did not finish within a store deadline (a hung or a very
                // slow store): write ungated, as every writer did before the gate — its
                // write is conditioned, at worst it loses the lock — so a queue behind a
                // hung request still answers within its own deadline or two, not one per
                // writer ahead of it (rule "a hung store is an outage").
                Err(_) => (None, known),
            },
        };
        // A known image names its item: its key is shared, not formatted again.
        let key = self.shard_key(req, shard, known.as_deref());
        let r = self
            .slow_passes(req, shard, &key, known, Budget::default())
            .await;
        r.map_err(|e| match e {
            Error::Unavailable(StoreError::TransactionConflict) => Error::Contended {
                entity: req.entity.to_string(),
                resource: req.resource.to_string(),
            },
            e => e,
        })
    }

    /// The image the cache holds for the shard when it is newer than `brought`: its `rf` is
    /// later, and every rf-locked write moves `rf` forward (rule "monotonic rf",
    /// `tollgate_core::writes::next_rf`). Otherwise `brought` — on a tie too, as a failed
    /// write's old item, read from the store, is at least as recent as this process's
    /// cache.
    fn newer_image(
        &self,
        req: &Request,
        shard: u32,
        brought: Arc<BucketImage>,
    ) -> Arc<BucketImage> {
        match self.images().get(&req.entity, &req.resource, shard) {
            Some(cached) if cached.refilled_at_ms > brought.refilled_at_ms => cached,
            _ => brought,
        }
    }

    /// One slow-path pass with its re-plans (no retries across passes), moves as given.
    pub(super) async fn slow_once(
        self: &Arc<Self>,
        req: &Request,
        shard: u32,
        key: &Key,
        moves: bool,
        known: Option<Arc<BucketImage>>,
    ) -> Result<Lease> {
        self.slow_passes(req, shard, key, known, Budget::one_pass(moves))
            .await
    }

    /// Passes under `budget` until it answers.
    async fn slow_passes(
        self: &Arc<Self>,
        req: &Request,
        shard: u32,
        key: &Key,
        known: Option<Arc<BucketImage>>,
        mut budget: Budget,
    ) -> Result<Lease> {
        let mut known = known;
        loop {
            let r = self
                .slow_attempt(req, shard, key, budget.pass_moves, &mut known)
                .await;
            match budget.next(r) {
                Step::Done(r) => return r,
                Step::Replan => {}
                Step::Retry(wait) => {
                    // A fresh pass reads the item again.
                    known = None;
                    if let Some(d) = wait {
                        tokio::time::sleep(d).await;
                    }
                }
            }
        }
    }

    /// One slow-path pass. `known`: the image to plan from instead of reading (taken); a
    /// pass that must be re-planned leaves the image its failed write returned there.
    pub(super) async fn slow_attempt(
        self: &Arc<Self>,
        req: &Request,
        shard: u32,
        key: &Key,
        moves: bool,
        known: &mut Option<Arc<BucketImage>>,
    ) -> Pass<Lease> {
        let img = match known.take() {
            Some(img) => img,
            None => match self.store().get(key, true).await? {
                None => {
                    let now = self.clock().now_ms();
                    // Boxed: a bucket is created once, and its future is the largest
                    // this one holds; held in place it would size every warm attempt.
                    return Box::pin(self.create(req, shard, key, now, moves, known)).await;
                }
                Some(item) => Arc::new(self.decode_shard(req, shard, &item, key.clone())?),
            },
        };
        // The clock is read after the item: a write is only as fresh as the `now` it
        // carries (its refill, its trust horizon).
        let now = self.clock().now_ms();
        if img.disabled {
            return Err(Flow::Fail(Error::ResourceDisabled {
                entity: req.entity.to_string(),
                resource: req.resource.to_string(),
            }));
        }
        // ADR-151: the item's stamp decides the pass's shape (the request only guessed) —
        // unless the configured mode disagrees with it, when this pass flips it (rule "a
        // scope's mode reaches its buckets on their slow pass"), a cached mode confirmed
        // by a consistent read first.
        let shaped;
        let req = match tollgate_core::bypass::flip(&img, req.mode) {
            None if img.bypass == req.bypass => req,
            None => {
                shaped = Request {
                    bypass: img.bypass,
                    ..req.clone()
                };
                &shaped
            }
            Some(to) if req.mode_confirmed => {
                shaped = Request {
                    bypass: to,
                    ..req.clone()
                };
                &shaped
            }
            Some(_) => {
                shaped = self.confirm_mode(req, &img).await?;
                &shaped
            }
        };
        let img_rf = img.refilled_at_ms;
        let cached = self.shards().count(&req.entity, &req.resource).unwrap_or(1);
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
            plan.now.max(self.clock().now_ms())
        };
        // Planned in the core (rule "plan in the core, execute in the limiter"); a grant off
        // shard 0 needs shard 0's count, read consistently unless the seed plan read it.
        let mut input = tollgate_core::plan::SlowPass {
            ask: req.ask(),
            image: &img,
            shard,
            shard_count: ShardCount(cached.max(img.shard_count).max(plan.shard_count)),
            seeds: &plan,
            shard0_count: plan.shard0,
            now: EpochMs(now),
        };
        let pass = loop {
            match tollgate_core::plan::plan_slow_pass(&input) {
                SlowPlan::Pass(p) => break p,
                SlowPlan::ReadShard0 => input.shard0_count = Some(self.shard0_count(req).await?),
            }
        };
        let PassPlan {
            shard_count: ShardCount(s),
            evals,
            pin,
            outcome,
        } = pass;
        self.shards().raise(&req.entity, &req.resource, s);
        let exceeded = |st| Box::new(Exceeded::new(&req.entity, &req.resource, st));
        let (write, refusal) = match outcome {
            PassOutcome::Refused(st) => {
                // A refusal writes nothing, but a stamp this pass found stale is put right.
                self.restamp_mode(key, shard, &img, req).await;
                self.rejections()
                    .record(&req.entity, &req.resource, shard, img, now);
                if s > 1 {
                    return self
                        .entity_acquire(req, s, shard, now)
                        .await
                        .map_err(Flow::from);
                }
                return Err(Flow::Fail(Error::RateLimitExceeded(exceeded(st))));
            }
            PassOutcome::Write { write, refused } => (write, refused.map(exceeded)),
        };
        let rf_written = write.refilled_at_ms;
        let write = Self::rf_locked(key, write.update, write.condition);
        let landed = self
            .commit_slot(req, shard, TransactOp::Update(write), &plan.moves, pin)
            .await?;
        match (landed, refusal) {
            (Landed::Wrote(_), Some(x)) => {
                self.images().forget(&req.entity, &req.resource, shard);
                if s > 1 {
                    return self
                        .entity_acquire(req, s, shard, now)
                        .await
                        .map_err(Flow::from);
                }
                Err(Flow::Fail(Error::RateLimitExceeded(x)))
            }
            (Landed::Wrote(new), None) => {
                Stats::bump(&self.stats().slow_admits);
                self.rejections().forget(&req.entity, &req.resource, shard);
                for m in &plan.moves {
                    self.rejections()
                        .forget(&req.entity, &req.resource, m.shard);
                }
                let new = self.remember(req, shard, key, new.as_deref(), Some(&img))?;
                debug_assert!(new.as_ref().is_none_or(|n| n.refilled_at_ms == rf_written));
                self.after_materialise(req, shard, s, &evals).await;
                Ok(self.lease(req, shard, key.clone(), &evals, None, new, s, now))
            }
            (Landed::LostLock(old), _) => {
                let old = old.as_deref().map(BucketImage::decode).transpose()?;
                // Boxed, as `create` above: a lost lock is rare, its future large.
                Box::pin(self.after_lost_lock(req, shard, key, s, img_rf, &evals, old, now, known))
                    .await
            }
        }
    }
}

/// What the slow path does after a pass (see [`Budget::next`]).
// The answer is held in place, not boxed: a step is made on every slow pass and consumed
// at once, so its size costs a copy while a box cost an allocation per acquire.
#[allow(clippy::large_enum_variant)]
enum Step {
    /// Answer.
    Done(Result<Lease>),
    /// Plan again at once, from the image the failed write returned (kept in `known`).
    Replan,
    /// A fresh pass (a new read), after the back-off when there is one.
    Retry(Option<std::time::Duration>),
}

/// The slow path's one bounded retry budget. Per pass: up to 6 re-reads, and a lost move
/// re-plans once, then seeds with moves disabled (ADR-145). Across passes: a retryable
/// store error is retried 3 times with back-off; a transaction that keeps conflicting is
/// retried once more with quota moves disabled, and then the pass conflicts for good
/// (rule "contention is not an outage", Q11: the caller reports [`Error::Contended`]).
#[derive(Debug)]
struct Budget {
    /// Whether failed passes are retried (off: one pass with its re-plans).
    across_passes: bool,
    attempt: u32,
    /// Moves allowed across passes (off once a transaction kept conflicting).
    moves: bool,
    /// Moves allowed in this pass (off after a second lost move; a fresh pass resets it).
    pass_moves: bool,
    replanned: bool,
    rereads: u32,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            across_passes: true,
            attempt: 0,
            moves: true,
            pass_moves: true,
            replanned: false,
            rereads: 0,
        }
    }
}

impl Budget {
    fn one_pass(moves: bool) -> Self {
        Budget {
            across_passes: false,
            moves,
            pass_moves: moves,
            ..Budget::default()
        }
    }

    fn next(&mut self, r: Pass<Lease>) -> Step {
        match r {
            Err(Flow::Reread) if self.rereads < 6 => {
                self.rereads += 1;
                return Step::Replan;
            }
            Err(Flow::MoveLost) if !self.replanned => {
                self.replanned = true;
                return Step::Replan;
            }
            Err(Flow::MoveLost) if self.pass_moves => {
                self.pass_moves = false;
                return Step::Replan;
            }
            _ => {}
        }
        let r = r.map_err(Flow::into_error);
        if !self.across_passes {
            return Step::Done(r);
        }
        match r {
            Err(Error::Unavailable(e)) if e.is_retryable() && self.attempt < 3 => {
                let wait = backoff(self.attempt);
                self.attempt += 1;
                self.fresh_pass();
                Step::Retry(Some(wait))
            }
            Err(Error::Unavailable(StoreError::TransactionConflict)) if self.moves => {
                tracing::debug!("transaction keeps conflicting: retrying without quota moves");
                self.moves = false;
                self.attempt = 0;
                self.fresh_pass();
                Step::Retry(None)
            }
            r => Step::Done(r),
        }
    }

    fn fresh_pass(&mut self) {
        self.pass_moves = self.moves;
        self.replanned = false;
        self.rereads = 0;
    }
}
