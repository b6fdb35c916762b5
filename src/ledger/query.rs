//! Spend queries: totals grouped by any of tenant, key, model, end user,
//! deployment, dialect and outcome, per day or month (UTC), within a time
//! range and a tenant's subtree; top N by cost; CSV. The database sums per
//! group and day ([`DayTotal`]); months and the top N are folded here, so
//! the SQL stays the same on SQLite and PostgreSQL.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::budget::calendar::{civil_from_days, days_from_civil};

const DAY_MICROS: u64 = 86_400_000_000;

/// Where spend is read from (the control database).
#[async_trait::async_trait]
pub trait SpendReader: Send + Sync + 'static {
    /// Totals per group of `q.group_by` and UTC day, over `q`'s range and subtree.
    async fn days(&self, q: &SpendQuery) -> Result<Vec<DayTotal>, super::batcher::LedgerError>;
    /// The rows of `q`'s range and subtree, oldest first, at most `limit`.
    async fn rows(
        &self,
        q: &SpendQuery,
        limit: usize,
    ) -> Result<Vec<super::SpendRow>, super::batcher::LedgerError>;
    /// The extent of `q`'s rows (range and subtree): their count, the
    /// first one's time, the largest charge (reconciliation's crash bound).
    async fn extent(&self, q: &SpendQuery) -> Result<Extent, super::batcher::LedgerError>;
}

/// The extent of a set of rows ([`SpendReader::extent`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Extent {
    /// Rows.
    pub rows: u64,
    /// When the first was settled, UTC µs (none without rows).
    pub first_micros: Option<u64>,
    /// The largest `charged_tokens` of a row.
    pub max_charged_tokens: u64,
    /// The largest `cost_micros` of a row.
    pub max_cost_micros: u64,
}

/// Spend of `q`, folded ([`fold`]).
pub async fn spend(
    reader: &dyn SpendReader,
    q: &SpendQuery,
) -> Result<Vec<SpendGroup>, super::batcher::LedgerError> {
    Ok(fold(q, reader.days(q).await?))
}

/// A column spend can be grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dimension {
    /// The request's own tenant.
    Tenant,
    /// The key id.
    Key,
    /// The public model.
    Model,
    /// The end user's keyed hash (empty when the request named none).
    EndUser,
    /// The deployment.
    Deployment,
    /// The API surface.
    Dialect,
    /// How the request ended.
    Outcome,
}

impl Dimension {
    /// The dimension a query parameter names.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "tenant" => Dimension::Tenant,
            "key" => Dimension::Key,
            "model" => Dimension::Model,
            "end_user" => Dimension::EndUser,
            "deployment" => Dimension::Deployment,
            "dialect" => Dimension::Dialect,
            "outcome" => Dimension::Outcome,
            _ => return None,
        })
    }

    /// Its name in queries, JSON and CSV headers.
    pub const fn name(self) -> &'static str {
        match self {
            Dimension::Tenant => "tenant",
            Dimension::Key => "key",
            Dimension::Model => "model",
            Dimension::EndUser => "end_user",
            Dimension::Deployment => "deployment",
            Dimension::Dialect => "dialect",
            Dimension::Outcome => "outcome",
        }
    }

    /// Its column in the table (a fixed name, never client text).
    pub const fn column(self) -> &'static str {
        match self {
            Dimension::Tenant => "tenant",
            Dimension::Key => "key_id",
            Dimension::Model => "model",
            Dimension::EndUser => "end_user",
            Dimension::Deployment => "deployment",
            Dimension::Dialect => "dialect",
            Dimension::Outcome => "outcome",
        }
    }
}

/// Totals per day or per month.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    /// `YYYY-MM-DD`.
    Day,
    /// `YYYY-MM`.
    Month,
}

/// A spend query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpendQuery {
    /// Columns the totals are grouped by (none: one total).
    pub group_by: Vec<Dimension>,
    /// Totals per day or month; `None`: over the whole range.
    pub period: Option<Period>,
    /// Rows settled at or after this, UTC µs.
    pub from_micros: u64,
    /// Rows settled before this, UTC µs.
    pub to_micros: u64,
    /// Only rows of this tenant and its descendants.
    pub within: Option<String>,
    /// Only rows recorded in this tenant's subtree as well: a tenant-scoped
    /// caller's own tenant (`within` may name a tenant inside it).
    pub scope: Option<String>,
    /// Only this many groups, by cost (then requests) descending.
    pub top: Option<usize>,
    /// Only the rows of the request the client knows by this id (every
    /// attempt of it; the same id sent by clients of other tenants too,
    /// unless `scope` keeps them out).
    pub request_id: Option<String>,
    /// Only the rows of this run (`x-budgetgate-run`).
    pub run_id: Option<String>,
    /// Only the rows of reservations this layer admitted
    /// ([`super::SpendRow::decided_by`]).
    pub decided_by: Option<&'static str>,
}

