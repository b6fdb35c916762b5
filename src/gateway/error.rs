//! The one error map: every error a client can get, mapped in one place
//! to its status, OpenAI error body (built by [`error_body`]) and retry
//! headers (DESIGN section 6; RFC 6585 section 4 for 429 and
//! `Retry-After`). Domain errors (store, upstream, estimate) convert into
//! [`ApiError`] here and nowhere else.

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::refusal_text;
use crate::budget::{BudgetName, Denial, Impossibility, Scope, StoreError};
use crate::dialects::anthropic;
use crate::dialects::error::error_body;
use crate::dialects::Dialect;
use crate::estimate::EstimateError;
use crate::upstreams::UpstreamError;

/// A request-ending error, as the client sees it.
#[derive(Debug)]
pub enum ApiError {
    /// No `Authorization: Bearer` or `api-key` header.
    MissingKey,
    /// The key matches no configured key.
    InvalidKey,
    /// Body over `server.max_body_bytes`.
    BodyTooLarge {
        /// The cap, bytes.
        limit: usize,
    },
    /// Malformed or invalid request (400).
    InvalidRequest {
        /// Offending parameter, if one.
        param: Option<String>,
        /// Explanation.
        message: String,
    },
    /// A request under a dollar budget that cannot be priced (400
    /// `unpriceable_request`, docs/MONEY.md).
    Unpriceable {
        /// The parameter that asks for what has no price.
        param: Option<String>,
        /// Explanation, naming the dollar budget.
        message: String,
    },
    /// Unknown model (404 `model_not_found`).
    ModelNotFound {
        /// The name the client sent.
        model: String,
        /// The names and patterns the caller can use, as listed in the message.
        known: String,
    },
    /// Unknown path (404).
    NotFound(String),
    /// A known path with another method (405): the method and the path.
    MethodNotAllowed(String, String),
    /// A stored response this tenant does not own, or that does not exist
    /// (404, without an upstream call); the parameter that named it, if any.
    ResponseNotFound(String, Option<&'static str>),
    /// A budget refused; retry later (429).
    RateLimited {
        /// The refusal.
        denial: Box<Denial>,
        /// Extra headers (`x-ratelimit-*`).
        headers: HeaderMap,
        /// Retry hint for concurrency refusals, µs.
        concurrency_hint_micros: u64,
    },
    /// Larger than a budget's capacity; never retry (429).
    Impossible(Box<Impossibility>),
    /// The request would have waited for capacity, but the queue is full
    /// (429 `queue_full`).
    QueueFull {
        /// When the refusing budget would have fit it, µs (the store's
        /// latest answer).
        retry_after_micros: u64,
    },
    /// The upstream failed (connect error, 5xx, bad answer): 502.
    BadGateway(String),
    /// The upstream is overloaded: 503.
    Unavailable(String),
    /// The budget store failed and the tenant fails closed: 503.
    StoreUnavailable,
    /// Another of the gateway's own stores cannot answer now: 503
    /// `server_error` with a code naming it (never `upstream_error`: the
    /// provider is not at fault).
    OwnStoreUnavailable {
        /// Which store.
        store: OwnStore,
        /// What the client is told.
        message: String,
    },
    /// The gateway is shutting down: 503.
    ShuttingDown,
    /// The upstream answered 429.
    UpstreamRateLimited {
        /// Seconds from the upstream's `retry-after`, if any.
        retry_after_secs: Option<u64>,
    },
    /// The upstream timed out: 504.
    GatewayTimeout,
    /// The upstream is overloaded (Anthropic's 529 `overloaded_error`):
    /// 529 on the Messages route, 503 elsewhere.
    Overloaded,
    /// The model exists but speaks the other dialect (404 `model_not_found`
    /// with a hint at the route that serves it).
    ModelElsewhere {
        /// The model.
        model: String,
        /// It is served on `/v1/messages` (else on the OpenAI routes).
        messages: bool,
    },
    /// The client did not send its body in time: 408.
    RequestTimeout,
    /// A `Content-Encoding` the gateway does not decode, or stacked
    /// encodings: 415 (the text names it).
    UnsupportedEncoding(String),
    /// The run was started with other limits, or by another end user
    /// (409 `run_conflict`, naming the run): nothing was charged or held.
    RunConflict {
        /// The run's scope (`run:<tenant>/<id>`).
        run: Scope,
    },
}

/// The gateway's own stores besides the budget store, as the `code` of
/// their 503.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnStore {
    /// The spend ledger's database (`ledger_unavailable`).
    Ledger,
    /// The control database (`control_database_unavailable`).
    ControlDatabase,
    /// The estimation threads (`estimator_busy`).
    Estimator,
    /// End users' budgets, kept in the budget store
    /// (`budget_store_unavailable`).
    EndUserBudgets,
}

