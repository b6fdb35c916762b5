//! The request spans' settlement observer: every settlement the store
//! applied (or never confirmed) becomes one span, handed to the SDK's
//! batch processor (a bounded queue exported on a thread of its own).

use std::sync::{Arc, OnceLock};

use super::Spans;
use crate::clock::Clock;
use crate::settlement::{Observer, Settled};

/// Exports the span of every settlement, while telemetry is on.
pub struct RequestSpans {
    spans: Arc<OnceLock<Arc<Spans>>>,
    clock: Arc<dyn Clock>,
}

impl RequestSpans {
    /// Spans go to the exporter set in `spans` (once, at start), ended at
    /// `clock`'s now.
    pub fn new(spans: Arc<OnceLock<Arc<Spans>>>, clock: Arc<dyn Clock>) -> Self {
        Self { spans, clock }
    }
}

impl Observer for RequestSpans {
    fn settled(&self, e: &Settled<'_>) {
        let (Some(who), Some(spans)) = (&e.subject.who, self.spans.get()) else {
            return;
        };
        if e.recorded() {
            spans.export(e, who, self.clock.now_micros());
        }
    }
}
