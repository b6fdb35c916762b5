//! Expected-output reservation (DESIGN section 5,
//! "Expected output"): a request whose output is not metered as it
//! streams (non-streamed, Messages thinking, `reasoning = true` models)
//! of a tenant or key with `output_reservation = "expected"` reserves, on
//! its tenant-side token budgets, the `expected_quantile` of the settled
//! outputs of its (model, tenant)'s last [`WINDOW`] answered requests on
//! this gateway, not its whole cap, as long as each budget's exposure
//! ([`super::exposure`]) stays within `max_exposure`. Deployment budgets
//! and dollar budgets keep the whole cap. What the answer uses above the
//! reservation settles as debt, in full.
//!
//! Owns the windows of settled outputs (one per (model, tenant), kept
//! across reloads) and the lowering of a reservation's amounts.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use metrics::{counter, gauge, Counter, Gauge};

use super::amounts::Budgets;
use super::exposure::{ExposureBook, ExposureGuard};
use crate::budget::{BudgetName, Costs};
use crate::config::output_reservation::{ExpectedSettings, OutputReservation};

/// Answers a window keeps (the most recent).
pub const WINDOW: usize = 200;

/// Answers known before the quantile is used (until then the model's
/// default output, never above the cap).
pub const MIN_KNOWN: usize = 20;

/// The settled outputs (per choice) of one (model, tenant)'s last
/// [`WINDOW`] answered requests, in arrival order and sorted.
#[derive(Debug, Default)]
pub struct OutputWindow {
    arrivals: VecDeque<u64>,
    sorted: Vec<u64>,
}

impl OutputWindow {
    /// Records one answered request's output.
    pub fn record(&mut self, output: u64) {
        if self.arrivals.len() == WINDOW {
            if let Some(old) = self.arrivals.pop_front() {
                if let Ok(i) = self.sorted.binary_search(&old) {
                    self.sorted.remove(i);
                }
            }
        }
        self.arrivals.push_back(output);
        let at = self.sorted.partition_point(|&x| x <= output);
        self.sorted.insert(at, output);
    }

    /// The `permille` quantile (nearest rank: the smallest output at
    /// least that share of the window is at or below); `None` until
    /// [`MIN_KNOWN`] are known.
    pub fn quantile(&self, permille: u32) -> Option<u64> {
        let n = self.sorted.len();
        if n < MIN_KNOWN {
            return None;
        }
        let rank = (n * permille.min(1000) as usize).div_ceil(1000).max(1);
        self.sorted.get(rank - 1).copied()
    }

    /// Answers known.
    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    /// No answer known yet.
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }
}

/// One (model, tenant)'s window, shared by its plans.
type SharedWindow = Arc<Mutex<OutputWindow>>;

/// The windows by (model, tenant) name (names, not ids: kept across reloads).
type Windows = HashMap<(Arc<str>, Arc<str>), SharedWindow>;

/// The gateway's windows and exposure book (one per process, every
/// serving thread's; kept across reloads).
#[derive(Default)]
pub struct ExpectedBooks {
    windows: Mutex<Windows>,
    /// Exposure in use per budget.
    pub exposure: Arc<ExposureBook>,
}

impl ExpectedBooks {
    /// The output-reservation part of the budget plan of `tenant` and
    /// `model` (built once per plan, so a request looks nothing up).
    pub fn plan(
        &self,
        reservation: OutputReservation,
        tenant: &str,
        model: &str,
        default_output: u64,
    ) -> ExpectedPlan {
        let settings = reservation.expected().unwrap_or(ExpectedSettings {
            max_exposure: reservation.max_exposure(),
            ..ExpectedSettings::default()
        });
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let window = windows
            .entry((Arc::from(model), Arc::from(tenant)))
            .or_default()
            .clone();
        let t = || tenant.to_string();
        ExpectedPlan {
            settings,
            quantile: reservation.expected().is_some(),
            default_output,
            window,
            book: self.exposure.clone(),
            metrics: Arc::new(ExpectedMetrics {
                past: counter!("budgetgate_output_past_reservation_total", "tenant" => t()),
                debt: counter!("budgetgate_output_debt_tokens_total", "tenant" => t()),
                exposure: gauge!("budgetgate_exposure_tokens", "tenant" => t()),
            }),
        }
    }
}

