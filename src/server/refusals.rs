//! "Why was this refused?": `GET /admin/v1/refusals/{request_id}`
//! answers every refusal this gateway kept of that request id
//! ([`crate::gateway::recent_refusals`]: the last ten minutes), each with
//! the ledger's spend of the refusing budget over its window and what held
//! that budget (holds in flight, units out on leases: read on the record's
//! first ask, one read at a time per gateway, then kept with it). A
//! tenant-scoped admin token reads its subtree only: a request id refused
//! only in other tenants is 404, as one refused nowhere (a 403 would tell
//! it another tenant's request ids); the store refusal a deny-cache
//! refusal reused is named only when its tenant is the caller's to see.

use std::sync::Arc;

use axum::extract::{OriginalUri, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use super::admin::{self, error_response, json_response};
use crate::gateway::recent_refusals::{InFlight, Refusal, KEPT_MICROS};
use crate::gateway::AppState;
use crate::ledger::window;
use crate::lifecycle::refusal::read_in_flight;

/// `GET /admin/v1/refusals/{request_id}`.
pub async fn explain(
    State(st): State<Arc<AppState>>,
    Path(request_id): Path<String>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> Response {
    let reader = match admin::Principal::of(&st, &headers, &uri) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let policy = st.policy.load_full();
    let now = st.clock.now_micros();
    let sees = |t: &str| reader.sees(&policy, t);
    let mut found = st.recent_refusals.find(&request_id, now, sees);
    if found.is_empty() {
        return error_response(
            StatusCode::NOT_FOUND,
            &format!(
                "No refusal of request {request_id:?} is kept by this gateway (refusals are kept {} minutes, per gateway).",
                KEPT_MICROS / 60_000_000
            ),
            Some("not_found"),
        );
    }
    for (tenant, r) in &mut found {
        if r.in_flight.is_none() {
            r.in_flight = in_flight(&st, tenant, r, policy.store.timeout).await;
        }
    }
    let mut refusals = Vec::with_capacity(found.len());
    for (tenant, r) in &found {
        let mut v = r.json(now);
        v["tenant"] = json!(tenant);
        // The origin's tenant, when it is still kept; the root sees every
        // tenant, known or not.
        let origin = r
            .reused
            .as_ref()
            .map(|by| st.recent_refusals.origin_of(&by.reservation_id));
        let shown = match &origin {
            Some(Some((t, request))) if sees(t) => {
                v["reused"]["tenant"] = json!(t);
                v["reused"]["request_id"] = json!(request);
                true
            }
            Some(None) if reader.scope().is_none() => {
                v["reused"]["request_id"] = Value::Null;
                true
            }
            Some(_) => {
                v["reused"] = json!({
                    "age_micros": r.reused.as_ref().map(|by| by.age_micros),
                    "note": "the refusal it reused is of a tenant this admin token does not see",
                });
                false
            }
            None => false,
        };
        v["ledger"] = ledger_of(&st, r, reader.scope().map(str::to_string)).await;
        v["explanation"] = json!(sentence(r, shown));
        refusals.push(v);
    }
    json_response(
        StatusCode::OK,
        json!({"request_id": request_id, "refusals": refusals}),
    )
}

/// What holds the refusing budget of `tenant`'s refusal `r`, read on the
/// first ask and kept with the record (the refusal itself read nothing).
/// One read at a time per gateway: a burst of asks makes one walk of the
/// store's holds after another, never many at once.
async fn in_flight(
    st: &AppState,
    tenant: &str,
    r: &Refusal,
    timeout: std::time::Duration,
) -> Option<InFlight> {
    let spec = r.spec.as_ref()?;
    let _turn = st.recent_refusals.reading().await;
    let kept = st
        .recent_refusals
        .in_flight_of(tenant, &r.request_id, r.at_micros);
    if kept.is_some() {
        return kept;
    }
    let f = read_in_flight(st, spec, r.at_micros, timeout).await;
    st.recent_refusals
        .fill_in_flight(tenant, &r.request_id, r.at_micros, f.clone());
    Some(f)
}

/// The ledger's spend of the refusing budget over its window at the refusal.
async fn ledger_of(st: &AppState, r: &Refusal, caller: Option<String>) -> Value {
    let (Some(scope), Some(name)) = (&r.scope, r.budget) else {
        return Value::Null;
    };
    let Some(range) = window::window_of(name, r.at_micros) else {
        return json!({"note": "a concurrency limit has no window"});
    };
    let Some(reader) = st.spend.get() else {
        return json!({"note": "the ledger is off on this gateway"});
    };
    match window::spend_of(&**reader, scope, range, caller).await {
        Ok(t) => json!({
            "from_micros": range.0,
            "to_micros": range.1,
            "requests": t.requests,
            "charged_tokens": t.charged_tokens,
            "cost_micros": t.cost_micros,
            "in_budget_unit": window::in_unit(name, &t),
        }),
        Err(e) => json!({"note": format!("the ledger did not answer: {e}")}),
    }
}

/// One sentence a person reads first (`origin_shown`: the reused store
/// refusal may be named).
fn sentence(r: &Refusal, origin_shown: bool) -> String {
    let Some(name) = r.budget else {
        return match r.decided_by {
            "queue" => "Refused by the wait queue: it was full.".into(),
            _ => "Refused because the budget store did not answer and the tenant fails closed."
                .into(),
        };
    };
    let scope = r.scope.as_ref().map(|s| s.to_string()).unwrap_or_default();
    let mut s = format!(
        "Refused by {name} of {scope} ({}), decided by the {}: the request asked {} and {} was available.",
        r.reason,
        r.decided_by.replace('_', " "),
        r.requested,
        r.available.map_or("none".to_string(), |a| a.to_string()),
    );
    match &r.reused {
        Some(by) if origin_shown => s.push_str(&format!(
            " The deny cache reused the store's refusal of reservation {} from {} ms before.",
            by.reservation_id,
            by.age_micros / 1000
        )),
        Some(by) => s.push_str(&format!(
            " The deny cache reused the store's refusal of a request {} ms before.",
            by.age_micros / 1000
        )),
        None => {}
    }
    if let Some(f) = &r.in_flight {
        if let Some(h) = &f.holds {
            s.push_str(&format!(
                " {} holds in flight held {} of it",
                h.holds, h.units
            ));
        }
        if let Some(l) = &f.leases {
            s.push_str(&format!(
                "; {} units were out on {} leases",
                l.units, l.leases
            ));
        }
        s.push_str(&format!(
            " (read {} ms after the decision).",
            f.read_after_micros / 1000
        ));
    }
    s
}
