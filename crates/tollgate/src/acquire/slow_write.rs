//! The slow path's normal write (rf-locked, materialising) and remembering the image a
//! write returned.

use super::*;

impl Inner {
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
            vu: if req.bypass {
                Some(tollgate_core::bypass::VALID_UNTIL)
            } else {
                valid_until(&req.limits, evals, now)
            },
            ttl: req.ttl,
            ph: &req.ph,
        };
        let (update, condition) =
            normal_write(img.rf, &stamp, &req.limits, evals, &wcu, amounts, charging);
        let mut update = tollgate_core::usage::stamp_write_time(update, now);
        // A pass shaped by the configured mode against the item's stamp flips the stamp
        // (conditioned below on the one it found).
        match tollgate_core::bypass::flip(img, req.mode) {
            Some(true) if req.bypass => update = update.set(attr::BYPASS, true),
            Some(false) if !req.bypass => update = update.remove(attr::BYPASS),
            _ => {}
        }
        (
            UpdateRequest {
                key: key.clone(),
                update: update.set(attr::CASCADE, req.cascade),
                condition: Some(
                    condition
                        .and(Condition::not_exists(attr::DISABLED))
                        .and(tollgate_core::bypass::stamp(img.bypass)),
                ),
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
    ) -> Result<Option<Arc<BucketImage>>> {
        match new {
            Some(i) => {
                let img = Arc::new(BucketImage::decode(i)?);
                self.images
                    .put(&req.entity, &req.resource, shard, Arc::clone(&img));
                Ok(Some(img))
            }
            None => {
                self.images.forget(&req.entity, &req.resource, shard);
                Ok(None)
            }
        }
    }
}