impl OwnStore {
    /// The error's `code`, also its label in logs and metrics.
    pub fn code(self) -> &'static str {
        match self {
            OwnStore::Ledger => "ledger_unavailable",
            OwnStore::ControlDatabase => "control_database_unavailable",
            OwnStore::Estimator => "estimator_busy",
            OwnStore::EndUserBudgets => "budget_store_unavailable",
        }
    }
}

/// An error response: `status` with an OpenAI error body.
pub fn body(
    status: StatusCode,
    message: &str,
    kind: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Response {
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        error_body(message, kind, param, code),
    )
        .into_response()
}

impl From<StoreError> for ApiError {
    fn from(_: StoreError) -> Self {
        ApiError::StoreUnavailable
    }
}

impl From<UpstreamError> for ApiError {
    fn from(e: UpstreamError) -> Self {
        match e {
            UpstreamError::Timeout(_) => ApiError::GatewayTimeout,
            // The deployment's name, never the credential's source or content.
            UpstreamError::Credentials(name) => ApiError::BadGateway(format!(
                "Upstream deployment {name} has no access token: its credentials failed (see the gateway's log)."
            )),
            _ => ApiError::BadGateway("The upstream could not be reached.".into()),
        }
    }
}

impl ApiError {
    /// The API error of an estimation failure; `refusing` names the budget
    /// whose capacity (the argument) the request can never fit.
    pub fn from_estimate(
        e: EstimateError,
        refusing: impl FnOnce(u64) -> (Scope, BudgetName),
    ) -> Self {
        match e {
            EstimateError::Invalid { param, message } => {
                ApiError::InvalidRequest { param, message }
            }
            EstimateError::Impossible { needed, capacity } => {
                let (scope, name) = refusing(capacity);
                ApiError::Impossible(Box::new(Impossibility {
                    scope,
                    name,
                    capacity,
                    requested: needed,
                }))
            }
        }
    }
}

fn set(resp: &mut Response, name: &'static str, value: String) {
    if let Ok(v) = HeaderValue::from_str(&value) {
        resp.headers_mut().insert(HeaderName::from_static(name), v);
    }
}

/// `type` of a rate refusal: `requests` for request-counting budgets, `tokens` otherwise.
fn rate_type(name: BudgetName) -> &'static str {
    match name {
        BudgetName::Rpm => "requests",
        BudgetName::MaxConcurrent => "concurrency",
        _ => "tokens",
    }
}

/// `retry-after` value: whole seconds, rounded up, at least 1.
pub fn retry_after_secs(micros: u64) -> u64 {
    micros.div_ceil(1_000_000).max(1)
}

impl ApiError {
    /// HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::MissingKey | ApiError::InvalidKey => StatusCode::UNAUTHORIZED,
            ApiError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::InvalidRequest { .. } | ApiError::Unpriceable { .. } => {
                StatusCode::BAD_REQUEST
            }
            ApiError::ModelNotFound { .. }
            | ApiError::NotFound(_)
            | ApiError::ModelElsewhere { .. }
            | ApiError::ResponseNotFound(..) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(..) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::RunConflict { .. } => StatusCode::CONFLICT,
            ApiError::RateLimited { .. }
            | ApiError::Impossible(_)
            | ApiError::QueueFull { .. }
            | ApiError::UpstreamRateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::BadGateway(_) => StatusCode::BAD_GATEWAY,
            ApiError::Unavailable(_)
            | ApiError::StoreUnavailable
            | ApiError::OwnStoreUnavailable { .. }
            | ApiError::ShuttingDown
            | ApiError::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::GatewayTimeout => StatusCode::GATEWAY_TIMEOUT,
            ApiError::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ApiError::UnsupportedEncoding(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        }
    }

    /// True for failures of the upstream (as opposed to refusals of the gateway).
    pub fn is_upstream_failure(&self) -> bool {
        matches!(
            self,
            ApiError::BadGateway(_)
                | ApiError::Unavailable(_)
                | ApiError::UpstreamRateLimited { .. }
                | ApiError::GatewayTimeout
                | ApiError::Overloaded
        )
    }

    /// Low-cardinality label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            ApiError::MissingKey => "missing_key",
            ApiError::InvalidKey => "invalid_key",
            ApiError::BodyTooLarge { .. } => "body_too_large",
            ApiError::InvalidRequest { .. } => "invalid_request",
            ApiError::Unpriceable { .. } => "unpriceable",
            ApiError::ModelNotFound { .. } | ApiError::ModelElsewhere { .. } => "model_not_found",
            ApiError::Overloaded => "overloaded",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed(..) => "method_not_allowed",
            ApiError::ResponseNotFound(..) => "response_not_found",
            ApiError::RateLimited { denial, .. } if denial.name == BudgetName::MaxConcurrent => {
                "concurrency"
            }
            ApiError::RateLimited { denial, .. } if is_quota(denial.name) => "quota",
            ApiError::RateLimited { .. } => "rate_limited",
            ApiError::Impossible(_) => "impossible",
            ApiError::QueueFull { .. } => "queue_full",
            ApiError::BadGateway(_) => "bad_gateway",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::StoreUnavailable => "store_unavailable",
            ApiError::OwnStoreUnavailable { store, .. } => store.code(),
            ApiError::ShuttingDown => "shutting_down",
            ApiError::UpstreamRateLimited { .. } => "upstream_rate_limited",
            ApiError::GatewayTimeout => "gateway_timeout",
            ApiError::RequestTimeout => "request_timeout",
            ApiError::UnsupportedEncoding(_) => "unsupported_encoding",
            ApiError::RunConflict { .. } => "run_conflict",
        }
    }
}

