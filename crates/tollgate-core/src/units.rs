//! The units that are easy to confuse where they cross a function boundary, as types: an
//! amount of [`Millitokens`], an instant in [`EpochMs`], an entity's [`ShardCount`]. Each is
//! a transparent `i64` (`.0`); the rules that take several of them take them as named
//! fields of one input ([`crate::refill::Drip`], [`crate::grant::GrantShare`]), so a
//! balance cannot be passed where a capacity is meant, nor a shard count where an instant
//! is.

/// An amount in thousandths of a token: balances, capacities, refill amounts, debits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Millitokens(pub i64);

/// An instant: milliseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct EpochMs(pub i64);

/// How many shards an entity's bucket is spread over (1 to
/// [`crate::bucket::MAX_SHARD_COUNT`]); a shard's index is a `u32` below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardCount(pub i64);

impl Default for ShardCount {
    fn default() -> Self {
        ShardCount(1)
    }
}

impl ShardCount {
    /// The count, at least 1 (an item without a count is one shard).
    pub fn get(self) -> i64 {
        self.0.max(1)
    }
}
