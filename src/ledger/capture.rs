//! Capture: a reservation carries the fixed part of its ledger row from
//! admission ([`LedgerDraft`]: who, what, where), the settle phase adds the
//! usage, the cost and how the request ended, and once the store has
//! applied the settlement the row goes to the buffer ([`LedgerCapture::record`]).
//! Settlements the store applied become rows: `Settled`, and
//! `AlreadySettled` (a retry after a lost reply; the first attempt applied
//! it, and the row's primary key keeps it to one row). A settlement the
//! store never confirmed within its retry window becomes a row too, with
//! outcome `unknown` ([`LedgerCapture::record_unknown`]).

use std::sync::Arc;

use axum::http::HeaderValue;

use super::{Ledger, SpendOutcome, SpendRow};
use crate::budget::{Actual, Settlement};
use crate::dialects::{Dialect, UsageBreakdown};

/// What every reservation of one budget plan (tenant, key, model, policy)
/// shares in its row; built once per plan.
#[derive(Debug)]
pub struct LedgerScope {
    /// The tenant.
    pub tenant: Arc<str>,
    /// Its ancestors, nearest first.
    pub ancestors: Arc<[Arc<str>]>,
    /// The key id.
    pub key_id: Arc<str>,
    /// The public model.
    pub model: Arc<str>,
    /// The policy version (the prices are the policy's).
    pub price_version: Arc<str>,
    /// Names of the plan's deployments, in the plan's order.
    pub deployments: Vec<Arc<str>>,
    /// The `gen_ai.provider.name` of each deployment (request spans).
    pub providers: Vec<&'static str>,
    /// The model name sent upstream (request spans).
    pub upstream_model: Arc<str>,
}

/// The row of one reservation as far as it is known.
#[derive(Debug, Clone)]
pub struct LedgerDraft {
    scope: Arc<LedgerScope>,
    deployment: Arc<str>,
    provider: &'static str,
    /// UTC µs of the admission: a request span's start.
    admitted_micros: u64,
    /// The request id the client saw (a header value: a reference-counted
    /// copy of the one the response carries).
    request_id: HeaderValue,
    /// Which reservation of the request this is, from 1.
    attempt: u32,
    dialect: Dialect,
    end_user: Option<Arc<str>>,
    /// Position among the hold's amounts of a dollar budget: what the drop
    /// backstop charged it is the row's cost then.
    usd_index: Option<usize>,
    usage: Option<UsageBreakdown>,
    cost_micros: u64,
    outcome: Option<SpendOutcome>,
}

impl LedgerDraft {
    /// The draft of a reservation of `scope`'s plan on its `deployment`-th
    /// deployment.
    pub fn new(
        scope: Arc<LedgerScope>,
        deployment: usize,
        dialect: Dialect,
        end_user: Option<Arc<str>>,
        usd_index: Option<usize>,
    ) -> Self {
        let provider = scope.providers.get(deployment).copied().unwrap_or("");
        let deployment = scope
            .deployments
            .get(deployment)
            .cloned()
            .unwrap_or_default();
        Self {
            scope,
            deployment,
            provider,
            admitted_micros: 0,
            request_id: HeaderValue::from_static(""),
            attempt: 1,
            dialect,
            end_user,
            usd_index,
            usage: None,
            cost_micros: 0,
            outcome: None,
        }
    }

    /// The reservation was admitted at `micros` (UTC µs).
    pub fn admitted_at(mut self, micros: u64) -> Self {
        self.admitted_micros = micros;
        self
    }

    /// The reservation is the `attempt`-th (from 1) of the request the
    /// client knows as `request_id`.
    pub fn of_request(mut self, request_id: HeaderValue, attempt: u32) -> Self {
        self.request_id = request_id;
        self.attempt = attempt;
        self
    }

