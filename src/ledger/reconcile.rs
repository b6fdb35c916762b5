//! The ledger reconciled against the budgets (docs/LEDGER.md
//! "Reconciliation"): for a calendar quota (tokens or µ$, per day or month)
//! the store's counter and the ledger's sum over the same window differ by
//! known causes, each bounded by what the gateway can read:
//!
//! - the store counts more than the ledger by the **holds in flight**
//!   (reserved, not settled: no row yet), the **units out on leases**
//!   (debited from the store at the grant, spent or given back later), the
//!   **rows still buffered** (settled, not yet written), the **rows the
//!   ledger dropped** (buffer full during a database outage, summed when
//!   dropped), **retention** (rows deleted past `ledger.retention_days`,
//!   when the window starts before the cutoff) and the rows **lost in a
//!   crash** (at most the crashed run's buffer, [`super::crash`]; in units,
//!   that many rows of the largest charge the window's rows hold, or, none
//!   surviving, of the largest request the tenant's budgets admit,
//!   [`crash_bound`]);
//! - the ledger counts more than the store by the **window boundary** (a
//!   request admitted before midnight and settled after counts in the
//!   store's window of its admission, the ledger's row in the day of its
//!   settlement: at most the rows settled within one request's lifetime
//!   after the window's start), the rows **served by the fail-open
//!   limiter** (a `fail_open` tenant's requests while the store failed:
//!   their spend never reached the store's counters, at most what those
//!   rows of the window charged) and a **store reset** (the store's counter
//!   started after the window's first ledger row: a flushed Redis, a
//!   memory store restarted without a snapshot).
//!
//! Each cause explains at most its bound, in the order above; what is left
//! is unexplained. [`explain`] is the arithmetic; the admin route
//! (`server::reconcile`) reads the inputs.

use serde::Serialize;

/// What one quota's reconciliation reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inputs {
    /// What the store's counter holds for the window (limit − remaining).
    pub store: i64,
    /// The ledger's sum for the window, in the quota's unit.
    pub ledger: u64,
    /// Units of holds in flight on the quota (`None`: not read).
    pub holds: Option<u64>,
    /// Units out on leases of the quota (`None`: leases off or not read).
    pub leases: Option<u64>,
    /// Units of rows settled in the window still in this gateway's buffer.
    pub buffered: u64,
    /// Units of rows of the window this gateway dropped.
    pub dropped: u64,
    /// Rows of the window may be past the ledger's retention.
    pub retention: bool,
    /// Units a crash may have lost in the window (`None`: no crash known).
    pub crash: Option<u64>,
    /// Units of ledger rows settled within one request's lifetime after
    /// the window's start (they may count in the previous window in the store).
    pub boundary: u64,
    /// Units of the window's ledger rows whose reservation the fail-open
    /// limiter admitted (the store never counted them).
    pub fail_open: u64,
    /// The store's counter started after the window's first ledger row.
    pub store_reset: bool,
}

/// One cause and what it explains, in the quota's unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cause {
    /// Its name (`holds_in_flight`, `leases_out`, `buffered`, `dropped`,
    /// `retention`, `lost_in_a_crash`, `window_boundary`,
    /// `served_by_fail_open_limiter`, `store_reset`).
    pub cause: &'static str,
    /// What it could explain at most (`None`: unbounded).
    pub bound: Option<u64>,
    /// What it explains of this difference.
    pub explains: u64,
}

/// A quota reconciled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Explained {
    /// Store − ledger.
    pub difference: i64,
    /// The causes that explain part of it, in order.
    pub causes: Vec<Cause>,
    /// What no known cause explains (same sign as the difference).
    pub unexplained: i64,
}

/// What a crash may have lost of a quota, in its unit: the crashed run's
/// `buffer_rows`, each at most the window's largest surviving row or, when
/// none survived (every row of the window was still buffered: a window
/// that began shortly before the crash), the largest request the
/// tenant's own budgets admit (`largest_admissible`: a larger one is
/// refused before it reserves).
pub fn crash_bound(buffer_rows: u64, largest_row: u64, largest_admissible: u64) -> u64 {
    let per_row = match largest_row {
        0 => largest_admissible,
        row => row,
    };
    buffer_rows.saturating_mul(per_row)
}