pub(super) fn is_quota(name: BudgetName) -> bool {
    matches!(
        name,
        BudgetName::TokensPerDay
            | BudgetName::TokensPerMonth
            | BudgetName::RequestsPerDay
            | BudgetName::UsdPerDay
            | BudgetName::UsdPerMonth
            | BudgetName::RunsPerDay
    ) || name.is_rolling()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.respond(Dialect::ChatCompletions)
    }
}

/// An error response in `dialect`'s shape: OpenAI's body, or Anthropic's
/// (its `type` given by the status; an overloaded upstream answers 529).
fn shaped(
    dialect: Dialect,
    status: StatusCode,
    message: &str,
    kind: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Response {
    if dialect.is_gemini() {
        return crate::dialects::gemini::error::shaped(status, message);
    }
    if !dialect.is_anthropic() {
        return body(status, message, kind, param, code);
    }
    let status = anthropic::error::status(status, code == Some("overloaded"));
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        anthropic::error::error_body(anthropic::error::error_type(status.as_u16()), message),
    )
        .into_response()
}

impl ApiError {
    /// The response to the client of `dialect`: status, body in the
    /// dialect's shape, retry headers.
    pub fn respond(self, dialect: Dialect) -> Response {
        self.respond_for(dialect, None)
    }

    /// [`Self::respond`], a budget refusal naming the request's tenant
    /// (`requester`, e.g. `tenant ml, child of acme`) after the refusing
    /// scope, which may be an ancestor's.
    pub fn respond_for(self, dialect: Dialect, requester: Option<&str>) -> Response {
        if !dialect.is_gemini() {
            return self.respond_shaped(dialect, requester);
        }
        let details = self.google_details();
        crate::dialects::gemini::error::with_details(
            self.respond_shaped(dialect, requester),
            details,
        )
    }

    /// What a Google client reads of a refusal beside its message: which
    /// budget refused as a `QuotaFailure` (its `quotaId` names the window:
    /// Gemini CLI retries a per-minute limit and stops on a per-day one)
    /// and why as an `ErrorInfo`; `RetryInfo` is added from `retry-after`.
    fn google_details(&self) -> Vec<serde_json::Value> {
        use crate::dialects::gemini::error::{error_info, quota_failure, quota_id};
        match self {
            ApiError::RateLimited { denial, .. } => vec![
                quota_failure(
                    quota_id(denial.name),
                    &denial.scope.to_string(),
                    &format!("{} of {}", denial.name.as_str(), denial.scope),
                ),
                error_info(if is_quota(denial.name) {
                    "QUOTA_EXHAUSTED"
                } else {
                    "RATE_LIMIT_EXCEEDED"
                }),
            ],
            ApiError::Impossible(i) => vec![
                quota_failure(
                    quota_id(i.name),
                    &i.scope.to_string(),
                    &format!(
                        "the request needs more than the {} of {} holds",
                        i.name.as_str(),
                        i.scope
                    ),
                ),
                error_info("REQUEST_EXCEEDS_BUDGET"),
            ],
            ApiError::QueueFull { .. } | ApiError::UpstreamRateLimited { .. } => {
                vec![error_info("RATE_LIMIT_EXCEEDED")]
            }
            _ => Vec::new(),
        }
    }

