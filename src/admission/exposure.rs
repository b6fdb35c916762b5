//! The exposure book (expected-output reservation): per budget, the sum over
//! expected-mode requests in flight on this gateway of what they did not
//! reserve (cap − reserved output). A request takes its share on a budget
//! only while the sum stays within that budget's `max_exposure`, else it
//! reserves its whole cap there. Per gateway, in process: the fleet's
//! bound is `fleet_size × max_exposure` (DESIGN section 5, "Expected
//! output"). Entries at zero are removed, so end users' budgets do not
//! accumulate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use metrics::Gauge;

/// Exposure in use per budget key, tokens.
#[derive(Default)]
pub struct ExposureBook {
    used: Mutex<HashMap<Arc<str>, u64>>,
}

impl ExposureBook {
    /// Takes `amount` on each budget of `budgets` (key, bound) whose
    /// exposure stays within its bound with it; the guard gives it back
    /// when dropped. `taken[i]` says whether budget `i` took it.
    pub fn take(
        self: &Arc<Self>,
        budgets: &[(Arc<str>, u64)],
        amount: u64,
        gauge: Option<Gauge>,
    ) -> (ExposureGuard, Vec<bool>) {
        let mut taken = vec![false; budgets.len()];
        let mut keys = Vec::new();
        if amount > 0 {
            let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
            for (i, (key, bound)) in budgets.iter().enumerate() {
                let now = used.get(key).copied().unwrap_or(0);
                if now.checked_add(amount).is_some_and(|sum| sum <= *bound) {
                    used.insert(key.clone(), now + amount);
                    keys.push(key.clone());
                    taken[i] = true;
                }
            }
        }
        let gauge = gauge.filter(|_| !keys.is_empty());
        if let Some(g) = &gauge {
            g.increment(amount as f64);
        }
        let guard = ExposureGuard {
            book: self.clone(),
            keys,
            amount,
            gauge,
        };
        (guard, taken)
    }

    /// Exposure in use on budget `key`, tokens.
    pub fn in_use(&self, key: &str) -> u64 {
        let used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        used.get(key).copied().unwrap_or(0)
    }

    fn release(&self, keys: &[Arc<str>], amount: u64) {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        for key in keys {
            if let Some(u) = used.get_mut(key) {
                *u = u.saturating_sub(amount);
                if *u == 0 {
                    used.remove(key);
                }
            }
        }
    }
}

/// What one request took; given back exactly once, when dropped (after
/// its settlement is applied, or with a hold that ends otherwise).
pub struct ExposureGuard {
    book: Arc<ExposureBook>,
    keys: Vec<Arc<str>>,
    amount: u64,
    gauge: Option<Gauge>,
}

impl ExposureGuard {
    /// Whether any budget took the request's exposure.
    pub fn took_any(&self) -> bool {
        !self.keys.is_empty()
    }
}

impl Drop for ExposureGuard {
    fn drop(&mut self) {
        if !self.keys.is_empty() {
            self.book.release(&self.keys, self.amount);
            if let Some(g) = &self.gauge {
                g.decrement(self.amount as f64);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budgets(bound: u64) -> Vec<(Arc<str>, u64)> {
        vec![(Arc::from("t"), bound), (Arc::from("k"), bound * 10)]
    }

    #[test]
    fn a_request_takes_its_exposure_only_within_each_bound_and_gives_it_back_once() {
        let book = Arc::new(ExposureBook::default());
        let (a, taken) = book.take(&budgets(100), 60, None);
        assert_eq!(taken, [true, true]);
        // 60 + 60 passes the tenant's 100, not the key's 1000.
        let (b, taken) = book.take(&budgets(100), 60, None);
        assert_eq!(taken, [false, true]);
        assert_eq!((book.in_use("t"), book.in_use("k")), (60, 120));
        drop(a);
        assert_eq!((book.in_use("t"), book.in_use("k")), (0, 60));
        let (c, taken) = book.take(&budgets(100), 100, None);
        assert_eq!(taken, [true, true]);
        drop(b);
        drop(c);
        assert_eq!((book.in_use("t"), book.in_use("k")), (0, 0));
        assert!(
            book.used.lock().unwrap().is_empty(),
            "entries at zero are removed"
        );
    }

    #[test]
    fn nothing_to_expose_takes_nothing() {
        let book = Arc::new(ExposureBook::default());
        let (g, taken) = book.take(&budgets(0), 0, None);
        assert_eq!(taken, [false, false]);
        assert!(!g.took_any());
        let (_g, taken) = book.take(&budgets(0), 1, None);
        assert_eq!(taken, [false, false]);
    }
}
