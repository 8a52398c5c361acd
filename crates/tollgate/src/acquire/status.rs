//! Statuses and refusals: every limit's view of the entity after (or instead of) a debit.

use super::*;

impl Inner {
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
                    img.refilled_at_ms,
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
        after: Option<Arc<BucketImage>>,
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
                    (
                        st.and_then(|st| st.window_start_ms),
                        st.and_then(|st| st.period_applied_ms),
                        img.refilled_at_ms,
                    )
                }
                None => (e.window_start_ms, e.period_applied_ms, now),
            };
            if let Some(p) = refund_pin(l, ws, pe, rf) {
                pins.insert(l.name().to_string(), p);
            }
            if let Some((_, a)) = req.amounts.iter().find(|(n, _)| n == l.name()) {
                // The write landed: a window this pass opened is in force now.
                let after = Evaluated {
                    balance: if debited || req.bypass {
                        e.balance
                    } else {
                        e.balance - a
                    },
                    opened: false,
                    ..e.clone()
                };
                // `after` carries `e`'s remainder.
                let view = ShardView::of(&after, s);
                statuses.push(limit_status(l, &[view], *a, false, now));
            }
        }
        // Inserted one by one: collecting into a map first gathers the pairs in a vector.
        let mut held = BTreeMap::new();
        for (n, a) in req.amounts.iter() {
            held.insert(n.clone(), *a);
        }
        let part = Part {
            shard,
            key,
            held,
            pins,
            image: after,
            bypassed: req.bypass,
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
        if req.bypass || images.iter().flatten().any(|i| i.bypass) {
            // ADR-151: nothing refuses on a bypassed item (the caller writes it instead).
            return None;
        }
        let statuses = self.statuses(req, images, s, now, Some(&req.amounts));
        statuses
            .iter()
            .any(|s| s.exceeded)
            .then(|| Box::new(Exceeded::new(&req.entity, &req.resource, statuses)))
    }

    /// [`tollgate_core::plan::entity_statuses`] of the limits `req` names.
    pub(crate) fn statuses(
        &self,
        req: &Request,
        images: &[Option<&BucketImage>],
        s: i64,
        now: i64,
        judged: Option<&[(String, i64)]>,
    ) -> Vec<LimitStatus> {
        tollgate_core::plan::entity_statuses(&req.limits, &req.amounts, images, s, now, judged)
    }

    /// [`tollgate_core::plan::refusal`], as the error it answers.
    pub(super) fn refuse(
        &self,
        req: &Request,
        evals: &[Evaluated],
        s: i64,
        now: i64,
    ) -> Option<Box<Exceeded>> {
        tollgate_core::plan::refusal(&req.ask(), evals, s, now)
            .map(|st| Box::new(Exceeded::new(&req.entity, &req.resource, st)))
    }
}
