//! The tenant metrics' settlement observer: a settlement the store applied
//! counts its tokens (settled, refunded, debt, the estimate ratio) and its
//! cost in the hold's tenant's series.

use super::TenantMetrics;
use crate::settlement::{Observer, Settled, Tally};

/// Counts applied settlements in their tenant's series.
pub struct TenantSettlements;

impl Observer for TenantSettlements {
    fn settled(&self, e: &Settled<'_>) {
        let (Some((reserved, _)), Some(t)) = (e.applied_now(), &e.subject.tenant) else {
            return;
        };
        t.settled(reserved, e.made.settlement.actual_tokens);
        if let Some(micros) = e.made.cost_micros {
            t.spent(micros);
        }
    }
}

impl Tally for TenantMetrics {
    fn settled(&self, estimated: u64, actual: u64) {
        TenantMetrics::settled(self, estimated, actual)
    }

    fn spent(&self, micros: u64) {
        TenantMetrics::spent(self, micros)
    }
}