/// Sums over a set of rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpendTotals {
    /// Rows (settled or voided reservations).
    pub requests: u64,
    /// Uncached input tokens.
    pub input_tokens: u64,
    /// Cache reads.
    pub cached_read_tokens: u64,
    /// Cache writes.
    pub cache_write_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Reasoning tokens.
    pub reasoning_tokens: u64,
    /// Tokens charged to token budgets.
    pub charged_tokens: u64,
    /// µ$.
    pub cost_micros: u64,
}

impl SpendTotals {
    /// Adds `o`.
    pub fn add(&mut self, o: &SpendTotals) {
        self.requests += o.requests;
        self.input_tokens += o.input_tokens;
        self.cached_read_tokens += o.cached_read_tokens;
        self.cache_write_tokens += o.cache_write_tokens;
        self.output_tokens += o.output_tokens;
        self.reasoning_tokens += o.reasoning_tokens;
        self.charged_tokens += o.charged_tokens;
        self.cost_micros += o.cost_micros;
    }
}

/// What the database answers: totals of one group on one day (`day`:
/// days since 1970-01-01, UTC).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DayTotal {
    /// The group's values, in the query's `group_by` order.
    pub key: Vec<String>,
    /// The day.
    pub day: i64,
    /// Its totals.
    pub totals: SpendTotals,
}

/// One line of a query's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpendGroup {
    /// The group's values, in the query's `group_by` order.
    pub key: Vec<String>,
    /// The day or month, when the query has a period.
    pub period: Option<String>,
    /// Its totals.
    pub totals: SpendTotals,
}

/// Folds day totals into the query's periods, largest cost first (ties:
/// by period, then group, so the answer is stable), cut to its top N.
pub fn fold(q: &SpendQuery, days: Vec<DayTotal>) -> Vec<SpendGroup> {
    let mut groups: BTreeMap<(Option<String>, Vec<String>), SpendTotals> = BTreeMap::new();
    for d in days {
        let period = q.period.map(|p| period_name(p, d.day));
        groups.entry((period, d.key)).or_default().add(&d.totals);
    }
    let mut out: Vec<SpendGroup> = groups
        .into_iter()
        .map(|((period, key), totals)| SpendGroup {
            key,
            period,
            totals,
        })
        .collect();
    if let Some(n) = q.top {
        out.sort_by(|a, b| {
            b.totals
                .cost_micros
                .cmp(&a.totals.cost_micros)
                .then(b.totals.requests.cmp(&a.totals.requests))
        });
        out.truncate(n);
    }
    out
}

/// `YYYY-MM-DD` or `YYYY-MM` of day number `day`.
pub fn period_name(p: Period, day: i64) -> String {
    let (y, m, d) = civil_from_days(day);
    match p {
        Period::Day => format!("{y:04}-{m:02}-{d:02}"),
        Period::Month => format!("{y:04}-{m:02}"),
    }
}

/// The UTC µs at the start of `YYYY-MM-DD`.
pub fn parse_date(s: &str) -> Option<u64> {
    let mut parts = s.splitn(3, '-');
    let y: i64 = parts.next()?.parse().ok()?;
    let m: i64 = parts.next()?.parse().ok()?;
    let d: i64 = parts.next()?.parse().ok()?;
    if !(1970..=9999).contains(&y) || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let days = days_from_civil(y, m, d);
    // 2026-02-31 would silently become March: refused instead.
    if civil_from_days(days) != (y, m, d) {
        return None;
    }
    Some(days as u64 * DAY_MICROS)
}

/// The day number of `micros`.
pub fn day_of(micros: u64) -> i64 {
    (micros / DAY_MICROS) as i64
}

/// The answer as CSV: a header line, then one line per group.
pub fn to_csv(q: &SpendQuery, groups: &[SpendGroup]) -> String {
    let mut out = String::new();
    let mut header: Vec<&str> = Vec::new();
    if q.period.is_some() {
        header.push("period");
    }
    header.extend(q.group_by.iter().map(|d| d.name()));
    header.extend(TOTAL_COLUMNS);
    out.push_str(&header.join(","));
    out.push('\n');
    for g in groups {
        let mut fields: Vec<String> = Vec::new();
        if let Some(p) = &g.period {
            fields.push(csv_field(p));
        }
        fields.extend(g.key.iter().map(|k| csv_field(k)));
        let t = &g.totals;
        for v in [
            t.requests,
            t.input_tokens,
            t.cached_read_tokens,
            t.cache_write_tokens,
            t.output_tokens,
            t.reasoning_tokens,
            t.charged_tokens,
            t.cost_micros,
        ] {
            fields.push(v.to_string());
        }
        let _ = writeln!(out, "{}", fields.join(","));
    }
    out
}

