//! What the feed-aggregator examples (`aggregate_pass`, `aggregate_absorb`) share: their
//! three counts from the command line, and a limiter on a memory store with its change feed,
//! with a limit that never refuses stored for resource `api` ([`RESOURCE`], limit
//! [`LIMIT`]), and an aggregator over that feed.

use std::sync::Arc;

use tollgate::{FeedAggregator, Limit, Limiter, Scope, UsageOptions};
use tollgate_store::MemoryStore;

/// The resource the examples acquire.
pub const RESOURCE: &str = "api";
/// Its one limit: 1,000,000,000 a second.
pub const LIMIT: &str = "rps";

/// The first three arguments as counts (each at least 1), `defaults` for those not given.
pub fn counts(defaults: [usize; 3]) -> Result<[usize; 3], std::num::ParseIntError> {
    let mut args = std::env::args().skip(1);
    let mut out = defaults;
    for n in &mut out {
        if let Some(a) = args.next() {
            *n = a.parse()?;
        }
        *n = (*n).max(1);
    }
    Ok(out)
}

/// A limiter on a fresh memory store with its change feed, [`LIMIT`] stored for
/// [`RESOURCE`], and an aggregator over the feed with `opts`.
pub async fn limiter_on_feed(
    opts: UsageOptions,
) -> Result<(Limiter, FeedAggregator), Box<dyn std::error::Error>> {
    let store = Arc::new(MemoryStore::with_change_feed());
    let lim = Limiter::new(store.clone())?;
    let agg = FeedAggregator::new(&lim, store, opts)?;
    lim.admin()
        .set_limits(
            &Scope::Resource(RESOURCE.into()),
            &[Limit::per_second(LIMIT, 1_000_000_000)?],
        )
        .await?;
    Ok((lim, agg))
}
