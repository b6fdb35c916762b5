//! Phase 6, meter (DESIGN section 1.7): a non-streamed answer is read
//! whole and its `usage` taken; a streamed one is handed to the relay,
//! which meters it as it passes and extends the reservation as output
//! grows (DESIGN section 5).

use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use serde_json::Value;

use super::admit::HoldBudgets;
use super::context::RequestContext;
use super::finish::Outcome;
use super::forward::Answer;
use super::owner::OwnerWriter;
use super::prepare::Prepared;
use super::rewrite::{enforced_cap, output_cap, usage_bounds};
use super::settle::{refund, settle};
use super::whole_answer::Whole;
use crate::admission::{amounts, HeldReservation};
use crate::budget::ExtendOutcome;
use crate::config::estimate::StreamCounting;
use crate::dialects::UsageBreakdown;
use crate::gateway::error::ApiError;
use crate::metrics;
use crate::settlement::Outcome as SpendOutcome;
use crate::upstreams::relay::{self, Ending, ExtendPlan, Extension, Meter, StreamProcessor};

/// How the answer went, for the final line.
pub enum Metered {
    /// Answered whole; `settled` tokens.
    Answered(Response, u64),
    /// Handed to the stream relay, which finishes the request itself.
    Streaming(Response),
    /// The upstream's error answer, passed on unmetered (refunded).
    PassedOn(Response),
    /// Failed while reading the answer.
    Failed(ApiError),
}

/// Meters the answer: streams go to the relay (which settles and finishes
/// them), whole answers are read and settled here.
pub async fn meter(cx: &mut RequestContext, request: &Prepared, answer: Answer) -> Metered {
    if request.stream {
        let response = stream(cx, request, answer);
        return Metered::Streaming(super::gemini::framed(cx.call, response));
    }
    let Answer {
        hold,
        response,
        headers,
        budgets,
    } = answer;
    let status = response.status();
    let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
    let body = match http_body_util::BodyExt::collect(response.into_body()).await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            tracing::warn!(reservation_id = %hold.id(), error = %e, "upstream body failed");
            hold.settle(refund(&budgets));
            return Metered::Failed(ApiError::BadGateway(
                "The upstream response was interrupted.".into(),
            ));
        }
    };
    // Only `usage` is read out of the answer; the rest is checked to be
    // JSON and passed on untouched (the whole tree is built only when the
    // upstream sent no usage and the output must be counted here).
    let Some(whole) = Whole::read(&body) else {
        hold.settle(refund(&budgets));
        return Metered::Failed(ApiError::BadGateway(
            "The upstream returned a response that is not JSON.".into(),
        ));
    };
    let usage = if cx.dialect.is_gemini() {
        whole.usage_metadata
    } else {
        whole.usage
    };
    let (id, output) = (whole.id, whole.output);
    let model = cx.policy.model_at(request.model);
    let (encoding, ratio) = (model.encoding, model.token_ratio);
    let used = usage
        .and_then(|u| cx.dialect.usage_from_answer(u))
        .unwrap_or_default()
        .bounded(&usage_bounds(request, model, cx.dialect))
        .filled(request.estimate.input_tokens, || {
            let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            cx.dialect.count_answer_output(&parsed, encoding, ratio)
        });
    let mut used = full_charge(request).unwrap_or(used);
    if !request.hosted.is_empty() {
        if let Some(Ok(Value::Array(items))) = output.map(serde_json::from_str) {
            used.hosted = crate::dialects::responses::hosted_uses(&items);
        }
    }
    if let (Some(owner), Some(id)) = (OwnerWriter::new(cx, request, budgets.deployment()), id) {
        owner.write(&id, used.total());
    }
    metrics::input_calibration(&model.name, request.estimate.input_tokens, &used);
    count_over_cap(cx, request, &used);
    let settled = settle(hold, &budgets, used, SpendOutcome::Answered);
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        content_type.unwrap_or(HeaderValue::from_static("application/json")),
    );
    Metered::Answered(response, settled)
}

/// A whole answer whose output passed the cap sent upstream settles as
/// debt (its usage is what it is) and is counted per deployment.
fn count_over_cap(cx: &RequestContext, request: &Prepared, used: &UsageBreakdown) {
    let Some(d) = cx.finish.deployment else {
        return;
    };
    let upstream = cx.policy.deployment(d);
    let model = cx.policy.model_at(request.model);
    if cx.dialect.cap_field(upstream.max_tokens_only).is_none() {
        return;
    }
    let cap = output_cap(request, model).saturating_mul(request.estimate.choices.max(1));
    if used.output.unwrap_or(0) > cap {
        tracing::info!(deployment = %upstream.name, output = used.output.unwrap_or(0), cap, "answer passed the cap sent upstream; settled as debt");
        metrics::output_over_cap(&upstream.name, "answer_debt");
    }
}