/// The totals' names, in CSV and JSON.
pub const TOTAL_COLUMNS: [&str; 8] = [
    "requests",
    "input_tokens",
    "cached_read_tokens",
    "cache_write_tokens",
    "output_tokens",
    "reasoning_tokens",
    "charged_tokens",
    "cost_micros",
];

/// A CSV field (RFC 4180): quoted when it holds a comma, quote or line
/// break, and when it starts with a character a spreadsheet would read as
/// a formula (the text stays literal).
pub fn csv_field(s: &str) -> String {
    let formula = s.starts_with(['=', '+', '-', '@', '\t', '\r']);
    if formula || s.contains([',', '"', '\n', '\r']) {
        let body = s.replace('"', "\"\"");
        if formula {
            format!("\"'{body}\"")
        } else {
            format!("\"{body}\"")
        }
    } else {
        s.to_string()
    }
}

/// `YYYY-MM-DDTHH:MM:SS.ffffffZ` of UTC µs.
pub fn rfc3339(micros: u64) -> String {
    let secs = micros / 1_000_000;
    let day = day_of(micros);
    let s = secs % 86_400;
    format!(
        "{}T{:02}:{:02}:{:02}.{:06}Z",
        period_name(Period::Day, day),
        s / 3600,
        s / 60 % 60,
        s % 60,
        micros % 1_000_000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(key: &[&str], day: i64, cost: u64) -> DayTotal {
        DayTotal {
            key: key.iter().map(|s| s.to_string()).collect(),
            day,
            totals: SpendTotals {
                requests: 1,
                cost_micros: cost,
                ..Default::default()
            },
        }
    }

    fn query(period: Option<Period>, top: Option<usize>) -> SpendQuery {
        SpendQuery {
            group_by: vec![Dimension::Model],
            period,
            from_micros: 0,
            to_micros: u64::MAX,
            within: None,
            scope: None,
            top,
            request_id: None,
            run_id: None,
            decided_by: None,
        }
    }

    #[test]
    fn days_fold_into_months_and_the_top_n_is_by_cost() {
        let nov30 = days_from_civil(2026, 11, 30);
        let dec1 = days_from_civil(2026, 12, 1);
        let days = vec![
            day(&["a"], nov30, 5),
            day(&["a"], dec1, 7),
            day(&["a"], dec1 + 1, 1),
            day(&["b"], dec1, 20),
        ];
        let months = fold(&query(Some(Period::Month), None), days.clone());
        let got: Vec<(String, String, u64)> = months
            .iter()
            .map(|g| {
                (
                    g.period.clone().unwrap(),
                    g.key[0].clone(),
                    g.totals.cost_micros,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("2026-11".into(), "a".into(), 5),
                ("2026-12".into(), "a".into(), 8),
                ("2026-12".into(), "b".into(), 20)
            ]
        );
        let top = fold(&query(None, Some(1)), days);
        assert_eq!(top.len(), 1);
        assert_eq!(
            (top[0].key[0].as_str(), top[0].totals.cost_micros),
            ("b", 20)
        );
    }

    #[test]
    fn dates_are_whole_utc_days_and_impossible_ones_are_refused() {
        assert_eq!(parse_date("1970-01-02"), Some(DAY_MICROS));
        assert_eq!(
            period_name(Period::Day, day_of(parse_date("2026-12-02").unwrap())),
            "2026-12-02"
        );
        assert_eq!(parse_date("2026-02-31"), None);
        assert_eq!(parse_date("2026-13-01"), None);
        assert_eq!(parse_date("yesterday"), None);
    }

    #[test]
    fn csv_fields_stay_literal() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("=cmd()"), "\"'=cmd()\"");
        let q = SpendQuery {
            period: Some(Period::Day),
            ..query(None, None)
        };
        let g = SpendGroup {
            key: vec!["m,1".into()],
            period: Some("2026-12-01".into()),
            totals: SpendTotals {
                requests: 2,
                cost_micros: 9,
                ..Default::default()
            },
        };
        assert_eq!(
            to_csv(&q, &[g]),
            "period,model,requests,input_tokens,cached_read_tokens,cache_write_tokens,output_tokens,reasoning_tokens,charged_tokens,cost_micros\n2026-12-01,\"m,1\",2,0,0,0,0,0,0,9\n"
        );
    }
}
