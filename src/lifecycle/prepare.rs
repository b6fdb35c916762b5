//! Phase 2, prepare (DESIGN section 1.2 and 1.4): read the body within its
//! size cap and time, parse and validate it, find the model and the
//! budget plan, and estimate the cost. Large bodies are parsed and counted
//! on the low-priority estimation threads, so that the serving thread's
//! other connections go on meanwhile; small ones right here.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue};
use bytes::Bytes;
use serde_json::Value;

use super::authenticate::Caller;
use super::body_object::BodyObject;
use super::context::RequestContext;
use super::owner;
use crate::admission::amounts::Counting;
use crate::admission::plan;
use crate::budget::{BudgetName, BudgetSpec, Scope};
use crate::config::{CapReservation, ModelId, ModelPolicy, Policy};
use crate::dialects::anthropic;
use crate::dialects::responses::refuse::References;
use crate::dialects::Dialect;
use crate::estimate::{self, Estimate, ModelEstimation};
use crate::gateway::error::ApiError;
use crate::gateway::{AppState, BudgetPlan};
use crate::money::CacheWrites;

/// A request after validation and estimation, ready to route and reserve.
pub struct Prepared {
    /// Who sent it.
    pub caller: Caller,
    /// The client's body as received (forwarded with only the gateway's fields rewritten).
    pub raw: Bytes,
    /// The public model.
    pub model: ModelId,
    /// Its cost.
    pub estimate: Estimate,
    /// `stream: true`.
    pub stream: bool,
    /// The client asked for the usage chunk of a stream.
    pub client_wants_usage: bool,
    /// Budgets of this tenant, key and model.
    pub plan: Arc<BudgetPlan>,
    /// Positions in `plan.upstreams` of the deployments that can serve the request.
    pub candidates: Vec<usize>,
    /// A stream whose output is never extended: its reservation is the
    /// whole cap (reasoning models; Anthropic thinking other than `disabled`).
    pub never_extend: bool,
    /// Provider-side objects the body refers to (Responses).
    pub references: References,
    /// Cache writes the body asks for: priced at reservation (dollar budgets).
    pub cache: CacheWrites,
    /// The end user, as the keyed hash of its id (`None`: no end user
    /// named, or the tenant's tree has no end-user settings).
    pub end_user: Option<Arc<str>>,
    /// The request's own budgets, reserved after the plan's common ones
    /// (never cached in the plan: they are per end user and per run): the
    /// end user's (every level of the tree that limits end users), then
    /// the run's.
    pub request_budgets: Vec<BudgetSpec>,
    /// How each of `request_budgets` counts.
    pub request_counting: Vec<Counting>,
    /// The run the request belongs to: its id and the record its
    /// reservation sets or compares (`None`: no run header).
    pub run: Option<(Arc<str>, crate::budget::RunRecord)>,
    /// The output cap was lowered to fit the budgets ([`super::clamp`]):
    /// `estimate.client_max_output` is the lowered cap, sent upstream.
    pub clamped: bool,
    /// Reserved a second time with a cap lowered by the store's refusal:
    /// a refusal now stands.
    pub clamp_retried: bool,
    /// The model name the client sent, when a pattern entry without
    /// `upstream_model` serves it: that name goes upstream.
    pub sent_model: Option<Box<str>>,
    /// Uses of priced hosted tools reserved (their price on dollar
    /// budgets); empty when the body uses none.
    pub hosted: crate::money::HostedCalls,
    /// `max_tool_calls` sent upstream: the model's maximum, or the
    /// client's lower value (set when the body uses a priced hosted tool).
    /// Messages: the calls its priced server tools may make together,
    /// each tool's `max_uses` set to the model's maximum or the client's
    /// lower value ([`server_tool_max_uses`]).
    pub max_tool_calls: Option<u64>,
    /// The tightest token capacities of the request's budgets (what an
    /// uncapped default and an uncapped bound are lowered to fit).
    pub room: estimate::TokenRoom,
}

/// The bound of an uncapped request's answer ([`Prepared::uncapped_bound`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UncappedBound {
    /// Most output per choice the answer can have.
    pub per_choice: u64,
    /// Sent upstream as the cap (lower than the model's own bound).
    pub sent: bool,
}

