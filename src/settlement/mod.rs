//! The settlement event and its observers (DESIGN section 9).
//!
//! A settlement is made in one of three places, each naming its
//! [`Outcome`]: the settle phase (a whole answer), the relay's meter (a
//! stream) and the drop backstop (a hold dropped unsettled); refunds and
//! voids name theirs where the request fails. The maker hands the hold a
//! [`Settling`] (the store's settlement, the outcome, the usage and the
//! cost); once the store has answered, one [`Settled`] event goes to every
//! [`Observer`] of the gateway's [`Observers`], in order. Observers never
//! block (the event is delivered on the task that settled): one that needs
//! I/O queues what it needs in its own bounded buffer. What a settlement is
//! about ([`Subject`]: the tenant's counters, the deny-cache entries, the
//! budgets waiting lines watch, who and what for the ledger and the spans)
//! is built once at admission and carried by the hold unread.
//!
//! - `outcome`: [`Outcome`], how the reservation ended.
//! - `subject`: [`Subject`] and its parts ([`Who`], [`Scope`], [`DenyRelease`]).

mod outcome;
mod subject;

use std::sync::Arc;

pub use outcome::Outcome;
pub use subject::{dialect_name, DenyRelease, Returned, Scope, Subject, Tally, Who, DIALECTS};

use crate::budget::{Actual, SettleOutcome, Settlement};
use crate::dialects::UsageBreakdown;

/// A settlement as its maker hands it to the hold: what the store applies,
/// and what the observers are told of it.
#[derive(Debug, Clone)]
pub struct Settling {
    /// What the store applies (tokens, and amounts per budget).
    pub settlement: Settlement,
    /// How the reservation ended.
    pub outcome: Outcome,
    /// What the answer used, when an answer was metered.
    pub usage: Option<UsageBreakdown>,
    /// The settled cost, µ$, when the deployment is priced and an answer
    /// was metered.
    pub cost_micros: Option<u64>,
}

impl Settling {
    /// `settlement`, ended as `outcome`, with no metered usage.
    pub fn of(settlement: Settlement, outcome: Outcome) -> Self {
        Self {
            settlement,
            outcome,
            usage: None,
            cost_micros: None,
        }
    }

    /// The same with the answer's usage and its cost.
    pub fn used(mut self, usage: UsageBreakdown, cost_micros: Option<u64>) -> Self {
        self.usage = Some(usage);
        self.cost_micros = cost_micros;
        self
    }
}

/// One settlement the store has answered (or never confirmed), as every
/// observer sees it.
pub struct Settled<'a> {
    /// The reservation id.
    pub id: &'a str,
    /// The settlement as made (tokens and amounts bounded as applied).
    pub made: &'a Settling,
    /// The store's answer; `None` when it never confirmed the settlement
    /// within its retry window (an attempt may have applied).
    pub applied: Option<&'a SettleOutcome>,
    /// What the settlement is about.
    pub subject: &'a Subject,
}

/// What a settlement charged, as the ledger row and the span record it.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// How the reservation ended (`Unknown` when the store never confirmed).
    pub outcome: Outcome,
    /// The usage charged (zero counts when nothing was).
    pub usage: UsageBreakdown,
    /// Tokens the settlement charged the token budgets.
    pub charged_tokens: u64,
    /// The cost charged, µ$.
    pub cost_micros: u64,
}

impl Settled<'_> {
    /// True when the store applied the settlement now or before (a retry
    /// after a lost reply answers `AlreadySettled`), or never confirmed it:
    /// the settlements the ledger keeps a row of.
    pub fn recorded(&self) -> bool {
        matches!(
            self.applied,
            None | Some(SettleOutcome::Settled { .. } | SettleOutcome::AlreadySettled)
        )
    }

    /// What the settlement charged. A refund (upstream failed, nothing
    /// metered) and a void charge nothing, whatever was used; an abandoned
    /// hold costs what its dollar budget was charged.
    pub fn figures(&self) -> Figures {
        let made = self.made;
        let s = &made.settlement;
        let refunded = s.upstream_failed && made.usage.is_none();
        let charged = made.outcome != Outcome::Voided && !refunded;
        let usd_index = self.subject.who.as_ref().and_then(|w| w.usd_index);
        let cost = match (made.cost_micros, made.outcome, &s.actual) {
            (Some(c), _, _) => c,
            (None, Outcome::Abandoned, Actual::PerSpec(amounts)) => {
                usd_index.and_then(|i| amounts.get(i).copied()).unwrap_or(0)
            }
            _ => 0,
        };
        Figures {
            outcome: match self.applied {
                None => Outcome::Unknown,
                Some(_) => made.outcome,
            },
            usage: made
                .usage
                .filter(|_| charged)
                .unwrap_or(UsageBreakdown::from_counts(0, 0)),
            charged_tokens: if charged { s.actual_tokens } else { 0 },
            cost_micros: if charged { cost } else { 0 },
        }
    }

    /// Tokens reserved and refunded, when the store applied the settlement now.
    pub fn applied_now(&self) -> Option<(u64, u64)> {
        match self.applied {
            Some(SettleOutcome::Settled {
                reserved, refunded, ..
            }) => Some((*reserved, *refunded)),
            _ => None,
        }
    }
}

/// Told of every settlement once the store has answered it. Called on the
/// task that settled: it must not block or wait (one that needs I/O
/// queues the event's part it needs in a bounded buffer of its own).
pub trait Observer: Send + Sync {
    /// The settlement `e` was answered.
    fn settled(&self, e: &Settled<'_>);
}

/// The gateway's observers, in the order they are told.
#[derive(Clone, Default)]
pub struct Observers(Arc<[Arc<dyn Observer>]>);

impl Observers {
    /// `list`, told in its order.
    pub fn new(list: Vec<Arc<dyn Observer>>) -> Self {
        Self(list.into())
    }

    /// Tells every observer of `e`.
    pub fn settled(&self, e: &Settled<'_>) {
        for o in self.0.iter() {
            o.settled(e);
        }
    }

    /// How many observers there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
