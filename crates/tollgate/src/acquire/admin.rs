//! Administrative calls on the buckets: double an entity's shards (its modes are in
//! `enforce`).

use super::*;

impl Limiter {
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
            bypass: false,
            mode: None,
            mode_confirmed: false,
        };
        self.inner.bump(&req, old).await
    }
}