impl ExpectedBooks {
    /// Forgets the windows of every tenant and model `policy` no longer
    /// has: a deleted tenant's outputs neither stay in memory nor size the
    /// reservations of a tenant created later under its name (its
    /// tenant-labelled series leave `/metrics` with the tenant,
    /// [`crate::metrics::policy_installed`]). Run on every policy change.
    pub fn prune(&self, policy: &crate::config::Policy) {
        let tenants: std::collections::HashSet<&str> =
            policy.tenants.iter().map(|t| t.name.as_str()).collect();
        let models: std::collections::HashSet<&str> =
            policy.models.iter().map(|m| m.name.as_str()).collect();
        self.windows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(m, t), _| models.contains(&**m) && tenants.contains(&**t));
    }

    /// Windows kept (one per (model, tenant) planned in expected mode).
    pub fn windows(&self) -> usize {
        self.windows.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// The series of a tenant's expected-mode requests.
pub struct ExpectedMetrics {
    past: Counter,
    debt: Counter,
    exposure: Gauge,
}

/// What a budget plan carries of its tenant's (or key's) output reservation.
pub struct ExpectedPlan {
    settings: ExpectedSettings,
    /// `output_reservation = "expected"`: the window's quantile is
    /// reserved (else the model's default output, for uncapped requests).
    quantile: bool,
    /// The model's `default_max_output_tokens` (per choice).
    default_output: u64,
    window: Arc<Mutex<OutputWindow>>,
    book: Arc<ExposureBook>,
    metrics: Arc<ExpectedMetrics>,
}

/// One admitted expected-mode reservation: what its settlement records.
pub struct ExpectedTicket {
    window: Arc<Mutex<OutputWindow>>,
    metrics: Arc<ExpectedMetrics>,
    choices: u64,
    /// Output reserved on the budgets that took the exposure (all choices).
    reserved_output: u64,
    /// Some budget reserved less than the cap.
    lowered: bool,
}

impl ExpectedTicket {
    /// The request settled `output` tokens of output; `answered`: neither
    /// cut off nor failed (only those enter the window).
    pub fn settled(&self, output: u64, answered: bool) {
        if answered {
            let per_choice = output / self.choices.max(1);
            self.window
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .record(per_choice);
        }
        if self.lowered && output > self.reserved_output {
            self.metrics.past.increment(1);
            self.metrics.debt.increment(output - self.reserved_output);
        }
    }
}

/// The output a request may emit and what the expected mode reserves of it.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    /// Output reserved at the cap (all choices): what the other budgets hold.
    pub cap: u64,
    /// Choices the cap covers.
    pub choices: u64,
}

impl ExpectedPlan {
    /// In expected mode (`output_reservation = "expected"`).
    pub fn expected_mode(&self) -> bool {
        self.quantile
    }

    /// The expected output per choice: in expected mode the window's
    /// quantile, else (and until it is known) the model's default output;
    /// never above `per_choice_cap`.
    pub fn expected_per_choice(&self, per_choice_cap: u64) -> u64 {
        let q = self.quantile.then(|| {
            self.window
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .quantile(self.settings.quantile_permille)
        });
        q.flatten()
            .unwrap_or(self.default_output)
            .min(per_choice_cap)
    }

