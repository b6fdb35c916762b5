//! budgetgate: an OpenAI-compatible LLM token-budget gateway.
//!
//! Clients point their OpenAI SDK at the gateway; for every request it
//! estimates the token cost, reserves it atomically against every budget the
//! request touches, forwards the request upstream, meters the answer
//! (streams included) and settles the real usage, refunding what was not used.
//!
//! # Layout
//!
//! The modules stand on floors (DESIGN §9, checked by
//! `tests/it/house.rs`): from the bottom `clock`, `money`, `db`,
//! `admin_call`; `config`; `budget`, `estimate`; the layers (`dialects`,
//! `settlement`, `metrics`, `connections`, `tls`, `upstreams`, `queue`, `telemetry`, `control`, `ledger`,
//! `alerts`, `admission`); `gateway`; `lifecycle`; `server`, `admin_cli`;
//! `app`. Imports point down.
//!
//! - [`clock`]: the one place that reads the wall clock.
//! - [`config`]: typed TOML configuration and its validation; every
//!   settings type of every feature (`[store]`, `[queue]`, `[ledger]`,
//!   `[alerts]`, `[telemetry]`, `[server.tls]`, `[estimation]`, beta
//!   policies) and the bounds validation checks. Imports no feature.
//! - [`control`]: the control plane: runtime tenants, keys and admin
//!   tokens, their merge into the policy and their propagation to every
//!   gateway.
//! - [`db`]: the database handle the control plane and the ledger share
//!   (SQLite or PostgreSQL), the embedded migrations, the state directory.
//! - [`dialects`]: everything that differs between API surfaces (chat,
//!   completions, embeddings, Responses, Anthropic Messages): estimate,
//!   cap field, usage breakdown, output counting, cutoff frames, error
//!   body, rate-limit headers (`x-ratelimit-*`, IETF `RateLimit`,
//!   Anthropic's), named stream events, the provider objects a body
//!   refers to.
//! - [`estimate`]: tiktoken cost estimation of request bodies, by body
//!   shape (no dialect: `dialects` maps each to its shape).
//! - [`ledger`]: the spend ledger: one row per settled or voided
//!   reservation, buffered (bounded) and written in batches off the request
//!   path; spend queries and CSV.
//! - [`lifecycle`]: the request path as named phases — authenticate,
//!   prepare, route, admit, forward, meter, settle, finish — and the
//!   per-request context they share; stored responses kept to their
//!   tenant (`owner`) and the Responses routes without output (`stored`).
//! - [`metrics`]: Prometheus metrics with bounded labels.
//! - [`money`]: prices and dollar amounts in exact integers (µ$): decimal
//!   parsing, price tables with long-context tiers, the one cost function.
//! - [`queue`]: wait queues: one line of
//!   waiters per waited-for budget (strict priority, starvation guard,
//!   weighted fair sharing by cost), the waiter's ticket; above the store
//!   (holds no reservation), joined to the request path by
//!   `lifecycle::wait`.
//! - [`admission`]: a held reservation (extend, settle, drop backstop,
//!   each where it was admitted), quota leases, slot lease renewal, the
//!   settlement tracker, the budget plan of a request (and the
//!   one list of a tenant's budgets the pages and the alert watch read),
//!   and the deny-cache and fail-open store layers composed into the gateway's store.
//! - [`budget`]: the budget model, the `BudgetStore` trait and its stores,
//!   and the owner records of stored responses
//!   (knows nothing of HTTP, config files or the request path).
//! - [`gateway`]: the gateway's state (`AppState`) and the budget plan of
//!   a (tenant, key, model), the error map (`ApiError`, its words and its
//!   rendering), each tenant's recent refusals and the settlement
//!   observers' registration (`gateway::observers`): what every phase of
//!   the request path reads, under the lifecycle and the HTTP face.
//! - [`server`]: the HTTP face: axum router, route handlers, the admin and
//!   control APIs (one admin authentication), the budget and spend pages.
//! - [`settlement`]: the settlement event and the observer trait: once the
//!   store has answered a settlement, one event (its outcome named where
//!   it was made) goes to every observer (spans, ledger, queue capacity,
//!   tenant metrics, deny release).
//! - [`upstreams`]: upstream client (the direct providers' connections on
//!   hyper's client), SSE framing and the stream relay; no
//!   budgets (the relay meters through its own `Meter` trait).
//! - [`connections`]: client connections: accepted under
//!   `max_connections`, served by hyper with a header read timeout and a
//!   write timeout, drained gracefully at shutdown.
//! - [`tls`]: HTTPS on the listener, certificate reload.
//! - [`admin_cli`]: the `keys`, `tenants` and `admin-tokens` commands
//!   (HTTP calls to the control API).
//! - [`admin_call`]: what every command calling the admin API shares
//!   (the token, percent-encoding, an unreachable gateway, printing).
//! - [`alerts`]: soft thresholds of quota and dollar budgets fired as
//!   signed webhooks, once per threshold per window.
//! - [`app`]: wiring a policy, a store and a listener into a running gateway.
//!
//! The fleet simulation of quota leases is an example
//! (`examples/fleet_sim/`), not part of the library: it drives
//! `admission::quota_lease::Book` through its public API.

pub mod admin_call;
pub mod admin_cli;
pub mod admission;
pub mod alerts;
pub mod app;
pub mod budget;
pub mod clock;
pub mod config;
pub mod connections;
pub mod control;
pub mod db;
pub mod dialects;
pub mod estimate;
pub mod gateway;
pub mod ledger;
pub mod lifecycle;
pub mod metrics;
pub mod money;
pub mod queue;
pub mod server;
pub mod settlement;
pub mod telemetry;
pub mod tls;
pub mod upstreams;