impl Prepared {
    /// The bound of an uncapped request's answer, per choice, and whether
    /// it goes upstream as the cap (DESIGN section 5, "Uncapped
    /// requests"): the model's own bound ([`model_bound`]); for output not
    /// metered as it streams, lowered to fit the budgets' capacities and
    /// sent when so lowered (the budgets cannot hold the model's whole
    /// answer). Otherwise the request goes upstream uncapped and runs to
    /// its natural end (a metered stream extends up to the bound). `None`:
    /// the client gave a cap (or the gateway clamped one), or no bound is
    /// known and the reservation goes upstream as the cap. `model` is the
    /// request's entry.
    pub fn uncapped_bound(&self, model: &ModelPolicy) -> Option<UncappedBound> {
        let e = &self.estimate;
        let own = model_bound(e, model, self.references.background)?;
        if self.stream && !self.never_extend {
            return Some(UncappedBound {
                per_choice: own,
                sent: false,
            });
        }
        // The reservation fits the room, so the bound lowered to it does too.
        let fitted = estimate::fit_output(e.input_tokens, e.choices, own, 1, self.room)
            .map_or(e.output_tokens_per_choice, |(per_choice, _)| per_choice);
        Some(UncappedBound {
            per_choice: fitted,
            sent: fitted < own,
        })
    }

    /// The model name sent upstream: the client's, matched by a pattern
    /// entry without `upstream_model`; else the entry's `upstream_model`.
    pub fn upstream_model<'a>(&'a self, model: &'a ModelPolicy) -> &'a str {
        self.sent_model.as_deref().unwrap_or(&model.upstream_model)
    }
}

/// Reads, parses, validates and estimates the request.
pub async fn prepare(
    cx: &mut RequestContext,
    caller: Caller,
    headers: &HeaderMap,
    body: Body,
    path_model: Option<String>,
) -> Result<Prepared, ApiError> {
    prepare_as(cx, caller, headers, body, path_model, Purpose::Send).await
}

/// What a prepared request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Sent upstream: its estimate must fit the token budgets.
    Send,
    /// Only counted (`POST /v1/responses/input_tokens`): the count is
    /// answered whatever the budgets' capacity, as
    /// `/v1/messages/count_tokens` answers it.
    Count,
}

/// [`prepare`] for `purpose`.
pub async fn prepare_as(
    cx: &mut RequestContext,
    caller: Caller,
    headers: &HeaderMap,
    body: Body,
    path_model: Option<String>,
    purpose: Purpose,
) -> Result<Prepared, ApiError> {
    let bytes = super::decode::read_body(body, cx.policy.server.max_body_bytes, headers).await?;
    let dialect = cx.dialect;
    let end_user_header = super::end_user::header(cx.policy.tenant(caller.tenant), headers)?;
    let run_headers = super::run::headers(
        cx.policy.tenant(caller.tenant),
        cx.policy.key(caller.tenant, caller.key),
        headers,
    )?;
    let betas = if dialect.is_anthropic() {
        anthropic_betas(headers)?
    } else {
        Vec::new()
    };
    let (unparsed, azure_model) = (bytes.clone(), path_model.clone());
    let path_stream = cx.call.map(|c| c.stream);
    let prepared = if bytes.len() <= estimate::OFF_IO_THREAD_BYTES {
        let req = Request {
            dialect,
            caller,
            raw: bytes,
            path_model,
            betas: &betas,
            end_user_header,
            run_headers,
            purpose,
            path_stream,
        };
        parse(&cx.st, &cx.policy, req)
    } else {
        let len = bytes.len();
        let (st, policy) = (cx.st.clone(), cx.policy.clone());
        let job = move || {
            let req = Request {
                dialect,
                caller,
                raw: bytes,
                path_model,
                betas: &betas,
                end_user_header,
                run_headers,
                purpose,
                path_stream,
            };
            parse(&st, &policy, req)
        };
        estimate::off_io_threads(len, job)
            .await
            .ok_or_else(|| ApiError::OwnStoreUnavailable {
                store: crate::gateway::error::OwnStore::Estimator,
                message: "The request could not be estimated; please retry.".into(),
            })?
    };
    let prepared = match prepared {
        Ok(p) => p,
        Err(e) => {
            if matches!(e, ApiError::Impossible(_)) || dialect.is_anthropic() {
                // The rate-limit headers of the refusal describe the request's budgets.
                cx.plan = plan_of(cx, caller, &unparsed, azure_model);
            }
            return Err(e);
        }
    };
    cx.plan = Some(prepared.plan.clone());
    let mut prepared = prepared;
    if prepared.references.previous_response_id.is_some() {
        owner::resolve_previous(cx, &mut prepared).await?;
    }
    cx.finish.model = Some(prepared.model);
    cx.finish.estimated = prepared.estimate.total_tokens;
    cx.finish.end_user = prepared.end_user.clone();
    cx.finish.run = prepared.run.as_ref().map(|(id, _)| id.clone());
    Ok(prepared)
}

