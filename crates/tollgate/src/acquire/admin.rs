//! Administrative calls on the buckets: double an entity's shards (its modes are in
//! `enforce`).

use super::*;

impl Limiter {
    /// The implementation of [`crate::Admin::bump_shard_count`].
    #[cfg(feature = "testing")]
    pub(crate) async fn bump_shard_count(
        &self,
        entity: &str,
        resource: &str,
        old: i64,
    ) -> Result<i64> {
        validate_entity_id(entity)?;
        validate_resource(resource)?;
        let req = Request {
            entity: entity.into(),
            resource: resource.into(),
            amounts: Arc::from([]),
            limits: Vec::new().into(),
            params_hash: "".into(),
            ttl: TtlWrite::Remove,
            cascade: false,
            bypass: false,
            mode: None,
            mode_confirmed: false,
        };
        self.inner().bump(&req, old).await
    }
}
