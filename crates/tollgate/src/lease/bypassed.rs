//! Settling a lease granted while its scope was bypassed (ADR-151): its adjustments and
//! rollback are recorded in `tc` only.

use tollgate_core::expr::Condition;

use super::Lease;
use crate::error::Result;

impl Lease {
    /// ADR-151: finish a lease debited while bypassed — its adjustments (or, for a
    /// rollback, everything it holds, as a refund) are recorded in `tc` only, in one write
    /// on its part: no balance was debited, so none is credited or charged.
    pub(super) async fn finish_bypassed(&mut self, rollback: bool) -> Result<()> {
        let Some(lim) = self.lim.clone() else {
            return Ok(());
        };
        let deltas: Vec<(String, i64)> = if rollback {
            self.pending.clear();
            self.parts[0]
                .held
                .iter()
                .filter(|(_, h)| **h != 0)
                .map(|(n, h)| (n.clone(), -h))
                .collect()
        } else {
            std::mem::take(&mut self.pending)
                .into_iter()
                .filter(|(_, d)| *d != 0)
                .collect()
        };
        if deltas.is_empty() {
            return Ok(());
        }
        let names = tollgate_core::bypass::tc_only(&deltas);
        let u = tollgate_store::UpdateRequest {
            key: self.parts[0].key.clone(),
            update: tollgate_core::writes::adjust_write(&deltas, &names, lim.clock().now_ms()),
            condition: Some(Condition::exists("PK")),
            returns: tollgate_core::expr::ReturnValues::None,
        };
        lim.store().update(u).await?;
        for (n, d) in deltas {
            *self.parts[0].held.entry(n).or_default() += d;
        }
        Ok(())
    }
}
