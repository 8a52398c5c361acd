//! Administrative calls on the buckets: disable an entity's resource, double its shards.

use super::*;

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
        inner.images.clear();
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
            limits: Vec::new().into(),
            ph: "".into(),
            ttl: TtlWrite::Remove,
            cascade: false,
        };
        self.inner.bump(&req, old).await
    }
}
