//! The deny cache's settlement observer: a settlement that refunded tokens
//! clears the deny-cache entries of the hold's refundable budgets (a
//! request the cache would refuse may fit again).

use crate::settlement::{Observer, Settled};

/// Clears the hold's deny-cache entries when its settlement refunded.
pub struct DenyReleaseObserver;

impl Observer for DenyReleaseObserver {
    fn settled(&self, e: &Settled<'_>) {
        let (Some((_, refunded)), Some(d)) = (e.applied_now(), &e.subject.release) else {
            return;
        };
        if refunded > 0 {
            d.cache.forget(&d.keys);
        }
    }
}