/// The budget plan of a body whose estimate was refused (its model is
/// known: estimation comes after the model lookup).
fn plan_of(
    cx: &RequestContext,
    caller: Caller,
    raw: &[u8],
    path_model: Option<String>,
) -> Option<Arc<BudgetPlan>> {
    #[derive(serde::Deserialize)]
    struct ModelOnly {
        model: Option<String>,
    }
    let model = match path_model {
        Some(m) => m,
        None => serde_json::from_slice::<ModelOnly>(raw).ok()?.model?,
    };
    let id = cx.policy.model_id(&model)?;
    Some(cx.st.budget_plan(&cx.policy, caller.tenant, caller.key, id))
}

/// A 400 `invalid_request_error`.
pub fn invalid(param: Option<&str>, message: impl Into<String>) -> ApiError {
    ApiError::InvalidRequest {
        param: param.map(str::to_string),
        message: message.into(),
    }
}

/// Refuses a request whose `anthropic-beta` values `model` does not pass
/// upstream (400 naming the first).
pub fn check_betas(model: &ModelPolicy, betas: &[String]) -> Result<(), ApiError> {
    for b in betas {
        if let Err(why) = model.anthropic_betas.check(b) {
            return Err(invalid(
                None,
                anthropic::betas::refusal_message(b, &model.name, &why),
            ));
        }
    }
    Ok(())
}

/// The `anthropic-beta` values of a Messages request (comma-separated,
/// in one header or several).
pub fn anthropic_betas(headers: &HeaderMap) -> Result<Vec<String>, ApiError> {
    let mut betas = Vec::new();
    for v in headers.get_all(crate::dialects::anthropic::BETA) {
        let v = v
            .to_str()
            .map_err(|_| invalid(None, "The anthropic-beta header is not readable."))?;
        betas.extend(
            v.split(',')
                .map(str::trim)
                .filter(|b| !b.is_empty())
                .map(str::to_string),
        );
    }
    Ok(betas)
}

/// What `parse` reads.
struct Request<'b> {
    dialect: Dialect,
    caller: Caller,
    raw: Bytes,
    path_model: Option<String>,
    betas: &'b [String],
    end_user_header: Option<HeaderValue>,
    run_headers: Option<super::run::RunHeaders>,
    purpose: Purpose,
    /// Whether the path's method streams (Gemini): the body says nothing.
    path_stream: Option<bool>,
}