    fn respond_shaped(self, dialect: Dialect, requester: Option<&str>) -> Response {
        let of = requester.map(|r| format!(" for {r}")).unwrap_or_default();
        let status = self.status();
        match self {
            ApiError::MissingKey => shaped(
                dialect,
                status,
                "You didn't provide an API key. Send it as `Authorization: Bearer YOUR_KEY` (or `api-key: YOUR_KEY`).",
                "invalid_request_error",
                None,
                Some("missing_api_key"),
            ),
            ApiError::InvalidKey => shaped(
                dialect,
                status,
                "Incorrect API key provided.",
                "invalid_request_error",
                None,
                Some("invalid_api_key"),
            ),
            ApiError::BodyTooLarge { limit } => shaped(
                dialect,
                status,
                &format!("Request body is larger than the gateway's limit of {limit} bytes."),
                "invalid_request_error",
                None,
                Some("request_too_large"),
            ),
            ApiError::InvalidRequest { param, message } => {
                shaped(dialect, status, &message, "invalid_request_error", param.as_deref(), None)
            }
            ApiError::Unpriceable { param, message } => shaped(
                dialect,
                status,
                &message,
                "invalid_request_error",
                param.as_deref(),
                Some("unpriceable_request"),
            ),
            ApiError::ModelElsewhere { model, messages } => shaped(
                dialect,
                status,
                &if messages {
                    format!("The model `{model}` is served on POST /v1/messages (Anthropic Messages API) only.")
                } else {
                    format!("The model `{model}` is served on the OpenAI routes (/v1/chat/completions…), not on /v1/messages.")
                },
                "invalid_request_error",
                Some("model"),
                Some("model_not_found"),
            ),
            ApiError::Overloaded => shaped(
                dialect,
                status,
                "Every deployment of this model is overloaded; please retry.",
                "upstream_error",
                None,
                Some("overloaded"),
            ),
            ApiError::ModelNotFound { model, known } => shaped(
                dialect,
                status,
                &if known.is_empty() {
                    format!("The model `{model}` does not exist or you do not have access to it.")
                } else {
                    format!("The model `{model}` does not exist or you do not have access to it. Models on this gateway (a name ending in `*` serves every name it starts): {known}.")
                },
                "invalid_request_error",
                Some("model"),
                Some("model_not_found"),
            ),
            ApiError::ResponseNotFound(id, param) => shaped(
                dialect,
                status,
                &format!("No response found with id '{}'.", id.chars().take(128).collect::<String>()),
                "invalid_request_error",
                param,
                Some(if param.is_some() { "previous_response_not_found" } else { "not_found" }),
            ),
            ApiError::NotFound(path) => shaped(
                dialect,
                status,
                &format!("Unknown request URL: {path}. This gateway serves /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, /v1/messages and /v1/models."),
                "invalid_request_error",
                None,
                Some("unknown_url"),
            ),
            ApiError::RunConflict { run } => shaped(
                dialect,
                status,
                &format!("The run {run} was started with other limits (x-budgetgate-run-limits) or by another end user; a run keeps the limits it started with for its life. Send the same limits, or start a new run."),
                "invalid_request_error",
                None,
                Some("run_conflict"),
            ),
            ApiError::MethodNotAllowed(method, path) => body(
                status,
                &format!("{method} is not supported on {path}."),
                "invalid_request_error",
                None,
                Some("method_not_allowed"),
            ),
            ApiError::RateLimited { denial, headers, concurrency_hint_micros } => {
                let d = &denial;
                let quota = is_quota(d.name);
                let wait = if d.name == BudgetName::MaxConcurrent {
                    concurrency_hint_micros
                } else {
                    d.retry_after_micros
                };
                let message = refusal_text::rate_limited(d, wait, &of);
                let (kind, code) = if quota {
                    ("insufficient_quota", "insufficient_quota")
                } else {
                    (rate_type(d.name), "rate_limit_exceeded")
                };
                let mut resp = shaped(dialect, status, &message, kind, None, Some(code));
                resp.headers_mut().extend(headers);
                set(&mut resp, "retry-after", retry_after_secs(wait).to_string());
                set(&mut resp, "retry-after-ms", wait.div_ceil(1000).max(1).to_string());
                if quota {
                    set(&mut resp, "x-should-retry", "false".into());
                }
                resp
            }
            ApiError::Impossible(i) => {
                let message = refusal_text::impossible(&i, &of);
                let (kind, code) = if is_quota(i.name) {
                    ("insufficient_quota", "insufficient_quota")
                } else {
                    (rate_type(i.name), "rate_limit_exceeded")
                };
                let mut resp = shaped(dialect, status, &message, kind, None, Some(code));
                set(&mut resp, "x-should-retry", "false".into());
                resp
            }
            ApiError::QueueFull { retry_after_micros } => {
                let mut resp = shaped(
                    dialect,
                    status,
                    &format!("The gateway's wait queue is full{of}; retry the request later."),
                    "requests",
                    None,
                    Some("queue_full"),
                );
                set(&mut resp, "retry-after", retry_after_secs(retry_after_micros).to_string());
                set(&mut resp, "retry-after-ms", retry_after_micros.div_ceil(1000).max(1).to_string());
                resp
            }
            ApiError::BadGateway(m) => shaped(dialect, status, &m, "upstream_error", None, Some("bad_gateway")),
            ApiError::Unavailable(m) => shaped(dialect, status, &m, "upstream_error", None, Some("service_unavailable")),
            ApiError::StoreUnavailable => shaped(
                dialect,
                status,
                "The budget store is unavailable; please retry.",
                "server_error",
                None,
                Some("budget_store_unavailable"),
            ),
            ApiError::OwnStoreUnavailable { store, message } => {
                shaped(dialect, status, &message, "server_error", None, Some(store.code()))
            }
            ApiError::ShuttingDown => {
                let mut resp = shaped(
                    dialect,
                    status,
                    "The gateway is shutting down; retry the request.",
                    "server_error",
                    None,
                    Some("shutting_down"),
                );
                // Another gateway of the fleet can take it at once.
                set(&mut resp, "retry-after", "1".into());
                resp
            }
            ApiError::UpstreamRateLimited { retry_after_secs } => {
                let mut resp = shaped(
                dialect,
                    status,
                    "The upstream provider is rate limiting this gateway. Please retry later.",
                    "requests",
                    None,
                    Some("rate_limit_exceeded"),
                );
                let secs = retry_after_secs.unwrap_or(1).max(1);
                set(&mut resp, "retry-after", secs.to_string());
                set(&mut resp, "retry-after-ms", (secs * 1000).to_string());
                resp
            }
            ApiError::RequestTimeout => shaped(
                dialect,
                status,
                "The request body was not received in time.",
                "invalid_request_error",
                None,
                Some("request_timeout"),
            ),
            ApiError::GatewayTimeout => shaped(
                dialect,
                status,
                "The upstream did not answer in time.",
                "upstream_error",
                None,
                Some("timeout"),
            ),
            ApiError::UnsupportedEncoding(why) => body(
                status,
                &format!("{why} This gateway decodes one of Content-Encoding gzip, deflate, br or zstd."),
                "invalid_request_error",
                None,
                Some("unsupported_content_encoding"),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_of(r: Response) -> serde_json::Value {
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 16)
            .await
            .expect("a body");
        serde_json::from_slice(&bytes).expect("JSON")
    }

    /// Fault guarded against: the estimation threads' and end users'
    /// 503s said `upstream_error`, blaming the provider for the gateway's
    /// own failure.
    #[tokio::test]
    async fn the_gateways_own_stores_answer_503_server_error_naming_the_store() {
        for (store, code) in [
            (OwnStore::Estimator, "estimator_busy"),
            (OwnStore::EndUserBudgets, "budget_store_unavailable"),
            (OwnStore::Ledger, "ledger_unavailable"),
            (OwnStore::ControlDatabase, "control_database_unavailable"),
        ] {
            let e = || ApiError::OwnStoreUnavailable {
                store,
                message: "retry".into(),
            };
            assert!(!e().is_upstream_failure());
            assert_eq!(e().label(), code);
            let r = e().respond(Dialect::ChatCompletions);
            assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
            let v = body_of(r).await;
            assert_eq!(v["error"]["type"], "server_error", "{v}");
            assert_eq!(v["error"]["code"], code, "{v}");
            let r = e().respond(Dialect::Messages);
            assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
            let v = body_of(r).await;
            assert_eq!(v["error"]["type"], "api_error", "{v}");
        }
        let v = body_of(ApiError::StoreUnavailable.respond(Dialect::ChatCompletions)).await;
        assert_eq!(v["error"]["type"], "server_error");
        assert_eq!(v["error"]["code"], "budget_store_unavailable");
    }
}
