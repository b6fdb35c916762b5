//! This gateway's demand on one budget: requests and units per second,
//! counted in whole-second slots of the monotonic clock.
//!
//! The rate a lease is sized by is the larger of the last complete second
//! and the current one so far: a burst shows at once, a lull only after a
//! full second (so a lease is not given back between two bursts).

/// Microseconds per slot.
const SLOT: u64 = 1_000_000;
/// Microseconds per quarter slot: a budget becomes hot within a quarter
/// second of its rate passing `min_rate`, not a whole second (every
/// request before that costs the store two calls).
const QUARTER: u64 = SLOT / 4;

/// Requests and units asked of one budget, per second.
#[derive(Debug, Clone, Copy, Default)]
pub struct Demand {
    slot: u64,
    requests: u64,
    units: u64,
    prev_requests: u64,
    prev_units: u64,
    /// Slot of the last request.
    last: u64,
    quarter: u64,
    quarter_requests: u64,
    quarter_units: u64,
}

impl Demand {
    /// Counts one request asking `units` at monotonic time `now` (µs).
    pub fn count(&mut self, units: u64, now: u64) {
        self.roll(now);
        self.last = self.slot;
        let q = now / QUARTER;
        if q != self.quarter {
            self.quarter = q;
            self.quarter_requests = 0;
            self.quarter_units = 0;
        }
        self.quarter_requests += 1;
        self.quarter_units = self.quarter_units.saturating_add(units);
        self.requests += 1;
        self.units = self.units.saturating_add(units);
    }

    /// Requests per second.
    pub fn requests_per_sec(&mut self, now: u64) -> u64 {
        self.roll(now);
        self.prev_requests.max(self.requests)
    }

    /// Requests per second as the current quarter second shows them (at
    /// least the whole-second rate).
    pub fn quick_requests_per_sec(&mut self, now: u64) -> u64 {
        let q = if now / QUARTER == self.quarter {
            self.quarter_requests * 4
        } else {
            0
        };
        self.requests_per_sec(now).max(q)
    }

    /// Units per second as the current quarter second shows them (at
    /// least the whole-second rate).
    pub fn quick_units_per_sec(&mut self, now: u64) -> u64 {
        let q = if now / QUARTER == self.quarter {
            self.quarter_units * 4
        } else {
            0
        };
        self.units_per_sec(now).max(q)
    }

    /// Takes back one request of `units` counted at `now` (one the store
    /// failed to decide: an outage's retries are not demand).
    pub fn uncount(&mut self, units: u64, now: u64) {
        self.roll(now);
        self.requests = self.requests.saturating_sub(1);
        self.units = self.units.saturating_sub(units);
        if now / QUARTER == self.quarter {
            self.quarter_requests = self.quarter_requests.saturating_sub(1);
            self.quarter_units = self.quarter_units.saturating_sub(units);
        }
    }

    /// Units per second.
    pub fn units_per_sec(&mut self, now: u64) -> u64 {
        self.roll(now);
        self.prev_units.max(self.units)
    }

    /// Seconds since the last request (0 within the current slot).
    pub fn idle_slots(&self, now: u64) -> u64 {
        (now / SLOT).saturating_sub(self.last)
    }

    fn roll(&mut self, now: u64) {
        let slot = now / SLOT;
        if slot == self.slot {
            return;
        }
        if slot == self.slot + 1 {
            self.prev_requests = self.requests;
            self.prev_units = self.units;
        } else {
            self.prev_requests = 0;
            self.prev_units = 0;
        }
        self.requests = 0;
        self.units = 0;
        self.slot = slot;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_shows_at_once_and_a_lull_after_a_full_second() {
        let mut d = Demand::default();
        for i in 0..60 {
            d.count(10, 5_000_000 + i * 1000);
        }
        assert_eq!(d.requests_per_sec(5_100_000), 60);
        assert_eq!(d.units_per_sec(5_100_000), 600);
        // The next second: the last complete one still counts.
        assert_eq!(d.requests_per_sec(6_500_000), 60);
        // Two seconds on with nothing: no demand.
        assert_eq!(d.requests_per_sec(7_000_000), 0);
        assert_eq!(d.idle_slots(7_000_000), 2);
    }
}