/// Explains `i`'s difference by its causes (module docs).
pub fn explain(i: &Inputs) -> Explained {
    let difference = i.store - i.ledger as i64;
    let mut left = difference.unsigned_abs();
    let mut causes = Vec::new();
    let mut take = |cause: &'static str, bound: Option<u64>| {
        let explains = bound.map_or(left, |b| b.min(left));
        left -= explains;
        if explains > 0 || bound.is_some_and(|b| b > 0) {
            causes.push(Cause {
                cause,
                bound,
                explains,
            });
        }
    };
    if difference > 0 {
        take("holds_in_flight", Some(i.holds.unwrap_or(0)));
        take("leases_out", Some(i.leases.unwrap_or(0)));
        take("buffered", Some(i.buffered));
        take("dropped", Some(i.dropped));
        if i.retention {
            take("retention", None);
        }
        if let Some(c) = i.crash {
            take("lost_in_a_crash", Some(c));
        }
    } else if difference < 0 {
        take("window_boundary", Some(i.boundary));
        take("served_by_fail_open_limiter", Some(i.fail_open));
        if i.store_reset {
            take("store_reset", None);
        }
    }
    let unexplained = if difference < 0 {
        -(left as i64)
    } else {
        left as i64
    };
    Explained {
        difference,
        causes,
        unexplained,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(e: &Explained) -> Vec<(&'static str, u64)> {
        e.causes.iter().map(|c| (c.cause, c.explains)).collect()
    }

    #[test]
    fn equal_sums_need_no_cause() {
        let e = explain(&Inputs {
            store: 100,
            ledger: 100,
            ..Default::default()
        });
        assert_eq!((e.difference, e.unexplained), (0, 0));
        assert!(e.causes.is_empty());
    }

    #[test]
    fn a_larger_store_is_explained_in_order_up_to_each_bound() {
        let e = explain(&Inputs {
            store: 1_000,
            ledger: 600,
            holds: Some(100),
            leases: Some(150),
            buffered: 50,
            dropped: 20,
            ..Default::default()
        });
        assert_eq!(e.difference, 400);
        assert_eq!(
            names(&e),
            vec![
                ("holds_in_flight", 100),
                ("leases_out", 150),
                ("buffered", 50),
                ("dropped", 20)
            ]
        );
        assert_eq!(e.unexplained, 80);
    }

    #[test]
    fn a_crash_explains_up_to_its_bound_and_no_more() {
        let within = explain(&Inputs {
            store: 500,
            ledger: 300,
            crash: Some(250),
            ..Default::default()
        });
        assert_eq!(names(&within), vec![("lost_in_a_crash", 200)]);
        assert_eq!(within.unexplained, 0);
        let beyond = explain(&Inputs {
            store: 500,
            ledger: 100,
            crash: Some(250),
            ..Default::default()
        });
        assert_eq!(beyond.unexplained, 150);
    }

    #[test]
    fn a_crash_that_lost_every_row_of_the_window_is_bounded_by_the_largest_request() {
        // Rows survived: the largest of them.
        assert_eq!(crash_bound(600, 250, 100_000), 150_000);
        // None survived: the largest request the tenant's budgets admit,
        // not 0 (which left the whole difference unexplained).
        let bound = crash_bound(600, 0, 100_000);
        assert_eq!(bound, 60_000_000);
        let e = explain(&Inputs {
            store: 4_000,
            ledger: 0,
            crash: Some(bound),
            ..Default::default()
        });
        assert_eq!(names(&e), vec![("lost_in_a_crash", 4_000)]);
        assert_eq!(e.unexplained, 0);
        assert_eq!(crash_bound(u64::MAX, 0, 2), u64::MAX);
    }

    #[test]
    fn a_larger_ledger_is_the_boundary_or_a_reset_never_holds() {
        let e = explain(&Inputs {
            store: 100,
            ledger: 180,
            holds: Some(1_000),
            boundary: 30,
            ..Default::default()
        });
        assert_eq!(names(&e), vec![("window_boundary", 30)]);
        assert_eq!(e.unexplained, -50);
        let reset = explain(&Inputs {
            store: 0,
            ledger: 180,
            store_reset: true,
            ..Default::default()
        });
        assert_eq!(names(&reset), vec![("store_reset", 180)]);
        assert_eq!(reset.unexplained, 0);
    }

    /// Fault: a `fail_open` tenant's spend while the store was down left
    /// the store short of the ledger with `causes: []`.
    #[test]
    fn a_smaller_store_is_explained_by_what_the_fail_open_limiter_served() {
        let e = explain(&Inputs {
            store: 100,
            ledger: 400,
            boundary: 20,
            fail_open: 250,
            ..Default::default()
        });
        assert_eq!(
            names(&e),
            vec![
                ("window_boundary", 20),
                ("served_by_fail_open_limiter", 250)
            ]
        );
        assert_eq!(e.unexplained, -30);
        let larger = explain(&Inputs {
            store: 500,
            ledger: 400,
            fail_open: 250,
            ..Default::default()
        });
        assert!(larger.causes.is_empty(), "never a cause of a larger store");
    }

    #[test]
    fn retention_explains_what_is_left_of_a_larger_store() {
        let e = explain(&Inputs {
            store: 1_000,
            ledger: 10,
            retention: true,
            ..Default::default()
        });
        assert_eq!(names(&e), vec![("retention", 990)]);
        assert_eq!(e.unexplained, 0);
    }
}
