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
//! - [`metrics`]: Prometheus metrics with bounded labels.
//! - [`reservation`]: a held reservation (extend, settle, drop backstop),
//!   leases, the settlement tracker, and the deny-cache and fail-open store
//!   layers composed into the gateway's store.
//! - [`reserve`]: the budget model, the `BudgetStore` trait and its stores.
//! - [`server`]: axum router, handlers, error map, rate-limit headers.
//! - [`upstreams`]: upstream client, SSE relay and metering.
//! - [`tls`]: HTTPS on the listener, certificate reload.
//! - [`app`]: wiring a policy, a store and a listener into a running gateway.

pub mod app;
pub mod clock;
pub mod config;
pub mod dialects;
pub mod estimate;
pub mod metrics;
pub mod reservation;
pub mod reserve;
pub mod server;
pub mod tls;
pub mod upstreams;
