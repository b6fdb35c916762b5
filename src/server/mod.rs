//! The HTTP face of the gateway: axum router, request handlers, the error
//! map and the rate-limit headers. Only the handlers (and the stream relay
//! they start) join budgets and upstreams.
//!
//! - [`handlers`]: the request lifecycle of DESIGN section 1.
//! - [`error`]: every error → status, OpenAI body, retry headers.
//! - [`headers`]: `x-ratelimit-*` and IETF `RateLimit` fields.
//! - [`settlement`]: the reservation guard and settlement tasks.

pub mod error;
pub mod handlers;
pub mod headers;
pub mod settlement;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use axum::routing::{any, get, post};
use axum::Router;

use crate::clock::Clock;
use crate::config::Policy;
use crate::reserve::keys::KeySpace;
use crate::reserve::BudgetStore;
use crate::upstreams::UpstreamClient;
use settlement::SettlementTracker;

/// Everything a request needs, shared by all handlers.
pub struct AppState {
    /// The active policy; swapped atomically on reload, each request keeps the one it started with.
    pub policy: ArcSwap<Policy>,
    /// Budget state.
    pub store: Arc<dyn BudgetStore>,
    /// Time source (the store reads its own; this one stamps logs and responses).
    pub clock: Arc<dyn Clock>,
    /// Pooled upstream client.
    pub upstream: UpstreamClient,
    /// Settlement tasks in flight.
    pub settlements: SettlementTracker,
    /// Deployments that answered 429: no traffic until the given UTC µs (per gateway).
    cooldowns: Mutex<HashMap<String, u64>>,
}

impl AppState {
    /// State for `policy` over `store`.
    pub fn new(policy: Policy, store: Arc<dyn BudgetStore>, clock: Arc<dyn Clock>) -> Arc<Self> {
        Arc::new(Self {
            policy: ArcSwap::from_pointee(policy),
            store,
            clock,
            upstream: UpstreamClient::new(),
            settlements: SettlementTracker::default(),
            cooldowns: Mutex::new(HashMap::new()),
        })
    }

    /// Keeps traffic away from `deployment` until `until_micros` (UTC µs).
    pub fn cool_down(&self, deployment: &str, until_micros: u64) {
        let mut c = self.cooldowns.lock().unwrap_or_else(|e| e.into_inner());
        let entry = c.entry(deployment.to_string()).or_insert(0);
        *entry = (*entry).max(until_micros);
    }

    /// When `deployment` is cooling down at `now` (UTC µs), the end of its cool-down.
    pub fn cooldown_until(&self, deployment: &str, now: u64) -> Option<u64> {
        let c = self.cooldowns.lock().unwrap_or_else(|e| e.into_inner());
        c.get(deployment).copied().filter(|until| *until > now)
    }

    /// Key space of the current policy.
    pub fn key_space(policy: &Policy) -> KeySpace {
        KeySpace::new(&policy.store.key_prefix, &policy.store.domain)
    }
}

/// The gateway's routes.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(handlers::chat_completions))
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/embeddings", post(handlers::embeddings))
        .route("/v1/models", get(handlers::list_models))
        .route("/v1/models/{model}", get(handlers::get_model))
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
        .route("/healthz", get(handlers::healthz))
        .route("/readyz", get(handlers::readyz))
        .route("/v1/{*rest}", any(handlers::unknown_path))
        .fallback(handlers::unknown_path)
        .with_state(state)
}
