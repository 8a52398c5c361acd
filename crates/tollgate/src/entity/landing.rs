//! What an entity-wide charge carries in from a lease ([`RideAlong`]) and where it lands
//! ([`Landing`]).

use std::collections::BTreeMap;

use tollgate_core::expr::Condition;
use tollgate_core::value::Key;

/// Refunds that ride in the transaction of an entity-wide charge: a lease's refunds on
/// the shards it holds tokens on, landing all or none with its usage.
#[derive(Debug, Clone)]
pub(crate) struct RideAlong<'a> {
    /// The shard.
    pub shard: u32,
    /// Milli returned per limit (positive).
    pub refunds: Vec<(String, i64)>,
    /// Per quota limit: the condition under which the refund still credits the balance
    /// (its period); otherwise it is recorded in `tc` only.
    pub pins: &'a BTreeMap<String, Condition>,
    /// The entity is in debt: the dripping refunds repay it over every shard from the
    /// bottom up (`tollgate_core::spread::plan_refund`) rather than landing on `shard`.
    pub spread: bool,
}

/// Where part of a charge landed: the shard, its key, and the milli charged per limit
/// (negative: refunded).
#[derive(Debug, Clone)]
pub(crate) struct Landing {
    /// The shard.
    pub shard: u32,
    /// Its bucket key.
    pub key: Key,
    /// Milli per limit.
    pub charged: Vec<(String, i64)>,
}