    /// What a request span needs beyond the row.
    pub fn span_facts(&self) -> crate::telemetry::SpanFacts<'_> {
        crate::telemetry::SpanFacts {
            admitted_micros: self.admitted_micros,
            provider: self.provider,
            upstream_model: &self.scope.upstream_model,
        }
    }

    /// The answer used `used`, costing `cost_micros`, and ended as `outcome`.
    pub fn settled(
        &mut self,
        used: UsageBreakdown,
        cost_micros: Option<u64>,
        outcome: SpendOutcome,
    ) {
        self.usage = Some(used);
        self.cost_micros = cost_micros.unwrap_or(0);
        self.outcome = Some(outcome);
    }

    /// The reservation was dropped unsettled and charged `amounts` (per
    /// spec of the hold; empty when only tokens are known).
    pub fn abandoned(&mut self, amounts: &[u64]) {
        self.outcome = Some(SpendOutcome::Abandoned);
        self.cost_micros = self
            .usd_index
            .and_then(|i| amounts.get(i).copied())
            .unwrap_or(0);
    }

    /// The row of reservation `id` settled by `s` at `at_micros`.
    pub fn row(&self, id: &str, s: &Settlement, at_micros: u64) -> SpendRow {
        let outcome = match (&s.actual, self.outcome) {
            (Actual::Void, _) => SpendOutcome::Voided,
            (_, Some(o)) => o,
            (_, None) if s.upstream_failed => SpendOutcome::UpstreamFailed,
            (_, None) => SpendOutcome::Abandoned,
        };
        // A refund or a void charges nothing, whatever was drafted.
        let refunded = s.upstream_failed && self.usage.is_none();
        let charged = outcome != SpendOutcome::Voided && !refunded;
        let used = self
            .usage
            .filter(|_| charged)
            .unwrap_or(UsageBreakdown::from_counts(0, 0));
        SpendRow {
            reservation_id: id.to_string(),
            // Only visible ASCII is ever kept as a request id.
            request_id: self.request_id.to_str().unwrap_or("").to_owned(),
            attempt: self.attempt,
            at_micros,
            tenant: self.scope.tenant.clone(),
            ancestors: self.scope.ancestors.clone(),
            key_id: self.scope.key_id.clone(),
            end_user: self.end_user.clone(),
            model: self.scope.model.clone(),
            deployment: self.deployment.clone(),
            dialect: dialect_name(self.dialect),
            input_tokens: used.uncached_input.unwrap_or(0),
            cached_read_tokens: used.cached_input,
            cache_write_tokens: used.cache_writes,
            output_tokens: used.output.unwrap_or(0),
            reasoning_tokens: used.reasoning,
            charged_tokens: if charged { s.actual_tokens } else { 0 },
            cost_micros: if charged { self.cost_micros } else { 0 },
            outcome,
            price_version: self.scope.price_version.clone(),
        }
    }
}

/// A draft and the ledger its row goes to, carried by the reservation.
#[derive(Clone)]
pub struct LedgerCapture {
    ledger: Arc<Ledger>,
    draft: Box<LedgerDraft>,
}

impl LedgerCapture {
    /// `draft`'s row will go to `ledger`.
    pub fn new(ledger: Arc<Ledger>, draft: LedgerDraft) -> Self {
        Self {
            ledger,
            draft: Box::new(draft),
        }
    }

    /// The draft, to complete.
    pub fn draft_mut(&mut self) -> &mut LedgerDraft {
        &mut self.draft
    }

    /// Buffers the row of reservation `id`, settled by `s` (applied by
    /// the store), and exports its span.
    pub fn record(&self, id: &str, s: &Settlement) {
        self.push(self.draft.row(id, s, self.ledger.now_micros()));
    }

    /// Buffers the row of reservation `id` whose settlement `s` the store
    /// never confirmed (every attempt failed; one may have applied before
    /// its reply was lost): its figures are what `s` charges, its outcome
    /// `unknown`.
    pub fn record_unknown(&self, id: &str, s: &Settlement) {
        let mut row = self.draft.row(id, s, self.ledger.now_micros());
        row.outcome = SpendOutcome::Unknown;
        self.push(row);
    }

    fn push(&self, row: SpendRow) {
        if let Some(spans) = self.ledger.spans() {
            spans.export(&row, self.draft.span_facts());
        }
        if let Some(buffer) = self.ledger.buffer() {
            buffer.record(row);
        }
    }
}

/// Every dialect's column value.
pub const DIALECTS: [&str; 5] = ["chat", "completions", "embeddings", "responses", "messages"];

