//! The HTTP face of the gateway: axum router, request handlers, the error
//! map and the rate-limit headers. Only the handlers (and the stream relay
//! they start) join budgets and upstreams.
//!
//! - [`handlers`]: the request lifecycle of DESIGN section 1.
//! - [`error`]: every error → status, OpenAI body, retry headers.
//! - [`headers`]: `x-ratelimit-*` and IETF `RateLimit` fields.
//! - [`settlement`]: the reservation guard and settlement tasks.
//! - [`admin`]: the operator API under `/admin/v1/`.

pub mod admin;
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
use crate::reserve::deny_cache::DenyCache;
use crate::reserve::guarded::GuardedStore;
use crate::reserve::keys::KeySpace;
use crate::reserve::memory::MemoryStore;
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
    /// Refusals answered locally without a store call.
    pub deny_cache: DenyCache,
    /// The local limiter used for fail-open tenants while the store is down.
    pub fallback: Arc<MemoryStore>,
    /// SHA-256 of the admin API bearer token; `None` disables the admin API.
    admin_token: Mutex<Option<[u8; 32]>>,
}

impl AppState {
    /// State for `policy` over `store`.
    /// The store is wrapped in a [`GuardedStore`] (timeout, metrics, circuit breaker).
    pub fn new(policy: Policy, store: Arc<dyn BudgetStore>, clock: Arc<dyn Clock>) -> Arc<Self> {
        let store: Arc<dyn BudgetStore> = Arc::new(GuardedStore::new(store, policy.store.timeout));
        crate::metrics::install();
        crate::metrics::policy_version(None, &policy.version);
        Arc::new(Self {
            fallback: Arc::new(MemoryStore::new(clock.clone())),
            deny_cache: DenyCache::new(),
            policy: ArcSwap::from_pointee(policy),
            store,
            clock,
            upstream: UpstreamClient::new(),
            settlements: SettlementTracker::default(),
            cooldowns: Mutex::new(HashMap::new()),
            admin_token: Mutex::new(None),
        })
    }

    /// Enables the admin API with bearer `token`, or disables it (`None` or
    /// empty). Only the token's SHA-256 is kept.
    pub fn set_admin_token(&self, token: Option<&str>) {
        use sha2::Digest;
        let digest = token
            .filter(|t| !t.is_empty())
            .map(|t| <[u8; 32]>::from(sha2::Sha256::digest(t.as_bytes())));
        *self.admin_token.lock().unwrap_or_else(|e| e.into_inner()) = digest;
    }

    /// SHA-256 of the admin token, when the admin API is enabled.
    pub fn admin_token_digest(&self) -> Option<[u8; 32]> {
        *self.admin_token.lock().unwrap_or_else(|e| e.into_inner())
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
        .route("/admin/v1/policy", get(admin::policy))
        .route(
            "/admin/v1/tenants/{tenant}/budgets",
            get(admin::tenant_budgets),
        )
        .route(
            "/admin/v1/upstreams/{upstream}/budgets",
            get(admin::upstream_budgets),
        )
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
    tokio::select! {
        biased;
        resp = next.run(req) => resp,
        _ = tracker.cutoff() => {
            error::ApiError::Unavailable("The gateway is shutting down; retry the request.".into())
                .into_response()
        }
    }
}
