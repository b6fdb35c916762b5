//! budgetgate: an OpenAI-compatible LLM token-budget gateway.
//!
//! Clients point their OpenAI SDK at the gateway; for every request it
//! estimates the token cost, reserves it atomically against every budget the
//! request touches, forwards the request upstream, meters the answer
//! (streams included) and settles the real usage, refunding what was not used.
//!
//! # Layout
//!
//! - [`clock`]: the one place that reads the wall clock.
//! - [`config`]: typed TOML configuration and its validation.
//! - [`dialects`]: what differs between API surfaces (error body shape).
//! - [`estimate`]: tiktoken cost estimation of request bodies.
//! - [`lifecycle`]: the request path as named phases — authenticate,
//!   prepare, route, admit, forward, meter, settle, finish — and the
//!   per-request context they share.
//! - [`metrics`]: Prometheus metrics with bounded labels.
//! - [`reservation`]: a held reservation (extend, settle, drop backstop),
//!   leases, the settlement tracker, and the deny-cache and fail-open store
//!   layers composed into the gateway's store.
//! - [`reserve`]: the budget model, the `BudgetStore` trait and its stores.
//! - [`server`]: axum router, route handlers, the error map, rate-limit
//!   headers, the admin API and the gateway state.
//! - [`upstreams`]: upstream client, SSE relay and metering.
//! - [`app`]: wiring a policy, a store and a listener into a running gateway.

pub mod app;
pub mod clock;
pub mod config;
pub mod dialects;
pub mod estimate;
pub mod lifecycle;
pub mod metrics;
pub mod reservation;
pub mod reserve;
pub mod server;
pub mod upstreams;
