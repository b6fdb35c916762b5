//! The per-request context the phases pass along instead of long argument
//! lists: the gateway state, the policy the request runs under (a request
//! keeps the one it started with), the API surface, who the caller is
//! (typed indices into that policy, carried by the prepared request) and
//! the final-line record.

use std::sync::Arc;

use axum::http::HeaderMap;
use axum::response::Response;

use super::finish::Finish;
use super::request_id::RequestId;
use crate::admission::AnsweredBy;
use crate::config::Policy;
use crate::dialects::Dialect;
use crate::gateway::{AppState, BudgetPlan};

/// One request on its way through the phases.
pub struct RequestContext {
    /// Gateway state.
    pub st: Arc<AppState>,
    /// The policy snapshot of this request.
    pub policy: Arc<Policy>,
    /// The API dialect it came in on.
    pub dialect: Dialect,
    /// The final line, written by the last phase.
    pub finish: Finish,
    /// The budgets the request touches, once prepare knows them (the
    /// rate-limit headers of a refusal describe them).
    pub plan: Option<Arc<BudgetPlan>>,
    /// Who answered the last reservation (a deny-cache refusal knows only
    /// the refusing budget).
    pub answered_by: Option<AnsweredBy>,
    /// The request's claim to a share of a contended deployment, set when
    /// it may wait (the gateway has a queue).
    pub share: Option<crate::budget::share::ShareClaim>,
    /// What the last refused reservation asked, set only when one is
    /// refused (the refusal's record: "why was this refused?").
    pub refused: Option<Box<super::refusal::Asked>>,
    /// The method and framing the path named (Gemini), `None` where the
    /// body says whether to stream.
    pub call: Option<crate::dialects::gemini::Call>,
}

impl RequestContext {
    /// A request that arrived now on `dialect` with `headers`.
    pub fn new(st: Arc<AppState>, dialect: Dialect, headers: &HeaderMap) -> Self {
        let policy = st.policy.load_full();
        let mut finish = Finish::new(
            policy.clone(),
            RequestId::arrived_in(
                headers,
                dialect.request_id_header(),
                dialect.key_headers(),
                policy.store.layout,
            ),
        );
        if let Some(spans) = st.spans.get() {
            finish.spans = Some(spans.clone());
            finish.dialect_name = crate::settlement::dialect_name(dialect);
        }
        Self {
            st,
            policy,
            dialect,
            finish,
            plan: None,
            answered_by: None,
            share: None,
            refused: None,
            call: None,
        }
    }
}

impl RequestContext {
    /// This request with its method and route (a refusal's line names
    /// them).
    pub fn at(
        mut self,
        method: &'static str,
        route: impl Into<std::borrow::Cow<'static, str>>,
    ) -> Self {
        self.finish.route = (method, route.into());
        self
    }

    /// How a refusal names the request's tenant when it has ancestors
    /// ([`Policy::requester_of`]); `None` before authentication.
    pub fn requester(&self) -> Option<String> {
        let t = self.finish.tenant?;
        self.policy.requester_of(self.policy.tenant(t))
    }

    /// `response` with the request's id in the dialect's request-id header
    /// (the answers of the forward phase have it already; refusals get it here).
    pub fn with_request_id(&self, mut response: Response) -> Response {
        response.headers_mut().insert(
            self.dialect.request_id_header(),
            self.finish.request_id.header(),
        );
        response
    }
}