fn parse(st: &AppState, policy: &Policy, req: Request<'_>) -> Result<Prepared, ApiError> {
    let Request {
        dialect,
        caller,
        raw,
        path_model,
        betas,
        end_user_header,
        run_headers,
        purpose,
        path_stream,
    } = req;
    let value: BodyObject = serde_json::from_slice(&raw).map_err(|e| {
        invalid(
            None,
            format!("We could not parse the JSON body of your request ({e}). The OpenAI API expects a JSON payload."),
        )
    })?;
    let mut body = match value {
        BodyObject::Object(body) => body,
        BodyObject::NotObject => {
            return Err(invalid(None, "The request body must be a JSON object."))
        }
        BodyObject::Repeated(name) => {
            return Err(invalid(
                Some(name),
                format!("`{name}` appears more than once in the request body; send it once."),
            ))
        }
    };
    if let Some(m) = path_model {
        // Azure path form: the deployment in the URL names the model.
        body.insert("model".into(), Value::String(m));
    }
    let key = policy.key(caller.tenant, caller.key);
    let (model_id, sent) = match body.get("model") {
        Some(Value::String(m)) => match policy.model_id(m) {
            // A key limited to some models sees no others (as a provider's
            // project key does): the same 404 as an unknown model.
            Some(id) if key.allows(m) => (id, m.as_str()),
            _ => return Err(not_found(policy, key, dialect, m)),
        },
        Some(_) => return Err(invalid(Some("model"), "`model` must be a string.")),
        None => {
            return Err(invalid(
                Some("model"),
                "You must provide a model parameter.",
            ))
        }
    };
    let model = policy.model_at(model_id);
    let sent_model = (model.pattern && !model.renamed).then(|| Box::from(sent));
    if model.messages != dialect.is_anthropic() {
        // All deployments of a model speak one dialect (checked at load).
        return Err(ApiError::ModelElsewhere {
            model: model.name.clone(),
            messages: model.messages,
        });
    }
    if model.gemini || dialect.is_gemini() {
        super::gemini::check_route(policy, model, dialect)?;
    }
    check_betas(model, betas)?;
    let references = match dialect {
        Dialect::Responses => owner::check_body(policy, caller, model, &body)?,
        _ => References::default(),
    };
    let stream = match (path_stream, body.get("stream")) {
        (Some(s), _) => s,
        (None, None | Some(Value::Null)) => false,
        (None, Some(Value::Bool(b))) => *b,
        (None, Some(_)) => return Err(invalid(Some("stream"), "`stream` must be a boolean.")),
    };
    if stream && !dialect.streams() {
        return Err(invalid(Some("stream"), "Embeddings cannot be streamed."));
    }
    let client_wants_usage = body
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let n = body.get("n").and_then(Value::as_u64).unwrap_or(1);
    let plan = st.budget_plan(policy, caller.tenant, caller.key, model_id);
    let candidates: Vec<usize> = plan
        .upstreams
        .iter()
        .enumerate()
        .filter(|(_, d)| n <= 1 || policy.deployment(d.upstream).supports_n)
        .filter(|(_, d)| {
            // A deployment whose `models` map has no id for this model is skipped.
            let u = policy.deployment(d.upstream);
            u.models.is_none()
                || u.model_id(
                    model,
                    sent_model.as_deref().unwrap_or(&model.upstream_model),
                )
                .is_some()
        })
        .map(|(i, _)| i)
        .collect();
    if candidates.is_empty() && n <= 1 {
        return Err(invalid(
            Some("model"),
            format!(
                "No deployment of model `{}` has an id for `{}` (their `models` maps do not name it).",
                model.name,
                sent_model.as_deref().unwrap_or(&model.name)
            ),
        ));
    }
    if candidates.is_empty() {
        return Err(invalid(
            Some("n"),
            format!(
                "`n` > 1 is not supported by any deployment of model `{}`.",
                model.name
            ),
        ));
    }
    let tenant = policy.tenant(caller.tenant);
    let end_user =
        super::end_user::end_user(policy, tenant, dialect, end_user_header.as_ref(), &body)?;
    let (mut request_budgets, mut request_counting) = match &end_user {
        Some(hash) => plan::end_user_plan(&AppState::key_space(policy), policy, tenant, hash),
        None => (Vec::new(), Vec::new()),
    };
    let run = match run_headers {
        None => None,
        Some(asked) => {
            let run = super::run::plan(
                &AppState::key_space(policy),
                tenant,
                key,
                asked,
                end_user.as_deref(),
            )?;
            request_budgets.extend(run.budgets);
            request_counting.extend(run.counting);
            Some((run.id, run.record))
        }
    };
    let body = Value::Object(body);
    if dialect.is_anthropic() {
        let allowed = |u: anthropic::Unmetered| match u {
            anthropic::Unmetered::FileId => model.allow_file_ids && tenant.allow_file_ids,
            _ => model.allow_server_tools,
        };
        if !model.allow_server_tools {
            super::hosted_tools::server_tools_allowed(model, &body)?;
        }
        if let Some(u) = anthropic::unmetered_beside_tools(&body).filter(|u| !allowed(*u)) {
            return Err(invalid(
                Some(u.param()),
                format!(
                    "`{}`: {u} are not enabled for model `{}` on this gateway (its work is billed beside the token usage the gateway meters).",
                    u.param(),
                    model.name
                ),
            ));
        }
    }
    let mut candidates = candidates;
    let cache = super::pricing::check(
        dialect,
        &body,
        model,
        &plan,
        &request_budgets,
        &mut candidates,
    )?;
    let common = &plan.common;
    let cand_specs: Vec<&[BudgetSpec]> = candidates
        .iter()
        .map(|&i| plan.upstreams[i].budgets.as_slice())
        .collect();
    // The end user's budgets are common ones too (every candidate's).
    let none: [&[BudgetSpec]; 0] = [];
    let room = match purpose {
        Purpose::Send => {
            plan::token_room(common, &cand_specs).tighter(plan::token_room(&request_budgets, &none))
        }
        Purpose::Count => estimate::TokenRoom::default(),
    };
    let me = ModelEstimation {
        encoding: model.encoding,
        default_max_output_tokens: model.default_max_output_tokens,
        max_output_tokens: model.refused_above(),
        min_output_tokens: policy.min_output_tokens,
        token_ratio: model.token_ratio,
        image: model.image,
    };
    let never_extend = model.reasoning
        || (dialect.is_anthropic() && anthropic::thinks(&body))
        || (dialect.is_gemini() && crate::dialects::gemini::thinks(&body));
    let mut estimate =
        estimate::estimate(dialect, &body, &me, &policy.estimation, room).map_err(|e| {
            ApiError::from_estimate(e, |capacity| {
                // The tightest token budget is the one the request can never fit.
                common
                    .iter()
                    .chain(&request_budgets)
                    .chain(cand_specs.iter().copied().flatten())
                    .filter(|s| s.name.counts_tokens() && s.capacity() == capacity)
                    .min_by_key(|s| s.capacity())
                    .map(|s| (s.scope.clone(), s.name))
                    .unwrap_or_else(|| {
                        (Scope::Tenant(tenant.name.as_str().into()), BudgetName::Tpm)
                    })
            })
        })?;
    let (hosted, max_tool_calls) = match dialect {
        Dialect::Responses => super::hosted_tools::hosted_demand(model, &body),
        Dialect::Messages => super::hosted_tools::server_tool_demand(model, &body),
        _ => (crate::money::HostedCalls::EMPTY, None),
    };
    if let Some(calls) = max_tool_calls {
        // What the searches bring into the context is input the body does
        // not show: an allowance per use, settled at the reported usage.
        let allowance = calls.saturating_mul(model.hosted_call_input_tokens);
        estimate.input_tokens = estimate.input_tokens.saturating_add(allowance);
        estimate.total_tokens = estimate.total_tokens.saturating_add(allowance);
    }
    drop(body);
    let clamped = tenant.on_short_output == crate::config::OnShortOutput::Clamp
        && super::clamp::to_capacity(
            &mut estimate,
            room,
            policy.min_output_tokens.max(dialect.min_cap()),
        );
    if stream && !never_extend && model.client_cap_reservation == CapReservation::Incremental {
        incremental(&mut estimate, model.default_max_output_tokens);
    }
    Ok(Prepared {
        caller,
        raw,
        model: model_id,
        estimate,
        stream,
        client_wants_usage,
        plan,
        candidates,
        never_extend,
        references,
        cache,
        end_user,
        request_budgets,
        request_counting,
        run,
        clamped,
        clamp_retried: false,
        sent_model,
        hosted,
        max_tool_calls,
        room,
    })
}

