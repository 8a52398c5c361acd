//! The slow path's normal write (rf-locked, materialising; planned in
//! `tollgate_core::plan`) as a store request, and remembering the image a write returned.

use super::*;

impl Inner {
    /// [`tollgate_core::plan::materialising_write`] on `key`, returning the new image
    /// (`ALL_NEW`) and the `rf` it stamps.
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
        let w = tollgate_core::plan::materialising_write(
            &req.ask(),
            img,
            evals,
            amounts,
            charging,
            now,
        );
        (
            Self::rf_locked(key, w.update, w.condition),
            w.refilled_at_ms,
        )
    }

    /// The store request of a planned rf-locked write (it returns the new item).
    pub(crate) fn rf_locked(key: &Key, update: Update, condition: Condition) -> UpdateRequest {
        UpdateRequest {
            key: key.clone(),
            update,
            condition: Some(condition),
            returns: ReturnValues::AllNew,
        }
    }

    /// Decode an item of `shard` read or returned by a write, like the image this process
    /// last saw there or another bucket of the same shape ([`BucketImage::decode_known`]:
    /// a shape seen before is decoded by place).
    pub(crate) fn decode_shard(
        &self,
        req: &Request,
        shard: u32,
        item: &tollgate_core::value::Item,
        key: Key,
    ) -> Result<BucketImage> {
        self.decode_shard_like(req, shard, item, key, None)
    }

    /// [`Inner::decode_shard`], like `planned` when there is one (the image a write was
    /// planned from: no look-up in the cache).
    fn decode_shard_like(
        &self,
        req: &Request,
        shard: u32,
        item: &tollgate_core::value::Item,
        key: Key,
        planned: Option<&BucketImage>,
    ) -> Result<BucketImage> {
        let images = self.images();
        let cached = match planned {
            Some(_) => None,
            None => images.get(&req.entity, &req.resource, shard),
        };
        let like = planned.or(cached.as_deref());
        Ok(BucketImage::decode_known(item, key, like, images.shapes())?)
    }

    /// Remember the image a write returned (`ALL_NEW`) for the next plan; `None` when the
    /// write returned nothing (a transaction): the shard's entry is dropped. `planned`: the
    /// image the write was planned from, when there is one — the returned item is decoded
    /// like it (by its layout, when the names are the same: the image is the same either
    /// way), with no look-up in the cache.
    pub(crate) fn remember(
        &self,
        req: &Request,
        shard: u32,
        key: &Key,
        new: Option<&tollgate_core::value::Item>,
        planned: Option<&BucketImage>,
    ) -> Result<Option<Arc<BucketImage>>> {
        match new {
            Some(i) => {
                let img = Arc::new(self.decode_shard_like(req, shard, i, key.clone(), planned)?);
                self.images()
                    .put(&req.entity, &req.resource, shard, Arc::clone(&img));
                Ok(Some(img))
            }
            None => {
                self.images().forget(&req.entity, &req.resource, shard);
                Ok(None)
            }
        }
    }
}
