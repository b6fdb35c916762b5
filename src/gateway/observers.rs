//! The settlement observers of the gateway, registered here and nowhere
//! else: every settlement the store answered is told to each, in this
//! order. A new observer is a file in its own module and one line here.
//! (It goes with [`super::AppState`], which builds the list.)

use std::sync::{Arc, OnceLock};

use crate::clock::Clock;
use crate::settlement::{Observer, Observers};

/// The observers of a gateway whose ledger and request spans are set (at
/// start) in `ledger` and `spans`, whose waiting lines are `queue`, and
/// whose clock is `clock`.
pub fn observers(
    queue: &Arc<crate::queue::Queue>,
    ledger: &Arc<OnceLock<Arc<crate::ledger::Ledger>>>,
    spans: &Arc<OnceLock<Arc<crate::telemetry::Spans>>>,
    clock: &Arc<dyn Clock>,
) -> Observers {
    // The deny cache first, then the queue: a waiter woken for capacity
    // must not meet an entry the refund cleared. Then what only records.
    let list: Vec<Arc<dyn Observer>> = vec![
        Arc::new(crate::admission::deny_release::DenyReleaseObserver),
        Arc::new(crate::queue::settlement::CapacityReturned::new(
            queue.clone(),
        )),
        Arc::new(crate::metrics::settlement::TenantSettlements),
        Arc::new(crate::ledger::LedgerRows::new(ledger.clone())),
        Arc::new(crate::telemetry::settlement::RequestSpans::new(
            spans.clone(),
            clock.clone(),
        )),
    ];
    Observers::new(list)
}