/// The most output per choice the model can answer a request without a
/// cap: its `max_output_tokens`, at most what the input estimate leaves of
/// its `context_window`. `None` when the client gave a cap, for a
/// background response (charged its reservation whatever it answers, so
/// the reservation stays its cap), for embeddings, and when the model
/// states neither bound.
fn model_bound(e: &Estimate, model: &ModelPolicy, background: bool) -> Option<u64> {
    if e.client_max_output.is_some() || e.choices == 0 || background {
        return None;
    }
    let room = model
        .context_window
        .map(|c| c.saturating_sub(e.input_tokens));
    match (model.max_output_tokens, room) {
        (Some(max), Some(room)) => Some(max.min(room)),
        (max, room) => max.or(room),
    }
}

/// The 404 of a model name `sent` that `key` cannot use on `dialect`'s
/// routes, naming what it can: the entries (names and patterns) served
/// there, or the key's own list when it has one.
pub fn not_found(
    policy: &Policy,
    key: &crate::config::KeyPolicy,
    dialect: Dialect,
    sent: &str,
) -> ApiError {
    use crate::config::model_names::NamePattern;
    let known: Vec<String> = match &key.allowed_models {
        Some(allowed) => allowed
            .iter()
            .map(|p| match p {
                NamePattern::Exact(n) => n.clone(),
                NamePattern::Prefix(p) => format!("{p}*"),
            })
            .collect(),
        None => policy
            .models
            .iter()
            .filter(|m| m.messages == dialect.is_anthropic())
            .filter(|m| m.gemini || !dialect.is_gemini())
            .map(|m| m.name.clone())
            .collect(),
    };
    ApiError::ModelNotFound {
        model: sent.to_string(),
        known: known_list(&known),
    }
}

/// At most [`KNOWN_SHOWN`] names, then how many more.
fn known_list(names: &[String]) -> String {
    /// Names a 404 lists before it counts the rest.
    const KNOWN_SHOWN: usize = 20;
    let mut out = names
        .iter()
        .take(KNOWN_SHOWN)
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > KNOWN_SHOWN {
        out.push_str(&format!(" and {} more", names.len() - KNOWN_SHOWN));
    }
    out
}

/// Incremental reservation of a stream's client cap (DESIGN section 5):
/// reserve at most the model's default output per choice; the relay
/// extends in steps up to the client's cap, which goes upstream unchanged.
fn incremental(estimate: &mut Estimate, default_max_output: u64) {
    let Some(cap) = estimate.client_max_output else {
        return;
    };
    let per_choice = cap.min(default_max_output);
    estimate.output_tokens_per_choice = per_choice;
    estimate.output_tokens = estimate.choices.saturating_mul(per_choice);
    estimate.total_tokens = estimate.input_tokens.saturating_add(estimate.output_tokens);
}
