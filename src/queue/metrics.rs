//! The queue's metrics, labelled by class only (three
//! values: bounded cardinality).

use metrics::{counter, gauge, histogram};

use crate::config::queue::Class;

/// Waiters of `class` came (`+1`) or went (`-1`).
pub fn depth(class: Class, delta: f64) {
    gauge!("budgetgate_queue_depth", "class" => class.as_str()).increment(delta);
}

/// A waiter of `class` was admitted after `seconds` in the queue.
pub fn admitted(class: Class, seconds: f64) {
    counter!("budgetgate_queue_admitted_total", "class" => class.as_str()).increment(1);
    histogram!("budgetgate_queue_wait_seconds", "class" => class.as_str()).record(seconds);
}

/// A waiter of `class` ran out of time after `seconds` (answered the 429
/// it would have had).
pub fn timed_out(class: Class, seconds: f64) {
    counter!("budgetgate_queue_timeouts_total", "class" => class.as_str()).increment(1);
    histogram!("budgetgate_queue_wait_seconds", "class" => class.as_str()).record(seconds);
}

/// A request of `class` found the queue full (429 `queue_full`).
pub fn full(class: Class) {
    counter!("budgetgate_queue_full_total", "class" => class.as_str()).increment(1);
}

/// Registers every series at zero (alerts on `increase()` work before the
/// first event).
pub fn register() {
    for c in Class::ALL {
        gauge!("budgetgate_queue_depth", "class" => c.as_str()).increment(0.0);
        counter!("budgetgate_queue_admitted_total", "class" => c.as_str()).increment(0);
        counter!("budgetgate_queue_timeouts_total", "class" => c.as_str()).increment(0);
        counter!("budgetgate_queue_full_total", "class" => c.as_str()).increment(0);
    }
}
