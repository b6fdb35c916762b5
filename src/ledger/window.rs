//! The ledger's spend of one budget over its window: what
//! "why was this refused?" adds to a refusal and what reconciliation
//! compares with the store's counter. A quota's window is its UTC day or
//! month up to now; a rate's, the last minute; a concurrency limit has
//! none. The budget's scope picks the rows: a tenant's subtree (a parent's
//! budget is reserved by its children's requests too), one of its keys,
//! models or end users, or one deployment.

use super::query::{Dimension, SpendQuery, SpendReader, SpendTotals};
use super::LedgerError;
use crate::budget::calendar::Window;
use crate::budget::{BudgetName, Scope};

const MINUTE_MICROS: u64 = 60_000_000;

/// The window of budget `name` at `now`, `[from, to)` in UTC µs; `None`
/// for concurrency.
pub fn window_of(name: BudgetName, now: u64) -> Option<(u64, u64)> {
    let to = now.saturating_add(1);
    match name {
        BudgetName::TokensPerDay
        | BudgetName::UsdPerDay
        | BudgetName::RequestsPerDay
        | BudgetName::RunsPerDay => Some((Window::Day.start(now), to)),
        BudgetName::TokensPerMonth | BudgetName::UsdPerMonth => {
            Some((Window::Month.start(now), to))
        }
        BudgetName::Rpm | BudgetName::Tpm | BudgetName::InputTpm | BudgetName::OutputTpm => {
            Some((now.saturating_sub(MINUTE_MICROS), to))
        }
        BudgetName::TokensPer5h | BudgetName::UsdPer5h | BudgetName::RequestsPer5h => {
            Some((Window::Hours5.start(now), to))
        }
        BudgetName::TokensPer24h | BudgetName::UsdPer24h | BudgetName::RequestsPer24h => {
            Some((Window::Hours24.start(now), to))
        }
        BudgetName::TokensPerWeek | BudgetName::UsdPerWeek | BudgetName::RequestsPerWeek => {
            Some((Window::Week.start(now), to))
        }
        BudgetName::MaxConcurrent => None,
    }
}

/// What the ledger counted for a budget in its unit: rows for request
/// budgets, charged tokens (input or output tokens for `input_tpm` and
/// `output_tpm`), µ$ for dollar budgets.
pub fn in_unit(name: BudgetName, t: &SpendTotals) -> u64 {
    match name {
        BudgetName::Rpm
        | BudgetName::RequestsPerDay
        | BudgetName::RequestsPer5h
        | BudgetName::RequestsPer24h
        | BudgetName::RequestsPerWeek
        | BudgetName::RunsPerDay => t.requests,
        BudgetName::InputTpm => t.input_tokens + t.cached_read_tokens + t.cache_write_tokens,
        BudgetName::OutputTpm => t.output_tokens,
        BudgetName::UsdPerDay
        | BudgetName::UsdPerMonth
        | BudgetName::UsdPer5h
        | BudgetName::UsdPer24h
        | BudgetName::UsdPerWeek => t.cost_micros,
        BudgetName::Tpm
        | BudgetName::TokensPerDay
        | BudgetName::TokensPerMonth
        | BudgetName::TokensPer5h
        | BudgetName::TokensPer24h
        | BudgetName::TokensPerWeek => t.charged_tokens,
        BudgetName::MaxConcurrent => 0,
    }
}

/// The ledger's totals for `scope` over `[from, to)`, kept to the subtree
/// of `caller` (a tenant-scoped admin token's tenant) when given.
pub async fn spend_of(
    reader: &dyn SpendReader,
    scope: &Scope,
    range: (u64, u64),
    caller: Option<String>,
) -> Result<SpendTotals, LedgerError> {
    spend_decided_by(reader, scope, range, caller, None).await
}

/// [`spend_of`], of the rows whose reservation the layer labelled
/// `decided_by` admitted (every row: `None`).
pub async fn spend_decided_by(
    reader: &dyn SpendReader,
    scope: &Scope,
    (from, to): (u64, u64),
    caller: Option<String>,
    decided_by: Option<&'static str>,
) -> Result<SpendTotals, LedgerError> {
    let (within, dim, value): (Option<&str>, Option<Dimension>, Option<&str>) = match scope {
        Scope::Tenant(t) => (Some(&**t), None, None),
        Scope::Key(t, k) => (Some(&**t), Some(Dimension::Key), Some(&**k)),
        Scope::TenantModel(t, m) => (Some(&**t), Some(Dimension::Model), Some(&**m)),
        Scope::EndUser(t, h) => (Some(&**t), Some(Dimension::EndUser), Some(&**h)),
        Scope::Upstream(d) => (None, Some(Dimension::Deployment), Some(&**d)),
        // A run's rows: its tenant's, filtered on the run id below.
        Scope::Run(t, _) => (Some(&**t), None, None),
    };
    let q = SpendQuery {
        group_by: dim.into_iter().collect(),
        period: None,
        from_micros: from,
        to_micros: to,
        within: within.map(str::to_string),
        scope: caller,
        top: None,
        request_id: None,
        run_id: match scope {
            Scope::Run(_, r) => Some(r.to_string()),
            _ => None,
        },
        decided_by,
    };
    let mut out = SpendTotals::default();
    for d in reader.days(&q).await? {
        if value.is_none_or(|v| d.key.first().map(String::as_str) == Some(v)) {
            out.add(&d.totals);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_follow_the_budget() {
        let day = crate::budget::calendar::MICROS_PER_DAY;
        // 1970-02-03 12:00 UTC.
        let now = 33 * day + day / 2;
        assert_eq!(
            window_of(BudgetName::TokensPerDay, now),
            Some((33 * day, now + 1))
        );
        assert_eq!(
            window_of(BudgetName::UsdPerMonth, now),
            Some((31 * day, now + 1))
        );
        assert_eq!(
            window_of(BudgetName::Rpm, now),
            Some((now - 60_000_000, now + 1))
        );
        assert_eq!(window_of(BudgetName::MaxConcurrent, now), None);
    }

    #[test]
    fn units_follow_the_budget() {
        let t = SpendTotals {
            requests: 2,
            input_tokens: 10,
            cached_read_tokens: 1,
            cache_write_tokens: 0,
            output_tokens: 5,
            reasoning_tokens: 0,
            charged_tokens: 16,
            cost_micros: 70,
        };
        assert_eq!(in_unit(BudgetName::Rpm, &t), 2);
        assert_eq!(in_unit(BudgetName::InputTpm, &t), 11);
        assert_eq!(in_unit(BudgetName::OutputTpm, &t), 5);
        assert_eq!(in_unit(BudgetName::TokensPerDay, &t), 16);
        assert_eq!(in_unit(BudgetName::UsdPerMonth, &t), 70);
    }
}
