//! `GET /v1/models` and `GET /v1/models/{model}`: the models a key may
//! use, in Anthropic's shape (`data[]` of `{type: "model", id,
//! display_name, created_at}`, paginated by `limit`, `after_id`,
//! `before_id`) when the request carries `anthropic-version` or
//! `x-api-key` (Claude Code's model discovery), in OpenAI's otherwise. A
//! pattern entry is listed by the concrete names its `models` gives, never
//! by its pattern. Every key header of the other routes is accepted here.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderName};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::config::{KeyPolicy, ModelPolicy, Policy};
use crate::dialects::{Dialect, KeyHeader};
use crate::gateway::error::ApiError;
use crate::gateway::AppState;
use crate::lifecycle;
use crate::lifecycle::authenticate::{caller, Caller};
use crate::lifecycle::context::RequestContext;

/// Every header a key may come in on the other routes.
static KEY_HEADERS: [KeyHeader; 3] = [
    KeyHeader::Bearer(header::AUTHORIZATION),
    KeyHeader::Plain(HeaderName::from_static("x-api-key")),
    KeyHeader::Plain(HeaderName::from_static("api-key")),
];

/// Anthropic's page size when the request names none, and its largest.
const DEFAULT_LIMIT: usize = 20;
const MAX_LIMIT: usize = 1000;

/// The gateway knows no release dates: every model says the epoch.
const CREATED_AT: &str = "1970-01-01T00:00:00Z";

/// Anthropic's shape: the request carries `anthropic-version` (which wins
/// over a Bearer token) or Anthropic's key header.
fn dialect_of(headers: &HeaderMap) -> Dialect {
    if headers.contains_key(crate::dialects::anthropic::VERSION)
        || headers.contains_key("x-api-key")
    {
        Dialect::Messages
    } else {
        Dialect::ChatCompletions
    }
}

fn authenticate(cx: &mut RequestContext, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let found = caller(&cx.policy, cx.st.clock.now_micros(), &KEY_HEADERS, headers)?;
    cx.finish.tenant = Some(found.tenant);
    Ok(found)
}

/// The names `key` may use that a listing in `dialect`'s shape shows, in
/// configured order: an exact entry's name, a pattern entry's `models`
/// (each only where it resolves to that entry). Anthropic's shape lists
/// Messages models only.
fn listed<'p>(policy: &'p Policy, key: &KeyPolicy, dialect: Dialect) -> Vec<&'p str> {
    let mut names = Vec::new();
    for m in &policy.models {
        if dialect.is_anthropic() && !m.messages {
            continue;
        }
        let own: Vec<&str> = match m.pattern {
            true => m.listed.iter().map(String::as_str).collect(),
            false => vec![m.name.as_str()],
        };
        names.extend(
            own.into_iter()
                .filter(|n| key.allows(n))
                .filter(|n| policy.model(n).is_some_and(|e| std::ptr::eq(e, m))),
        );
    }
    names
}

fn object(dialect: Dialect, id: &str) -> Value {
    if dialect.is_anthropic() {
        json!({"type": "model", "id": id, "display_name": id, "created_at": CREATED_AT})
    } else {
        json!({"id": id, "object": "model", "created": 0, "owned_by": "budgetgate"})
    }
}

/// `GET /v1/models`.
pub async fn list(
    State(st): State<Arc<AppState>>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let dialect = dialect_of(&headers);
    let mut cx = RequestContext::new(st, dialect, &headers).at("GET", "/v1/models");
    let result = authenticate(&mut cx, &headers).and_then(|c| {
        let policy = &cx.policy;
        let names = listed(policy, policy.key(c.tenant, c.key), dialect);
        if !dialect.is_anthropic() {
            let data: Vec<Value> = names.iter().map(|n| object(dialect, n)).collect();
            return Ok(Json(json!({"object": "list", "data": data})).into_response());
        }
        page(&names, &query).map(|p| Json(p).into_response())
    });
    lifecycle::conclude(cx, result)
}

/// One page of Anthropic's list: up to `limit` names after `after_id`, or
/// before `before_id` (an id not listed leaves nothing on that side).
fn page(names: &[&str], query: &HashMap<String, String>) -> Result<Value, ApiError> {
    let invalid = |message: String| ApiError::InvalidRequest {
        param: None,
        message,
    };
    let limit = match query.get("limit") {
        None => DEFAULT_LIMIT,
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|l| (1..=MAX_LIMIT).contains(l))
            .ok_or_else(|| invalid(format!("limit: must be an integer from 1 to {MAX_LIMIT}")))?,
    };
    let at = |id: &String| names.iter().position(|n| n == id);
    let (items, has_more) = match (query.get("after_id"), query.get("before_id")) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "after_id and before_id cannot be given together".into(),
            ))
        }
        (None, Some(before)) => {
            let end = at(before).unwrap_or(0);
            let start = end.saturating_sub(limit);
            (&names[start..end], start > 0)
        }
        (after, None) => {
            let start = after.map_or(0, |a| at(a).map_or(names.len(), |i| i + 1));
            let end = start.saturating_add(limit).min(names.len());
            (&names[start..end], end < names.len())
        }
    };
    Ok(json!({
        "data": items.iter().map(|n| object(Dialect::Messages, n)).collect::<Vec<_>>(),
        "has_more": has_more,
        "first_id": items.first(),
        "last_id": items.last(),
    }))
}

/// `GET /v1/models/{model}`: an unknown name and one the key may not use
/// get the same 404.
pub async fn get(
    State(st): State<Arc<AppState>>,
    Path(model): Path<String>,
    headers: HeaderMap,
) -> Response {
    let dialect = dialect_of(&headers);
    let mut cx = RequestContext::new(st, dialect, &headers).at("GET", "/v1/models/{model}");
    let result = authenticate(&mut cx, &headers).and_then(|c| {
        let policy = &cx.policy;
        let key = policy.key(c.tenant, c.key);
        let served = |m: &ModelPolicy| !dialect.is_anthropic() || m.messages;
        match policy.model(&model) {
            // A name a pattern entry serves is answered under that name.
            Some(m) if key.allows(&model) && served(m) => {
                let id = if m.pattern { model.as_str() } else { &m.name };
                Ok(Json(object(dialect, id)).into_response())
            }
            _ => Err(lifecycle::prepare::not_found(policy, key, dialect, &model)),
        }
    });
    lifecycle::conclude(cx, result)
}