    /// Lowers the output `costs` reserve on the token budgets among
    /// `common` (the first specs of every candidate's row) to the expected
    /// output, on each budget whose exposure stays within its bound. The
    /// guard holds the exposure taken (release it once the settlement is
    /// applied); the ticket records the settlement.
    pub fn lower(
        &self,
        output: Output,
        common: Budgets<'_>,
        costs: &mut Costs,
    ) -> (ExposureGuard, ExpectedTicket) {
        let per_choice = self.expected_per_choice(output.cap / output.choices.max(1));
        self.lower_to(output, per_choice, common, costs)
    }

    /// [`Self::lower`] to `per_choice` reserved per choice (at most the
    /// cap's share): an uncapped request's reservation, whose cap is what
    /// the model can answer at most.
    pub fn lower_to(
        &self,
        output: Output,
        per_choice: u64,
        common: Budgets<'_>,
        costs: &mut Costs,
    ) -> (ExposureGuard, ExpectedTicket) {
        let choices = output.choices.max(1);
        let expected = per_choice.min(output.cap / choices).saturating_mul(choices);
        let saving = output.cap.saturating_sub(expected);
        // Token budgets that count the output and hold the reserved output
        // (not the whole cap): tenant, key, tenant × model, end users.
        let lowers: Vec<usize> = common
            .specs
            .iter()
            .enumerate()
            .filter(|(i, s)| {
                let whole = common.counting.get(*i).is_some_and(|c| c.whole_cap);
                s.name.counts_tokens() && s.name != BudgetName::InputTpm && !whole
            })
            .map(|(i, _)| i)
            .collect();
        let bounds: Vec<(Arc<str>, u64)> = lowers
            .iter()
            .map(|&i| {
                let s = &common.specs[i];
                (s.key.clone(), self.settings.max_exposure.of(s.capacity()))
            })
            .collect();
        let (guard, taken) = self
            .book
            .take(&bounds, saving, Some(self.metrics.exposure.clone()));
        for (&i, _) in lowers.iter().zip(&taken).filter(|(_, &t)| t) {
            for row in costs.per_candidate.iter_mut() {
                if let Some(a) = row.get_mut(i) {
                    *a = a.saturating_sub(saving);
                }
            }
        }
        let lowered = guard.took_any();
        if lowered && taken.iter().all(|&t| t) {
            costs.tokens = costs.tokens.saturating_sub(saving);
        }
        let ticket = ExpectedTicket {
            window: self.window.clone(),
            metrics: self.metrics.clone(),
            choices,
            reserved_output: if lowered { expected } else { output.cap },
            lowered,
        };
        (guard, ticket)
    }
}

