//! The settlement series the alerts read: every retry of
//! a settlement the store failed counts in
//! `budgetgate_settlement_retries_total`, and a settlement given up after
//! the retry window in `budgetgate_settlements_failed_total`. Paused time:
//! the back-off never sleeps on the wall clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use budgetgate::admission::tracker::settle_with_retry;
use budgetgate::budget::{
    BudgetSpec, BudgetState, BudgetStore, ExtendOutcome, RenewOutcome, ReserveOutcome,
    ReserveRequest, SettleOutcome, Settlement, StoreError,
};

/// A store whose first `failures` settle calls fail.
struct FlakySettle {
    failures: usize,
    calls: AtomicUsize,
}

#[async_trait]
impl BudgetStore for FlakySettle {
    async fn reserve(&self, _: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
        unreachable!("only settle is called")
    }
    async fn extend(
        &self,
        _: &str,
        _: &budgetgate::budget::Step,
    ) -> Result<ExtendOutcome, StoreError> {
        unreachable!("only settle is called")
    }
    async fn renew(&self, _: &str) -> Result<RenewOutcome, StoreError> {
        unreachable!("only settle is called")
    }
    async fn settle(&self, _: &str, _: &Settlement) -> Result<SettleOutcome, StoreError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.failures {
            Err(StoreError::Unavailable("down".into()))
        } else {
            Ok(SettleOutcome::AlreadySettled)
        }
    }
    async fn void(&self, _: &str, _: u64) -> Result<SettleOutcome, StoreError> {
        unreachable!("only settle is called")
    }
    async fn inspect(&self, _: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError> {
        unreachable!("only settle is called")
    }
    async fn lower(&self, _: &BudgetSpec, _: u64) -> Result<i64, StoreError> {
        unreachable!("only settle is called")
    }
}

fn counter(name: &str) -> f64 {
    budgetgate::metrics::render()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

const SETTLEMENT: Settlement = Settlement {
    actual_tokens: 10,
    upstream_failed: false,
    actual: budgetgate::budget::Actual::Tokens,
};

/// One test: the counters are process-wide.
#[tokio::test(start_paused = true)]
async fn settlement_retries_and_failures_are_counted() {
    budgetgate::metrics::install();
    let retries = || counter("budgetgate_settlement_retries_total");
    let failed = || counter("budgetgate_settlements_failed_total");
    let (r0, f0) = (retries(), failed());

    let flaky = FlakySettle {
        failures: 3,
        calls: AtomicUsize::new(0),
    };
    let got = settle_with_retry(&flaky, "r1", SETTLEMENT, Duration::from_secs(60)).await;
    assert_eq!(got, Some(SettleOutcome::AlreadySettled));
    assert_eq!(retries() - r0, 3.0);
    assert_eq!(failed() - f0, 0.0);

    let down = FlakySettle {
        failures: usize::MAX,
        calls: AtomicUsize::new(0),
    };
    let got = settle_with_retry(&down, "r2", SETTLEMENT, Duration::from_secs(1)).await;
    assert_eq!(got, None);
    assert_eq!(failed() - f0, 1.0);
    let tries = down.calls.load(Ordering::SeqCst) as f64;
    assert_eq!(
        retries() - r0,
        3.0 + tries - 1.0,
        "every call but the first is a retry"
    );
}
