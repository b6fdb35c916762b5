//! Every integration suite in one test binary: one link instead of one per
//! file (each binary is ~110 MB and its link dominated a warm
//! `scripts/test.sh`). Each module is one former `tests/NAME.rs`; run one
//! with `cargo test --test it NAME::`.
//!
//! Two suites stay binaries of their own because they assert counters that
//! are process-wide (the metrics recorder): `tests/admin_list.rs` and
//! `tests/settlement_metrics.rs`.

#[path = "../support/mod.rs"]
mod support;

mod admin;
mod agents_cli;
mod alerts;
mod anthropic_betas;
mod bedrock;
mod bedrock_sigv4;
mod budget_page_browser;
mod budget_page_console;
mod clamp;
mod cli;
mod config_fixtures;
mod config_range;
mod control;
mod control_fleet;
mod control_own_write;
mod control_races;
mod deploy_kit;
mod deployments;
mod docs_links;
mod dollars;
mod dollars_fleet;
mod dollars_flow;
mod edges;
mod end_users;
mod estimate_accuracy;
mod expected_output;
mod explain;
mod first_use;
mod gateway_budgets;
mod gateway_errors;
mod house;
mod key_headers;
mod lease_burst;
mod lease_calls;
mod lease_conformance;
mod lease_differential;
mod lease_faults;
mod lease_fleet;
mod lease_refusals;
mod lease_streams;
mod ledger;
mod ledger_faults;
mod ledger_sink;
mod lifecycle_log;
mod listen;
mod log_secrets;
mod memory_persistence;
mod messages;
mod messages_server_tools;
mod metric_series;
mod mock_upstream_selftest;
mod model_patterns;
mod models_route;
mod nested_tenants;
mod operations;
mod output_limits;
mod own_budget;
mod queue;
mod queue_fairness;
mod queue_paths;
mod rate_cut;
mod reconcile;
mod redis_acl;
mod redis_bench;
mod redis_crash;
mod redis_differential;
mod redis_faults;
mod redis_fleet;
mod redis_layout;
mod redis_lost_replies;
mod redis_outage;
mod redis_reconnect;
mod redis_restricted;
mod redis_retry;
mod reload;
mod request_ids;
mod responses;
mod responses_estimate;
mod responses_tools;
mod sdk_e2e;
mod share_conformance;
mod share_fleet;
mod shutdown;
mod spend_cli;
mod store_conformance;
mod store_errors;
mod stream_bound;
mod streaming;
mod suites_always_run;
mod telemetry;
mod tls;
mod token_limits;
mod uncapped;
mod usage_settlement;
mod vertex;
