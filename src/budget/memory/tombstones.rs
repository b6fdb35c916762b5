//! Settled holds, kept cheaply for as long as their holds would have lived.

use foldhash::HashMap;

/// Settled holds: what a retried settle (`AlreadySettled`) and a replayed
/// reserve need, ~40 bytes each instead of a whole hold. They must answer
/// as long as the hold would have lived (`hold_ttl`, 15 minutes by
/// default), which at thousands of requests per second is millions of
/// entries, so they are never scanned: entries go into `current`; once per
/// `period` (the longest remaining hold lifetime seen) `current` becomes
/// `previous` and the old `previous` is dropped whole. An entry is kept one
/// to two periods and answers only until its own expiry.
#[derive(Default)]
pub(super) struct Tombstones {
    current: HashMap<Box<str>, Tombstone>,
    previous: HashMap<Box<str>, Tombstone>,
    rotated_at: u64,
    period: u64,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Tombstone {
    pub(super) expires_at: u64,
    /// The admission's store time and chosen candidate, for replays.
    pub(super) now_micros: u64,
    pub(super) candidate: usize,
    /// Voided (`BudgetStore::void`): a reserve of the id answers `Voided`.
    pub(super) voided: bool,
}

impl Tombstone {
    /// What a settled (or, with `voided`, voided) hold leaves behind.
    pub(super) fn of(hold: &super::state::Hold, voided: bool) -> Self {
        Tombstone {
            expires_at: hold.expires_at,
            now_micros: hold.admission.now_micros,
            candidate: hold.admission.candidate,
            voided,
        }
    }
}

impl Tombstones {
    /// The unexpired tombstone of `id`.
    pub(super) fn get(&self, id: &str, now: u64) -> Option<Tombstone> {
        self.current
            .get(id)
            .or_else(|| self.previous.get(id))
            .copied()
            .filter(|t| t.expires_at > now)
    }

    pub(super) fn insert(&mut self, id: &str, t: Tombstone, now: u64) {
        // An entry inserted now is dropped two rotations later, at least
        // `period` from now: the period covers its remaining lifetime.
        self.period = self.period.max(t.expires_at.saturating_sub(now));
        self.current.insert(id.into(), t);
    }

    pub(super) fn rotate(&mut self, now: u64) {
        if now >= self.rotated_at.saturating_add(self.period) {
            let old = std::mem::replace(&mut self.previous, std::mem::take(&mut self.current));
            self.rotated_at = now;
            // Freeing millions of entries takes long: not under the store's lock.
            if old.len() > 10_000 {
                let dropped = std::thread::Builder::new()
                    .name("budgetgate-tombstones".into())
                    .spawn(move || drop(old));
                if let Err(e) = dropped {
                    tracing::warn!(error = %e, "could not free settled holds on a thread");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000_000;

    fn stone(expires_at: u64) -> Tombstone {
        Tombstone {
            expires_at,
            now_micros: 0,
            candidate: 0,
            voided: false,
        }
    }

    #[test]
    fn a_tombstone_answers_until_its_expiry_across_rotations_then_is_freed() {
        let mut t = Tombstones::default();
        // Settled at minute 0 and minute 10, each hold living 15 minutes from
        // its admission (the second admitted at minute 5).
        t.insert("a", stone(15 * MIN), 0);
        t.rotate(10 * MIN);
        t.insert("b", stone(20 * MIN), 10 * MIN);
        for now in (0..15 * MIN).step_by(MIN as usize) {
            t.rotate(now);
            assert!(t.get("a", now).is_some(), "a at minute {}", now / MIN);
        }
        t.rotate(15 * MIN);
        assert!(t.get("a", 15 * MIN).is_none(), "expired");
        for now in (15 * MIN..20 * MIN).step_by(MIN as usize) {
            t.rotate(now);
            assert!(t.get("b", now).is_some(), "b at minute {}", now / MIN);
        }
        assert!(t.get("b", 20 * MIN).is_none());
        // Two periods with nothing settled: both generations are gone.
        t.rotate(40 * MIN);
        t.rotate(60 * MIN);
        assert_eq!(t.current.len() + t.previous.len(), 0);
    }
}
