//! The alert watch: every check interval, the quota and dollar budgets of
//! every tenant (its own, its keys', its models') are read from the store
//! (read-only, as the budget page does) and each threshold crossed for the
//! first time in its window is fired. What was fired is remembered per
//! window in memory; ids of past windows are forgotten, so the set stays
//! bounded. After a restart a crossed threshold fires again under the
//! same id (the receiver deduplicates).

use std::collections::HashSet;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::thresholds::{crossed, Firing};
use super::webhook::{body, Deliveries};
use crate::budget::{BudgetSpec, BudgetStore};
use crate::clock::Clock;
use crate::config::alerts::AlertSettings;
use crate::config::{Policy, TenantPolicy};

/// What the watch reads, handed over by the wiring: the active policy
/// (reloads included), the time, the budget store (read only) and which
/// budgets of a tenant to check — the composition the budget pages list
/// (`admission::plan::tenant_specs`), so that a page and an alert never
/// disagree on a tenant's budgets.
pub struct Watched {
    /// The active policy.
    pub policy: Arc<ArcSwap<Policy>>,
    /// Gateway time.
    pub clock: Arc<dyn Clock>,
    /// The gateway's store; only `inspect` is called.
    pub store: Arc<dyn BudgetStore>,
    /// Every budget of a tenant's own scopes.
    pub budgets_of: fn(&Policy, &TenantPolicy) -> Vec<BudgetSpec>,
}

/// Fired ids and the window end each belongs to.
#[derive(Default)]
pub struct Fired {
    ids: HashSet<String>,
    ends: Vec<(u64, String)>,
}

impl Fired {
    /// True the first time `f` is seen (it is remembered).
    pub fn first(&mut self, f: &Firing) -> bool {
        if !self.ids.insert(f.id.clone()) {
            return false;
        }
        self.ends.push((f.window_end_micros, f.id.clone()));
        true
    }

    /// Forgets ids whose window ended by `now`.
    pub fn forget_before(&mut self, now: u64) {
        let ids = &mut self.ids;
        self.ends.retain(|(end, id)| {
            let keep = *end > now;
            if !keep {
                ids.remove(id);
            }
            keep
        });
    }
}

/// Quota and dollar budgets: the ones with a calendar window.
fn is_windowed(name: crate::budget::BudgetName) -> bool {
    use crate::budget::BudgetName::*;
    matches!(
        name,
        TokensPerDay | TokensPerMonth | RequestsPerDay | UsdPerDay | UsdPerMonth
    )
}

/// One check: reads the budgets, queues the new firings; returns them.
pub async fn check(
    st: &Watched,
    settings: &AlertSettings,
    fired: &mut Fired,
    deliveries: &Deliveries,
) -> Result<Vec<Firing>, crate::budget::StoreError> {
    let p = st.policy.load_full();
    let specs: Vec<_> = p
        .tenants
        .iter()
        .flat_map(|t| (st.budgets_of)(&p, t))
        .filter(|s| !s.shadow && is_windowed(s.name))
        .collect();
    let now = st.clock.now_micros();
    fired.forget_before(now);
    let mut out = Vec::new();
    for chunk in specs.chunks(256) {
        let states = st.store.inspect(chunk).await?;
        for (spec, state) in chunk.iter().zip(&states) {
            for f in crossed(
                spec,
                state,
                &settings.thresholds_percent,
                &p.store.domain,
                now,
            ) {
                if fired.first(&f) {
                    crate::metrics::alert_fired(f.budget, f.threshold_percent);
                    tracing::info!(alert_id = %f.id, scope = %f.scope, budget = f.budget, threshold_percent = f.threshold_percent, used = f.used, limit = f.limit, "budget threshold reached");
                    deliveries.send(f.id.clone(), body(&f, now));
                    out.push(f);
                }
            }
        }
    }
    Ok(out)
}

/// Starts the watch (and its delivery task) when `settings` has a
/// webhook; the secret is read from its environment variable now.
pub fn spawn(st: Watched, settings: AlertSettings) -> Option<tokio::task::JoinHandle<()>> {
    let url = settings.webhook_url.clone()?;
    let secret = std::env::var_os(&settings.secret_env)
        .map(|s| s.as_encoded_bytes().to_vec())
        .unwrap_or_default();
    let (deliveries, sender) = Deliveries::spawn(url, secret, settings.retry_for);
    Some(tokio::spawn(async move {
        let _sender = AbortOnDrop(sender);
        let mut fired = Fired::default();
        let mut tick = tokio::time::interval(settings.check_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = check(&st, &settings, &mut fired, &deliveries).await {
                tracing::debug!(error = %e, "budget alerts not checked: the store did not answer");
            }
        }
    }))
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
