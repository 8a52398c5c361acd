//! The entity-wide debit's entry point for a lease's usage its shard cannot cover
//! ([`Inner::entity_charge`]); an acquire's is in the acquire module (`across`).

use std::sync::Arc;

use tollgate_store::StoreError;

use crate::error::{Error, Result};
use crate::limiter::Inner;
use crate::request::Request;

use super::{Charged, Landing, RideAlong};

impl Inner {
    /// A lease's usage its shard cannot cover: charge it across the entity (debt levelled),
    /// with the lease's `refunds` in the same transaction.
    pub(crate) async fn entity_charge(
        self: &Arc<Self>,
        req: &Request,
        s: i64,
        preferred: u32,
        usage: &[(String, i64)],
        refunds: &[RideAlong<'_>],
    ) -> Result<Vec<Landing>> {
        match self
            .entity_debit(req, s, preferred, usage, true, refunds)
            .await?
        {
            Charged::Landed(parts) => Ok(parts.into_iter().map(|t| t.landing).collect()),
            Charged::Short(_) => Err(Error::Unavailable(StoreError::TransactionConflict)),
        }
    }
}
