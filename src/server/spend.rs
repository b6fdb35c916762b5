//! The spend ledger's admin routes (docs/LEDGER.md), behind the admin
//! token like every `/admin/v1/` route:
//!
//! - `GET /admin/v1/spend?group_by=tenant,model&period=day|month&from=YYYY-MM-DD&to=YYYY-MM-DD&tenant=NAME&top=N&format=json|csv`:
//!   totals per group and period; `to` is exclusive; by default the last
//!   30 days; `tenant` keeps the rows of that tenant and its descendants.
//! - `GET /admin/v1/spend/rows?from=&to=&tenant=&request_id=&run_id=&limit=N&format=json|csv`:
//!   the rows themselves, oldest first (the CSV export for finance);
//!   `request_id` keeps the rows of the request a client knows by that id
//!   (every attempt), `run_id` those of a run (`x-budgetgate-run`), each
//!   over all time unless `from` or `to` is given.
//!
//! 503 while the ledger has no database (or it does not answer).

// The refusal is returned as is (`Result<_, Response>`, 128 bytes), as in
// the control API: built on a rare path, boxing it would buy nothing.
#![allow(clippy::result_large_err)]

use std::sync::Arc;

use axum::extract::{OriginalUri, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::admin::{self, json_response};
use crate::gateway::error::{ApiError, OwnStore};
use crate::gateway::AppState;
use crate::ledger::query::{self, csv_field, rfc3339, Dimension, Period, SpendGroup, SpendQuery};
use crate::ledger::{SpendReader, SpendRow};

const DAY_MICROS: u64 = 86_400_000_000;
/// The range when `from` is not given, days before `to`.
const DEFAULT_DAYS: u64 = 30;
/// The end of "all time": 10000-01-01 UTC, past any date `to` accepts.
const ALL_TIME_END: u64 = 253_402_300_800_000_000;
/// Most rows one `/spend/rows` answer holds.
pub const MAX_ROWS: usize = 100_000;

/// The query parameters of both routes.
#[derive(Debug, Default, serde::Deserialize)]
pub struct SpendParams {
    group_by: Option<String>,
    period: Option<String>,
    from: Option<String>,
    to: Option<String>,
    tenant: Option<String>,
    request_id: Option<String>,
    run_id: Option<String>,
    top: Option<usize>,
    limit: Option<usize>,
    format: Option<String>,
}

/// A query parameter the routes refuse (400), and why.
#[derive(Debug)]
pub struct BadParam(&'static str, String);

impl IntoResponse for BadParam {
    fn into_response(self) -> Response {
        ApiError::InvalidRequest {
            message: self.1,
            param: Some(self.0.into()),
        }
        .into_response()
    }
}

fn invalid(param: &'static str, message: String) -> BadParam {
    BadParam(param, message)
}

/// `params` as a query at `now` (UTC µs), or the 400 to answer.
pub fn parse(params: &SpendParams, now: u64) -> Result<SpendQuery, BadParam> {
    let mut group_by = Vec::new();
    for name in params
        .group_by
        .as_deref()
        .unwrap_or("")
        .split(',')
        .filter(|s| !s.is_empty())
    {
        match Dimension::parse(name) {
            Some(d) if !group_by.contains(&d) => group_by.push(d),
            Some(_) => return Err(invalid("group_by", format!("`group_by` names {name:?} twice."))),
            None => return Err(invalid(
                "group_by",
                "`group_by` takes a comma-separated list of tenant, key, model, end_user, deployment, dialect, outcome.".into(),
            )),
        }
    }
    let period = match params.period.as_deref() {
        None | Some("") | Some("none") => None,
        Some("day") => Some(Period::Day),
        Some("month") => Some(Period::Month),
        Some(_) => return Err(invalid("period", "`period` must be day or month.".into())),
    };
    let date = |param: &'static str, v: &Option<String>| -> Result<Option<u64>, BadParam> {
        match v.as_deref() {
            None | Some("") => Ok(None),
            Some(s) => query::parse_date(s).map(Some).ok_or_else(|| {
                invalid(param, format!("`{param}` must be a date YYYY-MM-DD (UTC)."))
            }),
        }
    };
    let request_id = params.request_id.clone().filter(|t| !t.is_empty());
    let (to, from) = (date("to", &params.to)?, date("from", &params.from)?);
    // A request looked up by its id: whenever it was, unless the caller
    // bounds it.
    let run_given = params.run_id.as_deref().is_some_and(|r| !r.is_empty());
    let all_time = (request_id.is_some() || run_given) && to.is_none() && from.is_none();
    let to = match to {
        Some(to) => to,
        None if all_time => ALL_TIME_END,
        None => (now / DAY_MICROS + 1) * DAY_MICROS,
    };
    let from = match from {
        Some(from) => from,
        None if all_time => 0,
        None => to.saturating_sub(DEFAULT_DAYS * DAY_MICROS),
    };
    if from >= to {
        return Err(invalid("from", "`from` must be before `to`.".into()));
    }
    if params.top == Some(0) {
        return Err(invalid("top", "`top` must be at least 1.".into()));
    }
    Ok(SpendQuery {
        group_by,
        period,
        from_micros: from,
        to_micros: to,
        within: params.tenant.clone().filter(|t| !t.is_empty()),
        scope: None,
        top: params.top,
        request_id,
        run_id: params.run_id.clone().filter(|t| !t.is_empty()),
        decided_by: None,
    })
}

fn csv_format(params: &SpendParams) -> Result<bool, BadParam> {
    match params.format.as_deref() {
        None | Some("json") => Ok(false),
        Some("csv") => Ok(true),
        Some(_) => Err(invalid("format", "`format` must be json or csv.".into())),
    }
}

fn reader_of(st: &AppState) -> Option<&Arc<dyn SpendReader>> {
    st.spend.get()
}

fn no_database() -> Response {
    ApiError::OwnStoreUnavailable {
        store: OwnStore::Ledger,
        message: "The spend ledger has no database on this gateway.".into(),
    }
    .into_response()
}

fn unavailable(e: crate::ledger::LedgerError) -> Response {
    tracing::warn!(error = %e, "spend query failed");
    ApiError::OwnStoreUnavailable {
        store: OwnStore::Ledger,
        message: "The spend ledger's database did not answer; please retry.".into(),
    }
    .into_response()
}

fn csv_response(name: &str, body: String) -> Response {
    let mut r = (StatusCode::OK, body).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/csv; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{name}.csv\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    r
}

/// A tenant-scoped token's query covers its subtree as the rows recorded
/// it (a tenant deleted and its name reused elsewhere keeps its rows out
/// of reach); a `tenant` outside the subtree today is 403.
fn scope_to(reader: &admin::Principal, st: &AppState, q: &mut SpendQuery) -> Result<(), Response> {
    let Some(root) = reader.scope() else {
        return Ok(());
    };
    if let Some(t) = &q.within {
        reader.check_sees(&st.policy.load(), t)?;
    }
    q.scope = Some(root.to_string());
    Ok(())
}

/// `GET /admin/v1/spend`.
pub async fn spend(
    State(st): State<Arc<AppState>>,
    params: Result<Query<SpendParams>, axum::extract::rejection::QueryRejection>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> Response {
    let reader = match admin::Principal::of(&st, &headers, &uri) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let Ok(Query(params)) = params else {
        return invalid("top", "`top` and `limit` must be whole numbers.".into()).into_response();
    };
    let (mut q, csv) = match (parse(&params, st.clock.now_micros()), csv_format(&params)) {
        (Ok(q), Ok(csv)) => (q, csv),
        (Err(r), _) | (_, Err(r)) => return r.into_response(),
    };
    if let Err(r) = scope_to(&reader, &st, &mut q) {
        return r;
    }
    let Some(reader) = reader_of(&st) else {
        return no_database();
    };
    let groups = match query::spend(&**reader, &q).await {
        Ok(g) => g,
        Err(e) => return unavailable(e),
    };
    if csv {
        return csv_response("spend", query::to_csv(&q, &groups));
    }
    json_response(StatusCode::OK, spend_json(&q, &groups))
}

/// The JSON answer of `/admin/v1/spend`.
pub fn spend_json(q: &SpendQuery, groups: &[SpendGroup]) -> Value {
    let data: Vec<Value> = groups
        .iter()
        .map(|g| {
            let mut o = serde_json::Map::new();
            if let Some(p) = &g.period {
                o.insert("period".into(), json!(p));
            }
            for (d, k) in q.group_by.iter().zip(&g.key) {
                o.insert(d.name().into(), json!(k));
            }
            let t = &g.totals;
            for (name, v) in query::TOTAL_COLUMNS.iter().zip([
                t.requests,
                t.input_tokens,
                t.cached_read_tokens,
                t.cache_write_tokens,
                t.output_tokens,
                t.reasoning_tokens,
                t.charged_tokens,
                t.cost_micros,
            ]) {
                o.insert((*name).into(), json!(v));
            }
            o.insert(
                "cost_usd".into(),
                json!(crate::money::format_usd(t.cost_micros as i64)),
            );
            Value::Object(o)
        })
        .collect();
    json!({
        "from": query::period_name(Period::Day, query::day_of(q.from_micros)),
        "to": query::period_name(Period::Day, query::day_of(q.to_micros)),
        "tenant": q.within,
        "group_by": q.group_by.iter().map(|d| d.name()).collect::<Vec<_>>(),
        "data": data,
    })
}

/// `GET /admin/v1/spend/rows`.
pub async fn rows(
    State(st): State<Arc<AppState>>,
    params: Result<Query<SpendParams>, axum::extract::rejection::QueryRejection>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> Response {
    let reader = match admin::Principal::of(&st, &headers, &uri) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let Ok(Query(params)) = params else {
        return invalid("limit", "`top` and `limit` must be whole numbers.".into()).into_response();
    };
    let (mut q, csv) = match (parse(&params, st.clock.now_micros()), csv_format(&params)) {
        (Ok(q), Ok(csv)) => (q, csv),
        (Err(r), _) | (_, Err(r)) => return r.into_response(),
    };
    if let Err(r) = scope_to(&reader, &st, &mut q) {
        return r;
    }
    let limit = params.limit.unwrap_or(MAX_ROWS);
    if limit == 0 || limit > MAX_ROWS {
        return invalid("limit", format!("`limit` must be within 1..={MAX_ROWS}.")).into_response();
    }
    let Some(reader) = reader_of(&st) else {
        return no_database();
    };
    let rows = match reader.rows(&q, limit).await {
        Ok(r) => r,
        Err(e) => return unavailable(e),
    };
    if csv {
        return csv_response("spend-rows", rows_csv(&rows));
    }
    json_response(
        StatusCode::OK,
        json!({"data": rows.iter().map(row_json).collect::<Vec<_>>()}),
    )
}

/// The columns of a row, in the CSV export's order.
pub const ROW_COLUMNS: [&str; 23] = [
    "reservation_id",
    "request_id",
    "attempt",
    "at",
    "tenant",
    "ancestors",
    "key",
    "end_user",
    "model",
    "deployment",
    "dialect",
    "input_tokens",
    "cached_read_tokens",
    "cache_write_tokens",
    "output_tokens",
    "reasoning_tokens",
    "charged_tokens",
    "cost_micros",
    "outcome",
    "price_version",
    "decided_by",
    "at_micros",
    "run_id",
];

fn row_fields(r: &SpendRow) -> [String; 23] {
    [
        r.reservation_id.clone(),
        r.request_id.clone(),
        r.attempt.to_string(),
        rfc3339(r.at_micros),
        r.tenant.to_string(),
        r.ancestors
            .iter()
            .map(|a| &**a)
            .collect::<Vec<_>>()
            .join("/"),
        r.key_id.to_string(),
        r.end_user.as_deref().unwrap_or("").to_string(),
        r.model.to_string(),
        r.deployment.to_string(),
        r.dialect.to_string(),
        r.input_tokens.to_string(),
        r.cached_read_tokens.to_string(),
        r.cache_write_tokens.to_string(),
        r.output_tokens.to_string(),
        r.reasoning_tokens.to_string(),
        r.charged_tokens.to_string(),
        r.cost_micros.to_string(),
        r.outcome.as_str().to_string(),
        r.price_version.to_string(),
        r.decided_by.to_string(),
        r.at_micros.to_string(),
        r.run_id.as_deref().unwrap_or("").to_string(),
    ]
}

/// Rows as CSV, a header line first.
pub fn rows_csv(rows: &[SpendRow]) -> String {
    let mut out = ROW_COLUMNS.join(",");
    out.push('\n');
    for r in rows {
        let fields: Vec<String> = row_fields(r).iter().map(|f| csv_field(f)).collect();
        out.push_str(&fields.join(","));
        out.push('\n');
    }
    out
}

fn row_json(r: &SpendRow) -> Value {
    json!({
        "reservation_id": r.reservation_id,
        "request_id": r.request_id,
        "attempt": r.attempt,
        "at": rfc3339(r.at_micros),
        "at_micros": r.at_micros,
        "tenant": &*r.tenant,
        "ancestors": r.ancestors.iter().map(|a| &**a).collect::<Vec<_>>(),
        "key": &*r.key_id,
        "end_user": r.end_user.as_deref(),
        "run_id": r.run_id.as_deref(),
        "model": &*r.model,
        "deployment": &*r.deployment,
        "dialect": r.dialect,
        "input_tokens": r.input_tokens,
        "cached_read_tokens": r.cached_read_tokens,
        "cache_write_tokens": r.cache_write_tokens,
        "output_tokens": r.output_tokens,
        "reasoning_tokens": r.reasoning_tokens,
        "charged_tokens": r.charged_tokens,
        "cost_micros": r.cost_micros,
        "outcome": r.outcome.as_str(),
        "price_version": &*r.price_version,
        "decided_by": r.decided_by,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_range_is_the_last_thirty_days_through_today() {
        let now = query::parse_date("2026-12-02").unwrap() + 3_600_000_000;
        let q = parse(&SpendParams::default(), now).unwrap();
        assert_eq!(
            query::period_name(Period::Day, query::day_of(q.from_micros)),
            "2026-11-03"
        );
        assert_eq!(
            query::period_name(Period::Day, query::day_of(q.to_micros)),
            "2026-12-03"
        );
        let bad = SpendParams {
            group_by: Some("tenant,colour".into()),
            ..Default::default()
        };
        assert_eq!(
            parse(&bad, now).unwrap_err().into_response().status(),
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn a_request_id_is_looked_up_over_all_time_unless_bounded() {
        let now = query::parse_date("2026-12-02").unwrap();
        let by_id = SpendParams {
            request_id: Some("req-1".into()),
            ..Default::default()
        };
        let q = parse(&by_id, now).unwrap();
        assert_eq!(q.request_id.as_deref(), Some("req-1"));
        assert_eq!((q.from_micros, q.to_micros), (0, ALL_TIME_END));
        assert_eq!(
            query::period_name(Period::Day, query::day_of(ALL_TIME_END)),
            "10000-01-01"
        );
        let bounded = SpendParams {
            from: Some("2026-11-01".into()),
            ..by_id
        };
        let q = parse(&bounded, now).unwrap();
        assert_eq!(q.from_micros, query::parse_date("2026-11-01").unwrap());
        assert_eq!(q.to_micros, query::parse_date("2026-12-03").unwrap());
        let empty = SpendParams {
            request_id: Some(String::new()),
            ..Default::default()
        };
        assert_eq!(parse(&empty, now).unwrap().request_id, None);
    }

    #[test]
    fn times_are_written_in_utc() {
        assert_eq!(
            rfc3339(86_400_000_000 + 3_723_000_042),
            "1970-01-02T01:02:03.000042Z"
        );
    }
}