/// The column value of a dialect.
pub const fn dialect_name(d: Dialect) -> &'static str {
    match d {
        Dialect::ChatCompletions => "chat",
        Dialect::Completions => "completions",
        Dialect::Embeddings => "embeddings",
        Dialect::Responses => "responses",
        Dialect::Messages => "messages",
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn scope() -> Arc<LedgerScope> {
        Arc::new(LedgerScope {
            tenant: "ml".into(),
            ancestors: vec![Arc::<str>::from("acme")].into(),
            key_id: "batch".into(),
            model: "gpt-4o-mini".into(),
            price_version: "abc123".into(),
            deployments: vec!["east".into(), "west".into()],
            providers: vec!["openai", "anthropic"],
            upstream_model: "gpt-4o-mini-2024-07-18".into(),
        })
    }

    /// A row of reservation `id` costing `micros`.
    pub(crate) fn row(id: &str, micros: u64) -> SpendRow {
        let mut d = LedgerDraft::new(scope(), 1, Dialect::ChatCompletions, None, None);
        d.settled(
            UsageBreakdown::from_counts(10, 5),
            Some(micros),
            SpendOutcome::Answered,
        );
        d.row(id, &settlement(15, false, Actual::Tokens), 1_000)
    }

    fn settlement(tokens: u64, upstream_failed: bool, actual: Actual) -> Settlement {
        Settlement {
            actual_tokens: tokens,
            upstream_failed,
            actual,
        }
    }

    #[test]
    fn a_settled_answer_carries_its_usage_cost_and_who() {
        let mut d = LedgerDraft::new(scope(), 1, Dialect::Messages, Some("eu1".into()), Some(0));
        let used = UsageBreakdown {
            uncached_input: Some(100),
            cached_input: 40,
            cache_writes: 7,
            cache_writes_1h: 0,
            output: Some(30),
            reasoning: 12,
            hosted: Default::default(),
        };
        d.settled(used, Some(4_321), SpendOutcome::CutOff);
        let r = d.row("r1", &settlement(177, false, Actual::PerSpec(vec![1])), 99);
        assert_eq!(r.reservation_id, "r1");
        assert_eq!(r.at_micros, 99);
        assert_eq!(&*r.deployment, "west");
        assert_eq!(r.dialect, "messages");
        assert_eq!(r.end_user.as_deref(), Some("eu1"));
        assert_eq!(
            (r.input_tokens, r.cached_read_tokens, r.cache_write_tokens),
            (100, 40, 7)
        );
        assert_eq!((r.output_tokens, r.reasoning_tokens), (30, 12));
        assert_eq!((r.charged_tokens, r.cost_micros), (177, 4_321));
        assert_eq!(r.outcome, SpendOutcome::CutOff);
        assert_eq!(r.levels().collect::<Vec<_>>(), ["ml", "acme"]);
    }

    #[test]
    fn a_refund_and_a_void_charge_nothing() {
        let d = LedgerDraft::new(scope(), 0, Dialect::ChatCompletions, None, Some(0));
        let refunded = d.row("r1", &settlement(0, true, Actual::PerSpec(vec![0])), 1);
        assert_eq!(refunded.outcome, SpendOutcome::UpstreamFailed);
        assert_eq!((refunded.cost_micros, refunded.charged_tokens), (0, 0));
        let mut settled_then_voided = d.clone();
        settled_then_voided.settled(
            UsageBreakdown::from_counts(5, 5),
            Some(9),
            SpendOutcome::Answered,
        );
        let voided = settled_then_voided.row("r2", &settlement(0, true, Actual::Void), 1);
        assert_eq!(voided.outcome, SpendOutcome::Voided);
        assert_eq!((voided.cost_micros, voided.input_tokens), (0, 0));
    }

    #[test]
    fn an_abandoned_reservation_costs_what_its_dollar_budget_was_charged() {
        let mut d = LedgerDraft::new(scope(), 0, Dialect::Responses, None, Some(1));
        d.abandoned(&[500, 7_000, 500]);
        let r = d.row(
            "r1",
            &settlement(500, false, Actual::PerSpec(vec![500, 7_000, 500])),
            1,
        );
        assert_eq!(r.outcome, SpendOutcome::Abandoned);
        assert_eq!((r.cost_micros, r.charged_tokens), (7_000, 500));
    }
}
