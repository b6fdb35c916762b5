//! The wait queue's settlement observer: a settlement the store applied
//! gave capacity back (its slots, and its refund) to the hold's budgets,
//! and the lines waiting for them try again now.

use std::sync::Arc;

use super::Queue;
use crate::settlement::{Observer, Settled};

/// Wakes the lines of the budgets a settlement returned capacity to.
pub struct CapacityReturned {
    queue: Arc<Queue>,
}

impl CapacityReturned {
    /// Wakes lines of `queue`.
    pub fn new(queue: Arc<Queue>) -> Self {
        Self { queue }
    }
}

impl Observer for CapacityReturned {
    fn settled(&self, e: &Settled<'_>) {
        let (Some((_, refunded)), Some(r)) = (e.applied_now(), &e.subject.returned) else {
            return;
        };
        self.queue
            .capacity_returned_each(|key| r.each(refunded, key));
    }
}
