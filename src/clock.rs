//! The only module that reads the wall clock. Everything else receives `now`
//! as UTC microseconds since the Unix epoch from a [`Clock`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in UTC microseconds since the Unix epoch.
///
/// Calendar quotas need a calendar, so budget time is wall-clock time, not a
/// monotonic instant; stores protect themselves against a clock that steps
/// backwards by using `max(now, last)` per record.
pub trait Clock: Send + Sync + 'static {
    /// Current time, UTC microseconds since 1970-01-01T00:00:00Z.
    fn now_micros(&self) -> u64;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_micros(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0)
    }
}

/// A clock that only moves when a test moves it. Clones share the same time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    micros: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock frozen at `start_micros` (UTC microseconds).
    pub fn new(start_micros: u64) -> Self {
        Self {
            micros: Arc::new(AtomicU64::new(start_micros)),
        }
    }

    /// Moves the clock forward by `delta_micros` microseconds.
    pub fn advance(&self, delta_micros: u64) {
        self.micros.fetch_add(delta_micros, Ordering::SeqCst);
    }

    /// Sets the clock to `micros` (UTC microseconds); may move backwards,
    /// which stores must tolerate.
    pub fn set(&self, micros: u64) {
        self.micros.store(micros, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> u64 {
        self.micros.load(Ordering::SeqCst)
    }
}