/// The response relaying a streamed answer: its body meters and settles
/// the stream and writes the final line when the stream ends.
fn stream(cx: &mut RequestContext, request: &Prepared, answer: Answer) -> Response {
    let Answer {
        hold,
        response: upstream,
        headers,
        budgets,
    } = answer;
    let model = cx.policy.model_at(request.model);
    let estimate = &request.estimate;
    let choices = estimate.choices.max(1);
    let deployment = cx.finish.deployment.map(|d| cx.policy.deployment(d));
    let cap = deployment.and_then(|u| enforced_cap(request, model, cx.dialect, u));
    let proc = StreamProcessor::new(
        cx.dialect,
        model.encoding,
        request.client_wants_usage,
        choices,
    )
    .with_limits(estimate.input_tokens, cap)
    .with_token_ratio(model.token_ratio)
    .with_usage_bounds(usage_bounds(request, model, cx.dialect));
    let proc = match cx.policy.stream_counting {
        StreamCounting::Bound => proc,
        StreamCounting::Exact => proc.with_exact_counting(),
    };
    // The request's time limit counts from its arrival.
    let deadline = cx.finish.started + cx.policy.server.max_request;
    // Extended up to the client's cap (an incremental reservation of it,
    // prepare), else the bound of an uncapped answer (sent uncapped); an
    // uncapped stream of a model without one is sent its reservation.
    let max_output = output_cap(request, model).saturating_mul(choices);
    let step = (!request.never_extend && estimate.output_tokens < max_output)
        .then_some(cx.policy.stream_extension_step);
    let plan = ExtendPlan {
        reserved_output: estimate.output_tokens,
        step,
        max_output,
        input_tokens: estimate.input_tokens,
        deadline: Some(tokio::time::Instant::from_std(deadline)),
    };
    let finish = cx.finish.hand_off();
    let owner = OwnerWriter::new(cx, request, budgets.deployment());
    let full = full_charge(request);
    let input_tokens = estimate.input_tokens;
    let (model_name, input_estimate) = (model.name.clone(), estimate.input_tokens);
    let meter = StreamMeter {
        hold,
        budgets,
        owner,
        response_id: None,
        full,
        input_tokens,
        model: model_name,
        input_estimate,
    };
    metrics::active_streams(1.0);
    let body = Body::new(relay::relay_body(
        upstream,
        proc,
        meter,
        plan,
        move |summary| {
            metrics::active_streams(-1.0);
            finish.write(Outcome::Streamed(&summary));
        },
    ));
    let mut response = Response::new(body);
    *response.headers_mut() = headers;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// A background response goes on after the HTTP response ends, beyond the
/// gateway's metering: it is charged its whole reservation, never refunded.
fn full_charge(request: &Prepared) -> Option<UsageBreakdown> {
    request.references.background.then(|| {
        UsageBreakdown::from_counts(
            request.estimate.input_tokens,
            request.estimate.output_tokens,
        )
    })
}

/// What the stream relay meters through: the held reservation and the
/// budgets it debited (for the amounts per budget).
struct StreamMeter {
    hold: HeldReservation,
    budgets: HoldBudgets,
    /// Writes the owner record of a stored response (Responses).
    owner: Option<OwnerWriter>,
    response_id: Option<String>,
    /// The whole reservation, charged instead of the usage (background).
    full: Option<UsageBreakdown>,
    /// The input estimate: the context recorded until the stream settles.
    input_tokens: u64,
    /// The public model and its input estimate, for the calibration metric.
    model: String,
    input_estimate: u64,
}

impl Meter for StreamMeter {
    fn id(&self) -> &str {
        self.hold.id()
    }

    async fn extend(&mut self, tokens: u64) -> Extension {
        let step = amounts::extension_step(tokens, self.budgets.rates());
        match self.hold.extend(&step).await {
            Ok(ExtendOutcome::Extended { granted, .. }) if granted > 0 => {
                Extension::Granted(granted)
            }
            Ok(ExtendOutcome::Exhausted(d)) => {
                Extension::Exhausted(format!("{} {}", d.scope, d.name))
            }
            Ok(ExtendOutcome::Extended { .. }) => Extension::Exhausted("no tokens granted".into()),
            Ok(ExtendOutcome::Unknown) => Extension::Exhausted("the hold is gone".into()),
            Ok(ExtendOutcome::AlreadySettled) => {
                Extension::Exhausted("the hold was settled already".into())
            }
            Err(e) => Extension::Failed(e.to_string()),
        }
    }

    fn shutdown(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.hold.shutdown_cutoff()
    }

    fn settle(self, used: UsageBreakdown, ending: Ending) -> u64 {
        let used = self.full.unwrap_or(used);
        let outcome = match ending {
            Ending::Completed => SpendOutcome::Answered,
            Ending::CutOff | Ending::TimeLimit | Ending::OverCap | Ending::ClientGone => {
                SpendOutcome::CutOff
            }
            Ending::UpstreamError => SpendOutcome::UpstreamFailed,
        };
        if let (Some(owner), Some(id)) = (&self.owner, &self.response_id) {
            owner.write(id, used.total());
        }
        metrics::input_calibration(&self.model, self.input_estimate, &used);
        settle(self.hold, &self.budgets, used, outcome)
    }

    fn stream_cutoffs(&self) -> Option<&crate::admission::stream_cutoffs::StreamCutoffs> {
        Some(self.hold.stream_cutoffs())
    }

    fn created(&mut self, id: &str) {
        if let Some(owner) = &self.owner {
            owner.write(id, self.input_tokens);
            self.response_id = Some(id.to_string());
        }
    }
}
