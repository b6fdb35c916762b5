//! One store double for tests that need to watch or disturb store calls:
//! every call goes to an inner store, with the test's own hooks before and
//! after it (count calls, fail them, hold them, note when they happened).

use std::ops::Deref;

use async_trait::async_trait;
use budgetgate::budget::{
    BudgetSpec, BudgetState, BudgetStore, ExtendOutcome, RenewOutcome, ReserveOutcome,
    ReserveRequest, SettleOutcome, Settlement, Step, StoreError,
};

/// Which store operation a hook sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Reserve,
    Extend,
    Renew,
    Settle,
    Void,
    Inspect,
    Lower,
}

/// What a test does around each call. `before` may answer the call itself
/// with an error (the inner store is then not called); what it returns is
/// handed to `after` once the inner store answered.
#[async_trait]
pub trait Hooks: Send + Sync + 'static {
    async fn before(&self, _call: Call) -> Result<u64, StoreError> {
        Ok(0)
    }
    fn after(&self, _call: Call, _noted: u64) {}
}

/// `inner` with `hooks` around every call; derefs to the hooks, so a test
/// reads its counters as fields of the store.
pub struct Spy<S, H> {
    pub inner: std::sync::Arc<S>,
    pub hooks: H,
}

impl<S, H> Deref for Spy<S, H> {
    type Target = H;
    fn deref(&self) -> &H {
        &self.hooks
    }
}

impl<S: BudgetStore, H: Hooks> Spy<S, H> {
    async fn around<T>(
        &self,
        call: Call,
        f: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let noted = self.hooks.before(call).await?;
        let r = f.await;
        self.hooks.after(call, noted);
        r
    }
}

#[async_trait]
impl<S: BudgetStore, H: Hooks> BudgetStore for Spy<S, H> {
    async fn reserve(&self, req: &ReserveRequest) -> Result<ReserveOutcome, StoreError> {
        self.around(Call::Reserve, self.inner.reserve(req)).await
    }
    async fn extend(&self, id: &str, step: &Step) -> Result<ExtendOutcome, StoreError> {
        self.around(Call::Extend, self.inner.extend(id, step)).await
    }
    async fn renew(&self, id: &str) -> Result<RenewOutcome, StoreError> {
        self.around(Call::Renew, self.inner.renew(id)).await
    }
    async fn settle(&self, id: &str, s: &Settlement) -> Result<SettleOutcome, StoreError> {
        self.around(Call::Settle, self.inner.settle(id, s)).await
    }
    async fn void(&self, id: &str, ttl: u64) -> Result<SettleOutcome, StoreError> {
        self.around(Call::Void, self.inner.void(id, ttl)).await
    }
    async fn inspect(&self, specs: &[BudgetSpec]) -> Result<Vec<BudgetState>, StoreError> {
        self.around(Call::Inspect, self.inner.inspect(specs)).await
    }
    async fn lower(&self, spec: &BudgetSpec, at_most: u64) -> Result<i64, StoreError> {
        self.around(Call::Lower, self.inner.lower(spec, at_most))
            .await
    }
}
