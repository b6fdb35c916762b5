//! The HTTP face of the gateway: axum router, request handlers, the admin
//! and control APIs and pages, and the error map's rendering. It calls the
//! lifecycle and reads the gateway's state ([`crate::gateway`]); nothing
//! below imports it.
//!
//! - [`handlers`]: the routes of the request lifecycle of DESIGN section 1.
//! - [`models`]: `GET /v1/models` in OpenAI's or Anthropic's shape.
//! - [`admin`]: the operator API under `/admin/v1/` and the one admin
//!   authentication ([`admin::Principal`]).
//! - [`control_api`]: tenants, keys, admin tokens and the audit trail
//!   under `/admin/v1/` (the control plane), and `GET /v1/budget`.
//! - [`budget_view`]: every tenant's budgets (`/admin/v1/budgets`) and the
//!   remaining-share gauges.
//! - [`spend`]: the spend ledger's queries and CSV (`/admin/v1/spend…`).
//! - [`refusals`]: "why was this refused?" (`/admin/v1/refusals/{id}`).
//! - [`reconcile`]: the ledger against the store's quota counters
//!   (`/admin/v1/reconcile`).
//! - [`admin_ui`]: the live budget page at `/admin/ui`.
//! - [`connections`]: client connections, their bound and timeouts.

pub mod admin;
pub mod admin_ui;
pub mod budget_view;
pub mod control_api;
pub mod gemini;
pub mod handlers;
pub mod models;
pub mod reconcile;
pub mod refusals;
pub mod spend;

use std::sync::Arc;

use axum::routing::{any, get, post};
use axum::Router;

use crate::gateway::error::ApiError;
use crate::gateway::AppState;
use crate::lifecycle::stored::StoredOp;

/// The gateway's routes.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(handlers::chat_completions))
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/embeddings", post(handlers::embeddings))
        .route("/v1/messages", post(handlers::messages))
        .route("/v1/messages/count_tokens", post(handlers::count_tokens))
        .route("/v1/responses", post(handlers::responses))
        .route(
            "/v1/responses/input_tokens",
            post(handlers::responses_input_tokens),
        )
        .route(
            "/v1/responses/{id}",
            get(|s, p, u, h| handlers::stored_response(StoredOp::Get, s, p, u, h))
                .delete(|s, p, u, h| handlers::stored_response(StoredOp::Delete, s, p, u, h)),
        )
        .route(
            "/v1/responses/{id}/cancel",
            post(|s, p, u, h| handlers::stored_response(StoredOp::Cancel, s, p, u, h)),
        )
        .route(
            "/v1/responses/{id}/input_items",
            get(|s, p, u, h| handlers::stored_response(StoredOp::InputItems, s, p, u, h)),
        )
        .route("/v1beta/models", get(gemini::list))
        .route("/v1beta/models/{*call}", post(gemini::model_call))
        .route("/v1/models", get(models::list))
        // POST: Gemini's `v1` surface (`models/{model}:generateContent`),
        // where the google-genai SDK goes when given a base URL.
        .route(
            "/v1/models/{model}",
            get(models::get).post(gemini::model_call),
        )
        .route(
            "/openai/deployments/{deployment}/chat/completions",
            post(handlers::azure_chat_completions),
        )
        .route(
            "/openai/deployments/{deployment}/completions",
            post(handlers::azure_completions),
        )
        .route(
            "/openai/deployments/{deployment}/embeddings",
            post(handlers::azure_embeddings),
        )
        .route("/admin/v1/policy", get(admin::policy))
        .route("/admin/v1/budgets", get(budget_view::list))
        .route("/admin/v1/spend", get(spend::spend))
        .route("/admin/v1/spend/rows", get(spend::rows))
        .route("/admin/v1/refusals/{request_id}", get(refusals::explain))
        .route("/admin/v1/reconcile", get(reconcile::reconcile))
        .route("/admin/ui", get(admin_ui::page))
        .route("/admin/ui/", get(admin_ui::page))
        .route("/admin/ui/{asset}", get(admin_ui::asset))
        .route(
            "/admin/v1/tenants/{tenant}/budgets",
            get(admin::tenant_budgets),
        )
        .route("/admin/v1/tenants/{tenant}/runs", get(admin::tenant_runs))
        .route(
            "/admin/v1/upstreams/{upstream}/budgets",
            get(admin::upstream_budgets),
        )
        .merge(control_api::routes())
        .route("/healthz", get(handlers::healthz))
        .route("/metrics", get(handlers::metrics))
        .route("/readyz", get(handlers::readyz))
        .route("/v1/{*rest}", any(handlers::unknown_path))
        .fallback(handlers::unknown_path)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            end_at_shutdown_cutoff,
        ))
        .with_state(state)
}

/// Ends a request whose handler is still running when the shutdown grace
/// period is over: the handler is dropped (its reservation settles through
/// its guard, tracked, so shutdown waits for it) and the client gets 503.
/// Streams are not affected once their response has started: the relay
/// cuts them off itself.
async fn end_at_shutdown_cutoff(
    axum::extract::State(st): axum::extract::State<Arc<AppState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let tracker = st.settlements.clone();
    let handler = crate::lifecycle::request_id::scope(next.run(req));
    tokio::pin!(handler);
    tokio::select! {
        biased;
        resp = &mut handler => resp,
        _ = tracker.cutoff() => {
            let mut resp = ApiError::ShuttingDown.into_response();
            // The id the request was named on arrival (its dropped handler
            // logs it as the request's final line).
            if let Some((name, id)) = crate::lifecycle::request_id::published(handler.as_mut()) {
                resp.headers_mut().insert(name, id);
            }
            resp
        }
    }
}
