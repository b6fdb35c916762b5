//! Capture: the ledger's settlement observer. Who, what and where of a
//! reservation ([`crate::settlement::Who`]) are fixed at admission; once
//! the store has answered the settlement, [`LedgerRows`] builds the row
//! from the event (usage, cost and outcome as the settlement's maker named
//! them) and pushes it into the bounded buffer. Settlements the store
//! applied become rows: `Settled`, and `AlreadySettled` (a retry after a
//! lost reply; the first attempt applied it, and the row's primary key
//! keeps it to one row). A settlement the store never confirmed within its
//! retry window becomes a row too, with outcome `unknown`.

use std::sync::{Arc, OnceLock};

use super::{Ledger, SpendRow};
use crate::settlement::{Observer, Settled, Who};

pub use crate::settlement::{dialect_name, Scope as LedgerScope, DIALECTS};

/// The row of the settlement `e` of the reservation `who` describes, at
/// `at_micros`.
pub fn row(e: &Settled<'_>, who: &Who, at_micros: u64) -> SpendRow {
    let f = e.figures();
    let used = f.usage;
    SpendRow {
        reservation_id: e.id.to_string(),
        // Only visible ASCII is ever kept as a request id.
        request_id: who.request_id.to_str().unwrap_or("").to_owned(),
        attempt: who.attempt,
        at_micros,
        tenant: who.scope.tenant.clone(),
        ancestors: who.scope.ancestors.clone(),
        key_id: who.scope.key_id.clone(),
        end_user: who.end_user.clone(),
        model: who.scope.model.clone(),
        deployment: who.deployment.clone(),
        dialect: dialect_name(who.dialect),
        input_tokens: used.uncached_input.unwrap_or(0),
        cached_read_tokens: used.cached_input,
        cache_write_tokens: used.cache_writes,
        output_tokens: used.output.unwrap_or(0),
        reasoning_tokens: used.reasoning,
        charged_tokens: f.charged_tokens,
        cost_micros: f.cost_micros,
        outcome: f.outcome,
        price_version: who.scope.price_version.clone(),
        decided_by: who.decided_by,
        run_id: who.run.clone(),
    }
}

/// Buffers the row of every settlement the store applied (or never
/// confirmed), while the ledger is on. Never blocks: a full buffer drops
/// the row and counts it.
pub struct LedgerRows {
    ledger: Arc<OnceLock<Arc<Ledger>>>,
}

impl LedgerRows {
    /// Rows go to the ledger set in `ledger` (once, at start).
    pub fn new(ledger: Arc<OnceLock<Arc<Ledger>>>) -> Self {
        Self { ledger }
    }
}

impl Observer for LedgerRows {
    fn settled(&self, e: &Settled<'_>) {
        let (Some(who), Some(ledger)) = (&e.subject.who, self.ledger.get()) else {
            return;
        };
        if let (true, Some(buffer)) = (e.recorded(), ledger.buffer()) {
            buffer.record(row(e, who, ledger.now_micros()));
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::budget::{Actual, SettleOutcome, Settlement};
    use crate::dialects::{Dialect, UsageBreakdown};
    use crate::settlement::{Outcome, Settling, Subject};

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

    const APPLIED: SettleOutcome = SettleOutcome::AlreadySettled;

    /// The row of reservation `id` of `who`, settled as `made`.
    fn row_of(id: &str, who: Who, made: &Settling, at: u64) -> SpendRow {
        let subject = Subject {
            who: Some(Box::new(who)),
            ..Subject::default()
        };
        let e = Settled {
            id,
            made,
            applied: Some(&APPLIED),
            subject: &subject,
        };
        super::row(&e, subject.who.as_deref().expect("who"), at)
    }

    /// A row of reservation `id` costing `micros`.
    pub(crate) fn row(id: &str, micros: u64) -> SpendRow {
        let who = Who::new(scope(), 1, Dialect::ChatCompletions, None, None);
        let made = Settling::of(settlement(15, false, Actual::Tokens), Outcome::Answered)
            .used(UsageBreakdown::from_counts(10, 5), Some(micros));
        row_of(id, who, &made, 1_000)
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
        let who = Who::new(scope(), 1, Dialect::Messages, Some("eu1".into()), Some(0));
        let used = UsageBreakdown {
            uncached_input: Some(100),
            cached_input: 40,
            cache_writes: 7,
            cache_writes_1h: 0,
            output: Some(30),
            reasoning: 12,
            hosted: Default::default(),
            ..UsageBreakdown::default()
        };
        let made = Settling::of(
            settlement(177, false, Actual::PerSpec(vec![1])),
            Outcome::CutOff,
        )
        .used(used, Some(4_321));
        let r = row_of("r1", who, &made, 99);
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
        assert_eq!(r.outcome, Outcome::CutOff);
        assert_eq!(r.levels().collect::<Vec<_>>(), ["ml", "acme"]);
    }

    #[test]
    fn a_refund_and_a_void_charge_nothing() {
        let who = Who::new(scope(), 0, Dialect::ChatCompletions, None, Some(0));
        let refund = Settling::of(
            settlement(0, true, Actual::PerSpec(vec![0])),
            Outcome::UpstreamFailed,
        );
        let refunded = row_of("r1", who.clone(), &refund, 1);
        assert_eq!(refunded.outcome, Outcome::UpstreamFailed);
        assert_eq!((refunded.cost_micros, refunded.charged_tokens), (0, 0));
        let void = Settling::of(settlement(0, true, Actual::Void), Outcome::Voided)
            .used(UsageBreakdown::from_counts(5, 5), Some(9));
        let voided = row_of("r2", who, &void, 1);
        assert_eq!(voided.outcome, Outcome::Voided);
        assert_eq!((voided.cost_micros, voided.input_tokens), (0, 0));
    }

    #[test]
    fn an_abandoned_reservation_costs_what_its_dollar_budget_was_charged() {
        let who = Who::new(scope(), 0, Dialect::Responses, None, Some(1));
        let made = Settling::of(
            settlement(500, false, Actual::PerSpec(vec![500, 7_000, 500])),
            Outcome::Abandoned,
        );
        let r = row_of("r1", who, &made, 1);
        assert_eq!(r.outcome, Outcome::Abandoned);
        assert_eq!((r.cost_micros, r.charged_tokens), (7_000, 500));
    }

    #[test]
    fn a_settlement_the_store_never_confirmed_is_a_row_of_outcome_unknown() {
        let who = Who::new(scope(), 0, Dialect::ChatCompletions, None, None);
        let made = Settling::of(settlement(15, false, Actual::Tokens), Outcome::Answered)
            .used(UsageBreakdown::from_counts(10, 5), Some(3));
        let subject = Subject {
            who: Some(Box::new(who)),
            ..Subject::default()
        };
        let e = Settled {
            id: "r1",
            made: &made,
            applied: None,
            subject: &subject,
        };
        assert!(e.recorded());
        let r = super::row(&e, subject.who.as_deref().expect("who"), 1);
        assert_eq!(r.outcome, Outcome::Unknown);
        assert_eq!((r.charged_tokens, r.cost_micros), (15, 3));
    }
}
