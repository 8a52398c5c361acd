//! The slow pass and the configured mode (rule "a scope's mode is its most specific
//! level's", docs/rules.md): confirming a mode that disagrees with the item's stamp, and
//! putting a stale stamp right on a refusal.

use super::*;

impl Inner {
    /// A refused pass that confirmed the item's bypass stamp stale: lift or set it (with
    /// `vu = 0` when lifting, so the first enforced write materialises), conditioned on the
    /// stamp it found. Best effort: a failure leaves the stamp, which the next pass
    /// questions again.
    pub(super) async fn restamp_mode(
        &self,
        key: &Key,
        shard: u32,
        img: &BucketImage,
        req: &Request,
    ) {
        let Some(to) = tollgate_core::bypass::flip(img, req.mode) else {
            return;
        };
        if !req.mode_confirmed || to != req.bypass {
            return;
        }
        let mode = if to {
            Enforcement::Bypass
        } else {
            Enforcement::Enforce
        };
        let r = self
            .store()
            .update(UpdateRequest {
                key: key.clone(),
                update: mode.stamp_update(),
                condition: Some(
                    Condition::exists("PK")
                        .and(Condition::not_exists(attr::DISABLED))
                        .and(tollgate_core::bypass::stamp(img.bypass)),
                ),
                returns: ReturnValues::None,
            })
            .await;
        match r {
            Ok(_) => self.images().forget(&req.entity, &req.resource, shard),
            Err(e) => {
                tracing::debug!(error = %e, %key, "bypass: the stale stamp was not put right")
            }
        }
    }

    /// A slow pass found the item's stamp disagreeing with the mode this process's cache
    /// holds: resolve the pair again, consistently (the cache keeps the answer, marked
    /// confirmed), and shape the pass by that answer — flipping the stamp when the answer
    /// still disagrees, keeping it when the cache was the stale one, refusing when the
    /// scope is now disabled. A re-read that fails keeps the item's stamp (its shape).
    pub(super) async fn confirm_mode(&self, req: &Request, img: &BucketImage) -> Pass<Request> {
        let now = self.clock().now_ms();
        let res = self
            .config()
            .resolve_confirmed(
                self.store().as_ref(),
                self.ns(),
                &req.entity,
                &req.resource,
                now,
            )
            .await;
        let mode = match res {
            Ok(r) => r.mode,
            Err(e) => {
                tracing::warn!(error = %e, entity = %req.entity, resource = %req.resource,
                    "bypass: the config re-read a disagreeing stamp asked for failed; the stamp stands");
                return Ok(Request {
                    bypass: img.bypass,
                    mode: None,
                    ..req.clone()
                });
            }
        };
        if mode == Some(Enforcement::Disabled) {
            return Err(Flow::Fail(Error::ResourceDisabled {
                entity: req.entity.to_string(),
                resource: req.resource.to_string(),
            }));
        }
        Ok(Request {
            bypass: tollgate_core::bypass::flip(img, mode).unwrap_or(img.bypass),
            mode,
            mode_confirmed: true,
            ..req.clone()
        })
    }
}