/// `check-config`'s statement of the bound (DESIGN section 5, "Expected
/// output"): for every tenant and key, each token budget its unmetered
/// requests may leave partly unreserved (uncapped ones in either mode,
/// capped ones in expected mode) and the most that budget may be
/// over-admitted at any moment, `fleet_size × max_exposure` (the book is
/// per gateway).
pub fn describe(policy: &crate::config::Policy) -> Vec<String> {
    use crate::budget::Scope;
    let n = policy.store.lease.fleet_size.max(1);
    let ks = crate::admission::plan::key_space(policy);
    let mut out = Vec::new();
    let mut line = |scope: Scope, limits: &crate::config::Limits, r: OutputReservation| {
        let mode = match r {
            OutputReservation::Cap(_) => "cap",
            OutputReservation::Expected(_) => "expected",
        };
        for b in super::plan::scope_budgets(&ks, scope, limits, true) {
            if b.name.counts_tokens() && b.name != BudgetName::InputTpm {
                let one = r.max_exposure().of(b.capacity());
                out.push(format!(
                    "  {} {} ({mode}): max_exposure {one} per gateway; over-admission at any moment at most {} across the fleet",
                    b.scope,
                    b.name,
                    one.saturating_mul(n),
                ));
            }
        }
    };
    for t in &policy.tenants {
        line(
            Scope::Tenant(t.name.as_str().into()),
            &t.limits,
            t.output_reservation,
        );
        for k in &t.keys {
            line(
                Scope::Key(t.name.as_str().into(), k.id.as_str().into()),
                &k.limits,
                t.output_reservation(k),
            );
        }
    }
    if !out.is_empty() {
        out.insert(
            0,
            format!(
                "output reservation: requests whose output is not metered as it streams reserve less than they may answer on tenant-side token budgets (uncapped ones: the default output, or the expected output in expected mode, of the model's maximum; capped ones in expected mode: the expected output of their cap); what is left unreserved is bounded per budget; fleet of {n} gateway(s):"
            ),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quantile_is_unknown_until_twenty_answers_then_nearest_rank() {
        let mut w = OutputWindow::default();
        for x in 1..MIN_KNOWN as u64 {
            w.record(x * 100);
        }
        assert_eq!(w.quantile(900), None);
        w.record(2000);
        // 20 answers 100..=2000: the 18th is the p90.
        assert_eq!(w.quantile(900), Some(1800));
        assert_eq!(w.quantile(1000), Some(2000));
        assert_eq!(w.quantile(1), Some(100));
    }

    #[test]
    fn the_window_keeps_the_last_two_hundred() {
        let mut w = OutputWindow::default();
        // 200 large answers, then 200 small ones: only the small remain.
        for _ in 0..WINDOW {
            w.record(50_000);
        }
        assert_eq!(w.quantile(900), Some(50_000));
        for x in 0..WINDOW as u64 {
            w.record(x + 1);
        }
        assert_eq!(w.len(), WINDOW);
        assert_eq!(w.quantile(900), Some(180));
        assert_eq!(w.quantile(1000), Some(200));
    }

    #[test]
    fn expected_output_is_the_default_until_known_and_never_above_the_cap() {
        let books = ExpectedBooks::default();
        let plan = books.plan(
            OutputReservation::Expected(ExpectedSettings::default()),
            "t",
            "m",
            4096,
        );
        assert_eq!(plan.expected_per_choice(64_000), 4096);
        assert_eq!(plan.expected_per_choice(1000), 1000);
        for _ in 0..MIN_KNOWN {
            plan.window.lock().unwrap().record(1500);
        }
        assert_eq!(plan.expected_per_choice(64_000), 1500);
        // Same (model, tenant): the same window, across plans (reloads).
        let again = books.plan(
            OutputReservation::Expected(ExpectedSettings::default()),
            "t",
            "m",
            4096,
        );
        assert_eq!(again.expected_per_choice(64_000), 1500);
        let other = books.plan(
            OutputReservation::Expected(ExpectedSettings::default()),
            "u",
            "m",
            4096,
        );
        assert_eq!(other.expected_per_choice(64_000), 4096);
    }

    #[test]
    fn a_policy_without_a_tenant_forgets_its_windows() {
        let books = ExpectedBooks::default();
        for t in ["gone", "kept"] {
            let plan = books.plan(
                OutputReservation::Expected(ExpectedSettings::default()),
                t,
                "m",
                4096,
            );
            for _ in 0..MIN_KNOWN {
                plan.window.lock().unwrap().record(1500);
            }
        }
        let raw = toml::from_str(
            r#"
[server]
listen = "127.0.0.1:8080"
[[upstreams]]
name = "u"
kind = "self_hosted"
base_url = "http://127.0.0.1:9/v1"
[[models]]
name = "m"
upstreams = ["u"]
[[tenants]]
name = "kept"
"#,
        )
        .unwrap();
        books.prune(&crate::config::Policy::from_raw(raw, "v".into()).unwrap());
        assert_eq!(books.windows(), 1);
        let plan = |t| {
            books.plan(
                OutputReservation::Expected(ExpectedSettings::default()),
                t,
                "m",
                4096,
            )
        };
        assert_eq!(plan("kept").expected_per_choice(64_000), 1500);
        assert_eq!(
            plan("gone").expected_per_choice(64_000),
            4096,
            "a tenant of the deleted one's name starts afresh"
        );
    }
}
